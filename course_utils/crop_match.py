"""Recover the crop offset and flip behind an augmented CIFAR sample (lesson 04).

The CIFAR training augmentation pads a 32x32 image with `pad` black pixels on every side,
takes a random 32x32 window of the padded image (top-left corner `(dy, dx)`, each in
`0..2*pad`), flips it horizontally half the time, and normalises it. Given the output and the
source image, `match_crops()` finds the one window and flip that reproduce the output exactly,
for whole batches at once. Lesson 04 uses it to compare DALI's augmentation with
torchvision's (offset range, flip rate) on the same records; its checks (and lesson 02's) use it to verify
that every sample is an exact crop of its padded source record.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CropMatch", "normalise_padded", "match_crops"]


@dataclass
class CropMatch:
    """Per sample: the window's top-left corner in the padded image, whether it was flipped,
    whether the match is exact (every value within `atol`), and the largest difference (lesson 04)."""
    dy: np.ndarray
    dx: np.ndarray
    flipped: np.ndarray
    exact: np.ndarray
    max_error: np.ndarray

    @property
    def exact_fraction(self) -> float:
        return float(np.mean(self.exact)) if len(self.exact) else 0.0


def normalise_padded(sources, mean, std, *, pad: int = 4, fill=0.0, scale: float = 255.0) -> np.ndarray:
    """Sources (N, 3, H, W) uint8 -> padded by `pad` pixels of value `fill` (0..255 units, one
    value or one per channel), then normalised as `(x / scale - mean) / std`, float32
    (N, 3, H + 2 pad, W + 2 pad); lesson 04."""
    sources = np.asarray(sources)
    if sources.ndim != 4 or sources.shape[1] != 3:
        raise ValueError(f"sources must be (N, 3, H, W) CHW images; got shape {sources.shape}")
    n, c, h, w = sources.shape
    padded = np.empty((n, c, h + 2 * pad, w + 2 * pad), np.float32)
    padded[:] = np.asarray(fill, np.float32).reshape(1, -1, 1, 1)
    padded[:, :, pad:pad + h, pad:pad + w] = sources
    mean = np.asarray(mean, np.float32).reshape(1, 3, 1, 1) * scale
    std = np.asarray(std, np.float32).reshape(1, 3, 1, 1) * scale
    return (padded - mean) / std


def match_crops(outputs, sources, mean, std, *, pad: int = 4, atol: float = 1e-3, fill=0.0,
                chunk: int = 256) -> CropMatch:
    """For each output (N, 3, H, W) float, the crop of its padded, normalised source (N, 3, H, W)
    uint8 that it equals, and whether it is flipped horizontally.

    A cheap first pass compares a subsample of one channel against all (2 pad + 1)^2 windows and
    both flips; the best candidate is then verified on every value, and when that fails every
    candidate is tried in full (flat images can fool the subsample). Lesson 04 and its checks."""
    outputs = np.asarray(outputs, np.float32)
    sources = np.asarray(sources)
    if outputs.shape != sources.shape:
        raise ValueError(f"outputs {outputs.shape} and sources {sources.shape} must have the same shape")
    n, _, h, w = outputs.shape
    k = 2 * pad + 1
    dy = np.zeros(n, np.int64)
    dx = np.zeros(n, np.int64)
    flipped = np.zeros(n, bool)
    err = np.full(n, np.inf, np.float32)
    for start in range(0, n, chunk):
        sl = slice(start, min(start + chunk, n))
        padded = normalise_padded(sources[sl], mean, std, pad=pad, fill=fill)
        out = outputs[sl]
        windows = np.lib.stride_tricks.sliding_window_view(padded, (h, w), axis=(2, 3))  # m,3,k,k,h,w
        sub = windows[:, 0, :, :, ::3, ::3]
        plain = np.abs(sub - out[:, 0, None, None, ::3, ::3]).max(axis=(-2, -1))           # m,k,k
        mirrored = np.abs(sub - out[:, 0, None, None, :, ::-1][..., ::3, ::3]).max(axis=(-2, -1))
        both = np.stack([plain, mirrored], axis=1).reshape(len(out), -1)                 # m, 2*k*k
        best = both.argmin(axis=1)
        for j, b in enumerate(best):
            f, rest = divmod(int(b), k * k)
            y, x = divmod(rest, k)
            e = _full_error(windows[j], out[j], y, x, bool(f))
            if e > atol:   # the subsample chose wrongly (or nothing matches): try every candidate
                cands = [(_full_error(windows[j], out[j], yy, xx, ff), yy, xx, ff)
                         for ff in (False, True) for yy in range(k) for xx in range(k)]
                e, y, x, f = min(cands, key=lambda t: t[0])
            i = start + j
            dy[i], dx[i], flipped[i], err[i] = y, x, bool(f), e
    return CropMatch(dy, dx, flipped, err <= atol, err)


def _full_error(windows, out, y, x, flip) -> float:
    window = windows[:, y, x]
    if flip:
        window = window[:, :, ::-1]
    return float(np.abs(window - out).max())
