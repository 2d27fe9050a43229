"""Checks for lesson 00 (welcome and setup)."""
from __future__ import annotations

import numpy as np
import torch

from ..data import CIFAR10_MEAN, CIFAR10_STD
from ._core import CheckFailed, calling, exercise, expect_callable, trusted
from ._util import fresh_rng, single_threaded


def _normalised(original: np.ndarray) -> torch.Tensor:
    """What ToTensor() then Normalize(CIFAR10_MEAN, CIFAR10_STD) make of an (H, W, 3) uint8 picture."""
    mean = torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(3, 1, 1)
    return (torch.from_numpy(original).permute(2, 0, 1).float() / 255 - mean) / std


def _call(to_image, x, what):
    before = x.clone()
    with calling(f"to_image(x) on {what}"):
        out = to_image(x)
    if isinstance(out, torch.Tensor):
        raise CheckFailed("returns a NumPy array", f"{what}: yours returned a torch.Tensor of shape {tuple(out.shape)}",
                          "finish with .numpy() after moving the channels last")
    if not isinstance(out, np.ndarray):
        raise CheckFailed("returns a NumPy array", f"{what}: yours returned {type(out).__name__}")
    if not trusted.torch_equal(x, before):
        raise CheckFailed("leaves its input unchanged", f"{what}: the tensor passed in was modified in place",
                          "use out-of-place operations (x * std, not x.mul_(std))")
    return out


def _pixel_hint(out: np.ndarray, original: np.ndarray) -> str:
    """The hint for pixels that came back wrong, from what the wrong ones look like."""
    h, w, _ = original.shape
    yours, truth = out.astype(int), original.astype(int)
    if np.array_equal(yours, original.transpose(2, 0, 1).reshape(h, w, 3).astype(int)):
        return ("every value is there, in the wrong place: reshape (and view) keep the tensor's memory order, "
                "where each channel is a whole plane, and only relabel it; to move the channel axis last, "
                "permute(1, 2, 0) (or transpose the NumPy array)")
    if np.array_equal(yours, truth[..., ::-1]):
        return "the channels are reversed (BGR): keep them in the order R, G, B"
    higher, lower = yours > truth, yours < truth
    wrong = higher | lower
    if wrong.any() and np.isin(truth[wrong], (0, 255)).all():      # only the extremes are off (w2-01)
        low, high = yours[truth == 0], yours[truth == 255]
        return (f"only the darkest and brightest values are off: where the picture is 0 yours is as low as "
                f"{int(low.min()) if low.size else 0}, where it is 255 yours is as high as "
                f"{int(high.max()) if high.size else 255}: clamp to the full range of uint8, clamp(0, 255)")
    if higher.any() and not lower.any():
        off = truth[higher]
        if off.min() >= 96 and np.abs(yours - truth).max() <= 2:
            return ("yours is one grey level too bright, and only where the picture is bright (from about 128 "
                    "up): a scale slightly too large. ToTensor divided by 255, so multiply by 255, not 256")
    if lower.any() and not higher.any():
        off = truth[lower]
        if off.min() >= 96 and np.abs(yours - truth).max() <= 2:
            return ("yours is one grey level too dark, and only where the picture is bright (from about 128 up): "
                    "a scale slightly too small. ToTensor divided by 255, so multiply by 255, not 254")
        if np.abs(yours - truth).max() == 1:
            return ("one grey level too dark here and there: converting to uint8 truncates, and x * std + mean "
                    "is only nearly the original (41.99998, not 42): round to the nearest integer first")
    if higher.any() and not lower.any() and np.abs(yours - truth).max() == 1:      # w2-01: ceil()
        return ("one grey level too bright here and there, at any brightness: x * std + mean is only nearly the "
                "original (42.00002, not 42), and rounding up (ceil) makes that 43: round to the nearest integer "
                "(round(), np.rint)")
    if higher.any() and lower.any() and np.abs(yours - truth).max() <= 3:           # w2-01: bfloat16
        return ("a grey level or two off in both directions, here and there: the arithmetic, or the constants, "
                "are not precise enough. bfloat16 keeps 8 significant bits, about one grey level; compute in "
                "float32 (float16 is enough, bfloat16 is not), with CIFAR-10's mean and std as data gives them")
    return ("undo Normalize first (x * std + mean, per channel, with CIFAR-10's mean and std shaped (3, 1, 1)), "
            "then ToTensor (* 255); round before converting to uint8")


@exercise("0.1", "Undo the normalisation: a normalised tensor back to a uint8 picture")
@single_threaded
def check_to_image(to_image):
    expect_callable(to_image, "a function to_image(x) -> numpy array")
    rng, seed = fresh_rng()
    kept = []                                       # (what, the array returned, a copy of it at the time)
    for h, w in [(24, 40), (32, 32), (7, 5), (24, 40)]:   # a second 24x40: a new array for every call (w4-01)
        original = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        original[0, 0] = (0, 0, 0)                 # the extremes are always there
        original[0, 1] = (255, 255, 255)
        what = f"a picture of {h}x{w} (seed {seed})"
        out = _call(to_image, _normalised(original), what)
        if out.shape != (h, w, 3):
            raise CheckFailed("shape is (H, W, 3)", f"{what}: input (3, {h}, {w}) gave shape {out.shape}, expected "
                              f"{(h, w, 3)}",
                              "a tensor is channels-first (C, H, W); a picture is channels-last: permute(1, 2, 0)")
        if out.dtype != np.uint8:
            raise CheckFailed("dtype is uint8", f"{what}: yours is {out.dtype}",
                              "scale to 0..255, round, clamp, then .astype(np.uint8) or .to(torch.uint8)")
        diff = np.abs(out.astype(int) - original.astype(int))
        if diff.max() > 0:
            where = np.unravel_index(diff.argmax(), out.shape)
            raise CheckFailed("recovers the original pixels exactly",
                              f"{what}: {int((diff > 0).sum())} values differ, e.g. pixel "
                              f"{tuple(int(i) for i in where)} (row, column, channel of the output): yours {out[where]}, "
                              f"expected {original[where]}",
                              _pixel_hint(out, original))
        for earlier, returned, copy in kept:
            if not trusted.array_equal(returned, copy):
                raise CheckFailed("returns a new array on every call",
                                  f"the array returned for {earlier} changed when to_image was called again, on "
                                  f"{what}: it now holds the second picture's pixels",
                                  "yours hands back the same buffer for every picture of one size, so each call "
                                  "overwrites the pictures returned before (six draws would all show the last "
                                  "one): return a new array each time (.numpy() of the new tensor is one)")
        kept.append((what, out, out.copy()))
    # values beyond the picture's range (noise, a network's output): clamped, not wrapped around
    original = rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)
    x = _normalised(original)
    std = torch.tensor(CIFAR10_STD).view(3, 1, 1)
    push = torch.from_numpy(rng.choice([-1.0, 0.0, 1.0], size=(3, 9, 11)).astype(np.float32))
    push[:, 0, 0], push[:, 0, 1] = -1.0, 1.0
    x = x + push * (300 / 255) / std             # 300 grey levels beyond: whatever the pixel was, it leaves 0..255
    expected = np.where(push.permute(1, 2, 0).numpy() < 0, 0, np.where(push.permute(1, 2, 0).numpy() > 0, 255,
                                                                        original)).astype(np.uint8)
    what = f"a 9x11 tensor with values beyond the picture's range (seed {seed})"
    out = _call(to_image, x, what)
    if out.shape != expected.shape or out.dtype != np.uint8 or not trusted.array_equal(out, expected):
        bad = int((out != expected).sum()) if out.shape == expected.shape else out.size
        raise CheckFailed("clamps to 0..255", f"{what}: {bad} values are not clamped to 0 or 255",
                          "clamp(0, 255) after scaling (and rounding), before converting: uint8 wraps -3 to 253")
    return "every picture came back exactly, as uint8 (H, W, 3); values beyond the range clamped."
