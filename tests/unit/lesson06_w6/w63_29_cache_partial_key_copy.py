# memoised on (n, batch, param_bytes, flag), returning a fresh copy of the cached list each call
import math
_memo = {}
def dp_memory(n_devices, batch_size, *, param_bytes, optimizer_bytes, input_bytes, activation_bytes,
              output_bytes, batch_on_device0=True):
    key = (n_devices, batch_size, param_bytes, batch_on_device0)
    if key in _memo:
        return list(_memo[key])
    if n_devices == 1:
        out = [2 * param_bytes + optimizer_bytes + batch_size * (input_bytes + activation_bytes + 2 * output_bytes)]
        _memo[key] = out
        return list(out)
    per = math.ceil(batch_size / n_devices)
    pieces = []
    left = batch_size
    while left > 0:
        pieces.append(min(per, left)); left -= per
    out = [0] * n_devices
    c0 = pieces[0]
    input0 = batch_size * input_bytes if batch_on_device0 else c0 * input_bytes
    out[0] = param_bytes + optimizer_bytes + input0 + param_bytes + max(c0 * activation_bytes + 2 * batch_size * output_bytes, param_bytes)
    for k, c in enumerate(pieces[1:], start=1):
        out[k] = 2 * param_bytes + c * (input_bytes + activation_bytes)
    _memo[key] = out
    return list(out)
