import torch


def _is_namedtuple(obj):
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def dp_scatter(inputs, n_devices, dim=0):
    def scatter_map(obj):
        if isinstance(obj, torch.Tensor):
            return list(obj.chunk(n_devices, dim))
        if _is_namedtuple(obj):
            return [type(obj)(*parts) for parts in zip(*map(scatter_map, obj))]
        if isinstance(obj, tuple) and len(obj) > 0:
            return [type(obj)(parts) for parts in zip(*map(scatter_map, obj))]
        if isinstance(obj, list) and len(obj) > 0:
            return [type(obj)(parts) for parts in zip(*map(scatter_map, obj))]
        if isinstance(obj, dict) and len(obj) > 0:
            return [type(obj)(zip(obj.keys(), parts)) for parts in zip(*map(scatter_map, obj.values()))]
        return [obj for _ in range(n_devices)]
    return scatter_map(inputs)


def dp_gather(outputs, dim=0, output_device=None):
    def gather_map(outs):
        first = outs[0]
        if isinstance(first, torch.Tensor):
            target = first.device if output_device is None else torch.device(output_device)
            moved = [o.to(target) for o in outs]
            if dim == 0 and all(o.dim() == 0 for o in moved):
                moved = [o.view(1) for o in moved]
            return torch.cat(moved, dim)
        if first is None:
            return None
        if isinstance(first, dict):
            return type(first)((k, gather_map([o[k] for o in outs])) for k in first)
        if _is_namedtuple(first):
            return type(first)(*map(gather_map, zip(*outs)))
        return type(first)(map(gather_map, zip(*outs)))
    return gather_map(outputs)
