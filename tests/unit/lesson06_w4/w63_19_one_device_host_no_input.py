# w63_19_one_device_host_no_input: one device with the batch on the host: no input counted
import math


def dp_memory(n_devices, batch_size, *, param_bytes, optimizer_bytes, input_bytes, activation_bytes,
              output_bytes, batch_on_device0=True):
    size = math.ceil(batch_size / n_devices)
    pieces, left = [], batch_size
    while left > 0:
        pieces.append(min(size, left))
        left -= pieces[-1]
    held = [0] * n_devices
    P = param_bytes
    if n_devices == 1:
        held[0] = 2 * P + optimizer_bytes + batch_size * ((input_bytes if batch_on_device0 else 0) + activation_bytes + 2 * output_bytes)
        return held
    c0 = pieces[0]
    input0 = batch_size * input_bytes if batch_on_device0 else c0 * input_bytes
    held[0] = P + optimizer_bytes + input0 + P + max(c0 * activation_bytes + 2 * batch_size * output_bytes, P)
    for k, c in enumerate(pieces[1:], start=1):
        held[k] = P + c * input_bytes + c * activation_bytes + P
    return held
