"""The rank side of checks 7.2-7.5 (lesson 07): what runs inside each process torchrun starts.

    python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        -m course_utils.checks.lesson07_ranks JOBS.json OUTDIR

`JOBS.json` is a list of jobs `{"exercise": "7.2", "file": ".../ddp_yours.py", "function":
"train_ddp", "seed": 123, "timeout_s": 20}`. For each job every rank joins a fresh process
group (so one job that breaks its group cannot spoil the next), imports the learner's file,
calls the learner's function on inputs drawn from the job's seed while recording what it does
(which samples each forward pass saw, which collectives it called, what it saved and loaded),
and writes what it saw to `OUTDIR/<job>-rank<r>.json`. It judges nothing: the check in the
notebook's process reads every rank's observations and decides (`lesson07.py`). A learner's
exception is recorded, never raised, so every rank always reaches the next job.

The inputs of each job (`case_72`, `cases_73`, `case_74`, `cases_75`) are functions of the seed alone, so
the check recomputes them to build the expected answers.

The ranks always run gloo on the CPU. What would differ under nccl is made visible where the
learner's own tensors meet a collective (7.3): a second pass runs the learner's function as if
the group were nccl, on the virtual CUDA device (`virtual_cuda.VirtualCuda`): `dist.get_backend()`
answers "nccl", and a collective handed a tensor that is not on the (virtual) GPU raises what
nccl raises, while one on it is reduced for real, through gloo, on its host values.
"""
from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import math
import os
import re
import weakref
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_object", "all_gather_into_tensor",
               "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "broadcast_object_list",
               "gather_object", "scatter_object_list", "all_to_all", "all_to_all_single")
SAVE_DELAY_S = 0.5       # a checkpoint write takes a while: a rank that does not wait for it finds no file
GRADING_ENV = "COURSE_GRADING_RANKS"   # the course's own answers (notebooks/scripts/ddp_exercises.py) refuse to run


# -- the inputs, from the seed alone (the check rebuilds them) ------------------------------------

def case_72(seed: int, world: int) -> dict:
    """Exercise 7.2's problem: a float64 classification set one sample short of dividing evenly
    among the ranks (DistributedSampler pads the last rank's share with a repeat; a sampler with
    drop_last=True gives each rank one sample fewer: w5-07 w72_16), a batch size that does not
    divide a rank's share (so each epoch ends on a partial batch). `per_rank` is each rank's share,
    ceil(n / world)."""
    rng = np.random.default_rng([72, seed])
    while True:
        per_rank = int(rng.integers(14, 30))
        batch = int(rng.integers(3, 8))
        if per_rank % batch > 1:      # a loader's drop_last drops 2 or more: never one sample, as a sampler's does
            break
    n, d_in, classes = per_rank * world - (1 if world > 1 else 0), 5, 3
    x = rng.normal(size=(n, d_in))
    centers = rng.normal(0, 1.5, size=(classes, d_in))
    y = rng.integers(0, classes, size=n)
    x[:, 1:] += centers[y, 1:]
    return {"n": n, "per_rank": per_rank, "batch_size": batch, "epochs": 3, "lr": float(rng.uniform(0.05, 0.3)),
            "sampler_seed": int(rng.integers(1, 10_000)), "d_in": d_in, "hidden": 8, "classes": classes,
            "x": x, "y": y}


def cases_73(seed: int, world: int) -> list[list[tuple[float, int, int]]]:
    """Exercise 7.3's inputs: per case, per rank, (loss_sum, correct, count). Always, in this
    order: equal counts, unequal counts, a rank with no samples, counts too large for float32,
    no samples on any rank, one sample in all (one rank holds it, the others none: w11-07 w73_19,
    `c / n if n > 1 else nan`, passed while no case had a total of exactly 1)."""
    rng = np.random.default_rng([73, seed])

    def rank_values(count):
        correct = int(rng.integers(0, count + 1)) if count else 0
        loss_sum = float(rng.uniform(0.2, 2.5) * count) if count else 0.0
        return (loss_sum, correct, int(count))

    cases = []
    equal = int(rng.integers(20, 200))
    cases.append([rank_values(equal) for _ in range(world)])                  # equal counts
    small, large = int(rng.integers(3, 40)), int(rng.integers(400, 5000))
    counts = [small if r % 2 == 0 else large for r in range(world)]
    cases.append([rank_values(c) for c in counts])                            # unequal counts
    empty = int(rng.integers(0, world))
    cases.append([rank_values(0 if r == empty else int(rng.integers(50, 500))) for r in range(world)])
    while True:
        big = []
        for r in range(world):                                                # beyond float32's integers
            count = 2 ** 25 + 2 * int(rng.integers(1, 2 ** 20)) + 1    # odd, so float32 cannot hold it
            correct = count - 2 * int(rng.integers(1, 2 ** 18))          # odd too
            big.append((float(count * rng.uniform(0.3, 1.9)) + 0.123456789, correct, count))
        if _float32_paths_differ(big):
            break
    cases.append(big)
    cases.append([(0.0, 0, 0) for _ in range(world)])                         # nobody has a sample
    one = int(rng.integers(0, world))                                         # one sample in all
    hit = int(rng.integers(0, 2))
    cases.append([(float(rng.uniform(0.2, 2.5)), hit, 1) if r == one else (0.0, 0, 0) for r in range(world)])
    return cases


def _float32_paths_differ(case) -> bool:
    """Whether the two ways of losing precision after exact sums tell apart in this case's results (w11-07
    w73_14): dividing in float32 (float32 sums of the numbers divided) and casting the exact means to
    float32. They give the same bits in about a quarter of the draws; those are drawn again."""
    f32 = np.float32
    loss, correct, count = (sum(c[i] for c in case) for i in range(3))
    division = (f32(f32(loss) / f32(count)), f32(f32(correct) / f32(count)))
    cast = (f32(loss / count), f32(correct / count))
    return any(d != c for d, c in zip(division, cast))


NCCL_CASE_73 = 1          # the case (unequal counts) run a second time as under nccl


def NCCL_GPUS_PER_NODE_73(world: int) -> int:
    """The GPUs of each machine in 7.3's pass as under nccl: twice the processes a node runs."""
    return 2 * world


def case_74(seed: int, world: int) -> dict:
    """Exercise 7.4's inputs: a float64 MLP, and for each call a local batch per rank split into
    k micro-batches (k = 1, and sizes that do not divide the batch). The ranks hold the same
    number of samples in every call but the last, where their counts differ (`local` per rank)."""
    rng = np.random.default_rng([74, seed])
    d_in, classes = 6, 4
    calls = []
    ks = (int(rng.integers(3, 6)), 1, int(rng.integers(2, 5)), int(rng.integers(2, 4)))
    for i, k in enumerate(ks):
        unequal = i == len(ks) - 1
        while True:
            local = [int(rng.integers(7, 19))] * world if not unequal else \
                [int(rng.integers(5, 10)) if r % 2 == 0 else int(rng.integers(14, 24)) for r in range(world)]
            if k == 1 or all(n % k for n in local):
                break
        xs = [rng.normal(size=(local[r], d_in)) for r in range(world)]
        ys = [rng.integers(0, classes, size=local[r]) for r in range(world)]
        calls.append({"k": k, "local": local, "x": xs, "y": ys, "equal_counts": not unequal})
    return {"d_in": d_in, "hidden": 10, "classes": classes, "init_seed": int(rng.integers(0, 2**31)),
            "stale": float(rng.uniform(3.0, 9.0)), "calls": calls}


LABEL_SMOOTHING_74 = 0.3


def loss_fn_74(logits, labels):
    """Exercise 7.4's loss_fn: a mean loss that is not plain cross-entropy, so that code ignoring the
    loss_fn it is given (F.cross_entropy(..., reduction='sum') / total: w6-07 w74_18) shows."""
    return F.cross_entropy(logits, labels, label_smoothing=LABEL_SMOOTHING_74)


class MLP(nn.Module):
    """Linear-tanh-Linear in float64 (no BatchNorm: micro-batches and shards change nothing)."""

    def __init__(self, d_in, hidden, classes):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden, dtype=torch.float64)
        self.fc2 = nn.Linear(hidden, classes, dtype=torch.float64)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class RecordingMLP(MLP):
    """The MLP of exercise 7.2, which also notes which samples each training forward pass saw
    (found from their first feature, which is unique)."""

    def __init__(self, d_in, hidden, classes, lookup):
        super().__init__(d_in, hidden, classes)
        self._lookup = lookup
        self.seen: list[list[int]] = []
        self.moves: list[str] = []         # the devices the learner's code moved it to (.to / .cuda)
        self.record_only = False           # the GPU pass of 7.2: note the move, keep the weights where they are

    def to(self, *args, **kwargs):
        if kwargs.get("device") is not None:    # read as given: the virtual GPU's parse_to reads device= as the CPU
            device = torch.device(kwargs["device"])
        else:
            device = torch._C._nn._parse_to(*args, **{k: v for k, v in kwargs.items() if k != "device"})[0]
        if device is not None:
            self.moves.append(str(device))
            if self.record_only:
                return self
        return super().to(*args, **kwargs)

    def cuda(self, device=None):
        self.moves.append(f"cuda:{torch.device(device).index if isinstance(device, (str, torch.device)) else device}"
                          if device is not None else "cuda")
        if self.record_only:
            return self
        return super().cuda(device)

    def forward(self, x):
        if self.training:
            self.seen.append([self._lookup.get(float(v), -1) for v in x[:, 0].detach().cpu().tolist()])
        return super().forward(x)


def state_lists(module) -> dict:
    return {k: v.detach().double().cpu().tolist() for k, v in module.state_dict().items()}


# -- recording what the learner's code does ---------------------------------------------------------

_INSIDE_DDP_HOOK = [0]     # DDP's own all-reduces (through a comm hook) are not the learner's calls


def _sequence_number() -> int:
    """Collectives the default process group has run so far (each rank's own count)."""
    return dist.distributed_c10d._get_default_group()._get_sequence_number_for_group()


class CollectiveCounter:
    """Counts collectives during a block: `count` from the process group's own sequence number
    (every collective, however it was called: `dist.all_reduce`, a name imported from
    torch.distributed, or the two that `all_gather_object` makes), and `calls`, the names of the
    learner's top-level calls through `torch.distributed.<name>`, for the messages."""

    def __init__(self):
        self.calls: list[str] = []
        self.devices: list[str] = []      # the device of each tensor the learner handed to a collective
        self.count = 0
        self._depth = 0
        self._saved = {}

    def __enter__(self):
        self._seq0 = _sequence_number()
        for name in COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            self._saved[name] = fn
            setattr(dist, name, self._wrap(name, fn))
        return self

    def _wrap(self, name, fn):
        def counted(*args, **kwargs):
            if self._depth == 0 and not _INSIDE_DDP_HOOK[0]:
                self.calls.append(name)
                self.devices += [str(t.device) for t in _tensor_args(args, kwargs)]
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
        return counted

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self.count = _sequence_number() - self._seq0


@contextlib.contextmanager
def watch_checkpoint_io(saves: list, loads: list, rank: int, snapshot=None):
    """Record torch.save / torch.load calls (what, where, when, and how many collectives this rank
    had run by then: waiting for another rank takes a collective, never a clock); a save takes
    SAVE_DELAY_S. `snapshot()`, if given, is called at each load: the model's weights just before it."""
    real_save, real_load = torch.save, torch.load

    def save(obj, f, *args, **kwargs):
        entry = {"path": str(getattr(f, "name", f)), "start": time.monotonic(), "rank": rank}
        if isinstance(obj, dict):
            entry["keys"] = sorted(map(str, obj))
            entry["values"] = {str(k): v.detach().double().cpu().tolist() for k, v in obj.items()
                               if isinstance(v, torch.Tensor)}
        else:
            entry["type"] = type(obj).__name__
        time.sleep(SAVE_DELAY_S)
        real_save(obj, f, *args, **kwargs)
        entry["end"] = time.monotonic()
        entry["collectives_before_end"] = _sequence_number()
        saves.append(entry)

    def load(f, *args, **kwargs):
        map_location = kwargs.get("map_location", args[0] if args else None)
        loads.append({"path": str(getattr(f, "name", f)), "time": time.monotonic(), "map_location": None if map_location is None
                      else str(map_location), "rank": rank, "weights_before": snapshot() if snapshot else None,
                      "collectives_before": _sequence_number()})
        return real_load(f, *args, **kwargs)

    torch.save, torch.load = save, load
    try:
        yield
    finally:
        torch.save, torch.load = real_save, real_load


@contextlib.contextmanager
def watch_ddp(wrapped: list, moved: list | None = None):
    """Record every DistributedDataParallel built (around which module, and where that module had
    been moved to by then)."""
    moved = [] if moved is None else moved
    from torch.nn.parallel import DistributedDataParallel
    real_init = DistributedDataParallel.__init__

    def init(self, module, *args, **kwargs):
        wrapped.append(type(module).__name__)
        moved.append(list(getattr(module, "moves", ["(not recorded)"])))   # was it moved before DDP wrapped it?
        real_init(self, module, *args, **kwargs)

    DistributedDataParallel.__init__ = init
    try:
        yield
    finally:
        DistributedDataParallel.__init__ = real_init


WORKER_TRACEBACK = "Original Traceback (most recent call last):"
_FRAME = re.compile(r'\s*File "(?P<file>.*)", line (?P<line>\d+), in ')


def _from_worker(message: str, learner_file: str | None) -> tuple[str, dict | None]:
    """An exception a DataLoader worker raised, as the main process re-raises it: its message is
    "Caught X in DataLoader worker process N." followed by the worker's whole traceback as text,
    whose last line is the learner's exception and whose frames name the learner's file (w11-07
    w75_14: cut at 600 characters, inside the grading code's frames, before either). Returns the
    head with the worker's last line, and the learner's innermost frame there."""
    head, text = message.split(WORKER_TRACEBACK, 1)
    lines = [line for line in text.splitlines() if line.strip()]
    where = None
    for j, line in enumerate(lines):
        m = _FRAME.match(line)
        if m and learner_file and os.path.abspath(m["file"]) == os.path.abspath(learner_file):
            code = lines[j + 1].strip() if j + 1 < len(lines) and not _FRAME.match(lines[j + 1]) else ""
            where = {"line": int(m["line"]), "code": code}       # the innermost one wins
    last = lines[-1].strip() if lines else ""
    return f"{head.strip().rstrip('.')}: {last}", where


def describe_error(exc: BaseException, learner_file: str | None) -> dict:
    """Type, message and the learner's line where it came from (in a DataLoader worker too)."""
    where = None
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if learner_file and os.path.abspath(frame.filename) == os.path.abspath(learner_file):
            where = {"line": frame.lineno, "code": (frame.line or "").strip()}
            break
    message = str(exc)
    if WORKER_TRACEBACK in message:
        message, in_worker = _from_worker(message, learner_file)
        where = in_worker or where
    return {"type": type(exc).__name__, "message": message[:600], "where": where,
            "not_implemented": isinstance(exc, NotImplementedError)}


def load_learner(path: str, function: str, tag: str):
    spec = importlib.util.spec_from_file_location(f"learner_{tag}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise AttributeError(f"{Path(path).name} defines no function {function}()")
    return fn


# -- the three harnesses ------------------------------------------------------------------------------

def run_72(fn, job, rank, world, workdir, obs) -> None:
    case = case_72(job["seed"], world)
    x, y = torch.tensor(case["x"]), torch.tensor(case["y"])
    lookup = {float(v): i for i, v in enumerate(x[:, 0].tolist())}
    dataset = torch.utils.data.TensorDataset(x, y)
    made = []

    def make_model():
        torch.manual_seed(1_000_003 * job["seed"] + 7919 * rank + len(made))   # differs per rank on purpose
        model = RecordingMLP(case["d_in"], case["hidden"], case["classes"], lookup)
        made.append({"model": model, "initial": state_lists(model)})
        return model

    checkpoint = Path(workdir) / f"checkpoint-{job['index']}.pt"
    obs.update({"saves": [], "loads": [], "ddp": [], "ddp_moves": [], "checkpoint": str(checkpoint)})

    def snapshot():
        return state_lists(made[0]["model"]) if made else None

    try:
        # graded as 2 nodes x 1 process (x-07 F1): every rank is local rank 0 of a node of its own,
        # as torchrun sets it there, so that LOCAL_RANK used where the global rank is meant (who
        # saves, the sampler's share) fails here as it does on a second machine
        with watch_checkpoint_io(obs["saves"], obs["loads"], rank, snapshot), \
                watch_ddp(obs["ddp"], obs["ddp_moves"]), \
                as_node(local_rank=0, per_node=1, node=rank, nodes=world):
            returned = fn(make_model, dataset, device=torch.device("cpu"), epochs=case["epochs"],
                          batch_size=case["batch_size"], lr=case["lr"], seed=case["sampler_seed"],
                          checkpoint=str(checkpoint))
    finally:
        obs["made"] = len(made)
        if made:
            obs["initial"] = made[0]["initial"]
            obs["seen"] = made[0]["model"].seen
    obs["returned"] = type(returned).__name__
    obs["returned_ddp"] = isinstance(returned, nn.parallel.DistributedDataParallel)
    if isinstance(returned, nn.Module):
        obs["final"] = state_lists(returned)
        obs["returned_is_made"] = any(returned is m["model"] for m in made)
    loads = [ld for ld in obs["loads"] if ld["weights_before"] is not None]
    obs["trained"] = loads[0]["weights_before"] if loads else obs.get("final")
    obs["gpu_pass"] = _run_72_as_on_gpus(fn, job, rank, world, workdir, case, dataset, lookup)
    # and as one node of `world` GPUs: rank r's device is cuda:r, so that a hard-coded cuda:0 (in
    # .to() or in device_ids) shows on rank 1 (w5-07 w72_22, w72_26)
    obs["gpu_pass_one_node"] = _run_72_as_on_gpus(fn, job, rank, world, workdir, case, dataset, lookup,
                                                  one_node=True)


class _StopHere(BaseException):
    """Ends the GPU pass of 7.2 where DDP wraps the model (or the model first runs): a BaseException,
    so that the learner's `except Exception` does not swallow it."""


def _run_72_as_on_gpus(fn, job, rank, world, workdir, case, dataset, lookup, one_node=False) -> dict:
    """The learner's train_ddp once more, as on 2 nodes of 1 GPU each: `device` is cuda:0 (a virtual
    GPU: torch.cuda says there is one), and the pass stops where DistributedDataParallel wraps the
    model, noting where the learner's code moved it. Nothing is trained (the moves are recorded, the
    weights stay in host memory): this pass only asks whether the model went to the `device` the
    caller gave, and not to one the code guessed (cuda:RANK, the global rank, is cuda:1 on the second
    node, which has one GPU: w4-07 w72_global_rank_device). With `one_node`, as one node of
    `world` GPUs instead: rank r's `device` is cuda:r, so a GPU the code named itself (cuda:0,
    device_ids=[0]) is another rank's GPU on rank 1 (w5-07). DDP's device_ids are noted too."""
    from torch.nn.parallel import DistributedDataParallel
    from .virtual_cuda import VirtualCuda
    found = {"moves": None, "wrapped": False}

    def make_model():
        torch.manual_seed(1_000_003 * job["seed"] + 7919 * rank)
        model = RecordingMLP(case["d_in"], case["hidden"], case["classes"], lookup)
        model.record_only = True

        def stop(*args, **kwargs):
            found["moves"] = list(model.moves)
            raise _StopHere
        model.forward = stop
        return model

    real_init = DistributedDataParallel.__init__

    def init(self, module, device_ids=None, output_device=None, *args, **kwargs):
        found["moves"], found["wrapped"] = list(getattr(module, "moves", [])), True
        found["device_ids"] = None if device_ids is None else [str(torch.device("cuda", d) if isinstance(d, int)
                                                                   else torch.device(d)) for d in device_ids]
        found["device_ids_given"] = None if device_ids is None else repr(list(device_ids))
        raise _StopHere

    checkpoint = Path(workdir) / f"gpu-checkpoint-{job['index']}{'-one-node' if one_node else ''}.pt"
    node = as_node(local_rank=rank, per_node=world, node=0, nodes=1) if one_node else \
        as_node(local_rank=0, per_node=1, node=rank, nodes=world)
    index, count = (rank, world) if one_node else (0, 1)
    found["device"] = f"cuda:{index}"
    DistributedDataParallel.__init__ = init
    try:
        with node, VirtualCuda(index=index, count=count):
            fn(make_model, dataset, device=torch.device("cuda", index), epochs=case["epochs"],
               batch_size=case["batch_size"], lr=case["lr"], seed=case["sampler_seed"], checkpoint=str(checkpoint))
    except _StopHere:
        pass
    except Exception as exc:
        found["error"] = describe_error(exc, job["file"])
    finally:
        DistributedDataParallel.__init__ = real_init
    return found


@contextlib.contextmanager
def as_node(*, local_rank: int, per_node: int, node: int, nodes: int, global_rank: int | None = None):
    """The environment torchrun gives a process that is local rank `local_rank` of `per_node` on node
    `node` of `nodes` (LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE); with `global_rank`,
    RANK and `dist.get_rank()` say that rank instead (the same process, as on a later node)."""
    env = {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(node),
           "GROUP_WORLD_SIZE": str(nodes)}
    if global_rank is not None:
        env["RANK"] = env["ROLE_RANK"] = str(global_rank)
    saved_env = {k: os.environ.get(k) for k in env}
    saved_rank = dist.get_rank
    os.environ.update(env)
    if global_rank is not None:
        dist.get_rank = lambda group=None: global_rank if group is None else saved_rank(group)
    try:
        yield
    finally:
        dist.get_rank = saved_rank
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_73(fn, job, rank, world, workdir, obs) -> None:
    results = obs.setdefault("results", [])
    cases = cases_73(job["seed"], world)
    for case in cases:
        entry = _call_73(fn, case[rank], job)
        results.append(entry)
        if "error" in entry:
            return           # the ranks' collectives may be out of step now: stop here
    # the same learner code once more, as it would run under nccl (the learner's file loaded anew,
    # so that names it imported from torch.distributed are the nccl-like ones), as the second node
    # of a job of 2 nodes x `world` GPUs: rank r is global rank world + r, on its node's GPU r
    # (cuda:LOCAL_RANK, what init_process_group set as the current device); a tensor on another
    # GPU of the node, or on a GPU the node does not have, fails as it does there (x-07 F2)
    from .virtual_cuda import VirtualCuda
    # w7-07 w73_17: machines of 2 x `world` GPUs, more than the processes a node runs, so that
    # cuda:{rank % device_count()} is not the local rank there (it is only with one process per GPU)
    with as_node(local_rank=rank, per_node=world, node=1, nodes=2, global_rank=world + rank), \
            VirtualCuda(index=rank, count=NCCL_GPUS_PER_NODE_73(world), other_device=NCCL_OTHER_DEVICE) as vc, \
            as_if_nccl(vc):
        fn_nccl = load_learner(job["file"], job["function"], f"{job['index']}-nccl")
        entry = _call_73(fn_nccl, cases[NCCL_CASE_73][rank], job)
    obs["nccl"] = entry


def _call_73(fn, args, job) -> dict:
    loss_sum, correct, count = args
    entry = {}
    with CollectiveCounter() as counter:
        try:
            value = fn(loss_sum, correct, count)
        except Exception as exc:
            if isinstance(exc, NotImplementedError):
                raise
            entry["error"] = describe_error(exc, job["file"])
            value = None
    entry["collectives"] = counter.count
    entry["collective_names"] = counter.calls
    entry["collective_devices"] = counter.devices
    entry["value"] = _numbers(value)
    entry["types"] = _types(value)
    return entry


# what torch 2.x raises for a host tensor in a collective of an nccl group (it has no CPU backend)
NCCL_CPU_TENSOR = "No backend type associated with device type cpu"
# what ProcessGroupNCCL raises for a tensor on a GPU other than the one the group is bound to
NCCL_OTHER_DEVICE = "Tensor found on device {found} but backend constrained to {own}"


@contextlib.contextmanager
def as_if_nccl(vc):
    """Inside: `dist.get_backend()` says "nccl", and every collective does what nccl would with
    its tensors: a tensor on the (virtual) GPU is reduced, for real, through the gloo group on
    its host values; a tensor in host memory raises nccl's error."""
    import torch.distributed.distributed_c10d as c10d
    from .virtual_cuda import DeviceTensor
    saved = {}

    def patch(module, name, value):
        saved[(module, name)] = getattr(module, name)
        setattr(module, name, value)

    def on_device(name, real):
        def collective(*args, **kwargs):
            tensors = [t for t in _tensor_args(args, kwargs)]
            host = [t for t in tensors if not isinstance(t, DeviceTensor)]
            if host:
                raise RuntimeError(f"{NCCL_CPU_TENSOR} (dist.{name} was handed a tensor on {host[0].device}, "
                                   "and an nccl group reduces GPU memory only)")
            inner = [t._inner for t in tensors]
            swap = dict(zip(map(id, tensors), inner))
            args = [swap.get(id(a), a) if isinstance(a, torch.Tensor) else
                    [swap.get(id(x), x) for x in a] if isinstance(a, list) else a for a in args]
            kwargs = {k: swap.get(id(v), v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            out = real(*args, **kwargs)
            stream = vc.current_stream()
            for t in tensors:                       # the device memory was written, on this stream
                stream.seq += 1
                t._alloc.write = (stream.id, stream.seq)
            return out
        return collective

    patch(dist, "get_backend", lambda group=None: "nccl")
    patch(c10d, "get_backend", lambda group=None: "nccl")
    for name in COLLECTIVES:
        if name.endswith("_object") or name.endswith("_object_list") or getattr(dist, name, None) is None:
            continue
        patch(dist, name, on_device(name, getattr(dist, name)))
    try:
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def _tensor_args(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.Tensor))


def _numbers(value):
    """The learner's (mean_loss, accuracy) as floats (a tensor of one element read out: `_types`
    says what it was), or a description of what it was."""
    if value is None:
        return None
    if not isinstance(value, (tuple, list)):
        return {"bad": f"{type(value).__name__}: {value!r:.60}"}
    out = []
    for v in value:
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.detach().cpu().item()
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
            return {"bad": f"{type(value).__name__} holding {type(v).__name__}"}
        v = float(v)
        out.append(v if math.isfinite(v) else str(v))
    return out


def _types(value) -> list[str] | None:
    """What the learner returned, item by item: 'float' for a Python float, else the type's name."""
    if not isinstance(value, (tuple, list)):
        return None
    return ["float" if isinstance(v, float) else type(v).__name__ for v in value]


def run_74(fn, job, rank, world, workdir, obs) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    case = case_74(job["seed"], world)
    torch.manual_seed(case["init_seed"] + rank)          # DDP broadcasts rank 0's weights anyway
    model = MLP(case["d_in"], case["hidden"], case["classes"])
    events = []                  # "F" per forward with autograd on, "B" per backward
    synced = []                  # for each pass: was DDP's gradient sync on (outside no_sync) at that moment?

    def on_forward(module, inputs, output):
        if torch.is_grad_enabled() and output.requires_grad:
            events.append("F")
            synced.append(("F", ddp.require_backward_grad_sync))
            output.register_hook(on_backward)

    def on_backward(grad):
        events.append("B")
        synced.append(("B", ddp.require_backward_grad_sync))

    model.register_forward_hook(on_forward)
    # w7-07 w74_13: backward(retain_graph=True), or a loss kept with its graph: each tensor autograd
    # saves for backward is packed in a holder; at each forward's start, the holders still alive are
    # earlier micro-batches' activations (backward without retain_graph frees them)
    saved = []                   # weak references to the holders of the call's saved tensors
    alive_at_forward = []        # for each forward: how many earlier saved tensors were still alive

    class _Saved:
        __slots__ = ("tensor", "__weakref__")

        def __init__(self, tensor):
            self.tensor = tensor

    def pack(tensor):
        holder = _Saved(tensor)
        saved.append(weakref.ref(holder))
        return holder

    model.register_forward_pre_hook(
        lambda module, inputs: alive_at_forward.append(sum(ref() is not None for ref in saved))
        if torch.is_grad_enabled() else None)
    ddp = DistributedDataParallel(model)
    hooks = {"n": 0}

    def counting_hook(state, bucket):
        hooks["n"] += 1
        _INSIDE_DDP_HOOK[0] += 1
        try:
            return default_hooks.allreduce_hook(state, bucket)
        finally:
            _INSIDE_DDP_HOOK[0] -= 1

    ddp.register_comm_hook(None, counting_hook)
    warm = case["calls"][0]
    for _ in range(2):                                    # DDP settles its buckets after the first backward
        hooks["n"] = 0
        F.cross_entropy(ddp(torch.tensor(warm["x"][rank])), torch.tensor(warm["y"][rank])).backward()
    buckets = hooks["n"]                                  # all-reduces in one synchronising backward
    initial = state_lists(model)
    obs.update({"buckets": buckets, "initial": initial})
    results = obs.setdefault("results", [])
    for call in case["calls"]:
        x, y = torch.tensor(call["x"][rank]), torch.tensor(call["y"][rank])
        micro = list(zip(torch.tensor_split(x, call["k"]), torch.tensor_split(y, call["k"])))
        for p in model.parameters():
            p.grad = torch.full_like(p, case["stale"])    # last step's gradients: the call must clear them
        hooks["n"] = 0
        events.clear()
        synced.clear()
        saved.clear()
        alive_at_forward.clear()
        steps = []          # any optimizer's step() during the call (even one with lr=0, which changes nothing)
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        step_hook = register_optimizer_step_pre_hook(
            lambda optimizer, args, kwargs: steps.append(type(optimizer).__name__))
        from ..syncs import SyncCounter
        reads = SyncCounter(host_reads=True, cuda_debug=False)  # a value read here is a wait for the GPU there
        try:
            with CollectiveCounter() as counter, reads, \
                    torch.autograd.graph.saved_tensors_hooks(pack, lambda holder: holder.tensor):
                returned = fn(ddp, micro, loss_fn_74)
        finally:
            step_hook.remove()
        learner_file = os.path.abspath(job["file"])
        mine = [(name, where) for name, where in zip(reads.calls, reads.where)
                if os.path.abspath(where.rpartition(":")[0]) == learner_file]
        results.append({"k": call["k"], "all_reduces": hooks["n"] / max(buckets, 1),
                        "own_collectives": counter.count - hooks["n"], "collective_names": counter.calls,
                        "events": "".join(events), "synced": synced[:], "alive_at_forward": alive_at_forward[:],
                        "returned_type": "float" if isinstance(returned, float) else type(returned).__name__,
                        "returned_graph": bool(isinstance(returned, torch.Tensor) and returned.requires_grad),
                        "grads": [None if p.grad is None else p.grad.detach().double().tolist()
                                  for p in model.parameters()],
                        "returned": _numbers([returned]) if returned is not None else None,
                        "weights_changed": state_lists(model) != initial, "optimizer_steps": steps,
                        "host_reads": [f"{name} at line {where.rpartition(':')[2]}" for name, where in mine]})


# -- 7.5 shards for every rank and worker ---------------------------------------------------------------

def cases_75(seed: int, world: int) -> list[dict]:
    """Exercise 7.5's inputs, always in this order: (0) many shards of unequal sizes, two workers
    per rank, three epochs (then all again in this process, on the same object: nothing may be kept
    from an earlier call) and a resumed epoch; (1) an odd number of samples, world x batch x m + 1
    (one sample too many for m full batches per rank, one too few for m + 1), read without
    workers; (2) a single shard, two workers per rank, resumed after an odd number of batches;
    (3) a single shard over six epochs, without workers; (4) a single shard with a remainder of one
    over 21 epochs and (5) 16 small shards over ten epochs, both without workers; (6) a single
    shard, four workers per rank, resumed before its last batch; (7) two shards that divide into full
    batches exactly, without workers.
    Only (7), drawn last, divides into full batches (the edge where dropping and padding agree): in
    every other case they give different epochs."""
    rng = np.random.default_rng([75, seed])
    cases = []
    while True:
        sizes = [int(v) for v in rng.integers(30, 51, size=int(rng.integers(8, 13)))]
        batch = int(rng.integers(4, 10))
        if sum(sizes) % (world * batch):
            break
    k = sum(sizes) // (world * batch)
    # three epochs: a right answer's split repeats between two epochs by chance (about 1 seed in 300),
    # between three, about 1 in 100,000
    cases.append({"sizes": sizes, "batch_size": batch, "seed": int(rng.integers(0, 10_000)), "workers": 2,
                  "epochs": [0, 1, 2], "resume": [1, int(rng.integers(2, k - 2))]})
    batch = int(rng.integers(3, 7))
    n = world * batch * int(rng.integers(5, 9)) + 1
    cuts = sorted(int(c) for c in rng.choice(np.arange(1, n), size=2, replace=False))
    cases.append({"sizes": [cuts[0], cuts[1] - cuts[0], n - cuts[1]], "batch_size": batch,
                  "seed": int(rng.integers(0, 10_000)), "workers": 0, "epochs": [int(rng.integers(0, 5))],
                  "resume": None})
    while True:
        n, batch = int(rng.integers(40, 81)), int(rng.integers(3, 7))
        if n % (world * batch) and n // (world * batch) >= 4:
            break
    cases.append({"sizes": [n], "batch_size": batch, "seed": int(rng.integers(0, 10_000)), "workers": 2,
                  "epochs": [0], "resume": [0, 1 + 2 * int(rng.integers(0, (n // (world * batch) - 1) // 2))]})
    # (3) a single shard over six epochs, read without workers, its remainder as large as it can be
    # (world x batch - 1 samples): dropping, the samples left out must change with the epoch, neither
    # the same every epoch (a cut always at the stream's start: w4-07 w75_fixed_offset) nor every
    # other epoch (w75_tail_always_dropped). A cut drawn from (seed, epoch) has world x batch >= 10
    # places, so a right answer repeats a 2-cycle over six epochs with a chance of 1 in 10,000 at most.
    batch = int(rng.integers(5, 7))
    n = world * batch * int(rng.integers(4, 7)) + world * batch - 1
    cases.append({"sizes": [n], "batch_size": batch, "seed": int(rng.integers(0, 10_000)), "workers": 0,
                  "epochs": [0, 1, 2, 3, 4, 5], "resume": None})
    # (4) a single shard with a remainder of one sample, over 21 epochs, without workers: dropping,
    # the cut's offset is 0 or 1, and each sample must be trained in some epoch: an offset drawn below
    # the remainder (an exclusive bound: w5-07 w75_15) never trains the shard's last sample. A right
    # answer never reaches offset 1 in 21 epochs with a chance of 2**-21 (5e-7)
    batch = int(rng.integers(3, 6))
    n = world * batch * int(rng.integers(3, 6)) + 1
    cases.append({"sizes": [n], "batch_size": batch, "seed": int(rng.integers(0, 10_000)), "workers": 0,
                  "epochs": list(range(21)), "resume": None})
    # (5) 16 small shards over ten epochs, without workers: the shards a rank reads change with the
    # epoch (their order is drawn anew, not only the cut: w5-07 w75_16 read the same half of the data
    # every epoch; the check fails 5 or more shards read in all ten). A right answer's rank reads a
    # given shard in all ten epochs with a chance near 0.55**10 (1 in 400): five such shards of 16,
    # about 1e-9 (4,000 seeds: at most 2); the unshuffled answer had 6 or more on every one of them
    batch = int(rng.integers(2, 4))
    while True:
        sizes = [int(v) for v in rng.integers(4, 9, size=16)]
        if sum(sizes) % (world * batch):
            break
    cases.append({"sizes": sizes, "batch_size": batch, "seed": int(rng.integers(0, 10_000)), "workers": 0,
                  "epochs": list(range(10)), "resume": None})
    # (6) a single shard, FOUR workers per rank, K = 4m + 2 batches per rank, resumed before its last
    # batch: the split of K batches among W workers shows only when W does not divide K, and only near
    # the epoch's end, where a worker runs dry. With two workers, ceil(K/W) per worker and the longer runs
    # last are right (w6-07 w75_14, w75_15); with three, each is right for one of K % 3 = 1, 2; with
    # four and K % 4 = 2 both resume wrongly from batch K - 1 (a simulation of the DataLoader's
    # round-robin, on every K; the fewest workers and the one resume point that catch both)
    batch = int(rng.integers(3, 6))
    while True:
        n = int(rng.integers(60, 161))
        k = n // (world * batch)
        if n % (world * batch) and k % 4 == 2 and k >= 10:      # 6 would leave a ceil(K/W) split's worker idle
            break
    cases.append({"sizes": [n], "batch_size": batch, "seed": int(rng.integers(0, 10_000)), "workers": 4,
                  "epochs": [0], "resume": [0, k - 1]})
    # (7) the near-miss rule on the remainder's edge: two shards that divide into full batches exactly,
    # where dropping and padding agree (nothing to drop, nothing to pad): a padding answer that always adds
    # a batch (n // (world x batch) + 1), or an offset drawn from rng.integers(0, remainder), shows only here.
    # Drawn last, so that the cases above keep their draws
    batch = int(rng.integers(3, 6))
    n = world * batch * int(rng.integers(3, 7))
    cut = int(rng.integers(1, n))
    cases.append({"sizes": [cut, n - cut], "batch_size": batch, "seed": int(rng.integers(0, 10_000)), "workers": 0,
                  "epochs": [int(rng.integers(0, 5))], "resume": None})
    return cases


MAX_BATCHES_75 = 5000        # a stream that yields more than this is endless
NO_GROUP = ("Default process group has not been initialized, please make sure to call init_process_group. "
            "(inside a DataLoader worker started by spawn)")


def _pairs(batch):
    """A batch as [[shard, index], ...], or None when it is not a sequence of pairs of integers."""
    try:
        if hasattr(batch, "tolist"):
            batch = batch.tolist()
        out = []
        for item in batch:
            if hasattr(item, "tolist"):
                item = item.tolist()
            shard, index = item
            if int(shard) != shard or int(index) != index:
                return None
            out.append([int(shard), int(index)])
        return out
    except (TypeError, ValueError):
        return None


class _TaggedStream(torch.utils.data.IterableDataset):
    """The learner's stream, each batch tagged with the DataLoader worker that yielded it."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        for i, batch in enumerate(self.inner):
            if i >= MAX_BATCHES_75:
                yield worker, "endless"
                return
            pairs = _pairs(batch)
            yield worker, pairs if pairs is not None else {"bad": repr(batch)[:80]}


def _as_if_spawned(worker_id):
    """A DataLoader worker as the spawn or forkserver start method makes it (macOS, Python 3.14's
    default on Linux): torch.distributed is not initialised there. (The check's workers are forked,
    which is quicker; this takes away what a fork would have copied.)"""
    def no_group(*args, **kwargs):
        raise ValueError(NO_GROUP)

    dist.is_initialized = lambda: False
    for name in ("get_rank", "get_world_size", "get_backend", "barrier", "all_reduce", "broadcast"):
        setattr(dist, name, no_group)
    dist.distributed_c10d._get_default_group = no_group


def _read_stream(stream, workers: int, timeout_s: float, spawn: bool = False) -> list:
    extra = {"multiprocessing_context": "spawn"} if spawn else {"worker_init_fn": _as_if_spawned} if workers else {}
    loader = torch.utils.data.DataLoader(_TaggedStream(stream), batch_size=None, num_workers=workers,
                                         timeout=(timeout_s + (60 if spawn else 0)) if workers else 0, **extra)
    return [[worker, pairs] for worker, pairs in loader]


def load_importable(path: str, function: str, tag: str, workdir):
    """The learner's class from a copy of its file that a spawned worker can import by name (a
    module loaded from a path under another name cannot be unpickled there). The copy lives in the
    launch's own folder, removed with it."""
    import importlib
    import shutil
    folder = Path(workdir) / f"importable-{tag}-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"learner_75_{tag}_{os.getpid()}"
    shutil.copyfile(path, folder / f"{name}.py")
    sys.path.insert(0, str(folder))
    module = importlib.import_module(name)
    obj = getattr(module, function, None)
    if obj is None:
        raise AttributeError(f"{Path(path).name} defines no {function}")
    return obj


def run_75(cls, job, rank, world, workdir, obs) -> None:
    cls = load_importable(job["file"], job["function"], str(job["index"]), workdir)
    results = obs.setdefault("results", [])
    timeout = job.get("timeout_s", 20)
    for i, case in enumerate(cases_75(job["seed"], world)):
        entry = {"epochs": {}, "resume": None}
        results.append(entry)
        try:
            stream = cls(list(case["sizes"]), case["batch_size"], seed=case["seed"])
            for epoch in case["epochs"]:
                stream.set_epoch(epoch)
                spawn = bool(job.get("spawn")) and i == 0 and epoch == case["epochs"][0]
                entry["epochs"][str(epoch)] = _read_stream(stream, case["workers"], timeout, spawn)
            if i == 0:           # the same object, iterated here: each epoch's plan from (seed, epoch) again
                entry["in_process"] = {}
                for epoch in case["epochs"]:
                    stream.set_epoch(epoch)
                    entry["in_process"][str(epoch)] = _read_stream(stream, 0, timeout)
                _seed_and_repeat_75(cls, stream, case, entry, lambda st: _read_stream(st, 0, timeout))
            if case["resume"]:
                epoch, start = case["resume"]
                again = cls(list(case["sizes"]), case["batch_size"], seed=case["seed"])   # as a restarted job
                again.set_epoch(epoch, start=start)
                entry["resume"] = _read_stream(again, case["workers"], timeout)
                if i == 0 and str(epoch + 1) in entry.get("in_process", {}):
                    # the next epoch, set without start, after the resumed one (w5-07 w75_18: a start kept)
                    again.set_epoch(epoch + 1)
                    entry["after_resume"] = [epoch + 1, _read_stream(again, 0, timeout)]
        except Exception as exc:
            if isinstance(exc, NotImplementedError) or "NotImplementedError" in str(exc).split("\n", 1)[0]:
                raise NotImplementedError("Exercise 7.5") from None
            entry["error"] = describe_error(exc, sys.modules[cls.__module__].__file__)
            entry["error"]["no_group_in_worker"] = "Default process group has not been initialized" in str(exc) \
                and case["workers"] > 0


def _seed_and_repeat_75(cls, stream, case, entry, read) -> None:
    """Case 0's reads in this process that a split drawn from (seed, epoch) alone, anew on every call,
    answers predictably (w11-07): the last epoch iterated once more on the same object, right after
    itself (a generator kept on the object between iterations, even one rebuilt when the epoch
    changes, gives other batches: w75_10); and the first epoch with the next seed on a fresh object:
    not the seed's own first epoch (the seed ignored: w75_15), nor the seed's second one (seed and
    epoch mixed into one number, default_rng(seed + epoch): w75_08)."""
    last = case["epochs"][-1]
    stream.set_epoch(last)
    entry["in_process_again"] = [last, read(stream)]
    other = cls(list(case["sizes"]), case["batch_size"], seed=case["seed"] + 1)
    other.set_epoch(case["epochs"][0])
    entry["next_seed"] = [case["seed"] + 1, case["epochs"][0], read(other)]


HARNESSES = {"7.2": run_72, "7.3": run_73, "7.4": run_74, "7.5": run_75}


def store_barrier(store, key: str, world: int, *, timeout_s: float) -> None:
    """Wait until `world` ranks have reached `key`, through the store alone (no process group)."""
    store.add(key, 1)
    deadline = time.monotonic() + timeout_s
    while store.add(key, 0) < world:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other ranks did not reach {key} within {timeout_s:g} s")
        time.sleep(0.01)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    jobs = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ[GRADING_ENV] = "1"
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                         timeout=timedelta(seconds=max(j.get("timeout_s", 20) for j in jobs) + 90))
    for index, job in enumerate(jobs):
        job = {**job, "index": index}
        obs = {"rank": rank, "world": world}
        try:
            # every rank starts the job together (one may still be leaving a hung collective of the
            # last job), then joins the job's own process group
            store_barrier(base, f"start{index}", world, timeout_s=job.get("timeout_s", 20) + 60)
            dist.init_process_group("gloo", store=dist.PrefixStore(f"job{index}", base), rank=rank,
                                    world_size=world, timeout=timedelta(seconds=job.get("timeout_s", 20)))
            fn = load_learner(job["file"], job["function"], f"{index}")
            HARNESSES[job["exercise"]](fn, job, rank, world, out, obs)    # fills obs as it goes
        except BaseException as exc:          # the learner's error is an observation, never a crash
            obs["error"] = describe_error(exc, job["file"])
            if isinstance(exc, KeyboardInterrupt):
                raise
        finally:
            if os.environ.get(GRADING_ENV) != "1":      # the learner's code switched the course's refusal off
                obs["tampered"] = True
                os.environ[GRADING_ENV] = "1"
            gc.collect()             # the job's DDP, freed before its group (gloo's threads, at exit, abort)
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        try:
            text = json.dumps(obs)
        except (TypeError, ValueError) as exc:        # something unexpected in the observations
            text = json.dumps({"rank": rank, "world": world,
                               "error": {"type": "HarnessError", "message": f"observations not JSON: {exc}",
                                         "where": None, "not_implemented": False}})
        (out / f"{index}-rank{rank}.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
