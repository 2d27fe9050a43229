"""A simulated accelerator for machines without a GPU (lesson 01 onwards).

A real GPU runs work *asynchronously*: the host launches kernels into a queue and carries on
(loading the next batch) while the device computes; `torch.cuda.synchronize()` waits for the
queue to drain. `SimulatedAccelerator` reproduces exactly that behaviour with a device thread:
`step()` queues a fixed amount of "device time" and returns at once, the device thread sleeps
through it (sleeping releases the GIL, so DataLoader workers and the main thread keep running
as they would beside a GPU), and `synchronize()` waits. It computes nothing.

Work a real GPU would do *on the device* besides the model step (normalising or augmenting a
batch there, lesson 03) goes through `run(fn, ...)`: it is computed on the host, so its results
are real, and it is charged to the device, in order, as a GPU stream would run those kernels
before the step: each tensor operation costs `kernel_us` (a kernel launch and its fixed cost)
plus the bytes it reads and writes at `bandwidth_gbs` (such operations are memory-bound). The
charge is counted from the operations themselves (a `TorchDispatchMode`), not timed on the
host, so a busy host does not inflate it. The defaults (10 us a kernel, 300 GB/s) are on the
slow side for a GPU; the label states them. It is charged, never overlapped for free.
Host-to-device copies are not charged (the simulated device shares host memory).

Everything measured with it is a *simulation* of a device of that speed: its `label` says so,
and every figure built from it must carry that label.
"""
from __future__ import annotations

import threading
import time
from collections import deque

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SimulatedAccelerator", "SimEvent", "default_sim", "DEFAULT_STEP_MS", "DEFAULT_PER_SAMPLE_MS",
           "DEFAULT_KERNEL_US", "DEFAULT_BANDWIDTH_GBS"]

# The course's stand-in GPU: a step of 128 samples takes 1 + 128 * 0.05 = 7.4 ms (about 17,000
# samples/s). That is a made-up device, chosen so that, as beside a real GPU, the course's
# baseline input pipeline on a small CPU cannot keep up with it, while a good pipeline can.
DEFAULT_STEP_MS = 1.0
DEFAULT_PER_SAMPLE_MS = 0.05
# How the simulated device runs on-device tensor work (see the module docstring): a fixed cost
# per kernel plus the bytes each one moves. Slow for a GPU on purpose: charge too much, not too little.
DEFAULT_KERNEL_US = 10.0
DEFAULT_BANDWIDTH_GBS = 300.0


class _KernelCost(TorchDispatchMode):
    """Counts the tensor operations run inside it and the bytes they read and write (views,
    which move no data, are free)."""

    def __init__(self):
        super().__init__()
        self.kernels = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False):
            self.kernels += 1
            self.bytes += _nbytes(args) + _nbytes(kwargs) + _nbytes(out)
        return out


def _nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_nbytes(o) for o in obj.values())
    return 0


class SimEvent:
    """Like `torch.cuda.Event(enable_timing=True)`: records the moment the device reaches it."""

    def __init__(self):
        self._done = threading.Event()
        self.time_s: float | None = None

    def synchronize(self) -> None:
        self._done.wait()

    def query(self) -> bool:
        return self._done.is_set()

    def elapsed_time(self, end: "SimEvent") -> float:
        """Milliseconds between this event and `end` (both must have been reached)."""
        self.synchronize()
        end.synchronize()
        return (end.time_s - self.time_s) * 1e3


class SimulatedAccelerator:
    """A stand-in device whose steps take `step_ms` (+ `per_sample_ms` per sample) of device time.

    `max_queued` is how many launched steps may wait in the queue before `step()` blocks, as
    CUDA's launch queue (about a thousand kernels, a few dozen training steps) eventually blocks
    a host that runs too far ahead.
    """

    type = "sim"

    def __init__(self, step_ms: float = 20.0, *, per_sample_ms: float = 0.0, max_queued: int = 32,
                 kernel_us: float = DEFAULT_KERNEL_US, bandwidth_gbs: float = DEFAULT_BANDWIDTH_GBS):
        if step_ms < 0 or per_sample_ms < 0:
            raise ValueError("step_ms and per_sample_ms must be >= 0")
        if kernel_us < 0 or not bandwidth_gbs > 0:
            raise ValueError("kernel_us must be >= 0 and bandwidth_gbs > 0")
        self.kernel_us = float(kernel_us)
        self.bandwidth_gbs = float(bandwidth_gbs)
        self.charged_ms = 0.0        # device time charged by run() so far
        self.charged_kernels = 0
        if max_queued < 1:
            raise ValueError("max_queued must be >= 1")
        self.step_ms = float(step_ms)
        self.per_sample_ms = float(per_sample_ms)
        self.max_queued = int(max_queued)
        self._queue: deque = deque()
        self._cv = threading.Condition()
        self._busy_s = 0.0           # device time finished so far
        self._current_start = None   # when the item now running started
        self._closed = False
        self.steps_run = 0
        self._thread = threading.Thread(target=self._device_loop, name="sim-device", daemon=True)
        self._thread.start()

    # -- what lessons call -------------------------------------------------------------
    @property
    def label(self) -> str:
        per = f" + {self.per_sample_ms:g} ms/sample" if self.per_sample_ms else ""
        return (f"simulated accelerator ({self.step_ms:g} ms/step{per}; on-device tensor work charged at "
                f"{self.kernel_us:g} us/kernel + {self.bandwidth_gbs:g} GB/s; host {_host()})")

    def step_time_ms(self, batch_size: int = 0) -> float:
        """Device time one step of `batch_size` samples costs."""
        return self.step_ms + self.per_sample_ms * batch_size

    def step(self, batch=None) -> None:
        """Launch one training step on the device and return at once (asynchronously)."""
        n = _batch_size(batch)
        self.launch(self.step_time_ms(n))
        self.steps_run += 1

    def run(self, fn, *args, **kwargs):
        """Device-side tensor work: compute `fn(*args, **kwargs)` now (on the host, so the result is
        real) and queue on the device, before whatever is launched next, the time a GPU stream
        would take for its operations: `kernel_us` each plus their bytes at `bandwidth_gbs`.
        Returns what `fn` returns."""
        cost = _KernelCost()
        with cost:
            result = fn(*args, **kwargs)
        ms = cost.kernels * self.kernel_us / 1e3 + cost.bytes / (self.bandwidth_gbs * 1e9) * 1e3
        self.charged_ms += ms
        self.charged_kernels += cost.kernels
        self.launch(ms)
        return result

    def launch(self, ms: float) -> None:
        """Queue `ms` of device work; blocks only while `max_queued` items are already waiting."""
        with self._cv:
            while len(self._queue) >= self.max_queued and not self._closed:
                self._cv.wait()
            self._queue.append(("work", ms / 1e3))
            self._cv.notify_all()

    def record_event(self) -> SimEvent:
        """Queue an event; it completes when the device has finished all work launched before it."""
        event = SimEvent()
        with self._cv:
            self._queue.append(("event", event))
            self._cv.notify_all()
        return event

    def synchronize(self) -> None:
        """Wait until every launched step has finished (like `torch.cuda.synchronize()`)."""
        self.record_event().synchronize()

    def busy_seconds(self) -> float:
        """Device time spent so far, counting the part of the running step already done."""
        with self._cv:
            running = time.perf_counter() - self._current_start if self._current_start else 0.0
            return self._busy_s + running

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def __repr__(self) -> str:
        return (f"SimulatedAccelerator(step_ms={self.step_ms:g}, per_sample_ms={self.per_sample_ms:g}, "
                f"kernel_us={self.kernel_us:g}, bandwidth_gbs={self.bandwidth_gbs:g})")

    # -- the device thread ---------------------------------------------------------------
    def _device_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed and not self._queue:
                    return
                kind, payload = self._queue[0]
                if kind == "work":
                    self._current_start = time.perf_counter()
            if kind == "work":
                _sleep_precise(payload)
                with self._cv:
                    self._busy_s += time.perf_counter() - self._current_start
                    self._current_start = None
                    self._queue.popleft()
                    self._cv.notify_all()
            else:
                with self._cv:
                    self._queue.popleft()
                    self._cv.notify_all()
                payload.time_s = time.perf_counter()
                payload._done.set()


def default_sim(**overrides) -> SimulatedAccelerator:
    """The course's simulated accelerator (see DEFAULT_STEP_MS); keyword arguments override."""
    kwargs = {"step_ms": DEFAULT_STEP_MS, "per_sample_ms": DEFAULT_PER_SAMPLE_MS}
    kwargs.update(overrides)
    return SimulatedAccelerator(**kwargs)


def _sleep_precise(seconds: float) -> None:
    """Sleep (GIL released) to within ~0.1 ms: a plain sleep, then a short final wait."""
    end = time.perf_counter() + seconds
    if seconds > 0.002:
        time.sleep(seconds - 0.001)
    while True:
        left = end - time.perf_counter()
        if left <= 0:
            return
        time.sleep(min(left, 0.0002))


def _batch_size(batch) -> int:
    if batch is None:
        return 0
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return _batch_size(next(iter(batch.values())))
    return 0


def _host() -> str:
    from .env import usable_cores
    return f"CPU, {usable_cores()} cores"
