import math


def estimate_dp(costs, n_devices, batch_size, loader_samples_per_s):
    def pieces_of(b, n):
        size = math.ceil(b / n)
        out, left = [], b
        while left > 0:
            out.append(min(size, left))
            left -= size
        return out

    def step(pieces, batch, n):
        first = pieces[0]
        devices = costs.compute_fixed_ms + costs.compute_per_sample_ms * first + costs.device0_ms
        if len(pieces) >= 2:
            devices += costs.replicate_ms + costs.reduce_ms + (batch - first) * (
                costs.scatter_ms_per_sample + costs.gather_ms_per_sample)
        host = costs.host_step_ms + (costs.host_ms_per_replica * (len(pieces) - 1) if n > 1 else 0.0)
        loader = 1000.0 * batch / loader_samples_per_s
        times = {"devices": devices, "host": host, "loader": loader}
        bound = max(times, key=times.get)
        return 1000.0 * batch / times[bound], bound

    pieces = pieces_of(batch_size, n_devices)
    sps, bound = step(pieces, batch_size, n_devices)
    alone, _ = step([pieces[0]], pieces[0], 1)
    return {"samples_per_s": sps, "efficiency": sps / (n_devices * alone), "bound": bound}
