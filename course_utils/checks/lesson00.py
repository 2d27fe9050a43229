"""Checks for lesson 00 (welcome and setup)."""
from __future__ import annotations

import numpy as np
import torch

from ..data import CIFAR10_MEAN, CIFAR10_STD
from ._core import CheckFailed, exercise, expect_callable
from ._util import fresh_rng


@exercise("0.1", "Undo the normalisation: a normalised tensor back to a uint8 picture")
def check_to_image(to_image):
    expect_callable(to_image, "a function to_image(x) -> numpy array")
    rng, seed = fresh_rng()
    mean = torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(3, 1, 1)
    for h, w in [(32, 32), (24, 40), (7, 5)]:
        original = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        x = (torch.from_numpy(original).permute(2, 0, 1).float() / 255 - mean) / std
        before = x.clone()
        out = to_image(x)
        if isinstance(out, torch.Tensor):
            raise CheckFailed("returns a NumPy array", f"yours returned a torch.Tensor of shape {tuple(out.shape)}",
                              "finish with .numpy() after moving the channels last")
        if not isinstance(out, np.ndarray):
            raise CheckFailed("returns a NumPy array", f"yours returned {type(out).__name__}")
        if out.shape != (h, w, 3):
            raise CheckFailed("shape is (H, W, 3)", f"input (3, {h}, {w}) gave shape {out.shape}, expected {(h, w, 3)}",
                              "a tensor is channels-first (C, H, W); a picture is channels-last: permute(1, 2, 0)")
        if out.dtype != np.uint8:
            raise CheckFailed("dtype is uint8", f"yours is {out.dtype}",
                              "scale to 0..255, round, clamp, then .astype(np.uint8) or .to(torch.uint8)")
        if not torch.equal(x, before):
            raise CheckFailed("leaves its input unchanged", "the tensor passed in was modified in place",
                              "use out-of-place operations (x * std, not x.mul_(std))")
        err = np.abs(out.astype(int) - original.astype(int)).max()
        if err > 1:
            where = np.unravel_index(np.abs(out.astype(int) - original.astype(int)).argmax(), out.shape)
            raise CheckFailed("recovers the original pixels (within 1)",
                              f"pixel {tuple(int(i) for i in where)}: yours {out[where]}, expected {original[where]} "
                              f"(seed {seed})",
                              "undo Normalize first (x * std + mean, per channel), then ToTensor (* 255); "
                              "round before converting to uint8")
    return "every picture came back within one grey level, as uint8 (H, W, 3)."
