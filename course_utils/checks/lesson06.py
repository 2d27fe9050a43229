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
import dataclasses
import gc
import math
import numbers
import statistics
import types
import weakref

import torch

from .. import scaling
from ._core import CheckFailed, Tripwire, WrongType, exercise, expect_callable, trusted
from ._util import fresh_rng
from .virtual_cuda import VirtualCuda
from torch.overrides import TorchFunctionMode

__all__ = ["reference_scatter", "reference_gather"]


def _seeded(seed) -> tuple:
    """`fresh_rng()`, or the generator of the seed a learner passes (`check("6.1", estimate_dp, seed=N)` reruns
    the inputs of a line that printed '(seed N)')."""
    if seed is None:
        return fresh_rng()
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2 ** 64:
        raise WrongType("takes a seed", f"the check's seed= takes a whole number from 0 on, as a line prints it "
                        f"('(seed 1234)': seed=1234), not {seed!r}; leave it out for fresh inputs")
    return fresh_rng(int(seed))


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
_COST_FIELDS = [f.name for f in dataclasses.fields(scaling.StageCosts) if f.name != "notes"]


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
        device0_ms=float(rng.uniform(0.1, 2.0)), host_step_ms=float(rng.uniform(0.5, 5.0)),
        host_ms_per_replica=float(rng.uniform(0.05, 0.6)))
    values.update(fixed)
    return scaling.StageCosts(**values)


# What earlier checks in this process asked (the same devices, batch and loader: the model's answer): a cache
# the learner's code kept from an earlier run of the check answers this run's call with one of them (w6-06)
_ASKED_61: dict = {}
_ASKED_63: dict = {}

_ONE_AT_A_TIME = ("compute_fixed_ms", "compute_per_sample_ms", "scatter_ms_per_sample", "gather_ms_per_sample",
                  "replicate_ms", "reduce_ms", "device0_ms", "host_step_ms", "host_ms_per_replica")


def _describe_case(costs, n, batch, loader) -> str:
    loader_text = "an unlimited loader" if math.isinf(loader) else f"a loader of {loader:,.0f} samples/s"
    return f"{n} device(s), batch {batch}, {loader_text}"


def _array_split(batch, n):
    q, r = divmod(batch, n)
    return [q + 1 if k < r else q for k in range(n) if (q + 1 if k < r else q) > 0]


def _first_plus_one(batch, n):
    first = batch // n + 1
    return [min(first, batch - k * first) for k in range(math.ceil(batch / first))]


_SPLITS = {"np.array_split's sizes": _array_split,
           "batch // n_devices + 1 per piece": _first_plus_one,
           "batch // n_devices per piece, the rest to the last": lambda b, n: (
               [b // n] * (n - 1) + [b - (b // n) * (n - 1)] if b >= n else [1] * b),
           "torch.tensor_split's sizes (n_devices pieces, empty ones too)": lambda b, n: [
               (b // n + (1 if k < b % n else 0)) for k in range(n)]}


def _times(c, n, batch, loader, *, devices_stat=None, host_rule="right", serial_rule="pieces", add=False,
           split=None, piece="first", serial_piece="first", device0="always", leaving="rest", count="batch",
           loader_unit=1e3, loader_samples="batch", drop=None, gathered="rest"):
    """(samples/s, bound) of the model or of one of its near misses, named by the keywords."""
    chunks = scaling.dp_chunk_sizes(batch, n) if split is None else split(batch, n)
    if not chunks or not chunks[0]:
        return math.nan, "devices"
    pace = {"first": chunks[0], "mean": batch / len(chunks), "last": chunks[-1],
            "median": statistics.median(chunks), "median_low": statistics.median_low(chunks)}
    left = ((batch - pace[serial_piece]) if leaving == "rest" else (len(chunks) - 1) * chunks[0])
    serial = ((0.0 if drop == "replicate" else c.replicate_ms) + (0.0 if drop == "reduce" else c.reduce_ms)
              + left * c.scatter_ms_per_sample + (batch if gathered == "batch" else left) * c.gather_ms_per_sample)
    pays_serial = len(chunks) > 1 if serial_rule == "pieces" else n > 1
    own = c.device0_ms if device0 == "always" or (device0 == "one_piece" and len(chunks) == 1) else 0.0
    if devices_stat is None:
        device = c.compute_ms(pace[piece]) + own
    else:
        device = devices_stat([c.compute_ms(chunks[0]) + c.device0_ms] + [c.compute_ms(k) for k in chunks[1:]])
    device += serial if pays_serial else 0.0
    replicas = {"n_devices": n if n > 1 else 0, "always": len(chunks),
                "one_fewer": len(chunks) - 1 if n > 1 else 0,
                "pieces_only": len(chunks) if len(chunks) > 1 else 0}.get(host_rule, len(chunks) if n > 1 else 0)
    if device0 == "host":      # device 0's own work charged to the host
        host_extra = c.device0_ms
    else:
        host_extra = 0.0
    host = {"no_launch": c.host_ms_per_replica * replicas,
            "launch_per_replica": ((c.host_step_ms + c.host_ms_per_replica) * replicas if replicas
                                   else c.host_step_ms)}.get(
        host_rule, c.host_step_ms + c.host_ms_per_replica * replicas) + host_extra
    loaded = chunks[0] if loader_samples == "first" else batch
    load = loader_unit * loaded / loader if math.isfinite(loader) else 0.0
    times = {"loader": load, "host": host, "devices": device}
    step = sum(times.values()) if add else max(times.values())
    samples = chunks[0] * len(chunks) if count == "padded" else batch
    return 1e3 * samples / step, max(times, key=times.get)


# named near misses of samples/s: (keywords for _times, or a function of the right value; the sentence)
_SPEED_MISSES = (
    (dict(add=True), "yours adds the devices', the host's and the loader's times: the three work at the same time "
                     "(the host runs ahead of the devices, the loader's workers ahead of the host), so a step takes "
                     "the longest of them, not their sum"),
    ("per_device", "yours is the samples/s of one device: samples_per_s is the whole run's (every device's pieces)"),
    (dict(devices_stat=statistics.mean), "yours takes the mean{or_median} of the devices' times: a step waits for "
                                         "the slowest device, device 0 (the largest piece, and its own work)"),
    (dict(devices_stat=statistics.median), "yours takes the median of the devices' times: a step waits for the "
                                           "slowest device, device 0 (the largest piece, and its own work)"),
    (dict(serial_rule="n_devices"), "yours charges replicate, reduce, scatter and gather whenever n_devices >= 2: "
                                    "they move bytes only when two or more devices get a piece (a batch of one "
                                    "sample is one piece, on device 0)"),
    (dict(host_rule="n_devices"), "yours charges host_ms_per_replica for every device: DataParallel makes one "
                                  "replica per piece, and a small batch makes fewer pieces than devices (here "
                                  "{pieces} pieces on {n} devices)", "one replica per piece"),
    (dict(host_rule="always"), "yours charges host_ms_per_replica with one device: with one device DataParallel "
                               "calls the model directly, no replica"),
    (dict(host_rule="pieces_only"), "yours charges no replica when the batch makes one piece: with two or more "
                                    "devices DataParallel replicates onto every device that gets a piece, device 0 "
                                    "included, even when it is the only one"),
    (dict(host_rule="one_fewer"), "yours charges host_ms_per_replica for one replica fewer than the pieces ({pieces}"
                                  " pieces here, so {pieces} replicas): DataParallel's replicate builds a new module "
                                  "for every device that gets a piece, device 0's included (replica 0 shares the "
                                  "model's parameters, but the host builds and launches it as it does the others)",
     "the host launches the step once and works for every replica"),
    (dict(host_rule="no_launch"), "yours leaves out host_step_ms: the host launches every kernel of the step "
                                  "(host_step_ms, once per step) besides its work per replica"),
    (dict(piece="mean"), "yours times the devices by the mean piece (batch / pieces = {mean:g} samples here): a "
                         "step waits for the slowest device, device 0, with the first, largest piece ({first} samples) "
                         "and its own work", "the slowest device sets the pace"),
    (dict(piece="median", serial_piece="median"), "yours times the devices by the median piece ({median_piece:g} "
                                                  "samples here): a step waits for the slowest device, device 0, "
                                                  "with the first, largest piece ({first} samples) and its own work, "
                                                  "and the samples that leave device 0 are batch - the first piece",
     "the slowest device sets the pace"),
    (dict(piece="median"), "yours times the devices by the median piece ({median_piece:g} samples here): a step "
                           "waits for the slowest device, device 0, with the first, largest piece ({first} samples) "
                           "and its own work", "the slowest device sets the pace"),
    (dict(piece="last", serial_piece="last"), "yours times the devices by the last piece ({last} samples here{also_low}): a "
                                              "step waits for the slowest device, device 0, with the first, largest "
                                              "piece ({first} samples), and the samples that leave device 0 are "
                                              "batch - the first piece", "the slowest device sets the pace"),
    (dict(piece="last"), "yours times the devices by the last piece ({last} samples here{also_low}): a step waits for the "
                         "slowest device, device 0, with the first, largest piece ({first} samples)",
     "the slowest device sets the pace"),
    (dict(piece="median_low"), "yours times the devices by the lower median of the pieces ({low_piece} samples here):"
                               " a step waits for the slowest device, device 0, with the first, largest piece "
                               "({first} samples) and its own work", "the slowest device sets the pace"),
    (dict(loader_samples="first"), "yours times the loader for the first piece only ({first} samples here): the "
                                   "loader prepares the whole batch ({batch} samples) every step, before scatter "
                                   "splits it, so it needs 1000 x batch / loader_samples_per_s ms per step, however "
                                   "many devices share the batch", "the loader caps the throughput"),
    (dict(loader_unit=1.0), "yours counts the loader's time in seconds (batch / loader_samples_per_s) beside times "
                            "in ms: the stage costs are in ms, so the loader needs 1000 x batch / "
                            "loader_samples_per_s ms per batch", "the loader caps the throughput"),
    (dict(device0="host"), "yours charges device0_ms to the host: it is device 0's own work on the GPU (the loss on "
                           "the gathered outputs, the optimizer step), on top of its piece, every step; the host "
                           "only launches it (host_step_ms)", "device 0's own work every step"),
    (dict(drop="reduce"), "yours leaves out reduce_ms: with two or more pieces the replicas' gradients are summed "
                          "onto device 0 every step (replicate + reduce, once each)",
     "pays the serial stages once per step"),
    (dict(drop="replicate"), "yours leaves out replicate_ms: with two or more pieces the model is copied to every "
                             "device that gets a piece every step (replicate + reduce, once each)",
     "pays the serial stages once per step"),
    (dict(gathered="batch"), "yours gathers all {batch} samples' outputs: device 0's own piece stays where it is, so "
                             "gather moves only the outputs of the samples that left device 0 (batch - the first "
                             "piece = {rest}), as scatter does",
     "scatters and gathers the samples that leave device 0"),
    (dict(device0="one_piece"), "yours leaves out device0_ms when two or more devices work: device 0 does its own "
                                "work (the loss on the gathered outputs, the optimizer step) every step, on top of "
                                "its piece, however many devices share the batch", "device 0's own work every step"),
    (dict(device0="never"), "yours leaves out device0_ms: device 0 does its own work (the loss on the gathered "
                            "outputs, the optimizer step) every step, on top of its piece"),
    (dict(leaving="pieces"), "yours scatters and gathers {padded_rest} samples here ((pieces - 1) x the first piece, "
                             "or batch - the last piece): the samples that leave device 0 are batch - the first piece "
                             "({rest}), the last piece being smaller", "scatters and gathers the samples that leave device 0"),
    (dict(count="padded"), "yours counts the first piece x the pieces ({padded} samples here) per step: the last "
                           "piece is smaller, and a step trains on the batch's {batch} samples",
     "counts the batch's samples"),
    (dict(host_rule="launch_per_replica"), "yours pays host_step_ms for every replica: the step's launches are "
                                           "paid once (the backward's kernels are launched by one autograd thread "
                                           "per device, side by side); each replica adds host_ms_per_replica"),
)


def _named_speed_miss(yours: float, c, n, batch, loader, expected: float) -> str:
    def matches(value):
        return (not math.isnan(value) and not trusted.isclose(value, expected, rel_tol=1e-6)
                and trusted.isclose(yours, value, rel_tol=1e-6))

    chunks = scaling.dp_chunk_sizes(batch, n)
    numbers_here = dict(n=n, batch=batch, pieces=len(chunks), first=chunks[0], last=chunks[-1],
                        mean=round(batch / len(chunks), 2), rest=batch - chunks[0],
                        padded_rest=(len(chunks) - 1) * chunks[0], padded=chunks[0] * len(chunks),
                        median_piece=statistics.median(chunks), low_piece=statistics.median_low(chunks),
                        also_low=(", also the pieces' lower median" if statistics.median_low(chunks) == chunks[-1]
                                  and len(chunks) > 1 else ""))
    found, prop = [], None        # the first mistake of the model's terms and the first of the split, if any
    for rule, sentence, *own_prop in _SPEED_MISSES:
        value = expected / n if rule == "per_device" else _times(c, n, batch, loader, **rule)[0]
        if rule == dict(device0="host") and matches(_times(c, n, batch, loader, device0="one_piece")[0]):
            continue              # left out only when split gives this number too: that entry names it
        if matches(value):
            if rule == dict(loader_samples="first") and matches(_times(c, n, batch, loader, loader_unit=1.0)[0]):
                sentence = ("yours charges the loader too little: either it times the first piece only ({first} "
                            "samples here) or it counts the loader's time in seconds (batch / loader_samples_per_s) "
                            "beside times in ms, which give the same number here: the loader prepares the whole "
                            "batch ({batch} samples) every step, before scatter splits it, so it needs 1000 x batch "
                            "/ loader_samples_per_s ms per step")
            if rule == dict(device0="host") and matches(_times(c, n, batch, loader, device0="never")[0]):
                sentence = ("yours leaves device0_ms out of device 0's time: left out, or charged to the host (the "
                            "two give the same number here, where the host's time stays below the devices'): it is "
                            "device 0's own work on the GPU (the loss on the gathered outputs, the optimizer step), "
                            "on top of its piece, every step")
                own_prop = []
            median = _times(c, n, batch, loader, devices_stat=statistics.median)[0]
            found.append(sentence.format(or_median=" (here also the median)" if trusted.isclose(median, value)
                                         else "", **numbers_here))
            prop = own_prop[0] if own_prop else None
            break
    for name, split in _SPLITS.items():
        if matches(_times(c, n, batch, loader, split=split)[0]):
            text = (f"yours splits the batch into {name}: DataParallel's tensor.chunk makes pieces of "
                    f"ceil(batch / n_devices) = {math.ceil(batch / n)} here, the last one smaller "
                    f"({scaling.dp_chunk_sizes(batch, n)})")
            if prop == "one replica per piece":   # always the same number: n pieces, n replicas
                found[-1] = (f"yours makes {len(split(batch, n))} replicas for {len(chunks)} pieces: either it "
                             f"charges host_ms_per_replica for every device, or it splits the batch into {name} "
                             f"({len(split(batch, n))} pieces, one replica each); DataParallel's tensor.chunk makes "
                             f"{len(chunks)} pieces here ({chunks}), one replica per piece")
            elif found:           # two mistakes that give the same number here: both named, the model's term first
                found.append("or " + text)
                prop = None
            else:
                found.append(text)
            break
    return "; ".join(found), prop


def _named_efficiency_miss(yours: float, c, n, batch, loader, expected: dict) -> str:
    if n == 1:
        run = expected["samples_per_s"]
        bare = 1e3 * batch / c.compute_ms(batch)
        if trusted.isclose(yours, run / bare, rel_tol=1e-6):
            return (f"yours times the one-device baseline by its compute alone (compute_fixed_ms + "
                    f"compute_per_sample_ms x the piece): the baseline is one device training alone, so it pays "
                    f"what that run pays, device0_ms, the host's launches (host_step_ms) and the loader too; with one "
                    f"device it is this very run, so efficiency is 1 (yours {yours:.4f})")
        return (f"with one device the run is its own baseline: one device alone on the first piece, which is the "
                f"whole batch, is this very run, so efficiency is 1 (yours {yours:.4f}: your one-device baseline "
                "is not timed like the run: the same compute, device0_ms, host_step_ms and loader, at batch "
                "ceil(batch_size / n_devices))")
    first = scaling.dp_chunk_sizes(batch, n)[0]
    speed = expected["samples_per_s"]
    pieces = len(scaling.dp_chunk_sizes(batch, n))
    alone = scaling.predict_dp(c, 1, first, loader).samples_per_s
    misses = (
        (speed / (n * scaling.predict_dp(c, 1, first, loader * first / batch).samples_per_s),
         f"yours charges the one-device baseline's loader for the whole global batch ({batch} samples): the baseline "
         f"is one device training alone on the first piece's batch ({first} samples), so its loader prepares that "
         f"batch, 1000 x {first} / loader_samples_per_s ms per step"),
        (speed / (n * scaling.predict_dp(c, 1, batch, loader).samples_per_s),
         "yours compares with one device on the whole global batch: the baseline is one device training alone "
         "on the first piece's batch (n_devices of them side by side)"),
        (speed / (n * scaling.predict_dp(c, 1, first).samples_per_s),
         "yours runs the one-device baseline with an unlimited loader: it trains from the same loader"),
        (speed / (pieces * alone), "yours divides by the pieces, not by n_devices: devices left without a piece "
                                   "count against the efficiency too"),
        (speed / alone, "yours is the speed-up over one device: efficiency divides it by n_devices"),
        (speed / (n * _alone(c, batch / n, loader)),
         f"yours runs the one-device baseline on batch / n_devices ({batch / n:.4g} samples here): the baseline is one "
         f"device training alone on the first piece's batch ({first} samples, ceil(batch / n_devices)), the largest "
         "piece, which sets the run's pace"),
        (speed / (n * _alone(c, first, loader, replicas=1)),
         "yours gives the one-device baseline a replica's host work (host_ms_per_replica): one device training alone "
         "runs the model directly, no DataParallel, no replica"),
        (speed / (n * _times(c, n, first, loader, host_rule="n_devices")[0]),
         "yours gives the one-device baseline n_devices replicas' host work: one device alone runs no replica"),
    )
    found = [sentence for value, sentence in misses
             if not trusted.isclose(value, expected["efficiency"], rel_tol=1e-6)
             and trusted.isclose(yours, value, rel_tol=1e-6)]
    if len(found) > 1:          # two mistakes that give the same number here: both named
        return "either " + "; or ".join(found)
    return found[0] if found else ""


def _alone(c, piece, loader, replicas=0) -> float:
    """Samples/s of one device alone on `piece` samples (a float for a near miss), with `replicas` replicas' host work."""
    times = (c.compute_fixed_ms + c.compute_per_sample_ms * piece + c.device0_ms,
             c.host_step_ms + c.host_ms_per_replica * replicas, 1e3 * piece / loader if math.isfinite(loader) else 0.0)
    return 1e3 * piece / max(times)


def _baseline(costs, n, batch, loader) -> float:
    """The samples/s of one device training alone on the first piece, from the same loader."""
    return scaling.predict_dp(costs, 1, scaling.dp_chunk_sizes(batch, n)[0], loader).samples_per_s


def _rounded(yours: float, expected: float) -> str | None:
    """How `yours` is `expected` cut short: 'rounded to 2 decimals', 'truncated to a whole number (int() ...)',
    'rounded up ...' (None if it is neither). Truncation (float(int(x)), math.floor) is off by up to a whole
    unit, so it is told by the digits, not by the distance (w7-06: it read as a wrong one-device formula)."""
    if trusted.isclose(yours, expected, rel_tol=1e-6) or not math.isfinite(expected):
        return None
    for digits in range(0, 5):
        scale = 10 ** digits
        places = "a whole number" if digits == 0 else f"{digits} decimal{'' if digits == 1 else 's'}"
        if abs(yours - expected) <= 0.5 * 10 ** -digits + 1e-12 and trusted.isclose(yours, round(yours, digits)):
            cut = math.trunc(expected * scale) / scale
            if trusted.isclose(yours, cut, rel_tol=1e-12):
                return f"rounded or truncated to {places} (the two give the same number here)"
            return f"rounded to {places}"
        if not 10 <= abs(expected * scale) < 2 ** 52:     # a cut that keeps two digits or more: 1.0 for 0.13
            continue                                      # is another mistake, not math.ceil
        for how, cut in (("truncated", math.trunc), ("rounded up", math.ceil)):
            if trusted.isclose(yours, cut(expected * scale) / scale, rel_tol=1e-12, abs_tol=1e-12):
                tool = (" (int() and math.floor cut the fraction off)" if how == "truncated" and digits == 0
                        else " (math.ceil)" if digits == 0 else "")
                return f"{how} to {places}{tool}"
    return None


_ROUNDING = ("returns the numbers unrounded",
             "the check compares samples_per_s and efficiency with the model's to 1 part in a million: return "
             "them as computed (no round(), int(), math.floor or math.ceil) and round only where you print them")


def _compare_estimate(estimate, costs, n, batch, loader, tripwire, props, earlier=None, history=()):
    where = _describe_case(costs, n, batch, loader)
    value = _call(estimate, tripwire, "computes the estimate itself",
                  "that is the course's own model, which the lesson uses for its plots",
                  "write the model from the stage costs with plain arithmetic", costs, n, batch, loader)
    yours = _read_estimate(value, where)
    expected = _expected_dp(costs, n, batch, loader)
    speed_prop, eff_prop, bound_prop = props
    if not trusted.isclose(yours["samples_per_s"], expected["samples_per_s"], rel_tol=1e-6):
        earlier = [] if earlier is None else earlier if isinstance(earlier, list) else [earlier]
        stale = any(trusted.isclose(yours["samples_per_s"], e["samples_per_s"], rel_tol=1e-9) for e in earlier)
        if not stale:           # the same call with every stage cost 1.7 times larger: does the answer move?
            other = scaling.StageCosts(**{f: getattr(costs, f) * (1.7 if f != "forward_share" else 1.0)
                                          for f in _COST_FIELDS})
            again = _call(estimate, tripwire, "computes the estimate itself",
                          "that is the course's own model, which the lesson uses for its plots",
                          "write the model from the stage costs with plain arithmetic", other, n, batch, loader)
            stale = (isinstance(again, collections.abc.Mapping) and again.get("samples_per_s") == value["samples_per_s"]
                     and not trusted.isclose(_expected_dp(other, n, batch, loader)["samples_per_s"],
                                             expected["samples_per_s"], rel_tol=1e-6))
        cut = _rounded(yours["samples_per_s"], expected["samples_per_s"])
        if cut is not None and not stale:
            raise CheckFailed(_ROUNDING[0], f"{where}: yours {yours['samples_per_s']!r} samples/s, expected "
                              f"{expected['samples_per_s']!r}: yours is the model's number {cut}", _ROUNDING[1])
        if stale:
            raise CheckFailed("computes every call from its own arguments",
                              f"{where}: yours {yours['samples_per_s']:,.2f} samples/s (expected "
                              f"{expected['samples_per_s']:,.2f}), and the same answer again with other stage costs",
                              "keep nothing between calls: a cache keyed on some of the arguments answers a call "
                              "whose other arguments changed with a stale result")
        named, own_prop = _named_speed_miss(yours["samples_per_s"], costs, n, batch, loader, expected["samples_per_s"])
        raise CheckFailed(own_prop or speed_prop, f"{where}: yours {yours['samples_per_s']:,.2f} samples/s, "
                          f"expected {expected['samples_per_s']:,.2f}", named or _speed_hint(speed_prop))
    if not trusted.isclose(yours["efficiency"], expected["efficiency"], rel_tol=1e-6):
        cut = _rounded(yours["efficiency"], expected["efficiency"])
        if cut is not None:
            raise CheckFailed(_ROUNDING[0], f"{where}: efficiency: yours {yours['efficiency']!r}, expected "
                              f"{expected['efficiency']!r}: yours is the model's number {cut}", _ROUNDING[1])
        alone = _baseline(costs, n, batch, loader)
        if any(not trusted.isclose(b, alone, rel_tol=1e-6) and trusted.isclose(
                yours["efficiency"], expected["samples_per_s"] / (n * b), rel_tol=1e-6) for b in history):
            raise CheckFailed("computes every call from its own arguments",
                              f"{where}: efficiency: yours {yours['efficiency']:.4f}, expected "
                              f"{expected['efficiency']:.4f}: yours divides by an earlier call's one-device "
                              "samples/s",
                              "keep nothing between calls: a baseline (one device's samples/s) kept from the first "
                              "call answers every later call with that call's baseline; compute it from this call's "
                              "costs, first piece and loader")
        named = _named_efficiency_miss(yours["efficiency"], costs, n, batch, loader, expected)
        raise CheckFailed(eff_prop, f"{where}: yours {yours['efficiency']:.4f}, expected {expected['efficiency']:.4f}",
                          named or "efficiency = samples/s / (n_devices x the samples/s of one device training "
                          "alone on the first piece's batch, from the same loader)")
    if yours["bound"] != expected["bound"]:
        raise CheckFailed(bound_prop, f"{where}: yours {yours['bound']!r}, expected {expected['bound']!r}",
                          "the bound is whichever of loader, host and devices needs the most time per step")
    return yours


def _speed_hint(prop: str) -> str:
    return {
        "one device: batch / (compute + device-0 work)":
            "with one device DataParallel is a pass-through: compute(B) + device0_ms per step on the device",
        "one device: the longer of its launches and its work":
            "with one device DataParallel calls the model directly: the host's time is host_step_ms (the step's "
            "launches), with no host_ms_per_replica, and the step takes the longer of that and the device's time",
        "splits the batch like DataParallel":
            "pieces of ceil(B / n) samples, the last smaller; the slowest device has the first piece, and "
            "only the pieces that exist get a replica",
        "pays the serial stages once per step":
            "replicate + reduce once when two or more devices get a piece; scatter + gather for the "
            "B - first_piece samples that leave device 0",
        "pays the serial stages only when two or more devices work":
            "a batch of one sample is one piece: DataParallel replicates onto device 0 alone and reduces there, "
            "but no bytes cross a link, so no replicate_ms, reduce_ms, scatter or gather",
        "the host launches the step once and works for every replica":
            "host time per step = host_step_ms + host_ms_per_replica x the number of replicas (one per piece) "
            "with two or more devices; the step takes the longest of devices, host and loader",
        "two or more devices: a replica even for one piece":
            "with two or more devices DataParallel replicates onto every device that gets a piece: one sample on "
            "four devices still costs the host one replica",
        "the loader caps the throughput":
            "the loader needs 1000 x batch / loader_samples_per_s ms per batch (the stage costs are in ms), "
            "whatever the devices do",
    }.get(prop, "the step takes max(device time, host time, loader time); samples/s = batch / that")


@exercise("6.1", "A scaling estimator: samples/s and efficiency of DataParallel on N devices", points=2)
def check_scaling_estimator(estimate_dp, *, seed=None):
    expect_callable(estimate_dp, "a function estimate_dp(costs, n_devices, batch_size, loader_samples_per_s)")
    rng, seed = _seeded(seed)
    trip = _course_tripwire(scaling.predict_dp, scaling._device_ms, scaling.host_ms)
    inf = math.inf
    count = 0

    answers, efficiencies = {}, []

    def case(costs, n, batch, loader, props):
        nonlocal count
        count += 1
        key = (n, batch, loader)           # the same devices, batch and loader again: with other costs
        earlier = answers.get(key, []) + _ASKED_61.get(key, [])
        answers.setdefault(key, []).append(_compare_estimate(estimate_dp, costs, n, batch, loader, trip, props,
                                                             earlier, efficiencies))
        if len(_ASKED_61) < 20_000:
            _ASKED_61.setdefault(key, []).append(_expected_dp(costs, n, batch, loader))
        efficiencies.append(_baseline(costs, n, batch, loader))
        return answers[key][-1]

    one = ("one device: batch / (compute + device-0 work)", "efficiency of one device is 1", "names what bounds the run")
    # one device, unlimited loader, no host cost: compute + device 0's work
    c = _costs(rng, host_step_ms=0.0, host_ms_per_replica=0.0)
    for batch in (int(rng.integers(1, 300)), int(rng.integers(300, 2000))):
        case(c, 1, batch, inf, one)
    # one device, launch-bound: the step's launches, and no replica (a pass-through)
    c = _costs(rng, compute_per_sample_ms=0.001, host_step_ms=float(rng.uniform(20, 40)),
               host_ms_per_replica=float(rng.uniform(20, 40)))
    case(c, 1, int(rng.integers(2, 300)), inf, ("one device: the longer of its launches and its work",) + one[1:])
    # the serial stages (even splits): expensive links, cheap compute, no host cost
    c = _costs(rng, host_step_ms=0.0, host_ms_per_replica=0.0, compute_per_sample_ms=0.001, scatter_ms_per_sample=0.05,
               replicate_ms=float(rng.uniform(5, 10)), reduce_ms=float(rng.uniform(5, 10)))
    serial = ("pays the serial stages once per step", "efficiency compares with one device alone",
              "names what bounds the run")
    for n in (2, int(rng.integers(3, 9))):
        case(c, n, n * int(rng.integers(20, 200)), inf, serial)
    # a host-bound run (even split): the step's launches and Python work per replica beat the devices
    c = _costs(rng, host_step_ms=float(rng.uniform(5, 15)), host_ms_per_replica=float(rng.uniform(20, 40)))
    host = ("the host launches the step once and works for every replica", "efficiency compares with one device alone",
            "names what bounds the run")
    for n in (2, int(rng.integers(3, 9))):      # 2 devices on every seed: 'n > 2' for 'two or more' fails there
        case(c, n, n * int(rng.integers(4, 30)), inf, host)
    # uneven splits, and fewer pieces than devices, bound by the devices and by the host
    n = int(rng.integers(4, 9))
    for replica_ms in (0.0, float(rng.uniform(20, 40))):
        c = _costs(rng, host_ms_per_replica=replica_ms, host_step_ms=0.0 if replica_ms == 0 else 1.0)
        # a remainder below n - 1: the last piece is then smaller than batch // n_devices, so a last-piece pace
        # and a floor split give different numbers
        for batch in (n * int(rng.integers(5, 40)) + int(rng.integers(1, n - 1)), n + 1, n - 1, n - 2):
            case(c, n, batch, inf, ("splits the batch like DataParallel", "efficiency compares with one device alone",
                                    "names what bounds the run"))
        if replica_ms == 0:    # two uneven pieces, bound by the devices: a median of the pieces is not the first
            case(c, 2, 2 * int(rng.integers(5, 40)) + 1, inf, ("splits the batch like DataParallel",
                                                              "efficiency compares with one device alone",
                                                              "names what bounds the run"))
    # a batch of one sample on two or more devices: one piece, a replica on device 0, no bytes across a link
    c = _costs(rng, host_step_ms=float(rng.uniform(5, 15)), host_ms_per_replica=float(rng.uniform(20, 40)))
    case(c, int(rng.integers(2, 9)), 1, inf, ("two or more devices: a replica even for one piece",) + host[1:])
    c = _costs(rng, host_step_ms=0.0, host_ms_per_replica=0.0, compute_per_sample_ms=0.001,
               replicate_ms=float(rng.uniform(5, 10)), reduce_ms=float(rng.uniform(5, 10)))
    case(c, int(rng.integers(2, 9)), 1, inf, ("pays the serial stages only when two or more devices work",)
         + serial[1:])
    # a loader-bound run: N devices fed by a loader that one device already saturates
    c = _costs(rng, host_step_ms=0.0, host_ms_per_replica=0.0)
    n, batch = int(rng.integers(2, 9)), int(rng.integers(64, 1024))
    alone = scaling.predict_dp(c, 1, scaling.dp_chunk_sizes(batch, n)[0]).samples_per_s
    together = scaling.predict_dp(c, n, batch).samples_per_s
    case(c, n, batch, float(min(alone, together) * rng.uniform(0.3, 0.9)),
         ("the loader caps the throughput", "efficiency compares with one device alone, same loader",
          "names what bounds the run"))
    # the same devices, batch and loader twice, with other stage costs: nothing kept between calls (as in the
    # uneven group, whose two halves ask the same batches)
    n, batch, loader = int(rng.integers(2, 9)), int(rng.integers(64, 1024)), float(rng.uniform(500, 200_000))
    fresh = ("matches the model on fresh costs", "efficiency compares with one device alone", "names what bounds the run")
    case(_costs(rng), n, batch, loader, fresh)
    case(_costs(rng, host_step_ms=float(rng.uniform(6, 9))), n, batch, loader, fresh)
    # one stage cost at a time, as the lesson's what-ifs change them (w6-06: a cache keyed on id(costs) or on one
    # or two cost fields answered host_ms_per_replica=0 with the measured run's 39,844 samples/s, not 87,521):
    # each call is the same costs with one field changed, then the same object changed in place
    n, batch = int(rng.integers(2, 9)), 0
    batch = n * int(rng.integers(8, 64)) + int(rng.integers(0, n))
    base = _costs(rng)
    case(base, n, batch, inf, fresh)
    seen = [_expected_dp(base, n, batch, inf)["samples_per_s"]]
    for name in _ONE_AT_A_TIME:
        for factor in (0.0, 4.0, 20.0, 100.0):
            one = dataclasses.replace(base, **{name: getattr(base, name) * factor})
            speed = _expected_dp(one, n, batch, inf)["samples_per_s"]
            if all(abs(speed - s) > 0.02 * s for s in seen):
                seen.append(speed)
                case(one, n, batch, inf, fresh)
                break
    for name in _ONE_AT_A_TIME:               # the same object, one field changed in place
        before = getattr(base, name)
        setattr(base, name, before * 50.0)
        speed = _expected_dp(base, n, batch, inf)["samples_per_s"]
        if all(abs(speed - s) > 0.02 * s for s in seen):
            case(base, n, batch, inf, fresh)
            break
        setattr(base, name, before)
    # fresh mixtures of everything
    for _ in range(40):
        c = _costs(rng)
        n = int(rng.integers(1, 17))
        batch = int(rng.integers(1, 4096))
        loader = inf if rng.random() < 0.3 else float(rng.uniform(500, 200_000))
        case(c, n, batch, loader, fresh)
    return f"all properties hold on {count} configurations (seed {seed})."


# -- 6.2 scatter and gather exactly as DataParallel does -----------------------------------------------

class _ChunkLeaf:
    """What `torch._C._scatter` does to one tensor (torch/csrc/cuda/comm.cpp, `scatter`):
    `tensor.chunk(len(devices), dim)`, then each piece `.to()` its GPU, which does not copy the
    piece already on its device. Here every device is the input's own device."""

    @staticmethod
    def apply(target_gpus, chunk_sizes, dim, tensor):
        return tensor.chunk(len(target_gpus), dim)


_FIRST = "the first output's device"      # dp_gather's default output_device (None)


class _CatLeaf:
    """What `Gather.apply` does to the outputs' tensors (torch/nn/parallel/_functions.py and
    torch/csrc/cuda/comm.cpp, `gather`): 0-dim tensors gathered on dim 0 become 1-element
    vectors, then all are concatenated along `dim` on the target device (DataParallel's
    `output_device`; here, by default, the first output's device)."""

    @staticmethod
    def apply(target_device, dim, *tensors):
        target = tensors[0].device if target_device is _FIRST else torch.device(target_device)
        if all(t.dim() == 0 for t in tensors) and dim == 0:
            tensors = [t.view(1) for t in tensors]
        return torch.cat([t.to(target) for t in tensors], dim)


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


def reference_gather(outputs, dim: int = 0, output_device=None):
    """torch's own `torch.nn.parallel.gather(outputs, output_device, dim)`, onto `output_device`
    (by default the first output's device, where DataParallel's device_ids[0] puts replica 0's)."""
    import warnings
    with _torch_recursion_here() as sg, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sg.gather(outputs, _FIRST if output_device is None else output_device, dim)


_Batch = collections.namedtuple("Batch", ["images", "labels"])


def _torch_parallel_tripwire() -> _Tripwire:
    return _Tripwire(codes=[reference_scatter.__code__, reference_gather.__code__, _ChunkLeaf.apply.__code__,
                            _CatLeaf.apply.__code__],
                     files=("torch/nn/parallel/scatter_gather.py", "torch/nn/parallel/_functions.py",
                            "torch/nn/parallel/comm.py", "torch/cuda/comm.py", "torch/nn/parallel/data_parallel.py"),
                     c_names=("_scatter", "_scatter_out", "_gather", "_gather_out"))


_NO_TORCH_PARALLEL = (
    "uses tensor operations, not torch.nn.parallel",
    "DataParallel's own scatter and gather work on CUDA tensors only (on a CPU they raise), and the exercise is "
    "to see what they do",
    "split with torch.chunk, join with torch.cat, and recurse into tuples, lists and dicts")

_DIM_HINT = ("pass dim down the recursion: a tensor inside a tuple, list or dict is split or joined along the same "
             "dim as a bare one")
_EVERY_DEVICE = ("anything that is not a tensor or a non-empty tuple, list or dict goes to every device as it is: "
                 "n_devices entries, each the very same object (an empty container is not walked: it is shared "
                 "like a number)")


def _kind(obj) -> str:
    if isinstance(obj, torch.Tensor):
        return f"a tensor of shape {tuple(obj.shape)}"
    return f"a {type(obj).__name__}"


def _has_tensor(obj) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        return any(_has_tensor(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return any(_has_tensor(v) for v in obj)
    return False


def _count_hint(inputs) -> str:
    if not _has_tensor(inputs):
        return _EVERY_DEVICE
    shares = isinstance(inputs, (tuple, list, dict)) and any(
        not _has_tensor(v) for v in (inputs.values() if isinstance(inputs, dict) else inputs))
    return ("tensor.chunk(n) makes fewer than n pieces when ceil(size / n) x (n - 1) >= size; a device with no "
            "piece gets no replica and no entry; when the elements of a tuple split into different numbers of "
            "pieces, the shortest wins, as zip() does" + ("; a non-tensor element gives n_devices entries (the same "
                                                          "object for each), so it never shortens the zip"
                                                          if shares else ""))


def _same(yours, expected, where: str, *, top: bool = False, count_prop: str = "splits like DataParallel",
          depth: int = 0, joining: bool = False, prop: str | None = None, count_hint: str = "") -> None:
    """Compare a scatter/gather result with the reference, failing on the property that differs
    (`prop`, when given, names a shape or count that differs)."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(yours, torch.Tensor):
            raise CheckFailed("keeps the structure", f"{where}: yours is {_kind(yours)}, expected {_kind(expected)}")
        if yours.shape != expected.shape:
            if prop is not None and depth:
                prop_here, hint = prop, _DIM_HINT
            elif joining:
                prop_here, hint = "joins like DataParallel", ("gather concatenates the outputs along dim, in order "
                                                              "(0-dim outputs on dim 0 become 1-element vectors first)")
            elif depth:
                prop_here, hint = "splits every tensor in the structure", ("recurse: a tensor inside a tuple, list "
                                                                          "or dict, at any depth, is split like a "
                                                                          "bare one")
            else:
                prop_here, hint = "splits like DataParallel", ("DataParallel uses tensor.chunk(n, dim): pieces of "
                                                               "ceil(size / n), the last one smaller")
            raise CheckFailed(prop_here, f"{where}: yours has shape {tuple(yours.shape)}, expected "
                              f"{tuple(expected.shape)}", hint)
        if yours.device != expected.device:
            if joining:
                int_note = ("; DataParallel passes output_device as an int (device_ids[0]), and 0 is cuda:0: test "
                            "`output_device is None`, not its truth" if "output_device=0" in where else "")
                raise CheckFailed("gathers onto output_device", f"{where}: yours is on {yours.device}, expected "
                                  f"{expected.device}",
                                  "DataParallel gathers onto its output_device (device_ids[0] unless you say "
                                  "otherwise), where the loss is computed: move every output to output_device, "
                                  "or, when it is None, to outputs[0]'s device, wherever that is (not a default "
                                  "device such as the CPU or the current GPU, not the last output's device), "
                                  "before concatenating" + int_note)
            raise CheckFailed("keeps pieces on the input's device", f"{where}: yours is on {yours.device}, expected "
                              f"{expected.device}", "split with torch.chunk: its pieces stay where the input is")
        if yours.dtype != expected.dtype or not trusted.torch_equal(yours.detach(), expected.detach()):
            if not joining and _storage(yours) != _storage(expected):
                raise CheckFailed("splits the tensor it is given, every call",
                                  f"{where}: neither a view of this call's tensor nor its samples: it holds another "
                                  "tensor's values", "keep nothing between calls: a cache keyed on the shape returns "
                                  "another batch's samples")
            raise CheckFailed("keeps the samples in order", f"{where}: the values differ from DataParallel's")
        return
    if top:
        if not isinstance(yours, (list, tuple)):
            raise CheckFailed("returns a list of pieces", f"{where}: yours returned {_kind(yours)}, "
                              "expected a list with one entry per device that gets work")
        if len(yours) != len(expected):
            raise CheckFailed(count_prop,
                              f"{where}: yours gave {len(yours)} piece{'' if len(yours) == 1 else 's'}, "
                              f"DataParallel gives {len(expected)}",
                              count_hint or _count_hint(None))
        for i, (a, b) in enumerate(zip(yours, expected)):
            _same(a, b, f"{where}, piece {i}", prop=prop)
        return
    if isinstance(expected, (tuple, list, dict)) and type(yours) is not type(expected):
        raise CheckFailed("keeps the structure", f"{where}: yours is {_kind(yours)}, expected a "
                          f"{type(expected).__name__}",
                          "a tuple gives tuples, a list lists, a dict dicts with the same keys, a namedtuple "
                          "the same namedtuple")
    if isinstance(expected, dict):
        if list(yours.keys()) != list(expected.keys()):
            raise CheckFailed("keeps the structure", f"{where}: keys {list(yours)} instead of {list(expected)}",
                              "build each dict with the input's keys in the input's order (type(obj)(zip(obj.keys(), "
                              "...)), as torch does): sorted keys, or a set of them, change the order the caller "
                              "reads them in" if sorted(map(str, yours)) == sorted(map(str, expected)) else
                              "one dict per piece with every key of the input, in its order")
        for key in expected:
            _same(yours[key], expected[key], f"{where}, key {key!r}", depth=depth + 1, joining=joining, prop=prop)
        return
    if isinstance(expected, (tuple, list)):
        if len(yours) != len(expected):
            raise CheckFailed("keeps the structure", f"{where}: {len(yours)} elements instead of {len(expected)}")
        for i, (a, b) in enumerate(zip(yours, expected)):
            _same(a, b, f"{where}, element {i}", depth=depth + 1, joining=joining, prop=prop)
        return
    if yours is not expected:
        if joining:
            raise CheckFailed("keeps None as None", f"{where}: yours is {yours!r:.40} ({type(yours).__name__}), "
                              f"expected {expected!r:.40}",
                              "gather returns None where the first replica's output holds None (torch's gather "
                              "walks tensors, tuples, lists, dicts and None only)")
        raise CheckFailed("shares non-tensors by reference",
                          f"{where}: yours is {yours!r:.40} ({type(yours).__name__}), expected the very object "
                          f"that was passed in ({expected!r:.40})", _EVERY_DEVICE)


def _raised(prop: str, where: str, exc: BaseException) -> CheckFailed:
    from ._core import _learner_line
    if isinstance(exc, RecursionError):
        return CheckFailed(prop, f"{where}: yours raised RecursionError: the recursion never ended",
                           "a str is a sequence of one-character strings, each a str again: recurse only into "
                           "tuple, list and dict, as torch does (isinstance(obj, (tuple, list, dict))), and "
                           "treat everything else as a leaf")
    hint = ("pass dim down the recursion: the tensors inside a tuple, list or dict are split and joined along the "
            "same dim as a bare tensor" if prop in ("joins along dim inside containers too",
                                                     "splits along dim inside containers too") else "")
    return CheckFailed(prop, f"{where}: yours raised {type(exc).__name__}: {exc}{_learner_line(exc)}", hint)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _not_from_elsewhere(yours, inputs, expected, where) -> None:
    """Pieces that are neither views of this call's tensor nor copies of its pieces come from
    somewhere else: an earlier call's tensor, kept between calls."""
    for i, piece in enumerate(yours):
        if not isinstance(piece, torch.Tensor) or _storage(piece) == _storage(inputs):
            continue
        match = (i < len(expected) and piece.shape == expected[i].shape and piece.dtype == expected[i].dtype
                 and trusted.torch_equal(piece.detach(), expected[i].detach()))
        if not match:
            raise CheckFailed("splits the tensor it is given, every call",
                              f"dp_scatter of {where}: piece {i} is neither a view of this call's tensor nor its "
                              "samples: it holds another tensor's values",
                              "keep nothing between calls: a cache keyed on the shape returns another batch's samples")


def _scatter_cases(rng):
    """(description, inputs, n, dim, property for a wrong shape inside containers or None) for fresh inputs."""
    cases = []
    # anything that is not walked: every device gets the object itself
    cases += [("a number on 3 devices", 0.5, 3, 0, None), ("None on 4 devices", None, 4, 0, None),
              ("an empty tuple on 2 devices", (), 2, 0, None), ("an empty dict on 3 devices", {}, 3, 0, None)]
    # single tensors: even, uneven, fewer pieces than devices, one sample
    for _ in range(6):
        n = int(rng.integers(2, 9))
        b = int(rng.integers(1, 4 * n + 3))
        cases.append((f"a tensor of {b} samples on {n} devices", torch.randn(b, 3, 2), n, 0, None))
    cases.append(("a tensor of 5 samples on 4 devices", torch.randn(5, 2), 4, 0, None))
    cases.append(("a tensor of 1 sample on 3 devices", torch.randn(1, 4), 3, 0, None))
    n = int(rng.integers(2, 6))
    cases.append((f"a tensor split along dim=1 on {n} devices", torch.randn(3, int(rng.integers(n, 4 * n)), 2), n, 1,
                  None))
    cases.append((f"a tensor split along dim=-1 on {n} devices", torch.randn(2, 3, int(rng.integers(n, 3 * n))), n, -1,
                  None))
    # structures
    n = int(rng.integers(2, 7))
    b = int(rng.integers(n, 5 * n))
    x, y = torch.randn(b, 3, 4, 4), torch.randint(0, 10, (b,))
    cases += [
        (f"a tuple (images, labels) of {b} samples on {n} devices", (x, y), n, 0, None),
        (f"a list [images, labels] of {b} samples on {n} devices", [x, y], n, 0, None),
        (f"a dict of {b} samples on {n} devices", {"labels": y, "images": x}, n, 0, None),
        (f"an OrderedDict of {b} samples on {n} devices", collections.OrderedDict([("mask", x[:, 0]), ("images", x),
                                                                                  ("labels", y)]), n, 0, None),
        (f"a namedtuple Batch(images, labels) on {n} devices", _Batch(x, y), n, 0, None),
        (f"a nested (images, {{'mask': ..., 'extra': [labels]}}) on {n} devices", (x, {"mask": x[:, 0], "extra": [y]}),
         n, 0, None),
        (f"a tuple mixing a tensor with a number, a string, None, a set and an options object on {n} devices",
         (x, 3, "crop", None, {"flip"}, types.SimpleNamespace(scale=2.0)), n, 0, None),
    ]
    # containers split along another dim: dim goes down the recursion
    n = int(rng.integers(2, 6))
    w = int(rng.integers(n + 1, 4 * n))
    inside = "splits along dim inside containers too"
    cases += [(f"a tuple of two tensors split along dim=1 on {n} devices", (torch.randn(2, w, 3), torch.randn(4, w)),
               n, 1, inside),
              (f"a dict {{'x': ..., 'more': [...]}} split along dim=1 on {n} devices",
               {"x": torch.randn(3, w), "more": [torch.randn(2, w, 2)]}, n, 1, inside)]
    short = int(rng.integers(1, n))
    if len(scaling.dp_chunk_sizes(short, n)) >= len(scaling.dp_chunk_sizes(b, n)):
        short = 1                       # fewer pieces than the other element, on every seed
    cases.append((f"a tuple of a {b}-sample and a {short}-sample tensor on {n} devices",
                  (torch.randn(b, 2), torch.randn(short, 2)), n, 0, None))
    return cases


def _gather_cases(rng):
    """(description, outputs, dim, property for a wrong shape inside containers or None)."""
    cases = []
    n = int(rng.integers(2, 7))
    sizes = [int(v) for v in rng.integers(1, 6, size=n)]
    cases.append((f"{n} outputs of {sizes} samples", [torch.randn(s, 10) for s in sizes], 0, None))
    cases.append((f"{n} outputs joined along dim=1", [torch.randn(2, s) for s in sizes], 1, None))
    cases.append((f"{n} outputs joined along dim=-1", [torch.randn(2, 3, s) for s in sizes], -1, None))
    cases.append((f"{n} scalar losses (0-dim tensors)", [torch.randn(()) for _ in sizes], 0, None))
    cases.append((f"{n} outputs (logits, features) tuples", [(torch.randn(s, 10), torch.randn(s, 4)) for s in sizes], 0,
                  None))
    cases.append((f"{n} outputs [logits, features] lists", [[torch.randn(s, 10), torch.randn(s, 4)] for s in sizes], 0,
                  None))
    cases.append((f"{n} outputs dicts {{'loss', 'logits'}}",
                  [{"loss": torch.randn(()), "logits": torch.randn(s, 10)} for s in sizes], 0, None))
    cases.append((f"{n} outputs OrderedDicts {{'logits', 'features', 'aux'}}",
                  [collections.OrderedDict([("logits", torch.randn(s, 10)), ("features", torch.randn(s, 4)),
                                            ("aux", torch.randn(s, 2))]) for s in sizes], 0, None))
    cases.append((f"{n} outputs namedtuples Batch(images, labels)",
                  [_Batch(torch.randn(s, 3), torch.randint(0, 9, (s,))) for s in sizes], 0, None))
    cases.append((f"{n} outputs (logits, None)", [(torch.randn(s, 10), None) for s in sizes], 0, None))
    inside = "joins along dim inside containers too"
    cases.append((f"{n} outputs (a, b) tuples joined along dim=1", [(torch.randn(2, s), torch.randn(3, s, 2))
                                                                     for s in sizes], 1, inside))
    cases.append((f"{n} outputs dicts {{'a': ..., 'b': [...]}} joined along dim=1",
                  [{"a": torch.randn(2, s), "b": [torch.randn(4, s)]} for s in sizes], 1, inside))
    return cases


def _device_gather_cases(rng):
    """Outputs on two devices (made inside a `VirtualCuda` block: a GPU's device placement on the
    CPU): (description, outputs, dim, output_device). DataParallel's replicas' outputs are on
    GPUs; it gathers onto output_device (device_ids[0], or the CPU when asked)."""
    n = int(rng.integers(3, 7))
    sizes = [int(v) for v in rng.integers(1, 6, size=n)]
    first_on_gpu = [torch.randn(s, 10, device="cuda" if i == 0 else "cpu") for i, s in enumerate(sizes)]
    losses = [torch.randn((), device="cuda" if i == 0 else "cpu") for i in range(n)]
    on_gpu = [torch.randn(s, 10, device="cuda") for s in sizes]
    first_on_cpu = [torch.randn(s, 10, device="cpu" if i == 0 else "cuda") for i, s in enumerate(sizes)]
    return [(f"{n} outputs, the first on the GPU (cuda), the others on the CPU", first_on_gpu, 0, None),
            (f"{n} scalar losses (0-dim), the first on the GPU (cuda), the others on the CPU", losses, 0, None),
            (f"{n} (logits, features) tuples, the first on the GPU (cuda)",
             [(t, t[:, :3] * 2) for t in first_on_gpu], 0, None),
            (f"{n} outputs, the first on the CPU, the others on the GPU, output_device='cuda'", first_on_cpu, 0,
             "cuda"),
            (f"{n} (logits, features) tuples, the first on the CPU, output_device='cuda'",
             [(t, t[:, :3] * 2) for t in first_on_cpu], 0, "cuda"),
            (f"{n} outputs on the GPU (cuda), output_device='cpu'", on_gpu, 0, "cpu"),
            # DataParallel passes output_device as an int (device_ids[0], usually 0): 0 is a device, not "no device"
            (f"{n} outputs, the first on the CPU, the others on the GPU, output_device=0 (an int, as DataParallel "
             "passes it)", first_on_cpu, 0, 0),
            # None: the first output's device, here the CPU (not the current CUDA device)
            (f"{n} outputs, the first on the CPU, the others on the GPU, output_device=None", first_on_cpu, 0, None)]


def _first_tensor(obj):
    if isinstance(obj, torch.Tensor):
        return obj
    for v in (obj.values() if isinstance(obj, dict) else obj):
        t = _first_tensor(v)
        if t is not None:
            return t
    return None


class _CopyWatch(TorchFunctionMode):
    """Notes every copy of a tensor onto its own device with its own dtype (`.to(..., copy=True)`,
    `.clone()`, `torch.clone`): a copy torch.cat makes again at once."""

    _COPIES = {torch.Tensor.to: ".to(..., copy=True)", torch.Tensor.clone: ".clone()", torch.clone: "torch.clone",
               torch.Tensor.cpu: ".cpu()", torch.Tensor.new_tensor: ".new_tensor()"}

    def __init__(self):
        super().__init__()
        self.needless = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = self._COPIES.get(func)
        if (name and args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor)
                and out is not args[0] and out.device == args[0].device and out.dtype == args[0].dtype
                and args[0].numel() > 0 and _storage(out) != _storage(args[0])):
            self.needless.append(name)
        return out


def _two_functions(obj):
    if (not isinstance(obj, (tuple, list)) or len(obj) != 2 or not all(callable(f) for f in obj)):
        if callable(obj):
            raise WrongType("type", "expected the pair (dp_scatter, dp_gather), but got one function. "
                            'Call check("6.2", (dp_scatter, dp_gather)).')
        raise WrongType("type", f"expected the pair (dp_scatter, dp_gather), but got {_kind(obj)}. "
                        'Call check("6.2", (dp_scatter, dp_gather)).')
    return obj


def _nothing_kept(call, name, rng):
    """A call's input (scatter) or result (gather) dies once the caller drops it: nothing kept between calls.
    (A cache keyed on id() and the shape returns the right views, and keeps every batch and its graph alive.)"""
    n = int(rng.integers(2, 6))
    x = torch.randn(int(rng.integers(n + 1, 5 * n)), 3, requires_grad=True)
    if name == "dp_scatter":
        out = call(x, n, 0)
        watched = x
    else:
        out = call([p * 1.0 for p in x.chunk(n)], 0)
        watched = out
    try:
        ref = weakref.ref(watched)
    except TypeError:          # not a tensor: the comparisons name that
        return
    del out, watched, x
    gc.collect()
    if ref() is not None:
        kept = (f"{name} of a tensor that requires grad: the tensor was still alive after the call's pieces were "
                "dropped: yours keeps a reference to it (a cache, a list, a global)" if name == "dp_scatter" else
                f"{name} of outputs that require grad: the result was still alive after the caller dropped it: "
                "yours keeps a reference to it (a list, a cache, a global)")
        raise CheckFailed("keeps nothing between calls", kept,
                          "a reference kept between calls keeps the tensor and its whole autograd graph (every "
                          "replica's activations) alive: one more batch of memory every step, a leak; "
                          "DataParallel's scatter and gather keep nothing: return the pieces or the result, store "
                          "nothing")


def _warm_scatter_gather() -> None:
    """The course's own scatter and gather on the check's kinds of inputs, outside the time limit: an aten
    operation on the virtual CUDA device first imports torch.distributed.tensor and sympy (3-15 s on a busy
    2-core machine, w6-06), which the check's 10 s would otherwise pay on a kernel's first call."""
    import numpy as np
    rng = np.random.default_rng(0)
    with torch.random.fork_rng(devices=[]):        # the learner's torch.manual_seed is left as it was
        for _, inputs, n, dim, _ in _scatter_cases(rng):
            reference_scatter(inputs, n, dim)
        with VirtualCuda():
            for _, outputs, dim, output_device in _device_gather_cases(rng):
                reference_gather(outputs, dim, output_device)


@exercise("6.2", "Scatter and gather exactly as DataParallel does", points=2, warmup=_warm_scatter_gather)
def check_scatter_gather(functions, *, seed=None):
    dp_scatter, dp_gather = _two_functions(functions)
    rng, seed = _seeded(seed)
    trip = _torch_parallel_tripwire()
    count = 0

    def scatter(inputs, n, dim):
        nonlocal count
        count += 1
        return _call(dp_scatter, trip, *_NO_TORCH_PARALLEL, inputs, n, dim=dim)

    def gather(outputs, dim, output_device=None):
        nonlocal count
        count += 1
        if output_device is None:        # the default: not passed, as DataParallel's callers often do
            return _call(dp_gather, trip, *_NO_TORCH_PARALLEL, outputs, dim=dim)
        try:
            return _call(dp_gather, trip, *_NO_TORCH_PARALLEL, outputs, dim=dim, output_device=output_device)
        except TypeError as exc:
            if "output_device" in str(exc):
                raise CheckFailed("takes output_device", f"dp_gather(outputs, dim={dim}, output_device="
                                  f"{output_device!r}) raised TypeError: {exc}",
                                  "the spec is dp_gather(outputs, dim=0, output_device=None): DataParallel gathers "
                                  "onto its output_device, the first output's device when it is None") from None
            raise

    asked = []                 # the n_devices of the calls so far
    for where, inputs, n, dim, prop in _scatter_cases(rng):
        try:
            yours = scatter(inputs, n, dim)
        except (CheckFailed, NotImplementedError):
            raise
        except Exception as exc:
            blame = "splits like DataParallel" if isinstance(inputs, torch.Tensor) else "keeps the structure"
            raise _raised(prop or blame, f"dp_scatter of {where}", exc) from None
        expected = reference_scatter(inputs, n, dim)
        if (not _has_tensor(inputs) and isinstance(yours, (list, tuple)) and len(yours) != n
                and len(yours) in asked):
            raise CheckFailed("takes n_devices from every call", f"dp_scatter of {where}: yours gave {len(yours)} "
                              f"entries, as many as an earlier call's n_devices ({len(yours)}), not {n}",
                              "keep nothing between calls: an n_devices (or anything else) remembered from the first "
                              "call answers the later ones with its count")
        asked.append(n)
        if prop is not None:
            count_prop = prop
        elif isinstance(inputs, torch.Tensor):
            count_prop = "splits like DataParallel"
        elif _has_tensor(inputs):
            count_prop = "stops at the shortest element, as zip does"
        else:
            count_prop = "shares non-tensors by reference"
        if isinstance(inputs, torch.Tensor) and isinstance(yours, (list, tuple)):
            _not_from_elsewhere(yours, inputs, expected, where)
        count_hint = _DIM_HINT if prop is not None else _count_hint(inputs)
        if (isinstance(inputs, torch.Tensor) and dim != 0 and isinstance(yours, (list, tuple))
                and len(yours) != len(expected) and len(yours) == len(inputs.chunk(n, 0))):
            # w6-06 w62_40: dim ignored, told only about the count
            count_hint = (f"yours has the pieces of a split along dim 0 (size {inputs.shape[0]} there: "
                          f"{len(yours)} pieces), not along dim={dim} as asked (size {inputs.shape[dim]} there: "
                          f"{len(expected)} pieces): tensor.chunk(n, dim) splits along the dim it is given")
        _same(yours, expected, f"dp_scatter of {where}", top=True, count_prop=count_prop, prop=prop,
              count_hint=count_hint)
        if isinstance(inputs, torch.Tensor):
            for i, piece in enumerate(yours):
                if _storage(piece) != _storage(inputs):
                    raise CheckFailed("makes no copies", f"dp_scatter of {where}: piece {i} is a copy, not a view "
                                      "of the input", "torch.chunk returns views; DataParallel copies a piece only "
                                      "to move it to another device, and here every device is the input's")
    # the same shape again, other values: the pieces of this call's tensor, nothing kept from the last one
    n = int(rng.integers(2, 7))
    shape = (int(rng.integers(n + 1, 5 * n)), 3)
    before, again = torch.randn(shape), torch.randn(shape)
    scatter(before, n, 0)
    yours = scatter(again, n, 0)
    where = f"a second tensor of shape {shape} on {n} devices"
    expected = reference_scatter(again, n, 0)
    if isinstance(yours, (list, tuple)):
        _not_from_elsewhere(yours, again, expected, where)
    _same(yours, expected, f"dp_scatter of {where}", top=True)
    del before, again, yours, expected
    _nothing_kept(scatter, "dp_scatter", rng)

    for where, outputs, dim, prop in _gather_cases(rng):
        watch = _CopyWatch()
        try:
            with watch:
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
            raise _raised(prop or blame, f"dp_gather of {where}", exc) from None
        _same(yours, reference_gather(outputs, dim), f"dp_gather of {where}", joining=True, prop=prop)
        if watch.needless:
            raise CheckFailed("copies each output once (torch.cat's copy)",
                              f"dp_gather of {where}: every output was already on the target device, and yours "
                              f"copied {len(watch.needless)} of them there again ({watch.needless[0]}) before "
                              "joining", "`.to(device)` returns the tensor itself when it is already there, and "
                              "torch.cat makes the one copy a gather needs: a copy before it moves every output's "
                              "bytes twice, the waste this lesson measures")

    _nothing_kept(gather, "dp_gather", rng)

    # outputs on two devices: where the result lands, and what crosses to the host on the way
    with VirtualCuda() as vc:
        for where, outputs, dim, output_device in _device_gather_cases(rng):
            copies, syncs = len(vc.copies), len(vc.syncs)
            try:
                yours = gather(outputs, dim, output_device)
            except (CheckFailed, NotImplementedError):
                raise
            except Exception as exc:
                raise _raised("gathers onto output_device", f"dp_gather of {where}", exc) from None
            to_host = [c for c in vc.copies[copies:] if c.kind == "d2h"]
            waits = [w for w in vc.syncs[syncs:] if w.cause != "h2d"]      # a host output's copy up is fine
            racy = [c for c in to_host if c.non_blocking]
            if racy:
                raise CheckFailed("copies to the host with a blocking copy",
                                  f"dp_gather of {where}: yours copied to the host with non_blocking=True and used "
                                  "the result at once",
                                  "a copy from a GPU to the host with non_blocking=True returns before the bytes have "
                                  "landed; torch.cat then reads memory still being written (a device-to-host copy "
                                  "needs a synchronisation): use a blocking .to('cpu')")
            expected = reference_gather(outputs, dim, output_device)
            _same(yours, expected, f"dp_gather of {where}", joining=True)
            if _first_tensor(expected).device.type != "cpu" and (to_host or waits):
                what = (f"{len(to_host)} cop{'y' if len(to_host) == 1 else 'ies'} to the host" if to_host
                        else f"{len(waits)} wait(s) for the device ({waits[0].what})")
                hint = ("move each output straight to the target device (`.to(device)`) and concatenate "
                        "there: a trip through host memory (.cpu(), .tolist(), .numpy()) makes the host wait "
                        "for the GPU at every step, and copies the outputs twice")
                first = _first_tensor(outputs[0])
                on_gpu = sum(1 for o in outputs if _first_tensor(o) is not None and _first_tensor(o).device.type != "cpu")
                if to_host and first is not None and first.device.type == "cpu" and len(to_host) == on_gpu:
                    hint = (f"yours joins the outputs on outputs[0]'s device (the CPU here; or through .cpu()) and "
                            f"then moves the result to output_device: each of the {on_gpu} outputs on the GPU crossed "
                            "to the host first, and "
                            "the joined result crossed back; move each output to output_device and concatenate "
                            "there (the by-hand step's cat_join(outputs).to(home) is right only because its "
                            "outputs[0] is on home, device 0)")
                if not to_host:   # a value read on the host, nothing copied: the wait is the whole cost
                    hint = ("yours reads a value on the host (.item(), bool(), float(), an `if` or assert on a tensor)"
                            " or waits for the device (torch.cuda.synchronize()): the host waits there for the GPU "
                            "to finish every step, so it cannot queue the next "
                            "kernels; gather with tensor operations only and leave the checks out of the step (or "
                            "do them on the device, every N steps)")
                raise CheckFailed("gathers on the device, nothing through the host",
                                  f"dp_gather of {where}: yours made {what}", hint)

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
        raise CheckFailed("lets gradients flow", "dp_gather of outputs that require grad gave a result that does not "
                          "require grad: yours cut the graph on the way (a .detach(), .data, a numpy round trip or "
                          "a new tensor)", "DataParallel's backward runs through the gather into every replica: "
                          "`.to(device)` and torch.cat keep the graph, so move and join the outputs themselves")
    (joined * weights).sum().backward()
    if x.grad is None or not trusted.torch_allclose(x.grad, weights):
        raise CheckFailed("lets gradients flow", "the gradient through dp_gather(dp_scatter(x)) is not the "
                          "gradient through x itself")
    # ... and through the 0-dim losses of the replicas
    x.grad = None
    chunks = list(x.chunk(n))
    losses = [(piece * weights[:len(piece)]).sum() for piece in chunks]
    joined = gather(losses, 0)
    if not isinstance(joined, torch.Tensor) or not joined.requires_grad:
        raise CheckFailed("lets gradients flow", f"dp_gather of {len(losses)} 0-dim losses that require grad gave a "
                          "result that does not: the replicas' losses would never reach their backward",
                          "a .detach(), .item() or torch.tensor([...]) cuts the graph: view each loss as a "
                          "1-element vector and concatenate (torch.cat keeps the graph)")
    scale_by = torch.randn(len(losses))
    (joined * scale_by).sum().backward()
    expected_grad = torch.cat([weights[:len(piece)] * scale_by[k] for k, piece in enumerate(chunks)])
    if x.grad is None or not trusted.torch_allclose(x.grad, expected_grad):
        raise CheckFailed("lets gradients flow", "the gradient through dp_gather of the replicas' 0-dim losses is "
                          "not the gradient through the losses themselves")

    # round trip: gather(scatter(batch)) is the batch again
    n = int(rng.integers(2, 7))
    b = int(rng.integers(n, 6 * n))
    batch = {"images": torch.randn(b, 3, 2, 2), "labels": torch.randint(0, 10, (b,))}
    back = gather(scatter(batch, n, 0), 0)
    _same(back, batch, "dp_gather(dp_scatter(a dict batch))")
    return f"all properties hold on {count} inputs, outputs on two devices and gradients included (seed {seed})."


# -- 6.3 the memory of each device ----------------------------------------------------------------------

def _read_memory(value, n, where):
    if not isinstance(value, list):
        raise CheckFailed("returns a list", f"{where}: yours returned {_kind(value)}, expected a list of {n} numbers",
                          "the spec asks for a list, one number of bytes per device: list(...) of yours")
    if len(value) != n:
        raise CheckFailed("returns one number per device", f"{where}: yours returned {len(value)} numbers, "
                          f"expected {n} (a device that gets no piece holds 0 bytes, but it has an entry)")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
            raise CheckFailed("returns one number per device", f"{where}: {v!r} is not a finite number of bytes")
        out.append(float(v))
    return out


def _is_number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, numbers.Real) and math.isfinite(float(v))


def _kept_list(where) -> CheckFailed:
    return CheckFailed("returns a new list on every call", f"{where}: yours returned the very list object of an earlier "
                       "call", "a list kept between calls (a mutable default argument, a global) carries one call's "
                       "numbers into the next and changes the list the caller kept: build a new list in every call")


def _terms(n, batch, sizes, on_device0):
    """The named terms of device 0's peak, for naming what an answer left out or counted twice."""
    p, o = sizes["param_bytes"], sizes["optimizer_bytes"]
    i, a, y = sizes["input_bytes"], sizes["activation_bytes"], sizes["output_bytes"]
    chunks = scaling.dp_chunk_sizes(batch, n)
    c0 = chunks[0]
    device0 = {
        "a copy of param_bytes (the parameters, their gradients" + (", the reduce's sum)" if n > 1 else ")"): p,
        "the optimizer state (optimizer_bytes)": o,
        "the input": (batch if on_device0 or n == 1 else c0) * i, "device 0's piece's input": c0 * i,
        "the activations": c0 * a, "the outputs and their gradient (2 x batch x output_bytes)": 2 * batch * y,
        "the gathered outputs or their gradient (batch x output_bytes)": batch * y,
        "its own piece's outputs": c0 * y,
    }
    return device0, chunks


def _named_memory_miss(yours, expected, terms) -> str:
    diff = yours - expected
    for name, value in terms.items():
        if value <= 0:
            continue
        if trusted.isclose(diff, value, rel_tol=1e-9, abs_tol=0.5):
            return f"yours counts {name} ({value:,.0f} B) once too often"
        if trusted.isclose(diff, -value, rel_tol=1e-9, abs_tol=0.5):
            return f"yours leaves out {name} ({value:,.0f} B)"
    return ""


_SPLIT_PROP = "splits the batch like DataParallel"


def _memory_case(dp_memory, trip, n, batch, sizes, props, on_device0=True, earlier=None, objects=()):
    where = (f"{n} device(s), batch {batch} {'on device 0' if on_device0 else 'left on the host'}, parameters "
             f"{sizes['param_bytes']:,} B, optimizer state {sizes['optimizer_bytes']:,} B, per sample: input "
             f"{sizes['input_bytes']:,} B, activations {sizes['activation_bytes']:,} B, output "
             f"{sizes['output_bytes']:,} B")
    kwargs = dict(sizes) if on_device0 else dict(sizes, batch_on_device0=False)
    value = _call(dp_memory, trip, "computes the memory itself",
                  "that is the course's own model, which the lesson uses for its plots",
                  "add up what each device holds, from the list in the exercise", n, batch, **kwargs)
    expected = [float(v) for v in scaling.dp_memory(n, batch, **sizes, batch_on_device0=on_device0)]
    earlier = [] if earlier is None else earlier if isinstance(earlier, list) and (
        not earlier or isinstance(earlier[0], list)) else [earlier]
    if isinstance(value, list) and value != expected and any(value == e for e in earlier):
        raise CheckFailed("computes every call from its own sizes", f"{where}: yours returned the numbers of an "
                          "earlier call with the same devices, batch and placement but other sizes",
                          "keep nothing between calls: a cache keyed on n_devices and batch_size answers with "
                          "another model's bytes")
    if (n > 1 and batch == 1 and isinstance(value, list) and len(value) in (1, n) and _is_number(value[0])
            and trusted.isclose(float(value[0]), scaling.dp_memory(1, 1, **sizes)[0], rel_tol=1e-9, abs_tol=0.5)
            and not trusted.isclose(float(value[0]), expected[0], rel_tol=1e-9, abs_tol=0.5)):
        raise CheckFailed(props[0], f"{where}: yours returned {value!r}, expected "
                          f"{[int(v) for v in expected]}",
                          "yours treats a batch that makes one piece as one device: with two or more devices "
                          "DataParallel still replicates onto device 0 and reduces its gradients, so device 0 holds "
                          "the reduce's copy too (2 x param_bytes when that is more than its activations and outputs),"
                          " and the list has an entry for every device (0 bytes for those without a piece)")
    try:
        yours = _read_memory(value, n, where)
        wrong = any(not trusted.isclose(a, b, rel_tol=1e-9, abs_tol=0.5) for a, b in zip(yours, expected))
    except CheckFailed:
        yours, wrong = None, True
    if wrong:                  # the same call again, and with every size 1.7 times larger: is anything kept?
        snapshot = list(value) if isinstance(value, list) else value
        bigger = {k: (int(v * 1.7) if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in kwargs.items()}
        other = _call(dp_memory, trip, "computes the memory itself", "", "", n, batch, **bigger)
        if isinstance(other, list) and isinstance(snapshot, list) and other == snapshot and snapshot != expected:
            raise CheckFailed("computes every call from its own sizes", f"{where}: yours returned the same numbers "
                              "for these sizes and for sizes 1.7 times larger",
                              "keep nothing between calls: a cache keyed on n_devices and batch_size answers with "
                              "another model's bytes")
        if isinstance(value, list) and (other is value or any(value is seen for seen in objects)):
            raise _kept_list(where)
    if yours is None:
        _read_memory(value, n, where)
    if isinstance(value, list) and any(value is seen for seen in objects):
        raise _kept_list(where)
    first, others, empty = props
    terms, chunks = _terms(n, batch, sizes, on_device0)
    split = (f"DataParallel splits the batch with tensor.chunk: pieces of ceil(batch / n_devices) = "
             f"{math.ceil(batch / n)} samples here, the last one smaller ({chunks}): " if first == _SPLIT_PROP
             else "")
    if not trusted.isclose(yours[0], expected[0], rel_tol=1e-9, abs_tol=0.5):
        raise CheckFailed(first, f"{where}: device 0: yours {yours[0]:,.0f} B, expected {expected[0]:,.0f} B",
                          split + _device0_hint(yours[0], n, batch, sizes, on_device0, terms))
    for k in range(1, n):
        if expected[k] == 0 and yours[k] != 0:
            raise CheckFailed("devices without a piece hold nothing", f"{where}: device {k} gets no piece but yours gives it {yours[k]:,.0f} B",
                              "tensor.chunk(n) can make fewer than n pieces; DataParallel replicates only onto "
                              "devices that get one")
        if not trusted.isclose(yours[k], expected[k], rel_tol=1e-9, abs_tol=0.5):
            c = chunks[k]
            p, act = sizes["param_bytes"], c * sizes["activation_bytes"]
            named = _named_memory_miss(yours[k], expected[k], {
                "a copy of param_bytes (the replica's parameters or their gradients)": p,
                "its piece's input": c * sizes["input_bytes"],
                "its piece's activations": act, "the optimizer state (only device 0 has one)": sizes["optimizer_bytes"],
                "its piece's outputs": c * sizes["output_bytes"]})
            if trusted.isclose(yours[k], expected[k] + 2 * c * sizes["output_bytes"], rel_tol=1e-9, abs_tol=0.5):
                named = (f"yours gives device {k} its piece's outputs and their gradient (2 x {c} x output_bytes): "
                         "gather moves every replica's outputs to device 0, where the loss and its backward run, so "
                         "the outputs and their gradient are counted on device 0 (the whole batch's), not on the "
                         "device that made them")
            hint = ("a device with a piece of c samples: the replica's parameters + c samples of input + c samples "
                    "of activations + the replica's gradients (backward makes gradients while earlier layers' "
                    "activations are still held: the peak is counted with both)")
            if trusted.isclose(yours[k], expected[k] - min(act, p), rel_tol=1e-9, abs_tol=0.5):
                hint = ("yours takes the larger of the activations and the gradients: backward makes a layer's "
                        "gradients while the activations of the layers before it are still held, and the course's "
                        "ResNet-18 measured close to their sum: count both (an upper bound)")
            elif named:
                hint = f"{named}; {hint}"
            raise CheckFailed(others, f"{where}: device {k}: yours {yours[k]:,.0f} B, expected {expected[k]:,.0f} B",
                              split + hint)
    return list(value), value


def _device0_hint(yours, n, batch, sizes, on_device0, terms):
    c0 = scaling.dp_chunk_sizes(batch, n)[0]
    p = sizes["param_bytes"]
    expected = scaling.dp_memory(n, batch, **sizes, batch_on_device0=on_device0)[0]
    working = c0 * sizes["activation_bytes"] + 2 * batch * sizes["output_bytes"]
    if n == 1 and not on_device0 and trusted.isclose(yours, expected - batch * sizes["input_bytes"], rel_tol=1e-9,
                                                     abs_tol=0.5):
        return ("yours leaves out the input when the batch is left on the host: with one device the batch's one "
                f"piece is the whole batch ({batch} samples), and the model runs on the device, so the batch is "
                "copied there all the same: one device holds the whole batch's input wherever the loader left it")
    acts = c0 * sizes["activation_bytes"]
    if (n == 1 and acts != working and acts != p
            and trusted.isclose(yours, expected - min(acts, p), rel_tol=1e-9, abs_tol=0.5)):
        return ("yours takes the larger of the activations and the gradients (the sum, not the max): backward "
                "makes a layer's gradients while the activations of the layers before it are still held, and the "
                "course's ResNet-18 measured close to their sum: count both (an upper bound)"
                + (f"; here the gradients are the larger, so yours leaves out the activations ({acts:,} B)"
                   if acts < p else f"; here the activations are the larger, so yours leaves out the gradients "
                   f"({p:,} B)"))
    if n == 1 and trusted.isclose(yours, expected - min(working, p), rel_tol=1e-9, abs_tol=0.5):
        return ("yours takes the larger of the activations and the gradients: backward makes a layer's gradients "
                "while the activations of the layers before it are still held, and the course's ResNet-18 measured "
                "close to their sum: count both (an upper bound)")
    if n > 1 and working < p and trusted.isclose(yours, expected - (p - working), rel_tol=1e-9, abs_tol=0.5):
        return ("yours leaves out the reduce's copy: at the end of backward DataParallel's reduce holds every "
                "replica's gradients, device 0's included, and allocates their sum, so device 0 holds the gradients "
                "twice (2 x param_bytes) when that is more than its activations and outputs")
    if n > 1 and trusted.isclose(yours, expected - p, rel_tol=1e-9, abs_tol=0.5) and working >= p:
        return ("yours takes the larger of (the activations and outputs) and the gradients: backward makes device 0's "
                "gradients while the activations are still held, so both count; the reduce's sum comes on top when "
                "the activations are gone")
    if n > 1 and trusted.isclose(yours, expected - p, rel_tol=1e-9, abs_tol=0.5):
        return ("yours holds device 0's gradients (param_bytes) only inside the max, as the larger of them and the "
                "activations: activations and gradients are counted together (backward makes device 0's gradients "
                "while its activations are still held), and the reduce's sum, another param_bytes, is what the max "
                "weighs against the activations and outputs")
    input0 = (batch if on_device0 else c0) * sizes["input_bytes"]
    inside = (2 * p + sizes["optimizer_bytes"] + max(input0 + working, p))
    if n > 1 and not on_device0 and input0 and trusted.isclose(yours, expected - input0, rel_tol=1e-9, abs_tol=0.5):
        dropped = (f"yours leaves out device 0's piece of the input ({c0} samples, {input0:,} B): the batch stayed on "
                   "the host, and scatter copies every piece from there to its device, device 0's piece to device 0 "
                   "too, where it is held to the end of the step")
        if trusted.isclose(inside, yours, rel_tol=1e-9, abs_tol=0.5):    # the reduce's sum outweighs both here
            dropped += (f"; or yours counts it inside the max, with the activations and outputs (the reduce's sum, "
                        f"{p:,} B, outweighs both here, so the two give the same number): add it outside the max")
        return dropped
    if n > 1 and trusted.isclose(yours, expected + min(working, p), rel_tol=1e-9, abs_tol=0.5):
        return (f"yours adds the two moments (its piece's activations with the gathered outputs and their gradient, "
                f"{working:,} B, and the reduce's sum, {p:,} B): the reduce runs after backward has freed the "
                "activations, so device 0's peak is the larger of the two, not their sum")
    whole = 2 * p + sizes["optimizer_bytes"] + input0 + max(batch * sizes["activation_bytes"]
                                                            + 2 * batch * sizes["output_bytes"], p)
    if n > 1 and not trusted.isclose(whole, expected, rel_tol=1e-9, abs_tol=0.5) and trusted.isclose(
            yours, whole, rel_tol=1e-9, abs_tol=0.5):
        return (f"yours gives device 0 the whole batch's activations ({batch} samples): device 0 runs only its own "
                f"piece ({c0} samples) forward and backward, so it holds that piece's activations; the other pieces' "
                "activations are on their own devices")
    if n > 1 and input0 and not trusted.isclose(inside, expected, rel_tol=1e-9, abs_tol=0.5) and trusted.isclose(
            yours, inside, rel_tol=1e-9, abs_tol=0.5):
        return (f"yours counts device 0's input ({input0:,} B) inside the max, with the activations and outputs: "
                "the input is held from the scatter to the end of the step, so it is there at both moments, beside "
                "the activations and beside the reduce's sum: add it outside the max")
    other_way = scaling.dp_memory(n, batch, **sizes, batch_on_device0=not on_device0)[0]
    if n > 1 and trusted.isclose(yours, other_way, rel_tol=1e-9, abs_tol=0.5):
        return ("with the batch on device 0 (the loader put it there) device 0 holds all of its input; left on the "
                "host, only its own piece" if on_device0 else
                "the batch stayed on the host: scatter copies each piece from there, so device 0 holds only its "
                f"own piece ({c0} samples) of the input")
    if n > 1:             # device 0 counting its own piece's outputs (2 x c0), not the gathered batch's (2 x B)
        y = sizes["output_bytes"]
        own = (p + sizes["optimizer_bytes"] + (batch if on_device0 else c0) * sizes["input_bytes"] + p
               + max(c0 * sizes["activation_bytes"] + 2 * c0 * y, p))
        if not trusted.isclose(own, expected, rel_tol=1e-9, abs_tol=0.5) and trusted.isclose(
                yours, own, rel_tol=1e-9, abs_tol=0.5):
            why = (f"gather brings every replica's outputs to device 0, the whole batch's {batch}, and the loss's "
                   "backward makes their gradient there too (2 x batch x output_bytes)")
            if trusted.isclose(2 * c0 * y, batch * y):     # an even split on 2 devices: both give this number
                return (f"yours counts the gathered outputs once (batch x output_bytes), or only device 0's own "
                        f"piece's outputs and their gradient (2 x {c0} x output_bytes): with this even split on 2 "
                        f"devices the two give the same number; {why}")
            return (f"yours counts device 0's own piece's outputs and their gradient (2 x {c0} x output_bytes): "
                    f"{why}")
    y, a, base0 = sizes["output_bytes"], sizes["activation_bytes"], 2 * p + sizes["optimizer_bytes"]
    input0 = (batch if on_device0 else c0) * sizes["input_bytes"]
    pieces = len(scaling.dp_chunk_sizes(batch, n))

    def near(value):
        return (not trusted.isclose(value, expected, rel_tol=1e-9, abs_tol=0.5)
                and trusted.isclose(yours, value, rel_tol=1e-9, abs_tol=0.5))
    if n == 1 and near(base0 + input0 + max(batch * a + 2 * batch * y, p)):
        return ("yours runs one device through the multi-device formula (the larger of the activations and outputs "
                "and the reduce's sum): with one device DataParallel calls the model directly, no replicate and no "
                "reduce, so there is no reduce's sum; one device holds its activations, its outputs and their "
                "gradient and the gradients all at once (their sum)")
    if n > 1 and near(base0 + input0 + max(c0 * a + 2 * (batch - c0) * y, p)):
        return (f"yours counts the gathered outputs of the other devices' pieces only ({batch - c0} samples): gather "
                f"brings every piece's outputs to device 0, its own piece's included, the whole batch's {batch}, and "
                "the loss's backward makes their gradient there (2 x batch x output_bytes)")
    for k in sorted({pieces - 1, pieces, n - 1, n} - {1}):
        if k > 1 and near(base0 + input0 + max(working, k * p)):
            return (f"yours gives the reduce's moment {k} x param_bytes: device 0 holds its own gradients (counted "
                    "outside the max) and the reduce allocates one sum, another param_bytes; the other replicas' "
                    "gradients stay on their own devices, which the reduce reads from there")
    named = _named_memory_miss(yours, expected, terms)
    rule = ("one device: the parameters + the optimizer state + the batch's input + its activations + its outputs "
            "and their gradient + the gradients" if n == 1 else
            "device 0: the parameters + the optimizer state + its input (the whole batch when the loader put it "
            "there, else its piece) + its gradients + the larger of (its piece's activations + the gathered outputs "
            "and their gradient) and (the reduce's sum, another param_bytes)")
    return f"{named}; {rule}" if named else rule


def _sizes(rng, regime=None, **fixed):
    """Random sizes; `regime` "activations" or "gradients" says which of the two outweighs the other
    on device 0 (both regimes are tested on every run)."""
    sizes = dict(param_bytes=int(rng.integers(10**5, 10**9)), optimizer_bytes=int(rng.integers(1, 2 * 10**9)),
                 input_bytes=int(rng.integers(10, 10**6)), activation_bytes=int(rng.integers(10**3, 10**7)),
                 output_bytes=int(rng.integers(4, 10**5)))
    if regime == "activations":       # a large batch of large activations, a small model
        sizes.update(param_bytes=int(rng.integers(10**5, 10**6)), activation_bytes=int(rng.integers(10**6, 10**7)))
    elif regime == "gradients":       # a big model, small activations
        sizes.update(param_bytes=int(rng.integers(10**8, 10**9)), activation_bytes=int(rng.integers(10**3, 10**4)),
                     output_bytes=int(rng.integers(4, 10**3)))
    sizes.update(fixed)
    return sizes


@exercise("6.3", "The memory each device holds in a DataParallel step", points=1)
def check_dp_memory(dp_memory, *, seed=None):
    expect_callable(dp_memory, "a function dp_memory(n_devices, batch_size, *, param_bytes, optimizer_bytes, "
                    "input_bytes, activation_bytes, output_bytes, batch_on_device0=True)")
    rng, seed = _seeded(seed)
    trip = _course_tripwire(scaling.dp_memory)
    count = 0
    answers, objects = {}, []

    def case(n, batch, sizes, props, on_device0=True):
        nonlocal count
        count += 1
        key = (n, batch, on_device0)      # the same devices, batch and placement again: with other sizes
        answer, value = _memory_case(dp_memory, trip, n, batch, sizes, props, on_device0,
                                     answers.get(key, []) + _ASKED_63.get(key, []), objects)
        if len(_ASKED_63) < 20_000:
            _ASKED_63.setdefault(key, []).append([float(v) for v in scaling.dp_memory(
                n, batch, **sizes, batch_on_device0=on_device0)])
        answers.setdefault(key, []).append(list(answer))
        objects.append(value)

    one = ("one device holds the whole step",) * 3
    for regime in ("gradients", "activations"):       # gradients first: there a left-out term has one name
        case(1, int(rng.integers(1, 512)), _sizes(rng, regime), one)
    # one device with the batch left on the host: its one piece is the whole batch, on the device (every seed)
    case(1, int(rng.integers(1, 512)), _sizes(rng), one, on_device0=False)
    props = ("device 0 holds the state, its input and its peak", "the others hold a replica, their piece and their peak",
             "devices without a piece hold nothing")
    n = int(rng.integers(2, 9))
    for regime in ("gradients", "activations"):
        case(n, n * int(rng.integers(20, 100)), _sizes(rng, regime), props)
    # big optimizer state or big outputs: only device 0 carries them
    case(n, n * int(rng.integers(2, 100)), _sizes(rng, "activations", optimizer_bytes=3 * 10**9), props)
    case(n, n * int(rng.integers(2, 100)), _sizes(rng, "activations", output_bytes=10**6), props)
    host = ("a batch left on the host puts only its piece on device 0", "the others hold a replica, their piece and "
            "their peak", "devices without a piece hold nothing")
    for regime in ("gradients", "activations"):
        case(n, n * int(rng.integers(20, 100)), _sizes(rng, regime), host, on_device0=False)
    # uneven splits where every way of splitting but DataParallel's disagrees (four devices or more)
    split = (_SPLIT_PROP,) * 3
    for m, batch in ((4, 10), (4, 5), (int(rng.integers(4, 9)), None)):
        batch = batch or m * int(rng.integers(3, 50)) + int(rng.integers(1, m))
        case(m, batch, _sizes(rng), split)
    # a batch of one sample on two or more devices: one piece, still a replica and a reduce on device 0
    one_piece = ("two or more devices: a replica even for one piece", "devices without a piece hold nothing",
                 "devices without a piece hold nothing")
    for m in (2, int(rng.integers(3, 9))):      # 2 devices on every seed: 'n <= 2' for 'n == 1' fails there
        case(m, 1, _sizes(rng, "gradients"), one_piece)
    # the same devices and batch twice, other sizes: nothing kept between calls
    again = ("matches the model on fresh sizes",) * 2 + ("devices without a piece hold nothing",)
    m, batch = int(rng.integers(2, 9)), int(rng.integers(1, 3000))
    case(m, batch, _sizes(rng), again)
    case(m, batch, _sizes(rng), again)
    # one size at a time, as the lesson compares SGD with Adam (w6-06: a cache keyed on the devices, batch,
    # param_bytes and placement gave both optimizers the same bytes): the optimizer state alone first
    m, batch, on0 = int(rng.integers(2, 9)), int(rng.integers(1, 3000)), bool(rng.integers(0, 2))
    base = _sizes(rng)
    case(m, batch, base, again, on_device0=on0)
    seen = [scaling.dp_memory(m, batch, **base, batch_on_device0=on0)]
    for name in ("optimizer_bytes", "param_bytes", "input_bytes", "activation_bytes", "output_bytes"):
        for factor in (0, 3, 20, 100):
            one = dict(base, **{name: base[name] * factor})
            expected = scaling.dp_memory(m, batch, **one, batch_on_device0=on0)
            if all(expected != e for e in seen):
                seen.append(expected)
                case(m, batch, one, again, on_device0=on0)
                break
    for k in range(24):
        m = int(rng.integers(1, 17))
        case(m, int(rng.integers(1, 3000)), _sizes(rng), again, on_device0=bool(k % 2))
    return f"all properties hold on {count} configurations, the batch on device 0 or on the host (seed {seed})."
