"""Lesson 06 checks: the right answers pass, plausible wrong ones fail on the right property on
every seed tried, stubs report not_implemented."""
import copy
import itertools
import math
import pytest
import torch

from course_utils import scaling
from course_utils.checks import run_check
from course_utils.checks.lesson06 import reference_gather, reference_scatter

SEEDS = ["1", "2", "3", "20240", "777"]


@pytest.fixture(params=SEEDS)
def seed(request, monkeypatch):
    monkeypatch.setenv("COURSE_CHECK_SEED", request.param)
    return request.param


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 6.x")


def fails_on(exercise, obj, prop):
    result = run_check(exercise, obj)
    assert result.status == "fail", f"{exercise} should fail on '{prop}': {result.status}: {result.message}"
    assert f"'{prop}'" in result.message, result.message
    return result


# -- 6.1 ------------------------------------------------------------------------------------------

def _chunks(batch, n):
    size = math.ceil(batch / n)
    return [min(size, batch - start) for start in range(0, batch, size)]


def _estimate(costs, n_devices, batch_size, loader_samples_per_s, *, chunks_fn=_chunks, device_fn=None,
              host_fn=None, loader_fn=None, alone_fn=None, bound_fn=None):
    def device_ms(chunks, batch):
        if device_fn is not None:
            return device_fn(costs, chunks, batch)
        ms = costs.compute_fixed_ms + costs.compute_per_sample_ms * chunks[0] + costs.device0_ms
        if len(chunks) > 1:
            ms += costs.replicate_ms + costs.reduce_ms
            ms += (batch - chunks[0]) * (costs.scatter_ms_per_sample + costs.gather_ms_per_sample)
        return ms

    def throughput(chunks, batch):
        times = {"devices": device_ms(chunks, batch),
                 "host": host_fn(costs, chunks) if host_fn else costs.host_ms_per_replica * len(chunks),
                 "loader": loader_fn(batch, loader_samples_per_s, len(chunks)) if loader_fn
                 else 1000 * batch / loader_samples_per_s}
        bound = max(times, key=times.get)
        return 1000 * batch / times[bound], (bound_fn(times) if bound_fn else bound)

    chunks = chunks_fn(batch_size, n_devices)
    samples_per_s, bound = throughput(chunks, batch_size)
    alone = alone_fn(throughput, chunks, batch_size, n_devices) if alone_fn else throughput([chunks[0]], chunks[0])[0]
    return {"samples_per_s": samples_per_s, "efficiency": samples_per_s / (n_devices * alone), "bound": bound}


def estimate_dp(costs, n_devices, batch_size, loader_samples_per_s):
    return _estimate(costs, n_devices, batch_size, loader_samples_per_s)


def linear_scaling(costs, n, b, loader):
    """No serial stages: N devices are N times one."""
    out = _estimate(costs, 1, math.ceil(b / n), loader)
    return {"samples_per_s": min(out["samples_per_s"] * n, loader), "efficiency": 1.0, "bound": "devices"}


def forgets_device0(costs, n, b, loader):
    return _estimate(costs, n, b, loader, device_fn=lambda c, ch, batch: (
        c.compute_fixed_ms + c.compute_per_sample_ms * ch[0]
        + ((c.replicate_ms + c.reduce_ms + (batch - ch[0]) * (c.scatter_ms_per_sample + c.gather_ms_per_sample))
           if len(ch) > 1 else 0)))


def float_split(costs, n, b, loader):
    return _estimate(costs, n, b, loader, chunks_fn=lambda batch, m: [batch / m] * m)


def tensor_split_sizes(costs, n, b, loader):
    return _estimate(costs, n, b, loader, chunks_fn=lambda batch, m: [len(t) for t in torch.arange(batch).tensor_split(m)])


def replicate_per_device(costs, n, b, loader):
    """Pays the broadcast and the reduction once per extra device."""
    return _estimate(costs, n, b, loader, device_fn=lambda c, ch, batch: (
        c.compute_ms(ch[0]) + c.device0_ms + (len(ch) - 1) * (c.replicate_ms + c.reduce_ms)
        + (batch - ch[0]) * (c.scatter_ms_per_sample + c.gather_ms_per_sample)))


def scatters_whole_batch(costs, n, b, loader):
    """Sends device 0's own piece too."""
    return _estimate(costs, n, b, loader, device_fn=lambda c, ch, batch: (
        c.compute_ms(ch[0]) + c.device0_ms
        + ((c.replicate_ms + c.reduce_ms + batch * (c.scatter_ms_per_sample + c.gather_ms_per_sample))
           if len(ch) > 1 else 0)))


def mean_piece(costs, n, b, loader):
    """The average piece, not the slowest one."""
    return _estimate(costs, n, b, loader, device_fn=lambda c, ch, batch: (
        c.compute_fixed_ms + c.compute_per_sample_ms * batch / len(ch) + c.device0_ms
        + ((c.replicate_ms + c.reduce_ms + (batch - ch[0]) * (c.scatter_ms_per_sample + c.gather_ms_per_sample))
           if len(ch) > 1 else 0)))


def host_once(costs, n, b, loader):
    """The host's work paid once per step, not per replica."""
    return _estimate(costs, n, b, loader, host_fn=lambda c, ch: c.host_ms_per_replica)


def host_and_devices_add_up(costs, n, b, loader):
    """Host and devices take turns instead of overlapping."""
    return _estimate(costs, n, b, loader, host_fn=lambda c, ch: 0.0, device_fn=lambda c, ch, batch: (
        c.compute_ms(ch[0]) + c.device0_ms + c.host_ms_per_replica * len(ch)
        + ((c.replicate_ms + c.reduce_ms + (batch - ch[0]) * (c.scatter_ms_per_sample + c.gather_ms_per_sample))
           if len(ch) > 1 else 0)))


def no_loader(costs, n, b, loader):
    return _estimate(costs, n, b, math.inf)


def loader_per_device(costs, n, b, loader):
    """As if every device had a loader of its own."""
    return _estimate(costs, n, b, loader, loader_fn=lambda batch, rate, m: 1000 * batch / (rate * m))


def efficiency_full_batch(costs, n, b, loader):
    """Compares with one device on the whole global batch (strong scaling)."""
    return _estimate(costs, n, b, loader, alone_fn=lambda tp, ch, batch, m: tp([batch], batch)[0])


def efficiency_ignores_loader(costs, n, b, loader):
    out = _estimate(costs, n, b, loader)
    alone = _estimate(costs, 1, _chunks(b, n)[0], math.inf)["samples_per_s"]
    return {**out, "efficiency": out["samples_per_s"] / (n * alone)}


def bound_always_devices(costs, n, b, loader):
    return {**_estimate(costs, n, b, loader), "bound": "devices"}


def speedup_not_efficiency(costs, n, b, loader):
    out = _estimate(costs, n, b, loader)
    return {**out, "efficiency": out["efficiency"] * n}


def calls_the_course(costs, n, b, loader):
    p = scaling.predict_dp(costs, n, b, loader)
    return {"samples_per_s": p.samples_per_s, "efficiency": p.efficiency, "bound": p.bound}


def returns_a_tuple(costs, n, b, loader):
    out = _estimate(costs, n, b, loader)
    return out["samples_per_s"], out["efficiency"], out["bound"]


def test_6_1_passes(seed):
    result = run_check("6.1", estimate_dp)
    assert result.status == "pass", result.message


@pytest.mark.parametrize("fn, prop", [
    (linear_scaling, "pays the serial stages once per step"),
    (forgets_device0, "one device: batch / (compute + device-0 work)"),
    (float_split, "splits the batch like DataParallel"),
    (tensor_split_sizes, "splits the batch like DataParallel"),
    (replicate_per_device, "pays the serial stages once per step"),
    (scatters_whole_batch, "pays the serial stages once per step"),
    (mean_piece, "splits the batch like DataParallel"),
    (host_once, "the host works for every replica"),
    (host_and_devices_add_up, "the host works for every replica"),
    (no_loader, "the loader caps the throughput"),
    (loader_per_device, "the loader caps the throughput"),
    (efficiency_full_batch, "efficiency compares with one device alone"),
    (efficiency_ignores_loader, "efficiency compares with one device alone, same loader"),
    (speedup_not_efficiency, "efficiency compares with one device alone"),
    (bound_always_devices, "names what bounds the run"),
    (calls_the_course, "computes the estimate itself"),
    (returns_a_tuple, "returns samples_per_s, efficiency and bound"),
])
def test_6_1_wrong(fn, prop, seed):
    fails_on("6.1", fn, prop)


def test_6_1_stub_and_wrong_type():
    assert run_check("6.1", stub).status == "not_implemented"
    result = run_check("6.1", 42)
    assert result.status == "fail" and "expected a function" in result.message


# -- 6.2 ------------------------------------------------------------------------------------------

def _is_namedtuple(obj):
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def make_scatter(*, split=lambda t, n, dim: list(t.chunk(n, dim)), leaf=lambda obj, n: [obj] * n,
                 tuple_type=None, zip_fn=zip, recurse=True, keep_namedtuple=True, dict_pieces=None):
    def dp_scatter(inputs, n_devices, dim=0):
        def go(obj):
            if isinstance(obj, torch.Tensor):
                return split(obj, n_devices, dim)
            sub = go if recurse else (lambda o: split(o, n_devices, dim) if isinstance(o, torch.Tensor) else leaf(o, n_devices))
            if _is_namedtuple(obj) and obj:
                if keep_namedtuple:
                    return [type(obj)(*p) for p in zip_fn(*map(sub, obj))]
                return [tuple(p) for p in zip_fn(*map(sub, obj))]
            if isinstance(obj, tuple) and obj:
                return [(tuple_type or tuple)(p) for p in zip_fn(*map(sub, obj))]
            if isinstance(obj, list) and obj:
                return [list(p) for p in zip_fn(*map(sub, obj))]
            if isinstance(obj, dict) and obj:
                if dict_pieces is not None:
                    return dict_pieces(obj, sub)
                return [type(obj)(zip(obj.keys(), p)) for p in zip_fn(*map(sub, obj.values()))]
            return leaf(obj, n_devices)
        return go(inputs)
    return dp_scatter


def make_gather(*, join=None, scalars=True, seq_type=None, to_first=True, dict_type=None, sort_keys=False):
    def dp_gather(outputs, dim=0):
        first = outputs[0]
        if isinstance(first, torch.Tensor):
            ts = list(outputs)
            if scalars and dim == 0 and all(t.dim() == 0 for t in ts):
                ts = [t.view(1) for t in ts]
            if join is not None:
                return join(ts, dim)
            return torch.cat([t.to(first.device) for t in ts] if to_first else ts, dim)
        if first is None:
            return None
        if isinstance(first, dict):
            keys = sorted(first) if sort_keys else first
            return (dict_type or type(first))((k, dp_gather([o[k] for o in outputs], dim)) for k in keys)
        if _is_namedtuple(first):
            return type(first)(*(dp_gather(list(p), dim) for p in zip(*outputs)))
        return (seq_type or type(first))(dp_gather(list(p), dim) for p in zip(*outputs))
    return dp_gather


dp_scatter, dp_gather = make_scatter(), make_gather()


def scatter_with_torch(inputs, n_devices, dim=0):
    return torch.nn.parallel.scatter(inputs, list(range(n_devices)), dim)


def gather_with_torch(outputs, dim=0):
    return torch.nn.parallel.gather(outputs, 0, dim)


def comm_scatter(inputs, n_devices, dim=0):
    from torch.cuda import comm
    if isinstance(inputs, torch.Tensor):
        return list(comm.scatter(inputs, list(range(n_devices)), dim=dim))
    return dp_scatter(inputs, n_devices, dim)


def calls_the_reference(inputs, n_devices, dim=0):
    return reference_scatter(inputs, n_devices, dim)


def test_6_2_passes(seed):
    result = run_check("6.2", (dp_scatter, dp_gather))
    assert result.status == "pass", result.message


def test_reference_is_torchs_recursion_with_chunk_and_cat():
    x = torch.arange(10.0)
    assert [len(p) for p in reference_scatter(x, 4)] == [3, 3, 3, 1]
    assert [len(p) for p in reference_scatter(torch.arange(5.0), 4)] == [2, 2, 1]
    pieces = reference_scatter((x, {"y": x}, 7), 2)
    assert isinstance(pieces, list) and isinstance(pieces[0], tuple) and pieces[1][2] == 7
    assert torch.equal(reference_gather([torch.tensor(1.0), torch.tensor(2.0)]), torch.tensor([1.0, 2.0]))
    # the patch is undone
    from torch.nn.parallel import _functions, scatter_gather
    assert scatter_gather.Scatter is _functions.Scatter and scatter_gather.Gather is _functions.Gather


@pytest.mark.parametrize("pair, prop", [
    ((make_scatter(split=lambda t, n, d: list(t.tensor_split(n, d))), dp_gather), "splits like DataParallel"),
    ((make_scatter(split=lambda t, n, d: list(t.split(max(t.shape[d] // n, 1), d))), dp_gather), "splits like DataParallel"),
    ((make_scatter(split=lambda t, n, d: list(t.chunk(n, d)) + [t.narrow(d, 0, 0)] * (n - len(t.chunk(n, d)))), dp_gather),
     "splits like DataParallel"),
    ((make_scatter(split=lambda t, n, d: list(t.chunk(n, 0))), dp_gather), "splits like DataParallel"),
    ((make_scatter(split=lambda t, n, d: [p.clone() for p in t.chunk(n, d)]), dp_gather), "makes no copies"),
    ((make_scatter(split=lambda t, n, d: [p.detach() for p in t.chunk(n, d)]), dp_gather), "lets gradients flow"),
    ((make_scatter(tuple_type=list), dp_gather), "keeps the structure"),
    ((make_scatter(keep_namedtuple=False), dp_gather), "keeps the structure"),
    ((make_scatter(dict_pieces=lambda obj, sub: [list(p) for p in zip(*map(sub, obj.values()))]), dp_gather),
     "keeps the structure"),
    ((make_scatter(leaf=lambda obj, n: [copy.deepcopy(obj) for _ in range(n)]), dp_gather), "shares non-tensors by reference"),
    ((make_scatter(zip_fn=lambda *its: itertools.zip_longest(*its)), dp_gather), "stops at the shortest element, as zip does"),
    ((make_scatter(recurse=False), dp_gather), "splits every tensor in the structure"),
    ((dp_scatter, make_gather(join=lambda ts, d: torch.stack(ts, d))), "joins like DataParallel"),
    ((dp_scatter, make_gather(scalars=False)), "turns 0-dim outputs into a vector"),
    ((dp_scatter, make_gather(join=lambda ts, d: torch.cat(ts, 0))), "joins like DataParallel"),
    ((dp_scatter, make_gather(seq_type=list)), "keeps the structure"),
    # issue 28 / 21: types the spec states, and where a gather lands (outputs on the course's virtual GPU)
    ((dp_scatter, make_gather(dict_type=dict)), "keeps the structure"),
    ((make_scatter(dict_pieces=lambda obj, sub: [dict(zip(obj.keys(), p)) for p in zip(*map(sub, obj.values()))]),
      dp_gather), "keeps the structure"),
    ((dp_scatter, make_gather(sort_keys=True)), "keeps the structure"),
    ((make_scatter(dict_pieces=lambda obj, sub: [type(obj)((k, v) for k, v in sorted(zip(obj.keys(), p)))
                                                 for p in zip(*map(sub, obj.values()))]), dp_gather),
     "keeps the structure"),
    ((dp_scatter, make_gather(join=lambda ts, d: torch.cat([t.to(ts[-1].device) for t in ts], d))),
     "gathers onto the first output's device"),
    ((dp_scatter, make_gather(join=lambda ts, d: torch.cat([t.cpu() for t in ts], d))),
     "gathers onto the first output's device"),
    ((dp_scatter, make_gather(to_first=False)), "gathers onto the first output's device"),
    ((scatter_with_torch, dp_gather), "uses tensor operations, not torch.nn.parallel"),
    ((dp_scatter, gather_with_torch), "uses tensor operations, not torch.nn.parallel"),
    ((comm_scatter, dp_gather), "uses tensor operations, not torch.nn.parallel"),
    ((calls_the_reference, dp_gather), "uses tensor operations, not torch.nn.parallel"),
])
def test_6_2_wrong(pair, prop, seed):
    fails_on("6.2", pair, prop)


def test_6_2_stub_and_wrong_type():
    assert run_check("6.2", (stub, stub)).status == "not_implemented"
    result = run_check("6.2", dp_scatter)
    assert result.status == "fail" and "(dp_scatter, dp_gather)" in result.message


# -- 6.3 ------------------------------------------------------------------------------------------

def _memory(n, batch, *, param_bytes, optimizer_bytes, input_bytes, activation_bytes, output_bytes,
            batch_on_device0=True, chunks_fn=_chunks, device0=None, other=None, pad=True, scale=1, host_aware=True,
            peak=max):
    chunks = chunks_fn(batch, n)
    on0 = batch if (batch_on_device0 or not host_aware) else chunks[0]
    first = (device0(chunks, batch) if device0 else
             param_bytes + optimizer_bytes + on0 * input_bytes
             + peak(chunks[0] * activation_bytes + 2 * batch * output_bytes, param_bytes))
    rest = [(other(c) if other else param_bytes + c * input_bytes + peak(c * activation_bytes, param_bytes))
            for c in chunks[1:]]
    out = [first] + rest + ([0] * (n - len(chunks)) if pad else [])
    return [v / scale for v in out]


def dp_memory(n_devices, batch_size, **sizes):
    return _memory(n_devices, batch_size, **sizes)


def optimizer_everywhere(n, batch, **s):
    out = _memory(n, batch, **s)
    return [out[0]] + [v + s["optimizer_bytes"] if v else 0 for v in out[1:]]


def gradients_and_activations_add_up(n, batch, **s):
    """The previous model: a device's gradients counted on top of its activations."""
    return _memory(n, batch, peak=lambda a, b: a + b, **s)


def replicas_without_gradients(n, batch, **s):
    return _memory(n, batch, other=lambda c: s["param_bytes"] + c * (s["input_bytes"] + s["activation_bytes"]), **s)


def whole_batch_activations_on_0(n, batch, **s):
    c0 = _chunks(batch, n)[0]
    return _memory(n, batch, device0=lambda ch, b: (
        s["param_bytes"] + s["optimizer_bytes"] + b * s["input_bytes"]
        + max(b * s["activation_bytes"] + 2 * b * s["output_bytes"], s["param_bytes"])), **s)


def only_own_input_on_0(n, batch, **s):
    return _memory(n, batch, **{**s, "batch_on_device0": False})


def batch_on_host_ignored(n, batch, **s):
    return _memory(n, batch, host_aware=False, **s)


def no_gathered_outputs(n, batch, **s):
    return _memory(n, batch, device0=lambda ch, b: (
        s["param_bytes"] + s["optimizer_bytes"] + (b if s.get("batch_on_device0", True) else ch[0]) * s["input_bytes"]
        + max(ch[0] * s["activation_bytes"], s["param_bytes"])), **s)


def all_devices_equal(n, batch, **s):
    out = _memory(n, batch, **s)
    return [out[0]] * n


def float_pieces(n, batch, **s):
    return _memory(n, batch, chunks_fn=lambda b, m: [b / m] * m, **s)


def tensor_split_pieces(n, batch, **s):
    return _memory(n, batch, chunks_fn=lambda b, m: [len(t) for t in torch.arange(b).tensor_split(m)], **s)


def no_padding(n, batch, **s):
    return _memory(n, batch, pad=False, **s)


def in_mib(n, batch, **s):
    return _memory(n, batch, scale=2**20, **s)


def course_memory(n, batch, **s):
    return scaling.dp_memory(n, batch, **s)


def test_6_3_passes(seed):
    result = run_check("6.3", dp_memory)
    assert result.status == "pass", result.message


@pytest.mark.parametrize("fn, prop", [
    (optimizer_everywhere, "the others hold a replica, their piece and their peak"),
    (gradients_and_activations_add_up, "one device holds the whole step"),
    (replicas_without_gradients, "the others hold a replica, their piece and their peak"),
    (whole_batch_activations_on_0, "device 0 holds the state, its input and its peak"),
    (only_own_input_on_0, "device 0 holds the state, its input and its peak"),
    (batch_on_host_ignored, "a batch left on the host puts only its piece on device 0"),
    (no_gathered_outputs, "one device holds the whole step"),
    (all_devices_equal, "the others hold a replica, their piece and their peak"),
    (float_pieces, "splits the batch like DataParallel"),
    (tensor_split_pieces, "splits the batch like DataParallel"),
    (no_padding, "returns one number per device"),
    (in_mib, "one device holds the whole step"),
    (course_memory, "computes the memory itself"),
])
def test_6_3_wrong(fn, prop, seed):
    fails_on("6.3", fn, prop)


def test_6_3_names_the_sum_of_activations_and_gradients(seed):
    assert "do not peak together" in fails_on("6.3", gradients_and_activations_add_up,
                                              "one device holds the whole step").message


def test_6_3_stub_and_wrong_type():
    assert run_check("6.3", stub).status == "not_implemented"
    assert run_check("6.3", [1, 2]).status == "fail"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_reference_matches_torch_scatter_gather_on_a_gpu():
    """torch's real scatter/gather, every 'device' being cuda:0, against the reference."""
    x = torch.randn(11, 3, device="cuda")
    y = torch.randint(0, 5, (11,), device="cuda")
    for n in range(1, 9):
        for obj in (x, (x, y), [x, {"y": y, "k": 3}]):
            real = torch.nn.parallel.scatter(obj, [0] * n)
            ours = reference_scatter(obj, n)
            assert len(real) == len(ours)
            assert repr(type(real[0])) == repr(type(ours[0]))
            flat_r = [t for t in torch.utils._pytree.tree_leaves(real) if isinstance(t, torch.Tensor)]
            flat_o = [t for t in torch.utils._pytree.tree_leaves(ours) if isinstance(t, torch.Tensor)]
            assert all(torch.equal(a, b) for a, b in zip(flat_r, flat_o))
    outs = [torch.randn(s, 4, device="cuda") for s in (3, 3, 2)]
    assert torch.equal(torch.nn.parallel.gather(outs, 0), reference_gather(outs))
    scalars = [torch.tensor(float(i), device="cuda") for i in range(3)]
    assert torch.equal(torch.nn.parallel.gather(scalars, 0), reference_gather(scalars))
