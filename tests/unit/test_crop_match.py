"""course_utils.crop_match: recovering the crop offset and flip of an augmented sample."""
import numpy as np
import pytest
import torch
from PIL import Image

from course_utils import data
from course_utils.crop_match import match_crops, normalise_padded


def _augment(src, dy, dx, flip):
    padded = normalise_padded(src[None], data.CIFAR10_MEAN, data.CIFAR10_STD)[0]
    window = padded[:, dy:dy + 32, dx:dx + 32]
    return window[:, :, ::-1] if flip else window


def test_recovers_known_offsets_and_flips():
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (40, 3, 32, 32), dtype=np.uint8)
    dy, dx, flip = rng.integers(0, 9, 40), rng.integers(0, 9, 40), rng.random(40) < 0.5
    out = np.stack([_augment(s, a, b, f) for s, a, b, f in zip(src, dy, dx, flip)])
    m = match_crops(out, src, data.CIFAR10_MEAN, data.CIFAR10_STD, chunk=16)
    assert m.exact.all() and m.exact_fraction == 1.0
    assert (m.dy == dy).all() and (m.dx == dx).all() and (m.flipped == flip).all()


def test_torchvision_baseline_outputs_are_exact_crops():
    images, _ = data.load_cifar10_arrays(limit=64)
    torch.manual_seed(0)
    tf = data.baseline_transform()
    out = np.stack([tf(Image.fromarray(im)).numpy() for im in images])
    m = match_crops(out, images.transpose(0, 3, 1, 2), data.CIFAR10_MEAN, data.CIFAR10_STD)
    assert m.exact.all()
    assert 0 <= m.dy.min() and m.dy.max() <= 8


def test_wrong_outputs_do_not_match():
    rng = np.random.default_rng(1)
    src = rng.integers(0, 256, (8, 3, 32, 32), dtype=np.uint8)
    out = np.stack([_augment(s, 2, 3, False) for s in src]) + 0.05    # off by a little everywhere
    m = match_crops(out, src, data.CIFAR10_MEAN, data.CIFAR10_STD)
    assert not m.exact.any() and (m.max_error > 0.04).all()
    raw = src.astype(np.float32)                                      # not normalised
    assert not match_crops(raw, src, data.CIFAR10_MEAN, data.CIFAR10_STD).exact.any()


def test_per_channel_fill_and_shape_errors():
    src = np.zeros((1, 3, 32, 32), np.uint8)
    padded = normalise_padded(src, (0, 0, 0), (1, 1, 1), fill=(255, 0, 255))
    assert padded.shape == (1, 3, 40, 40)
    assert padded[0, :, 0, 0].tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError):
        match_crops(np.zeros((2, 3, 32, 32)), np.zeros((3, 3, 32, 32), np.uint8), (0,) * 3, (1,) * 3)
    with pytest.raises(ValueError):
        normalise_padded(np.zeros((2, 32, 32, 3), np.uint8), (0,) * 3, (1,) * 3)
