"""Timing that tells the truth (lesson 01).

GPU work is asynchronous: a Python clock read right after a launch measures the launch, not
the work. Every timer here therefore (1) warms up first (cuDNN autotuning, allocator, lazy
init), (2) synchronises the device before reading the clock, or uses CUDA events recorded on
the stream, and (3) reports the median of several repeats, which one slow outlier cannot move.

- `synchronize(device)`: wait for a CUDA GPU or the simulated accelerator; nothing on a CPU.
- `benchmark(fn, device=...)`: warm-up + median of repeats -> `BenchResult`.
- `StepTimer`: splits each training step into data-wait and compute -> `StepStats`.
"""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

__all__ = ["synchronize", "benchmark", "BenchResult", "StepTimer", "StepStats", "stall_fraction"]


def synchronize(device=None) -> None:
    """Block until all work queued on `device` has finished (no-op for the CPU)."""
    if device is None:
        return
    if getattr(device, "type", None) == "sim":
        device.synchronize()
        return
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class BenchResult:
    """Times of the timed repeats of `benchmark()`, in milliseconds."""
    name: str
    times_ms: list[float]
    warmup: int
    device: str

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def spread_ms(self) -> float:
        """Interquartile range: how much the repeats disagree."""
        if len(self.times_ms) < 4:
            return max(self.times_ms) - min(self.times_ms)
        q = statistics.quantiles(self.times_ms, n=4)
        return q[2] - q[0]

    def __str__(self) -> str:
        return (f"{self.name}: median {self.median_ms:.3f} ms (IQR {self.spread_ms:.3f} ms, "
                f"{len(self.times_ms)} repeats after {self.warmup} warm-up) on {self.device}")


def benchmark(fn, *, device=None, warmup: int = 3, repeats: int = 10, name: str | None = None,
              cuda_events: bool = True) -> BenchResult:
    """Time `fn()` properly: `warmup` untimed calls, then `repeats` timed calls.

    On CUDA each repeat is bracketed by CUDA events (timed on the GPU's own clock); otherwise
    the device is synchronised before and after each call and `time.perf_counter()` is read.
    """
    from .env import device_label

    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    for _ in range(warmup):
        fn()
    synchronize(device)
    is_cuda = device is not None and getattr(device, "type", None) != "sim" and torch.device(device).type == "cuda"
    times = []
    for _ in range(repeats):
        if is_cuda and cuda_events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times.append((time.perf_counter() - t0) * 1e3)
    label = device_label(device) if device is not None else "CPU (no device sync)"
    return BenchResult(name or getattr(fn, "__name__", "fn"), times, warmup, label)


def stall_fraction(data_wait_ms, compute_ms) -> float:
    """Share of wall time the training loop spent waiting for data: sum(wait) / sum(wait + compute)."""
    wait, comp = float(sum(data_wait_ms)), float(sum(compute_ms))
    total = wait + comp
    return wait / total if total > 0 else 0.0


@dataclass
class StepStats:
    """What a `StepTimer` measured over the timed steps (warm-up steps excluded)."""
    steps: int
    samples: int
    total_s: float
    data_wait_ms: list[float] = field(repr=False)
    compute_ms: list[float] = field(repr=False)
    device: str = ""

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.total_s if self.total_s > 0 else 0.0

    @property
    def step_time_ms(self) -> float:
        return statistics.median([w + c for w, c in zip(self.data_wait_ms, self.compute_ms)]) if self.steps else 0.0

    @property
    def data_wait_median_ms(self) -> float:
        return statistics.median(self.data_wait_ms) if self.steps else 0.0

    @property
    def compute_median_ms(self) -> float:
        return statistics.median(self.compute_ms) if self.steps else 0.0

    @property
    def stall_fraction(self) -> float:
        return stall_fraction(self.data_wait_ms, self.compute_ms)

    def as_row(self) -> dict:
        return {"steps": self.steps, "samples_per_s": round(self.samples_per_s, 1),
                "step_time_ms": round(self.step_time_ms, 2),
                "data_wait_ms": round(self.data_wait_median_ms, 2),
                "compute_ms": round(self.compute_median_ms, 2),
                "stall_fraction": round(self.stall_fraction, 3), "device": self.device}

    def __str__(self) -> str:
        return (f"{self.samples_per_s:,.0f} samples/s over {self.steps} steps; per step (median) "
                f"data-wait {self.data_wait_median_ms:.2f} ms + compute {self.compute_median_ms:.2f} ms; "
                f"stalled on data {self.stall_fraction:.0%} of the time [{self.device}]")


class StepTimer:
    """Split every training step into *data wait* (blocked in `next(loader)`) and *compute*.

        timer = StepTimer(device)
        for images, labels in timer.wrap(loader):
            with timer.compute():
                ...forward, backward, step...
        print(timer.stats())

    `compute()` synchronises the device when it ends (`sync=True`), so the compute time is the
    device's work, not the launch. The first `skip_first` steps are warm-up and not counted.
    """

    def __init__(self, device=None, *, skip_first: int = 1, sync: bool = True):
        self.device = device
        self.skip_first = skip_first
        self.sync = sync
        self.data_wait_ms: list[float] = []
        self.compute_ms: list[float] = []
        self.batch_sizes: list[int] = []
        self.log: list[dict] = []   # per step: fetch_start, fetch_end, step_end (perf_counter seconds)
        self._pending_fetch = None
        self._pending_wait = None
        self._pending_size = 0

    def wrap(self, iterable):
        """Yield from `iterable`, timing how long each `next()` blocks."""
        iterator = iter(iterable)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            t1 = time.perf_counter()
            self._pending_fetch = (t0, t1)
            self._pending_wait = (t1 - t0) * 1e3
            self._pending_size = _batch_len(batch)
            yield batch

    @contextmanager
    def compute(self):
        """Time the body (the step's compute), synchronising the device at the end."""
        t0 = time.perf_counter()
        yield
        if self.sync:
            synchronize(self.device)
        t1 = time.perf_counter()
        self.compute_ms.append((t1 - t0) * 1e3)
        fetch_start, fetch_end = self._pending_fetch or (t0, t0)
        self.log.append({"fetch_start": fetch_start, "fetch_end": fetch_end, "step_end": t1})
        self._pending_fetch = None
        self.data_wait_ms.append(self._pending_wait if self._pending_wait is not None else 0.0)
        self.batch_sizes.append(self._pending_size)
        self._pending_wait = None

    def stats(self) -> StepStats:
        from .env import device_label
        k = min(self.skip_first, max(len(self.compute_ms) - 1, 0))
        waits, comps, sizes = self.data_wait_ms[k:], self.compute_ms[k:], self.batch_sizes[k:]
        total_s = (sum(waits) + sum(comps)) / 1e3
        label = device_label(self.device) if self.device is not None else "CPU"
        return StepStats(len(comps), sum(sizes), total_s, waits, comps, label)


def _batch_len(batch) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_len(batch[0])
    if isinstance(batch, dict) and batch:
        return _batch_len(next(iter(batch.values())))
    try:
        return len(batch)
    except TypeError:
        return 0
