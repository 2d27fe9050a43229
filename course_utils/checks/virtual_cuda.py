"""A virtual CUDA device on the CPU, so that a check can watch GPU code without a GPU.

Some wrong answers are right on a CPU and wrong on a GPU: nothing moved to the device, a
result brought back to the host, a side stream the consumer never waits for, memory handed
back to the allocator while another stream still reads it, a blocking copy every batch, a
pinned buffer the host refills while a queued copy still reads it.
On a machine without a GPU these mistakes are invisible, because every tensor is on the CPU
and every operation finishes before the next starts. Inside `with VirtualCuda() as vc:`

- `torch.device("cuda")` works: tensors created on it, or moved to it (`.to("cuda")`,
  `.cuda()`, `torch.tensor(..., device="cuda")`, `torch.Generator(device="cuda")`), report
  `device.type == "cuda"` and `is_cuda`, while their values live in host memory and every
  operation on them runs on the CPU (`DeviceTensor`, a tensor subclass); `torch.cuda.*`
  (is_available, Stream, Event, synchronize, manual_seed...) answers for the virtual device;
- an operation that mixes such a tensor with an ordinary (host) tensor of one or more
  dimensions raises the error real CUDA raises ("Expected all tensors to be on the same
  device ..."), and so does one that mixes two virtual devices (cuda:0 and cuda:1);
  zero-dimensional host tensors, Python numbers and host index tensors are allowed, as on CUDA
  (the latter are an implicit copy to the device, and are logged as one);
- every copy between host and device is logged (`vc.copies`): its direction, its bytes,
  whether the host memory was pinned (`tensor.pin_memory()` and `pin_memory=True` work, and
  mark the memory), whether it was `non_blocking`, the stream it was queued on, the point on
  that stream at which it is done (`seq`), and whether it made the host wait;
- a copy that does not make the host wait (`non_blocking=True` from pinned memory, either
  way) is done only when the host has waited for its stream's work (a synchronize, an event's
  synchronize, a blocking read or copy on that stream, a `query()` loop): until then a host
  write into the pinned memory it copies from, and a host read of the pinned memory it copies
  into, is a race (`vc.races`, kind "host_write" / "host_read"), as on a GPU, where the DMA runs
  when the stream reaches it; the destination of a non-blocking copy to the host holds
  garbage until then (NaN, or zeros), as a GPU's would;
- every call that makes the host wait for the device is logged (`vc.syncs`): `.item()`,
  `.cpu()`, `.tolist()`, `print(t)`, `torch.equal`, `nonzero`, a blocking copy,
  `torch.cuda.synchronize()`, `stream.synchronize()`, `event.synchronize()`, and a loop on
  `stream.query()` / `event.query()`: the first query about work not waited for answers False (on
  a GPU the copy is still in flight), the next about the same work is the host spinning until it is
  done (logged as a wait, then True);
- streams and events follow CUDA's ordering rules (`torch.cuda.Stream`, `torch.cuda.stream`,
  `current_stream`, `set_stream`, `wait_stream`, `wait_event`, `Event.record`, `Tensor.record_stream`):
  work queued on one stream is not visible on another until that one waits for it (or the
  host synchronised). Reading a tensor before the work that wrote it is visible is logged as
  a race (`vc.races`); a tensor allocated on one stream and used on another without
  `record_stream` for that stream is listed by `vc.unrecorded()`; `vc.reuse_hazards()` lists
  the ones whose memory was handed out again (the allocator reuses a freed block for the next
  allocation on its stream) before their stream had waited for that use: the real hazard, which
  `record_stream` or a wait back (`side.wait_stream(consumer)` before the next copy) prevents;
- the current stream and the current device are per thread, as CUDA's are, and threads started
  inside the block run inside it too (a thread that copies batches works as on a GPU);
- `VirtualCuda(second=True)` is the second device of two (`cuda:1` on a machine without a
  GPU) while the current device stays the first: code that only works on device 0 (a stream made
  without a device, `.to("cuda")`, `"cuda:0"`) is caught (`OTHER_DEVICE`);
- a `DataLoader(pin_memory=True)` pins its batches through the virtual device (in its own
  thread, with workers), and `torch.cuda.is_bf16_supported()` says yes;
- random numbers drawn for the device come from a generator of their own (seeded by
  `torch.manual_seed`, as CUDA's are); `vc.generator(seed)` makes a generator that reports
  `device.type == "cuda"` (every random op takes it: `randint`, `rand`, `bernoulli`, `uniform_`,
  `random_`, `multinomial`...), and drawing host numbers from it (or device numbers from a host
  generator) raises CUDA's error;
- `vc.ops` counts the operations run on the device (each a kernel launch on a GPU; views are
  not), `vc.peak_bytes` the most device memory allocated since `reset_log()` and alive at once.

It models what matters to the course's checks, not CUDA in full: no timing, no memory limit,
one device with memory (`cuda:0`, or the next index beside real GPUs, which
`torch.cuda.current_device()` then names and `device_count()` counts), no autograd at all (a
tensor on it cannot require gradients, and a model cannot move there: the checks run tensor work
on it, not training steps). Values are exactly the CPU's. Outside the `with` block,
`DeviceTensor`s still work (`.cpu()` gives the values) but nothing is logged. The checks of
lessons 03, 05 and 08 use it; check 5.5, which trains, uses `virtual_cuda_training` (tensors that
stay ordinary CPU tensors, with their device as a tag: autograd asks the CUDA runtime about a
tensor whose device is CUDA, and aborts without one).
"""
from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

__all__ = ["VirtualCuda", "DeviceTensor", "VirtualStream", "VirtualEvent", "Copy", "Sync", "Race",
           "MIXED_DEVICES", "OTHER_DEVICE"]

MIXED_DEVICES = ("Expected all tensors to be on the same device, but found at least two devices, "
                 "cuda:0 and cpu!")
# the start of the error raised when code asks for a CUDA device other than the virtual one
OTHER_DEVICE = "this code put work on a CUDA device other than the one it was given"
NO_AUTOGRAD = ("the virtual CUDA device computes no gradients: a check runs only tensor work there "
               "(copies, augmentation, normalisation), never a training step")
_REQUIRES_GRAD_SET = torch._C.TensorBase.requires_grad.__set__
_SYNC_OPS = frozenset({"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "_unique",
                       "_unique2", "unique_dim", "unique_consecutive", "nonzero_static"})
# torch functions that create a tensor from host data: with device="cuda" they copy it over
_FROM_HOST = frozenset({"tensor", "as_tensor", "asarray", "new_tensor"})
_RANDOM_FACTORIES = frozenset({"rand", "randn", "randint", "randperm", "normal"})
# what reads nothing of a tensor's values (its shape, where it lives): not a host read of a copy in flight
_METADATA = frozenset({"size", "dim", "numel", "element_size", "stride", "data_ptr", "untyped_storage",
                       "is_pinned", "__get__", "__len__", "storage_offset", "is_contiguous", "numpy", "__array__",
                       "nbytes", "itemsize", "ndimension", "nelement", "__hash__", "__eq__", "is_floating_point",
                       "is_complex", "type", "get_device", "__set__", "__delete__", "__reduce_ex__", "__deepcopy__"})
# Python's in-place operators on a tensor (their names at the torch-function level)
_INPLACE_DUNDER = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                             "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
                             "__imatmul__"})


@dataclass
class Copy:
    """One copy between host and device."""
    kind: str            # "h2d" or "d2h"
    nbytes: int
    pinned: bool         # the host side was pinned memory
    non_blocking: bool
    stream: int          # id of the stream it was queued on
    blocks_host: bool    # the host waited for it (a pageable or blocking copy)
    what: str            # the call, e.g. "Tensor.to", "torch.tensor", "index"
    where: str           # the line of code outside torch and this module that asked for it
    seq: int = -1        # the point on its stream at which it is done
    dst: int | None = None   # the device allocation a copy to the device wrote (its id)


@dataclass
class Sync:
    """A moment the host waited for the device."""
    what: str
    where: str
    cause: str = "wait"   # "h2d": a blocking copy to the device; "read": a value or copy back; "wait": a wait


@dataclass
class Race:
    """A read of memory before the work that wrote it was done where it was read: on a stream of the
    device ("device": the reading stream had not waited for the writer), or on the host ("host_write":
    the host wrote pinned memory a queued copy still copies from; "host_read": the host read the
    destination of a non-blocking copy to the host before it landed)."""
    what: str
    label: str
    stream: int
    writer: int
    where: str
    kind: str = "device"


class _Alloc:
    """A block of device memory: where it was allocated, who wrote it last, who used it."""
    _ids = itertools.count()

    def __init__(self, stream: "VirtualStream", label: str = "", nbytes: int = 0, epoch: int | None = None):
        self.id = next(self._ids)
        self.stream = stream.id
        self.write = (stream.id, stream.seq)
        self.used_on: set[int] = set()
        self.recorded: set[int] = set()
        self.last_use: dict[int, int] = {}       # stream id -> the point of its last use there
        self.label = label
        self.nbytes = nbytes
        self.epoch = epoch                       # the log it counts in (None: the check's own setup)
        self.freed = False


class _Token:
    """Held by every DeviceTensor of one allocation (views included): when the last one goes, the
    allocation is freed (handed back to the caching allocator of its stream)."""
    __slots__ = ("__weakref__",)


@dataclass
class _InFlight:
    """A non-blocking copy from pinned host memory, until the host has waited for it."""
    host: torch.Tensor        # the pinned source, as the copy read it
    snapshot: torch.Tensor    # its values when the copy was queued
    stream: int
    seq: int
    where: str
    flagged: bool = False


@dataclass
class _Landing:
    """A non-blocking copy into pinned host memory, until the host has waited for it."""
    host: torch.Tensor        # the destination
    values: torch.Tensor      # what lands there when the copy is done
    stream: int
    seq: int
    where: str
    flagged: bool = False


# code objects of a check's own wrappers around the device's methods (`passes_through`): never
# named as the line that asked for a copy or a wait
_PASS_THROUGH: set = set()


def passes_through(fn):
    """Mark `fn` (a check's wrapper around a method of the device) as not the code that asked: a
    copy or a wait made inside it is located at the line that called it."""
    _PASS_THROUGH.add(fn.__code__)
    return fn


def _where() -> str:
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if (frame.f_code in _PASS_THROUGH or path.endswith("checks/virtual_cuda.py") or "/torch/" in path
                or path.endswith("contextlib.py") or path.endswith("/threading.py")):
            frame = frame.f_back
            continue
        return f"{frame.f_code.co_filename}:{frame.f_lineno}"
    return "?"


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _poison(values: torch.Tensor) -> torch.Tensor:
    """What a non-blocking copy's destination holds before the copy lands: NaN for floating point
    (never right), zeros otherwise (what fresh pinned memory often holds: valid indices, wrong ones)."""
    if values.is_floating_point() or values.is_complex():
        return torch.full_like(values, float("nan"))
    return torch.zeros_like(values)


class DeviceTensor(torch.Tensor):
    """A tensor that reports the virtual CUDA device and keeps its values in host memory (see the module)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, inner: torch.Tensor, alloc: _Alloc, vc: "VirtualCuda", token: _Token | None = None,
                device: torch.device | None = None):
        out = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), storage_offset=inner.storage_offset(), dtype=inner.dtype,
            layout=inner.layout, device=device or vc.device, requires_grad=False)
        out._inner, out._alloc, out._vc, out._token = inner, alloc, vc, token
        return out

    def __init__(self, inner, alloc, vc, token=None, device=None):
        pass

    def __repr__(self, *, tensor_contents=None):
        if self._vc in _ACTIVE:
            self._vc._read(self, "print")
            self._vc._host_waits(self._vc._work_stream()._horizon(), "print (Tensor.__repr__)", "read")
        text = repr(self._inner)
        return text[:-1] + f", device='{self.device}')" if text.endswith(")") else text

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, DeviceTensor)]
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            a, b = sorted(str(d) for d in devices)[:2]
            raise RuntimeError(MIXED_DEVICES.replace("cuda:0 and cpu", f"{a} and {b}"))
        vc = next((t._vc for t in tensors if t._vc in _ACTIVE), tensors[0]._vc)
        return vc._dispatch(func, args, kwargs or {})


class VirtualStream:
    """A CUDA stream of the virtual device: an ordered queue of work, numbered."""

    def __init__(self, device=None, priority: int = 0, *, vc: "VirtualCuda | None" = None, index: int | None = None,
                 **kwargs):
        if vc is None:
            if not _ACTIVE:
                raise RuntimeError("a virtual CUDA stream can only be made inside `with VirtualCuda():`")
            vc = _ACTIVE[-1]
        self.vc = vc
        self.index = vc._resolve(device) if index is None else index
        self.id = next(vc._stream_ids)
        self.seq = 0                          # work items queued so far
        self.waited: dict[int, int] = {}      # stream id -> work of that stream this one waits for
        self.device = torch.device("cuda", self.index)
        self.device_index = self.index
        self.priority = priority
        self.kernels = 0                      # operations run on it, copies and allocations not counted
        self.first_kernel: tuple[str, str] | None = None
        vc.streams.append(self)
        vc._by_id[self.id] = self

    @property
    def cuda_stream(self) -> int:
        return self.id

    def sees(self, writer: tuple[int, int]) -> bool:
        stream, seq = writer
        return stream == self.id or self.waited.get(stream, -1) >= seq or self.vc._completed.get(stream, -1) >= seq

    def _horizon(self) -> dict[int, int]:
        out = dict(self.waited)
        out[self.id] = self.seq
        return out

    def _absorb(self, horizon: dict[int, int]) -> None:
        for stream, seq in horizon.items():
            if stream != self.id and seq > self.waited.get(stream, -1):
                self.waited[stream] = seq
        self.seq += 1

    def wait_stream(self, stream: "VirtualStream") -> None:
        """Later work on this stream waits for everything queued on `stream` so far."""
        self.vc.wait_calls.append((self.id, stream.id))
        self._absorb(stream._horizon())

    def wait_event(self, event: "VirtualEvent") -> None:
        self.vc.wait_calls.append((self.id, None))        # None: an event
        self._absorb(event._horizon)

    def record_event(self, event: "VirtualEvent | None" = None) -> "VirtualEvent":
        event = event or VirtualEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        self.vc._host_waits(self._horizon(), "stream.synchronize")

    @property
    def stream_id(self) -> int:
        return self.id

    def query(self) -> bool:
        """Whether the work queued on this stream is done (see `VirtualCuda._poll`)."""
        return self.vc._poll(self._horizon(), "stream.query()")

    def __enter__(self):
        self._ctx = self.vc.stream(self)
        return self._ctx.__enter__()

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)

    def __eq__(self, other) -> bool:
        return isinstance(other, VirtualStream) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("VirtualStream", self.id))

    def __repr__(self) -> str:
        default = " (default)" if self is self.vc._defaults.get(self.index) else ""
        return f"<virtual CUDA stream {self.id} on cuda:{self.index}{default}>"


class VirtualEvent:
    """A CUDA event of the virtual device: a point in a stream's work."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self._horizon: dict[int, int] = {}
        self._vc = None
        self._time = None

    def record(self, stream: VirtualStream | None = None) -> None:
        stream = stream or _ACTIVE[-1].current_stream()
        self._vc = stream.vc
        self._horizon = stream._horizon()
        self._time = time.perf_counter()

    def wait(self, stream: VirtualStream | None = None) -> None:
        (stream or _ACTIVE[-1].current_stream()).wait_event(self)

    def synchronize(self) -> None:
        if self._vc is not None:
            self._vc._host_waits(self._horizon, "event.synchronize")

    def query(self) -> bool:
        """Whether the work before the event is done (see `VirtualCuda._poll`)."""
        if self._vc is None:
            return True
        return self._vc._poll(self._horizon, "event.query()")

    def elapsed_time(self, end: "VirtualEvent") -> float:
        return (end._time - self._time) * 1e3


class _VirtualCudaGenerator(torch.Generator):
    """A host generator that says it belongs to the virtual CUDA device."""

    _device = torch.device("cuda", 0)

    @property
    def device(self):
        return self._device


class _AnyGenerator(type(torch._C.Generator)):
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, torch._C.Generator)


def _generator_class(vc: "VirtualCuda"):
    """What `torch.Generator` is inside the block: `torch.Generator(device="cuda")` makes a
    generator of the virtual device; any other device, an ordinary one."""
    class Generator(torch._C.Generator, metaclass=_AnyGenerator):
        def __new__(cls, device="cpu"):
            vc.generators_made += 1                 # a check can tell a generator made inside the answer
            if _is_cuda(device):
                vc._check_index(device, "torch.Generator")
                return vc.generator(torch._C.Generator().initial_seed())   # a new generator's default seed
            return torch._C.Generator(device)
    return Generator


_ACTIVE: list["VirtualCuda"] = []


class _DeviceContext:
    """What `torch.cuda.device(index)` is inside the block: the current device of this thread
    while the block runs."""

    def __init__(self, vc: "VirtualCuda", device=None):
        self.vc = vc
        self.idx = None if device is None or (isinstance(device, int) and device < 0) else vc._resolve(device)

    def __enter__(self):
        self.prev = self.vc._tls.device
        if self.idx is not None:
            self.vc._tls.device = self.idx
        return self

    def __exit__(self, *exc):
        self.vc._tls.device = self.prev
        return False


def _is_cuda(device) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return True
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def _pin_all(data, pin):
    """`data` (a DataLoader batch: tensors in tuples, lists, dicts, named tuples) with every
    tensor pinned by `pin`, as `torch.utils.data`'s pin_memory does it."""
    if isinstance(data, torch.Tensor):
        return pin(data)
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_pin_all(d, pin) for d in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_pin_all(d, pin) for d in data)
    if isinstance(data, dict):
        return type(data)({k: _pin_all(v, pin) for k, v in data.items()})
    return data


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _format(t, spec=""):
    if t.dim() == 0:
        return format(torch.ops.aten.item.default(t), spec)
    return format(repr(t), spec)


def _nonzero(t, *, as_tuple=False):
    out = torch.ops.aten.nonzero.default(t)
    return tuple(torch.ops.aten.unbind.int(out, 1)) if as_tuple else out


def _host_only(name):
    def fail(*args, **kwargs):
        raise TypeError(f"{name} is only implemented on CPU tensors")
    return fail


# Tensor methods whose Python bindings would ask the CUDA runtime for the device (and fail on
# a machine without one): the same work through aten operators, which reach the subclass.
_GUARDED = {
    "contiguous": lambda t, memory_format=torch.contiguous_format: torch.ops.aten.contiguous.default(
        t, memory_format=memory_format),
    "nonzero": _nonzero,
    "__float__": lambda t: float(torch.ops.aten.item.default(t)),
    "__int__": lambda t: int(torch.ops.aten.item.default(t)),
    "__index__": lambda t: int(torch.ops.aten.item.default(t)),
    "__complex__": lambda t: complex(torch.ops.aten.item.default(t)),
    "__invert__": lambda t: torch.ops.aten.bitwise_not.default(t),
    "copy_": lambda t, src, non_blocking=False: torch.ops.aten.copy_.default(t, src, non_blocking),
    "__format__": _format,
    "apply_": _host_only("apply_"),
    "map_": _host_only("map_"),
}


def _scalars_as_tensors(args):
    """torch.where(mask, -1, 1) or (mask, x, 0.0): Python numbers as 0-dim host tensors (which CUDA
    allows beside device tensors), so that torch's binding does not make them on the real CUDA device.
    The dtypes come out as torch's type promotion gives them for the Python numbers."""
    out = []
    for a in args:
        if isinstance(a, bool):
            out.append(torch.tensor(a))
        elif isinstance(a, int):
            out.append(torch.tensor(a, dtype=torch.int64))
        elif isinstance(a, float):
            out.append(torch.tensor(a, dtype=torch.get_default_dtype()))
        else:
            out.append(a)
    return tuple(out)


class _Mode(TorchFunctionMode):
    """Catches, at the level of Python calls, what cannot reach the tensor subclass: tensors
    created on or moved to the device from the host, pinning, streams in `record_stream`, host
    writes and reads of memory a copy in flight uses."""

    def __init__(self, vc: "VirtualCuda"):
        super().__init__()
        self.vc = vc

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        vc = self.vc
        if vc not in _ACTIVE:            # a thread that outlived the block
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        if vc._inflight or vc._landing:
            vc._host_access(name, args, kwargs)
        if name in ("to", "cuda", "cpu") and isinstance(first, torch.Tensor):
            return vc._move(func, name, first, args[1:], kwargs)
        if isinstance(first, DeviceTensor) and (name == "requires_grad_" and (args[1:2] or [kwargs.get(
                "requires_grad", True)])[0] or (func == _REQUIRES_GRAD_SET and args[1])):
            raise RuntimeError(NO_AUTOGRAD)
        if name == "pin_memory" and isinstance(first, torch.Tensor):
            return vc._pin(first)
        if name == "is_pinned" and isinstance(first, torch.Tensor):
            return vc.is_pinned(first)
        if isinstance(first, DeviceTensor) and name in _GUARDED:
            return _GUARDED[name](first, *args[1:], **kwargs)
        if name == "__getitem__" and isinstance(first, DeviceTensor):
            return vc._getitem(first, args[1])
        if name == "__setitem__" and isinstance(first, DeviceTensor):
            return vc._setitem(first, args[1], args[2])
        if name == "tolist" and isinstance(first, DeviceTensor):
            return vc._d2h(first, what="Tensor.tolist").tolist()
        if name in ("numpy", "__array__") and isinstance(first, DeviceTensor):
            raise TypeError(f"can't convert {first.device} device type tensor to numpy. Use Tensor.cpu() to copy "
                            "the tensor to host memory first.")
        leaves = None
        if name == "where":
            leaves = pytree.tree_leaves((args, kwargs))
            if any(isinstance(a, DeviceTensor) for a in leaves):
                args = _scalars_as_tensors(args)
        if name.startswith("new_") and isinstance(first, DeviceTensor):
            if "device" not in kwargs or _is_cuda(kwargs["device"]):
                if "device" in kwargs:
                    vc._check_index(kwargs["device"], f"Tensor.{name}")
                kwargs = dict(kwargs, device="cpu")
                out = func(first._inner, *args[1:], **kwargs)
                if name == "new_tensor":
                    vc._log_copy("h2d", out, pinned=False, non_blocking=False, what="Tensor.new_tensor")
                return vc._wrap_new(out, "Tensor." + name)
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            return vc._create(func, name, args, kwargs)
        if kwargs.get("pin_memory"):                     # torch.empty(..., pin_memory=True): pinned host memory
            out = func(*args, **dict(kwargs, pin_memory=False))
            if isinstance(out, torch.Tensor):
                vc._mark_pinned(out)
                vc.pinned_made.append(f"torch.{name}(..., pin_memory=True) at {_where()}")
            return out
        leaves = pytree.tree_leaves((args, kwargs)) if leaves is None else leaves
        generators = [a for a in leaves if isinstance(a, _VirtualCudaGenerator)]
        if generators:
            if not any(isinstance(a, DeviceTensor) for a in leaves):
                raise RuntimeError("Expected a 'cpu' device type for generator but found 'cuda'")
            # the generator reaches the device's operators as a plain torch._C.Generator (another
            # Python object): say here that this call's generators are the device's
            vc._tls.device_generator += 1
            try:
                return func(*args, **kwargs)
            finally:
                vc._tls.device_generator -= 1
        return func(*args, **kwargs)


class _ThreadState(threading.local):
    """What CUDA keeps per host thread: the current device and each device's current stream."""

    def __init__(self):
        self.device: int | None = None                 # None: the block's home device
        self.stacks: dict[int, list[VirtualStream]] = {}
        self.device_generator = 0                       # > 0 while a call passes a device generator


class VirtualCuda:
    """`with VirtualCuda() as vc:` runs CUDA code on the CPU and logs what it does (see the module).

    The device is `cuda:0` on a machine without a GPU; beside real GPUs it takes the next index
    (`cuda:1` beside one GPU), so that nothing made on it is mistaken for a real GPU's tensor
    (a cache of constants keyed by device, say). With `second=True` it takes the index after
    that, and the device before it (current in every thread until code selects another) is one
    that holds no memory: work put there raises `OTHER_DEVICE`.

    `VirtualCuda(index=k, count=n)` is GPU k of a node of n GPUs instead (lesson 07: a rank's own
    GPU, cuda:LOCAL_RANK): the current device is k until code selects another, `device_count()` n;
    work put on an index at or past n fails with CUDA's "invalid device ordinal", and on another
    GPU of the node with `other_device` (formatted with `found` and `own`) where given, else
    `OTHER_DEVICE`."""

    def __init__(self, *, second: bool = False, index: int | None = None, count: int | None = None,
                 other_device: str | None = None):
        real = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index is None:
            self.device = torch.device("cuda", real + (1 if second else 0))
            self._home = real                   # the current device until code selects another
        else:
            self.device = torch.device("cuda", int(index))
            self._home = int(index)
        self.count = int(count) if count is not None else self.device.index + 1
        self._strict = index is not None
        self._other_device = other_device
        self._stream_ids = itertools.count()
        self._by_id: dict[int, VirtualStream] = {}
        self._defaults: dict[int, VirtualStream] = {}
        self._tls = _ThreadState()
        self.streams: list[VirtualStream] = []
        self.copies: list[Copy] = []
        self.syncs: list[Sync] = []
        self.races: list[Race] = []
        self.wait_calls: list[tuple[int, int | None]] = []   # (waiting stream, stream waited for; None: an event)
        self.set_streams: list[str] = []             # where torch.cuda.set_stream was called
        self._polled: set = set()                    # work query() has answered False about once
        self.pins: list[str] = []                    # where memory was pinned by a copy (pin_memory() of pageable memory)
        self.generators_made = 0                     # torch.Generator(...) calls inside the block
        self.pinned_made: list[str] = []             # where pinned memory was allocated (torch.empty(..., pin_memory=True))
        self._completed: dict[int, int] = {}
        self._cross: dict[int, _Alloc] = {}          # allocations used on a stream they were not made on
        self._pinned: dict[int, torch.UntypedStorage] = {}
        self._inflight: dict[int, list[_InFlight]] = {}   # pinned source storage -> copies that still read it
        self._landing: dict[int, list[_Landing]] = {}     # pinned destination storage -> copies not landed yet
        self._freed: dict[int, list[_Alloc]] = {}         # stream id -> freed allocations used elsewhere, not reused yet
        self._hazards: list[_Alloc] = []
        self.default_stream = self._default(self.device.index)
        self._generator = torch.Generator()
        self._generator.manual_seed(torch.initial_seed())
        self.allocated_bytes = 0                     # device memory allocated since reset_log() (freed or not)
        self.peak_bytes = 0                          # the most of it alive at once
        self._live_bytes = 0
        self._epoch = 0
        self.ops = 0                                 # operations run on the device since reset_log()
        self._stack = None

    # -- what a check asks --------------------------------------------------------------------
    def h2d(self) -> list[Copy]:
        return [c for c in self.copies if c.kind == "h2d"]

    def d2h(self) -> list[Copy]:
        return [c for c in self.copies if c.kind == "d2h"]

    def unrecorded(self) -> list[_Alloc]:
        """Allocations used on a stream other than their own without `record_stream` for it."""
        return [a for a in self._cross.values() if a.used_on - a.recorded - {a.stream}]

    def reuse_hazards(self) -> list[_Alloc]:
        """Allocations used on a stream other than their own whose memory was handed out again on
        their own stream before it had waited for that use (and no `record_stream` for it): the
        next allocation there could overwrite what the other stream still reads."""
        return list(self._hazards)

    def is_pinned(self, t: torch.Tensor) -> bool:
        if isinstance(t, DeviceTensor) or t.device.type != "cpu":
            return False
        return t.untyped_storage().data_ptr() in self._pinned

    def generator(self, seed: int | None = None) -> torch.Generator:
        """A generator that reports this device (what `torch.Generator(device="cuda")` gives)."""
        g = _VirtualCudaGenerator()
        g._device = self.device
        if seed is None:
            g.seed()
        else:
            g.manual_seed(int(seed))
        return g

    def to_device(self, t: torch.Tensor, label: str = "") -> "DeviceTensor":
        """Put a copy of host tensor `t` on the virtual device without logging a copy (a check's own setup)."""
        if isinstance(t, DeviceTensor):
            return t
        inner = t.detach().clone()
        alloc, token = self._new_alloc(self._work_stream(), label, inner.untyped_storage().nbytes(), counted=False)
        return DeviceTensor(inner, alloc, self, token)

    def mark(self, t: "DeviceTensor", label: str) -> None:
        """Name the memory of `t` (it appears in race and record_stream reports)."""
        t._alloc.label = label

    def reset_log(self) -> None:
        self.copies.clear()
        self.syncs.clear()
        self.races.clear()
        self.pins.clear()
        self.pinned_made.clear()
        self._hazards.clear()
        self.allocated_bytes = self.peak_bytes = self._live_bytes = 0
        self._epoch += 1
        self.ops = 0
        for stream in self.streams:
            stream.kernels, stream.first_kernel = 0, None

    def settle(self) -> None:
        """Compare every pinned source of a copy still in flight with what it held when the copy was
        queued: a host write since then (any, numpy's included) is a race."""
        for entries in self._inflight.values():
            for entry in entries:
                self._changed(entry)

    # -- devices and streams -----------------------------------------------------------------------
    def _resolve(self, device) -> int:
        """The CUDA device index `device` names (None, "cuda": this thread's current device)."""
        if device is None:
            return self.current_device()
        if isinstance(device, VirtualStream):
            return device.index
        if isinstance(device, int):
            return device
        d = torch.device(device)
        return d.index if d.index is not None else self.current_device()

    def _check_index(self, device, what: str) -> None:
        idx = self._resolve(device)
        if idx != self.device.index and self._strict:       # a GPU of a node (lesson 07): as CUDA and NCCL say it
            if not 0 <= idx < self.count:
                raise RuntimeError(f"CUDA error: invalid device ordinal (cuda:{idx} asked for; this node has "
                                   f"{self.count} GPU(s), cuda:0 to cuda:{self.count - 1})")
            if self._other_device:
                raise RuntimeError(self._other_device.format(found=f"cuda:{idx}", own=self.device))
        if idx != self.device.index:
            named = device if isinstance(device, str) else (f"cuda:{device}" if isinstance(device, int) else device)
            raise RuntimeError(f"{OTHER_DEVICE}: {what} on {named} (cuda:{idx}), the device given was "
                               f"{self.device} ({_where()})")

    def current_device(self) -> int:
        return self._tls.device if self._tls.device is not None else self._home

    def _set_device(self, device) -> None:
        if isinstance(device, int) and device < 0:
            return
        self._tls.device = self._resolve(device)

    def _default(self, index: int) -> VirtualStream:
        if index not in self._defaults:
            self._defaults[index] = VirtualStream(vc=self, index=index)
        return self._defaults[index]

    def current_stream(self, device=None) -> VirtualStream:
        index = self._resolve(device)
        stack = self._tls.stacks.get(index)
        return stack[-1] if stack else self._default(index)

    def _work_stream(self) -> VirtualStream:
        """The stream work on this device is queued on now: its current stream in this thread."""
        return self.current_stream(self.device.index)

    @contextlib.contextmanager
    def stream(self, stream: VirtualStream | None, *, select_device: bool = True):
        """`torch.cuda.stream(stream)`: `stream` is its device's current stream in this thread while
        the block runs, and (as torch does it; not with `select_device=False`) its device the current one."""
        if stream is None:
            yield
            return
        if not isinstance(stream, VirtualStream):
            raise TypeError(f"expected a torch.cuda.Stream, got {type(stream).__name__}")
        tls = self._tls
        previous = tls.device
        stack = tls.stacks.setdefault(stream.index, [])
        slot = len(stack)
        stack.append(stream)
        if select_device:
            tls.device = stream.index             # as torch.cuda.stream does: the stream's device is current
        try:
            yield stream
        finally:
            if stream in stack:
                del stack[len(stack) - 1 - stack[::-1].index(stream)]
            elif len(stack) > slot:              # torch.cuda.set_stream replaced it inside the block
                del stack[slot]
            tls.device = previous

    def synchronize(self, device=None) -> None:
        index = self._resolve(device)
        horizon = {s.id: s.seq for s in self.streams if s.index == index}
        self._host_waits(horizon, "torch.cuda.synchronize")

    def _host_waits(self, horizon: dict[int, int], what: str, cause: str = "wait", *, log: bool = True) -> None:
        for entries in self._inflight.values():       # what the host wrote before the copies it waits for were done
            for entry in entries:
                if horizon.get(entry.stream, -1) >= entry.seq:
                    self._changed(entry)
        for stream, seq in horizon.items():
            if seq > self._completed.get(stream, -1):
                self._completed[stream] = seq
        self._retire()
        if log:
            self._sync(what, cause)

    def _poll(self, horizon: dict[int, int], what: str) -> bool:
        """`query()`: work the host has not waited for is not done the first time it is asked about
        (nothing on the virtual device runs until the host waits, as a copy is still in flight on a
        GPU when the host asks at once); asked again about the same work, with nothing queued in
        between, it is a poll loop: the host spun until the work was done, which is a host wait
        (logged, `cause` "wait") that returns True."""
        pending = tuple(sorted((s, q) for s, q in horizon.items() if q > self._completed.get(s, -1)))
        if not pending:
            return True
        if pending not in self._polled:
            self._polled.add(pending)
            return False
        self._host_waits(horizon, f"{what} in a loop (the host spun until the work was done)")
        return True

    def _set_stream(self, stream) -> None:
        """`torch.cuda.set_stream(stream)`: this thread's current stream (and device) from now on, not
        a context: it stays until something sets another (a `with torch.cuda.stream(...)` block
        entered before puts its own previous stream back when it ends)."""
        if stream is None:
            return
        if not isinstance(stream, VirtualStream):
            raise TypeError(f"expected a torch.cuda.Stream, got {type(stream).__name__}")
        self.set_streams.append(_where())
        stack = self._tls.stacks.setdefault(stream.index, [])
        if stack:
            stack[-1] = stream
        else:
            stack.append(stream)
        self._tls.device = stream.index

    def _done(self, stream: int, seq: int) -> bool:
        return self._completed.get(stream, -1) >= seq

    def _retire(self) -> None:
        """Copies the host has now waited for: sources free to write, destinations landed."""
        for key in list(self._inflight):
            left = [e for e in self._inflight[key] if not self._done(e.stream, e.seq)]
            if left:
                self._inflight[key] = left
            else:
                del self._inflight[key]
        for key in list(self._landing):
            left = []
            for e in self._landing[key]:
                if self._done(e.stream, e.seq):
                    with torch._C.DisableTorchFunction():
                        e.host.copy_(e.values)
                else:
                    left.append(e)
            if left:
                self._landing[key] = left
            else:
                del self._landing[key]

    def _changed(self, entry: _InFlight) -> None:
        if entry.flagged:
            return
        with torch._C.DisableTorchFunction():
            same = entry.host.shape == entry.snapshot.shape and torch.equal(entry.host, entry.snapshot)
        if not same:
            entry.flagged = True
            self.races.append(Race(f"the host changed pinned memory that a non-blocking copy (queued at {entry.where}) "
                                   "was still copying to the device", "pinned host memory", -1, entry.stream,
                                   entry.where, "host_write"))

    def _host_access(self, name: str, args, kwargs) -> None:
        """A call on host tensors while copies are in flight: a write into a pinned source, or any
        read of a destination that has not landed, is a race."""
        if name in _METADATA:
            return
        writes = name in _INPLACE_DUNDER or (name.endswith("_") and not name.startswith("_"))
        outs = kwargs.get("out")
        outs = [outs] if isinstance(outs, torch.Tensor) else list(outs or [])
        for i, a in enumerate(pytree.tree_leaves((args, {k: v for k, v in kwargs.items() if k != "out"}))):
            if not isinstance(a, torch.Tensor) or isinstance(a, DeviceTensor) or a.device.type != "cpu":
                continue
            key = _ptr(a)
            if i == 0 and writes:
                outs.append(a)
            for entry in self._landing.get(key, []):
                if not entry.flagged and not self._done(entry.stream, entry.seq):
                    entry.flagged = True
                    self.races.append(Race(f"the host read ({name}) the destination of a non-blocking copy to the host "
                                           f"(queued at {entry.where}) before it had landed", "pinned host memory",
                                           -1, entry.stream, _where(), "host_read"))
        for t in outs:
            if not isinstance(t, torch.Tensor) or isinstance(t, DeviceTensor):
                continue
            for entry in self._inflight.get(_ptr(t), []):
                if not entry.flagged and not self._done(entry.stream, entry.seq):
                    entry.flagged = True
                    self.races.append(Race(f"the host wrote ({name}) pinned memory that a non-blocking copy (queued "
                                           f"at {entry.where}) was still copying to the device", "pinned host memory",
                                           -1, entry.stream, _where(), "host_write"))

    def _sync(self, what: str, cause: str = "wait") -> None:
        self.syncs.append(Sync(what, _where(), cause))

    def reads(self) -> list[Sync]:
        """Host waits other than blocking copies to the device: values or tensors read back, waits."""
        return [s for s in self.syncs if s.cause != "h2d"]

    # -- entering and leaving ----------------------------------------------------------------
    def __enter__(self) -> "VirtualCuda":
        stack = contextlib.ExitStack()
        vc = self

        def patch(name, value):
            original = getattr(torch.cuda, name)
            setattr(torch.cuda, name, value)
            stack.callback(setattr, torch.cuda, name, original)

        def seed_all(seed):
            vc._generator.manual_seed(int(seed))

        patch("is_available", lambda: True)
        # beside real GPUs the virtual device is cuda:N after them: code that asks for "the current
        # device" or counts the devices must land on it, not on a real GPU (issue 19, item 18)
        patch("device_count", lambda: vc.count)
        patch("current_device", vc.current_device)
        patch("set_device", vc._set_device)
        patch("device", lambda device=None: _DeviceContext(vc, device))
        patch("get_device_name", lambda device=None: "virtual CUDA device (the CPU)")
        patch("is_current_stream_capturing", lambda: False)
        patch("Stream", VirtualStream)
        patch("Event", VirtualEvent)
        patch("stream", lambda stream: vc.stream(stream))
        patch("current_stream", vc.current_stream)
        patch("set_stream", vc._set_stream)
        patch("default_stream", lambda device=None: vc._default(vc._resolve(device)))
        patch("synchronize", vc.synchronize)
        patch("empty_cache", lambda: vc._sync("torch.cuda.empty_cache"))
        patch("manual_seed", seed_all)
        patch("manual_seed_all", seed_all)
        patch("is_bf16_supported", lambda including_emulation=True: True)
        # a DataLoader with pin_memory=True asks torch.accelerator for the device and pins each batch
        # in a thread of its own: both answer for the virtual device
        for name, value in (("current_device_index", vc.current_device),
                            ("set_device_index", vc._set_device)):
            stack.callback(setattr, torch.accelerator, name, getattr(torch.accelerator, name))
            setattr(torch.accelerator, name, value)
        from torch.utils.data._utils import pin_memory as pin_module
        stack.callback(setattr, pin_module, "pin_memory", pin_module.pin_memory)
        pin_module.pin_memory = lambda data, device=None: _pin_all(data, vc._pin)
        self._generator.manual_seed(torch.initial_seed())
        # Tensor.record_stream parses its stream argument before any mode could see it
        original_record = torch.Tensor.__dict__.get("record_stream")
        torch.Tensor.record_stream = lambda t, stream: vc._record_stream(t, stream)
        if original_record is None:
            stack.callback(delattr, torch.Tensor, "record_stream")
        else:
            stack.callback(setattr, torch.Tensor, "record_stream", original_record)
        original_generator = torch.Generator
        torch.Generator = _generator_class(self)
        stack.callback(setattr, torch, "Generator", original_generator)
        # threads started inside the block run inside it too (CUDA code in a loader's thread):
        # the mode is per-thread, so each new thread enters it first
        original_bootstrap = threading.Thread._bootstrap_inner

        def bootstrap(thread):
            if vc not in _ACTIVE:
                return original_bootstrap(thread)
            with _Mode(vc):
                return original_bootstrap(thread)
        threading.Thread._bootstrap_inner = bootstrap
        stack.callback(setattr, threading.Thread, "_bootstrap_inner", original_bootstrap)
        # model.to("cuda") must give the parameters this device's tensors, not copy into the old ones
        previous = torch.__future__.get_overwrite_module_params_on_conversion()
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        stack.callback(torch.__future__.set_overwrite_module_params_on_conversion, previous)
        stack.enter_context(_Mode(self))
        _ACTIVE.append(self)
        stack.callback(_ACTIVE.remove, self)
        self._stack = stack
        return self

    def __exit__(self, *exc) -> None:
        stack, self._stack = self._stack, None
        stack.__exit__(*exc)

    # -- the work --------------------------------------------------------------------------------
    def _new_alloc(self, stream: VirtualStream, label: str, nbytes: int, *, counted: bool = True):
        """A new block of device memory on `stream` (the caching allocator may hand it a block freed
        on that stream: whatever another stream still does with that block must be ordered first)."""
        for freed in self._freed.pop(stream.id, []):
            if self._reused_early(freed):
                self._hazards.append(freed)
        alloc = _Alloc(stream, label, nbytes, self._epoch if counted else None)
        token = _Token()
        finalizer = weakref.finalize(token, self._free, alloc)
        finalizer.atexit = False
        if counted:
            self.allocated_bytes += nbytes
            self._live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self._live_bytes)
        return alloc, token

    def _free(self, alloc: _Alloc) -> None:
        alloc.freed = True
        if alloc.epoch == self._epoch:
            self._live_bytes -= alloc.nbytes
        if any(s != alloc.stream for s in alloc.last_use):
            self._freed.setdefault(alloc.stream, []).append(alloc)

    def _reused_early(self, alloc: _Alloc) -> bool:
        """Whether handing `alloc`'s memory out again now, on its own stream, could overwrite it
        while another stream still uses it."""
        home = self._by_id.get(alloc.stream)
        for stream, seq in alloc.last_use.items():
            if stream == alloc.stream or stream in alloc.recorded:
                continue
            if (home is not None and home.waited.get(stream, -1) >= seq) or self._done(stream, seq):
                continue
            return True
        return False

    def _wrap_new(self, t: torch.Tensor, label: str = "") -> DeviceTensor:
        stream = self._work_stream()
        alloc, token = self._new_alloc(stream, label, t.untyped_storage().nbytes())
        stream.seq += 1
        alloc.write = (stream.id, stream.seq)
        self.ops += 1
        return DeviceTensor(t, alloc, self, token)

    def _log_copy(self, kind, t, *, pinned, non_blocking, what, stream=None, seq=-1, dst=None):
        stream = stream or self._work_stream()
        blocks = not (pinned and non_blocking)
        self.copies.append(Copy(kind, _nbytes(t), pinned, non_blocking, stream.id, blocks, what, _where(), seq, dst))
        if blocks:
            if non_blocking and kind == "h2d":       # pageable: the host stages the data, the stream is not waited for
                self._sync(f"{what} ({kind}, blocking)", "h2d")
            else:                                    # copy, then wait for the stream (torch's memcpy_and_sync)
                self._host_waits(stream._horizon(), f"{what} ({kind}, blocking)", "h2d" if kind == "h2d" else "read")

    def _read(self, t: DeviceTensor, what: str) -> None:
        if t._vc is not self:
            return      # made on an earlier virtual device, which has exited: its work has all finished
        stream = self._work_stream()
        alloc = t._alloc
        if not stream.sees(alloc.write):
            self.races.append(Race(what, alloc.label, stream.id, alloc.write[0], _where()))
        alloc.last_use[stream.id] = stream.seq + 1           # the work about to be queued there
        if stream.id != alloc.stream:
            alloc.used_on.add(stream.id)
            self._cross[alloc.id] = alloc

    def _in_flight(self, host: torch.Tensor, stream: VirtualStream, seq: int) -> None:
        """A non-blocking copy from pinned `host`: it reads `host` when its stream gets to it."""
        key = _ptr(host)
        for entry in self._inflight.get(key, []):     # another copy from the same memory: was it changed meanwhile?
            self._changed(entry)
        with torch._C.DisableTorchFunction():
            snapshot = host.detach().clone()
        self._inflight.setdefault(key, []).append(_InFlight(host.detach(), snapshot, stream.id, seq, _where()))

    def _h2d(self, host: torch.Tensor, *, dtype=None, non_blocking=False, what="Tensor.to") -> DeviceTensor:
        pinned = self.is_pinned(host)
        inner = host.detach().to(dtype=dtype or host.dtype, copy=True)
        out = self._wrap_new(inner)
        stream = self._work_stream()
        self._log_copy("h2d", host, pinned=pinned, non_blocking=non_blocking, what=what, seq=stream.seq,
                       dst=out._alloc.id)
        if pinned and non_blocking:
            self._in_flight(host, stream, stream.seq)
        return out

    def _d2h(self, t: DeviceTensor, *, dtype=None, non_blocking=False, what="Tensor.cpu") -> torch.Tensor:
        self._read(t, what)
        stream = self._work_stream()
        stream.seq += 1
        self.ops += 1
        values = t._inner.to(dtype=dtype or t.dtype, copy=True)
        if non_blocking:            # torch copies into pinned memory and returns before the copy lands
            out = _poison(values)
            self._mark_pinned(out)
            self._log_copy("d2h", t._inner, pinned=True, non_blocking=True, what=what, seq=stream.seq)
            self._landing.setdefault(_ptr(out), []).append(_Landing(out, values, stream.id, stream.seq, _where()))
            return out
        self._log_copy("d2h", t._inner, pinned=False, non_blocking=False, what=what, seq=stream.seq)
        return values

    def _mark_pinned(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        self._pinned[storage.data_ptr()] = storage

    def _pin(self, t: torch.Tensor, *, log: bool = True) -> torch.Tensor:
        """`t` in pinned memory (a copy, unless it is pinned already); `log`: note where (`vc.pins`)."""
        if isinstance(t, DeviceTensor):
            raise RuntimeError("cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned")
        if self.is_pinned(t):
            return t
        with torch._C.DisableTorchFunction():
            out = t.detach().clone()
        self._mark_pinned(out)
        if log:
            self.pins.append(_where())
        return out

    def _record_stream(self, t: torch.Tensor, stream) -> None:
        if not isinstance(t, DeviceTensor):
            # what CUDA says, near enough, and which tensor (w12-03: labels left on the host)
            raise RuntimeError(f"record_stream is only valid for CUDA tensors (a host tensor of shape "
                               f"{tuple(t.shape)}, {str(t.dtype).replace('torch.', '')})")
        if not isinstance(stream, VirtualStream):
            raise TypeError(f"record_stream() expects a torch.cuda.Stream, got {type(stream).__name__}")
        t._alloc.recorded.add(stream.id)

    def _move(self, func, name, t, args, kwargs):
        """Tensor.to / .cuda / .cpu, from or to the device."""
        device, dtype, non_blocking = None, None, bool(kwargs.get("non_blocking", False))
        if name == "cuda":
            device = args[0] if args and not isinstance(args[0], bool) else kwargs.get("device")
            device = torch.device("cuda") if device is None else (
                torch.device("cuda", device) if isinstance(device, int) else torch.device(device))
            bools = [a for a in args if isinstance(a, bool)]
            if bools:
                non_blocking = bools[0]
        elif name == "cpu":
            device = torch.device("cpu")
        else:
            positional = list(args)
            for a in positional:
                if isinstance(a, torch.Tensor):
                    device, dtype = a.device, a.dtype
                elif isinstance(a, torch.dtype):
                    dtype = a
                elif isinstance(a, (torch.device, str, int)) and not isinstance(a, bool):
                    device = torch.device(a) if not isinstance(a, int) else torch.device("cuda", a)
            bools = [a for a in positional if isinstance(a, bool)]
            if bools:
                non_blocking = bools[0]
            device = kwargs.get("device", device)
            dtype = kwargs.get("dtype", dtype)
        to_cuda = device is not None and _is_cuda(device)
        if to_cuda:
            self._check_index(device, f"Tensor.{name}")
        if isinstance(t, DeviceTensor):
            if device is not None and not to_cuda:
                return self._d2h(t, dtype=dtype, non_blocking=non_blocking, what=f"Tensor.{name}")
            if dtype is None or dtype == t.dtype:
                return t if not kwargs.get("copy") else t.clone()
            return t.to(dtype=dtype)                 # a cast on the device (through the subclass)
        if to_cuda:
            return self._h2d(t, dtype=dtype, non_blocking=non_blocking, what=f"Tensor.{name}")
        return func(t, *args, **kwargs)

    def _index_parts(self, t, index):
        """Python indexing as aten ops (what torch's own __getitem__ does, which a tensor that
        says it is on CUDA cannot use here): the basic part applied, the tensor part listed."""
        aten = torch.ops.aten
        items = index if isinstance(index, tuple) else (index,)

        def as_index(x):
            if isinstance(x, DeviceTensor):
                return x
            if isinstance(x, torch.Tensor):
                return self._h2d(x, what="indexing with a host tensor")
            return self._h2d(torch.tensor(x), what="indexing with a list")

        def as_int(x):
            """A Python int for an index or a slice bound; a device tensor's value is a read on the host."""
            if isinstance(x, DeviceTensor):
                self._read(x, "a device tensor used as an index or a slice bound")
                self._host_waits(self._work_stream()._horizon(),
                                 "a device tensor used as an index or a slice bound (int())", "read")
                return int(x._inner)
            return int(x)

        specified = sum(1 for i in items if i is not None and i is not Ellipsis and not isinstance(i, bool))
        out, dim, tensors = t, 0, []
        for item in items:
            if item is Ellipsis:
                skip = t.dim() - specified
                tensors.extend([None] * skip)
                dim += skip
            elif item is None:
                out = aten.unsqueeze.default(out, dim)
                tensors.append(None)
                dim += 1
            elif isinstance(item, bool):
                raise NotImplementedError("the virtual CUDA device does not index with a Python bool")
            elif isinstance(item, int) or (isinstance(item, torch.Tensor) and item.dim() == 0
                                           and not item.is_floating_point() and item.dtype != torch.bool):
                out = aten.select.int(out, dim, as_int(item))
            elif isinstance(item, slice):
                start = 0 if item.start is None else as_int(item.start)
                stop = (2 ** 63 - 1) if item.stop is None else as_int(item.stop)
                out = aten.slice.Tensor(out, dim, start, stop, 1 if item.step is None else as_int(item.step))
                tensors.append(None)
                dim += 1
            else:
                index_tensor = as_index(item)
                tensors.append(index_tensor)
                dim += index_tensor.dim() if index_tensor.dtype == torch.bool else 1
        while tensors and tensors[-1] is None:
            tensors.pop()
        return out, tensors

    def _getitem(self, t, index):
        out, tensors = self._index_parts(t, index)
        if any(i is not None for i in tensors):
            return torch.ops.aten.index.Tensor(out, tensors)
        return out if out is not t else torch.ops.aten.alias.default(t)

    def _setitem(self, t, index, value):
        out, tensors = self._index_parts(t, index)
        if not isinstance(value, torch.Tensor):
            if not any(i is not None for i in tensors) and isinstance(value, (bool, int, float)):
                torch.ops.aten.fill_.Scalar(out, value)       # a Python number is a kernel argument: no copy
                return
            value = torch.tensor(value, dtype=t.dtype)
        if any(i is not None for i in tensors):
            torch.ops.aten.index_put_.default(out, tensors, value)
        else:
            torch.ops.aten.copy_.default(out, value)

    def _create(self, func, name, args, kwargs):
        """A torch function called with device="cuda": run it on the host, put the result on the device."""
        self._check_index(kwargs["device"], f"torch.{name}")
        generator = kwargs.get("generator")
        if generator is not None and not isinstance(generator, _VirtualCudaGenerator):
            raise RuntimeError("Expected a 'cuda' device type for generator but found 'cpu'")
        kwargs = dict(kwargs, device="cpu")
        pinned = bool(kwargs.pop("pin_memory", False))
        if pinned:
            raise RuntimeError("Only dense CPU tensors can be pinned")
        if generator is None and name in _RANDOM_FACTORIES:
            kwargs["generator"] = self._generator
        args, kwargs = pytree.tree_map_only(DeviceTensor, lambda d: d._inner, (args, kwargs))
        out = func(*args, **kwargs)
        if name in _FROM_HOST:
            self._log_copy("h2d", out, pinned=False, non_blocking=False, what=f"torch.{name}")
        if isinstance(out, torch.Tensor):
            return self._wrap_new(out, f"torch.{name}")
        return out

    def _dispatch(self, func, args, kwargs):
        name = func.overloadpacket.__name__
        leaves = pytree.tree_leaves((args, kwargs))
        devices = [a for a in leaves if isinstance(a, DeviceTensor)]
        hosts = [a for a in leaves if isinstance(a, torch.Tensor) and not isinstance(a, DeviceTensor)]
        stream = self._work_stream()

        if name == "_to_copy" and not _is_cuda(kwargs.get("device", self.device)):
            return self._d2h(args[0], dtype=kwargs.get("dtype"), non_blocking=kwargs.get("non_blocking", False),
                             what="Tensor.to")
        if name == "copy_":
            dst, src = args[0], args[1]
            non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            if isinstance(dst, DeviceTensor) and not isinstance(src, DeviceTensor) and src.device.type == "cpu":
                pinned = self.is_pinned(src)
                self._read(dst, "copy_")
                dst._inner.copy_(src)
                stream.seq += 1
                self.ops += 1
                dst._alloc.write = (stream.id, stream.seq)
                self._log_copy("h2d", src, pinned=pinned, non_blocking=non_blocking, what="Tensor.copy_",
                               seq=stream.seq, dst=dst._alloc.id)
                if pinned and non_blocking:
                    self._in_flight(src, stream, stream.seq)
                return dst
            if not isinstance(dst, DeviceTensor) and dst.device.type == "cpu":              # device -> host
                self._read(src, "copy_")
                stream.seq += 1
                self.ops += 1
                if non_blocking and self.is_pinned(dst):   # queued: lands when the stream gets there
                    self._log_copy("d2h", src._inner, pinned=True, non_blocking=True, what="Tensor.copy_",
                                   seq=stream.seq)
                    values = src._inner.to(dtype=dst.dtype, copy=True).expand(dst.shape)
                    self._landing.setdefault(_ptr(dst), []).append(_Landing(dst, values, stream.id, stream.seq,
                                                                            _where()))
                    return dst
                self._log_copy("d2h", src._inner, pinned=False, non_blocking=False, what="Tensor.copy_",
                               seq=stream.seq)
                dst.copy_(src._inner)
                return dst
        indexing = name in ("index", "index_put_", "_index_put_impl_", "index_put")
        indices = [i for i in (args[1] if indexing and len(args) > 1 else []) if isinstance(i, torch.Tensor)]
        if indexing and not isinstance(args[0], DeviceTensor):
            raise RuntimeError("indices should be either on cpu or on the same device as the indexed tensor (cpu)")
        for h in hosts:
            if indexing and isinstance(args[0], DeviceTensor):
                if h.dim() > 0:
                    self._log_copy("h2d", h, pinned=self.is_pinned(h), non_blocking=False,
                                   what="indexing with a host tensor")
            elif h.dim() > 0 or h.device.type != "cpu":
                raise RuntimeError(MIXED_DEVICES.replace("cuda:0 and cpu", f"{self.device} and {h.device}"))
        if any(i.dtype == torch.bool for i in indices):
            self._host_waits(stream._horizon(), "indexing with a boolean mask", "read")
        for g in (a for a in leaves if isinstance(a, torch.Generator)):
            if not isinstance(g, _VirtualCudaGenerator) and not self._tls.device_generator:
                raise RuntimeError("Expected a 'cuda' device type for generator but found 'cpu'")

        if torch.is_grad_enabled() and any(h.requires_grad for h in hosts):
            raise RuntimeError(NO_AUTOGRAD)
        if not func.is_view:                  # a view reads no memory
            for d in devices:
                self._read(d, name)
        if name in _SYNC_OPS:
            self._host_waits(stream._horizon(), f"aten.{name}", "read")

        schema_args = func._schema.arguments
        if any(a.name == "generator" for a in schema_args):
            # a random op on the device with generator=None draws from the device's own generator
            pos = next(i for i, a in enumerate(schema_args) if a.name == "generator")
            if (kwargs.get("generator") is None) and not (len(args) > pos and args[pos] is not None):
                kwargs = dict(kwargs, generator=self._generator)

        def unwrap(x):
            return x._inner if isinstance(x, DeviceTensor) else x
        inner_args, inner_kwargs = pytree.tree_map(unwrap, (args, kwargs))
        if "device" in inner_kwargs and _is_cuda(inner_kwargs["device"]):
            self._check_index(inner_kwargs["device"], f"aten.{name}")
            inner_kwargs["device"] = torch.device("cpu")
        out = func(*inner_args, **inner_kwargs)
        if not isinstance(out, (torch.Tensor, list, tuple)):
            return out
        stream.seq += 1
        if not func.is_view:
            self.ops += 1
            stream.kernels += 1
            if stream.first_kernel is None:
                stream.first_kernel = (f"aten.{name}", _where())
        storages = {}
        for d in devices:
            storages.setdefault(d._inner.untyped_storage().data_ptr(), d)
        mutable = func._schema.is_mutable

        def wrap(x):
            if not isinstance(x, torch.Tensor) or isinstance(x, DeviceTensor):
                return x
            owner = storages.get(x.untyped_storage().data_ptr()) if x.untyped_storage().nbytes() else None
            if owner is not None:
                for d in devices:   # an in-place op returns its input itself
                    if d._inner is x:
                        if mutable:
                            d._alloc.write = (stream.id, stream.seq)
                        return d
                if mutable:
                    owner._alloc.write = (stream.id, stream.seq)
                return DeviceTensor(x, owner._alloc, self, owner._token)      # a view of device memory
            alloc, token = self._new_alloc(stream, "", x.untyped_storage().nbytes())
            alloc.write = (stream.id, stream.seq)
            return DeviceTensor(x, alloc, self, token)
        return pytree.tree_map(wrap, out)
