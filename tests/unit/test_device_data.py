"""course_utils.device_data: the dataset in device memory and batched augmentation (lesson 03)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms as T
from PIL import Image

from course_utils.data import CIFAR10_MEAN, CIFAR10_STD
from course_utils.device_data import (AugmentBatch, DeviceLoader, cifar10_on_device, normalize_batch,
                                      normalize_uint8, random_crop_flip)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _offsets(images, out, padding):
    """For each sample, the (dy, dx, flipped) at which `out` is a crop of the padded input, or None."""
    padded = F.pad(images, (padding,) * 4)
    h, w = images.shape[-2:]
    found = []
    for i in range(len(images)):
        hit = None
        for dy in range(2 * padding + 1):
            for dx in range(2 * padding + 1):
                crop = padded[i, :, dy:dy + h, dx:dx + w]
                if torch.equal(crop, out[i]):
                    hit = (dy, dx, False)
                elif torch.equal(crop.flip(-1), out[i]):
                    hit = (dy, dx, True)
        found.append(hit)
    return found


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_random_crop_flip_outputs_exact_crops(device, dtype):
    g = torch.Generator().manual_seed(0)
    images = (torch.rand(48, 3, 12, 10, generator=g) * 255).to(dtype).to(device)
    out = random_crop_flip(images, padding=3)
    assert out.shape == images.shape and out.dtype == dtype and out.device == images.device
    found = _offsets(images.cpu(), out.cpu(), 3)
    assert all(f is not None for f in found)
    assert len({f[:2] for f in found}) > 10 and {f[2] for f in found} == {True, False}


def test_random_crop_flip_roughly_uniform_and_reproducible():
    n, h, w, p = 3000, 12, 12, 4
    # pixel values encode their position, so the centre pixel tells the offset
    grid = (torch.arange(h * w, dtype=torch.float32) + 1).view(1, 1, h, w).expand(n, 1, h, w).contiguous()
    out = random_crop_flip(grid, p, torch.Generator().manual_seed(1))
    c = h // 2
    src = out[:, 0, c, c].long() - 1
    flipped = (out[:, 0, c, c + 1] - out[:, 0, c, c]) < 0
    dy = src // w - c + p
    dx = torch.where(flipped, (src % w) - (w - 1 - c) + p, src % w - c + p)
    counts_y = torch.bincount(dy, minlength=2 * p + 1)
    counts_x = torch.bincount(dx, minlength=2 * p + 1)
    assert len(counts_y) == len(counts_x) == 2 * p + 1
    expected = n / (2 * p + 1)
    assert counts_y.min() > 0.6 * expected and counts_y.max() < 1.4 * expected
    assert counts_x.min() > 0.6 * expected and counts_x.max() < 1.4 * expected
    assert 0.42 < flipped.float().mean() < 0.58
    again = random_crop_flip(grid, p, torch.Generator().manual_seed(1))
    assert torch.equal(out, again)
    assert not torch.equal(out, random_crop_flip(grid, p, torch.Generator().manual_seed(2)))


def test_random_crop_flip_channels_last_and_no_padding():
    x = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8)
    a = random_crop_flip(x.contiguous(memory_format=torch.channels_last), 2, torch.Generator().manual_seed(3))
    b = random_crop_flip(x, 2, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    out = random_crop_flip(x, 0)
    assert all(torch.equal(o, i) or torch.equal(o, i.flip(-1)) for o, i in zip(out, x))
    with pytest.raises(ValueError):
        random_crop_flip(x[0])


@pytest.mark.parametrize("device", DEVICES)
def test_normalize_uint8_equals_totensor_normalize(device):
    rng = np.random.default_rng(0)
    hwc = rng.integers(0, 256, (6, 9, 7, 3), dtype=np.uint8)
    tf = T.Compose([T.ToTensor(), T.Normalize(CIFAR10_MEAN, CIFAR10_STD)])
    expected = torch.stack([tf(Image.fromarray(im)) for im in hwc])
    images = torch.from_numpy(hwc).permute(0, 3, 1, 2).to(device)
    out = normalize_uint8(images)
    assert out.dtype == torch.float32 and out.device == images.device
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=0)
    labels = torch.arange(6)
    out2, labels2 = normalize_batch(images, labels)
    assert torch.equal(out2, out) and labels2 is labels
    with pytest.raises(TypeError):
        normalize_uint8(images.float())


def test_augment_batch_is_crop_flip_then_normalise():
    x = torch.randint(0, 256, (10, 3, 8, 8), dtype=torch.uint8)
    labels = torch.arange(10)
    out, lab = AugmentBatch(padding=2, generator=torch.Generator().manual_seed(4))(x, labels)
    ref = normalize_uint8(random_crop_flip(x, 2, torch.Generator().manual_seed(4)))
    assert torch.equal(out, ref) and lab is labels


def test_device_loader_epochs():
    images = torch.arange(10, dtype=torch.uint8).view(10, 1, 1, 1).expand(10, 3, 2, 2).contiguous()
    labels = torch.arange(10)
    loader = DeviceLoader(images, labels, 4, drop_last=False, seed=0)
    assert len(loader) == 3
    first = torch.cat([lab for _, lab in loader])
    second = torch.cat([lab for _, lab in loader])
    assert sorted(first.tolist()) == list(range(10)) == sorted(second.tolist())
    assert not torch.equal(first, second)             # a new order each epoch
    for imgs, labs in loader:                          # images and labels stay paired
        assert torch.equal(imgs[:, 0, 0, 0].long(), labs)
    dropped = DeviceLoader(images, labels, 4, seed=0)
    assert len(dropped) == 2 and all(len(lab) == 4 for _, lab in dropped)
    in_order = DeviceLoader(images, labels, 5, shuffle=False)
    assert torch.equal(torch.cat([lab for _, lab in in_order]), labels)
    with pytest.raises(ValueError):
        DeviceLoader(images, labels[:3], 4)


def test_cifar10_on_device_layout():
    images, labels = cifar10_on_device("cpu", limit=64)
    assert images.shape == (64, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.shape == (64,) and labels.dtype == torch.int64
    assert int(labels.min()) >= 0 and int(labels.max()) <= 9


def test_no_copy_from_the_host_and_no_wait_per_batch():
    """On a (virtual) GPU: after the first batch, augmenting and normalising a batch copies nothing
    from the host and reads nothing back; the loader draws its order on the device."""
    from course_utils.checks.virtual_cuda import VirtualCuda
    with VirtualCuda() as vc:
        images = vc.to_device(torch.randint(0, 256, (32, 3, 8, 8), dtype=torch.uint8))
        labels = vc.to_device(torch.arange(32))
        augment = AugmentBatch(padding=2, generator=vc.generator(5))
        augment(images, labels)                             # the first batch copies the constants once
        vc.reset_log()
        for batch, batch_labels in DeviceLoader(images, labels, 8, seed=1):
            out, _ = augment(batch, batch_labels)
            assert out.device == images.device
        normalize_batch(images, labels)
        random_crop_flip(images, 4)
        assert vc.h2d() == [] and vc.d2h() == [] and vc.syncs == []


def test_random_crop_flip_wants_the_generator_on_the_images_device():
    from course_utils.checks.virtual_cuda import VirtualCuda
    with VirtualCuda() as vc:
        images = vc.to_device(torch.zeros(4, 3, 8, 8))
        with pytest.raises(ValueError, match="images' device"):
            random_crop_flip(images, 2, torch.Generator().manual_seed(0))
