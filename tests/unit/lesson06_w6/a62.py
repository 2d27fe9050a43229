import torch
def dp_scatter(inputs, n_devices, dim=0):
    if isinstance(inputs, torch.Tensor):
        return list(inputs.chunk(n_devices, dim))
    if isinstance(inputs, dict) and len(inputs) > 0:
        parts = [dp_scatter(v, n_devices, dim) for v in inputs.values()]
        return [type(inputs)(zip(inputs.keys(), p)) for p in zip(*parts)]
    if isinstance(inputs, (tuple, list)) and len(inputs) > 0:
        parts = [dp_scatter(v, n_devices, dim) for v in inputs]
        if hasattr(inputs, "_fields"):
            return [type(inputs)(*p) for p in zip(*parts)]
        return [type(inputs)(p) for p in zip(*parts)]
    return [inputs] * n_devices


def dp_gather(outputs, dim=0, output_device=None):
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        target = first.device if output_device is None else output_device
        if isinstance(target, int):
            target = torch.device("cuda", target)
        target = torch.device(target)
        ts = [o.to(target) for o in outputs]
        if dim == 0 and first.dim() == 0:
            ts = [t.view(1) for t in ts]
        return torch.cat(ts, dim)
    if first is None:
        return None
    if isinstance(first, dict):
        return type(first)((k, dp_gather([o[k] for o in outputs], dim, output_device)) for k in first)
    if isinstance(first, (tuple, list)):
        parts = [dp_gather(list(p), dim, output_device) for p in zip(*outputs)]
        if hasattr(first, "_fields"):
            return type(first)(*parts)
        return type(first)(parts)
    return first
