# w63_01_max_act_grad: activations and gradients: the larger of the two (not their sum)
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
        held[0] = P + optimizer_bytes + batch_size * (input_bytes + 2 * output_bytes) + max(batch_size * activation_bytes, P)
        return held
    c0 = pieces[0]
    input0 = batch_size * input_bytes if batch_on_device0 else c0 * input_bytes
    held[0] = P + optimizer_bytes + input0 + max(P, c0 * activation_bytes + 2 * batch_size * output_bytes, P)
    for k, c in enumerate(pieces[1:], start=1):
        held[k] = P + c * input_bytes + max(c * activation_bytes, P)
    return held
