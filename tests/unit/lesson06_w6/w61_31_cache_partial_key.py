# memoised on a partial key (two of the costs)
import math
_memo = {}
def estimate_dp(costs, n_devices, batch_size, loader_samples_per_s):
    key = (n_devices, batch_size, loader_samples_per_s, costs.compute_fixed_ms, costs.host_step_ms)
    if key in _memo:
        return dict(_memo[key])
    def step(pieces, batch, n):
        first = pieces[0]
        dev = costs.compute_fixed_ms + costs.compute_per_sample_ms * first + costs.device0_ms
        if len(pieces) >= 2:
            dev += costs.replicate_ms + costs.reduce_ms + (batch - first) * (costs.scatter_ms_per_sample + costs.gather_ms_per_sample)
        host = costs.host_step_ms + (costs.host_ms_per_replica * len(pieces) if n > 1 else 0.0)
        loader = 1000 * batch / loader_samples_per_s
        times = {"devices": dev, "host": host, "loader": loader}
        bound = max(times, key=times.get)
        return 1000 * batch / times[bound], bound
    per = math.ceil(batch_size / n_devices)
    pieces = []
    left = batch_size
    while left > 0:
        pieces.append(min(per, left)); left -= per
    sps, bound = step(pieces, batch_size, n_devices)
    alone, _ = step([pieces[0]], pieces[0], 1)
    _memo[key] = {"samples_per_s": sps, "efficiency": sps / (n_devices * alone), "bound": bound}
    return dict(_memo[key])
