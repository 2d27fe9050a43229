"""The whole dataset in device memory, augmented a batch at a time (lesson 03).

CIFAR-10's 50,000 training images are 150 MiB as uint8: they fit in any GPU's memory. Once
they are there, an epoch needs no DataLoader, no workers and no host-to-device copies: each
batch is an index into a device tensor, and augmentation runs as a few tensor operations on
the whole batch, as the fastest CIFAR-10 trainers (airbench) do.

- `cifar10_on_device(device)`: the images as uint8 (N, 3, 32, 32) and the labels, on `device`.
- `DeviceLoader(images, labels, batch_size)`: shuffled batches sliced from device tensors.
- `random_crop_flip(images, padding=4)`: per-sample random crop of the zero-padded batch and
  random horizontal flip (what `RandomCrop(32, padding=4)` + `RandomHorizontalFlip()` do to
  one image at a time), as batched tensor ops.
- `normalize_uint8(images)`: uint8 -> float32 normalised, equal to `ToTensor()` + `Normalize()`.
- `normalize_batch`, `AugmentBatch`: the same as `batch_transform(images, labels)` functions
  for `course_utils.train.train`.

Everything here works on any device (CPU tensors too). Per batch, nothing here copies from the
host or waits for the device: random numbers are drawn on the images' device, and the
normalisation constants are copied to a device once and kept (lesson 05 explains why a copy
or a read-back every batch stalls the GPU). `cifar10_on_device` copies the dataset once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .data import CIFAR10_MEAN, CIFAR10_STD, load_cifar10_arrays

__all__ = ["cifar10_on_device", "DeviceLoader", "random_crop_flip", "normalize_uint8", "normalize_batch",
           "AugmentBatch"]


def cifar10_on_device(device, *, train: bool = True, limit: int | None = None, root=None):
    """CIFAR-10 (train or test split, at most `limit` records) as device tensors: images uint8
    (N, 3, 32, 32) channels-first, labels int64 (N,). One copy, done once (lesson 03)."""
    images, labels = load_cifar10_arrays(root, train=train, limit=limit)
    images = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()     # HWC -> CHW, still uint8
    labels = torch.from_numpy(labels)
    device = _torch_device(device)
    return images.to(device), labels.to(device)


class DeviceLoader:
    """Batches of `batch_size` sliced from `images` and `labels` already on the device (lesson 03).

    Each pass (each `for`) draws a new random order (`shuffle=True`) from its own generator on
    the device, seeded by `seed` (fresh when None); `drop_last` drops the final short batch.
    The permutation and the indexing happen on the device: no worker, no copy, no wait.
    """

    device_resident = True          # its batches are already in device memory: nothing to copy

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, *, shuffle: bool = True,
                 drop_last: bool = True, seed: int | None = None):
        if len(images) != len(labels):
            raise ValueError(f"images ({len(images)}) and labels ({len(labels)}) differ in length")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.images, self.labels = images, labels
        self.batch_size, self.shuffle, self.drop_last = int(batch_size), shuffle, drop_last
        self.generator = torch.Generator(device=images.device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def __len__(self) -> int:
        n = len(self.labels)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        n = len(self.labels)
        if self.shuffle:
            order = torch.randperm(n, generator=self.generator, device=self.images.device)
        else:
            order = torch.arange(n, device=self.images.device)
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield self.images.index_select(0, idx), self.labels.index_select(0, idx)


def random_crop_flip(images: torch.Tensor, padding: int = 4, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random crop of the zero-padded batch plus random horizontal flip, per sample (lesson 03).

    `images` (N, C, H, W), any dtype, any device. For each sample an offset (dy, dx) is drawn
    uniformly in 0..2*padding and a flip with probability 1/2; the output is the H x W window
    of the padded image at (dy, dx), mirrored left-right when flipped. Random numbers are drawn
    on the images' device, from `generator` (which must live there: numbers drawn on the host
    would be copied to the device for every batch) or from that device's global generator.
    """
    if images.dim() != 4:
        raise ValueError(f"expected a batch (N, C, H, W); got shape {tuple(images.shape)}")
    if generator is not None and _torch_device(generator.device) != _same_index(images.device):
        raise ValueError(f"the generator is on {generator.device} and the images on {images.device}: make the "
                         f"generator on the images' device (torch.Generator(device=images.device))")
    n, c, h, w = images.shape
    k = 2 * padding + 1
    dy = torch.randint(0, k, (n,), device=images.device, generator=generator)
    dx = torch.randint(0, k, (n,), device=images.device, generator=generator)
    flip = torch.rand(n, device=images.device, generator=generator) < 0.5
    padded = F.pad(images, (padding, padding, padding, padding)) if padding else images.contiguous()
    s = padded.stride()
    # windows[i, y, x] is the (C, H, W) view of sample i at offset (y, x): no copy yet
    windows = padded.as_strided((n, k, k, c, h, w), (s[0], s[2], s[3], s[1], s[2], s[3]))
    crops = windows[torch.arange(n, device=images.device), dy, dx]      # one gather: (N, C, H, W)
    return torch.where(flip.view(n, 1, 1, 1), crops.flip(3), crops)


_CONSTANTS: dict = {}


def _mean_std(images: torch.Tensor, mean, std):
    """Mean and std as (1, C, 1, 1) float32 tensors on `images`' device, made once per device
    (creating them on each call would copy from the host, and may synchronise, on every batch)."""
    device = images.device
    # A real device lives as long as the process, but the checks' virtual CUDA device
    # (checks/virtual_cuda.py) lives only as long as its `with` block, and the next one is "cuda:0"
    # again, with its streams numbered afresh: constants cached on an earlier one belong to a
    # device that is gone, and the new one would see their writes as work queued on its own
    # streams and never waited for (a second check run reported races here). So the cache also
    # remembers which virtual device made them (None for a real one) and makes them again for a
    # new one.
    owner = getattr(images, "_vc", None)
    key = (str(device), tuple(mean), tuple(std))
    cached = _CONSTANTS.get(key)
    if cached is None or cached[0] is not owner:
        cached = _CONSTANTS[key] = (owner, torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1).to(device),
                                    torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1).to(device))
    return cached[1], cached[2]


def normalize_uint8(images: torch.Tensor, mean=CIFAR10_MEAN, std=CIFAR10_STD) -> torch.Tensor:
    """uint8 (N, C, H, W) -> float32 (x / 255 - mean) / std per channel, on the images' device:
    what `ToTensor()` then `Normalize(mean, std)` give, for a whole batch (lesson 03)."""
    if images.dtype != torch.uint8:
        raise TypeError(f"expected uint8 images; got {images.dtype}")
    m, s = _mean_std(images, mean, std)
    return images.float().div_(255).sub_(m).div_(s)


def normalize_batch(images: torch.Tensor, labels: torch.Tensor):
    """`batch_transform` for `train`: normalise a uint8 batch on the device (CIFAR-10 constants)."""
    return normalize_uint8(images), labels


class AugmentBatch:
    """`batch_transform` for `train`: random crop + flip, then normalise, on the device (lesson 03).

    `generator` (optional, on the images' device) makes the augmentation reproducible.
    """

    def __init__(self, padding: int = 4, mean=CIFAR10_MEAN, std=CIFAR10_STD, generator=None):
        self.padding, self.mean, self.std, self.generator = padding, tuple(mean), tuple(std), generator

    def __call__(self, images: torch.Tensor, labels: torch.Tensor):
        images = random_crop_flip(images, self.padding, self.generator)
        return normalize_uint8(images, self.mean, self.std), labels

    def __repr__(self) -> str:
        return f"AugmentBatch(padding={self.padding})"


def _torch_device(device) -> torch.device:
    """The sim keeps its 'device memory' in host memory."""
    if getattr(device, "type", None) == "sim":
        return torch.device("cpu")
    return _same_index(torch.device(device))


def _same_index(device: torch.device) -> torch.device:
    """cuda and cuda:<current> are the same device."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
