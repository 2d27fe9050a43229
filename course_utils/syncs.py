"""Find the calls that make the host wait for the GPU (lesson 05).

CUDA work is asynchronous, so the host normally runs ahead, queueing the next step while the
GPU computes. Any call that needs a *value* from the GPU (`loss.item()`, `print(loss)`,
`float(loss)`, `if loss > x:`, `.cpu()`, `.tolist()`) or waits on purpose
(`torch.cuda.synchronize()`, `torch.accelerator.synchronize()`, and `torch.cuda.empty_cache()`, whose
frees wait for the device)
stops it: the queue drains and the GPU idles while the host catches up.

`SyncCounter` counts those calls on any device, a CPU included (where they cost nothing but
would cost a synchronisation on a GPU):

    with SyncCounter() as syncs:
        run_the_loop()
    print(syncs.count, syncs.by_name())

It sees Python-level calls on tensors through a `torch.overrides.TorchFunctionMode`, and
`torch.cuda.synchronize` / `torch.cuda.empty_cache` through temporary wrappers. On a CUDA
machine it also turns on `torch.cuda.set_sync_debug_mode("warn")`, which flags synchronising
operations inside PyTorch itself (a boolean mask index, `nonzero`, a blocking copy), and the
count is the larger of the two tallies.
"""
from __future__ import annotations

import contextlib
import os
import traceback
import sys
import warnings
import weakref
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["SyncCounter", "SYNC_METHODS"]

# Tensor methods that need the tensor's value on the host: each is a sync on a GPU tensor.
SYNC_METHODS = frozenset({
    "item", "tolist", "numpy", "cpu", "__float__", "__int__", "__bool__", "__index__",
    "__format__", "__repr__", "__str__", "__array__", "nonzero", "masked_select", "unique",
})
_TO_NAMES = frozenset({"to"})
_MOVES = frozenset({"cpu", "to"})   # a sync only when they copy from a device to the host


def _internal(filename: str) -> bool:
    """Frames inside torch itself or this module: the caller we report is outside them."""
    path = filename.replace("\\", "/")
    # the course's checks count reads through their own modes (course_utils/checks/): the line to name is
    # the learner's, which called into them (walk w4-05: "__bool__ at lesson05.py:850")
    return (path.endswith("course_utils/syncs.py") or "/torch/" in path or path.endswith("contextlib.py")
            or "course_utils/checks/" in path)


def _name(func) -> str:
    return getattr(func, "__name__", None) or str(func)


def _to_host(args, kwargs) -> bool:
    """True when a Tensor.to(...) call moves the tensor to the CPU."""
    candidates = list(args[1:]) + [kwargs.get("device")]
    for c in candidates:
        if isinstance(c, str) and c.split(":")[0] == "cpu":
            return True
        if isinstance(c, torch.device) and c.type == "cpu":
            return True
    return False


_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


def _warning_at_caller(func, args, kwargs):
    """Run `func`, and give the warnings it raises (torch's "Converting a tensor with requires_grad=True to a
    scalar", say) the line of the code that made the call, not this module's line (walk w6-05)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = func(*args, **kwargs)
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith((_HERE, _TORCH)):
        frame = frame.f_back
    for w in caught:
        if frame is not None and os.path.abspath(w.filename).startswith((_HERE, _TORCH)):
            warnings.warn_explicit(w.message, w.category, frame.f_code.co_filename, frame.f_lineno,
                                   module=frame.f_globals.get("__name__"), registry=frame.f_globals.setdefault(
                                       "__warningregistry__", {}))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return result


class _CountingMode(TorchFunctionMode):
    def __init__(self, counter: "SyncCounter"):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        counter = self.counter
        first = args[0] if args else None
        moves_to_host = False
        if isinstance(first, torch.Tensor) and (name in SYNC_METHODS or name in _TO_NAMES):
            on_device = first.device.type != "cpu"
            if name in _MOVES:
                moves_to_host = on_device and (name == "cpu" or _to_host(args, kwargs))
                is_sync = moves_to_host
            else:
                is_sync = on_device or (counter.host_reads and not counter._is_on_host(first))
            if is_sync and not counter._paused:
                counter._record(name)
        if isinstance(first, torch.Tensor) and first.requires_grad and name in SYNC_METHODS:
            result = _warning_at_caller(func, args, kwargs)
        else:
            result = func(*args, **kwargs)
        if moves_to_host and isinstance(result, torch.Tensor):
            counter._mark_on_host(result)   # copied back already: reading it costs nothing more
        return result


class SyncCounter:
    """Count host-device synchronising calls made inside the `with` block (lesson 05).

    `count`: how many; `calls`: their names in order; `by_name()`: a tally; `where`: the file
    and line of each call (to find them). `paused()` leaves a stretch of code out (a check's
    own bookkeeping).

    What counts: a value read (`item`, `tolist`, `float()`, `print`, `if t:` ...) of a tensor
    on a GPU, a copy from a GPU to the host, `torch.cuda.synchronize` and `torch.cuda.empty_cache`.
    With `host_reads=True` (the default on a machine without a GPU) value reads of CPU tensors
    count too, as the syncs they would be if the tensor lived on a GPU; a tensor that was copied
    back from a GPU is not counted twice. `cuda_debug=True` (the default) also switches on
    `torch.cuda.set_sync_debug_mode("warn")` when a GPU is present.
    """

    def __init__(self, *, host_reads: bool | None = None, cuda_debug: bool = True):
        self.calls: list[str] = []
        self.where: list[str] = []
        self.cuda_warnings = 0
        self.cuda_warned: list[str] = []     # each flagged warning's text and the Python line it came from
        self.host_reads = (not torch.cuda.is_available()) if host_reads is None else bool(host_reads)
        self._cuda_debug = cuda_debug and torch.cuda.is_available()
        self._paused = False
        self._on_host: dict[int, weakref.ref] = {}
        self._stack = None

    def _is_on_host(self, tensor) -> bool:
        ref = self._on_host.get(id(tensor))
        return ref is not None and ref() is tensor

    def _mark_on_host(self, tensor) -> None:
        key = id(tensor)
        self._on_host[key] = weakref.ref(tensor, lambda _: self._on_host.pop(key, None))

    @property
    def count(self) -> int:
        return max(len(self.calls), self.cuda_warnings)

    def by_name(self) -> dict:
        return dict(Counter(self.calls))

    @contextlib.contextmanager
    def paused(self):
        previous, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = previous

    def _record(self, name: str) -> None:
        self.calls.append(name)
        frame = next((f for f in reversed(traceback.extract_stack()[:-2]) if not _internal(f.filename)), None)
        self.where.append(f"{frame.filename}:{frame.lineno}" if frame else "?")

    def _wrap(self, name, original):
        def wrapper(*args, **kwargs):
            if not self._paused:
                self._record(name)
            if name.endswith(".synchronize") and not torch.cuda.is_available():
                return None   # a CPU-only machine: nothing to wait for (the call still counts)
            return original(*args, **kwargs)
        wrapper.__wrapped__ = original
        return wrapper

    def __enter__(self) -> "SyncCounter":
        stack = contextlib.ExitStack()
        targets = [(torch.cuda, "torch.cuda", "synchronize"), (torch.cuda, "torch.cuda", "empty_cache")]
        if hasattr(getattr(torch, "accelerator", None), "synchronize"):     # torch 2.6+: the device-agnostic one
            targets.append((torch.accelerator, "torch.accelerator", "synchronize"))
        for module, prefix, attr in targets:
            original = getattr(module, attr)
            setattr(module, attr, self._wrap(f"{prefix}.{attr}", original))
            stack.callback(setattr, module, attr, original)
        if self._cuda_debug:
            previous = torch.cuda.get_sync_debug_mode()
            caught = stack.enter_context(warnings.catch_warnings(record=True))
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            stack.callback(torch.cuda.set_sync_debug_mode, previous)
            stack.callback(self._count_cuda_warnings, caught)
        stack.enter_context(_CountingMode(self))
        self._stack = stack
        return self

    def _count_cuda_warnings(self, caught) -> None:
        flagged = [w for w in caught if "synchroniz" in str(w.message)]
        self.cuda_warnings += len(flagged)
        self.cuda_warned.extend(f"{str(w.message)[:120]} ({os.path.basename(w.filename)}:{w.lineno})"
                                for w in flagged)

    def __exit__(self, *exc) -> None:
        stack, self._stack = self._stack, None
        stack.__exit__(*exc)
