"""CUDA graphs without a GPU: torch.cuda's capture API emulated on the CPU (lesson 05).

A CUDA graph records the kernels one training step launches, once, and replays them with a
single launch: the host no longer spends its time per kernel (lesson 01's launch-bound ceiling).
Replaying is *not* running the Python again, and that is where capture goes wrong. `RULES` lists
what a real capture does, rule by rule, beside what this emulation does with it; the short
version:

- a replay reads and writes the memory the capture used: a batch must be copied *into* the
  captured input buffers (`static.copy_(batch)`); a tensor rebound (`static = batch`,
  `static.data = batch`, `static.set_(batch)`) is never seen by the graph;
- nothing may make the host wait for the device while capturing (`.item()`, `print(loss)`,
  `.cpu()`, `.tolist()`, a Python `if` on a device value, `torch.cuda.synchronize()`,
  `event.synchronize()`): CUDA refuses ("operation not permitted when stream is capturing");
- whatever the Python decided during the capture is frozen: a learning rate kept in a Python
  float, a branch taken, a tensor's shape, numbers drawn on the host;
- the state the step creates on its first run (the optimizer's momentum buffers) must exist
  before the capture: capture after a few ordinary warm-up steps.

`EmulatedGraphs` makes `torch.cuda.CUDAGraph`, `torch.cuda.graph` (with its `pool`, `stream` and
`capture_error_mode` arguments), `torch.cuda.graph_pool_handle`,
`torch.cuda.is_current_stream_capturing`, `torch.cuda.make_graphed_callables` (torch's own,
running on the emulation), streams, events and `torch.cuda.synchronize` (also by the paths
`torch.cuda.graphs.*`, `torch.cuda.streams.*`, `torch.Stream`, `torch.Event` and
`torch.accelerator.current_stream/set_stream/synchronize`) work on the CPU, with the same rules: inside a capture every tensor operation is recorded (a `TorchDispatchMode`), on
the very memory it used, and its effects are undone when the capture ends (a real capture runs
nothing: the tensors it made hold NaN until the first replay); a host read raises CUDA's error;
an optimizer that is not capturable refuses, as torch refuses it on a GPU; `g.replay()` runs the
recorded operations again on that memory, with no autograd and no Python in between, queued on
the current stream. Streams keep vector clocks: an operation or a replay that uses memory another
stream wrote (or read) before its own stream waited for that work (`wait_stream`, an event, a
synchronize) is logged in `races`, the race a GPU would run. Code
written for a GPU runs unchanged, so a check (exercise 5.5) and `COURSE_DEVICE=cpu` can test it
where there is none. Values are the CPU's; nothing is timed. With the course's virtual CUDA
device for training steps (`course_utils.checks.virtual_cuda_training`) tensors also say which
device they are on, so host tensors in a captured step fail as on a GPU, and every wait of the
host for the device is logged.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import traceback
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["EmulatedGraphs", "EmulatedGraph", "CAPTURE_ERROR", "CAPTURE_MODES", "RULES", "Rule", "Race",
           "use_graphs", "not_capturable_message"]

CAPTURE_ERROR = "CUDA error: operation not permitted when stream is capturing"
CAPTURE_MODES = ("global", "thread_local", "relaxed")
DEFAULT_STREAM = ("CUDA graphs must be captured on a non-default stream. (However, after capture, it's ok to "
                  "replay them on the default stream.)")


def not_capturable_message(optimizer_name: str) -> str:
    """What torch raises when a non-capturable optimizer steps inside a capture."""
    return (f"Attempting CUDA graph capture of step() for an instance of {optimizer_name} but param_groups' "
            "capturable is False.")


@dataclass(frozen=True)
class Rule:
    """One rule of CUDA graph capture: what a GPU does, and what the emulation does."""
    rule: str
    gpu: str
    emulation: str


RULES = [
    Rule("a replay reads the memory that was captured",
         "kernels are recorded with their pointers; a replay reads and writes those addresses, whatever Python "
         "names point to now",
         "each recorded operation keeps an alias of the storage it used at capture; `.data =`, `set_()` or a "
         "rebound name leave the graph on the old storage"),
    Rule("a capture runs nothing",
         "kernels are recorded, not run: the capture's outputs hold garbage until the first replay, and nothing is "
         "checked against the values (static inputs from torch.empty_like, filled only by the first copy_, are "
         "fine)",
         "the operations run to be recorded, then every tensor that existed before is restored and every "
         "tensor the capture made is filled with NaN (integers with -1) until the first replay; an operation that "
         "raises on the values it was given (an index or a class label out of range in memory not yet filled) is "
         "recorded anyway, with outputs of the shape a meta run gives"),
    Rule("no host reads while capturing",
         "a sync (.item(), print, .cpu(), .tolist(), an `if` on a tensor, nonzero, a boolean mask, "
         "torch.cuda.synchronize, event/stream.synchronize, event/stream.query, a blocking copy from pageable "
         "memory, indexing with a Python list) raises "
         f"'{CAPTURE_ERROR}' and invalidates the capture (capture_end then reports 'operation failed due to a "
         "previous error during capture')",
         "the same reads raise the same message at once; the original error is the one raised; outside a capture "
         "event.query() and stream.query() poll and do not count as a wait"),
    Rule("host work is not captured",
         "CPU work inside the capture (numbers drawn or computed on the host, a Python branch) runs once and is "
         "frozen into the graph's arguments: a 0-dim host tensor used by a captured kernel is read at capture "
         "(changing it later changes nothing)",
         "with the virtual CUDA device for training steps, operations on host tensors run once and are not "
         "recorded, and a 0-dim host tensor used by a recorded operation is copied at capture; on plain CPU "
         "tensors every tensor stands for a device tensor"),
    Rule("capture on a side stream",
         "capture_begin on the default (legacy) stream raises; torch.cuda.graph uses its own side stream or "
         "`stream=`; capture_end must run on the stream the capture began on; warm-up belongs on the stream that "
         "will capture (per-stream library state, cuBLAS workspaces, DDP's own warm-up)",
         "capture_begin on the default stream raises the same error, capture_end on another stream raises "
         "torch's 'Capture must end on the same stream it began on.'; a capture on a stream made for another "
         "device than the work's (torch.cuda.Stream(device=0), the batch on cuda:1) raises an error of the "
         "emulation's own (a GPU's answer is still to confirm); which stream the warm-up ran on is not "
         "checked (no library state to miss on the CPU)"),
    Rule("streams order the work",
         "streams made by torch.cuda.Stream() run concurrently with the default stream: work on one sees another "
         "stream's results only after wait_stream/wait_event (or the host synchronised); a graph replays on the "
         "stream that is current when replay() is called",
         "every operation and every replay is queued on the current stream with a vector clock per stream; an "
         "operation that reads memory another stream wrote, or writes memory another stream read or wrote, "
         "before its stream waited for that work, is logged as a race (`races`)"),
    Rule("capture_error_mode",
         "'global' (default): a potentially unsafe CUDA call from any thread (cudaMalloc, cudaHostAlloc of a "
         "pinning thread) fails the capture; 'thread_local': only this thread's; 'relaxed': none",
         "any other value raises as torch does; Tensor.pin_memory() from any thread during a 'global' capture, "
         "and from the capturing thread during a 'thread_local' one, raises (the virtual device for training "
         "steps); other threads' CUDA work is not seen"),
    Rule("one capture at a time",
         "a second capture while one is underway fails; a CUDAGraph captures once (torch: 'This CUDAGraph "
         "instance already owns a captured graph')", "the same, with torch's messages"),
    Rule("optimizers",
         "an optimizer that keeps its step count on the host (Adam, AdamW... default capturable=False) refuses "
         "to step inside a capture; capturable=True keeps it on the device; SGD needs no flag",
         "the same check, with torch's message"),
    Rule("random numbers",
         "the default CUDA generator is graph-safe: its seed and offset are host state, and torch copies them to "
         "the device before each replay and advances the offset, so every replay draws new numbers (different "
         "from an eager run's); another torch.Generator must be registered with "
         "graph.register_generator_state(generator), or drawing from it while capturing raises 'Attempt to "
         "increase offset for a CUDA generator not in capture mode.'; torch.cuda.manual_seed while capturing "
         "raises",
         "replays draw again from the CPU's generator (new numbers each replay, as on a GPU); an explicit "
         "generator= that was not registered raises torch's message; torch.cuda.manual_seed(_all) and "
         "torch.manual_seed raise while capturing"),
    Rule("memory pool",
         "a graph allocates from a private pool, held until the graph is freed; outputs and .grad tensors made "
         "during capture live there and each replay overwrites them; graphs that share a pool "
         "(graph_pool_handle(), pool=) must replay in capture order or overwrite each other's memory; a capture "
         "can run out of memory where eager did not; a captured input freed and reallocated is a use after free "
         "(torch 2.14: check_input_liveness=True)",
         "outputs are overwritten by each replay as on a GPU; every graph has memory of its own, so replaying "
         "shared-pool graphs out of order does not corrupt anything here, nothing runs out of memory, and a "
         "recorded operation keeps its memory alive (no use after free can happen)"),
    Rule("shapes and Python decisions",
         "a graph replays the shapes, dtypes and branches it captured; a batch of another shape needs another "
         "graph (or drop_last=True); copy_ broadcasts, so a batch of 1 sample (or 1 label) copied into a static "
         "buffer raises nothing and fills every row with it",
         "the same: recorded operations keep their shapes; copy_ raises or broadcasts as on a GPU"),
    Rule("the API emulated",
         "torch.cuda.CUDAGraph, torch.cuda.graph, torch.cuda.graphs.*, torch.cuda.Stream/Event (and "
         "torch.cuda.streams.*), torch.Stream/torch.Event for CUDA, torch.accelerator.current_stream/set_stream/"
         "synchronize (torch 2.6+), torch.accelerator.Graph (torch 2.14+)",
         "all of them but torch.accelerator.Graph (torch 2.14 has it, this course pins 2.14.1; it is not emulated "
         "because the course's measured H100 run used that box's own torch 2.11, which has none), which raises "
         "'only torch.cuda's graph API is emulated here'"),
]

# aten operations that need a device value on the host (a sync): refused while capturing
_HOST_READ_OPS = frozenset({"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "nonzero_static", "masked_select",
                            "_unique", "_unique2", "unique_dim", "unique_consecutive", "item"})
# Tensor methods and functions that read a device tensor on the host (seen before they reach aten)
_PYTHON_READS = frozenset({"item", "__float__", "__int__", "__bool__", "__index__", "__complex__", "tolist", "numpy",
                           "__array__", "__repr__", "__str__", "__format__", "cpu"})
_POISON_INT = -1
NOT_CAPTURING = "Attempt to increase offset for a CUDA generator not in capture mode."
ALREADY_CAPTURED = ("This CUDAGraph instance already owns a captured graph. To capture a new graph, create a new "
                    "instance.")
NOT_CAPTURED = "Called CUDAGraph::replay without a preceding successful capture."
OTHER_STREAM = "Capture must end on the same stream it began on."
# (emulation's words, walk w4-05: a stream made with device=0 while the batch lives on another GPU; on a GPU the
# capture then records that device's stream while the model's kernels go to the batch's device: README's GPU list)
OTHER_DEVICE_STREAM = ("CUDA graph capture on a stream of cuda:{stream}, while the work runs on cuda:{work}: "
                       "the capture would record none of it")
SEED_WHILE_CAPTURING = ("Cannot call CUDAGeneratorImpl::set_current_seed during CUDA graph capture. If you need this "
                        "call to be captured, please file an issue. Current cudaStreamCaptureStatus: "
                        "cudaStreamCaptureStatusActive")
NOT_EMULATED = ("torch.accelerator.Graph (torch 2.14+) is not emulated here: only torch.cuda's graph API is "
                "(torch.cuda.CUDAGraph, torch.cuda.graph), which every torch version the course runs on has")


def tensors_in(obj, out: list | None = None) -> list:
    """The tensors in `obj` (nested tuples, lists and dicts): a fast `pytree.tree_leaves` for the
    arguments of an operation."""
    if out is None:
        out = []
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        return out
    if isinstance(obj, dict):
        obj = obj.values()
    elif not isinstance(obj, (list, tuple)):
        return out
    for item in obj:                  # one call per container, not per item (sizes are lists of ints)
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, (list, tuple, dict)):
            tensors_in(item, out)
    return out


def _map_tensors(fn, obj):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map_tensors(fn, item) for item in obj)
    if isinstance(obj, list):
        return [_map_tensors(fn, item) for item in obj]
    if isinstance(obj, dict):
        return {key: _map_tensors(fn, item) for key, item in obj.items()}
    return obj


def _storage_key(t: torch.Tensor):
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A second tensor on the same memory: it keeps that memory even if `t` is rebound later."""
    return torch.ops.aten.alias.default(t)


def _to_host(args, kwargs) -> bool:
    """Whether a Tensor.to(...) call moves to the CPU."""
    for a in list(args) + [kwargs.get("device")]:
        if isinstance(a, (str, torch.device)):
            try:
                return torch.device(a).type == "cpu"
            except RuntimeError:
                return False
    return False


def _list_index(index) -> bool:
    """Whether a __getitem__/__setitem__ index holds a Python list (a copy of the index from host memory)."""
    if isinstance(index, list):
        return True
    return isinstance(index, tuple) and any(isinstance(i, list) for i in index)


_WRITES: dict = {}


def _written(func, args, kwargs) -> list:
    """The tensor arguments an aten operation writes (its schema's `Tensor(a!)` arguments)."""
    spec = _WRITES.get(func)
    if spec is None:
        try:
            arguments = func._schema.arguments
        except AttributeError:
            arguments = []
        spec = _WRITES[func] = tuple((i, a.name) for i, a in enumerate(arguments)
                                     if a.alias_info is not None and a.alias_info.is_write)
    out = []
    for i, name in spec:
        value = args[i] if i < len(args) else kwargs.get(name)
        out.extend(tensors_in(value))
    return out


def _on_meta(func, args, kwargs):
    """The operation on meta tensors: outputs with the right shapes, computed from no values."""
    def meta(t):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    margs, mkwargs = _map_tensors(meta, (args, kwargs))
    return func(*margs, **mkwargs)


def _same_generator(a, b) -> bool:
    """Whether two generator objects are one generator (a dispatch hands over a new Python object)."""
    if a is b:
        return True
    try:
        return a.device == b.device and a.initial_seed() == b.initial_seed() and bool(
            torch.equal(a.get_state(), b.get_state()))
    except (RuntimeError, AttributeError):
        return False


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = frame.filename.replace("\\", "/")
        if "/torch/" in path or path.endswith(("contextlib.py", "course_utils/graph_capture.py",
                                               "checks/virtual_cuda_training.py", "checks/lesson05_graphs.py")):
            continue
        return f"{path.rsplit('/', 1)[-1]}:{frame.lineno}"
    return "?"


class _Recorder(TorchDispatchMode):
    """Records every operation of a capture on aliases of the memory it used, and keeps the values of
    every tensor that existed before the capture (to undo the capture's writes: some operations
    write arguments their schema does not mark as written, batch norm's running statistics)."""

    def __init__(self, owner: "EmulatedGraphs", graph: "EmulatedGraph"):
        super().__init__()
        self.owner, self.graph = owner, graph
        self.ops: list = []
        self.saved: dict = {}          # id(tensor) -> (tensor, its values before the capture)
        self._made: set = set()        # ids of the tensors the capture's operations produced
        self.made: list = []           # the tensors the capture's operations produced (kept alive: ids stay unique)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        owner = self.owner
        name = func.overloadpacket.__name__
        leaves = tensors_in((args, kwargs))
        host_only = bool(leaves) and all(owner.is_host(t) for t in leaves)
        if owner.unrecorded_depth or host_only:     # host work: runs once, not recorded (a GPU does not capture it)
            return func(*args, **kwargs)
        bool_index = name in ("index", "index_put_", "_index_put_impl_", "index_put") and any(
            i.dtype == torch.bool for i in tensors_in(args[1:2]))
        if name in _HOST_READ_OPS or bool_index:
            owner.host_read(f"aten.{name}" + (" (a boolean mask)" if bool_index else ""))
        generator = kwargs.get("generator")
        if generator is not None and not any(_same_generator(generator, g) for g in self.graph.generators):
            raise RuntimeError(NOT_CAPTURING)
        for leaf in leaves:
            if id(leaf) not in self.saved and id(leaf) not in self._made:
                self.saved[id(leaf)] = (leaf, leaf.detach().clone())
        try:
            out = func(*args, **kwargs)
        except (IndexError, RuntimeError) as exc:
            # a GPU checks no value while capturing (an index or a label out of range in memory not filled yet)
            out = self._unrun(func, args, kwargs, exc)
        outs = []
        for leaf in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(leaf, torch.Tensor):
                if id(leaf) not in self.saved and id(leaf) not in self._made:
                    self._made.add(id(leaf))
                    self.made.append(leaf)
                outs.append(_alias(leaf))
            else:
                outs.append(None)
        # a 0-dim host tensor is an argument of the kernel: its value at capture is the one the graph keeps
        rec_args, rec_kwargs = _map_tensors(
            lambda t: t.detach().clone() if t.dim() == 0 and owner.is_host(t) else _alias(t), (args, kwargs))
        self.ops.append((func, rec_args, rec_kwargs, outs))
        return out

    @staticmethod
    def _unrun(func, args, kwargs, exc):
        """Outputs of the right shape for an operation that raised on its values (filled at capture end)."""
        try:
            meta = _on_meta(func, args, kwargs)
        except Exception:       # noqa: BLE001 (it raises on shapes too: the original error stands)
            raise exc from None
        written = _written(func, args, kwargs)
        if written and isinstance(meta, torch.Tensor):
            return written[0]
        device = next((t.device for t in tensors_in((args, kwargs))), torch.device("cpu"))
        return _map_tensors(lambda m: torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=device), meta)


class _PythonReads(TorchFunctionMode):
    """While capturing on plain CPU tensors (each stands for a device tensor): host reads that never
    reach an aten operation on the CPU (.cpu(), .tolist(), .numpy(), print, a Python-list index) raise
    CUDA's error."""

    def __init__(self, owner: "EmulatedGraphs"):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and (name in _PYTHON_READS or (name == "to" and _to_host(args[1:], kwargs))):
            self.owner.host_read(f"Tensor.{name}")
        if isinstance(first, torch.Tensor) and name in ("__getitem__", "__setitem__") and len(args) > 1 \
                and _list_index(args[1]):
            self.owner.host_read("indexing with a Python list (a copy of the index from pageable host memory)")
        return func(*args, **kwargs)


@dataclass
class Race:
    """Two operations on different streams touched the same memory, the second before its stream waited
    for the first."""
    what: str
    where: str

    def __str__(self) -> str:
        return f"{self.what} (at {self.where})"


class _StreamOrder(TorchDispatchMode):
    """Every operation outside a capture is queued on the current stream: its reads and writes are
    checked against the other streams' (see `EmulatedGraphs.races`)."""

    def __init__(self, owner: "EmulatedGraphs"):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        owner = self.owner
        if owner.capturing is not None or owner.unrecorded_depth:
            return out
        is_host = owner.is_host
        leaves = [t for t in tensors_in((args, kwargs)) if not is_host(t)]
        reads = {_storage_key(t): t for t in leaves}
        writes = {_storage_key(t): t for t in _written(func, args, kwargs) if not is_host(t)}
        for t in tensors_in(out):
            key = _storage_key(t)
            if key not in reads and not is_host(t):       # a new allocation: whatever that memory held is gone
                owner._forget(key)
                writes[key] = t
        name = func.overloadpacket.__name__
        owner._queue(name, reads=reads, writes=writes)
        if name in _HOST_READ_OPS:                # the host read the value: it waited for this stream
            owner._host_waited(owner.current_stream().clock)
        return out


class EmulatedGraph:
    """Stands in for `torch.cuda.CUDAGraph` (see the module docstring)."""

    def __init__(self, owner: "EmulatedGraphs", keep_graph: bool = False):
        self._owner = owner
        self._ops: list | None = None
        self._recorder: _Recorder | None = None
        self.replays = 0
        self.capture_error_mode: str | None = None
        self.capture_stream = None
        self.pool_token = None
        self.generators: list = []
        self.reads: dict = {}         # what a replay reads and writes: storage -> a tensor on it
        self.writes: dict = {}
        self._pool = next(owner._pool_ids)

    # -- capture -------------------------------------------------------------------------------
    def capture_begin(self, pool=None, capture_error_mode: str = "global", **kwargs):
        owner = self._owner
        if capture_error_mode not in CAPTURE_MODES:
            raise RuntimeError("Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, got "
                               f"{capture_error_mode}")
        if self._ops is not None:
            raise RuntimeError(ALREADY_CAPTURED)
        if owner.capturing is not None:
            raise RuntimeError("a CUDA graph capture is already underway: only one capture at a time")
        stream = owner.current_stream()
        if stream is owner.default_stream:
            raise RuntimeError(DEFAULT_STREAM)
        if getattr(stream, "device_index", owner.device.index) != owner.device.index:
            raise RuntimeError(OTHER_DEVICE_STREAM.format(stream=stream.device_index, work=owner.device.index))
        self.capture_error_mode, self.capture_stream = capture_error_mode, stream
        self.pool_token = pool
        for listener in owner.listeners:
            listener("begin", self)
        owner._start_capture(self)
        self._recorder = _Recorder(owner, self)
        self._recorder.__enter__()

    def capture_end(self):
        owner, recorder = self._owner, self._recorder
        if recorder is None:
            raise RuntimeError("capture_end() without capture_begin()")
        if owner.current_stream() is not self.capture_stream:
            raise RuntimeError(OTHER_STREAM)
        recorder.__exit__(None, None, None)
        owner._stop_capture(self)
        self._recorder = None
        keep = {_storage_key(t) for t, _ in recorder.saved.values()}
        # through .data: the values change, not the version counters autograd keeps (as on a GPU, where the
        # capture's in-place operations count as done for autograd and wrote nothing)
        with torch.no_grad(), owner.unrecorded():
            for tensor, before in recorder.saved.values():    # a capture runs nothing: undo its writes
                if not owner.is_host(tensor):
                    tensor.data.copy_(before)
            for made in recorder.made:                          # ... and leaves what it made unwritten
                if _storage_key(made) in keep or owner.is_host(made) or made.numel() == 0:
                    continue
                if made.is_floating_point() or made.is_complex():
                    made.data.fill_(float("nan"))
                elif made.dtype != torch.bool:
                    made.data.fill_(_POISON_INT)
        self._ops = recorder.ops
        for func, args, kwargs, outs in self._ops:
            self.reads.update((_storage_key(t), t) for t in tensors_in((args, kwargs)) if not owner.is_host(t))
            self.writes.update((_storage_key(t), t) for t in _written(func, args, kwargs) + [o for o in outs if o is not None]
                               if not owner.is_host(t))
        for listener in owner.listeners:
            listener("end", self)

    # -- replay --------------------------------------------------------------------------------
    def replay(self):
        if self._ops is None:
            raise RuntimeError(NOT_CAPTURED)
        owner = self._owner
        if owner.capturing is not None:
            raise RuntimeError("a CUDA graph cannot be replayed while another is being captured")
        owner._queue("the graph's replay", reads=self.reads, writes=self.writes)
        with torch._C._AutoDispatchBelowADInplaceOrView(), owner.unrecorded():
            for func, args, kwargs, outs in self._ops:
                new = func(*args, **kwargs)
                for old, fresh in zip(outs, new if isinstance(new, (tuple, list)) else (new,)):
                    if old is None or not isinstance(fresh, torch.Tensor) or old is fresh:
                        continue
                    if old.data_ptr() != fresh.data_ptr():
                        old.copy_(fresh)
        self.replays += 1
        for listener in owner.listeners:
            listener("replay", self)

    def instantiate(self):
        return None

    def reset(self):
        self._ops = None
        self.reads, self.writes = {}, {}

    def pool(self):
        return ("emulated graph pool", self._pool)

    def register_generator_state(self, generator):
        self.generators.append(generator)

    def enable_debug_mode(self):
        return None

    def debug_dump(self, path):
        raise RuntimeError("the emulated CUDA graph has nothing to dump: it records PyTorch operations, not kernels")


class _Stream:
    """Stands in for `torch.cuda.Stream`: the CPU runs everything in order, but each stream keeps a
    vector clock (how far it has seen every stream's work), so that work used by another stream
    before that one waited for it is logged as a race."""

    def __init__(self, owner: "EmulatedGraphs", device=None, priority: int = 0, **kwargs):
        self._owner = owner
        self.id = next(owner._stream_ids)
        self.priority = priority
        index = owner.device.index
        if device is not None:          # the device asked for (an int, "cuda:0", a torch.device): kept, to be checked
            asked = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
            index = asked.index if asked.index is not None else index
        self.device = torch.device("cuda", index)
        self.device_type = "cuda"
        self.device_index = index
        self.clock: dict[int, int] = {self.id: 0}
        owner.streams.append(self)

    @property
    def cuda_stream(self) -> int:
        return self.id

    @property
    def stream_id(self) -> int:
        return self.id

    def wait_stream(self, other):
        _merge(self.clock, other.clock)

    def wait_event(self, event):
        _merge(self.clock, event.clock)

    def record_event(self, event=None):
        event = event or _Event(self._owner)
        event.record(self)
        return event

    def synchronize(self):
        self._owner.host_read("stream.synchronize", waits=self.clock)

    def query(self) -> bool:
        self._owner.refuse_while_capturing("stream.query")
        self._owner._host_waited(self.clock)      # it returns True: the host now knows the work is done
        return True

    def is_capturing(self) -> bool:
        return self._owner.capturing is not None and self._owner.capturing.capture_stream is self

    def __enter__(self):
        self._ctx = self._owner.stream(self)
        return self._ctx.__enter__()

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)

    def __eq__(self, other) -> bool:
        return isinstance(other, _Stream) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("emulated stream", self.id))

    def __repr__(self) -> str:
        return f"<emulated CUDA stream {self.id}{' (default)' if self.id == 0 else ''}>"


def _merge(into: dict, other: dict) -> None:
    for key, value in other.items():
        if value > into.get(key, 0):
            into[key] = value


class _Event:
    """Stands in for `torch.cuda.Event`: recording and waiting are free (and allowed while capturing,
    as on a GPU); `synchronize()` and `elapsed_time()` wait for the device (a host read); `query()`
    polls (refused while capturing, not a wait otherwise)."""

    def __init__(self, owner: "EmulatedGraphs", enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, **kwargs):
        self._owner = owner
        self.enable_timing = enable_timing
        self._time = None
        self.clock: dict[int, int] = {}

    def record(self, stream=None):
        import time
        stream = stream if stream is not None else self._owner.current_stream()
        self.clock = dict(getattr(stream, "clock", {}))
        self._time = time.perf_counter()

    def wait(self, stream=None):
        stream = stream if stream is not None else self._owner.current_stream()
        stream.wait_event(self)

    def synchronize(self):
        self._owner.host_read("event.synchronize", waits=self.clock)

    def query(self) -> bool:
        self._owner.refuse_while_capturing("event.query")
        self._owner._host_waited(self.clock)
        return True

    def elapsed_time(self, end) -> float:
        if not (self.enable_timing and end.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        self._owner.host_read("event.elapsed_time", waits=end.clock)
        if self._time is None or end._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end._time - self._time) * 1e3


class _GraphContext:
    """Stands in for `torch.cuda.graph` (same arguments; those of newer torch versions are accepted)."""

    _NEWER = frozenset({"enable_annotations", "check_input_liveness", "annotation_config"})

    def __init__(self, owner: "EmulatedGraphs", cuda_graph, pool=None, stream=None, capture_error_mode="global",
                 **newer):
        unknown = sorted(set(newer) - self._NEWER)
        if unknown:
            raise TypeError(f"graph.__init__() got an unexpected keyword argument '{unknown[0]}'")
        if not isinstance(cuda_graph, EmulatedGraph):
            raise TypeError(f"torch.cuda.graph expects a torch.cuda.CUDAGraph, got {type(cuda_graph).__name__}")
        if stream is not None and not isinstance(stream, _Stream):
            raise TypeError(f"stream must be a torch.cuda.Stream, got {type(stream).__name__}")
        self._owner = owner
        self.cuda_graph = cuda_graph
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else owner.capture_stream
        self.capture_error_mode = capture_error_mode

    def __enter__(self):
        self._owner.synchronize()                 # torch.cuda.graph synchronizes before it captures
        self._stream_ctx = self._owner.stream(self.capture_stream)
        self._stream_ctx.__enter__()
        try:
            self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self._stream_ctx.__exit__(None, None, None)
            raise
        return None

    def __exit__(self, *exc):
        try:
            self.cuda_graph.capture_end()
        finally:
            self._stream_ctx.__exit__(*exc)
        return None


class _StreamType(type):
    """torch.cuda.Stream / Event (and torch.Stream / Event) while emulating: a call makes the emulated one
    (for torch.Stream / Event: when CUDA, the CPU or no device is named), and isinstance sees both."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, (cls._emulated, cls._real))

    def __subclasscheck__(cls, sub):
        return issubclass(sub, (cls._emulated, cls._real))

    def __call__(cls, *args, **kwargs):
        if not cls._agnostic:
            return cls._make(*args, **kwargs)
        device = kwargs.get("device", args[0] if args and not isinstance(args[0], bool) else None)
        if device is None or _device_type(device) in ("cuda", "cpu"):
            rest = {k: v for k, v in kwargs.items() if k != "device"}
            return cls._make(*args[1:], **rest)
        return cls._real(*args, **kwargs)


def _emulated_type(name, real, make, emulated, agnostic: bool):
    return _StreamType(name, (), {"_real": real, "_make": staticmethod(make), "_emulated": emulated,
                                  "_agnostic": agnostic})


def _device_type(device) -> str | None:
    if isinstance(device, int) and not isinstance(device, bool):
        return "cuda"
    try:
        return torch.device(device).type
    except (RuntimeError, TypeError):
        return None


class EmulatedGraphs:
    """Inside this block, torch.cuda's graph, stream and event calls work on the CPU (see the module
    docstring). `graphs` lists every graph made inside it (a check counts their replays);
    `listeners` are called with ("begin" | "end" | "replay", graph); `races` lists every use of
    memory by one stream before it waited for another stream's work on it.

    `is_host(tensor)` says whether a tensor is host memory (the virtual CUDA device for training
    steps tells); by default every tensor stands for a device tensor. `on_sync(what)` is called for
    every wait of the host for the device outside a capture; inside one, such a wait raises."""

    _CUDA_NAMES = ("CUDAGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "Stream", "stream",
                   "current_stream", "default_stream", "synchronize", "Event", "manual_seed", "manual_seed_all")

    def __init__(self, *, is_host=None, on_sync=None, python_reads: bool = True, device=None):
        self.graphs: list[EmulatedGraph] = []
        self.listeners: list = []
        self.races: list[Race] = []
        self.is_host = is_host or (lambda t: False)
        self.on_sync = on_sync or (lambda what: None)
        self.device = torch.device(device) if device is not None else torch.device("cuda", 0)
        self.capturing: EmulatedGraph | None = None
        self.capture_thread: int | None = None
        self.unrecorded_depth = 0
        self._python_reads = python_reads
        self._reads_mode: _PythonReads | None = None
        self._stream_ids = itertools.count()
        self._pool_ids = itertools.count(1)
        self.streams: list[_Stream] = []
        self.default_stream = _Stream(self)
        self.capture_stream = _Stream(self)     # torch.cuda.graph's own side stream
        self._current: list[_Stream] = [self.default_stream]
        self._host_clock: dict[int, int] = {}
        self._writes: dict = {}                 # storage -> (stream id, its clock then, what wrote it)
        self._reads: dict = {}                  # storage -> {stream id: (its clock then, what read it)}
        self._stack: contextlib.ExitStack | None = None

    # -- what the emulated API calls -------------------------------------------------------------
    def current_stream(self, device=None) -> _Stream:
        return self._current[-1]

    @contextlib.contextmanager
    def stream(self, stream):
        if stream is None:
            yield
            return
        if not isinstance(stream, _Stream):
            raise TypeError(f"expected a torch.cuda.Stream, got {type(stream).__name__}")
        self._current.append(stream)
        try:
            yield stream
        finally:
            self._current.pop()

    def set_stream(self, stream) -> None:
        """torch.accelerator.set_stream: the current stream from now on (not a context)."""
        if not isinstance(stream, _Stream):
            raise TypeError(f"expected a torch.cuda.Stream, got {type(stream).__name__}")
        self._current[-1] = stream

    def synchronize(self, device=None) -> None:
        waits: dict = {}
        for stream in self.streams:
            _merge(waits, stream.clock)
        self.host_read("torch.cuda.synchronize", waits=waits)

    def host_read(self, what: str, waits: dict | None = None) -> None:
        """The host waits for the device (or reads a value from it): CUDA's error while capturing.
        `waits`: the work the host then knows is done (by default the current stream's)."""
        if self.capturing is not None:
            raise RuntimeError(f"{CAPTURE_ERROR} (the host waited for the device inside the capture: {what}; "
                               "a captured step cannot read a value or synchronize: read after replay())")
        self._host_waited(self.current_stream().clock if waits is None else waits)
        self.on_sync(what)

    def refuse_while_capturing(self, what: str) -> None:
        """A call CUDA refuses during a capture and allows (without a wait) outside one."""
        if self.capturing is not None:
            raise RuntimeError(f"{CAPTURE_ERROR} ({what} inside the capture)")

    def unsafe_call(self, what: str) -> None:
        """A CUDA call that is unsafe while a capture is underway (an allocation of pinned memory)."""
        graph = self.capturing
        if graph is None or graph.capture_error_mode == "relaxed":
            return
        if graph.capture_error_mode == "global" or threading.get_ident() == self.capture_thread:
            where = "this thread" if threading.get_ident() == self.capture_thread else "another thread"
            raise RuntimeError(f"{CAPTURE_ERROR} ({what} in {where} during a capture in "
                               f"capture_error_mode={graph.capture_error_mode!r})")

    @contextlib.contextmanager
    def unrecorded(self):
        """Operations in this block are not recorded by a capture (host work; a replay itself)."""
        self.unrecorded_depth += 1
        try:
            yield
        finally:
            self.unrecorded_depth -= 1

    # -- stream order ----------------------------------------------------------------------------
    def _host_waited(self, clock: dict) -> None:
        _merge(self._host_clock, clock)

    def _stream_name(self, stream_id: int) -> str:
        if stream_id == self.default_stream.id:
            return "the default stream"
        if stream_id == self.capture_stream.id:
            return "torch.cuda.graph's own capture stream"
        return f"side stream {stream_id}"

    def _forget(self, key) -> None:
        self._writes.pop(key, None)
        self._reads.pop(key, None)

    def _queue(self, what: str, *, reads: dict, writes: dict) -> None:
        """One operation (or a replay) queued on the current stream, with the memory it reads and writes
        (storage -> a tensor on it): a race with another stream's work on the same memory is logged; then
        this stream's use of that memory is recorded."""
        stream = self.current_stream()
        clock = stream.clock
        if self._host_clock:
            _merge(clock, self._host_clock)        # the host launched it after what it had waited for
        clock[stream.id] = now = clock.get(stream.id, 0) + 1
        written, read = writes, reads
        for key, t in {**read, **written}.items():        # at most one race per memory per operation
            if not key:
                continue
            did = "overwrote" if key in written else "read"
            last = self._writes.get(key)
            if last is not None and last[0] != stream.id and last[1] > clock.get(last[0], 0):
                self._race(what, did, t, last[2], "wrote", last[0], stream.id)
                continue
            if key in written:
                unseen = [(other, by) for other, (when, by) in self._reads.get(key, {}).items()
                          if other != stream.id and when > clock.get(other, 0)]
                if unseen:
                    self._race(what, did, t, unseen[0][1], "read", unseen[0][0], stream.id)
        for key in written:
            if key:
                self._writes[key] = (stream.id, now, what)
                self._reads[key] = {}
        for key in read:
            if key and key not in written:
                self._reads.setdefault(key, {})[stream.id] = (now, what)

    def _race(self, what, did, t, other_what, other_did, other_id, stream_id) -> None:
        self.races.append(Race(
            f"{what} on {self._stream_name(stream_id)} {did} a tensor of shape {tuple(t.shape)} that {other_what} "
            f"on {self._stream_name(other_id)} {other_did}, before {self._stream_name(stream_id)} waited for it "
            "(wait_stream, an event, or a synchronize)", _caller()))

    # -- capture ---------------------------------------------------------------------------------
    def _start_capture(self, graph: EmulatedGraph) -> None:
        self.capturing, self.capture_thread = graph, threading.get_ident()
        if self._python_reads:
            self._reads_mode = _PythonReads(self)
            self._reads_mode.__enter__()

    def _stop_capture(self, graph: EmulatedGraph) -> None:
        if self._reads_mode is not None:
            self._reads_mode.__exit__(None, None, None)
            self._reads_mode = None
        self.capturing, self.capture_thread = None, None

    def _new_graph(self, keep_graph: bool = False):
        graph = EmulatedGraph(self, keep_graph)
        self.graphs.append(graph)
        return graph

    def _graph_pool_handle(self):
        return ("emulated graph pool", next(self._pool_ids))

    def _seeding(self, original):
        def seed(*args, **kwargs):
            if self.capturing is not None:
                raise RuntimeError(SEED_WHILE_CAPTURING)
            return original(*args, **kwargs)
        return seed

    # -- entering and leaving ----------------------------------------------------------------
    def __enter__(self):
        stack = contextlib.ExitStack()
        owner = self

        def patch(module, name, value):
            if hasattr(module, name):
                stack.callback(setattr, module, name, getattr(module, name))
            else:
                stack.callback(delattr, module, name)
            setattr(module, name, value)

        import torch.cuda.graphs as graphs_module
        import torch.cuda.streams as streams_module
        values = {
            "CUDAGraph": self._new_graph,
            "graph": lambda cuda_graph, *args, **kwargs: _GraphContext(owner, cuda_graph, *args, **kwargs),
            "graph_pool_handle": self._graph_pool_handle,
            "is_current_stream_capturing": lambda: owner.capturing is not None,
            "Stream": _emulated_type("Stream", torch.cuda.Stream, lambda *a, **k: _Stream(owner, *a, **k), _Stream,
                                     agnostic=False),
            "stream": self.stream,
            "current_stream": self.current_stream,
            "default_stream": lambda device=None: owner.default_stream,
            "synchronize": self.synchronize,
            "Event": _emulated_type("Event", torch.cuda.Event, lambda *a, **k: _Event(owner, *a, **k), _Event,
                                    agnostic=False),
            "manual_seed": self._seeding(torch.cuda.manual_seed),
            "manual_seed_all": self._seeding(torch.cuda.manual_seed_all),
        }
        for name in self._CUDA_NAMES:
            patch(torch.cuda, name, values[name])
        # the module paths the API docs use; torch.cuda.make_graphed_callables (torch's own) calls these by them
        for name in ("CUDAGraph", "graph", "graph_pool_handle", "is_current_stream_capturing"):
            patch(graphs_module, name, values[name])
        for name in ("Stream", "Event"):
            patch(streams_module, name, values[name])
        # the device-agnostic names (torch 2.6+): torch.Stream, torch.Event, torch.accelerator.*
        for name, emulated in (("Stream", _Stream), ("Event", _Event)):
            patch(torch, name, _emulated_type(name, getattr(torch, name), values[name]._make, emulated,
                                              agnostic=True))
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None:
            patch(accelerator, "current_stream", self.current_stream)
            patch(accelerator, "set_stream", self.set_stream)
            patch(accelerator, "synchronize", self.synchronize)
            if hasattr(accelerator, "Graph"):
                def not_emulated(*args, **kwargs):
                    raise RuntimeError(NOT_EMULATED)
                patch(accelerator, "Graph", not_emulated)
        patch(torch, "manual_seed", self._seeding(torch.manual_seed))
        # an optimizer that is not capturable refuses to step in a capture, as on a GPU
        for name in ("_accelerator_graph_capture_health_check", "_cuda_graph_capture_health_check"):
            if name in vars(torch.optim.Optimizer):
                patch(torch.optim.Optimizer, name, _health_check(owner))
        stack.enter_context(_StreamOrder(self))
        self._stack = stack
        return self

    def __exit__(self, *exc):
        if self.capturing is not None:          # an exception escaped a capture begun by hand
            recorder = self.capturing._recorder
            if recorder is not None:
                recorder.__exit__(None, None, None)
                self.capturing._recorder = None
            self._stop_capture(self.capturing)
        stack, self._stack = self._stack, None
        stack.__exit__(*exc)
        return None


def _health_check(owner: EmulatedGraphs):
    def check(optimizer) -> None:
        if owner.capturing is not None and not all(g.get("capturable", False) for g in optimizer.param_groups):
            raise RuntimeError(not_capturable_message(type(optimizer).__name__))
    return check


def use_graphs(device) -> contextlib.AbstractContextManager:
    """The real torch.cuda on a CUDA device; the emulation elsewhere."""
    if torch.device(device).type == "cuda":
        return contextlib.nullcontext()
    return EmulatedGraphs()
