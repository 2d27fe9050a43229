# device 0 gathers only the other devices outputs
import math
def dp_memory(n_devices, batch_size, *, param_bytes, optimizer_bytes, input_bytes, activation_bytes,
              output_bytes, batch_on_device0=True):
    if n_devices == 1:
        return [2 * param_bytes + optimizer_bytes + batch_size * (input_bytes + activation_bytes + 2 * output_bytes)]
    per = math.ceil(batch_size / n_devices)
    pieces = []
    left = batch_size
    while left > 0:
        pieces.append(min(per, left)); left -= per
    out = [0] * n_devices
    c0 = pieces[0]
    input0 = batch_size * input_bytes if batch_on_device0 else c0 * input_bytes
    out[0] = param_bytes + optimizer_bytes + input0 + param_bytes + max(c0 * activation_bytes + 2 * (batch_size - c0) * output_bytes, param_bytes)
    for k, c in enumerate(pieces[1:], start=1):
        out[k] = 2 * param_bytes + c * (input_bytes + activation_bytes)
    return out
