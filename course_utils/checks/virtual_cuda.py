"""A virtual CUDA device on the CPU, so that a check can watch GPU code without a GPU.

Some wrong answers are right on a CPU and wrong on a GPU: nothing moved to the device, a
result brought back to the host, a side stream the consumer never waits for, memory handed
back to the allocator while another stream still reads it, a blocking copy every batch.
On a machine without a GPU these mistakes are invisible, because every tensor is on the CPU
and every operation finishes before the next starts. Inside `with VirtualCuda() as vc:`

- `torch.device("cuda")` works: tensors created on it, or moved to it (`.to("cuda")`,
  `.cuda()`, `torch.tensor(..., device="cuda")`, `torch.Generator(device="cuda")`), report
  `device.type == "cuda"` and `is_cuda`, while their values live in host memory and every
  operation on them runs on the CPU (`DeviceTensor`, a tensor subclass); `torch.cuda.*`
  (is_available, Stream, Event, synchronize, manual_seed...) answers for the virtual device;
- an operation that mixes such a tensor with an ordinary (host) tensor of one or more
  dimensions raises the error real CUDA raises ("Expected all tensors to be on the same
  device ..."); zero-dimensional host tensors and host index tensors are allowed, as on CUDA
  (the latter are an implicit copy to the device, and are logged as one);
- every copy between host and device is logged (`vc.copies`): its direction, its bytes,
  whether the host memory was pinned (`tensor.pin_memory()` works, and marks the memory),
  whether it was `non_blocking`, the stream it was queued on, and whether it made the host
  wait;
- every call that makes the host wait for the device is logged (`vc.syncs`): `.item()`,
  `.cpu()`, `.tolist()`, `print(t)`, `torch.equal`, `nonzero`, a blocking copy,
  `torch.cuda.synchronize()`, `stream.synchronize()`, `event.synchronize()`;
- streams and events follow CUDA's ordering rules (`torch.cuda.Stream`, `torch.cuda.stream`,
  `current_stream`, `wait_stream`, `wait_event`, `Event.record`, `Tensor.record_stream`):
  work queued on one stream is not visible on another until that one waits for it (or the
  host synchronised). Reading a tensor before the work that wrote it is visible is logged as
  a race (`vc.races`); a tensor allocated on one stream and used on another without
  `record_stream` for that stream (so the caching allocator could reuse its memory while the
  other stream still reads it) is listed by `vc.unrecorded()`;
- a `DataLoader(pin_memory=True)` pins its batches through the virtual device (in its own
  thread, with workers), and `torch.cuda.is_bf16_supported()` says yes;
- random numbers drawn for the device come from a generator of their own (seeded by
  `torch.manual_seed`, as CUDA's are); `vc.generator(seed)` makes a generator that reports
  `device.type == "cuda"`, and drawing host numbers from it (or device numbers from a host
  generator) raises CUDA's error.

It models what matters to the course's checks, not CUDA in full: no timing, no memory limit
(`vc.allocated_bytes` counts what was allocated), one device (`cuda:0`, or the next index
beside real GPUs, which `torch.cuda.current_device()` then names and `device_count()` counts), no autograd at all (a tensor on it cannot require gradients, and a model
cannot move there: the checks run tensor work on it, not training steps), and tensors created
in other threads are plain host tensors (the mode is per-thread, like the current stream).
Values are exactly the CPU's. Outside the `with` block, `DeviceTensor`s still work (`.cpu()`
gives the values) but nothing is logged. The checks of lessons 03 and 05 use it; check 5.5, which
trains, uses `virtual_cuda_training` (tensors that stay ordinary CPU tensors, with their device as
a tag: autograd asks the CUDA runtime about a tensor whose device is CUDA, and aborts without one).
"""
from __future__ import annotations

import contextlib
import itertools
import time
import traceback
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

__all__ = ["VirtualCuda", "DeviceTensor", "VirtualStream", "VirtualEvent", "Copy", "Sync", "Race",
           "MIXED_DEVICES"]

MIXED_DEVICES = ("Expected all tensors to be on the same device, but found at least two devices, "
                 "cuda:0 and cpu!")
NO_AUTOGRAD = ("the virtual CUDA device computes no gradients: a check runs only tensor work there "
               "(copies, augmentation, normalisation), never a training step")
_REQUIRES_GRAD_SET = torch._C.TensorBase.requires_grad.__set__
_SYNC_OPS = frozenset({"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "_unique",
                       "_unique2", "unique_dim", "unique_consecutive", "nonzero_static"})
# torch functions that create a tensor from host data: with device="cuda" they copy it over
_FROM_HOST = frozenset({"tensor", "as_tensor", "asarray", "new_tensor"})
_RANDOM_FACTORIES = frozenset({"rand", "randn", "randint", "randperm", "normal"})


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


@dataclass
class Sync:
    """A moment the host waited for the device."""
    what: str
    where: str
    cause: str = "wait"   # "h2d": a blocking copy to the device; "read": a value or copy back; "wait": a wait


@dataclass
class Race:
    """A read of device memory before the work that wrote it was visible on the reading stream."""
    what: str
    label: str
    stream: int
    writer: int
    where: str


class _Alloc:
    """A block of device memory: where it was allocated, who wrote it last, who used it."""
    _ids = itertools.count()

    def __init__(self, stream: "VirtualStream", label: str = ""):
        self.id = next(self._ids)
        self.stream = stream.id
        self.write = (stream.id, stream.seq)
        self.used_on: set[int] = set()
        self.recorded: set[int] = set()
        self.label = label


def _where() -> str:
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = frame.filename.replace("\\", "/")
        if path.endswith("checks/virtual_cuda.py") or "/torch/" in path or path.endswith("contextlib.py"):
            continue
        return f"{frame.filename}:{frame.lineno}"
    return "?"


class DeviceTensor(torch.Tensor):
    """A tensor that reports the virtual CUDA device and keeps its values in host memory (see the module)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, inner: torch.Tensor, alloc: _Alloc, vc: "VirtualCuda"):
        out = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), storage_offset=inner.storage_offset(), dtype=inner.dtype,
            layout=inner.layout, device=vc.device, requires_grad=False)
        out._inner, out._alloc, out._vc = inner, alloc, vc
        return out

    def __init__(self, inner, alloc, vc):
        pass

    def __repr__(self, *, tensor_contents=None):
        if self._vc in _ACTIVE:
            self._vc._read(self, "print")
            self._vc._sync("print (Tensor.__repr__)", "read")
        text = repr(self._inner)
        return text[:-1] + f", device='{self.device}')" if text.endswith(")") else text

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        vc = next(a._vc for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, DeviceTensor))
        return vc._dispatch(func, args, kwargs or {})


class VirtualStream:
    """A CUDA stream of the virtual device: an ordered queue of work, numbered."""

    def __init__(self, device=None, priority: int = 0, *, vc: "VirtualCuda | None" = None, **kwargs):
        if vc is None:
            if not _ACTIVE:
                raise RuntimeError("a virtual CUDA stream can only be made inside `with VirtualCuda():`")
            vc = _ACTIVE[-1]
        self.vc = vc
        self.id = next(vc._stream_ids)
        self.seq = 0                          # work items queued so far
        self.waited: dict[int, int] = {}      # stream id -> work of that stream this one waits for
        self.device = vc.device
        self.priority = priority
        vc.streams.append(self)

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
        self._absorb(stream._horizon())

    def wait_event(self, event: "VirtualEvent") -> None:
        self._absorb(event._horizon)

    def record_event(self, event: "VirtualEvent | None" = None) -> "VirtualEvent":
        event = event or VirtualEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        self.vc._host_waits(self._horizon(), "stream.synchronize")

    def query(self) -> bool:
        return True

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
        return f"<virtual CUDA stream {self.id}{' (default)' if self.id == 0 else ''}>"


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
        return True

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
            if _is_cuda(device):
                return vc.generator(torch._C.Generator().initial_seed())   # a new generator's default seed
            return torch._C.Generator(device)
    return Generator


_ACTIVE: list["VirtualCuda"] = []


class _DeviceContext:
    """What `torch.cuda.device(index)` is inside the block: the virtual device is the only one,
    so selecting a device changes nothing (the real one would ask the CUDA runtime for it)."""

    def __init__(self, device=None):
        self.idx = device.index if isinstance(device, torch.device) else device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
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


class _Mode(TorchFunctionMode):
    """Catches, at the level of Python calls, what cannot reach the tensor subclass: tensors
    created on or moved to the device from the host, pinning, streams in `record_stream`."""

    def __init__(self, vc: "VirtualCuda"):
        super().__init__()
        self.vc = vc

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        vc = self.vc
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
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
        if name.startswith("new_") and isinstance(first, DeviceTensor):
            if "device" not in kwargs or _is_cuda(kwargs["device"]):
                kwargs = dict(kwargs, device="cpu")
                out = func(first._inner, *args[1:], **kwargs)
                if name == "new_tensor":
                    vc._log_copy("h2d", out, pinned=False, non_blocking=False, what="Tensor.new_tensor")
                return vc._wrap_new(out, "Tensor." + name)
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            vc._claim(kwargs["device"])
            return vc._create(func, name, args, kwargs)
        generator = kwargs.get("generator")
        if isinstance(generator, _VirtualCudaGenerator) and not any(
                isinstance(a, DeviceTensor) for a in pytree.tree_leaves((args, kwargs))):
            raise RuntimeError("Expected a 'cpu' device type for generator but found 'cuda'")
        return func(*args, **kwargs)


class VirtualCuda:
    """`with VirtualCuda() as vc:` runs CUDA code on the CPU and logs what it does (see the module).

    The device is `cuda:0` on a machine without a GPU; beside real GPUs it takes the next index
    (`cuda:1` beside one GPU), so that nothing made on it is mistaken for a real GPU's tensor
    (a cache of constants keyed by device, say).

    `VirtualCuda(index=k, count=n)` is GPU k of a node of n GPUs instead (lesson 07: a rank's own
    GPU, cuda:LOCAL_RANK): `current_device()` is k, `device_count()` n; a tensor asked for on an
    index at or past n fails with CUDA's "invalid device ordinal", and one on another GPU of the
    node with `other_device` (formatted with `found` and `own`), where given."""

    def __init__(self, *, index: int | None = None, count: int | None = None, other_device: str | None = None):
        real = torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.device = torch.device("cuda", real if index is None else int(index))
        self.count = int(count) if count is not None else self.device.index + 1
        self._strict = index is not None
        self._other_device = other_device
        self._stream_ids = itertools.count()
        self.streams: list[VirtualStream] = []
        self.copies: list[Copy] = []
        self.syncs: list[Sync] = []
        self.races: list[Race] = []
        self._completed: dict[int, int] = {}
        self._cross: dict[int, _Alloc] = {}          # allocations used on a stream they were not made on
        self._pinned: dict[int, torch.UntypedStorage] = {}
        self.default_stream = VirtualStream(vc=self)
        self._current = [self.default_stream]
        self._generator = torch.Generator()
        self._generator.manual_seed(torch.initial_seed())
        self.allocated_bytes = 0                     # device memory allocated so far (never freed here)
        self._stack = None

    def _claim(self, device) -> None:
        """A tensor asked for on `device`: with an `index` given, another index fails as it would there."""
        if not self._strict:
            return
        try:
            k = device if isinstance(device, int) else torch.device(device).index
        except (RuntimeError, TypeError):
            return
        if k is None or k == self.device.index:
            return
        if not 0 <= k < self.count:
            raise RuntimeError(f"CUDA error: invalid device ordinal (cuda:{k} asked for; this node has "
                               f"{self.count} GPU(s), cuda:0 to cuda:{self.count - 1})")
        if self._other_device:
            raise RuntimeError(self._other_device.format(found=f"cuda:{k}", own=self.device))

    # -- what a check asks --------------------------------------------------------------------
    def h2d(self) -> list[Copy]:
        return [c for c in self.copies if c.kind == "h2d"]

    def d2h(self) -> list[Copy]:
        return [c for c in self.copies if c.kind == "d2h"]

    def unrecorded(self) -> list[_Alloc]:
        """Allocations used on a stream other than their own without `record_stream` for it."""
        return [a for a in self._cross.values() if a.used_on - a.recorded - {a.stream}]

    def is_pinned(self, t: torch.Tensor) -> bool:
        if isinstance(t, DeviceTensor) or t.device.type != "cpu":
            return False
        return t.untyped_storage().data_ptr() in self._pinned

    def generator(self, seed: int | None = None) -> torch.Generator:
        """A generator that reports device cuda:0 (what `torch.Generator(device="cuda")` gives)."""
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
        return DeviceTensor(t.detach().clone(), _Alloc(self.current_stream(), label), self)

    def mark(self, t: "DeviceTensor", label: str) -> None:
        """Name the memory of `t` (it appears in race and record_stream reports)."""
        t._alloc.label = label

    def reset_log(self) -> None:
        self.copies.clear()
        self.syncs.clear()
        self.races.clear()
        self.allocated_bytes = 0

    # -- streams --------------------------------------------------------------------------------
    def current_stream(self, device=None) -> VirtualStream:
        return self._current[-1]

    @contextlib.contextmanager
    def stream(self, stream: VirtualStream | None):
        if stream is None:
            yield
            return
        if not isinstance(stream, VirtualStream):
            raise TypeError(f"expected a torch.cuda.Stream, got {type(stream).__name__}")
        self._current.append(stream)
        try:
            yield stream
        finally:
            self._current.pop()

    def synchronize(self, device=None) -> None:
        horizon = {}
        for s in self.streams:
            horizon[s.id] = s.seq
        self._host_waits(horizon, "torch.cuda.synchronize")

    def _host_waits(self, horizon: dict[int, int], what: str, cause: str = "wait") -> None:
        for stream, seq in horizon.items():
            if seq > self._completed.get(stream, -1):
                self._completed[stream] = seq
        self._sync(what, cause)

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
        patch("current_device", lambda: vc.device.index)
        patch("set_device", lambda device: None)
        patch("device", _DeviceContext)
        patch("get_device_name", lambda device=None: "virtual CUDA device (the CPU)")
        patch("is_current_stream_capturing", lambda: False)
        patch("Stream", VirtualStream)
        patch("Event", VirtualEvent)
        patch("stream", lambda stream: vc.stream(stream))
        patch("current_stream", vc.current_stream)
        patch("default_stream", lambda device=None: vc.default_stream)
        patch("synchronize", vc.synchronize)
        patch("empty_cache", lambda: vc._sync("torch.cuda.empty_cache"))
        patch("manual_seed", seed_all)
        patch("manual_seed_all", seed_all)
        patch("is_bf16_supported", lambda including_emulation=True: True)
        # a DataLoader with pin_memory=True asks torch.accelerator for the device and pins each batch
        # in a thread of its own (outside this per-thread mode): both answer for the virtual device
        for name, value in (("current_device_index", lambda: vc.device.index),
                            ("set_device_index", lambda index: None)):
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
    def _wrap_new(self, t: torch.Tensor, label: str = "") -> DeviceTensor:
        stream = self.current_stream()
        stream.seq += 1
        self.allocated_bytes += t.untyped_storage().nbytes()
        return DeviceTensor(t, _Alloc(stream, label), self)

    def _log_copy(self, kind, t, *, pinned, non_blocking, what, stream=None):
        stream = stream or self.current_stream()
        blocks = not (pinned and non_blocking)
        self.copies.append(Copy(kind, _nbytes(t), pinned, non_blocking, stream.id, blocks, what, _where()))
        if blocks:
            self._sync(f"{what} ({kind}, blocking)", "h2d" if kind == "h2d" else "read")

    def _read(self, t: DeviceTensor, what: str) -> None:
        if t._vc is not self:
            return      # made on an earlier virtual device, which has exited: its work has all finished
        stream = self.current_stream()
        alloc = t._alloc
        if not stream.sees(alloc.write):
            self.races.append(Race(what, alloc.label, stream.id, alloc.write[0], _where()))
        if stream.id != alloc.stream:
            alloc.used_on.add(stream.id)
            self._cross[alloc.id] = alloc

    def _h2d(self, host: torch.Tensor, *, dtype=None, non_blocking=False, what="Tensor.to") -> DeviceTensor:
        pinned = self.is_pinned(host)
        self._log_copy("h2d", host, pinned=pinned, non_blocking=non_blocking, what=what)
        inner = host.detach().to(dtype=dtype or host.dtype, copy=True)
        out = self._wrap_new(inner)
        if not (pinned and non_blocking):        # a blocking copy has finished when the call returns
            self._completed[out._alloc.write[0]] = max(self._completed.get(out._alloc.write[0], -1), out._alloc.write[1])
        return out

    def _d2h(self, t: DeviceTensor, *, dtype=None, non_blocking=False, what="Tensor.cpu") -> torch.Tensor:
        self._read(t, what)
        self._log_copy("d2h", t._inner, pinned=False, non_blocking=non_blocking, what=what)
        self.current_stream().seq += 1
        return t._inner.to(dtype=dtype or t.dtype, copy=True)

    def _pin(self, t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, DeviceTensor):
            raise RuntimeError("cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned")
        if self.is_pinned(t):
            return t
        out = t.detach().clone()
        storage = out.untyped_storage()
        self._pinned[storage.data_ptr()] = storage
        return out

    def _record_stream(self, t: torch.Tensor, stream) -> None:
        if not isinstance(t, DeviceTensor):
            raise RuntimeError("record_stream is only valid for CUDA tensors")   # what CUDA says, near enough
        if not isinstance(stream, VirtualStream):
            raise TypeError(f"record_stream() expects a torch.cuda.Stream, got {type(stream).__name__}")
        t._alloc.recorded.add(stream.id)

    def _move(self, func, name, t, args, kwargs):
        """Tensor.to / .cuda / .cpu, from or to the device."""
        device, dtype, non_blocking = None, None, bool(kwargs.get("non_blocking", False))
        if name == "cuda":
            device = self.device
            if args and isinstance(args[0], bool):
                non_blocking = args[0]
            elif args and args[0] is not None:
                self._claim(args[0] if not isinstance(args[0], int) else torch.device("cuda", args[0]))
            elif kwargs.get("device") is not None:
                self._claim(kwargs["device"])
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
        if to_cuda and name == "to":
            self._claim(device)
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
                self._sync("a device tensor used as an index or a slice bound (int())", "read")
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
            value = torch.tensor(value, dtype=t.dtype)
        if any(i is not None for i in tensors):
            torch.ops.aten.index_put_.default(out, tensors, value)
        else:
            torch.ops.aten.copy_.default(out, value)

    def _create(self, func, name, args, kwargs):
        """A torch function called with device="cuda": run it on the host, put the result on the device."""
        generator = kwargs.get("generator")
        if generator is not None and not isinstance(generator, _VirtualCudaGenerator):
            raise RuntimeError("Expected a 'cuda' device type for generator but found 'cpu'")
        kwargs = dict(kwargs, device="cpu")
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
        stream = self.current_stream()

        if name == "_to_copy" and not _is_cuda(kwargs.get("device", self.device)):
            return self._d2h(args[0], dtype=kwargs.get("dtype"), non_blocking=kwargs.get("non_blocking", False),
                             what="Tensor.to")
        if name == "copy_":
            dst, src = args[0], args[1]
            non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            if isinstance(dst, DeviceTensor) and not isinstance(src, DeviceTensor) and src.device.type == "cpu":
                self._log_copy("h2d", src, pinned=self.is_pinned(src), non_blocking=non_blocking, what="Tensor.copy_")
                self._read(dst, "copy_")
                dst._inner.copy_(src)
                stream.seq += 1
                dst._alloc.write = (stream.id, stream.seq)
                return dst
            if not isinstance(dst, DeviceTensor) and dst.device.type == "cpu":              # device -> host
                self._read(src, "copy_")
                pinned = self.is_pinned(dst)
                self._log_copy("d2h", src._inner, pinned=pinned, non_blocking=non_blocking, what="Tensor.copy_")
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
            if not isinstance(g, _VirtualCudaGenerator):
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
            inner_kwargs["device"] = torch.device("cpu")
        out = func(*inner_args, **inner_kwargs)
        if not isinstance(out, (torch.Tensor, list, tuple)):
            return out
        stream.seq += 1
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
                return DeviceTensor(x, owner._alloc, self)      # a view of device memory
            self.allocated_bytes += x.untyped_storage().nbytes()
            return DeviceTensor(x, _Alloc(stream), self)
        return pytree.tree_map(wrap, out)
