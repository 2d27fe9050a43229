"""The virtual CUDA device for training steps: GPU code that trains, graded on the CPU (lesson 05).

`virtual_cuda.VirtualCuda` runs tensor work on a device that says "cuda" (a tensor subclass), but
it cannot train: autograd asks the CUDA runtime about any tensor whose device is CUDA, and on a
machine without a GPU that aborts the process. This device keeps every tensor an ordinary CPU
tensor, so autograd, optimizers and `torch.cuda.graph`'s emulation (`course_utils.graph_capture`)
work, and keeps *where it lives* as a tag:

- tensors the check puts there (`vc.put(tensor)`, `vc.put_module(model)`) are device tensors,
  and so is everything computed from one (a `TorchDispatchMode` tags the results of every
  operation, backward's included) and everything made with `device="cuda"`, `.cuda()` or
  `.to("cuda")`; a tensor made on the host (`torch.empty(shape)` without a device, `.cpu()`,
  `torch.from_numpy`) is a host tensor;
- `tensor.device`, `.is_cuda`, `.is_cpu` and `.get_device()` answer from the tag (a
  `TorchFunctionMode` sees those getters), so code that asks where a tensor lives takes its GPU
  branch; an operation that mixes a device tensor with a host tensor of one or more dimensions
  raises what CUDA raises ("Expected all tensors to be on the same device ...");
- every wait of the host for the device is logged (`vc.syncs`): `.item()`, `float()`, `bool()` (an
  `if` on a tensor), `.tolist()`, `.cpu()`, `print()`, a format string, `torch.equal`, `nonzero`, a
  boolean mask, a blocking copy to the device, `torch.cuda.synchronize()`,
  `event.synchronize()`, `stream.synchronize()`, `torch.cuda.empty_cache()`; inside a capture
  each raises CUDA's error instead; `.numpy()` of a device tensor raises CUDA's TypeError;
- `torch.cuda` answers for the device: `is_available()`, `device_count()`, `current_device()`,
  streams, events, graphs (`graph_capture.EmulatedGraphs`, with `vc.graphs`: streams order the
  work, and a use of memory by one stream before it waited for another's work on it is logged in
  `vc.graphs.races`), `pin_memory()` (an unsafe call during a capture, from any thread in 'global'
  mode); so does `torch.accelerator` (`current_accelerator()`, `is_available()`, ...);
- the device has an index (`VirtualCudaTraining(index=1)` makes it `cuda:1`, and the current
  device): a tensor made on another index (`device="cuda:0"` written into the code) is on another
  GPU, and mixing it into the device's work raises what CUDA raises; a host tensor written in place
  with a device tensor (`host_total += loss`, even a 0-dim one) raises too.

It models what check 5.5 needs, not CUDA in full: no timing, no memory limit, one device that
computes (`cuda:0`, or the next index beside real GPUs, or the index asked for; other indices are
tags only), and the tags are kept on the Python tensor objects. Values are exactly the CPU's.
"""
from __future__ import annotations

import contextlib
import sys
import traceback
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..graph_capture import EmulatedGraphs, _list_index, tensors_in

__all__ = ["VirtualCudaTraining", "Sync", "MIXED_DEVICES", "NUMPY_ERROR"]

MIXED_DEVICES = "Expected all tensors to be on the same device, but found at least two devices, {} and cpu!"
NUMPY_ERROR = ("can't convert {} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory "
               "first.")
_TAG = "_course_vcuda"          # where a tensor lives: "device", "host", or "cuda:K" (another GPU: a tag only)
_DEVICE, _HOST = "device", "host"
_GET_DEVICE = torch._C.TensorBase.device.__get__
_GET_IS_CUDA = torch._C.TensorBase.is_cuda.__get__
_GET_IS_CPU = torch._C.TensorBase.is_cpu.__get__
_GET_DATA = torch._C.TensorBase.data.__get__
_SET_DATA = torch._C.TensorBase.data.__set__
# a value of a device tensor read on the host
_READS = frozenset({"item", "__float__", "__int__", "__bool__", "__index__", "__complex__", "tolist", "__repr__",
                    "__str__", "__format__", "equal", "nonzero", "argwhere", "masked_select", "unique",
                    "unique_consecutive", "allclose"})
# torch functions that make a tensor from nothing (or from host data): host memory unless device= says cuda
_FACTORIES = frozenset({"empty", "zeros", "ones", "full", "rand", "randn", "randint", "randperm", "arange", "range",
                        "linspace", "logspace", "eye", "tensor", "as_tensor", "asarray", "from_numpy", "empty_strided",
                        "scalar_tensor", "frombuffer", "normal", "bernoulli"})
_FROM_HOST_DATA = frozenset({"tensor", "as_tensor", "asarray", "new_tensor"})
_NOT_MIXING = frozenset({"copy_", "to", "__getitem__", "__setitem__", "set_", "index_put_", "__set__", "__get__",
                         "new_tensor", "detach", "clone"})
# in-place operators: the first tensor is written (a host tensor cannot be the output of device work)
_INPLACE_DUNDER = frozenset({"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                             "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"})


@dataclass
class Sync:
    """A moment the host waited for the device."""
    what: str
    where: str


def _where() -> str:
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = frame.filename.replace("\\", "/")
        if ("/torch/" in path or path.endswith(("contextlib.py", "checks/virtual_cuda_training.py",
                                                  "course_utils/graph_capture.py"))):
            continue
        return f"{frame.filename}:{frame.lineno}"
    return "?"


def _from_torch_internals() -> bool:
    """Whether the Tensor.to being handled was called by torch's optimizers or AMP, which take the device
    from C++ (where the virtual device's tensors are CPU tensors), not from Tensor.device."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        path = frame.f_code.co_filename.replace("\\", "/")
        if "/torch/optim/" in path or "/torch/amp/" in path:
            return True
        if "/torch/" not in path and not path.endswith("checks/virtual_cuda_training.py"):
            return False
        frame = frame.f_back
    return False


def _tag(t) -> str | None:
    return getattr(t, _TAG, None) if isinstance(t, torch.Tensor) else None


def _set_tag(t: torch.Tensor, tag: str) -> torch.Tensor:
    setattr(t, _TAG, tag)
    return t


def _is_cuda(device) -> bool:
    if device is None:
        return False
    if isinstance(device, int) and not isinstance(device, bool):
        return True
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def _cuda_index(device):
    """The index a CUDA device names (None: the current device)."""
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    try:
        return torch.device(device).index
    except (RuntimeError, TypeError):
        return None


def _on_a_gpu(tag) -> bool:
    return tag is not None and tag != _HOST


def _target_device(name, args, kwargs):
    """Where `Tensor.to(...)` / `.cuda()` / `.cpu()` moves to: "cuda", "cpu" or None (no move), and the
    device named (for "cuda")."""
    if name == "cuda":
        device = kwargs.get("device", args[0] if args and not isinstance(args[0], bool) else None)
        return "cuda", device
    if name == "cpu":
        return "cpu", None
    device = kwargs.get("device")
    for a in args:
        if isinstance(a, torch.Tensor):
            return ("cuda", _tag(a)) if _tag(a) != _HOST else ("cpu", None)
        if isinstance(a, (str, torch.device)) or (isinstance(a, int) and not isinstance(a, bool)):
            device = a
    if device is None:
        return None, None
    return ("cuda", device) if _is_cuda(device) else ("cpu", None)


class _Propagate(TorchDispatchMode):
    """Every operation's results live where its inputs do (backward's operations included)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tags = {getattr(a, _TAG, None) for a in tensors_in((args, kwargs))}
        others = sorted(t for t in tags if t not in (None, _DEVICE, _HOST))
        tag = _DEVICE if _DEVICE in tags else others[0] if others else _HOST if _HOST in tags else None
        if tag is not None:
            for leaf in tensors_in(out):
                if getattr(leaf, _TAG, None) is None:
                    setattr(leaf, _TAG, tag)
        return out


class _Where(TorchFunctionMode):
    """Answers where a tensor lives, makes tensors on the device, refuses mixed devices and logs
    every host read of a device tensor (see the module docstring)."""

    def __init__(self, vc: "VirtualCudaTraining"):
        super().__init__()
        self.vc = vc

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        vc = self.vc
        first = args[0] if args else None
        if func == _GET_DEVICE:
            return vc.device_of(first)
        if func == _GET_IS_CUDA:
            return _tag(first) != _HOST
        if func == _GET_IS_CPU:
            return _tag(first) == _HOST
        name = getattr(func, "__name__", "")
        if name == "get_device" and isinstance(first, torch.Tensor):
            return vc.device_of(first).index if _tag(first) != _HOST else -1
        if func == _GET_DATA:
            out = func(*args, **kwargs)
            return _set_tag(out, _tag(first)) if _tag(first) else out
        if func == _SET_DATA:                    # `t.data = other`: t now lives where other does
            func(*args, **kwargs)
            if _tag(args[1]):
                _set_tag(first, _tag(args[1]))
            return None
        on_device = isinstance(first, torch.Tensor) and _tag(first) != _HOST
        if name in ("to", "cuda", "cpu") and isinstance(first, torch.Tensor):
            return self._move(func, name, first, args, kwargs)
        if on_device and name in ("numpy", "__array__"):
            raise TypeError(NUMPY_ERROR.format(vc.device))
        if on_device and name in _READS:
            vc._host_read(f"Tensor.{name}" if name.startswith("__") or name in ("item", "tolist") else f"torch.{name}")
            return func(*args, **kwargs)
        if name == "__getitem__" and on_device:
            index = tensors_in(args[1:])
            if any(i.dtype == torch.bool for i in index):
                vc._host_read("indexing with a boolean mask")
            elif any(_tag(i) == _HOST for i in index):
                vc._host_read("indexing with a host tensor (a blocking copy of the index)")
        if name in ("__getitem__", "__setitem__") and on_device and len(args) > 1 and _list_index(args[1]):
            vc.graphs.refuse_while_capturing("indexing with a Python list (a copy of the index from pageable "
                                             "host memory)")
        if name == "is_pinned" and isinstance(first, torch.Tensor):
            return vc.is_pinned(first)
        if (name in ("__setitem__", "copy_", "index_put_") and isinstance(first, torch.Tensor) and _tag(first) == _HOST
                and any(_tag(t) != _HOST for t in tensors_in(args[1:]))
                and not (name == "copy_" and kwargs.get("non_blocking") and vc.is_pinned(first))
                and not _from_torch_internals()):
            # a host tensor written from the device (host_buffer[i] = loss.detach()): a copy to the host that
            # waits for the device, as .cpu() does (walk w8-05, check 5.4)
            vc._host_read(f"Tensor.{name} (a host tensor written from the device: a copy to the host)")
        device = kwargs.get("device")
        tensors = tensors_in((args, kwargs))
        if "device" in kwargs and _is_cuda(device):
            return self._make(func, name, args, dict(kwargs, device="cpu"), vc.tag_for(device))
        if name.startswith("new_") and on_device:
            return self._make(func, name, args, kwargs, _DEVICE)
        if name in _FACTORIES and not tensors:
            return self._make(func, name, args, kwargs, _HOST)
        if "device" in kwargs:                    # device="cpu" given: host memory
            return self._make(func, name, args, kwargs, _HOST)
        if name not in _NOT_MIXING:
            device_side = any(_tag(t) == _DEVICE for t in tensors)
            in_place = (name.endswith("_") and not name.endswith("__")) or name in _INPLACE_DUNDER or "out" in kwargs
            written = first if in_place and isinstance(first, torch.Tensor) else None
            host_side = [t for t in tensors if _tag(t) == _HOST and (t.dim() > 0 or t is written)]
            if device_side and host_side:
                raise RuntimeError(MIXED_DEVICES.format(vc.device) + f" (in {name}: a tensor of shape "
                                   f"{tuple(host_side[0].shape)} is in host memory"
                                   + (", and it is the one written" if host_side[0] is written else "") + ")")
            elsewhere = sorted({_tag(t) for t in tensors if _on_a_gpu(_tag(t)) and _tag(t) != _DEVICE})
            if elsewhere and (device_side or len(elsewhere) > 1):
                raise RuntimeError(MIXED_DEVICES.format(vc.device).replace(" and cpu!", f" and {elsewhere[0]}!")
                                   + f" (in {name}: a tensor was made on {elsewhere[0]}, the work runs on "
                                   f"{vc.device})")
        if tensors and all(_tag(t) == _HOST for t in tensors):
            with vc.graphs.unrecorded():          # host work is not captured
                return func(*args, **kwargs)
        return func(*args, **kwargs)

    def _make(self, func, name, args, kwargs, tag):
        vc = self.vc
        if _on_a_gpu(tag) and name in _FROM_HOST_DATA:
            vc._host_read(f"{'Tensor.' if name.startswith('new_') else 'torch.'}{name}(..., device='cuda'): a "
                          "blocking copy from host memory")
        if name.startswith("new_") and "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs = dict(kwargs, device="cpu")
        if tag == _HOST:
            with vc.graphs.unrecorded():
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        for leaf in tensors_in(out):
            _set_tag(leaf, tag)
        return out

    def _move(self, func, name, t, args, kwargs):
        vc = self.vc
        target, named = _target_device(name, args[1:], kwargs)
        non_blocking = bool(kwargs.get("non_blocking", False)) or (
            name == "cuda" and len(args) > 1 and isinstance(args[1], bool) and args[1]) or any(
            isinstance(a, bool) and a for a in args[1:])
        dtype = kwargs.get("dtype") or next((a for a in args[1:] if isinstance(a, torch.dtype)), None)
        if isinstance(args[1] if len(args) > 1 else None, torch.Tensor):
            dtype = dtype or args[1].dtype
        here = _tag(t) if _on_a_gpu(_tag(t)) else _DEVICE if _tag(t) is None else _HOST
        there = vc.tag_for(named) if target == "cuda" else _HOST      # a tag names its device too
        if target is None or there == here:
            if dtype is None or dtype == t.dtype:
                return t
            out = t.to(dtype)
            return _set_tag(out, here)
        if target == "cuda" and here != _HOST:      # between two GPUs: a copy, no wait for the host
            out = torch.empty_like(t, dtype=dtype or t.dtype)
            _set_tag(out, there)
            with torch.no_grad():
                out.copy_(t)
            return out
        if target == "cpu" and _from_torch_internals():
            # torch's own code groups tensors by their real device (the CPU here) and moves a scale or a flag
            # "to" it (a fused optimizer's grad_scale.to(device)): on a GPU that device is the GPU, no copy
            return t if dtype is None or dtype == t.dtype else _set_tag(t.to(dtype), here)
        if target == "cpu":                        # device -> host: the host waits for the copy
            vc._host_read(f"Tensor.{name} (a copy to the host)")
            return _set_tag(t.to(dtype=dtype or t.dtype, copy=True), _HOST)
        if not (non_blocking and vc.is_pinned(t)):  # host -> device from pageable memory: a blocking copy
            vc._host_read(f"Tensor.{name} (a blocking copy to the device)")
        out = torch.empty_like(t, dtype=dtype or t.dtype)
        _set_tag(out, there)
        with torch.no_grad():
            out.copy_(t)
        return out


class VirtualCudaTraining:
    """`with VirtualCudaTraining() as vc:` trains GPU code on the CPU, tensors tagged with where they
    live (see the module docstring). `vc.graphs` is the emulated capture API in use."""

    def __init__(self, index: int | None = None):
        real = torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.device = torch.device("cuda", real if index is None else max(index, real))
        self.syncs: list[Sync] = []
        self.graphs = EmulatedGraphs(is_host=lambda t: _tag(t) == _HOST, on_sync=self._log_sync,
                                     python_reads=False, device=self.device)
        self._quiet = 0
        self._pinned: set[int] = set()
        self._stack: contextlib.ExitStack | None = None

    # -- the check's side ---------------------------------------------------------------------
    def put(self, t: torch.Tensor) -> torch.Tensor:
        """Make `t` a device tensor (a check's own setup: no copy is logged)."""
        return _set_tag(t, _DEVICE)

    def put_module(self, module: torch.nn.Module) -> torch.nn.Module:
        for t in list(module.parameters()) + list(module.buffers()):
            _set_tag(t, _DEVICE)
        return module

    def tag_for(self, device) -> str:
        """The tag of a tensor made on CUDA device `device` ("cuda", "cuda:K", K): this device, or another."""
        index = None if device in (None, _DEVICE) else _cuda_index(device)
        return _DEVICE if index is None or index == self.device.index else f"cuda:{index}"

    def device_of(self, t: torch.Tensor) -> torch.device:
        tag = _tag(t)
        if tag == _HOST:
            return torch.device("cpu")
        return torch.device(tag) if _on_a_gpu(tag) and tag != _DEVICE else self.device

    @staticmethod
    def is_device(t: torch.Tensor) -> bool:
        return _tag(t) == _DEVICE

    @staticmethod
    def is_host(t: torch.Tensor) -> bool:
        return _tag(t) == _HOST

    def is_pinned(self, t: torch.Tensor) -> bool:
        return _tag(t) == _HOST and id(t) in self._pinned

    @contextlib.contextmanager
    def quiet(self):
        """The check's own reads: not logged."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    # -- the device's side --------------------------------------------------------------------
    def _host_read(self, what: str) -> None:
        self.graphs.host_read(what)

    def _log_sync(self, what: str) -> None:
        if not self._quiet:
            self.syncs.append(Sync(what, _where()))

    def _pin(self, t: torch.Tensor) -> torch.Tensor:
        if _tag(t) != _HOST and _tag(t) is not None:
            raise RuntimeError("cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned")
        self.graphs.unsafe_call("Tensor.pin_memory (cudaHostAlloc)")
        out = t.detach().clone()
        _set_tag(out, _HOST)
        self._pinned.add(id(out))
        return out

    def __enter__(self) -> "VirtualCudaTraining":
        stack = contextlib.ExitStack()
        vc = self

        def patch(module, name, value):
            stack.callback(setattr, module, name, getattr(module, name))
            setattr(module, name, value)

        patch(torch.cuda, "is_available", lambda: True)
        patch(torch.cuda, "device_count", lambda: vc.device.index + 1)
        patch(torch.cuda, "current_device", lambda: vc.device.index)
        patch(torch.cuda, "set_device", lambda device: None)
        patch(torch.cuda, "get_device_name", lambda device=None: "virtual CUDA device (the CPU)")
        patch(torch.cuda, "empty_cache", lambda: vc._host_read("torch.cuda.empty_cache"))
        for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
            patch(torch.cuda, name, lambda device=None: 0)
        patch(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None:             # the device-agnostic API (torch 2.6+) names this device too
            for name, value in (("current_accelerator", lambda check_available=False: torch.device("cuda")),
                                ("is_available", lambda: True), ("device_count", lambda: vc.device.index + 1),
                                ("current_device_index", lambda: vc.device.index),
                                ("current_device_idx", lambda: vc.device.index)):
                if hasattr(accelerator, name):
                    patch(accelerator, name, value)
        # pin_memory is a method every thread may call (a DataLoader's pinning thread): patched on the class
        original_pin = torch.Tensor.pin_memory
        torch.Tensor.pin_memory = lambda t, device=None: vc._pin(t)
        stack.callback(setattr, torch.Tensor, "pin_memory", original_pin)
        stack.enter_context(self.graphs)
        stack.enter_context(_Propagate())
        stack.enter_context(_Where(self))
        self._stack = stack
        return self

    def __exit__(self, *exc) -> None:
        stack, self._stack = self._stack, None
        stack.__exit__(*exc)
