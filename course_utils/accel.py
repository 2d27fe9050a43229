"""CUDA-only calls behind small helpers that also run on a CPU (lesson 03; used by the loop).

A lesson's GPU branch must also run, line for line, under `COURSE_DEVICE=cpu` (see
`course_utils.target`), so that CI executes it on a machine without a GPU. Only the calls that
exist for CUDA alone differ, and they go through here:

- `new_stream(device)`, `current_stream(device)`, `use_stream(stream)`: a CUDA stream, or on the
  CPU a `HostStream`, which has the same methods and does nothing (CPU work is synchronous:
  everything "queued" has already happened).
- `record_stream(batch, stream)`: tell CUDA's caching allocator that `stream` uses the batch's
  memory; nothing to tell on the CPU.
- `pin(batch)`, `pinning_helps()`: page-locked host memory, when a GPU is there to copy to
  (pinning without one only costs a copy, and torch warns).
- `Event(run_on)`: a timing event on the device's own clock: a CUDA event, the simulated
  accelerator's event, or on the CPU the host clock at `record()`.
"""
from __future__ import annotations

import contextlib
import time

import torch

__all__ = ["HostStream", "new_stream", "current_stream", "use_stream", "record_stream", "pin",
           "pinning_helps", "Event", "is_cuda"]


def is_cuda(device) -> bool:
    """True for a CUDA torch device (not for the CPU or the simulated accelerator)."""
    if getattr(device, "type", None) == "sim":
        return False
    return torch.device(device).type == "cuda"


class HostStream:
    """What a CUDA stream offers, for the CPU, where every operation has finished when it returns."""

    def __init__(self, device="cpu"):
        self.device = torch.device(device)

    def wait_stream(self, other) -> None:
        """Nothing to wait for: the other stream's work is done."""

    def wait_event(self, event) -> None:
        """Nothing to wait for."""

    def synchronize(self) -> None:
        """Nothing queued."""

    def query(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"HostStream({self.device})"


def new_stream(device):
    """A new side stream on `device`: `torch.cuda.Stream` on CUDA, a `HostStream` elsewhere."""
    if is_cuda(device):
        return torch.cuda.Stream(device=torch.device(device))
    return HostStream(device if getattr(device, "type", None) != "sim" else "cpu")


def current_stream(device):
    """The stream work on `device` is queued on now (the consumer's stream)."""
    if is_cuda(device):
        return torch.cuda.current_stream(torch.device(device))
    return HostStream(device if getattr(device, "type", None) != "sim" else "cpu")


def use_stream(stream):
    """Context manager: queue the work inside it on `stream` (`torch.cuda.stream`); a no-op for a
    `HostStream`."""
    if isinstance(stream, torch.cuda.Stream):
        return torch.cuda.stream(stream)
    return contextlib.nullcontext()


def record_stream(batch, stream) -> None:
    """`tensor.record_stream(stream)` for every CUDA tensor in `batch` (tensor, tuple, list, dict):
    the caching allocator will not hand their memory out again until `stream`'s work queued so
    far is done. Nothing to do for host tensors or a `HostStream`."""
    if not isinstance(stream, torch.cuda.Stream):
        return
    if isinstance(batch, torch.Tensor):
        if batch.is_cuda:
            batch.record_stream(stream)
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            record_stream(b, stream)
    elif isinstance(batch, dict):
        for b in batch.values():
            record_stream(b, stream)


def pinning_helps() -> bool:
    """Pinned (page-locked) host memory speeds up copies to a GPU; without one it only costs."""
    return torch.cuda.is_available()


def pin(batch):
    """`batch` (tensor, tuple, list, dict) in pinned host memory when a GPU is there to copy to;
    unchanged otherwise."""
    if not pinning_helps():
        return batch
    if isinstance(batch, torch.Tensor):
        return batch if batch.is_cuda or batch.is_pinned() else batch.pin_memory()
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(pin(b) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(pin(b) for b in batch)
    if isinstance(batch, dict):
        return {k: pin(v) for k, v in batch.items()}
    return batch


class Event:
    """A point on the device's own timeline, for timing without synchronising every step.

        start, end = Event(run_on), Event(run_on)
        start.record(); ...queue work...; end.record()
        ...later, once: end.synchronize(); start.elapsed_ms(end)

    On CUDA a `torch.cuda.Event(enable_timing=True)` recorded on the current stream; beside the
    simulated accelerator, an event queued behind the launched work; on the CPU, where work is
    synchronous, the host clock when `record()` is called.
    """

    def __init__(self, run_on):
        self.run_on = run_on
        self._kind = "sim" if getattr(run_on, "type", None) == "sim" else ("cuda" if is_cuda(run_on) else "host")
        self._event = torch.cuda.Event(enable_timing=True) if self._kind == "cuda" else None
        self._time_s: float | None = None

    def record(self) -> "Event":
        if self._kind == "cuda":
            self._event.record(torch.cuda.current_stream(torch.device(self.run_on)))
        elif self._kind == "sim":
            self._event = self.run_on.record_event()
        else:
            self._time_s = time.perf_counter()
        return self

    def host_time_s(self) -> float | None:
        """When the device reached this event, on the host's `time.perf_counter()` clock, where
        that is known (the CPU, the simulator); None for a CUDA event (it has only elapsed times)."""
        if self._kind == "host":
            return self._time_s
        if self._kind == "sim" and self._event is not None:
            self._event.synchronize()
            return self._event.time_s
        return None

    def synchronize(self) -> None:
        """Wait until the device has reached this event."""
        if self._event is not None:
            self._event.synchronize()

    def elapsed_ms(self, later: "Event") -> float:
        """Milliseconds of device time from this event to `later` (waits for both)."""
        if self._kind == "host":
            if self._time_s is None or later._time_s is None:
                raise RuntimeError("both events must be recorded before elapsed_ms()")
            return (later._time_s - self._time_s) * 1e3
        if self._event is None or later._event is None:
            raise RuntimeError("both events must be recorded before elapsed_ms()")
        later.synchronize()
        return float(self._event.elapsed_time(later._event))
