"""Checks for lesson 06 (DataParallel: what one process driving N devices costs).

6.1 a scaling estimator, 6.2 scatter and gather exactly as DataParallel does, 6.3 the memory
each device holds. Each check tests the learner's function on fresh random inputs against
the rules the lesson states; 6.2's reference is torch's own `scatter`/`gather` recursion
(`torch.nn.parallel.scatter_gather`) with its two leaf operations done where the tensors are
(see `reference_scatter`). A learner's function that calls the course's own implementation
(`course_utils.scaling`) or torch's DataParallel primitives fails with a sentence saying why.
"""
from __future__ import annotations

import collections
import contextlib
import math
import numbers
import types

import torch

from .. import scaling
from ._core import CheckFailed, Tripwire, WrongType, exercise, expect_callable, trusted
from ._util import fresh_rng
from .virtual_cuda import VirtualCuda

__all__ = ["reference_scatter", "reference_gather"]


# -- calls the learner's code must not make --------------------------------------------------------

_Tripwire = Tripwire      # the checks' tamper-proof watch (`_core.Tripwire`): switching it off fails the check


def _call(fn, tripwire: _Tripwire, prop: str, why: str, hint: str, *args, **kwargs):
    """Call the learner's `fn` with the tripwire set; a forbidden call fails `prop`."""
    tripwire.prop, tripwire.why, tripwire.hint = prop, why, hint
    return tripwire.call(fn, *args, **kwargs)


def _course_tripwire(*functions) -> _Tripwire:
    return _Tripwire(codes=[f.__code__ for f in functions])


# -- 6.1 a scaling estimator -------------------------------------------------------------------------

_RESULT_KEYS = ("samples_per_s", "efficiency", "bound")


def _expected_dp(costs: scaling.StageCosts, n: int, batch: int, loader: float) -> dict:
    p = scaling.predict_dp(costs, n, batch, loader)
    return {"samples_per_s": p.samples_per_s, "efficiency": p.efficiency, "bound": p.bound}


def _read_estimate(value, where) -> dict:
    if not isinstance(value, collections.abc.Mapping):
        raise CheckFailed("returns samples_per_s, efficiency and bound",
                          f"{where}: yours returned {type(value).__name__}, expected a dict",
                          "return {'samples_per_s': ..., 'efficiency': ..., 'bound': ...}")
    missing = [k for k in _RESULT_KEYS if k not in value]
    if missing:
        raise CheckFailed("returns samples_per_s, efficiency and bound",
                          f"{where}: the dict has no {', '.join(repr(k) for k in missing)}")
    out = {}
    for key in ("samples_per_s", "efficiency"):
        v = value[key]
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
            raise CheckFailed("returns samples_per_s, efficiency and bound",
                              f"{where}: {key} is {v!r}, expected a finite number")
        out[key] = float(v)
    if value["bound"] not in ("loader", "host", "devices"):
        raise CheckFailed("names what bounds the run", f"{where}: bound is {value['bound']!r}, "
                          "expected 'loader', 'host' or 'devices'")
    out["bound"] = value["bound"]
    return out


def _costs(rng, **fixed) -> scaling.StageCosts:
    values = dict(
        compute_fixed_ms=float(rng.uniform(0.2, 3.0)), compute_per_sample_ms=float(rng.uniform(0.01, 0.2)),
        scatter_ms_per_sample=float(rng.uniform(0.0005, 0.02)), gather_ms_per_sample=float(rng.uniform(0.0001, 0.01)),
        replicate_ms=float(rng.uniform(0.2, 4.0)), reduce_ms=float(rng.uniform(0.2, 4.0)),
        device0_ms=float(rng.uniform(0.1, 2.0)), host_ms_per_replica=float(rng.uniform(0.05, 0.6)))
    values.update(fixed)
    return scaling.StageCosts(**values)


def _describe_case(costs, n, batch, loader) -> str:
    loader_text = "an unlimited loader" if math.isinf(loader) else f"a loader of {loader:,.0f} samples/s"
    return f"{n} device(s), batch {batch}, {loader_text}"


def _compare_estimate(estimate, costs, n, batch, loader, tripwire, props):
    where = _describe_case(costs, n, batch, loader)
    yours = _read_estimate(_call(estimate, tripwire, "computes the estimate itself",
                                 "that is the course's own model, which the lesson uses for its plots",
                                 "write the model from the stage costs with plain arithmetic",
                                 costs, n, batch, loader), where)
    expected = _expected_dp(costs, n, batch, loader)
    speed_prop, eff_prop, bound_prop = props
    if not trusted.isclose(yours["samples_per_s"], expected["samples_per_s"], rel_tol=1e-6):
        raise CheckFailed(speed_prop, f"{where}: yours {yours['samples_per_s']:,.2f} samples/s, "
                          f"expected {expected['samples_per_s']:,.2f}", _speed_hint(speed_prop))
    if not trusted.isclose(yours["efficiency"], expected["efficiency"], rel_tol=1e-6):
        raise CheckFailed(eff_prop, f"{where}: yours {yours['efficiency']:.4f}, expected {expected['efficiency']:.4f}",
                          "efficiency = samples/s / (n_devices x the samples/s of one device training alone on "
                          "the first piece's batch, from the same loader)")
    if yours["bound"] != expected["bound"]:
        raise CheckFailed(bound_prop, f"{where}: yours {yours['bound']!r}, expected {expected['bound']!r}",
                          "the bound is whichever of loader, host and devices needs the most time per step")


def _speed_hint(prop: str) -> str:
    return {
        "one device: batch / (compute + device-0 work)":
            "with one device DataParallel is a pass-through: compute(B) + device0_ms per step, nothing else",
        "splits the batch like DataParallel":
            "pieces of ceil(B / n) samples, the last smaller; the slowest device has the first piece, and "
            "only the pieces that exist get a replica",
        "pays the serial stages once per step":
            "replicate + reduce once when two or more devices are used; scatter + gather for the "
            "B - first_piece samples that leave device 0",
        "the host works for every replica":
            "host time per step = host_ms_per_replica x the number of replicas; the step takes the "
            "longest of devices, host and loader",
        "the loader caps the throughput":
            "the loader needs batch / loader_samples_per_s seconds per batch, whatever the devices do",
    }.get(prop, "the step takes max(device time, host time, loader time); samples/s = batch / that")


@exercise("6.1", "A scaling estimator: samples/s and efficiency of DataParallel on N devices", points=2)
def check_scaling_estimator(estimate_dp):
    expect_callable(estimate_dp, "a function estimate_dp(costs, n_devices, batch_size, loader_samples_per_s)")
    rng, seed = fresh_rng()
    trip = _course_tripwire(scaling.predict_dp, scaling._device_ms)
    inf = math.inf

    def case(costs, n, batch, loader, props):
        _compare_estimate(estimate_dp, costs, n, batch, loader, trip, props)

    # one device, unlimited loader, no host cost: compute + device 0's work
    c = _costs(rng, host_ms_per_replica=0.0)
    for batch in (int(rng.integers(1, 300)), int(rng.integers(300, 2000))):
        case(c, 1, batch, inf, ("one device: batch / (compute + device-0 work)", "efficiency of one device is 1",
                                "names what bounds the run"))
    # the serial stages (even splits): expensive links, cheap compute, no host cost
    c = _costs(rng, host_ms_per_replica=0.0, compute_per_sample_ms=0.001, scatter_ms_per_sample=0.05,
               replicate_ms=float(rng.uniform(5, 10)), reduce_ms=float(rng.uniform(5, 10)))
    for n in (2, int(rng.integers(3, 9))):
        case(c, n, n * int(rng.integers(20, 200)), inf,
             ("pays the serial stages once per step", "efficiency compares with one device alone",
              "names what bounds the run"))
    # a host-bound run (even split): Python work per replica beats the devices
    c = _costs(rng, host_ms_per_replica=float(rng.uniform(20, 40)))
    n = int(rng.integers(2, 9))
    case(c, n, n * int(rng.integers(4, 30)), inf,
         ("the host works for every replica", "efficiency compares with one device alone", "names what bounds the run"))
    # uneven splits, and fewer pieces than devices, bound by the devices and by the host
    n = int(rng.integers(4, 9))
    for host in (0.0, float(rng.uniform(20, 40))):
        c = _costs(rng, host_ms_per_replica=host)
        for batch in (n * int(rng.integers(5, 40)) + int(rng.integers(1, n)), n + 1, n - 1, n - 2):
            case(c, n, batch, inf, ("splits the batch like DataParallel", "efficiency compares with one device alone",
                                    "names what bounds the run"))
    # a loader-bound run: N devices fed by a loader that one device already saturates
    c = _costs(rng, host_ms_per_replica=0.0)
    n, batch = int(rng.integers(2, 9)), int(rng.integers(64, 1024))
    alone = scaling.predict_dp(c, 1, scaling.dp_chunk_sizes(batch, n)[0]).samples_per_s
    together = scaling.predict_dp(c, n, batch).samples_per_s
    case(c, n, batch, float(min(alone, together) * rng.uniform(0.3, 0.9)),
         ("the loader caps the throughput", "efficiency compares with one device alone, same loader",
          "names what bounds the run"))
    # fresh mixtures of everything
    for _ in range(40):
        c = _costs(rng)
        n = int(rng.integers(1, 17))
        batch = int(rng.integers(1, 4096))
        loader = inf if rng.random() < 0.3 else float(rng.uniform(500, 200_000))
        case(c, n, batch, loader, ("matches the model on fresh costs", "efficiency compares with one device alone",
                                   "names what bounds the run"))
    return f"all properties hold on 55 configurations (seed {seed})."


# -- 6.2 scatter and gather exactly as DataParallel does -----------------------------------------------

class _ChunkLeaf:
    """What `torch._C._scatter` does to one tensor (torch/csrc/cuda/comm.cpp, `scatter`):
    `tensor.chunk(len(devices), dim)`, then each piece `.to()` its GPU, which does not copy the
    piece already on its device. Here every device is the input's own device."""

    @staticmethod
    def apply(target_gpus, chunk_sizes, dim, tensor):
        return tensor.chunk(len(target_gpus), dim)


class _CatLeaf:
    """What `Gather.apply` does to the outputs' tensors (torch/nn/parallel/_functions.py and
    torch/csrc/cuda/comm.cpp, `gather`): 0-dim tensors gathered on dim 0 become 1-element
    vectors, then all are concatenated along `dim` on the target device."""

    @staticmethod
    def apply(target_device, dim, *tensors):
        if all(t.dim() == 0 for t in tensors) and dim == 0:
            tensors = [t.view(1) for t in tensors]
        return torch.cat([t.to(tensors[0].device) for t in tensors], dim)


@contextlib.contextmanager
def _torch_recursion_here():
    from torch.nn.parallel import scatter_gather
    saved = scatter_gather.Scatter, scatter_gather.Gather
    scatter_gather.Scatter, scatter_gather.Gather = _ChunkLeaf, _CatLeaf
    try:
        yield scatter_gather
    finally:
        scatter_gather.Scatter, scatter_gather.Gather = saved


def reference_scatter(inputs, n_devices: int, dim: int = 0):
    """torch's own `torch.nn.parallel.scatter(inputs, n devices, dim)`, every piece left on the
    input's device (only the two leaf operations are replaced; the recursion is torch's)."""
    with _torch_recursion_here() as sg:
        return sg.scatter(inputs, list(range(n_devices)), dim)


def reference_gather(outputs, dim: int = 0):
    """torch's own `torch.nn.parallel.gather(outputs, device, dim)`, on the outputs' device."""
    import warnings
    with _torch_recursion_here() as sg, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sg.gather(outputs, "cpu", dim)


_Batch = collections.namedtuple("Batch", ["images", "labels"])


def _torch_parallel_tripwire() -> _Tripwire:
    return _Tripwire(codes=[reference_scatter.__code__, reference_gather.__code__, _ChunkLeaf.apply.__code__,
                            _CatLeaf.apply.__code__],
                     files=("torch/nn/parallel/scatter_gather.py", "torch/nn/parallel/_functions.py",
                            "torch/nn/parallel/comm.py", "torch/cuda/comm.py", "torch/nn/parallel/data_parallel.py"),
                     c_names=("_scatter", "_scatter_out", "_gather", "_gather_out"))


_NO_TORCH_PARALLEL = (
    "uses tensor operations, not torch.nn.parallel",
    "DataParallel's own scatter and gather copy every piece to a different GPU, so they need as many "
    "GPUs as pieces (on a CPU, or with fewer GPUs, they raise), and the exercise is to see what they do",
    "split with torch.chunk, join with torch.cat, and recurse into tuples, lists and dicts")


def _kind(obj) -> str:
    if isinstance(obj, torch.Tensor):
        return f"a tensor of shape {tuple(obj.shape)}"
    return f"a {type(obj).__name__}"


def _same(yours, expected, where: str, *, top: bool = False, count_prop: str = "splits like DataParallel",
          depth: int = 0, joining: bool = False) -> None:
    """Compare a scatter/gather result with the reference, failing on the property that differs."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(yours, torch.Tensor):
            raise CheckFailed("keeps the structure", f"{where}: yours is {_kind(yours)}, expected {_kind(expected)}")
        if yours.shape != expected.shape:
            if joining:
                prop, hint = "joins like DataParallel", ("gather concatenates the outputs along dim, in order (0-dim "
                                                         "outputs on dim 0 become 1-element vectors first)")
            elif depth:
                prop, hint = "splits every tensor in the structure", ("recurse: a tensor inside a tuple, list or "
                                                                     "dict, at any depth, is split like a bare one")
            else:
                prop, hint = "splits like DataParallel", "DataParallel uses tensor.chunk(n, dim): pieces of ceil(size / n), the last one smaller"
            raise CheckFailed(prop, f"{where}: yours has shape {tuple(yours.shape)}, expected {tuple(expected.shape)}",
                              hint)
        if yours.device != expected.device:
            if joining:
                raise CheckFailed("gathers onto the first output's device",
                                  f"{where}: yours is on {yours.device}, expected {expected.device}, the first "
                                  "output's device",
                                  "DataParallel gathers onto device 0, where the model's only lasting copy lives and "
                                  "the loss is computed: move every output to outputs[0]'s device (not the CPU, not "
                                  "the last output's device) before concatenating")
            raise CheckFailed("keeps pieces on the input's device", f"{where}: yours is on {yours.device}, expected "
                              f"{expected.device}", "split with torch.chunk: its pieces stay where the input is")
        if yours.dtype != expected.dtype or not trusted.torch_equal(yours.detach(), expected.detach()):
            raise CheckFailed("keeps the samples in order", f"{where}: the values differ from DataParallel's")
        return
    if top:
        if not isinstance(yours, (list, tuple)):
            raise CheckFailed("returns a list of pieces", f"{where}: yours returned {_kind(yours)}, "
                              "expected a list with one entry per device that gets work")
        if len(yours) != len(expected):
            raise CheckFailed(count_prop,
                              f"{where}: yours gave {len(yours)} pieces, DataParallel gives {len(expected)}",
                              "tensor.chunk(n) makes fewer than n pieces when ceil(size / n) x (n - 1) >= size; "
                              "a device with no piece gets no replica and no entry; when the elements of a tuple "
                              "split into different numbers of pieces, the shortest wins, as zip() does")
        for i, (a, b) in enumerate(zip(yours, expected)):
            _same(a, b, f"{where}, piece {i}")
        return
    if isinstance(expected, (tuple, list, dict)) and type(yours) is not type(expected):
        raise CheckFailed("keeps the structure", f"{where}: yours is {_kind(yours)}, expected a "
                          f"{type(expected).__name__}",
                          "a tuple gives tuples, a list lists, a dict dicts with the same keys, a namedtuple "
                          "the same namedtuple")
    if isinstance(expected, dict):
        if list(yours.keys()) != list(expected.keys()):
            raise CheckFailed("keeps the structure", f"{where}: keys {list(yours)} instead of {list(expected)}")
        for key in expected:
            _same(yours[key], expected[key], f"{where}[{key!r}]", depth=depth + 1, joining=joining)
        return
    if isinstance(expected, (tuple, list)):
        if len(yours) != len(expected):
            raise CheckFailed("keeps the structure", f"{where}: {len(yours)} elements instead of {len(expected)}")
        for i, (a, b) in enumerate(zip(yours, expected)):
            _same(a, b, f"{where}[{i}]", depth=depth + 1, joining=joining)
        return
    if yours is not expected:
        raise CheckFailed("shares non-tensors by reference",
                          f"{where}: yours is {yours!r:.40} ({type(yours).__name__}), expected the very object "
                          f"that was passed in ({expected!r:.40})",
                          "anything that is not a tensor, tuple, list or dict goes to every device as it is "
                          "(the same object, not a copy)")


def _raised(prop: str, where: str, exc: Exception) -> CheckFailed:
    from ._core import _learner_line
    return CheckFailed(prop, f"{where}: yours raised {type(exc).__name__}: {exc}{_learner_line(exc)}")


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _scatter_cases(rng):
    """(description, inputs, n, dim) for fresh inputs."""
    cases = []
    # single tensors: even, uneven, fewer pieces than devices, one sample
    for _ in range(6):
        n = int(rng.integers(2, 9))
        b = int(rng.integers(1, 4 * n + 3))
        cases.append((f"a tensor of {b} samples on {n} devices", torch.randn(b, 3, 2), n, 0))
    cases.append(("a tensor of 5 samples on 4 devices", torch.randn(5, 2), 4, 0))
    cases.append(("a tensor of 1 sample on 3 devices", torch.randn(1, 4), 3, 0))
    n = int(rng.integers(2, 6))
    cases.append((f"a tensor split along dim=1 on {n} devices", torch.randn(3, int(rng.integers(n, 4 * n)), 2), n, 1))
    cases.append((f"a tensor split along dim=-1 on {n} devices", torch.randn(2, 3, int(rng.integers(n, 3 * n))), n, -1))
    # structures
    n = int(rng.integers(2, 7))
    b = int(rng.integers(n, 5 * n))
    x, y = torch.randn(b, 3, 4, 4), torch.randint(0, 10, (b,))
    cases += [
        (f"a tuple (images, labels) of {b} samples on {n} devices", (x, y), n, 0),
        (f"a list [images, labels] of {b} samples on {n} devices", [x, y], n, 0),
        (f"a dict of {b} samples on {n} devices", {"labels": y, "images": x}, n, 0),
        (f"an OrderedDict of {b} samples on {n} devices", collections.OrderedDict([("mask", x[:, 0]), ("images", x),
                                                                                  ("labels", y)]), n, 0),
        (f"a namedtuple Batch(images, labels) on {n} devices", _Batch(x, y), n, 0),
        (f"a nested (images, {{'mask': ..., 'extra': [labels]}}) on {n} devices", (x, {"mask": x[:, 0], "extra": [y]}), n, 0),
        (f"a tuple mixing a tensor with a number, a string, None, a set and an options object on {n} devices",
         (x, 3, "crop", None, {"flip"}, types.SimpleNamespace(scale=2.0)), n, 0),
    ]
    short = int(rng.integers(1, n))
    cases.append((f"a tuple of a {b}-sample and a {short}-sample tensor on {n} devices",
                  (torch.randn(b, 2), torch.randn(short, 2)), n, 0))
    cases.append(("a number on 3 devices", 0.5, 3, 0))
    cases.append(("an empty tuple on 2 devices", (), 2, 0))
    return cases


def _gather_cases(rng):
    cases = []
    n = int(rng.integers(2, 7))
    sizes = [int(v) for v in rng.integers(1, 6, size=n)]
    cases.append((f"{n} outputs of {sizes} samples", [torch.randn(s, 10) for s in sizes], 0))
    cases.append((f"{n} outputs joined along dim=1", [torch.randn(2, s) for s in sizes], 1))
    cases.append((f"{n} outputs joined along dim=-1", [torch.randn(2, 3, s) for s in sizes], -1))
    cases.append((f"{n} scalar losses (0-dim tensors)", [torch.randn(()) for _ in sizes], 0))
    cases.append((f"{n} outputs (logits, features) tuples", [(torch.randn(s, 10), torch.randn(s, 4)) for s in sizes], 0))
    cases.append((f"{n} outputs [logits, features] lists", [[torch.randn(s, 10), torch.randn(s, 4)] for s in sizes], 0))
    cases.append((f"{n} outputs dicts {{'loss', 'logits'}}",
                  [{"loss": torch.randn(()), "logits": torch.randn(s, 10)} for s in sizes], 0))
    cases.append((f"{n} outputs OrderedDicts {{'logits', 'features', 'aux'}}",
                  [collections.OrderedDict([("logits", torch.randn(s, 10)), ("features", torch.randn(s, 4)),
                                            ("aux", torch.randn(s, 2))]) for s in sizes], 0))
    cases.append((f"{n} outputs namedtuples Batch(images, labels)",
                  [_Batch(torch.randn(s, 3), torch.randint(0, 9, (s,))) for s in sizes], 0))
    cases.append((f"{n} outputs (logits, None)", [(torch.randn(s, 10), None) for s in sizes], 0))
    if torch.cuda.is_available():     # outputs on two devices: gathered on the first one's
        cases.append((f"{n} outputs, the first on the GPU, the others on the CPU",
                      [torch.randn(s, 10, device="cuda" if i == 0 else "cpu") for i, s in enumerate(sizes)], 0))
    return cases


def _device_gather_cases(rng):
    """Outputs on two devices (made inside a `VirtualCuda` block: a GPU's device placement on the
    CPU): DataParallel gathers onto the first output's device, whichever that is."""
    n = int(rng.integers(3, 7))
    sizes = [int(v) for v in rng.integers(1, 6, size=n)]
    first_on_gpu = [torch.randn(s, 10, device="cuda" if i == 0 else "cpu") for i, s in enumerate(sizes)]
    first_on_cpu = [torch.randn(s, 10, device="cpu" if i == 0 else "cuda") for i, s in enumerate(sizes)]
    return [(f"{n} outputs, the first on the GPU (cuda), the others on the CPU", first_on_gpu, 0),
            (f"{n} outputs, the first on the CPU, the others on the GPU (cuda)", first_on_cpu, 0),
            (f"{n} (logits, features) tuples, the first on the GPU (cuda)",
             [(t, t[:, :3] * 2) for t in first_on_gpu], 0)]


def _two_functions(obj):
    if (not isinstance(obj, (tuple, list)) or len(obj) != 2 or not all(callable(f) for f in obj)):
        if callable(obj):
            raise WrongType("type", "expected the pair (dp_scatter, dp_gather), but got one function. "
                            'Call check("6.2", (dp_scatter, dp_gather)).')
        raise WrongType("type", f"expected the pair (dp_scatter, dp_gather), but got {_kind(obj)}. "
                        'Call check("6.2", (dp_scatter, dp_gather)).')
    return obj


@exercise("6.2", "Scatter and gather exactly as DataParallel does", points=2)
def check_scatter_gather(functions):
    dp_scatter, dp_gather = _two_functions(functions)
    rng, seed = fresh_rng()
    trip = _torch_parallel_tripwire()

    def scatter(inputs, n, dim):
        return _call(dp_scatter, trip, *_NO_TORCH_PARALLEL, inputs, n, dim=dim)

    def gather(outputs, dim):
        return _call(dp_gather, trip, *_NO_TORCH_PARALLEL, outputs, dim=dim)

    scatter_cases, gather_cases = _scatter_cases(rng), _gather_cases(rng)
    for where, inputs, n, dim in scatter_cases:
        try:
            yours = scatter(inputs, n, dim)
        except (CheckFailed, NotImplementedError):
            raise
        except Exception as exc:
            blame = "splits like DataParallel" if isinstance(inputs, torch.Tensor) else "keeps the structure"
            raise _raised(blame, f"dp_scatter of {where}", exc) from None
        expected = reference_scatter(inputs, n, dim)
        if isinstance(inputs, torch.Tensor):
            count_prop = "splits like DataParallel"
        elif isinstance(inputs, (tuple, list, dict)) and len(inputs):
            count_prop = "stops at the shortest element, as zip does"
        else:
            count_prop = "shares non-tensors by reference"
        _same(yours, expected, f"dp_scatter of {where}", top=True, count_prop=count_prop)
        if isinstance(inputs, torch.Tensor):
            for i, piece in enumerate(yours):
                if _storage(piece) != _storage(inputs):
                    raise CheckFailed("makes no copies", f"dp_scatter of {where}: piece {i} is a copy, not a view "
                                      "of the input", "torch.chunk returns views; DataParallel copies a piece only "
                                      "to move it to another device, and here every device is the input's")

    for where, outputs, dim in gather_cases:
        try:
            yours = gather(outputs, dim)
        except (CheckFailed, NotImplementedError):
            raise
        except Exception as exc:
            if "scalar" in where:
                raise CheckFailed("turns 0-dim outputs into a vector", f"dp_gather of {where} raised "
                                  f"{type(exc).__name__}: {exc}",
                                  "a replica that returns its loss returns a 0-dim tensor; DataParallel views each "
                                  "as a 1-element vector and returns one value per device") from None
            blame = "joins like DataParallel" if isinstance(outputs[0], torch.Tensor) else "keeps the structure"
            raise _raised(blame, f"dp_gather of {where}", exc) from None
        expected = reference_gather(outputs, dim)
        _same(yours, expected, f"dp_gather of {where}", joining=True)

    with VirtualCuda():
        for where, outputs, dim in _device_gather_cases(rng):
            try:
                yours = gather(outputs, dim)
            except (CheckFailed, NotImplementedError):
                raise
            except Exception as exc:
                raise _raised("gathers onto the first output's device", f"dp_gather of {where}", exc) from None
            _same(yours, reference_gather(outputs, dim), f"dp_gather of {where}", joining=True)

    # gradients flow back through the split and the join
    n = int(rng.integers(2, 6))
    x = torch.randn(int(rng.integers(n + 1, 5 * n)), 3, requires_grad=True)
    weights = torch.randn(x.shape[0], 3)
    pieces = scatter(x, n, 0)
    if not isinstance(pieces, (list, tuple)) or not all(isinstance(p, torch.Tensor) and p.requires_grad for p in pieces):
        raise CheckFailed("lets gradients flow", "dp_scatter of a tensor that requires grad gave pieces that do "
                          "not (a .detach(), a numpy round trip or a new tensor cuts the graph)",
                          "DataParallel's scatter and gather are part of the autograd graph: the backward "
                          "pass runs through them")
    joined = gather([p * 1.0 for p in pieces], 0)
    if not isinstance(joined, torch.Tensor) or not joined.requires_grad:
        raise CheckFailed("lets gradients flow", "dp_gather of outputs that require grad gave a result that does not")
    (joined * weights).sum().backward()
    if x.grad is None or not trusted.torch_allclose(x.grad, weights):
        raise CheckFailed("lets gradients flow", "the gradient through dp_gather(dp_scatter(x)) is not the "
                          "gradient through x itself")

    # round trip: gather(scatter(batch)) is the batch again
    n = int(rng.integers(2, 7))
    b = int(rng.integers(n, 6 * n))
    batch = {"images": torch.randn(b, 3, 2, 2), "labels": torch.randint(0, 10, (b,))}
    back = gather(scatter(batch, n, 0), 0)
    _same(back, batch, "dp_gather(dp_scatter(a dict batch))")
    return (f"all properties hold on {len(scatter_cases) + len(gather_cases) + 5} inputs, outputs on two devices "
            f"included (seed {seed}).")


# -- 6.3 the memory of each device ----------------------------------------------------------------------

def _read_memory(value, n, where):
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise CheckFailed("returns one number per device", f"{where}: yours returned {type(value).__name__}, "
                          f"expected a list of {n} numbers")
    if len(value) != n:
        raise CheckFailed("returns one number per device", f"{where}: yours returned {len(value)} numbers, "
                          f"expected {n} (a device that gets no piece holds 0 bytes, but it has an entry)")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
            raise CheckFailed("returns one number per device", f"{where}: {v!r} is not a finite number of bytes")
        out.append(float(v))
    return out


def _memory_case(dp_memory, trip, n, batch, sizes, props, on_device0=True):
    where = (f"{n} device(s), batch {batch} {'on device 0' if on_device0 else 'left on the host'}, parameters "
             f"{sizes['param_bytes']:,} B, optimizer state {sizes['optimizer_bytes']:,} B, per sample: input "
             f"{sizes['input_bytes']:,} B, activations {sizes['activation_bytes']:,} B, output "
             f"{sizes['output_bytes']:,} B")
    kwargs = dict(sizes) if on_device0 else dict(sizes, batch_on_device0=False)
    value = _call(dp_memory, trip, "computes the memory itself",
                  "that is the course's own model, which the lesson uses for its plots",
                  "add up what each device holds, from the list in the exercise", n, batch, **kwargs)
    yours = _read_memory(value, n, where)
    expected = scaling.dp_memory(n, batch, **sizes, batch_on_device0=on_device0)
    first, others, empty = props
    if not trusted.isclose(yours[0], expected[0], rel_tol=1e-9, abs_tol=0.5):
        raise CheckFailed(first, f"{where}: device 0: yours {yours[0]:,.0f} B, expected {expected[0]:,.0f} B",
                          _device0_hint(yours[0], n, batch, sizes, on_device0))
    for k in range(1, n):
        if expected[k] == 0 and yours[k] != 0:
            raise CheckFailed(empty, f"{where}: device {k} gets no piece but yours gives it {yours[k]:,.0f} B",
                              "tensor.chunk(n) can make fewer than n pieces; DataParallel replicates only onto "
                              "devices that get one")
        if not trusted.isclose(yours[k], expected[k], rel_tol=1e-9, abs_tol=0.5):
            c = scaling.dp_chunk_sizes(batch, n)[k]
            p, act = sizes["param_bytes"], c * sizes["activation_bytes"]
            hint = ("a device with a piece of c samples: the replica's parameters + c samples of input + the "
                    "larger of (c samples of activations) and (the replica's gradients): backward frees the "
                    "activations as it makes the gradients, which live until the reduce")
            if trusted.isclose(yours[k], expected[k] + min(act, p), rel_tol=1e-9, abs_tol=0.5):
                hint = ("yours adds the activations and the gradients: they do not peak together (backward frees "
                        "the activations as it makes the gradients): the peak holds the larger of the two")
            raise CheckFailed(others, f"{where}: device {k}: yours {yours[k]:,.0f} B, expected {expected[k]:,.0f} B",
                              hint)


def _device0_hint(yours, n, batch, sizes, on_device0):
    c0 = scaling.dp_chunk_sizes(batch, n)[0]
    expected = scaling.dp_memory(n, batch, **sizes, batch_on_device0=on_device0)[0]
    working = c0 * sizes["activation_bytes"] + 2 * batch * sizes["output_bytes"]
    if trusted.isclose(yours, expected + min(working, sizes["param_bytes"]), rel_tol=1e-9, abs_tol=0.5):
        return ("yours adds the activations (with the gathered outputs) and the gradients: they do not peak "
                "together (backward frees the activations as it makes the gradients): the peak holds the larger")
    other_way = scaling.dp_memory(n, batch, **sizes, batch_on_device0=not on_device0)[0]
    if trusted.isclose(yours, other_way, rel_tol=1e-9, abs_tol=0.5):
        return ("with the batch on device 0 (the loader put it there) device 0 holds all of its input; left on the "
                "host, only its own piece" if on_device0 else
                "the batch stayed on the host: scatter copies each piece from there, so device 0 holds only its "
                f"own piece ({c0} samples) of the input")
    return ("device 0: the parameters + the optimizer state + its input (the whole batch when the loader put it "
            "there, else its piece) + the larger of (its piece's activations + the gathered outputs and their "
            "gradient) and (the parameters' gradients)")


def _sizes(rng, regime=None, **fixed):
    """Random sizes; `regime` "activations" or "gradients" says which of the two dominates a
    device's peak (both regimes are tested on every run)."""
    sizes = dict(param_bytes=int(rng.integers(10**5, 10**9)), optimizer_bytes=int(rng.integers(0, 2 * 10**9)),
                 input_bytes=int(rng.integers(10, 10**6)), activation_bytes=int(rng.integers(10**3, 10**7)),
                 output_bytes=int(rng.integers(4, 10**5)))
    if regime == "activations":       # a large batch of large activations, a small model
        sizes.update(param_bytes=int(rng.integers(10**5, 10**6)), activation_bytes=int(rng.integers(10**6, 10**7)))
    elif regime == "gradients":       # a big model, small activations
        sizes.update(param_bytes=int(rng.integers(10**8, 10**9)), activation_bytes=int(rng.integers(10**3, 10**4)))
    sizes.update(fixed)
    return sizes


@exercise("6.3", "The memory each device holds in a DataParallel step", points=1)
def check_dp_memory(dp_memory):
    expect_callable(dp_memory, "a function dp_memory(n_devices, batch_size, *, param_bytes, optimizer_bytes, "
                    "input_bytes, activation_bytes, output_bytes, batch_on_device0=True)")
    rng, seed = fresh_rng()
    trip = _course_tripwire(scaling.dp_memory)
    one = ("one device holds the whole step", "one device holds the whole step", "one device holds the whole step")
    for regime in ("activations", "gradients"):
        _memory_case(dp_memory, trip, 1, int(rng.integers(1, 512)), _sizes(rng, regime), one)
    props = ("device 0 holds the state, its input and its peak", "the others hold a replica, their piece and their peak",
             "devices without a piece hold nothing")
    n = int(rng.integers(2, 9))
    for regime in ("activations", "gradients"):
        _memory_case(dp_memory, trip, n, n * int(rng.integers(20, 100)), _sizes(rng, regime), props)
    # big optimizer state or big outputs: only device 0 carries them
    _memory_case(dp_memory, trip, n, n * int(rng.integers(2, 100)), _sizes(rng, "activations", optimizer_bytes=3 * 10**9),
                 props)
    _memory_case(dp_memory, trip, n, n * int(rng.integers(2, 100)), _sizes(rng, "activations", output_bytes=10**6),
                 props)
    host = ("a batch left on the host puts only its piece on device 0", "the others hold a replica, their piece and "
            "their peak", "devices without a piece hold nothing")
    for regime in ("activations", "gradients"):
        _memory_case(dp_memory, trip, n, n * int(rng.integers(20, 100)), _sizes(rng, regime), host, on_device0=False)
    split = ("splits the batch like DataParallel",) * 3
    for batch in (n * int(rng.integers(3, 50)) + int(rng.integers(1, n)), n + 1, max(n - 1, 1)):
        _memory_case(dp_memory, trip, n, batch, _sizes(rng), split)
    fresh = ("matches the model on fresh sizes",) * 2 + ("devices without a piece hold nothing",)
    for k in range(24):
        n = int(rng.integers(1, 17))
        _memory_case(dp_memory, trip, n, int(rng.integers(1, 3000)), _sizes(rng), fresh, on_device0=bool(k % 2))
    return f"all properties hold on 35 configurations, the batch on device 0 or on the host (seed {seed})."
