"""CUDA graphs without a GPU: torch.cuda's capture API emulated on the CPU (lesson 05).

A CUDA graph records the kernels one training step launches, once, and replays them with a
single launch: the host no longer launches ~390 kernels a step (lesson 01's launch-bound
ceiling). Replaying is *not* running the Python again, and that is where capture goes wrong:

- the replay uses the very tensors the capture used: a batch must be copied *into* the captured
  input buffers (`static.copy_(batch)`); a new tensor is never seen by the graph;
- nothing may read the device on the host while capturing (`.item()`, `print(loss)`, a Python
  `if` on a device value): CUDA refuses ("operation not permitted when stream is capturing");
- whatever the Python decided during the capture is frozen: a learning rate kept in a Python
  float, a branch taken, a tensor's shape. A batch of another shape needs another graph;
- the state the step creates on its first run (the optimizer's momentum buffers) must exist
  before the capture: capture after a few ordinary warm-up steps (on a side stream, as
  `torch.cuda.graph` requires).

`EmulatedGraphs` makes `torch.cuda.CUDAGraph`, `torch.cuda.graph`, `torch.cuda.Stream`,
`torch.cuda.stream`, `torch.cuda.current_stream` and `torch.cuda.synchronize` work on the CPU,
with the same rules: inside `with torch.cuda.graph(g):` every tensor operation is recorded
(through a `TorchDispatchMode`) and its effects are undone when the capture ends (a real capture
runs nothing); a host read raises CUDA's error; `g.replay()` runs the recorded operations again on
the same tensors, writing each result into the tensor the capture produced, with no autograd and
no Python in between. Code written for a GPU runs unchanged, so a check (exercise 5.5) and
`COURSE_DEVICE=cpu` can test it where there is none. Values are the CPU's; nothing is timed.
"""
from __future__ import annotations

import contextlib

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["EmulatedGraphs", "EmulatedGraph", "CAPTURE_ERROR", "use_graphs"]

CAPTURE_ERROR = "CUDA error: operation not permitted when stream is capturing"
_HOST_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
               torch.ops.aten.equal.default}


class _Recorder(TorchDispatchMode):
    """Records every operation, and keeps a copy of every tensor that existed before the capture
    the first time an operation touches it (some operations write arguments their schema does not
    mark as written: batch norm's running statistics), so that the capture's effects can be undone."""

    def __init__(self):
        super().__init__()
        self.ops: list = []
        self.saved: dict = {}          # id(tensor) -> (tensor, its values before the capture)
        self._made: set = set()        # ids of the tensors the capture's operations produced

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS or func.__name__.startswith("_local_scalar_dense"):
            raise RuntimeError(f"{CAPTURE_ERROR} (a host read of a device value, {func.__name__}, inside "
                               "torch.cuda.graph: .item(), float(), print() or an `if` on a tensor)")
        for leaf in pytree.tree_leaves((args, kwargs)):
            if isinstance(leaf, torch.Tensor) and id(leaf) not in self._made and id(leaf) not in self.saved:
                self.saved[id(leaf)] = (leaf, leaf.detach().clone())
        out = func(*args, **kwargs)
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._made.add(id(leaf))
        self.ops.append((func, args, kwargs, out))
        return out


class EmulatedGraph:
    """Stands in for `torch.cuda.CUDAGraph` (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        self._ops: list | None = None
        self.replays = 0

    def capture_begin(self, *args, **kwargs):
        if self._ops is not None:
            raise RuntimeError("this CUDA graph was already captured")
        self._recorder = _Recorder()
        self._recorder.__enter__()

    def capture_end(self):
        recorder = self._recorder
        recorder.__exit__(None, None, None)
        with torch.no_grad():
            for tensor, before in recorder.saved.values():    # a capture runs nothing: undo its writes
                tensor.copy_(before)
        self._ops = recorder.ops
        del self._recorder

    def replay(self):
        if self._ops is None:
            raise RuntimeError("replay() before the graph was captured")
        with torch._C._AutoDispatchBelowADInplaceOrView():
            for func, args, kwargs, out in self._ops:
                new = func(*args, **kwargs)
                for old, fresh in zip(pytree.tree_leaves(out), pytree.tree_leaves(new)):
                    if isinstance(old, torch.Tensor) and isinstance(fresh, torch.Tensor) and old is not fresh:
                        if old.data_ptr() != fresh.data_ptr():
                            old.copy_(fresh)
        self.replays += 1

    def reset(self):
        self._ops = None

    def pool(self):
        return None


class _Stream:
    """Stands in for `torch.cuda.Stream`: the CPU runs everything in order."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


@contextlib.contextmanager
def _graph_context(graph, pool=None, stream=None, capture_error_mode=None):
    graph.capture_begin()
    try:
        yield graph
    finally:
        graph.capture_end()


class EmulatedGraphs:
    """Inside this block, torch.cuda's graph and stream calls work on the CPU (see the module
    docstring). `graphs` lists every graph made inside it (a check counts their replays)."""

    _NAMES = ("CUDAGraph", "graph", "Stream", "stream", "current_stream", "synchronize")

    def __init__(self):
        self.graphs: list[EmulatedGraph] = []
        self._saved: dict = {}

    def _new_graph(self, *args, **kwargs):
        graph = EmulatedGraph()
        self.graphs.append(graph)
        return graph

    def __enter__(self):
        self._saved = {name: getattr(torch.cuda, name) for name in self._NAMES}
        torch.cuda.CUDAGraph = self._new_graph
        torch.cuda.graph = _graph_context
        torch.cuda.Stream = _Stream
        torch.cuda.stream = lambda stream=None: contextlib.nullcontext(stream)
        torch.cuda.current_stream = lambda device=None: _Stream()
        torch.cuda.synchronize = lambda device=None: None
        return self

    def __exit__(self, *exc):
        for name, value in self._saved.items():
            setattr(torch.cuda, name, value)
        return None


def use_graphs(device) -> contextlib.AbstractContextManager:
    """The real torch.cuda on a CUDA device; the emulation elsewhere."""
    if torch.device(device).type == "cuda":
        return contextlib.nullcontext()
    return EmulatedGraphs()
