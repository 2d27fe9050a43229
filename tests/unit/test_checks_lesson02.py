"""Lesson 02 checks: right answers pass, typical wrong ones fail on the right property, stubs are
'not implemented'."""
import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from course_utils.checks import run_check
from course_utils.env import usable_cores


# -- 2.1 ------------------------------------------------------------------------------------

def choose(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if s >= (1 - tolerance) * best)


def argmax(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty sweep")
    return max(sweep, key=sweep.get)


def first_in_dict_order(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return next(w for w, s in sweep.items() if s >= (1 - tolerance) * best)


def stop_at_first_drop(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty sweep")
    counts = sorted(sweep)
    for a, b in zip(counts, counts[1:]):
        if sweep[b] < sweep[a]:
            return a
    return counts[-1]


def absolute_tolerance(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if s >= best - tolerance)


def returns_throughput(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty sweep")
    return sweep[choose(sweep, tolerance)]


def no_empty_guard(sweep, tolerance=0.05):
    if not sweep:
        return 0
    return choose(sweep, tolerance)


def sorts_in_place(sweep, tolerance=0.05):
    items = sorted(sweep.items())
    sweep.clear()
    sweep.update(items)
    return choose(sweep, tolerance)


def stub_21(sweep, tolerance=0.05):
    raise NotImplementedError("Exercise 2.1")


def test_choose_workers_right_and_wrong():
    for _ in range(5):   # fresh sweeps each run
        result = run_check("2.1", choose)
        assert result.status == "pass", result.message
    assert "smallest count within the tolerance" in run_check("2.1", argmax).message
    assert "single best point" in run_check("2.1", argmax).message
    assert "smallest count within the tolerance" in run_check("2.1", first_in_dict_order).message
    assert "smallest count within the tolerance" in run_check("2.1", stop_at_first_drop).message
    assert "smallest count within the tolerance" in run_check("2.1", absolute_tolerance).message
    assert "returns a worker count" in run_check("2.1", returns_throughput).message
    assert "raises ValueError" in run_check("2.1", no_empty_guard).message
    assert "leaves the sweep unchanged" in run_check("2.1", sorts_in_place).message
    assert run_check("2.1", stub_21).status == "not_implemented"
    assert run_check("2.1", 3).status == "fail"


def test_choose_workers_seed_is_reproducible(monkeypatch):
    monkeypatch.setenv("COURSE_CHECK_SEED", "1234")
    a = run_check("2.1", argmax).message
    b = run_check("2.1", argmax).message
    assert a == b and "seed 1234" in a


# -- 2.2 ------------------------------------------------------------------------------------

def fast_loader(dataset, batch_size):
    workers = usable_cores()
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                      persistent_workers=workers > 0, pin_memory=torch.cuda.is_available())


def baseline_loader(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=0)


def drops_last(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores(),
                      persistent_workers=True, drop_last=True)


def not_shuffled(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=usable_cores(),
                      persistent_workers=True)


def with_replacement(dataset, batch_size):
    sampler = torch.utils.data.RandomSampler(dataset, replacement=True)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=usable_cores(),
                      persistent_workers=True)


def one_shot(dataset, batch_size):
    return iter(fast_loader(dataset, batch_size))


def invented_labels(dataset, batch_size):
    n = len(dataset)
    order = torch.randperm(n)
    return [(torch.zeros(len(chunk), 3, 32, 32), chunk) for chunk in order.split(batch_size)]


class CachedOnce:
    """Augments every sample once, then serves the same tensors, reshuffled, every epoch."""

    def __init__(self, dataset, batch_size):
        images, labels = zip(*(dataset[i] for i in range(len(dataset))))
        self.images, self.labels = torch.stack(images), torch.tensor(labels)
        self.batch_size = batch_size

    def __iter__(self):
        for chunk in torch.randperm(len(self.labels)).split(self.batch_size):
            yield self.images[chunk], self.labels[chunk]


def stub_22(dataset, batch_size):
    raise NotImplementedError("Exercise 2.2")


def test_fast_loader_passes():
    result = run_check("2.2", fast_loader)
    assert result.status == "pass", result.message


class QuietMachine:
    """Stands in for CpuUse: reports that no other process used the CPU, so the check keeps the
    bar of a quiet machine even while other jobs share this one (the verdict stays deterministic)."""
    others_cores = 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_fast_loader_wrong_ones_fail(monkeypatch):
    monkeypatch.setattr("course_utils.loaders.CpuUse", QuietMachine)
    assert "faster than the baseline" in run_check("2.2", baseline_loader).message
    assert "exactly once" in run_check("2.2", drops_last).message
    assert "shuffles" in run_check("2.2", not_shuffled).message
    assert "exactly once" in run_check("2.2", with_replacement).message
    assert "exactly once" in run_check("2.2", one_shot).message
    assert "dataset's" in run_check("2.2", invented_labels).message
    assert "afresh" in run_check("2.2", CachedOnce).message
    assert run_check("2.2", stub_22).status == "not_implemented"
    assert run_check("2.2", "fast").status == "fail"


# -- 2.3 ------------------------------------------------------------------------------------

def crop_flip(image, padding, rng):
    h, w = image.shape[:2]
    padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))
    dy, dx = rng.integers(0, 2 * padding + 1, size=2)
    crop = padded[dy:dy + h, dx:dx + w]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    return torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1)


class CropFlipBase(Dataset):
    def __init__(self, images, labels, padding=4):
        self.images, self.labels, self.padding = images, labels, padding

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return crop_flip(self.images[i], self.padding, self.rng()), self.labels[i]


class WorkerSafe(CropFlipBase):
    """The solution: a generator per worker, seeded from the seed torch gives that worker."""
    _rng = _seed = None

    def rng(self):
        info = get_worker_info()
        seed = info.seed if info is not None else torch.initial_seed()
        if self._rng is None or seed != self._seed:
            self._rng, self._seed = np.random.default_rng(seed), seed
        return self._rng


class TorchGlobal(CropFlipBase):
    """Also right: torch's own generator, which DataLoader seeds in each worker."""

    def __getitem__(self, i):
        p = self.padding
        h, w = self.images.shape[1:3]
        padded = np.pad(self.images[i], ((p, p), (p, p), (0, 0)))
        dy, dx = (int(v) for v in torch.randint(0, 2 * p + 1, (2,)))
        crop = padded[dy:dy + h, dx:dx + w]
        if torch.rand(()) < 0.5:
            crop = crop[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1), self.labels[i]


class SeededInInit(CropFlipBase):
    """The bug: one generator, made in __init__, copied into every worker."""

    def __init__(self, images, labels, padding=4):
        super().__init__(images, labels, padding)
        self._g = np.random.default_rng(0)

    def rng(self):
        return self._g


class UnseededInInit(SeededInInit):
    def __init__(self, images, labels, padding=4):
        super().__init__(images, labels, padding)
        self._g = np.random.default_rng()


class LazyOnce(CropFlipBase):
    """Created at first use: fine in fresh workers, wrong once the main process used it."""
    _g = None

    def rng(self):
        if self._g is None:
            info = get_worker_info()
            self._g = np.random.default_rng(info.seed if info else None)
        return self._g


class ByWorkerId(CropFlipBase):
    _g = None

    def rng(self):
        info = get_worker_info()
        wid = info.id if info else -1
        if self._g is None or self._g[0] != (os.getpid(), wid):
            self._g = ((os.getpid(), wid), np.random.default_rng(wid + 1))
        return self._g[1]


class FreshEntropy(CropFlipBase):
    _g = None

    def rng(self):
        if self._g is None or self._g[0] != os.getpid():
            self._g = (os.getpid(), np.random.default_rng())
        return self._g[1]


class NoPadding(WorkerSafe):
    def __getitem__(self, i):
        image = self.images[i]
        h, w = image.shape[:2]
        big = np.pad(image, ((1, 1), (1, 1), (0, 0)), mode="edge")
        dy, dx = self.rng().integers(0, 3, size=2)
        return torch.from_numpy(np.ascontiguousarray(big[dy:dy + h, dx:dx + w])).permute(2, 0, 1), self.labels[i]


class HWCOut(WorkerSafe):
    def __getitem__(self, i):
        image, label = super().__getitem__(i)
        return image.permute(1, 2, 0), label


class NeverFlips(WorkerSafe):
    def __getitem__(self, i):
        p = self.padding
        h, w = self.images.shape[1:3]
        padded = np.pad(self.images[i], ((p, p), (p, p), (0, 0)))
        dy, dx = self.rng().integers(0, 2 * p + 1, size=2)
        return torch.from_numpy(np.ascontiguousarray(padded[dy:dy + h, dx:dx + w])).permute(2, 0, 1), self.labels[i]


class Stub23(Dataset):
    def __init__(self, images, labels, padding=4):
        raise NotImplementedError("Exercise 2.3")


def test_worker_seeding_right_ones_pass():
    for cls in (WorkerSafe, TorchGlobal):
        result = run_check("2.3", cls)
        assert result.status == "pass", (cls.__name__, result.message)


def test_worker_seeding_wrong_ones_fail():
    assert "different augmentations in different workers" in run_check("2.3", SeededInInit).message
    assert "different augmentations in different workers" in run_check("2.3", UnseededInInit).message
    assert "different augmentations in different workers" in run_check("2.3", LazyOnce).message
    assert "follows the torch seed" in run_check("2.3", ByWorkerId).message
    assert "reproducible" in run_check("2.3", FreshEntropy).message
    assert "crop of the zero-padded image" in run_check("2.3", NoPadding).message
    assert "uint8 (C, H, W)" in run_check("2.3", HWCOut).message
    assert "draws random crops and flips" in run_check("2.3", NeverFlips).message
    assert run_check("2.3", Stub23).status == "not_implemented"
    assert run_check("2.3", WorkerSafe(np.zeros((2, 4, 4, 3), np.uint8), [0, 1])).status == "fail"


def test_required_speedup_fits_the_device_and_the_load(monkeypatch):
    from course_utils.checks.lesson02 import required_speedup
    from course_utils.timing import StepStats

    def baseline(load_ms, step_ms):
        return StepStats(10, 1280, 1.0, [load_ms] * 10, [step_ms] * 10, "test")

    monkeypatch.setattr("course_utils.checks.lesson02.usable_cores", lambda: 2)
    # quiet 2-core machine, loading 24 ms + step 8 ms: ideal step max(8, 12) -> 32/12 = 2.67x
    assert required_speedup(baseline(24, 8), 0.0) == pytest.approx(1 + 0.15 * (32 / 12 - 1))
    # the device is the bottleneck already: still at least 1.2x on two cores
    assert required_speedup(baseline(2, 8), 0.0) == pytest.approx(1.2)
    # other processes took 1.2 cores: no fair grade, the bar drops, but never to the baseline's
    assert required_speedup(baseline(24, 8), 1.2) == pytest.approx(1.05)
    monkeypatch.setattr("course_utils.checks.lesson02.usable_cores", lambda: 16)
    assert required_speedup(baseline(24, 8), 0.0) == pytest.approx(1 + 0.15 * (32 / 8 - 1))
    monkeypatch.setattr("course_utils.checks.lesson02.usable_cores", lambda: 1)
    assert required_speedup(baseline(0.1, 8), 0.0) == pytest.approx(1.02)
