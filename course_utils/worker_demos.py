"""The datasets lesson 02 runs in DataLoader workers (slow reads, memory, per-worker randomness).

They live in a module, not in the notebook, because of how workers start. On Linux a worker
is a `fork` of the running process and inherits every class the notebook defined. On macOS and
Windows (and with `multiprocessing_context="spawn"` anywhere) a worker is a fresh Python that
receives the dataset *pickled*, and pickle stores a class by its module and name: a class
defined in a notebook lives in the kernel's `__main__`, which the new process cannot import,
so the worker dies with "Can't get attribute ... on <module '__main__'>". Datasets, transforms,
`worker_init_fn`s and `collate_fn`s that workers run belong in an importable module.
The lesson prints their source with `show_source()`.
"""
from __future__ import annotations

import inspect
import random
import time

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

__all__ = ["SlowReads", "RecordsAsObjects", "RecordsAsArray", "crop_flip", "CropFlipOwnRNG", "WhatWorkersSee",
           "seed_own_rng", "show_source"]


def show_source(*objects) -> None:
    """Print the source of classes or functions (how lesson 02 shows the datasets it imports)."""
    for obj in objects:
        print(inspect.getsource(obj))


class SlowReads(Dataset):
    """Cheap uint8 items (C, H, W) from an array; the first item of every `every`-th block stalls
    `stall_s` seconds, like a slow read from network storage (a sleep: simulated, no CPU used)."""

    def __init__(self, images, labels, every, stall_s):
        self.images, self.labels, self.every, self.stall_s = images, labels, every, stall_s

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        if index % self.every == 0:
            time.sleep(self.stall_s)          # a simulated slow read
        return torch.from_numpy(self.images[index]).permute(2, 0, 1), int(self.labels[index])


class RecordsAsObjects(Dataset):
    """Each record a separate Python bytes object, in a list (as when encoded images are kept in a list)."""

    def __init__(self, images, labels):
        self.records = [im.tobytes() for im in images]
        self.labels = [int(label) for label in labels]

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        image = np.frombuffer(self.records[index], dtype=np.uint8).reshape(32, 32, 3)
        return torch.from_numpy(image.copy()).permute(2, 0, 1), self.labels[index]


class RecordsAsArray(Dataset):
    """All records in one NumPy array (what CIFAR10Binary does)."""

    def __init__(self, images, labels):
        self.images, self.labels = np.ascontiguousarray(images), np.asarray(labels)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return torch.from_numpy(self.images[index].copy()).permute(2, 0, 1), int(self.labels[index])


def crop_flip(image, padding, rng):
    """A random crop of the zero-padded image (H, W, C) and a flip half the time, drawn from `rng`:
    a uint8 tensor (C, H, W)."""
    h, w = image.shape[:2]
    padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))
    dy, dx = rng.integers(0, 2 * padding + 1, size=2)
    crop = padded[dy:dy + h, dx:dx + w]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    return torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1)


class CropFlipOwnRNG(Dataset):
    """Random crop + flip from a generator made once, in __init__ (the common pattern)."""

    def __init__(self, images, labels, padding=4, seed=0):
        self.images, self.labels, self.padding = images, labels, padding
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        return crop_flip(self.images[index], self.padding, self.rng), self.labels[index]


class WhatWorkersSee(Dataset):
    """Four items, each reporting the worker that made it and what its random generators give."""

    def __init__(self):
        self.own = np.random.default_rng(0)

    def __len__(self):
        return 4

    def __getitem__(self, index):
        info = get_worker_info()
        return {"item": index, "worker": info.id, "worker seed": info.seed,
                "torch.initial_seed()": torch.initial_seed(), "random.random()": round(random.random(), 4),
                "np.random.rand()": round(float(np.random.rand()), 4),
                "torch.rand(1)": round(torch.rand(1).item(), 4), "own default_rng": round(float(self.own.random()), 4)}


def seed_own_rng(worker_id):
    """A `worker_init_fn`: give this worker's copy of the dataset a generator seeded with the worker's seed."""
    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)
