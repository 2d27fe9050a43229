"""Timing that tells the truth (lesson 01).

GPU work is asynchronous: a Python clock read right after a launch measures the launch, not
the work. Every timer here therefore (1) warms up first (cuDNN autotuning, allocator, lazy
init), (2) synchronises the device before reading the clock, or uses CUDA events recorded on
the stream, and (3) reports the median of several repeats, which one slow outlier cannot move.

- `synchronize(device)`: wait for a CUDA GPU or the simulated accelerator; nothing on a CPU.
- `benchmark(fn, device=...)`: warm-up + median of repeats -> `BenchResult`.
- `StepTimer`: splits each training step into data-wait and the step itself, without a
  synchronisation per step (device events instead; one synchronisation at the end) -> `StepStats`.
"""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

__all__ = ["synchronize", "benchmark", "BenchResult", "StepTimer", "StepStats"]


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
            stream = torch.cuda.current_stream(torch.device(device))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            fn()
            end.record(stream)
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


def _wall_and_wait(step_log) -> tuple[float, float]:
    """(wall seconds, seconds waiting for data) of a StepTimer log: the wall time runs from the
    first entry's fetch_start to the last entry's step_end."""
    if not step_log:
        return 0.0, 0.0
    wall = step_log[-1]["step_end"] - step_log[0]["fetch_start"]
    wait = sum(e["fetch_end"] - e["fetch_start"] for e in step_log)
    return wall, wait


def row_share(x: float) -> float:
    """A share stored in a row: three decimals, unless they print as another whole percent than the figure itself
    (walk w5-08: a stall of 0.76549 printed "77%" in the StepStats line and, stored as 0.765, "76%" in the table)."""
    return round(x, 3) if f"{round(x, 3):.0%}" == f"{x:.0%}" else round(x, 6)


@dataclass
class StepStats:
    """What a `StepTimer` measured over the counted steps (warm-up steps excluded).

    total_s: wall time from the first counted step asking for its batch to the last step's end
    (after the loop's one final synchronisation), so `samples_per_s` is what the run achieved.
    data_wait_ms: per step, how long `next(loader)` blocked. compute_ms: per step, host time in
    the step's body (launching work, or blocked because the device's queue is full).
    device_ms: per step, the step's span on the device's own timeline, from an event recorded
    when the step began to one recorded when it ended (None if unknown). Gaps inside the step
    where the device waited for the host (launches; beside the simulator, the host computing
    device-side work) are included, so it is an upper bound on the device's work.
    step_log: the counted entries of the timer's log (host clock, `time.perf_counter()` seconds).
    device_spans: per step, (start, end) of its span on the device, on the same host clock (for
    CUDA events, placed by their elapsed times before the final synchronisation), or None.
    device_util: share of the wall time the device spent running work (kernels), as NVML's
    utilisation reports it: exact beside the simulated accelerator (its busy time), NVML's mean
    over the run where a caller measured it on a GPU (the ladder does), else None. Not the same as
    `steps_in_flight_fraction`: a step can be in flight while the device idles between kernels,
    waiting for the host to launch the next ones.
    """
    steps: int
    samples: int
    total_s: float
    data_wait_ms: list[float] = field(repr=False)
    compute_ms: list[float] = field(repr=False)
    device: str = ""
    device_ms: list[float] | None = field(default=None, repr=False)
    synced_every_step: bool = False
    step_log: list[dict] = field(default_factory=list, repr=False)
    device_spans: list[tuple[float, float]] | None = field(default=None, repr=False)
    device_util: float | None = None

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.total_s if self.total_s > 0 else 0.0

    @property
    def step_time_ms(self) -> float:
        """Wall time per step: the whole run's time divided by its steps."""
        return self.total_s * 1e3 / self.steps if self.steps else 0.0

    @property
    def data_wait_median_ms(self) -> float:
        return statistics.median(self.data_wait_ms) if self.steps else 0.0

    @property
    def compute_median_ms(self) -> float:
        return statistics.median(self.compute_ms) if self.steps else 0.0

    @property
    def device_median_ms(self) -> float | None:
        return statistics.median(self.device_ms) if self.device_ms else None

    @property
    def stall_fraction(self) -> float:
        """Share of the wall time the loop spent waiting for data: sum of the waits / wall time
        (the definition of exercise 1.2, on the same log)."""
        return min(1.0, sum(self.data_wait_ms) / 1e3 / self.total_s) if self.total_s > 0 else 0.0

    @property
    def steps_in_flight_fraction(self) -> float | None:
        """Share of the wall time covered by the steps' spans on the device (`device_ms`): the
        time some step had been started and not finished. An upper bound on the device's busy
        time (`device_util`): where the host launches slower than the device runs, the device
        idles inside every span, waiting for the next kernel."""
        if not self.device_ms or self.total_s <= 0:
            return None
        return min(1.0, sum(self.device_ms) / 1e3 / self.total_s)

    @property
    def device_busy_fraction(self) -> float | None:
        """The older name of `steps_in_flight_fraction` (it is not the device's busy time: see
        `device_util`)."""
        return self.steps_in_flight_fraction

    def as_row(self) -> dict:
        busy = self.device_busy_fraction
        util = self.device_util

        share = row_share
        return {"steps": self.steps, "samples_per_s": round(self.samples_per_s, 1),
                "step_time_ms": round(self.step_time_ms, 2),
                "data_wait_ms": round(self.data_wait_median_ms, 2),
                "compute_ms": round(self.compute_median_ms, 2),
                "device_ms": round(self.device_median_ms, 2) if self.device_ms else None,
                "stall_fraction": share(self.stall_fraction),
                "steps_in_flight_fraction": share(busy) if busy is not None else None,
                "device_util": share(util) if util is not None else None,
                "synced_every_step": self.synced_every_step, "device": self.device}

    def __str__(self) -> str:
        dev = ""
        if self.device_ms:
            # The span from the step's first event to its last is the step *in flight* on the
            # device, not the device's work: where the host launches slower than the device
            # runs, the device idles inside it. Say which is which, and give the busy time
            # per step (the busy share of the wall time, per step) beside it when it is known,
            # so the line agrees with a "device busy N%" printed from `device_util`.
            dev = f" (in flight on the device {self.device_median_ms:.2f} ms"
            if self.device_util is not None:
                dev += (f", of which the device ran work {self.device_util * self.step_time_ms:.2f} ms "
                        f"= busy {self.device_util:.0%} of the wall time")
            dev += ")"
        sync = "; synchronised every step" if self.synced_every_step else ""
        return (f"{self.samples_per_s:,.0f} samples/s over {self.steps} steps; per step (median) "
                f"data-wait {self.data_wait_median_ms:.2f} ms + step {self.compute_median_ms:.2f} ms{dev}; "
                f"stalled on data {self.stall_fraction:.0%} of the wall time{sync} [{self.device}]")


class StepTimer:
    """Split every training step into *data wait* (blocked in `next(loader)`) and the step itself.

        timer = StepTimer(device)
        for images, labels in timer.wrap(loader):
            with timer.compute():
                ...forward, backward, step...
        timer.finish()                  # one synchronisation, at the end
        print(timer.stats())

    The device is NOT synchronised after every step (`sync=False`): that would make the host
    wait for each step before loading the next batch, the very stall lesson 05 warns about.
    Instead the host runs ahead as far as the device's queue lets it, `finish()` synchronises
    once, and the wall time from the first counted step to that moment gives samples/s (the
    device is also synchronised once when the warm-up steps are done, so their queued work is
    not counted).
    Device events (`course_utils.accel.Event`) around each step give the device's own time per
    step without a synchronisation. `sync=True` synchronises at the end of every step instead
    (the old, stalling way; lesson 05 measures what it costs).

    `log`: one dict per step with the `time.perf_counter()` seconds at which the loop asked for
    the batch (`fetch_start`), got it (`fetch_end`) and was done with the step (`step_end`; for
    the last step, after `finish()`'s synchronisation). The first `skip_first` steps are warm-up
    and not counted.
    """

    def __init__(self, device=None, *, skip_first: int = 1, sync: bool = False, device_events: bool = True):
        self.device = device
        self.skip_first = skip_first
        self.sync = sync
        self.device_events = device_events and device is not None
        self.data_wait_ms: list[float] = []
        self.compute_ms: list[float] = []
        self.batch_sizes: list[int] = []
        self.log: list[dict] = []
        self._events: list = []
        self._pending_fetch = None
        self._pending_size = 0
        self._finished = False
        self._busy = [None, None]       # the device's busy seconds when counting starts and at finish()

    def wrap(self, iterable):
        """Yield from `iterable`, timing how long each `next()` blocks."""
        iterator = iter(iterable)
        while True:
            if self.skip_first and len(self.log) == self.skip_first and not self.sync:
                # warm-up is over: let the device finish it, so the counted steps start with an
                # empty queue and the wall time holds their work and no warm-up step's
                synchronize(self.device)
            if self._busy[0] is None and len(self.log) == self.skip_first:
                self._busy[0] = _busy_seconds(self.device)
            t0 = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            t1 = time.perf_counter()
            self._pending_fetch = (t0, t1)
            self._pending_size = _batch_len(batch)
            yield batch

    @contextmanager
    def compute(self):
        """Time the body (the step), recording device events around it."""
        from .accel import Event

        self._finished = False
        t0 = time.perf_counter()
        start = Event(self.device).record() if self.device_events else None
        yield
        if start is not None:
            self._events.append((start, Event(self.device).record()))
        if self.sync:
            synchronize(self.device)
        t1 = time.perf_counter()
        fetch_start, fetch_end = self._pending_fetch or (t0, t0)
        self.compute_ms.append((t1 - t0) * 1e3)
        self.data_wait_ms.append((fetch_end - fetch_start) * 1e3)
        self.log.append({"fetch_start": fetch_start, "fetch_end": fetch_end, "step_end": t1})
        self.batch_sizes.append(self._pending_size)
        self._pending_fetch = None

    def finish(self) -> None:
        """Synchronise once: the last step ends when the device has finished all queued work."""
        if self._finished:
            return
        synchronize(self.device)
        self._busy[1] = _busy_seconds(self.device)
        if self.log:
            now = time.perf_counter()
            tail = max(0.0, now - self.log[-1]["step_end"])
            self.log[-1]["step_end"] += tail
            self.compute_ms[-1] += tail * 1e3
        self._finished = True

    def stats(self) -> StepStats:
        """The counted steps' statistics (calls `finish()` first if the loop did not)."""
        from .env import device_label

        self.finish()
        k = min(self.skip_first, max(len(self.compute_ms) - 1, 0))
        counted = self.log[k:]
        wall, _ = _wall_and_wait(counted)
        device_ms = spans = None
        if self._events and len(self._events) == len(self.log):
            device_ms = [a.elapsed_ms(b) for a, b in self._events[k:]]
            spans = self._device_spans(k)
        label = device_label(self.device) if self.device is not None else "CPU"
        util = None
        if None not in self._busy and wall > 0 and k == self.skip_first:
            util = min(1.0, max(0.0, (self._busy[1] - self._busy[0]) / wall))
        return StepStats(len(counted), sum(self.batch_sizes[k:]), wall, self.data_wait_ms[k:], self.compute_ms[k:],
                         label, device_ms, self.sync, [dict(e) for e in counted], spans, util)

    def _device_spans(self, k: int) -> list[tuple[float, float]]:
        """Each counted step's (start, end) on the device, on the host clock."""
        last_end = self._events[-1][1]
        anchor = self.log[-1]["step_end"]            # the final synchronisation returned here
        spans = []
        for start, end in self._events[k:]:
            a, b = start.host_time_s(), end.host_time_s()
            if a is None or b is None:               # CUDA: place by elapsed time before the last event
                a = anchor - start.elapsed_ms(last_end) / 1e3
                b = anchor - end.elapsed_ms(last_end) / 1e3
            spans.append((a, b))
        return spans


def _busy_seconds(device) -> float | None:
    """The device's busy seconds so far where it keeps them (the simulated accelerator), else None."""
    busy = getattr(device, "busy_seconds", None)
    return busy() if callable(busy) else None


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
