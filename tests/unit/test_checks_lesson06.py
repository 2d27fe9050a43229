"""Lesson 06 checks, proven by their mutants: the right answers pass, plausible wrong ones fail on
the right property, with a message about their own mistake, on every seed tried; stubs report
not_implemented. The walker's passing wrong answers of w1-06 (P1-P11) and the expert's answers of
x-06 are here by those names."""
import collections
import copy
import itertools
import math
import statistics

import numpy as np
import pytest
import torch

from course_utils import scaling
from course_utils.checks import run_check
from course_utils.checks.lesson06 import reference_gather, reference_scatter
from mutants import Mutant, passes, rejected

SEEDS = ["1", "2", "3", "20240", "777"]


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 6.x")


# -- 6.1 ------------------------------------------------------------------------------------------

def _chunks(batch, n):
    size = math.ceil(batch / n)
    return [min(size, batch - start) for start in range(0, batch, size)]


def _estimate(costs, n_devices, batch_size, loader_samples_per_s, *, chunks_fn=_chunks, device_fn=None,
              host_fn=None, loader_fn=None, alone_fn=None, combine=max, per_device=False):
    c = costs

    def device_ms(chunks, batch, n):
        if device_fn is not None:
            return device_fn(c, chunks, batch, n)
        ms = c.compute_fixed_ms + c.compute_per_sample_ms * chunks[0] + c.device0_ms
        if len(chunks) > 1:
            ms += c.replicate_ms + c.reduce_ms + (batch - chunks[0]) * (c.scatter_ms_per_sample + c.gather_ms_per_sample)
        return ms

    def throughput(chunks, batch, n, loader=loader_samples_per_s):
        times = {"devices": device_ms(chunks, batch, n),
                 "host": host_fn(c, chunks, n) if host_fn else
                 c.host_step_ms + (c.host_ms_per_replica * len(chunks) if n > 1 else 0.0),
                 "loader": loader_fn(batch, loader, len(chunks)) if loader_fn else 1000 * batch / loader}
        bound = max(times, key=times.get)
        return 1000 * batch / combine(times.values()), bound

    chunks = chunks_fn(batch_size, n_devices)
    samples_per_s, bound = throughput(chunks, batch_size, n_devices)
    alone = (alone_fn(throughput, chunks, batch_size, n_devices) if alone_fn
             else throughput([chunks[0]], chunks[0], 1)[0])
    return {"samples_per_s": samples_per_s / n_devices if per_device else samples_per_s,
            "efficiency": samples_per_s / (n_devices * alone), "bound": bound}


def estimate_dp(costs, n_devices, batch_size, loader_samples_per_s):
    return _estimate(costs, n_devices, batch_size, loader_samples_per_s)


def _with(**knobs):
    return lambda c, n, b, loader: _estimate(c, n, b, loader, **knobs)


def _serial(c, ch, batch):
    return c.replicate_ms + c.reduce_ms + (batch - ch[0]) * (c.scatter_ms_per_sample + c.gather_ms_per_sample)


def linear_scaling(costs, n, b, loader):
    """No serial stages: N devices are N times one."""
    out = _estimate(costs, 1, math.ceil(b / n), loader)
    return {"samples_per_s": min(out["samples_per_s"] * n, loader), "efficiency": 1.0, "bound": out["bound"]}


def calls_the_course(costs, n, b, loader):
    p = scaling.predict_dp(costs, n, b, loader)
    return {"samples_per_s": p.samples_per_s, "efficiency": p.efficiency, "bound": p.bound}


def returns_a_tuple(costs, n, b, loader):
    out = _estimate(costs, n, b, loader)
    return out["samples_per_s"], out["efficiency"], out["bound"]


def bound_always_devices(costs, n, b, loader):
    return {**_estimate(costs, n, b, loader), "bound": "devices"}


def bound_named_device(costs, n, b, loader):
    out = _estimate(costs, n, b, loader)
    return {**out, "bound": {"devices": "device"}.get(out["bound"], out["bound"])}


def speedup_not_efficiency(costs, n, b, loader):
    out = _estimate(costs, n, b, loader)
    return {**out, "efficiency": out["efficiency"] * n}


_cache = {}


def cache_ignoring_costs(costs, n, b, loader):
    """State kept between calls (w1-06): keyed on everything but the costs."""
    key = (n, b, loader)
    if key not in _cache:
        _cache[key] = _estimate(costs, n, b, loader)
    return _cache[key]


def _array_split(b, n):
    q, r = divmod(b, n)
    return [q + 1 if k < r else q for k in range(n) if (q + 1 if k < r else q) > 0]


def _floor_rest_last(b, n):
    return [b // n] * (n - 1) + [b - (b // n) * (n - 1)] if b >= n else [1] * b


def _first_plus_one(b, n):
    first = b // n + 1
    return [min(first, b - k * first) for k in range(math.ceil(b / first))]


def _devices_stat(stat):
    def device(c, ch, batch, n):
        per = [c.compute_ms(ch[0]) + c.device0_ms] + [c.compute_ms(k) for k in ch[1:]]
        return stat(per) + (_serial(c, ch, batch) if len(ch) > 1 else 0.0)
    return device


def _right_host(c, ch, n):
    return c.host_step_ms + (c.host_ms_per_replica * len(ch) if n > 1 else 0.0)


def host_for_every_device_in_both_runs(costs, n, b, loader):
    """w1-06: 'host = host_ms_per_replica x n_devices in both steps': the one-device baseline
    pays n_devices replicas' host work too."""
    host = lambda c, ch, m: c.host_step_ms + (c.host_ms_per_replica * n if n > 1 else 0.0)   # noqa: E731
    return _estimate(costs, n, b, loader, host_fn=host)


MUTANTS_6_1 = [
    # w1-06 P1: the serial stages whenever n_devices >= 2, even when the batch makes one piece
    Mutant("P1 replicate and reduce whenever n_devices >= 2", _with(device_fn=lambda c, ch, batch, n: (
        c.compute_ms(ch[0]) + c.device0_ms + (_serial(c, ch, batch) if n > 1 else 0.0))),
        "pays the serial stages only when two or more devices work", words="a batch of one sample is one piece"),
    Mutant("linear scaling", linear_scaling, "pays the serial stages once per step"),
    Mutant("replicate and reduce only with 3+ pieces", _with(device_fn=lambda c, ch, batch, n: (
        c.compute_ms(ch[0]) + c.device0_ms + (_serial(c, ch, batch) if len(ch) > 2 else 0.0))),
        "pays the serial stages once per step"),
    Mutant("replicate and reduce even on one device", _with(device_fn=lambda c, ch, batch, n: (
        c.compute_ms(ch[0]) + c.device0_ms + _serial(c, ch, batch))), "one device: batch / (compute + device-0 work)"),
    Mutant("replicate and reduce once per extra device", _with(device_fn=lambda c, ch, batch, n: (
        c.compute_ms(ch[0]) + c.device0_ms + (len(ch) - 1) * (c.replicate_ms + c.reduce_ms)
        + (batch - ch[0]) * (c.scatter_ms_per_sample + c.gather_ms_per_sample))), "pays the serial stages once per step"),
    Mutant("scatters the whole batch", _with(device_fn=lambda c, ch, batch, n: (
        c.compute_ms(ch[0]) + c.device0_ms + ((c.replicate_ms + c.reduce_ms + batch * (
            c.scatter_ms_per_sample + c.gather_ms_per_sample)) if len(ch) > 1 else 0.0))),
        "pays the serial stages once per step"),
    Mutant("scatter and gather for all but the last piece", _with(device_fn=lambda c, ch, batch, n: (
        c.compute_ms(ch[0]) + c.device0_ms + ((c.replicate_ms + c.reduce_ms + (batch - ch[-1]) * (
            c.scatter_ms_per_sample + c.gather_ms_per_sample)) if len(ch) > 1 else 0.0))),
        "scatters and gathers the samples that leave device 0", words="batch - the last piece"),
    Mutant("forgets device 0's work", _with(device_fn=lambda c, ch, batch, n: (
        c.compute_ms(ch[0]) + (_serial(c, ch, batch) if len(ch) > 1 else 0.0))),
        "one device: batch / (compute + device-0 work)"),
    Mutant("device 0's work only when split", _with(device_fn=lambda c, ch, batch, n: (
        c.compute_ms(ch[0]) + ((c.device0_ms + _serial(c, ch, batch)) if len(ch) > 1 else 0.0))),
        "one device: batch / (compute + device-0 work)"),
    Mutant("float split", _with(chunks_fn=lambda b, n: [b / n] * n), "splits the batch like DataParallel"),
    Mutant("tensor_split sizes", _with(chunks_fn=lambda b, n: [len(t) for t in torch.arange(b).tensor_split(n)]),
           "one replica per piece", words="or it splits the batch into"),
    Mutant("np.array_split sizes", _with(chunks_fn=_array_split), "one replica per piece",
           words="np.array_split's sizes"),
    Mutant("floor split, the rest to the last", _with(chunks_fn=_floor_rest_last), "splits the batch like DataParallel",
           words="the rest to the last"),
    Mutant("round(b / n) pieces", _with(chunks_fn=lambda b, n: _chunks(b, max(1, b // max(round(b / n), 1)))),
           "splits the batch like DataParallel"),
    Mutant("first piece b // n + 1", _with(chunks_fn=_first_plus_one, alone_fn=lambda tp, ch, batch, n: tp(
        [batch // n + 1], batch // n + 1, 1)[0]), "efficiency of one device is 1", words="ceil(batch_size / n_devices)"),
    Mutant("the mean piece sets the pace", _with(device_fn=lambda c, ch, batch, n: (
        c.compute_fixed_ms + c.compute_per_sample_ms * batch / len(ch) + c.device0_ms
        + (_serial(c, ch, batch) if len(ch) > 1 else 0.0))), "the slowest device sets the pace", words="mean piece"),
    Mutant("the last piece sets the pace", _with(device_fn=lambda c, ch, batch, n: (
        c.compute_ms(ch[-1]) + c.device0_ms + (_serial(c, ch, batch) if len(ch) > 1 else 0.0))),
        "the slowest device sets the pace", words="by the last piece"),
    # w2-06: right splits whose messages named the split (w61_12, w61_15, w61_16, w61_21, w61_26)
    Mutant("w2-06 w61_16: the last piece everywhere", _with(chunks_fn=lambda b, n: _chunks(b, n)[::-1], alone_fn=(
        lambda tp, ch, batch, n: tp([ch[0]], ch[0], 1)[0])), "the slowest device sets the pace",
        words="by the last piece"),
    Mutant("w2-06 w61_15: device 0's work only with one piece", _with(device_fn=lambda c, ch, batch, n: (
        c.compute_ms(ch[0]) + (c.device0_ms if len(ch) == 1 else _serial(c, ch, batch)))),
        "device 0's own work every step", words="leaves out device0_ms when two or more devices work"),
    Mutant("w2-06 w61_21: counts the padded samples", lambda c, n, b, loader: {
        **_estimate(c, n, b, loader), "samples_per_s": _estimate(c, n, b, loader)["samples_per_s"]
        * _chunks(b, n)[0] * len(_chunks(b, n)) / b}, "counts the batch's samples", words="the first piece x the pieces"),
    Mutant("w2-06 w61_26: scatter for (pieces - 1) x the first piece", _with(device_fn=lambda c, ch, batch, n: (
        c.compute_ms(ch[0]) + c.device0_ms + ((c.replicate_ms + c.reduce_ms + (len(ch) - 1) * ch[0] * (
            c.scatter_ms_per_sample + c.gather_ms_per_sample)) if len(ch) > 1 else 0.0))),
        "scatters and gathers the samples that leave device 0", words="(pieces - 1) x the first piece"),
    Mutant("devices' time: the mean of the devices' times", _with(device_fn=_devices_stat(statistics.mean)),
           "pays the serial stages once per step", words="mean"),
    Mutant("devices' time: the median of the devices' times", _with(device_fn=_devices_stat(statistics.median)),
           "pays the serial stages once per step", words="median"),
    # the host
    Mutant("no launch time (host_step_ms left out)", _with(host_fn=lambda c, ch, n: (
        c.host_ms_per_replica * len(ch) if n > 1 else 0.0)),
        "one device: the longer of its launches and its work", words="leaves out host_step_ms"),
    Mutant("a replica's host work with one device", _with(host_fn=lambda c, ch, n: (
        c.host_step_ms + c.host_ms_per_replica * len(ch))),
        "one device: the longer of its launches and its work", words="calls the model directly"),
    Mutant("no replica for a one-piece batch", _with(host_fn=lambda c, ch, n: (
        c.host_step_ms + (c.host_ms_per_replica * len(ch) if len(ch) > 1 else 0.0))),
        "two or more devices: a replica even for one piece", words="device 0 included"),
    Mutant("the launch time for every replica", _with(host_fn=lambda c, ch, n: (
        (c.host_step_ms + c.host_ms_per_replica) * len(ch) if n > 1 else c.host_step_ms)),
        "the host launches the step once and works for every replica", words="pays host_step_ms for every replica"),
    Mutant("host work once per step", _with(host_fn=lambda c, ch, n: (
        c.host_step_ms + (c.host_ms_per_replica if n > 1 else 0.0))),
           "the host launches the step once and works for every replica"),
    Mutant("host work for n - 1 replicas", _with(host_fn=lambda c, ch, n: (
        c.host_step_ms + c.host_ms_per_replica * max(len(ch) - 1, 1) if n > 1 else c.host_step_ms)),
        "the host launches the step once and works for every replica"),
    Mutant("host work shared by two cores", _with(host_fn=lambda c, ch, n: (
        c.host_step_ms + (c.host_ms_per_replica * len(ch) / min(len(ch), 2) if n > 1 else 0.0))),
        "the host launches the step once and works for every replica"),
    Mutant("w2-06 w61_03: host work for every device (both steps)", _with(host_fn=lambda c, ch, n: (
        c.host_step_ms + c.host_ms_per_replica * n if n > 1 else c.host_step_ms)),
        "one replica per piece", words="it charges host_ms_per_replica for every device"),
    Mutant("host work for every device, the one-device run too", host_for_every_device_in_both_runs,
           "efficiency compares with one device alone", words="n_devices replicas' host work"),
    Mutant("host and devices add up", _with(combine=sum), "one device: the longer of its launches and its work",
           words="adds the devices', the host's and the loader's times"),
    # the loader
    Mutant("no loader", lambda c, n, b, loader: _estimate(c, n, b, math.inf), "the loader caps the throughput"),
    Mutant("a loader per device", _with(loader_fn=lambda batch, rate, m: 1000 * batch / (rate * m)),
           "the loader caps the throughput"),
    Mutant("the loader for the first piece only", _with(loader_fn=lambda batch, rate, m: 1000 * math.ceil(batch / m)
                                                        / rate), "the loader caps the throughput"),
    # efficiency
    Mutant("efficiency against the whole batch", _with(alone_fn=lambda tp, ch, batch, n: tp([batch], batch, 1)[0]),
           "efficiency compares with one device alone", words="whole global batch"),
    Mutant("efficiency with an unlimited loader", _with(
        alone_fn=lambda tp, ch, batch, n: tp([ch[0]], ch[0], 1, math.inf)[0]),
        "efficiency compares with one device alone, same loader", words="unlimited loader"),
    Mutant("efficiency divided by the pieces", lambda c, n, b, loader: {
        **_estimate(c, n, b, loader), "efficiency": _estimate(c, n, b, loader)["efficiency"] * n / len(_chunks(b, n))},
        "efficiency compares with one device alone", words="divides by the pieces"),
    Mutant("efficiency at the mean piece b / n", _with(alone_fn=lambda tp, ch, batch, n: tp([batch / n], batch / n, 1)[0]),
           "efficiency compares with one device alone"),
    Mutant("efficiency at the floor piece b // n", _with(
        alone_fn=lambda tp, ch, batch, n: tp([max(batch // n, 1)], max(batch // n, 1), 1)[0]),
        "efficiency compares with one device alone"),
    Mutant("speed-up, not efficiency", speedup_not_efficiency, "efficiency compares with one device alone",
           words="speed-up"),
    Mutant("samples/s per device", _with(per_device=True), "pays the serial stages once per step",
           words="samples/s of one device"),
    # what it returns, and what it may not call
    Mutant("bound always devices", bound_always_devices, "names what bounds the run"),
    Mutant("bound 'device'", bound_named_device, "names what bounds the run"),
    Mutant("calls the course's predict_dp", calls_the_course, "computes the estimate itself"),
    Mutant("returns a tuple", returns_a_tuple, "returns samples_per_s, efficiency and bound"),
    Mutant("a cache that ignores the costs", cache_ignoring_costs, "computes every call from its own arguments"),
]


def test_6_1_passes():
    passes("6.1", estimate_dp, SEEDS)


@pytest.mark.parametrize("mutant", MUTANTS_6_1, ids=repr)
def test_6_1_mutants_rejected(mutant):
    _cache.clear()
    rejected("6.1", mutant, SEEDS)


def test_6_1_stub_and_wrong_type():
    assert run_check("6.1", stub).status == "not_implemented"
    result = run_check("6.1", 42)
    assert result.status == "fail" and "expected a function" in result.message


# -- 6.2 ------------------------------------------------------------------------------------------

def _is_namedtuple(obj):
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def make_scatter(*, split=lambda t, n, dim: list(t.chunk(n, dim)), leaf=lambda obj, n: [obj] * n,
                 tuple_type=None, zip_fn=zip, recurse=True, keep_namedtuple=True, dict_pieces=None, pass_dim=True,
                 walk_empty=False, walk=lambda obj: isinstance(obj, (tuple, list, dict))):
    def dp_scatter(inputs, n_devices, dim=0):
        def go(obj, d=dim):
            if isinstance(obj, torch.Tensor):
                return split(obj, n_devices, d)
            inner = d if pass_dim else 0
            sub = ((lambda o: go(o, inner)) if recurse else
                   (lambda o: split(o, n_devices, d) if isinstance(o, torch.Tensor) else leaf(o, n_devices)))
            if not walk(obj) or (not obj and not walk_empty):
                return leaf(obj, n_devices)
            if _is_namedtuple(obj):
                if keep_namedtuple:
                    return [type(obj)(*p) for p in zip_fn(*map(sub, obj))]
                return [tuple(p) for p in zip_fn(*map(sub, obj))]
            if isinstance(obj, dict):
                if dict_pieces is not None:
                    return dict_pieces(obj, sub)
                return [type(obj)(zip(obj.keys(), p)) for p in zip_fn(*map(sub, obj.values()))]
            if isinstance(obj, tuple):
                return [(tuple_type or tuple)(p) for p in zip_fn(*map(sub, obj))]
            if isinstance(obj, list):
                return [list(p) for p in zip_fn(*map(sub, obj))]
            return [type(obj)(p) for p in zip_fn(*map(sub, obj))]
        return go(inputs)
    return dp_scatter


def make_gather(*, join=None, scalars=True, seq_type=None, to=None, dict_type=None, sort_keys=False,
                none=lambda: None, pass_dim=True, pass_device=True, takes_device=True):
    def gather(outputs, dim=0, output_device=None):
        first = outputs[0]
        if isinstance(first, torch.Tensor):
            ts = list(outputs)
            target = (to(ts, output_device) if to is not None else
                      (torch.device(output_device) if output_device is not None else first.device))
            if join is not None:
                return join(ts, dim, target)
            ts = [t.to(target) for t in ts]
            if scalars and dim == 0 and all(t.dim() == 0 for t in ts):
                ts = [t.view(1) for t in ts]
            return torch.cat(ts, dim)
        if first is None:
            return none()
        inner_dim = dim if pass_dim else 0
        inner_device = output_device if pass_device else None
        if isinstance(first, dict):
            keys = sorted(first) if sort_keys else first
            return (dict_type or type(first))((k, gather([o[k] for o in outputs], inner_dim, inner_device))
                                              for k in keys)
        if _is_namedtuple(first):
            return type(first)(*(gather(list(p), inner_dim, inner_device) for p in zip(*outputs)))
        return (seq_type or type(first))(gather(list(p), inner_dim, inner_device) for p in zip(*outputs))
    if takes_device:
        return gather
    return lambda outputs, dim=0: gather(outputs, dim)


dp_scatter, dp_gather = make_scatter(), make_gather()


def _scalars_only(fn):
    """A join that does `fn` to 0-dim outputs gathered on dim 0 and the right thing otherwise."""
    def join(ts, dim, target):
        if dim == 0 and all(t.dim() == 0 for t in ts):
            return fn(ts, target)
        return torch.cat([t.to(target) for t in ts], dim)
    return join


def scatter_with_torch(inputs, n_devices, dim=0):
    return torch.nn.parallel.scatter(inputs, list(range(n_devices)), dim)


def gather_with_torch(outputs, dim=0, output_device=None):
    return torch.nn.parallel.gather(outputs, 0, dim)


def comm_scatter(inputs, n_devices, dim=0):
    from torch.cuda import comm
    if isinstance(inputs, torch.Tensor):
        return list(comm.scatter(inputs, list(range(n_devices)), dim=dim))
    return dp_scatter(inputs, n_devices, dim)


def calls_the_reference(inputs, n_devices, dim=0):
    return reference_scatter(inputs, n_devices, dim)


_pieces = {}


def cached_chunks(t, n, dim):
    """w1-06 P9: chunks cached by shape (state kept between calls)."""
    key = (tuple(t.shape), n, dim)
    if key not in _pieces:
        _pieces[key] = list(t.chunk(n, dim))
    return _pieces[key]


def _item_checked(ts, dim, target):
    """w2-06 w62_29: the right gather, and an assert on every output (a host sync, no copy)."""
    assert all(bool(torch.isfinite(t).all().item()) for t in ts)
    ts = [t.to(target) for t in ts]
    if dim == 0 and all(t.dim() == 0 for t in ts):
        ts = [t.view(1) for t in ts]
    return torch.cat(ts, dim)


def _host_round_trip(ts, dim, target):
    """w1-06 P8: every output copied to the host, concatenated there, copied back."""
    parts = [t.cpu().view(1) if t.dim() == 0 and dim == 0 else t.cpu() for t in ts]
    return torch.cat(parts, dim).to(target)


def _non_blocking(ts, dim, target):
    """x-06: `.to(target, non_blocking=True)` then torch.cat: a race when the target is the host."""
    ts = [t.to(target, non_blocking=True) for t in ts]
    if dim == 0 and all(t.dim() == 0 for t in ts):
        ts = [t.view(1) for t in ts]
    return torch.cat(ts, dim)


def _seq_abc(inputs, n, dim=0):
    """Recursion into every collections.abc.Sequence: strings are sequences of strings."""
    if isinstance(inputs, torch.Tensor):
        return list(inputs.chunk(n, dim))
    if isinstance(inputs, collections.abc.Sequence) and len(inputs) > 0:
        return [type(inputs)(*p) if _is_namedtuple(inputs) else type(inputs)(p)
                for p in zip(*(_seq_abc(x, n, dim) for x in inputs))]
    if isinstance(inputs, collections.abc.Mapping) and len(inputs) > 0:
        return [type(inputs)(zip(inputs.keys(), p)) for p in zip(*(_seq_abc(v, n, dim) for v in inputs.values()))]
    return [inputs] * n


def _to_gpu_if_any(ts, output_device):
    """x-06's gather onto the accelerator whenever an output is there (ignores output_device)."""
    return next((t.device for t in ts if t.device.type != "cpu"), ts[0].device)


MUTANTS_6_2 = [
    # w1-06's passing answers
    Mutant("P2 0-dim losses detached", (dp_scatter, make_gather(join=_scalars_only(
        lambda ts, target: torch.stack([t.detach().to(target) for t in ts])))), "lets gradients flow",
        words="0-dim losses"),
    Mutant("P3 0-dim losses through .item()", (dp_scatter, make_gather(join=_scalars_only(
        lambda ts, target: torch.tensor([t.item() for t in ts], device=target)))),
        "gathers on the device, nothing through the host", words="wait(s) for the device"),
    Mutant("w2-06 w62_29: a per-step .item() sanity check", (dp_scatter, make_gather(join=_item_checked)),
           "gathers on the device, nothing through the host", words="yours reads a value on the host"),
    Mutant("P8 gathered through the host (the copy's hint)", (dp_scatter, make_gather(join=_host_round_trip)),
           "gathers on the device, nothing through the host", words="copies the outputs twice"),
    Mutant("P4 0-dim losses gathered on the CPU", (dp_scatter, make_gather(join=_scalars_only(
        lambda ts, target: torch.stack([t.cpu() for t in ts])))), "gathers onto output_device"),
    Mutant("P5 0-dim losses onto the last output's device", (dp_scatter, make_gather(join=_scalars_only(
        lambda ts, target: torch.stack([t.to(ts[-1].device) for t in ts])))), "gathers onto output_device"),
    Mutant("P6 the scatter's recursion forgets dim", (make_scatter(pass_dim=False), dp_gather),
           "splits along dim inside containers too", words="pass dim down the recursion"),
    Mutant("P7 the gather's recursion forgets dim", (dp_scatter, make_gather(pass_dim=False)),
           "joins along dim inside containers too", words="pass dim down the recursion"),
    Mutant("P8 gathered through the host", (dp_scatter, make_gather(join=_host_round_trip)),
           "gathers on the device, nothing through the host", words="to the host"),
    Mutant("P9 chunks cached by shape", (make_scatter(split=cached_chunks), dp_gather),
           "splits the tensor it is given, every call"),
    # the expert's (x-06)
    Mutant("non_blocking copies to the host", (dp_scatter, make_gather(join=_non_blocking)),
           "copies to the host with a blocking copy"),
    Mutant("gathers onto the accelerator whatever output_device says", (dp_scatter, make_gather(to=_to_gpu_if_any)),
           "gathers onto output_device"),
    Mutant("no output_device argument", (dp_scatter, make_gather(takes_device=False)), "takes output_device"),
    Mutant("output_device ignored", (dp_scatter, make_gather(to=lambda ts, device: ts[0].device)),
           "gathers onto output_device"),
    Mutant("output_device not passed down the recursion", (dp_scatter, make_gather(pass_device=False)),
           "gathers onto output_device"),
    Mutant("tensor_split pieces", (make_scatter(split=lambda t, n, d: list(t.tensor_split(n, d))), dp_gather),
           "splits like DataParallel"),
    # splits
    Mutant("tensor_split, empty pieces dropped", (make_scatter(split=lambda t, n, d: [
        p for p in t.tensor_split(n, d) if p.shape[d] > 0]), dp_gather), "splits like DataParallel"),
    Mutant("split by floor size", (make_scatter(split=lambda t, n, d: list(t.split(max(t.shape[d] // n, 1), d))),
                                   dp_gather), "splits like DataParallel"),
    Mutant("empty pieces padded", (make_scatter(split=lambda t, n, d: list(t.chunk(n, d))
                                                + [t.narrow(d, 0, 0)] * (n - len(t.chunk(n, d)))), dp_gather),
           "splits like DataParallel"),
    Mutant("always along dim 0", (make_scatter(split=lambda t, n, d: list(t.chunk(n, 0))), dp_gather),
           "splits like DataParallel"),
    Mutant("cloned pieces", (make_scatter(split=lambda t, n, d: [p.clone() for p in t.chunk(n, d)]), dp_gather),
           "makes no copies"),
    Mutant("contiguous pieces", (make_scatter(split=lambda t, n, d: [p.contiguous() for p in t.chunk(n, d)]),
                                 dp_gather), "makes no copies"),
    Mutant("detached pieces", (make_scatter(split=lambda t, n, d: [p.detach() for p in t.chunk(n, d)]), dp_gather),
           "lets gradients flow"),
    # structures
    Mutant("tuples become lists", (make_scatter(tuple_type=list), dp_gather), "keeps the structure"),
    Mutant("namedtuples become tuples", (make_scatter(keep_namedtuple=False), dp_gather), "keeps the structure"),
    Mutant("dicts become lists", (make_scatter(dict_pieces=lambda obj, sub: [list(p) for p in
                                                                             zip(*map(sub, obj.values()))]),
                                  dp_gather), "keeps the structure"),
    Mutant("OrderedDict becomes dict", (make_scatter(dict_pieces=lambda obj, sub: [
        dict(zip(obj.keys(), p)) for p in zip(*map(sub, obj.values()))]), dp_gather), "keeps the structure"),
    Mutant("dict keys sorted", (make_scatter(dict_pieces=lambda obj, sub: [
        type(obj)((k, v) for k, v in sorted(zip(obj.keys(), p))) for p in zip(*map(sub, obj.values()))]),
        dp_gather), "keeps the structure", words="in the input's order"),
    Mutant("non-tensors deep-copied", (make_scatter(leaf=lambda obj, n: [copy.deepcopy(obj) for _ in range(n)]),
                                       dp_gather), "shares non-tensors by reference", words="very same object"),
    Mutant("non-tensors to device 0 only", (make_scatter(leaf=lambda obj, n: [obj]), dp_gather),
           "shares non-tensors by reference", words="n_devices entries"),
    Mutant("empty containers walked", (make_scatter(walk_empty=True), dp_gather), "shares non-tensors by reference",
           words="an empty container is not walked"),
    Mutant("zip_longest", (make_scatter(zip_fn=lambda *its: itertools.zip_longest(*its)), dp_gather),
           "stops at the shortest element, as zip does"),
    Mutant("no recursion", (make_scatter(recurse=False), dp_gather), "splits every tensor in the structure"),
    Mutant("sets walked too", (make_scatter(walk=lambda obj: isinstance(obj, (tuple, list, dict, set))), dp_gather),
           "shares non-tensors by reference", words="tuple, list or dict"),
    Mutant("every Sequence walked (strings too)", (_seq_abc, dp_gather), "keeps the structure",
           words="the recursion never ended"),
    # gathers
    Mutant("stack, not cat", (dp_scatter, make_gather(join=lambda ts, d, target: torch.stack(
        [t.to(target) for t in ts], d))), "joins like DataParallel"),
    Mutant("0-dim outputs not turned into a vector", (dp_scatter, make_gather(scalars=False)),
           "turns 0-dim outputs into a vector"),
    Mutant("the mean of 0-dim losses", (dp_scatter, make_gather(join=_scalars_only(
        lambda ts, target: torch.stack([t.to(target) for t in ts]).mean()))), "joins like DataParallel"),
    Mutant("the first loss only", (dp_scatter, make_gather(join=_scalars_only(lambda ts, target: ts[0].view(1)))),
           "joins like DataParallel"),
    Mutant("always along dim 0 (gather)", (dp_scatter, make_gather(join=lambda ts, d, target: torch.cat(
        [t.to(target).view(1) if t.dim() == 0 else t.to(target) for t in ts], 0))), "joins like DataParallel"),
    Mutant("reversed order", (dp_scatter, make_gather(join=lambda ts, d, target: torch.cat(
        [t.to(target).view(1) if t.dim() == 0 and d == 0 else t.to(target) for t in ts[::-1]], d))),
        "keeps the samples in order"),
    Mutant("the last output dropped", (dp_scatter, make_gather(join=lambda ts, d, target: torch.cat(
        [t.to(target).view(1) if t.dim() == 0 and d == 0 else t.to(target) for t in ts[:-1]], d))),
        "joins like DataParallel"),
    Mutant("sequences become lists", (dp_scatter, make_gather(seq_type=list)), "keeps the structure"),
    Mutant("OrderedDict becomes dict (gather)", (dp_scatter, make_gather(dict_type=dict)), "keeps the structure"),
    Mutant("keys sorted (gather)", (dp_scatter, make_gather(sort_keys=True)), "keeps the structure",
           words="in the input's order"),
    Mutant("None becomes an empty tensor", (dp_scatter, make_gather(none=lambda: torch.empty(0))),
           "keeps None as None"),
    Mutant("onto the last output's device", (dp_scatter, make_gather(to=lambda ts, device: ts[-1].device)),
           "gathers onto output_device"),
    Mutant("onto the CPU", (dp_scatter, make_gather(to=lambda ts, device: torch.device("cpu"))),
           "gathers onto output_device"),
    Mutant("concatenated where they are", (dp_scatter, make_gather(join=lambda ts, d, target: torch.cat(
        [t.view(1) if t.dim() == 0 and d == 0 else t for t in ts], d))), "gathers onto output_device"),
    # what it may not call
    Mutant("torch's scatter", (scatter_with_torch, dp_gather), "uses tensor operations, not torch.nn.parallel"),
    Mutant("torch's gather", (dp_scatter, gather_with_torch), "uses tensor operations, not torch.nn.parallel"),
    Mutant("torch.cuda.comm's scatter", (comm_scatter, dp_gather), "uses tensor operations, not torch.nn.parallel"),
    Mutant("the check's reference", (calls_the_reference, dp_gather), "uses tensor operations, not torch.nn.parallel"),
]


def test_6_2_passes():
    passes("6.2", (dp_scatter, dp_gather), SEEDS)


def _scalars_any_dim(ts, dim, target):
    """w2-06 w62_19: 0-dim outputs viewed as vectors for any dim (torch raises for dim != 0, and so does this)."""
    ts = [t.to(target) for t in ts]
    if all(t.dim() == 0 for t in ts):
        ts = [t.view(1) for t in ts]
    return torch.cat(ts, dim)


def test_6_2_w2_06_right_answers_pass():
    passes("6.2", (dp_scatter, make_gather(join=_scalars_any_dim)), SEEDS[:2])


@pytest.mark.parametrize("mutant", MUTANTS_6_2, ids=repr)
def test_6_2_mutants_rejected(mutant):
    _pieces.clear()
    rejected("6.2", mutant, SEEDS[:3])


def test_reference_is_torchs_recursion_with_chunk_and_cat():
    x = torch.arange(10.0)
    assert [len(p) for p in reference_scatter(x, 4)] == [3, 3, 3, 1]
    assert [len(p) for p in reference_scatter(torch.arange(5.0), 4)] == [2, 2, 1]
    pieces = reference_scatter((x, {"y": x}, 7), 2)
    assert isinstance(pieces, list) and isinstance(pieces[0], tuple) and pieces[1][2] == 7
    assert torch.equal(reference_gather([torch.tensor(1.0), torch.tensor(2.0)]), torch.tensor([1.0, 2.0]))
    assert reference_gather([torch.ones(2), torch.ones(1)], 0, "cpu").device.type == "cpu"
    # the patch is undone
    from torch.nn.parallel import _functions, scatter_gather
    assert scatter_gather.Scatter is _functions.Scatter and scatter_gather.Gather is _functions.Gather


def test_6_2_stub_and_wrong_type():
    assert run_check("6.2", (stub, stub)).status == "not_implemented"
    result = run_check("6.2", dp_scatter)
    assert result.status == "fail" and "(dp_scatter, dp_gather)" in result.message


# -- 6.3 ------------------------------------------------------------------------------------------

def _memory(n, batch, *, param_bytes, optimizer_bytes, input_bytes, activation_bytes, output_bytes,
            batch_on_device0=True, chunks_fn=_chunks, device0=None, other=None, one=None, pad=True, scale=1,
            host_aware=True, ret=list):
    p, o, i, a, y = param_bytes, optimizer_bytes, input_bytes, activation_bytes, output_bytes
    chunks = chunks_fn(batch, n)
    if n == 1:
        out = [one(p, o, i, a, y, batch) if one else p + o + batch * (i + a) + 2 * batch * y + p]
    else:
        on0 = batch if (batch_on_device0 or not host_aware) else chunks[0]
        first = (device0(p, o, i, a, y, batch, chunks[0], on0) if device0 else
                 p + o + on0 * i + p + max(chunks[0] * a + 2 * batch * y, p))
        rest = [(other(p, o, i, a, y, batch, c) if other else p + c * i + c * a + p) for c in chunks[1:]]
        out = [first] + rest + ([0] * (n - len(chunks)) if pad else [])
    return ret([v / scale for v in out])


def dp_memory(n_devices, batch_size, **sizes):
    return _memory(n_devices, batch_size, **sizes)


def _mem(**knobs):
    return lambda n, batch, **sizes: _memory(n, batch, **sizes, **knobs)


def optimizer_everywhere(n, batch, **s):
    out = _memory(n, batch, **s)
    return [out[0]] + [v + s["optimizer_bytes"] if v else 0 for v in out[1:]]


def all_devices_equal(n, batch, **s):
    out = _memory(n, batch, **s)
    return [out[0]] * n


def drops_devices_without_a_piece(n, batch, **s):
    return [v for v in _memory(n, batch, **s) if v]


def device0_only(n, batch, **s):
    out = _memory(n, batch, **s)
    return [out[0]] + [0] * (n - 1)


def course_memory(n, batch, **s):
    return scaling.dp_memory(n, batch, **s)


_memo = {}


def memoised_on_devices_and_batch(n, batch, **s):
    """w1-06 P10: results memoised on (n_devices, batch_size, batch_on_device0), the sizes ignored."""
    key = (n, batch, s.get("batch_on_device0", True))
    if key not in _memo:
        _memo[key] = _memory(n, batch, **s)
    return _memo[key]


def mutable_default(n, batch, _out=[], **s):     # noqa: B006 (the mistake under test)
    """A list kept between calls: a mutable default argument, cleared and refilled every call."""
    _out.clear()
    _out.extend(_memory(n, batch, **s))
    return _out


_grown = []


def growing_default(n, batch, _out=_grown, **s):     # noqa: B006
    """w1-06: the list is reused between calls, and emptied only now and then."""
    if len(_out) > 50:
        _out.clear()
    _out.extend(_memory(n, batch, **s))
    return _out


def one_piece_as_one_device(n, batch, **s):
    """w2-06 w63_17: the one-device formula whenever the batch makes one piece (batch 1 on 4 devices: one entry)."""
    if len(_chunks(batch, n)) == 1:
        return _memory(1, batch, **s)
    return _memory(n, batch, **s)


MUTANTS_6_3 = [
    # w1-06 P10, P11
    Mutant("P10 memoised on devices and batch", memoised_on_devices_and_batch, "computes every call from its own sizes"),
    Mutant("P11 returns a tuple", _mem(ret=tuple), "returns a list", words="tuple"),
    Mutant("returns a numpy array", _mem(ret=np.array), "returns a list"),
    Mutant("returns a tensor", _mem(ret=torch.tensor), "returns a list"),
    Mutant("a mutable default list", mutable_default, "returns a new list on every call"),
    Mutant("w1-06: a mutable default list that grows", growing_default, "returns a new list on every call"),
    # the peak (x-06: measured on the course's ResNet-18 close to the sum; DataParallel's reduce: 2 x P on device 0)
    Mutant("the larger of activations and gradients (the old model)", _mem(
        one=lambda p, o, i, a, y, b: p + o + b * i + max(b * a + 2 * b * y, p),
        device0=lambda p, o, i, a, y, b, c0, on0: p + o + on0 * i + max(c0 * a + 2 * b * y, p),
        other=lambda p, o, i, a, y, b, c: p + c * i + max(c * a, p)),
        "one device holds the whole step", words="takes the larger of the activations and the gradients"),
    Mutant("x-06: the larger of activations and the reduce's 2P", _mem(
        device0=lambda p, o, i, a, y, b, c0, on0: p + o + on0 * i + max(c0 * a + 2 * b * y, 2 * p),
        other=lambda p, o, i, a, y, b, c: p + c * i + max(c * a, p)),
        "the others hold a replica, their piece and their peak", words="takes the larger"),
    Mutant("x-06: activations + gradients without the reduce", _mem(
        device0=lambda p, o, i, a, y, b, c0, on0: p + o + on0 * i + c0 * a + 2 * b * y + p),
        "device 0 holds the state, its input and its peak", words="leaves out the reduce's copy"),
    Mutant("the reduce's copy on every device", _mem(other=lambda p, o, i, a, y, b, c: p + c * i + c * a + 2 * p),
           "the others hold a replica, their piece and their peak"),
    Mutant("the reduce's copy with one device too", _mem(
        one=lambda p, o, i, a, y, b: p + o + b * i + p + max(b * a + 2 * b * y, p)),
        "one device holds the whole step"),
    Mutant("no gradients at all", _mem(one=lambda p, o, i, a, y, b: p + o + b * (i + a) + 2 * b * y,
                                       device0=lambda p, o, i, a, y, b, c0, on0: p + o + on0 * i + c0 * a + 2 * b * y,
                                       other=lambda p, o, i, a, y, b, c: p + c * (i + a)),
           "one device holds the whole step", words="leaves out a copy of param_bytes"),
    # device 0's terms (w1-06's messages that pointed elsewhere)
    Mutant("the gathered outputs once", _mem(one=lambda p, o, i, a, y, b: p + o + b * (i + a) + b * y + p,
                                             device0=lambda p, o, i, a, y, b, c0, on0: p + o + on0 * i + p + max(
                                                 c0 * a + b * y, p)),
           "one device holds the whole step", words="leaves out the gathered outputs or their gradient"),
    Mutant("w2-06 w63_11: device 0 counts its own piece's outputs", _mem(
        device0=lambda p, o, i, a, y, b, c0, on0: p + o + on0 * i + p + max(c0 * a + 2 * c0 * y, p)),
        "device 0 holds the state, its input and its peak", words="device 0's own piece's outputs"),
    Mutant("w2-06 w63_04: the gathered outputs once on device 0", _mem(
        device0=lambda p, o, i, a, y, b, c0, on0: p + o + on0 * i + p + max(c0 * a + b * y, p)),
        "device 0 holds the state, its input and its peak", words="the gathered outputs"),
    Mutant("w2-06 w63_17: one piece as one device (a list of one)", one_piece_as_one_device,
           "two or more devices: a replica even for one piece", words="treats a batch that makes one piece as one device"),
    Mutant("one piece as one device, the others 0", lambda n, batch, **s: (
        one_piece_as_one_device(n, batch, **s) + [0] * (n - 1) if batch == 1 and n > 1 else _memory(n, batch, **s)),
        "two or more devices: a replica even for one piece", words="treats a batch that makes one piece as one device"),
    Mutant("the gathered outputs outside the max", _mem(
        device0=lambda p, o, i, a, y, b, c0, on0: p + o + on0 * i + p + max(c0 * a, p) + 2 * b * y),
        "device 0 holds the state, its input and its peak"),
    Mutant("the outputs of device 0's piece only", _mem(
        one=lambda p, o, i, a, y, b: p + o + b * (i + a) + p,
        device0=lambda p, o, i, a, y, b, c0, on0: p + o + on0 * i + p + max(c0 * a + 2 * c0 * y, p)),
        "one device holds the whole step"),
    Mutant("the input counted twice", _mem(one=lambda p, o, i, a, y, b: p + o + 2 * b * i + b * a + 2 * b * y + p),
           "one device holds the whole step", words="counts the input"),
    Mutant("the optimizer state taken as momentum (P)", _mem(
        one=lambda p, o, i, a, y, b: p + p + b * (i + a) + 2 * b * y + p,
        device0=lambda p, o, i, a, y, b, c0, on0: p + p + on0 * i + p + max(c0 * a + 2 * b * y, p)),
        "one device holds the whole step"),
    Mutant("no gathered outputs with one device", _mem(one=lambda p, o, i, a, y, b: p + o + b * (i + a) + p),
           "one device holds the whole step", words="leaves out the outputs and their gradient"),
    Mutant("device 0's activations for the whole batch", _mem(
        device0=lambda p, o, i, a, y, b, c0, on0: p + o + on0 * i + p + max(b * a + 2 * b * y, p)),
        "device 0 holds the state, its input and its peak"),
    Mutant("device 0 holds only its own input", _mem(host_aware=True, device0=lambda p, o, i, a, y, b, c0, on0: (
        p + o + c0 * i + p + max(c0 * a + 2 * b * y, p))), "device 0 holds the state, its input and its peak"),
    Mutant("the batch always on device 0", _mem(host_aware=False),
           "a batch left on the host puts only its piece on device 0"),
    Mutant("the input counted B + c0", _mem(device0=lambda p, o, i, a, y, b, c0, on0: (
        p + o + (on0 + (c0 if on0 == b else 0)) * i + p + max(c0 * a + 2 * b * y, p))),
        "device 0 holds the state, its input and its peak"),
    # the others
    Mutant("the optimizer state on every device", optimizer_everywhere,
           "the others hold a replica, their piece and their peak", words="optimizer state"),
    Mutant("replicas without gradients", _mem(other=lambda p, o, i, a, y, b, c: p + c * (i + a)),
           "the others hold a replica, their piece and their peak", words="leaves out a copy of param_bytes"),
    Mutant("replicas without input", _mem(other=lambda p, o, i, a, y, b, c: p + c * a + p),
           "the others hold a replica, their piece and their peak"),
    Mutant("replicas hold their own outputs", _mem(other=lambda p, o, i, a, y, b, c: p + c * (i + a + 2 * y) + p),
           "the others hold a replica, their piece and their peak"),
    Mutant("every device like device 0", all_devices_equal, "the others hold a replica, their piece and their peak"),
    Mutant("device 0 only, the others 0", device0_only, "the others hold a replica, their piece and their peak"),
    Mutant("a replica on a device without a piece", _mem(chunks_fn=lambda b, n: _chunks(b, n) + [0] * (
        n - len(_chunks(b, n))), other=lambda p, o, i, a, y, b, c: p + c * i + c * a + p, pad=False),
        "devices without a piece hold nothing"),
    # splits and what it returns
    Mutant("float pieces", _mem(chunks_fn=lambda b, m: [b / m] * m), "splits the batch like DataParallel"),
    Mutant("tensor_split pieces", _mem(chunks_fn=lambda b, m: [len(t) for t in torch.arange(b).tensor_split(m)]),
           "splits the batch like DataParallel"),
    Mutant("np.array_split pieces", _mem(chunks_fn=_array_split), "splits the batch like DataParallel"),
    Mutant("floor pieces, the rest last", _mem(chunks_fn=_floor_rest_last), "splits the batch like DataParallel"),
    Mutant("the small piece first", _mem(chunks_fn=lambda b, m: _chunks(b, m)[::-1]),
           "splits the batch like DataParallel"),
    Mutant("no entry for a device without a piece", _mem(pad=False), "returns one number per device"),
    Mutant("drops devices without a piece", drops_devices_without_a_piece, "returns one number per device"),
    Mutant("in MiB", _mem(scale=2**20), "one device holds the whole step"),
    Mutant("calls the course's dp_memory", course_memory, "computes the memory itself"),
]


def test_6_3_passes():
    passes("6.3", dp_memory, SEEDS)


@pytest.mark.parametrize("mutant", MUTANTS_6_3, ids=repr)
def test_6_3_mutants_rejected(mutant):
    _memo.clear()
    _grown.clear()
    rejected("6.3", mutant, SEEDS)


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
    assert torch.equal(torch.nn.parallel.gather(outs, -1), reference_gather(outs, 0, "cpu"))   # output_device=-1
    on0 = reference_gather(outs, 0, 0)       # w3-06: output_device as DataParallel passes it, an int
    assert on0.device == torch.device("cuda", 0) and torch.equal(torch.nn.parallel.gather(outs, 0, dim=0), on0)
    scalars = [torch.tensor(float(i), device="cuda") for i in range(3)]
    assert torch.equal(torch.nn.parallel.gather(scalars, 0), reference_gather(scalars))


# -- walk w3-06: the wrong answers that passed, and the messages that pointed away --------------------

def _piece_stat(stat):
    """w3-06 w61_median_piece / w61_lower_median_piece: the devices timed by a statistic of the pieces."""
    def device(c, ch, batch, n):
        piece = stat(ch)
        return (c.compute_fixed_ms + c.compute_per_sample_ms * piece + c.device0_ms
                + (c.replicate_ms + c.reduce_ms + (batch - piece) * (c.scatter_ms_per_sample + c.gather_ms_per_sample)
                   if len(ch) > 1 else 0.0))
    return device


def efficiency_alone_compute_only(c, n, b, loader):
    """w3-06: the one-device baseline without device 0's work, the host or the loader."""
    out = estimate_dp(c, n, b, loader)
    first = _chunks(b, n)[0]
    return {**out, "efficiency": out["samples_per_s"] / (n * 1000 * first / c.compute_ms(first))}


class EfficiencyFirstCallState:
    """w3-06 w61_efficiency_first_call_state: the baseline kept from the first call (a fresh one per seed)."""

    def __init__(self):
        self.alone = None

    def __call__(self, c, n, b, loader):
        out = estimate_dp(c, n, b, loader)
        if self.alone is None:
            self.alone = out["samples_per_s"] * n / out["efficiency"]
        return {**out, "efficiency": out["samples_per_s"] / (n * self.alone)}


MUTANTS_6_1_W3 = [
    # passed 33 of 40 seeds: no 2-device host-bound case on most draws (now in every draw)
    Mutant("w3-06 w61_host_replicas_from_three_devices (n > 2 for n > 1)", _with(host_fn=lambda c, ch, n: (
        c.host_step_ms + (c.host_ms_per_replica * len(ch) if n > 2 else 0.0))),
        "the host launches the step once and works for every replica", words="2 device(s)"),
    # the model's term leads, the split that gives the same number second
    Mutant("w3-06 w61_replicate_reduce_when_n_gt_1", _with(device_fn=lambda c, ch, batch, n: (
        c.compute_ms(ch[0]) + c.device0_ms + (_serial(c, ch, batch) if n > 1 else 0.0))),
        "pays the serial stages only when two or more devices work",
        words="Hint: yours charges replicate, reduce, scatter and gather whenever n_devices >= 2"),
    Mutant("w3-06 w61_median_piece", _with(device_fn=_piece_stat(statistics.median)), "the slowest device sets the pace",
           words="median piece"),
    Mutant("w3-06 w61_lower_median_piece", _with(device_fn=_piece_stat(lambda ch: sorted(ch)[(len(ch) - 1) // 2])),
           "splits the batch like DataParallel", words="also the pieces' lower median"),
    Mutant("w3-06 w61_rounded_outputs", lambda c, n, b, loader: {
        **estimate_dp(c, n, b, loader), "samples_per_s": round(estimate_dp(c, n, b, loader)["samples_per_s"])},
        "returns the numbers unrounded", words="to a whole number"),
    Mutant("w3-06 w61_rounded_sps_one_decimal", lambda c, n, b, loader: {
        **estimate_dp(c, n, b, loader), "samples_per_s": round(estimate_dp(c, n, b, loader)["samples_per_s"], 1)},
        "returns the numbers unrounded", words="1 part in a million"),
    Mutant("w3-06 efficiency rounded to 2 decimals", lambda c, n, b, loader: {
        **estimate_dp(c, n, b, loader), "efficiency": round(estimate_dp(c, n, b, loader)["efficiency"], 2)},
        "returns the numbers unrounded", words="to 2 decimals"),
    Mutant("w3-06 w61_efficiency_alone_compute_only", efficiency_alone_compute_only, "efficiency of one device is 1",
           words="by its compute alone"),
    Mutant("w3-06 w61_loader_in_seconds", _with(loader_fn=lambda batch, rate, m: batch / rate),
           "the loader caps the throughput", words="in seconds"),
]


@pytest.mark.parametrize("mutant", MUTANTS_6_1_W3, ids=repr)
def test_6_1_w3_06_mutants_rejected(mutant):
    rejected("6.1", mutant, SEEDS)


def test_6_1_w3_06_baseline_kept_between_calls():
    for seed in SEEDS[:2]:
        rejected("6.1", Mutant("w3-06 w61_efficiency_first_call_state", EfficiencyFirstCallState(),
                               "computes every call from its own arguments", words="an earlier call's one-device"),
                 [seed])


def test_6_1_w3_06_right_answers_pass():
    """Right by the contract: the upper median of chunk's pieces is the first piece; ties between the bounds
    are not defined by the spec (the loader named first among equals)."""
    upper = _with(device_fn=_piece_stat(lambda ch: sorted(ch)[len(ch) // 2]))

    def ties_loader_first(c, n, b, loader):
        out = estimate_dp(c, n, b, loader)
        return out
    passes("6.1", upper, SEEDS[:2])
    passes("6.1", ties_loader_first, SEEDS[:1])


def _gather_target_or_default(ts, device):
    """w3-06 w62_gather_target_from_output_device_int: `if not output_device` takes 0 for 'not given'."""
    return ts[0].device if not device else torch.device(device)


def _gather_default_current_cuda(ts, device):
    """w3-06 w62_gather_default_current_cuda: None means the current CUDA device, not the first output's."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else ts[0].device


class RemembersFirstN:
    """w3-06 w62_remembers_first_n: the first call's n_devices kept for every later call (fresh per seed)."""

    def __init__(self):
        self.n = None

    def __call__(self, inputs, n_devices, dim=0):
        self.n = self.n or n_devices
        return dp_scatter(inputs, self.n, dim)


MUTANTS_6_2_W3 = [
    Mutant("w3-06 w62_gather_target_from_output_device_int", (dp_scatter, make_gather(to=_gather_target_or_default)),
           "gathers onto output_device", words="output_device=0"),
    Mutant("w3-06 w62_gather_default_current_cuda", (dp_scatter, make_gather(to=_gather_default_current_cuda)),
           "gathers onto output_device", words="output_device=None"),
    Mutant("w3-06 w62_gather_copy_always", (dp_scatter, make_gather(join=lambda ts, d, target: torch.cat(
        [t.to(target, copy=True).view(1) if t.dim() == 0 and d == 0 else t.to(target, copy=True) for t in ts], d))),
        "copies each output once (torch.cat's copy)", words="copy=True"),
    Mutant("w3-06 outputs cloned before the join", (dp_scatter, make_gather(join=lambda ts, d, target: torch.cat(
        [t.to(target).clone().view(1) if t.dim() == 0 and d == 0 else t.to(target).clone() for t in ts], d))),
        "copies each output once (torch.cat's copy)", words=".clone()"),
]


@pytest.mark.parametrize("mutant", MUTANTS_6_2_W3, ids=repr)
def test_6_2_w3_06_mutants_rejected(mutant):
    rejected("6.2", mutant, SEEDS[:1])


def test_6_2_w3_06_state_and_labels():
    rejected("6.2", Mutant("w3-06 w62_remembers_first_n", (RemembersFirstN(), dp_gather),
                           "takes n_devices from every call", words="an earlier call's n_devices"), SEEDS[:1])
    # a nested output is named by its element, not as `'cuda'[0]`
    result = run_check("6.2", (dp_scatter, make_gather(pass_device=False)))
    assert result.status == "fail" and "'cuda'[" not in result.message and ", element 0" in result.message


def _mem_serial_from_three_devices(n, batch, **s):
    """w3-06 w63_serial_from_three_devices: `n <= 2 and one piece` taken for one device (passed 35 of 40 seeds)."""
    if n <= 2 and len(_chunks(batch, n)) == 1:
        return _memory(1, batch, **s)
    return _memory(n, batch, **s)


def test_6_3_w3_06_mutants_rejected():
    rejected("6.3", Mutant("w3-06 w63_serial_from_three_devices", _mem_serial_from_three_devices,
                           "two or more devices: a replica even for one piece", words="2 device(s), batch 1"), SEEDS)
    rejected("6.3", Mutant("w3-06 w63_floor_split", _mem(chunks_fn=_floor_rest_last),
                           "splits the batch like DataParallel", words="ceil(batch / n_devices)"), SEEDS[:2])
    rejected("6.3", Mutant("w3-06 w63_larger_of_act_and_grads", _mem(
        device0=lambda p, o, i, a, y, b, c0, on0: p + o + on0 * i + max(c0 * a + 2 * b * y, p),
        other=lambda p, o, i, a, y, b, c: p + c * i + max(c * a, p)),
        "device 0 holds the state, its input and its peak", words="counted together"), SEEDS[:2])


def test_6_2_w3_06_synchronize_named():
    def join(ts, d, target):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return torch.cat([t.to(target).view(1) if t.dim() == 0 and d == 0 else t.to(target) for t in ts], d)
    rejected("6.2", Mutant("w3-06 w62_gather_synchronize_first", (dp_scatter, make_gather(join=join)),
                           "gathers on the device, nothing through the host", words="torch.cuda.synchronize()"),
             SEEDS[:1])
