"""Checks for lesson 02 (DataLoader workers)."""
from __future__ import annotations

import contextlib
import gc
import os
import time
import warnings

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..env import usable_cores
from ._busy import MachineBusy, OthersCpu, busy_limit
from ._core import CheckFailed, exercise, expect_callable, expect_class, trusted
from ._util import fresh_rng


# -- 2.1 choose num_workers from a sweep -----------------------------------------------------

def _reference_choice(sweep: dict, tolerance: float) -> int:
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if s >= (1 - tolerance) * best)


def _sweep_of(kind: str, rng: np.random.Generator) -> dict:
    """A made-up sweep {num_workers: samples/s} of one kind (values only, keys in order)."""
    cores = int(rng.choice([2, 4, 8, 16]))
    if rng.random() < 0.5:
        counts = list(range(0, 2 * cores + 1))
    else:
        counts = sorted({0, 1, 2} | {c for c in (3, 4, 6, 8, 12, 16, 24, 32) if c <= 2 * cores})
    base = float(rng.uniform(400, 3000))
    gain = float(rng.uniform(0.6, 1.0))          # how much each extra worker adds up to the cores
    values = []
    for w in counts:
        if kind == "flat":                        # the device is the bottleneck from 0 workers on
            v = base * rng.uniform(0.99, 1.01)
        else:
            useful = min(w, cores)
            v = base * (1 + gain * useful)
            if w > cores:                         # oversubscribed: the main process starves
                v *= 1 - rng.uniform(0.03, 0.08) * (w - cores) / max(cores / 4, 1)
            noise = 0.06 if kind == "noisy" else 0.01
            v *= 1 + rng.uniform(-noise, noise)
        values.append(v)
    if kind == "non-monotone" and len(counts) > 4:
        # a dip in the middle (another job stole the CPU), then the real best further on
        i = int(rng.integers(1, len(counts) - 2))
        values[i] *= rng.uniform(0.5, 0.7)
        j = int(rng.integers(i + 1, len(counts)))
        values[j] = max(values) * rng.uniform(1.15, 1.3)
    if kind == "best-last":
        values = sorted(values)
    return dict(zip(counts, values))


def _away_from_edge(sweep: dict, tolerance: float) -> dict:
    """Move values that sit within 0.5% of the threshold away from it (no knife-edge cases)."""
    best = max(sweep.values())
    threshold = (1 - tolerance) * best
    out = {}
    for w, v in sweep.items():
        if v != best and abs(v - threshold) < 0.005 * best:
            v = threshold + (0.01 if v >= threshold else -0.01) * best
            v = min(v, best * 0.999)
        out[w] = float(v)
    return out


def _shuffled(sweep: dict, rng) -> dict:
    keys = list(sweep)
    rng.shuffle(keys)
    return {k: sweep[k] for k in keys}


# Sweeps whose answer a plausible slip changes: each is (sweep, tolerance or None for the
# default, what it catches). Random sweeps keep their values away from the threshold, so
# these knife edges are written out. Every threshold below lands exactly where it is meant to
# however the arithmetic is written ((1 - t) * best, best - t * best, s / best, (best - s) / best).
_EDGE_CASES = [
    ({0: 500.0, 1: 951.0, 2: 980.0, 3: 1000.0}, 0.05, "a point just within 5% of the best (0.95 x best, not best / 1.05)"),
    ({0: 400.0, 1: 750.0, 2: 900.0, 3: 1000.0}, 0.25, "a point exactly at the threshold (at least means >=)"),
    ({0: 500.0, 1: 948.0, 2: 1000.0}, 0.05, "a point just below the threshold (0.948 x best: 0.95 once rounded)"),
    ({0: 1520.5, 1: 1601.0}, 0.05, "a point 0.45 samples/s below a threshold of 1,520.95 (1,520 once truncated)"),
    ({0: 1520.97, 1: 1601.0}, 0.05, "a point 0.02 samples/s above a threshold of 1,520.95 (1,521 once rounded)"),
    ({0: 500.0, 1: 949.6, 2: 1000.0}, 0.05, "a point 0.4 samples/s below a threshold of 950 (950 once rounded)"),
    ({0: 300.0, 1: 880.0, 2: 960.0, 3: 1000.0}, 0.15, "a tolerance of 0.15, where 0.05 would pick another count"),
    ({0: 600.0, 1: 899.0, 2: 1000.0, 3: 990.0}, 0.1, "a point just below the threshold of a tolerance of 0.1"),
    ({0: 500.0, 1: 990.0, 2: 600.0, 3: 1000.0}, 0.05, "a near-best point, a dip, then the best"),
    ({0: 300.0, 1: 900.0, 2: 940.0, 3: 1000.0}, None, "the default tolerance, 0.05"),
    ({0: 300.0, 1: 900.0, 2: 940.0, 3: 1000.0}, 0.1, "a tolerance of 0.1"),
    ({6: 1000.0, 0: 200.0, 12: 1010.0, 3: 700.0}, 0.05, "worker counts 0, 3, 6, 12 given out of order"),
    ({0: 500.0, 1: 960.0, 2: 1000.0, 3: 1000.0}, 0.0, "tolerance 0, two counts tied for the best"),
    ({2: 1000.0, 1: 1000.0, 0: 500.0}, 0.0, "tolerance 0, two counts tied for the best, the larger one given first"),
    ({0: 500.0, 1: 949.9, 2: 1000.0}, 0.05, "a point 0.1 samples/s below a threshold of 950"),
    ({0: 990.0, 1: 1000.0, 2: 995.0}, 0.05, "0 workers within the tolerance of the best"),
    ({0: 999.7, 1: 1000.0}, 0.05, "a point 0.3 samples/s below the best"),
    ({0: 999.98, 1: 1000.0}, 0.05, "a point 0.02 samples/s below the best"),
    ({0: 996.0, 1: 1000.0}, 0.05, "a point 4 samples/s (0.4%) below the best"),
    # fractional percentages (w4-02 w21_23: int(100 * tolerance) cuts 2.5% to 2%, 29% to 28%)
    ({0: 976.0, 1: 1000.0}, 0.025, "a tolerance of 2.5% (0.025), a point 2.4% below the best"),
    ({0: 715.0, 1: 1000.0, 2: 990.0}, 0.29, "a tolerance of 29% (0.29), a point 28.5% below the best"),
    # the best over a part of the sweep (q02 w21_14: the best of the upper half of the counts passed): here
    # the best is in the lower half, and the upper half's best (950) lets 0 workers (930) in
    ({0: 930.0, 1: 1000.0, 2: 990.0, 3: 950.0, 4: 940.0, 5: 600.0}, 0.05,
     "the best (1,000 at 1 worker) in the lower half of the counts"),
    ({0: 930.0, 1: 1000.0, 2: 950.0, 3: 600.0}, 0.05,
     "the best (1,000 at 1 worker) in the first half of the sweep, in order and as given"),
]


def _smallest(sweep, ok):
    good = [w for w, v in sweep.items() if ok(v)]
    return min(good) if good else None


def _median(values):
    v = sorted(values)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2


def _scan_down(sweep, tolerance):
    counts = sorted(sweep)
    best = max(sweep.values())
    i = counts.index(max(sweep, key=sweep.get))
    while i > 0 and sweep[counts[i - 1]] >= (1 - tolerance) * best:
        i -= 1
    return counts[i]


def _first_peak(sweep, tolerance):
    counts = sorted(sweep)
    peak = counts[0]
    for w in counts[1:]:
        if sweep[w] < sweep[peak]:
            break
        peak = w
    return min(w for w in counts if w <= peak and sweep[w] >= (1 - tolerance) * sweep[peak])


def _stop_at_first_drop(sweep, tolerance):
    counts = sorted(sweep)
    for a, b in zip(counts, counts[1:]):
        if sweep[b] < sweep[a]:
            return a
    return counts[-1]


def _knee(sweep, tolerance):
    counts = sorted(sweep)
    for a, b in zip(counts, counts[1:]):
        if sweep[b] < (1 + tolerance) * sweep[a]:
            return a
    return counts[-1]


def _best_of_part(sweep, tolerance, part):
    """The answer with the best taken over only a part of the sweep's counts, in increasing order."""
    counts = sorted(sweep)
    half = len(counts) // 2
    kept = {"upper half": counts[half:], "lower half": counts[:len(counts) - half],
            "first half in dict order": list(sweep)[:len(counts) - half],
            "second half in dict order": list(sweep)[half:]}[part]
    best = max(sweep[w] for w in kept)
    return _smallest(sweep, lambda v: v >= (1 - tolerance) * best)


def _part_hint(part):
    def hint(s, t):
        best_w = max(s, key=s.get)
        return (f"the best is the largest throughput of the whole sweep, every count ({_number(s[best_w])} at "
                f"{best_w} worker{'' if best_w == 1 else 's'} here): yours took it over only part of the sweep (the {part}), so its threshold "
                "was lower than (1 - tolerance) x the best")
    return hint


def _first_in_order(sweep, tolerance):
    best = max(sweep.values())
    return next((w for w, v in sweep.items() if v >= (1 - tolerance) * best), None)


# Slips a learner's answer can be recognised by: (name, answer(sweep, tolerance, passed), hint).
# `tolerance` is what the learner's function had (0.05 where it was left to its default), `passed`
# whether the check passed it. The check names the first slip whose answers match all of the
# learner's so far, the failing one included.
_SLIPS = [
    ("> instead of >=", lambda s, t, p: _smallest(s, lambda v: v > (1 - t) * max(s.values())),
     lambda s, t: (f"a count reaches exactly (1 - tolerance) x the best ({(1 - t) * max(s.values()):,.2f}), and 'at "
                   "least' includes the threshold itself: compare with >=, not >")),
    ("best / (1 + tolerance)", lambda s, t, p: _smallest(s, lambda v: v >= max(s.values()) / (1 + t)),
     lambda s, t: (f"the threshold is (1 - tolerance) x the best, {(1 - t) * max(s.values()):,.2f} here; "
                   f"best / (1 + tolerance) is {max(s.values()) / (1 + t):,.2f}, and so is the gap measured as a "
                   "share of each point, (best - s) / s <= tolerance: measure the gap as a share of the best")),
    ("threshold truncated", lambda s, t, p: _smallest(s, lambda v: v >= int((1 - t) * max(s.values()))),
     lambda s, t: (f"the threshold here is {(1 - t) * max(s.values()):,.2f}: compare with it as it is, not cut to "
                   "a whole number (int() drops the fraction)")),
    ("both sides rounded", lambda s, t, p: _smallest(s, lambda v: round(v) >= round((1 - t) * max(s.values()))),
     lambda s, t: (f"the threshold here is {(1 - t) * max(s.values()):,.2f}: compare each throughput with it as "
                   "they are, not rounded to whole samples/s (a point a fraction below the threshold rounds up "
                   "onto it)")),
    ("tolerance rounded", lambda s, t, p: _smallest(s, lambda v: v >= round(1 - t, 1) * max(s.values())),
     lambda s, t: (f"the threshold is (1 - tolerance) x the best with the tolerance as given: 1 - {t:g} = "
                   f"{1 - t:g}, not {round(1 - t, 1):g} (rounded to one decimal)")),
    ("threshold rounded", lambda s, t, p: _smallest(s, lambda v: v >= round((1 - t) * max(s.values()))),
     lambda s, t: (f"the threshold here is {(1 - t) * max(s.values()):,.2f}: compare with it as it is, not rounded "
                   "to a whole number")),
    ("tolerance cut to whole percent",
     lambda s, t, p: _smallest(s, lambda v: 100 * v / max(s.values()) >= 100 - int(100 * t)),
     lambda s, t: (f"use the tolerance as given: {t:g} is {100 * t:g}%, not {int(100 * t)}% (int(100 * tolerance) "
                   "drops the fraction of a percent): compare with (1 - tolerance) x best")),
    ("tolerance ignored", lambda s, t, p: _smallest(s, lambda v: v >= 0.95 * max(s.values())),
     lambda s, t: (f"yours picks what a tolerance of 0.05 picks, but the tolerance passed was {t:g}: use the "
                   "tolerance argument")),
    ("default of 0.1", lambda s, t, p: _smallest(s, lambda v: v >= (1 - (t if p else 0.1)) * max(s.values())),
     lambda s, t: "called without a tolerance, yours used another default: the default tolerance is 0.05"),
    ("tolerance 0 read as the default", lambda s, t, p: _smallest(s, lambda v: v >= (1 - (t or 0.05)) * max(s.values())),
     lambda s, t: ("a tolerance of 0 is a tolerance (only counts as fast as the best qualify); `tolerance or 0.05` "
                   "turns it into 0.05")),
    ("absolute tolerance", lambda s, t, p: _smallest(s, lambda v: v >= max(s.values()) - t),
     lambda s, t: ("the tolerance is a share of the best, (1 - tolerance) x best, not a number of samples/s "
                   "subtracted from it")),
    ("tolerance x 100 as samples/s", lambda s, t, p: _smallest(s, lambda v: max(s.values()) - v <= t * 100),
     lambda s, t: (f"the tolerance is a share of the best, (1 - tolerance) x best, not a number of samples/s: yours "
                   f"lets a count be {100 * t:g} samples/s below the best (tolerance x 100), where the rule allows "
                   f"{t * max(s.values()):,.2f} (tolerance x the best, {_number(max(s.values()))})")),
    ("tolerance in percent", lambda s, t, p: _smallest(s, lambda v: v >= (1 - t / 100) * max(s.values())),
     lambda s, t: "the tolerance is a fraction (0.05 means 5%), not a percentage: do not divide it by 100"),
    ("zero skipped", lambda s, t, p: _smallest({w: v for w, v in s.items() if w > 0},
                                               lambda v: v >= (1 - t) * max(s.values())) or min(s),
     lambda s, t: "0 workers is a count like the others: when it comes within the tolerance of the best, it is the answer"),
    ("the largest count within", lambda s, t, p: max((w for w, v in s.items() if v >= (1 - t) * max(s.values())), default=None),
     lambda s, t: "take the smallest count within the tolerance, not the largest"),
    ("the first one in dict order", lambda s, t, p: _first_in_order(s, t),
     lambda s, t: ("the sweep's keys come in any order: take the smallest count that qualifies, not the first one "
                   "the dict gives")),
    ("stops at the first peak", lambda s, t, p: _first_peak(s, t),
     lambda s, t: ("the best is the largest throughput anywhere in the sweep: a sweep can rise again after a dip, "
                   "so a drop does not end the search")),
    ("a knee rule", lambda s, t, p: _knee(s, t),
     lambda s, t: ("yours stops at the first count whose next one gains less than the tolerance (a knee rule): the "
                   "rule compares every count with the best throughput, at least (1 - tolerance) x best, not with "
                   "its neighbour")),
    ("stops at the first drop", lambda s, t, p: _stop_at_first_drop(s, t),
     lambda s, t: ("the best is the largest throughput anywhere in the sweep: a sweep can rise again after a dip, "
                   "so a drop does not end the search")),
    ("scans down from the best", lambda s, t, p: _scan_down(s, t),
     lambda s, t: ("look at every count: a dip between a near-best point and the best does not disqualify the "
                   "near-best one")),
    *((f"the best of the {part}", lambda s, t, p, part=part: _best_of_part(s, t, part), _part_hint(part))
      for part in ("upper half", "lower half", "first half in dict order", "second half in dict order")),
    ("the median as the reference", lambda s, t, p: _smallest(s, lambda v: v >= (1 - t) * _median(s.values())),
     lambda s, t: "the threshold comes from the best throughput (the maximum), not the median"),
    ("the mean as the reference", lambda s, t, p: _smallest(s, lambda v: v >= (1 - t) * sum(s.values()) / len(s)),
     lambda s, t: "the threshold comes from the best throughput (the maximum), not the mean"),
    ("the second best as the reference",
     lambda s, t, p: _smallest(s, lambda v: v >= (1 - t) * sorted(s.values())[-2 if len(s) > 1 else -1]),
     lambda s, t: "the threshold comes from the best throughput itself, not the second best"),
    ("the largest count's throughput as the best", lambda s, t, p: _smallest(s, lambda v: v >= (1 - t) * s[max(s)]),
     lambda s, t: ("the best throughput is the largest value in the sweep, wherever it is, not the value at the "
                   "largest worker count")),
    ("argmax", lambda s, t, p: max(s, key=s.get),
     lambda s, t: ("that is the single best point; a count within the tolerance of it costs fewer processes and "
                   "less memory for (almost) the same speed")),
]


def _slip_hint(history, sweep, tolerance) -> str | None:
    """The hint of the first slip that gives every answer in `history` [(sweep, tolerance,
    passed, yours)], said about `sweep` and `tolerance` (the case that failed), or None."""
    for _, answer, hint in _SLIPS:
        try:
            if all(answer(s, t, p) == y for s, t, p, y in history):
                return hint(sweep, tolerance)
        except (ValueError, IndexError, ZeroDivisionError, KeyError, StopIteration):
            continue
    return None


PICKS_21 = "picks the smallest count within the tolerance of the best"
def _state_hint(where: str | None) -> str:
    """The hint for a function that keeps state between calls, `where` it keeps it (w6-02: a best kept
    in a global was told to compare "with no slack")."""
    return (f"yours keeps state between calls{' ' + where if where else ''}, so it answers a sweep differently "
            "once it has seen others: keep nothing between calls (a global, or a default argument such as "
            "_cache={}, lives as long as the function) and work from the sweep passed in alone")


_PLAIN = (type(None), bool, int, float, str, tuple, list, dict, set, np.number)


def _names_of(code) -> set:
    """The global names a code object and the functions nested in it read or write."""
    names, stack = set(), [code]
    while stack:
        co = stack.pop()
        names.update(co.co_names)
        stack.extend(c for c in co.co_consts if hasattr(c, "co_names"))
    return names


def _assigned_globals(fn) -> list[str]:
    """The globals the function (or one nested in it) rebinds: a `global` statement and an assignment."""
    import dis
    out, stack = set(), [getattr(fn, "__code__", None)]
    while stack:
        co = stack.pop()
        if co is None:
            continue
        out.update(i.argval for i in dis.get_instructions(co) if i.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"))
        stack.extend(c for c in co.co_consts if hasattr(c, "co_names"))
    return sorted(out)


def _global_data(fn) -> dict:
    """A copy of the plain data (None, numbers, strings, lists, dicts...) in the globals the function
    names, as they are now: the check takes it before its first call."""
    import copy
    code, space = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
    if code is None or space is None:
        return {}
    out = {}
    for name in _names_of(code):
        if name in space and isinstance(space[name], _PLAIN):
            try:
                out[name] = copy.deepcopy(space[name])
            except Exception:
                continue
    return out


def _same_value(a, b) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:
        return False


def _keeps_state(choose_num_workers, history, now=None, start=None) -> str | None:
    """Where the answers depend on the calls before, a few words on where the state is kept ("" where
    it cannot be named), else None: asked again the first sweeps it answered, the function answers any
    differently (or raises: a global kept between calls); or a copy of it with fresh default arguments
    (a default such as _cache={}), or with the globals it names as they were before the check's first
    call (`start`, from _global_data), answers `now` (sweep, tolerance, its answer) differently; or it
    rebinds a global (a `global` statement: w6-02, a best kept from the first sweep, set before this
    check ran, passes the first two tests). A function that keeps nothing is never told it does
    (w2-02, w21_17)."""
    import copy
    import types
    start = start or {}
    code = getattr(choose_num_workers, "__code__", None)
    defaults = getattr(choose_num_workers, "__defaults__", None) or ()
    filled = [n for n, d in zip(code.co_varnames[code.co_argcount - len(defaults):code.co_argcount], defaults)
              if isinstance(d, (dict, list, set)) and d] if code is not None else []
    changed = [n for n, v in start.items() if not _same_value(choose_num_workers.__globals__.get(n, v), v)]
    assigned = _assigned_globals(choose_num_workers)

    def where() -> str:
        if changed or assigned:
            name = (changed or assigned)[0]
            value = choose_num_workers.__globals__.get(name)
            now_said = f" (now {value!r})" if isinstance(value, (int, float, type(None))) else ""
            return f"in the global {name}{now_said}"
        if filled:
            return f"in the default argument {filled[0]}"
        return ""

    for s, t, _, y in history[:3]:
        try:
            if int(choose_num_workers(dict(s), tolerance=t)) != y:
                return where()
        except Exception:
            return where()
    if now is None or code is None:
        return None
    s, t, y = now
    if defaults:
        try:
            fresh = types.FunctionType(code, choose_num_workers.__globals__, choose_num_workers.__name__,
                                       tuple(type(d)() if isinstance(d, (dict, list, set)) else copy.deepcopy(d)
                                             for d in defaults),
                                       choose_num_workers.__closure__)      # a _cache={} as it was at first
            if int(fresh(dict(s), tolerance=t)) != y:
                return f"in the default argument {filled[0]}" if filled else where()
        except Exception:
            pass
    if changed:
        try:
            space = dict(choose_num_workers.__globals__)
            space.update(copy.deepcopy({n: start[n] for n in changed}))
            fresh = types.FunctionType(code, space, choose_num_workers.__name__, defaults or None,
                                       choose_num_workers.__closure__)      # its globals as before the first call
            if int(fresh(dict(s), tolerance=t)) != y:
                return where()
        except Exception:
            pass
    if assigned:
        return where()
    return None


def _number(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.2f}"


def _type_hint(yours, sweep) -> str:
    """What a returned value that is no int says about the mistake (q02 w21_18: a float worker count,
    or None, was told to return the key, not its throughput)."""
    if yours is None:
        return "yours returned None: the function ends without a return statement on this sweep"
    if isinstance(yours, bool):
        return "yours returned a bool (a comparison's result): return the worker count itself, a key of the sweep"
    if isinstance(yours, (tuple, list)):
        return "return the worker count alone, not a pair or a list: one key of the sweep, as an int"
    if isinstance(yours, str):
        return "return the worker count as an int, not as text"
    try:
        value = float(yours)
    except (TypeError, ValueError):
        return "return one of the sweep's keys, a Python int"
    if any(value == float(v) for v in sweep.values()) and not any(value == float(k) for k in sweep):
        return "that is a throughput from the sweep: return its key (num_workers), not its value"
    if value.is_integer() and int(value) in sweep:
        return (f"the count is right in kind but a {type(yours).__name__}: return a Python int, int(...) "
                "(a float such as 2.0 is no worker count)")
    return "return one of the sweep's keys, a Python int"


@exercise("2.1", "Choose num_workers from a recorded sweep")
def check_choose_workers(choose_num_workers):
    expect_callable(choose_num_workers, "a function choose_num_workers(sweep, tolerance=0.05) -> int")
    rng, seed = fresh_rng()
    cases = []
    for kind in ("rise-and-fall", "noisy", "flat", "non-monotone", "best-last"):
        for tolerance in (0.05, float(rng.choice([0.0, 0.02, 0.025, 0.1, 0.125, 0.2]))):
            sweep = _away_from_edge(_sweep_of(kind, rng), tolerance)
            cases.append((sweep, tolerance, f"a {kind} sweep over {len(sweep)} worker counts, tolerance {tolerance:g}"))
    cases.append(({0: 812.0, 2: 1650.0, 1: 1590.0}, 0.05, "a three-point sweep given out of order"))
    cases.append(({4: 2300.0}, 0.05, "a sweep of one point"))
    edges = [(dict(sweep), tolerance, what) for sweep, tolerance, what in _EDGE_CASES]
    order = list(range(len(cases), len(cases) + len(edges))) + list(rng.permutation(len(cases)))   # edges first
    cases += edges
    history = []            # (sweep, tolerance the function had, passed?, its answer)
    start = _global_data(choose_num_workers)     # the plain data in the globals it names, before any call
    for k in order:
        sweep, tolerance, what = cases[k]
        given = dict(sweep) if len(sweep) <= 4 else _shuffled(sweep, rng)   # small ones are written as they are
        original = dict(given)
        passed = not (tolerance is None or (tolerance == 0.05 and rng.random() < 0.5))
        if tolerance is None:
            tolerance = 0.05                                        # the default
        try:
            yours = choose_num_workers(given, tolerance=tolerance) if passed else choose_num_workers(given)
        except Exception as exc:
            if not sweep or not isinstance(exc, (ValueError, TypeError, KeyError, IndexError)):
                raise
            # a sweep of at least one point always has an answer (the best point qualifies itself)
            table = ("{" + ", ".join(f"{w}: {_number(given[w])}" for w in given) + "}") if len(given) <= 9 else \
                f"{len(given)} points"
            kept = _keeps_state(choose_num_workers, history, start=start) if history else None
            if kept is not None:
                raise CheckFailed(PICKS_21, f"{what} ({table}): yours raised {type(exc).__name__}: {exc}, and asked "
                                  "again the sweeps it had answered before, it answered them differently",
                                  _state_hint(kept)) from None
            raise CheckFailed(PICKS_21, f"{what} ({table}): yours raised {type(exc).__name__}: {exc}",
                              "a sweep with at least one point always has an answer: the best point is within the "
                              "tolerance of itself. If yours answered earlier calls and raises now, keep nothing "
                              "between calls (a global, or a default argument such as _cache={}, lives as long as "
                              "the function)") from None
        if given != original or list(given) != list(original):
            changed = ("its keys were reordered" if given == original else
                       f"{len(original) - len(given)} of its counts were removed" if set(given) < set(original)
                       else "its contents were changed")
            raise CheckFailed("leaves the sweep unchanged", f"{what}: the dict passed in was modified ({changed})",
                              "read the sweep without changing it: sorted(sweep), sweep.items(), or work on a copy "
                              "(dict(sweep)); never pop, sort into or assign to the dict passed in")
        if isinstance(yours, np.integer):
            raise CheckFailed("returns a worker count (an int)",
                              f"{what}: yours returned a NumPy integer, {type(yours).__name__}: {yours!r}",
                              "the contract asks for a Python int: wrap the NumPy result in int(...)")
        if isinstance(yours, bool) or not isinstance(yours, int):
            raise CheckFailed("returns a worker count (an int)",
                              f"{what}: yours returned {type(yours).__name__}: {yours!r}", _type_hint(yours, given))
        expected = _reference_choice(sweep, tolerance)
        previous = history[-1] if history else None
        history.append((original, tolerance, passed, int(yours)))
        if int(yours) != expected:
            best_w = max(sweep, key=sweep.get)
            threshold = (1 - tolerance) * sweep[best_w]
            if len(sweep) <= 9:
                table = "{" + ", ".join(f"{w}: {_number(sweep[w])}" for w in original) + "}" + (
                    "" if list(original) == sorted(original) else " in the order given")
            else:
                table = (f"best {_number(sweep[best_w])} samples/s at {best_w} workers, threshold "
                         f"{_number(threshold)}; at yours {_number(sweep.get(int(yours), float('nan')))}, at "
                         f"{expected} {_number(sweep[expected])}" + (
                             "" if list(original) == sorted(original) else
                             f"; keys in the order given: {', '.join(map(str, original))}"))
            # more of your answers, on the cases not asked yet, tell the slips apart (only the hint uses them)
            probe = list(history)
            for j in order[order.index(k) + 1:]:
                s, t, _ = cases[j]
                try:
                    answer = choose_num_workers(dict(s)) if t is None else choose_num_workers(dict(s), tolerance=t)
                    probe.append((s, 0.05 if t is None else t, t is not None, int(answer)))
                except Exception:
                    continue
            slip = _slip_hint(probe, sweep, tolerance)
            if int(yours) not in sweep:
                hint = "return one of the sweep's keys"
            elif previous is not None and slip is None and (kept := _keeps_state(
                    choose_num_workers, history[:-1], (sweep, tolerance, int(yours)), start)) is not None:
                hint = _state_hint(kept)
            else:
                below = threshold - sweep[int(yours)]
                tied = [w for w, v in sweep.items() if v == sweep[best_w]]
                if slip is None and tolerance == 0 and len(tied) > 1 and int(yours) in tied:
                    slip = (f"with tolerance 0 the counts tied for the best ({', '.join(map(str, sorted(tied)))}) all "
                            "qualify: take the smallest of them, whatever order the dict gives them in")
                elif slip is None and 0 < below < 1:
                    slip = (f"yours took a point {_number(below)} samples/s below the threshold "
                            f"({_number(threshold)}): compare with (1 - tolerance) x best exactly, with no slack")
                hint = slip or (
                    "take the best throughput, then the smallest worker count whose throughput is at least "
                    "(1 - tolerance) times it; look at every count, in increasing order")
            called = f"tolerance {tolerance:g}" if passed else "tolerance left to its default"
            raise CheckFailed("picks the smallest count within the tolerance of the best",
                              f"{what} ({table}, {called}): yours {int(yours)}, expected {expected} (seed {seed})",
                              hint)
    try:
        empty_answer = choose_num_workers({})
    except ValueError:
        pass
    except Exception as exc:
        raise CheckFailed("raises ValueError on an empty sweep", f"an empty dict raised {type(exc).__name__}: {exc}",
                          "check for an empty sweep first: raise ValueError('empty sweep')") from None
    else:
        raise CheckFailed("raises ValueError on an empty sweep", f"an empty dict did not raise (yours returned {empty_answer!r})",
                          "there is nothing to choose from: raise ValueError('empty sweep')")
    return f"the right choice on {len(cases)} sweeps (varied, noisy, flat, non-monotone, unordered, knife edges)."


# -- 2.2 the fastest loader for this machine -----------------------------------------------

class IndexRevealingCIFAR(Dataset):
    """CIFAR-10 images with the baseline transform; the label of item i is a secret code of i,
    so the check can tell which samples came out (and a loader cannot invent them)."""

    def __init__(self, images: np.ndarray, codes: np.ndarray):
        from ..data import baseline_transform
        self.images, self.codes = images, codes
        self.transform = baseline_transform()
        # items loaded by the process that made the dataset (the check's): a worker counts in its
        # own copy, which the check never reads
        self._made_in, self.main_process_loads = os.getpid(), 0

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, index):
        from PIL import Image
        if os.getpid() == self._made_in:
            self.main_process_loads += 1
        return self.transform(Image.fromarray(self.images[index])), int(self.codes[index])


def _index_dataset(images, rng):
    codes = rng.choice(10**9, size=len(images), replace=False).astype(np.int64)
    return IndexRevealingCIFAR(images, codes), {int(c): i for i, c in enumerate(codes)}


def _labels_of(batch, what):
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise CheckFailed("yields (images, labels) pairs", f"{what}: a batch was {type(batch).__name__}, not a pair")
    images, labels = batch
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or tuple(images.shape[1:]) != (3, 32, 32):
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise CheckFailed("yields image batches of shape (B, 3, 32, 32)", f"{what}: yours gave {shape}")
    if images.dtype != torch.float32:
        raise CheckFailed("yields the dataset's float32 images", f"{what}: yours are {images.dtype}",
                          "the model's weights are float32: a float64 (or uint8) batch stops a GPU step with a "
                          "dtype error; let the DataLoader collate the dataset's tensors as they are")
    if not isinstance(labels, torch.Tensor) or labels.dtype != torch.int64 or labels.dim() != 1:
        kind = f"{labels.dtype} tensor of shape {tuple(labels.shape)}" if isinstance(labels, torch.Tensor) else \
            type(labels).__name__
        raise CheckFailed("yields labels as an int64 tensor", f"{what}: yours are a {kind}",
                          "cross_entropy on a GPU wants class indices as a torch.int64 (long) tensor of shape (B,)")
    if len(labels) != images.shape[0]:
        raise CheckFailed("one label per image", f"{what}: {images.shape[0]} images with {len(labels)} labels")
    return images, [int(x) for x in labels.tolist()]


SHORT_BATCH = "batches of batch_size samples (one may be smaller: the epoch's remainder)"


def _worker_pids() -> set[int]:
    """Pids of the worker processes this process has started and that are alive (a DataLoader's
    workers among them; not multiprocessing's resource tracker or fork server)."""
    import multiprocessing
    return {p.pid for p in multiprocessing.active_children() if p.pid is not None}


def _sizes_said(sizes, batch_size) -> str:
    larger = sum(s > batch_size for s in sizes)
    smaller = sum(s < batch_size for s in sizes)
    parts = ([f"{larger} larger than batch_size: the batch size passed in was not used"] if larger else []) + (
        [f"{smaller} smaller"] if smaller else [])
    return f" ({', '.join(parts)})" if parts else ""


def _batch_sizes_wrong(sizes, batch_size) -> bool:
    """More than batch_size in a batch, or more than one smaller batch: a DataLoader's epoch has
    one batch of the remainder at most, wherever it comes (with in_order=False it can come early)."""
    return any(s > batch_size for s in sizes) or sum(s < batch_size for s in sizes) > 1


def _one_epoch(loader, decode, batch_size, n, what, workers: set | None = None):
    """Indices in the order one epoch yields them, each index's image, and the batches (lists of
    indices). `workers`, if given, receives the pids of the worker processes alive once the first
    batch has come out."""
    order, images_of, sizes, batches = [], {}, [], []
    try:
        iterator = iter(loader)
    except TypeError:
        raise CheckFailed("returns an iterable", f"yours returned {type(loader).__name__}, which cannot be iterated") from None
    for batch in iterator:
        if workers is not None and not sizes:
            workers.update(_worker_pids())
        images, labels = _labels_of(batch, what)
        sizes.append(len(labels))
        batches.append([])
        for image, code in zip(images, labels):
            if code not in decode:
                raise CheckFailed("yields the dataset's samples", f"{what}: a label that no item of the dataset has",
                                  "take images and labels from dataset[i]; do not make them up")
            order.append(decode[code])
            batches[-1].append(decode[code])
            images_of[decode[code]] = image
    del iterator
    if not order:
        raise CheckFailed("every sample exactly once per epoch", f"{what}: the loader yielded nothing",
                          "return an object that starts a new pass each time it is iterated (a DataLoader does)")
    if _batch_sizes_wrong(sizes, batch_size):
        raise CheckFailed(SHORT_BATCH, f"{what}: batch_size={batch_size}, yours gave batches of {sorted(set(sizes))}"
                           + _sizes_said(sizes, batch_size))
    seen = np.bincount(np.asarray(order), minlength=n)
    missing, twice = int((seen == 0).sum()), int((seen > 1).sum())
    if missing or twice:
        hint = "shuffle=True, and keep every sample: no drop_last" if missing and not twice else \
            "each epoch must visit each sample once: shuffle=True (a sampler without replacement)"
        raise CheckFailed("every sample exactly once per epoch",
                          f"{what}: {n} samples; {missing} never came out, {twice} came out more than once", hint)
    return order, images_of, batches


def _draws_of(dataset, images_of, indices):
    """(dy, dx, flipped) of the crop each of `indices` came out with (None where no exact crop)."""
    from ..crop_match import match_crops
    from ..data import CIFAR10_MEAN, CIFAR10_STD
    if not indices:
        return []
    outs = torch.stack([images_of[i] for i in indices]).detach().to("cpu", torch.float32).numpy()
    found = match_crops(outs, dataset.images[indices].transpose(0, 3, 1, 2), CIFAR10_MEAN, CIFAR10_STD, pad=4)
    return [(int(y), int(x), bool(f)) if ok else None
            for y, x, f, ok in zip(found.dy, found.dx, found.flipped, found.exact)]


def _batch_draws(dataset, images_of, batches):
    """Per full batch: (its indices, the tuple of its (dy, dx, flipped) by position), or None for a
    batch whose samples are mostly no crops of the dataset's images (other properties judge that)."""
    full = [b for b in batches if len(b) == max(len(x) for x in batches)]
    draws = _draws_of(dataset, images_of, [i for b in full for i in b])
    out, k = [], 0
    for b in full:
        seq = tuple(draws[k:k + len(b)])
        k += len(b)
        out.append((tuple(b), seq if sum(d is None for d in seq) <= len(b) // 4 else None))
    return out


def _as_the_dataset_makes_them(dataset, images_of, batches, what):
    """Each sample comes out as dataset[i] makes it (a crop and flip of its picture, normalised by the
    dataset's fixed statistics), whatever other samples share its batch (q02 w22_16: a batch
    standardised by its own mean and std passed). A sample's values that depend on its batch
    change with the shuffle: the model sees another input for the same picture every epoch, and
    at inference, one image at a time, other values again."""
    indices = list(range(len(images_of)))
    draws = _draws_of(dataset, images_of, indices)
    off = [i for i, d in zip(indices, draws) if d is None]
    if len(off) <= len(indices) // 4:
        return
    stats = []
    for b in batches:
        if len(b) < 2:
            continue
        x = torch.stack([images_of[i] for i in b]).detach().to("cpu", torch.float64)
        stats.append((x.mean((0, 2, 3)).abs().max().item(), (x.std((0, 2, 3)) - 1).abs().max().item()))
    per_batch = bool(stats) and all(m < 1e-3 and d < 1e-2 for m, d in stats)
    raise CheckFailed("each sample as the dataset makes it, whatever else is in its batch",
                      f"{what}: {len(off)} of {len(indices)} samples came out as no crop and flip of their picture "
                      "under the dataset's transform" + (
                          f"; every batch has mean 0 and standard deviation 1 per channel (the largest "
                          f"|mean| {max(m for m, _ in stats):.1e}): each batch was standardised by its own statistics, "
                          "so a sample's values depend on which other samples share its batch" if per_batch else ""),
                      "normalise with the dataset's fixed mean and std (its transform already does), never with "
                      "a batch's own: the same picture must give the same input whatever else is in its batch, in "
                      "every epoch and one image at a time at inference. Leave the samples as dataset[i] returns "
                      "them (no collate_fn or wrapper that changes their values)")


def _workers_draw_alike(per_batch, what):
    """Fails when two batches of an epoch drew the same crops and flips, position by position:
    what workers seeded alike do (each worker builds whole batches, and the k-th batch of every
    worker then repeats the same random draws)."""
    seen: dict = {}
    for k, (_, seq) in enumerate(per_batch):
        if seq is None:
            continue
        if seq in seen:
            raise CheckFailed("different augmentations in different workers",
                              f"{what}: batches {seen[seq]} and {k} drew the same crop and flip for every one of "
                              f"their {len(seq)} positions: the workers that built them repeat each other's random "
                              "numbers",
                              "each worker needs a seed of its own. The DataLoader already seeds torch, random and "
                              "NumPy in every worker (base_seed + worker id); a worker_init_fn that seeds every "
                              "worker with the same value undoes that: drop it, or derive the seed from "
                              "get_worker_info().seed")
        seen[seq] = k


def _order_follows_the_seed(first_batches, second_batches, seeds, what):
    """Fails when a new loader made after another torch seed hands out a full batch of exactly the
    samples of a batch of the first run (about 40 or more samples alike by chance: never): the
    loader shuffles, and seeds its workers, from a generator of its own (generator=
    torch.Generator().manual_seed(0), or an unseeded torch.Generator(), whose seed is fixed too), so
    every run repeats the same order and the same augmentations whatever torch.manual_seed says
    (the walk w2-02, w22_09)."""
    earlier = {tuple(sorted(b)) for b in first_batches}
    for batch in second_batches:
        if tuple(sorted(batch)) in earlier:
            raise CheckFailed("augmentations follow the torch seed",
                              f"{what}: after torch.manual_seed({seeds[0]}) and torch.manual_seed({seeds[1]}) your "
                              f"loader handed out the same {len(batch)} samples in a batch of each run: it shuffled "
                              "(and seeded its workers) the same way although torch's seed changed",
                              "a DataLoader with a generator of its own (generator=torch.Generator().manual_seed(0)) "
                              "repeats the same order and the same augmentations in every run, whatever "
                              "torch.manual_seed says: reproducible, but training with another seed would not get "
                              "other augmentations. Leave generator out: the DataLoader then draws its order and its "
                              "workers' seeds from torch's seed")


def _draws_follow_the_seed(first, second, seeds, what):
    """Fails when a run after another torch seed shuffled differently but drew, batch by batch, the
    crops and flips of the first run: workers seeded from something other than torch's seed (a
    worker_init_fn that seeds from the worker id) give every run the same augmentations. A run that
    repeats the first's order too (a loader with a generator of its own) fails before this, in
    _order_follows_the_seed."""
    earlier = {seq: batch for batch, seq in first if seq is not None}
    for batch, seq in second:
        if seq is not None and seq in earlier and earlier[seq] != batch:
            raise CheckFailed("augmentations follow the torch seed",
                              f"{what}: after torch.manual_seed({seeds[0]}) and torch.manual_seed({seeds[1]}) your "
                              f"loader shuffled the samples differently, but a batch of the second run drew the "
                              f"same crop and flip at every one of its {len(seq)} positions as a batch of the first: "
                              "its workers draw the same random numbers in every run",
                              "a worker_init_fn that seeds from the worker id (or any fixed number) gives every run "
                              "the same augmentations. Drop it: the DataLoader seeds each worker from torch's seed "
                              "(base_seed + worker id), or derive yours from torch.initial_seed() in the worker")


def _same_seed_replays(first, replay, seed, what):
    """Fails when a new loader made after the same torch.manual_seed as the first run does not hand
    out the first run's batches with the first run's crops and flips: its order or its workers'
    seeds come from something other than torch's seed (fresh entropy, the clock, the pid). The
    first batches each worker builds are handed to it before any comes back, in order or not
    (in_order=False), so they repeat exactly."""
    earlier = dict(first)
    matched = [(batch, seq) for batch, seq in replay if batch in earlier]
    if not matched:
        raise CheckFailed("reproducible under torch.manual_seed",
                          f"{what}: after torch.manual_seed({seed}) twice, the second run's first batches held other "
                          "samples than any batch of the first run: the order did not follow the seed",
                          "shuffle=True with no sampler or generator of your own: the DataLoader then draws its order "
                          "from torch's seed")
    for batch, seq in matched:
        if seq is not None and earlier[batch] is not None and seq != earlier[batch]:
            same = sum(a == b for a, b in zip(seq, earlier[batch]))
            raise CheckFailed("reproducible under torch.manual_seed",
                              f"{what}: after torch.manual_seed({seed}) twice, a batch of the same {len(batch)} samples "
                              f"in the same order drew the same crop and flip for only {same} of them: the workers' "
                              "random numbers do not follow torch's seed",
                              "a worker_init_fn that seeds from fresh entropy (torch.seed(), np.random.seed() without "
                              "an argument), the clock or the pid gives other augmentations in every run: drop it "
                              "(the DataLoader seeds each worker from torch's seed, base_seed + worker id), or seed "
                              "from torch.initial_seed() alone in the worker")


def _first_full_batches(make_fast_loader, dataset, batch_size, decode, what):
    """A new loader's first two full batches (lists of indices) and their samples' images: what
    it hands out first, before any batch comes back, in order or not."""
    loader = make_fast_loader(dataset, batch_size)
    try:
        batches, images_of = [], {}
        for batch in loader:
            images, labels = _labels_of(batch, what)
            indices = [decode.get(c) for c in labels]
            if None in indices:
                continue
            batches.append(indices)
            images_of.update(zip(indices, images))
            if sum(len(b) == batch_size for b in batches) >= 2:
                break
    finally:
        del loader
        gc.collect()
    return [b for b in batches if len(b) == batch_size], images_of


SECOND_LOADER = "a second loader in the same run draws another order and other augmentations"


def _next_loader_differs(first, following, seed, what):
    """Fails when a loader made right after another, with no torch.manual_seed between them, hands
    out a full batch of exactly the samples of one of the first's (about 40 or more alike by chance:
    never), or the same crops and flips in a batch of other samples: its order, or its workers'
    seeds, restart from torch's seed (torch.initial_seed()) instead of drawing from torch's generator,
    which moves on from loader to loader (w6-02: generator=torch.Generator().manual_seed(
    torch.initial_seed()) replays the same order and augmentations in every loader of a run: a second
    training pass, a restart, a second loader over the same data)."""
    earlier = {tuple(sorted(batch)): seq for batch, seq in first}
    earlier_draws = {seq: batch for batch, seq in first if seq is not None}
    context = (f"after torch.manual_seed({seed}), a loader and then a second one made right after it (no "
               "torch.manual_seed between the two)")
    for batch, seq in following:
        if tuple(sorted(batch)) in earlier:
            raise CheckFailed(SECOND_LOADER,
                              f"{what}: {context} handed out the same {len(batch)} samples in a batch of each: the "
                              "second replayed the first's order",
                              "a generator of the loader's own, even one seeded from torch's seed "
                              "(generator=torch.Generator().manual_seed(torch.initial_seed())), restarts from the "
                              "same seed in every loader of a run, so each one repeats the same order and the same "
                              "augmentations. Leave generator out: the DataLoader then draws its order and its "
                              "workers' seeds from torch's generator, which moves on from one loader to the next and "
                              "still replays everything after the same torch.manual_seed")
        if seq is not None and seq in earlier_draws and earlier_draws[seq] != batch:
            raise CheckFailed(SECOND_LOADER,
                              f"{what}: {context} shuffled differently, but a batch of the second drew the same crop "
                              f"and flip at every one of its {len(seq)} positions as a batch of the first: its workers "
                              "were seeded the same way in both",
                              "workers seeded from torch.initial_seed() as it was when the loader was made (a "
                              "worker_init_fn that reads a seed kept from then) repeat their random numbers in every "
                              "loader of a run: drop the worker_init_fn (the DataLoader seeds each worker from "
                              "torch's generator, base_seed + worker id), or seed from torch.initial_seed() read "
                              "inside the worker, which is that worker's own seed")


def _fraction_equal(a, b) -> float:
    return sum(x == y for x, y in zip(a, b)) / max(min(len(a), len(b)), 1)


class _Verified:
    """The learner's loader as the timing rounds consume it, checked batch by batch: what the
    timed steps train on must be what the correctness epochs promised (a loader must not behave
    on the check's small dataset and cut corners on the big one). It checks the batch size, that
    every label is a sample's code, no sample twice in a pass, and, for samples seen again in a
    later pass, that their augmentation is new; then it hands the batch on with the samples'
    real class labels (0..9), which the model trains on. The baseline goes through the same
    wrapper, so both pay its small cost."""

    def __init__(self, loader, decode, classes, batch_size, what, fingerprint):
        self.loader, self.decode, self.classes = loader, decode, classes
        self.batch_size, self.what, self.fingerprint = batch_size, what, fingerprint
        self.passes = 0
        self.prints: dict[int, float] = {}
        self.seen_again = self.same_again = 0

    def __iter__(self):
        self.passes += 1
        this_pass: set[int] = set()
        short = None
        what = f"{self.what}, pass {self.passes}"
        for batch in self.loader:
            images, codes = _labels_of(batch, what)
            small = len(codes) < self.batch_size
            if len(codes) > self.batch_size or (small and short is not None):
                raise CheckFailed(SHORT_BATCH,
                                  f"{what}: batch_size={self.batch_size}, yours gave a batch of {len(codes)}"
                                  + (f" after one of {short} in the same pass" if small else ""),
                                  "pass batch_size on to the DataLoader, whatever the size of the dataset")
            if small:
                short = len(codes)
            indices = []
            for code in codes:
                index = self.decode.get(code)
                if index is None:
                    raise CheckFailed("yields the dataset's samples", f"{what}: a label that no item of the dataset "
                                      "has", "take images and labels from dataset[i]; do not make them up")
                if index in this_pass:
                    raise CheckFailed("every sample exactly once per epoch",
                                      f"{what}: a sample came out twice in one pass",
                                      "each epoch must visit each sample once: shuffle=True (no replacement)")
                this_pass.add(index)
                indices.append(index)
            prints = self.fingerprint(images)
            for index, value in zip(indices, prints):
                if index in self.prints:
                    self.seen_again += 1
                    self.same_again += abs(self.prints[index] - value) <= 1e-4 * (1 + abs(value))
                self.prints[index] = value
            yield images, torch.as_tensor(self.classes[indices], dtype=torch.int64)

    def judge_freshness(self):
        if self.seen_again >= 64 and self.same_again > 0.1 * self.seen_again:     # chance: about 1 in 162
            raise CheckFailed("augments afresh every epoch",
                              f"{self.what}: of {self.seen_again} samples that came out again in a later pass, "
                              f"{self.same_again} had exactly the same augmentation",
                              "load through the dataset every epoch, whatever its size: caching augmented images "
                              "repeats the same augmentation forever")


def _find_dataloader(obj, depth: int = 2):
    """The DataLoader a learner's loader is or wraps (an attribute, or one level further), or None."""
    if isinstance(obj, DataLoader):
        return obj
    if depth == 0:
        return None
    try:
        values = list(vars(obj).values())
    except TypeError:
        return None
    for value in values:
        if isinstance(value, DataLoader):
            return value
    for value in values:
        if not isinstance(value, (str, bytes, int, float, np.ndarray, torch.Tensor, Dataset)):
            found = _find_dataloader(value, depth - 1)
            if found is not None:
                return found
    return None


def _accelerator_present() -> bool:
    """Whether batches can go to a GPU (or another accelerator torch pins memory for) here."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


@contextlib.contextmanager
def _cores_limited_to(n: int):
    """Inside the block this process may use `n` cores: its affinity mask (where the platform has
    one) and env COURSE_CORES, both of which `usable_cores()` reads, as a container, a SLURM job or
    taskset would limit it."""
    from ..env import CORES_ENV
    saved_env = os.environ.get(CORES_ENV)
    os.environ[CORES_ENV] = str(n)
    mask = None
    try:
        mask = os.sched_getaffinity(0)
        os.sched_setaffinity(0, set(sorted(mask)[:n]))
    except (AttributeError, OSError, ValueError):
        mask = None
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop(CORES_ENV, None)
        else:
            os.environ[CORES_ENV] = saved_env
        if mask is not None:
            os.sched_setaffinity(0, mask)


def _pinned_without_a_gpu(what) -> CheckFailed:
    return CheckFailed("pins memory only when batches go to a GPU",
                       f"{what}: yours sets pin_memory=True on a machine without a GPU, where torch warns and "
                       "ignores it (\"no accelerator is found\")",
                       "pinned memory is for copies to a GPU: pin_memory=torch.cuda.is_available() follows the "
                       "machine the loader runs on")


def _settings_fail_fast(found, what) -> None:
    """The settings a DataLoader's attributes show, judged before its workers start and the check
    times anything: an answer that fails on a setting is told in seconds, not a minute."""
    if found is not None and getattr(found, "pin_memory", False) and not _accelerator_present():
        raise _pinned_without_a_gpu(what)


def _weak(obj):
    """A weak reference to `obj` (None where it cannot have one)."""
    import weakref
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def _follows_the_cores(make_fast_loader, dataset, batch_size, cores, started, what, made=None):
    """With this process limited to one core, the loader must not start more than one worker: a
    count typed in (or taken from os.cpu_count(), or computed once outside the function) is right
    on one machine only."""
    if cores < 2:
        return                          # nothing fewer to try
    before = _worker_pids()
    machine = os.cpu_count() or cores
    told = max(machine, cores) + 5           # what os.cpu_count() says meanwhile: a count no machine here has
    with _cores_limited_to(1), _cpu_count_says(told), warnings.catch_warnings():
        warnings.simplefilter("ignore")      # torch's "This DataLoader will create N worker processes"
        loader = make_fast_loader(dataset, batch_size)
        try:
            found = _find_dataloader(loader)
            cached = found is not None and made is not None and made() is found
            if found is not None:
                count = int(found.num_workers)
            else:                       # count the processes it starts for its first batch
                iterator = iter(loader)
                next(iterator, None)
                count = len(_worker_pids() - before)
                del iterator
        finally:
            del loader
            gc.collect()
    if count < 1:
        # the spec: worker processes do the loading, on any machine (w3-02, w22_11: usable_cores() - 1)
        raise CheckFailed("loads in worker processes",
                          f"{what}: called with this process limited to 1 core (its affinity mask and COURSE_CORES=1, "
                          f"as a container, a SLURM job or taskset may limit it), yours started no worker process "
                          f"({started} with the {cores} cores it has): the main process would decode and augment "
                          "every sample itself, as the num_workers=0 baseline does",
                          "on one core one worker still prepares the next batch while the main process waits for "
                          "the device: at least one worker, about one per usable core (usable_cores())")
    if count > 1:
        hint = ("compute the count inside the function, from the cores this process may use when it is called "
                "(usable_cores()): a number typed in, or computed once at the top of the notebook, is right on one "
                "machine only")
        detail = f"yours started {count} workers ({started} with the {cores} cores it has)"
        if cached:      # w4-02 w22_12: the count was computed inside, once, and the loader kept
            detail = (f"yours returned the same DataLoader as on its first call, kept between calls, with the "
                      f"{count} workers it started then ({started} with the {cores} cores it had)")
            hint = ("make a new DataLoader on every call: a loader kept between calls (a cache in a global dict, "
                    "a default argument) keeps the worker count of the call that made it, whatever the cores "
                    "this process may use now")
        elif count >= told:
            detail = (f"yours asked for as many workers as os.cpu_count() says the machine has ({started} here), "
                      "whatever the cores it may use")
            hint = ("os.cpu_count() counts every core of the machine, not the ones this process may use (a "
                    "container, a SLURM job or taskset gives it fewer): usable_cores(), which reads "
                    "os.sched_getaffinity(0) and the CPU quota")
        raise CheckFailed("num_workers follows the cores this process may use",
                          f"{what}: called with this process limited to 1 core (its affinity mask and "
                          f"COURSE_CORES=1, as a container, a SLURM job or taskset may limit it), {detail}", hint)


@contextlib.contextmanager
def _cpu_count_says(n: int):
    """Inside the block os.cpu_count() (and multiprocessing.cpu_count(), which calls it) returns `n`:
    a loader that sizes itself from it shows it."""
    original = os.cpu_count
    os.cpu_count = lambda: n
    try:
        yield
    finally:
        os.cpu_count = original


@contextlib.contextmanager
def _ends_what_it_starts():
    """A check that starts worker processes ends them, whichever way it ends: on an exception (its
    time limit, a failed property, the learner's code raising), every process this one started
    during the block that is still alive is terminated, then killed (issue 37: a spawned worker
    of a check that timed out ran on, orphaned, and printed results after the check's ERROR).
    multiprocessing's resource tracker and fork server are shared services, left alone."""
    import psutil
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    try:
        yield
    except BaseException:
        gc.collect()
        _end_new_children(me, before)
        raise


def _end_new_children(me, before) -> None:
    import multiprocessing

    import psutil
    try:
        strays = [p for p in me.children(recursive=True) if p.pid not in before]
    except psutil.Error:
        return
    keep = ("resource_tracker", "forkserver")
    targets = []
    for p in strays:
        try:
            if not any(k in " ".join(p.cmdline()) for k in keep):
                targets.append(p)
        except psutil.Error:
            continue
    for p in targets:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(targets, timeout=2.0)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=2.0)
    multiprocessing.active_children()          # reaps the ones multiprocessing started


@contextlib.contextmanager
def _torch_rng_kept():
    """The check seeds torch's global generator; the learner's state is put back afterwards."""
    state = torch.random.get_rng_state()
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


# The share of the ideal gain 2.2 asks for (see required_speedup).
GAIN_ASKED = 0.2


def required_speedup(baseline, others_cores: float) -> float:
    """The throughput ratio 2.2 asks for, fitted to the device and to the CPU this run had.

    From the baseline's own steps: loading a batch takes `t_load` (its data wait), the host's
    share of a step `t_host` (the time in the step's body: launching its kernels, or waiting for
    the device), the device's own work `t_device` (its busy share of the step where the device
    reports it, else the step's span on the device: an upper bound). All of it is CPU work but the
    device's, so with a worker per free core a step takes at least the longest of
    `(t_load + t_host) / free cores`, `t_host` and `t_device`; against the baseline's
    `t_load + t_host`, that is the ideal gain. The check asks for `GAIN_ASKED` (20%) of it, at
    least 1.05x.

    Why 20%, on the simulated H100 (lesson 01) and a 2-core host, quiet (2026-11-25,
    `benchmarks/check_bars.py 2.2 --runs N --quiet`), timing the steady state (the whole training
    set, so that no timed batch was prepared during the warm-up); the ideal is about 2.0x, the bar
    1.2x. At normal priority with nothing else running: the right loader (one worker per core,
    persistent) 1.31x-1.62x (5 runs), 1.36x-1.63x with COURSE_DEVICE=cpu (4 runs; CI once saw
    1.31x there), the unchanged num_workers=0 baseline 0.99x-1.01x; with the host's other jobs held
    off by real-time priority (6 runs): right 1.66x-1.76x, baseline 0.90x-1.11x. The bar sits 0.11
    below the slowest right loader and 0.09 above the fastest baseline. Four workers per core:
    1.32x-1.75x, no faster than one per core, as lesson 02 says.
    `others_cores`, what other programs took from this process's cores meanwhile (`_busy.OthersCpu`),
    is taken from the free cores, up to `_busy.busy_limit` (0.2 of 2 cores). Past it the machine is
    too busy to judge speed: with one of two cores taken the right loader measured 0.79x, so a
    lowered bar would pass the unchanged baseline as often as it fails a right answer; the check
    then says "not graded: the machine was busy" (`MachineBusy`) unless yours cleared the quiet
    machine's bar, and the grader runs it again later."""
    cores = usable_cores()
    free = max(cores - others_cores, 1.0)
    t_load = baseline.data_wait_median_ms
    t_host = baseline.compute_median_ms
    step = baseline.step_time_ms or (t_load + t_host)
    util = getattr(baseline, "device_util", None)
    t_device = util * step if util is not None else (baseline.device_median_ms or 0.0)
    ideal = (t_load + t_host) / max((t_load + t_host) / free, t_host, t_device, 1e-6)
    return max(1.05, 1.0 + GAIN_ASKED * (ideal - 1.0))


def _timing_target():
    """Where 2.2's timed rounds train, and a sentence on what the number means there.

    On a GPU: the real model, on the GPU. Beside the simulator: the simulated device. Under
    COURSE_DEVICE=cpu the real model would train on the same two cores the loader's workers
    need, so its ratio would measure the fight for the CPU, not the loader: the speed is graded
    against the simulated device, and the real narrow model trains a few steps on your batches
    on the CPU to prove they fit it (dtype, shape, labels)."""
    from ..sim import default_sim
    from ..target import pick_target
    target = pick_target()
    if target.kind == "cuda":
        return target, target.run_on, target.model(), ""
    if target.kind == "cpu":
        return (target, default_sim(), None,
                " Under COURSE_DEVICE=cpu the speed is measured against the simulated device (the real model "
                "would share the cores with your workers); the real narrow model trained on your batches on the CPU.")
    return target, target.run_on, None, ""


_ROUNDS_BUDGET_S = 100      # what the timed rounds of yours may take, of 2.2's 240 s limit


_WORKER_DIED = ("its worker processes stay alive")


def _dead_workers(before: set) -> list[str]:
    """'pid N (how it ended)' for each worker process this process started (not in `before`) that
    ended abnormally: killed by a signal, or exited with a non-zero code, joined or not yet."""
    import multiprocessing
    import multiprocessing.process as mp_process

    import psutil
    out = []
    for p in list(getattr(mp_process, "_children", ())):
        if p.pid in before:
            continue
        code = p.exitcode                       # polls without blocking
        if code is not None and code != 0:
            out.append(f"pid {p.pid} ({'killed by signal ' + str(-code) if code < 0 else 'exit code ' + str(code)})")
    try:
        for child in psutil.Process().children(recursive=True):
            if child.pid not in before and child.status() == psutil.STATUS_ZOMBIE and \
                    not any(s.startswith(f"pid {child.pid} ") for s in out):
                out.append(f"pid {child.pid} (ended, not yet collected)")
    except psutil.Error:
        pass
    multiprocessing.active_children()
    return out


@contextlib.contextmanager
def _workers_that_die():
    """A worker that dies (killed for memory by the system, a crash in native code, os._exit or
    sys.exit in the dataset) ends the loader's epoch: the check says the workers died, the
    property that failed, never "not graded: the machine was busy" nor a time-out (q02: dead
    workers were reported as a busy machine)."""
    import re

    import psutil
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    hint = ("a worker process that dies takes the batches it was building with it: look for what ends it in "
            "the worker (os._exit or sys.exit in the dataset, memory the system reclaims from a worker holding too "
            "much: the OOM killer, a crash in native code) and run the dataset in the main process "
            "(num_workers=0) to see its own error")
    try:
        yield
    except RuntimeError as exc:
        if not re.search(r"DataLoader worker \(pid", str(exc)):
            raise
        raise CheckFailed(_WORKER_DIED, f"a worker process of your loader died while it loaded: {exc}",
                          hint) from None
    except TimeoutError as exc:
        dead = _dead_workers(before)
        if not dead:
            raise
        raise CheckFailed(_WORKER_DIED, f"{exc}: the loader waited for batches from worker processes that had died "
                          f"({', '.join(dead[:4])}{' and more' if len(dead) > 4 else ''}), not for a busy "
                          "machine", hint) from None


@exercise("2.2", "The fastest loader for this machine", points=3, time_limit_s=240)
def check_fast_loader(make_fast_loader):
    with _ends_what_it_starts(), _torch_rng_kept(), _workers_that_die():
        return _check_fast_loader(make_fast_loader)


def _check_fast_loader(make_fast_loader):
    from ..data import load_cifar10_arrays
    from ..loaders import measure_loader

    expect_callable(make_fast_loader, "a function make_fast_loader(dataset, batch_size) -> loader")
    rng, seed = fresh_rng()
    # correctness on a small dataset, with a batch size no one types by habit (not 32, 64, 128...)
    small_bs = int(rng.choice([b for b in range(36, 100) if b != 64]))
    small_n = small_bs * int(rng.integers(3, 6)) + int(rng.integers(1, small_bs))
    batch_size = int(rng.choice([64, 128]))
    steps = 24           # timed steps per round: fewer, and scheduler jitter decides the ratio
    # The timed dataset is the whole training set: a round's timed steps must end well inside an
    # epoch. A loader's workers run ahead by the batches they hold in flight; where an epoch ends
    # soon after the timed steps, that work was done during the untimed warm-up and never has to
    # be done again inside the timed window, so a loader holding many batches in flight (many
    # workers, a deep prefetch) looked faster than it is (8 workers on 2 cores: 2.0x the baseline
    # in 44-batch epochs, 1.5x in the steady state). With 390 batches an epoch the workers keep
    # working ahead through every timed step, as in training.
    pool, pool_labels = load_cifar10_arrays()
    big_n = len(pool)
    start = 0
    small, decode = _index_dataset(pool[rng.choice(len(pool), small_n, replace=False)], rng)

    # correctness: two epochs over a small dataset, every sample exactly once each, reshuffled
    before = _worker_pids()
    seeds = (int(rng.integers(0, 2**31 - 1)), 0)
    seeds = (seeds[0], seeds[0] + 1)
    what = f"{small_n} samples, batch_size={small_bs}"
    workers1, workers2 = set(), set()
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        torch.manual_seed(seeds[0])
        loader = make_fast_loader(small, small_bs)
        try:
            _settings_fail_fast(_find_dataloader(loader), what)   # before any worker starts (w4-02: 66 s)
            first, images1, batches1 = _one_epoch(loader, decode, small_bs, small_n, f"epoch 1 ({what})", workers1)
            second, images2, _ = _one_epoch(loader, decode, small_bs, small_n,
                                            f"epoch 2 of the same loader ({what})", workers2)
            found = _find_dataloader(loader)
            pinned = bool(getattr(found, "pin_memory", False)) if found is not None else None
            made = _weak(found)         # the DataLoader of the first call: a cache returns it again
        finally:
            main_loads = small.main_process_loads
            del loader
            gc.collect()
    if first == sorted(first):
        raise CheckFailed("shuffles", f"{what}: epoch 1 came out in dataset order 0, 1, 2, ...",
                          "training needs a fresh random order each epoch: shuffle=True")
    if first == second:
        raise CheckFailed("reshuffles every epoch", f"{what}: epoch 2 repeated epoch 1's order")
    fresh = sum(not trusted.torch_equal(images1[i], images2[i]) for i in range(small_n)) / small_n
    # a random crop and flip repeats by chance for about 1 sample in 162 (1 in 81 for a picture
    # that looks the same mirrored): more than 1 in 10 alike is a cache, even of a part (issue 35)
    if fresh < 0.9:
        raise CheckFailed("augments afresh every epoch",
                          f"{what}: {1 - fresh:.0%} of the samples came out identical in both epochs",
                          "load through the dataset each epoch: caching augmented images repeats the same "
                          "augmentation forever")
    _as_the_dataset_makes_them(small, images1, batches1, f"epoch 1 ({what})")
    draws1 = _batch_draws(small, images1, batches1)
    _workers_draw_alike(draws1, f"epoch 1 ({what})")
    workers1 -= before
    workers2 -= before
    cores = usable_cores()
    if not workers1:
        raise CheckFailed("loads in worker processes",
                          f"{what}: no worker process loaded epoch 1: the main process decoded and augmented every "
                          "sample itself, as the num_workers=0 baseline does",
                          "num_workers > 0: worker processes load the next batches while the main process runs "
                          "the step (this lesson's sweep)")
    if main_loads > small_bs:
        raise CheckFailed("loads in worker processes",
                          f"{what}: the main process loaded {main_loads:,} of the {2 * small_n:,} samples of the "
                          f"two epochs itself; your {len(workers1)} worker process(es) ran, but did not load them",
                          "the per-sample work (decode, augment) belongs in the dataset's __getitem__, which a "
                          "DataLoader's workers call: return the DataLoader over the dataset itself (what a "
                          "wrapper's __iter__ does runs in the main process, on the training loop's time)")
    if not workers1 & workers2:
        raise CheckFailed("keeps its worker processes alive between epochs",
                          f"{what}: epoch 1 was loaded by {len(workers1)} worker process(es), epoch 2 by new ones "
                          "(the first were stopped when epoch 1 ended)",
                          "persistent_workers=True: starting the workers costs every epoch its start-up time")
    if len(workers1) > cores:
        raise CheckFailed("at most one worker per usable core",
                          f"{what}: yours started {len(workers1)} worker processes on the {cores} cores this process "
                          "may use",
                          "past the core count the workers only take turns on the same cores, and the main process, "
                          "which launches every step, waits behind them: about one per usable core, usable_cores() "
                          "(a sweep on a shared machine can rank a larger count first by noise: look at the spread "
                          "of its rounds)")
    if not _accelerator_present() and (pinned or any("pin_memory" in str(w.message) for w in warned)):
        raise _pinned_without_a_gpu(what)
    _follows_the_cores(make_fast_loader, small, small_bs, cores, len(workers1), what, made)
    # a second run after another torch seed: its augmentations must follow the seed too
    torch.manual_seed(seeds[1])
    again, images_again = _first_full_batches(make_fast_loader, small, small_bs, decode, what)
    _order_follows_the_seed(batches1, again, seeds, what)
    _draws_follow_the_seed(draws1, _batch_draws(small, images_again, again), seeds, what)
    # and the first seed again: the same order and the same augmentations (q02 w22_06: workers seeded
    # from fresh entropy, torch.seed() in a worker_init_fn, differ by worker and by run, and passed)
    torch.manual_seed(seeds[0])
    replay, images_replay = _first_full_batches(make_fast_loader, small, small_bs, decode, what)
    replay_draws = _batch_draws(small, images_replay, replay)
    _same_seed_replays(draws1, replay_draws, seeds[0], what)
    # then a second loader in the same run, with no torch.manual_seed between the two: torch's
    # generator has moved on, so another order and other augmentations (w6-02: a generator of the
    # loader's own seeded from torch.initial_seed() passed the two runs above, and replays the
    # seed's order and augmentations in every loader made in one run)
    following, images_following = _first_full_batches(make_fast_loader, small, small_bs, decode, what)
    _next_loader_differs(replay_draws, _batch_draws(small, images_following, following), seeds[0], what)

    # throughput: yours against the num_workers=0 baseline, in the same run, through train(),
    # in alternating rounds (a load spike from another process hits both sides alike); every
    # batch the rounds consume is verified, and trains with the samples' class labels
    target, device, model, where = _timing_target()
    big, big_decode = _index_dataset(pool[start:start + big_n], rng)
    classes = np.asarray(pool_labels[start:start + big_n], dtype=np.int64)
    weights = torch.from_numpy(rng.standard_normal((3, 6, 6)).astype(np.float32))

    def fingerprint(images):      # a weighted sum of 108 scattered pixels: a shift or a flip changes it
        return (images[:, :, 3::5, 2::5].detach().to("cpu", torch.float32) * weights).sum((1, 2, 3)).tolist()

    big_what = f"the timed rounds ({big_n} samples, batch_size={batch_size})"
    rounds = []
    yours_raw = make_fast_loader(big, batch_size)
    speed_hint = _speed_hint(yours_raw, usable_cores())
    settings = _settings_of(yours_raw, usable_cores())
    yours_loader = _Verified(yours_raw, big_decode, classes, batch_size, big_what, fingerprint)
    try:
        warmup = max(1 + _in_flight(_find_dataloader(yours_raw) or yours_raw), 3 if target.cuda else 1)
        first = measure_loader(yours_loader, device, 1, model=model, warmup=warmup)   # start-up, cuDNN autotuning
        per_batch = first.total_s          # the one step after the warm-up: start-up not included
        if 3 * steps * per_batch > _ROUNDS_BUDGET_S:
            # too slow to time within the check's limit: say so, with the times (w3-02, w22_15: a
            # slow wrapper was told "does your code loop forever ...?" after 240 s)
            probe = _Verified(DataLoader(big, batch_size=batch_size, shuffle=True, num_workers=0),
                              big_decode, classes, batch_size, "the baseline", fingerprint)
            base_batch = measure_loader(probe, device, 2, model=model, warmup=1).total_s / 2
            del probe
            if per_batch > 1.5 * base_batch:
                raise CheckFailed("is faster than the baseline loader on this machine",
                                  f"{big_what}: yours took {per_batch:.2f} s a step after its warm-up, the "
                                  f"num_workers=0 baseline {base_batch:.2f} s: slower, not "
                                  f"stuck; the 3 timed rounds of {steps} steps would have taken about "
                                  f"{3 * steps * per_batch:.0f} s, so the check stopped there", speed_hint)
        if target.kind == "cpu":
            from ..train import train
            cpu_model = target.model()
            train(cpu_model, yours_loader, device=target.run_on, steps=2, progress=False)
            del cpu_model
        while True:
            baseline_loader = _Verified(DataLoader(big, batch_size=batch_size, shuffle=True, num_workers=0),
                                        big_decode, classes, batch_size, "the baseline", fingerprint)
            # what other programs took from this process's cores while each side ran (never the
            # check's own processes: _busy.OthersCpu)
            with OthersCpu() as cpu_base:
                base = measure_loader(baseline_loader, device, steps, model=model, warmup=1)
            with OthersCpu() as cpu:
                yours = measure_loader(yours_loader, device, steps, model=model, warmup=warmup)
            del baseline_loader
            rounds.append((yours.samples_per_s / base.samples_per_s, base, yours, cpu.others_cores,
                           cpu_base.others_cores))
            if len(rounds) < 3:
                continue
            ratio, base, yours, _, _ = sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]   # the median round
            others = float(np.median([r[3] for r in rounds]))
            others_base = float(np.median([r[4] for r in rounds]))
            required = required_speedup(base, others)
            busy = max(others, others_base) >= busy_limit(usable_cores())
            if abs(ratio - required) > 0.1 or len(rounds) >= 7 or busy:   # clear, as sure as it gets, or busy
                break
        yours_loader.judge_freshness()
    finally:
        del yours_loader, yours_raw
        gc.collect()
        if getattr(device, "type", None) == "sim":
            device.close()
    cores = usable_cores()
    if busy:
        # Too busy to judge speed: only a pass that the load cannot have helped stands, at the quiet
        # machine's bar, with the baseline's one core left to it while it ran (load on the cores your
        # workers need only slows yours); anything else is not graded, and graded again later.
        quiet_bar = required_speedup(base, 0.0)
        base_free = max(0.0, cores - 1 - busy_limit(cores))
        if not (ratio >= quiet_bar and others_base <= base_free) and settings[0]:
            # the speed cannot be judged, the settings can: the ones this lesson measured (w3-02:
            # on a machine busy all day 2.2 never graded)
            # w6-02: a loader slower than the baseline passed so, 3/3: the pass says plainly what it did not grade
            return (f"not timed: the machine was busy ({max(others, others_base):.1f} of its {cores} cores taken by other "
                    "programs while your loader and the baseline were timed), so the speed was not judged: these "
                    f"points do NOT grade speed ({ratio:.2f}x the baseline was measured meanwhile, which under that "
                    "load says nothing either way). Graded on what holds without timing: every sample once per "
                    f"epoch, reshuffled, freshly augmented, in the timed rounds too; {settings[1]}. Run this cell "
                    f"again on a quieter machine to have the speed graded too.{where}")
        if not (ratio >= quiet_bar and others_base <= base_free):
            why = (f"yours cleared that bar, but the baseline itself ran with other programs on "
                   f"{others_base:.1f} cores, more than the {base_free:.1f} its one core leaves free (at most "
                   f"{busy_limit(cores):.1f} on its own core): load that slows the baseline makes any loader look "
                   "faster than it is, so this ratio cannot pass it") if ratio >= quiet_bar else (
                   "below that bar, which the load on the cores your workers need may explain")
            raise MachineBusy(max(others, others_base), cores,
                              f"while your loader and the baseline were timed; {ratio:.2f}x the baseline measured, "
                              f"{quiet_bar:.2f}x asked on a quiet machine: {why}",
                              held="Every property but speed held: each sample once per epoch, reshuffled, freshly "
                                   "augmented, other augmentations in other workers and after another torch seed, "
                                   "worker processes kept alive, at most one per usable core, in the timed rounds "
                                   f"too; only the speed could not be judged, and without it yours is not graded: "
                                   f"{settings[1]}")
        required = quiet_bar
    loaded = (f"; other processes used {others:.1f} of the {cores} cores meanwhile, so the bar was fitted to what "
              "the cores they left allow") if others > 0.05 and not busy else (
              f"; other processes used {max(others, others_base):.1f} of the {cores} cores meanwhile, and yours "
              "cleared the quiet machine's bar all the same") if busy else ""
    if ratio < required:
        detail = (f"in the same run, yours loaded {yours.samples_per_s:,.0f} samples/s and the num_workers=0 baseline "
                  f"{base.samples_per_s:,.0f}: {ratio:.2f}x the baseline (the median of {len(rounds)} rounds of "
                  f"{steps} steps, batches of {batch_size}; the rounds ranged {min(r[0] for r in rounds):.2f}x-"
                  f"{max(r[0] for r in rounds):.2f}x). "
                  f"The bar here is {required:.2f}x, set from the baseline's own steps on this device and "
                  f"these {usable_cores()} cores{loaded}. The device: {base.device}.{where}")
        raise CheckFailed("is faster than the baseline loader on this machine", detail.rstrip("."), speed_hint)
    return (f"every sample once per epoch, reshuffled, freshly augmented, in the timed rounds too; {ratio:.2f}x "
            f"the baseline's throughput (at least {required:.2f}x asked; median of {len(rounds)} rounds, batches of "
            f"{batch_size}) on {base.device}{loaded}.{where}")


def _settings_of(loader, cores: int) -> tuple[bool, str]:
    """Whether the loader is the one this lesson measured fastest on any machine, without timing it:
    the DataLoader itself, one worker per usable core, persistent, pinned only with a GPU; and a
    sentence that says what was found."""
    found = _find_dataloader(loader)
    if found is None or found is not loader:
        return False, (f"yours hands every batch through {type(loader).__name__}.__iter__, in the main process, "
                       "which only timing can judge")
    pin = _accelerator_present()
    said = (f"num_workers={found.num_workers} for {cores} usable cores, persistent_workers="
            f"{found.persistent_workers}, pin_memory={found.pin_memory} ({'a GPU' if pin else 'no GPU'} here), "
            f"batch_size={found.batch_size}")
    if found.num_workers != cores:
        return False, f"{said}: not one worker per usable core, which only timing can judge"
    if not found.persistent_workers or bool(found.pin_memory) != pin:
        return False, f"{said}: settings only timing can judge"
    return True, f"{said}: the settings this lesson measured"


def _speed_hint(loader, cores: int) -> str:
    """What to look at when a loader that passed every correctness property measured too slow,
    from what the loader is."""
    found = _find_dataloader(loader)
    if found is None or found is not loader:
        return (f"yours hands every batch through {type(loader).__name__}.__iter__, which runs in the main process, "
                "on the training loop's time: whatever it does there per batch (a copy, a conversion, loading "
                "samples) no worker takes off it. Return the DataLoader itself, and leave the per-sample work to "
                "the dataset, in the workers")
    if found.num_workers < cores:
        return (f"yours has {found.num_workers} worker(s) for {cores} usable cores: about one per usable core "
                "(usable_cores())")
    return (f"yours has {found.num_workers} workers, persistent_workers={found.persistent_workers}: the settings "
            "this lesson recommends. A slow round can also be the machine: run the check again, and look at "
            "`top` for other programs")


def _in_flight(loader) -> int:
    from ..loaders import in_flight_batches
    return in_flight_batches(loader)


# -- 2.3 per-worker randomness -----------------------------------------------------------------

def _check_item(item, labels, index, shape, what):
    """The type, label and shape of one item; returns its image as a uint8 (C, H, W) array."""
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        size = f" of {len(item)}" if isinstance(item, (tuple, list)) else ""
        raise CheckFailed("returns (image, label)", f"{what}: item {index} is a {type(item).__name__}{size}",
                          "return a pair: (crop_flip(self.images[index], self.padding, rng), self.labels[index])")
    image, label = item
    if isinstance(label, torch.Tensor) and label.numel() == 1:
        label = label.item()
    if isinstance(label, (torch.Tensor, np.ndarray)) or label != labels[index]:
        where = [j for j, x in enumerate(labels) if isinstance(label, (int, np.integer)) and x == label]
        raise CheckFailed("returns the item's label", f"{what}: item {index} has label {label!r}, expected "
                          f"{labels[index]}" + (f" (the label of item {where[0]})" if where else ""),
                          "return self.labels[index], the label of the index asked for, as it was given"
                          if where or not isinstance(item[0], (int, np.integer)) else
                          "the pair is (image, label), in that order")
    h, w, c = shape
    if not isinstance(image, torch.Tensor):
        hint = ("a NumPy array: turn it into a tensor, torch.from_numpy(crop).permute(2, 0, 1) (crop_flip already "
                "returns one)" if isinstance(image, np.ndarray) else
                "the pair is (image, label), in that order" if isinstance(image, (int, np.integer)) else
                "return crop_flip's tensor, (C, H, W) uint8")
        raise CheckFailed("returns a torch tensor image", f"{what}: item {index} is a {type(image).__name__}", hint)
    if image.dtype != torch.uint8 or tuple(image.shape) != (c, h, w):
        if tuple(image.shape) == (h, w, c):
            hint = "the channels go first: (C, H, W), crop.permute(2, 0, 1) of an (H, W, C) crop"
        elif image.dtype != torch.uint8 and tuple(image.shape) == (c, h, w):
            hint = ("keep the image's uint8 values: no .float(), no / 255 (the training normalises later, on the "
                    "device)")
        elif image.dim() == 3 and tuple(image.shape[:1]) == (c,):
            hint = (f"a crop is as large as the image ({h}x{w}): pad by padding on every side, then take an {h}x{w} "
                    "window")
        else:
            hint = "return crop_flip's result: a uint8 (C, H, W) crop as large as the image"
        raise CheckFailed("returns a uint8 (C, H, W) crop the size of the image",
                          f"{what}: item {index} is {image.dtype} {tuple(image.shape)}, expected torch.uint8 {(c, h, w)}",
                          hint)
    return image.numpy()


def _params_of(items, images, labels, indices, padding, what) -> list[tuple[int, int, bool]]:
    """(dy, dx, flipped) of every item, found by matching it against every window of its
    zero-padded image (through `course_utils.crop_match`, in 0..1 units so that only an exact
    match counts); fails when an item is no such crop."""
    from ..crop_match import match_crops
    outs = np.stack([_check_item(item, labels, i, images.shape[1:], what) for item, i in zip(items, indices)])
    found = match_crops(outs.astype(np.float32) / 255, images[indices].transpose(0, 3, 1, 2), (0.0, 0.0, 0.0),
                        (1.0, 1.0, 1.0), pad=padding, atol=1e-4)
    if not found.exact.all():
        j = int(np.flatnonzero(~found.exact)[0])
        h, w = images.shape[1:3]
        mistake = _why_not_a_crop(outs[j].transpose(1, 2, 0), images[indices[j]], padding)
        raise CheckFailed("returns a crop of the zero-padded image, flipped or not",
                          f"{what}: item {indices[j]} is not a {h}x{w} window of the image padded by {padding} "
                          "with zeros, mirrored left-right or not" + (f"; it is {mistake[0]}" if mistake else ""),
                          mistake[1] if mistake else
                          "pad with zeros on every side, take a window at a random (dy, dx) in 0..2*padding, "
                          "mirror it left-right with probability 1/2")
    return [(int(y), int(x), bool(f)) for y, x, f in zip(found.dy, found.dx, found.flipped)]


# What an item that is no crop of the zero-padded image may be instead: (what it is, hint,
# padding used, np.pad mode, flips allowed as (top-bottom, left-right)).
def _crop_candidates(padding):
    out = []
    if padding != 4:
        out.append(("a crop of the image padded by 4", "use the padding passed to __init__ (self.padding), not 4",
                    4, "constant", ((False, False), (False, True))))
    out += [("mirrored top-bottom", "mirror left-right (the last axis of a window (H, W, C) is C: flip axis 1, "
             "window[:, ::-1]), not top-bottom", padding, "constant", ((True, False), (True, True))),
            ("a crop of the image padded by reflection", "pad with zeros (np.pad's default mode, 'constant')",
             padding, "reflect", ((False, False), (False, True))),
            ("a crop of the image padded by repeating its edge", "pad with zeros (np.pad's default mode, 'constant')",
             padding, "edge", ((False, False), (False, True)))]
    return out


def _why_not_a_crop(item, image, padding):
    """(what the item is, hint) where it is a window of `image` (H, W, C) padded another way, or
    mirrored the other way; None if it is none of those."""
    h, w = image.shape[:2]
    for what, hint, pad, mode, flips in _crop_candidates(padding):
        if mode != "constant" and pad >= min(h, w):
            continue
        padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)), mode=mode)
        for dy in range(2 * pad + 1):
            for dx in range(2 * pad + 1):
                window = padded[dy:dy + h, dx:dx + w]
                for vertical, horizontal in flips:
                    candidate = window[::-1] if vertical else window
                    candidate = candidate[:, ::-1] if horizontal else candidate
                    if candidate.shape == item.shape and trusted.array_equal(candidate, item):
                        return what, hint
    return None


def _worker_context():
    """How the check starts its workers: by fork where the platform has it (Linux, macOS). A
    dataset class defined in a notebook cannot be pickled into a *spawned* worker (lesson 02,
    "Workers and spawn"); the check grades the seeding, which behaves the same either way (each
    worker gets a copy of the dataset, generator included), not where the class was defined."""
    import multiprocessing
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else None


def _worker_run(cls_ds, images, labels, padding, seed, what, *, epochs=1, order=None):
    """Params of every item, in index order (or in `order`, the sampler's), for each epoch of a
    2-worker loader after torch.manual_seed(seed). Item k of the order goes to worker k % 2."""
    order = list(range(len(labels))) if order is None else order
    loader = DataLoader(cls_ds, batch_size=None, sampler=order, num_workers=2,
                        multiprocessing_context=_worker_context())
    torch.manual_seed(seed)
    runs = []
    for epoch in range(epochs):
        items = list(loader)
        if len(items) != len(order):
            raise CheckFailed("works in DataLoader workers", f"{what}: {len(items)} items came out of {len(order)}",
                              "len(dataset) is the number of images, and dataset[i] returns one item for every i "
                              "the sampler asks for")
        runs.append(_params_of(items, images, labels, order, padding, what))
    del loader
    return runs


def _main_process_draws(dataset_class, images, labels, padding, torch_seed, what):
    """Params of two passes over a fresh dataset in the main process, after torch.manual_seed."""
    torch.manual_seed(torch_seed)
    ds = dataset_class(images, labels, padding=padding)
    indices = list(range(len(labels))) * 2
    return _params_of([ds[i] for i in indices], images, labels, indices, padding, what)


_GENERATOR_TYPES = (np.random.Generator, np.random.RandomState, np.random.BitGenerator, torch.Generator)


def _holds_a_generator(value) -> bool:
    """A generator, or a dict, list or tuple holding one (one level down)."""
    if isinstance(value, _GENERATOR_TYPES):
        return True
    if isinstance(value, dict):
        value = list(value.values()) + list(value.keys())
    if isinstance(value, (list, tuple, set)):
        return any(isinstance(v, _GENERATOR_TYPES) or (isinstance(v, (tuple, list)) and
                                                       any(isinstance(x, _GENERATOR_TYPES) for x in v))
                   for v in value)
    return False


def _generator_kept_outside(dataset_class) -> str | None:
    """Where a dataset class keeps a generator that outlives its instances, said for the hint: an
    attribute of the class (or of a class it derives from, not torch's), a default argument of one
    of its methods, or a global of its module that its methods name; None where there is none
    (w6-02: a class attribute was missed where the class was made by exec, its __module__
    "builtins")."""
    import sys
    mine = [c for c in type.mro(dataset_class) if c is not object and c.__module__ != "typing"
            and not c.__module__.startswith("torch")]
    for c in mine:
        for k, v in vars(c).items():
            if _holds_a_generator(v):
                return f"on the class ({c.__name__}.{k})"
    names = set()
    for c in mine:
        for k, f in vars(c).items():
            f = getattr(f, "__func__", f)
            code = getattr(f, "__code__", None)
            if code is None:
                continue
            for d, v in zip(code.co_varnames[code.co_argcount - len(f.__defaults__ or ()):code.co_argcount],
                            f.__defaults__ or ()):
                if _holds_a_generator(v):
                    return f"in a default argument of {c.__name__}.{k} ({d})"
            stack = [code]
            while stack:
                co = stack.pop()
                names.update(co.co_names)
                stack.extend(x for x in co.co_consts if hasattr(x, "co_names"))
    module = sys.modules.get(dataset_class.__module__)
    spaces = [vars(module)] if module is not None and dataset_class.__module__ != "builtins" else []
    for c in mine:
        for f in vars(c).values():
            g = getattr(getattr(f, "__func__", f), "__globals__", None)
            if g is not None and all(g is not x for x in spaces):
                spaces.append(g)
    for space in spaces:
        for k in sorted(names):
            if k in space and _holds_a_generator(space[k]):
                return f"in the global {k}"
    return None


def _seeded_from(dataset_class, images, labels, padding, torch_seed, what) -> bool:
    """Whether a fresh dataset drawing after torch.manual_seed(torch_seed) made a NumPy generator
    from that very seed (np.random.default_rng(torch.initial_seed()))."""
    with _numpy_seeds_recorded() as made:
        _main_process_draws(dataset_class, images, labels, padding, torch_seed, what)
    return torch_seed in made


def _main_process_seeding(dataset_class, images, labels, padding, torch_seed, pairs):
    """A fresh dataset in the main process after torch.manual_seed(s) draws the same
    augmentations every time, and other ones after another seed."""
    what = f"a fresh dataset in the main process (num_workers=0) after torch.manual_seed({torch_seed})"
    first = _main_process_draws(dataset_class, images, labels, padding, torch_seed, what)
    again = _main_process_draws(dataset_class, images, labels, padding, torch_seed, what)
    if first != again:
        saved = np.random.get_state()
        try:
            np.random.seed(12345)
            a = _main_process_draws(dataset_class, images, labels, padding, torch_seed, what)
            np.random.seed(12345)
            b = _main_process_draws(dataset_class, images, labels, padding, torch_seed, what)
        finally:
            np.random.set_state(saved)
        kept = _generator_kept_outside(dataset_class)
        if kept:
            hint = (f"yours keeps its generator {kept}, which lives between calls and is shared by every dataset "
                    "of the class: a fresh dataset after torch.manual_seed(s) goes on with the stream an earlier one "
                    "left, where the seed has not changed. Keep it on the instance (self.rng), made when the seed "
                    "differs from the one it was made with")
        elif a == b:
            hint = ("your draws follow NumPy's global generator (np.random.*), which torch.manual_seed does not "
                    "seed: in the main process, seed your own generator from torch.initial_seed(); in a worker, "
                    "from get_worker_info().seed")
        elif _seeded_from(dataset_class, images, labels, padding, torch_seed, what):
            hint = (f"yours made np.random.default_rng({torch_seed}), from torch.initial_seed() as it should, yet a "
                    "fresh dataset after the same torch.manual_seed drew other numbers: its draws come from a "
                    "generator kept between calls outside the fresh dataset (on the class, in a global, in a "
                    "default argument), which goes on with the stream an earlier dataset left. Keep it on the "
                    "instance (self.rng)")
        else:
            hint = ("in the main process (get_worker_info() is None) seed the generator from torch.initial_seed(), "
                    "not from fresh OS entropy (default_rng() without a seed), the clock or the pid")
        raise CheckFailed("reproducible under torch.manual_seed in the main process",
                          f"{what}, twice: {1 - _fraction_equal(first, again):.0%} of the draws differ", hint)
    # seeds near and far apart (_seed_pairs): a fold of the seed that _seed_folded could not see (no
    # np.random.default_rng called with it: a Generator(PCG64(...)) made by hand, say) shows in the draws
    by_seed = _draws_by_seed(dataset_class, images, labels, padding, _pair_seeds(pairs), what)
    alike = []
    for a, b, kind in pairs:
        (da, ma, _), (db, mb, _) = by_seed[a], by_seed[b]
        # torch's own CPU generator keeps 32 bits of its seed: an answer drawing from torch (torch.randint,
        # or a torch.Generator seeded from the seed) draws alike 2**32 apart as torch itself does, so that
        # pair judges only an answer that made a NumPy generator from a seed cut below 2**32
        if kind == "32 bits" and not any(isinstance(k, int) and 0 <= k < 2**32 for k in ma + mb):
            continue
        if _fraction_equal(da, db) > 0.5:
            alike.append((a, b, kind, _fraction_equal(da, db)))
    if alike:
        a, b, kind, share = alike[0]
        low, big = pairs[1][0], pairs[0][0]          # an ordinary seed and one of 63 bits: far apart
        constant = _fraction_equal(by_seed[low][0], by_seed[big][0]) > 0.5
        raise CheckFailed(FOLLOWS_MAIN,
                          f"torch.manual_seed({a}) and torch.manual_seed({b}) gave the same augmentations for "
                          f"{share:.0%} of the draws of a fresh dataset" + (
                              f", and so did torch.manual_seed({low}) and ({big}): yours draws the same whatever "
                              "torch's seed" if constant else ""),
                          "in the main process, seed from torch.initial_seed(), which torch.manual_seed sets" if
                          constant else _FOLD_HINTS[kind])


FOLLOWS_MAIN = "follows the torch seed in the main process"

# What a fold of the seed that makes the pair of _seed_pairs of each kind alike is (the hint).
_FOLD_HINTS = {
    "low bit": ("torch seeds 1 apart drew alike (a loader's two workers get base_seed and base_seed + 1): yours drops "
                "the seed's lowest bit: a seed halved (seed // 2) or shifted, or passed through float() (a float64 "
                "holds 53 bits, so 64-bit seeds 1 apart become the same float). Pass the whole seed to "
                "np.random.default_rng (it takes any non-negative int): different seeds, different generators"),
    "8 bits": ("seeds 256 apart drew alike: yours keeps only the low bits of the seed (a seed % 256), so only 256 "
               "runs can differ. Pass the whole seed to np.random.default_rng (it takes any non-negative int)"),
    "16 bits": ("seeds 65536 apart drew alike: yours keeps only the low bits of the seed (a seed % 65536), so only "
                "65,536 runs can differ. Pass the whole seed to np.random.default_rng (it takes any non-negative int)"),
    "32 bits": ("seeds 2**32 apart drew alike: yours keeps only the low 32 bits of the seed (a seed % 2**32, a habit "
                "from np.random.seed, which takes 32 bits), but torch seeds have 64: pass the whole seed to "
                "np.random.default_rng (it takes any non-negative int)"),
    "halves folded": ("these two seeds differ in both 32-bit halves, and yours folded each into the same 32-bit seed "
                      "(its halves XORed or added, seed ^ (seed >> 32)): 2**32 streams for 2**64 seeds, and seeds such "
                      "as 1 and 2**32 draw alike. Torch seeds have 64 bits: pass the whole seed to "
                      "np.random.default_rng (it takes any non-negative int)"),
}


def _seed_pairs(rng) -> list[tuple[int, int, str]]:
    """Pairs of torch seeds (a, b, kind) that a fold of a 64-bit seed into fewer bits maps onto one
    seed, whatever the check draws (w6-02: seed // 2 and int(float(seed)) passed on some seeds, a
    32-bit XOR fold on every one): seeds 1 apart, the lower one even and both the same float64
    ("low bit": // 2, a shift, float(), float32); 256, 65,536 and 2**32 apart (% 256, % 65536,
    % 2**32: the same low bits); and an odd seed with bit 32 clear against it + 2**32 - 1, whose low
    half is one less and high half one more ("halves folded": lo ^ hi and lo + hi are the same). All
    below 2**63, so that they fit an int64 too."""
    low = int(rng.integers(2**20, 2**31))
    big_even = int(rng.integers(2**50, 2**51)) << 12                  # in [2**62, 2**63), a multiple of 4096
    odd = (int(rng.integers(2**10, 2**30)) << 33) | (int(rng.integers(0, 2**31)) << 1) | 1
    return [(big_even, big_even + 1, "low bit"), (low, low + 256, "8 bits"), (low, low + 2**16, "16 bits"),
            (low, low + 2**32, "32 bits"), (odd, odd + 2**32 - 1, "halves folded")]


def _pair_seeds(pairs) -> list[int]:
    return sorted({x for a, b, _ in pairs for x in (a, b)})


def _seed_key(value):
    """What a seed handed to np.random.default_rng is, comparable: an int, a tuple of ints, a
    SeedSequence's entropy; None where it is none of these (no seed, a BitGenerator)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, np.random.SeedSequence):
        return ("SeedSequence", repr(value.entropy), tuple(value.spawn_key))
    if isinstance(value, (list, tuple, np.ndarray)):
        try:
            return tuple(int(v) for v in np.asarray(value).ravel())
        except (TypeError, ValueError):
            return None
    return None


@contextlib.contextmanager
def _numpy_seeds_recorded():
    """Inside the block np.random.default_rng records the seed of every generator it makes
    (`_seed_key`, None for none) in the list the block receives."""
    made = []
    original = np.random.default_rng

    def recording(*args, **kwargs):
        made.append(_seed_key(args[0] if args else kwargs.get("seed")))
        return original(*args, **kwargs)

    np.random.default_rng = recording
    try:
        yield made
    finally:
        np.random.default_rng = original


def _draws_by_seed(dataset_class, images, labels, padding, seeds, what) -> dict:
    """For each torch seed: (the draws of a fresh dataset after torch.manual_seed(seed), the seeds
    of the NumPy generators it made meanwhile, whether it drew from torch's global generator)."""
    out = {}
    for seed in seeds:
        with _numpy_seeds_recorded() as made:
            draws = _main_process_draws(dataset_class, images, labels, padding, seed, what)
        drew = not trusted.torch_equal(torch.random.get_rng_state(), torch.Generator().manual_seed(seed).get_state())
        out[seed] = (draws, [k for k in made if k is not None], drew)
    return out


def _seed_folded(dataset_class, images, labels, padding, pairs):
    """In the main process, before the workers: two torch seeds of a pair of `_seed_pairs` that
    hand np.random.default_rng the same seed, where other torch seeds hand it others (the seed is
    read, then folded into fewer bits), and draw alike. Judged here, where the seed handed over
    shows the fold exactly; in workers the same fold makes a loader's two workers (base_seed and
    base_seed + 1) alike on some torch seeds only (w6-02: seed // 2 on about half of them). An
    answer that draws from torch's global generator is left to later properties on the pair 2**32
    apart, which torch's own generator cannot tell apart (it keeps 32 bits of its seed)."""
    what = "a fresh dataset in the main process (num_workers=0)"
    by_seed = _draws_by_seed(dataset_class, images, labels, padding, _pair_seeds(pairs), what)
    if len({tuple(m) for _, m, _ in by_seed.values() if m}) <= 1:
        return        # none made from a seed, or one seed whatever torch's: no fold (later properties judge it)
    for a, b, kind in pairs:
        (da, ma, ta), (db, mb, tb) = by_seed[a], by_seed[b]
        if not ma or ma != mb or (kind == "32 bits" and (ta or tb)):
            continue
        share = _fraction_equal(da, db)
        if share > 0.5:
            said = ma[0] if len(set(ma)) == 1 else f"{ma[0]}) ... ({ma[-1]}"
            raise CheckFailed(FOLLOWS_MAIN,
                              f"torch.manual_seed({a}) and torch.manual_seed({b}) gave the same augmentations for "
                              f"{share:.0%} of the draws of {what}: yours made np.random.default_rng({said}) for "
                              "both", _FOLD_HINTS[kind])


def _later_seed_followed(dataset_class, images, labels, padding, seeds):
    """A dataset built and used in the main process under one torch seed follows a
    torch.manual_seed set afterwards: the seed is read when drawing, not once."""
    def draws(after):
        torch.manual_seed(seeds[0])
        ds = dataset_class(images, labels, padding=padding)
        ds[0]                                   # looked at, as in a notebook
        torch.manual_seed(after)
        indices = list(range(len(labels))) * 2
        return _params_of([ds[i] for i in indices], images, labels, indices, padding, what)

    what = (f"a dataset built and looked at (dataset[0]) after torch.manual_seed({seeds[0]}), then "
            f"torch.manual_seed({seeds[1]}) or ({seeds[1] + 1}) before drawing, in the main process")
    a, b = draws(seeds[1]), draws(seeds[1] + 1)
    if _fraction_equal(a, b) > 0.5:
        raise CheckFailed("follows a torch.manual_seed set after the dataset was made",
                          f"{what}: the same augmentations for {_fraction_equal(a, b):.0%} of the draws: yours read "
                          "the seed once (in __init__ or at its first draw) and never again",
                          "read the seed whenever you draw (torch.initial_seed() in the main process) and make a new "
                          "generator when it differs from the seed the current one was made with: a training run "
                          "that calls torch.manual_seed(s) must get the same augmentations every time")


def _torch_rng_left_alone(dataset_class, images, labels, padding, torch_seed, what):
    """Making a dataset and drawing every item twice in the main process leaves torch's global
    generator as it was (q02 w23_12, w23_15): reading torch.initial_seed() draws nothing, but
    torch.rand / torch.randint without a generator, or a torch.manual_seed inside, change the
    stream the training draws from (the model's initialisation, dropout, a num_workers=0 loader's
    order), and differently whenever a sample is looked at."""
    torch.manual_seed(torch_seed)
    torch.rand(7)                      # part of the stream used, as in training: a reseed to its start shows
    before = torch.random.get_rng_state()
    ds = dataset_class(images, labels, padding=padding)
    for i in list(range(len(labels))) * 2:
        ds[i]
    after = torch.random.get_rng_state()
    if trusted.torch_equal(before, after):
        return
    seed_now = torch.initial_seed()
    restarted = torch.Generator().manual_seed(seed_now).get_state()
    if seed_now != torch_seed:
        did = f"yours set torch's seed: torch.initial_seed() was {torch_seed} before, {seed_now} after"
        hint = ("never call torch.manual_seed inside the dataset: it reseeds the training's own generator. Make a "
                "NumPy generator of your own, np.random.default_rng(seed)")
    elif trusted.torch_equal(after, restarted):
        did = ("yours called torch.manual_seed(torch.initial_seed()) (or the like): the generator went back to the "
               "start of its stream")
        hint = ("never call torch.manual_seed inside the dataset: it restarts the training's own generator. Reading "
                "the seed (torch.initial_seed(), get_worker_info().seed) is all the dataset needs; seed a NumPy "
                "generator of your own with it")
    else:
        did = "yours drew from torch's global generator (torch.rand, torch.randint or the like without generator=)"
        hint = ("draw from a NumPy generator of your own, np.random.default_rng(seed) seeded from "
                "torch.initial_seed() in the main process and get_worker_info().seed in a worker: torch's global "
                "generator belongs to the training, and a dataset that draws from it changes the model's "
                "initialisation, dropout and the loader's order whenever a sample is looked at")
    raise CheckFailed("leaves torch's global generator alone",
                      f"{what}: torch's global random state changed while a fresh dataset was made and every item "
                      f"drawn twice; {did}", hint)


def _generators_made(dataset_class, images, labels, padding, what):
    """How many NumPy generators np.random.default_rng made while a fresh dataset drew each item
    twice in the main process (the module's function is wrapped for the block)."""
    made = [0]
    original = np.random.default_rng

    def counted(*args, **kwargs):
        made[0] += 1
        return original(*args, **kwargs)

    ds = dataset_class(images, labels, padding=padding)
    np.random.default_rng = counted
    try:
        for i in list(range(len(labels))) * 2:
            ds[i]
    finally:
        np.random.default_rng = original
    n = 2 * len(labels)
    if made[0] > n // 2:
        raise CheckFailed("keeps one generator per process",
                          f"{what}: {made[0]} NumPy generators made for {n} draws (one for every item or more)",
                          "making a generator costs tens of microseconds, a sizeable share of a CIFAR crop and "
                          "flip, on every item of every epoch, and its seeding then decides everything: make one "
                          "when the seed changes and keep drawing from it")


def _draw_statistics(params, padding, what, per_item):
    """Each item's repeated draws vary; offsets cover 0..2*padding uniformly on both axes, drawn
    independently of each other; some items are flipped and some not. `per_item`: the item count
    (params cycle through the items). The share flipped is judged over all the draws of the check
    (`_flip_share`), where there are enough of them to tell 0.5 from 0.49."""
    k = 2 * padding + 1
    n = len(params)
    repeats = [{params[j] for j in range(i, n, per_item)} for i in range(per_item)]
    stuck = sum(len(r) == 1 for r in repeats)
    if stuck > per_item // 2:
        if len(set(params[:per_item])) == 1:
            raise CheckFailed("draws anew on every call",
                              f"{what}: every item, every one of the {n // per_item} times it was asked for, came out "
                              f"with the same crop and flip {params[0]}: your generator starts again from the same "
                              "seed on every call",
                              "make the generator only when the seed changes, and keep drawing from it: compare the "
                              "seeds with != (`is not` compares objects, and two equal large ints are different "
                              "objects), and never make one per item")
        raise CheckFailed("draws anew on every call",
                          f"{what}: {stuck} of {per_item} items came out with the same crop and flip all "
                          f"{n // per_item} times they were asked for",
                          "a generator made (or re-seeded) for every item, from a seed such as seed + index, "
                          "restarts from the same state each time that item is asked for: make one generator "
                          "per process and keep drawing from it")
    flips = sum(p[2] for p in params) / n
    if flips in (0.0, 1.0):
        raise CheckFailed("flips half the items", f"{what}: {'every one' if flips else 'none'} of {n} draws "
                          f"{'was' if flips else 'were'} mirrored",
                          "mirror with probability 1/2: rng.random() < 0.5")
    offsets = len({p[:2] for p in params})
    if offsets < 3:
        raise CheckFailed("draws random crops", f"{what}: {n} draws gave only {offsets} different offsets "
                          f"(padding {padding}: {k * k} possible)",
                          "draw each offset uniformly over 0..2*padding: rng.integers(0, 2 * padding + 1)")
    for axis, name in ((0, "vertical"), (1, "horizontal")):
        counts = np.bincount([p[axis] for p in params], minlength=k)
        missing = [int(v) for v in np.flatnonzero(counts == 0)]
        if missing:
            hint = ("rng.integers(0, 2 * padding + 1): the upper bound is exclusive" if missing == [2 * padding] else
                    "draw each offset uniformly over 0..2*padding, both ends included")
            raise CheckFailed("offsets cover 0..2*padding", f"{what}: over {n} draws the {name} offset never took "
                              f"the values {missing} (padding {padding})", hint)
        if counts.min() < 0.5 * n / k or counts.max() > 1.5 * n / k:     # about 5 standard deviations
            raise CheckFailed("offsets are uniform over 0..2*padding", f"{what}: {name} offsets counted "
                              f"{counts.tolist()} over {n} draws (about {n / k:.0f} each expected)",
                              "one uniform draw per axis in 0..2*padding")
    # the two offsets drawn independently: every (dy, dx) pair turns up where there are draws enough
    # for all of them (at least 20 each expected: a pair missing by chance is e^-20), and the two
    # are uncorrelated (|r| above 0.2 is 7 standard deviations from 0 for 1,200 draws)
    dy = np.array([p[0] for p in params], float)
    dx = np.array([p[1] for p in params], float)
    pairs = len({p[:2] for p in params})
    r = float(np.corrcoef(dy, dx)[0, 1]) if dy.std() > 0 and dx.std() > 0 else 0.0
    if (n >= 20 * k * k and pairs < k * k) or abs(r) > 0.2:
        same = float(np.mean(dy == dx))
        raise CheckFailed("offsets drawn independently on the two axes",
                          f"{what}: {pairs} of the {k * k} (dy, dx) pairs turned up in {n} draws; dy equalled dx in "
                          f"{same:.0%} of them (1 in {k} by chance), correlation {r:+.2f}",
                          "draw dy and dx separately: rng.integers(0, 2 * padding + 1, size=2), not one offset used "
                          "for both")


# The share mirrored is read in looks, as many draws as it takes (_flip_share): at each look it fails
# beyond _FLIP_Z_FAIR standard deviations of a fair coin, and passes within _FLIP_OFF -
# _FLIP_Z_OFF standard deviations (where a rate _FLIP_OFF from 1/2 lands that rarely); the last look
# decides, the two bands meeting there.
_FLIP_OFF, _FLIP_Z_FAIR, _FLIP_Z_OFF = 0.01, 5.3, 5.2
_FLIP_LOOKS = (51_000, 75_000, 100_000, 125_000, 150_000, 200_000,
               int(np.ceil(((_FLIP_Z_FAIR + _FLIP_Z_OFF) * 0.5 / _FLIP_OFF) ** 2)))    # the last: 275,625


def _flip_verdict(mirrored: int, n: int, last: bool) -> str | None:
    """'fail', 'pass' or None (draw more) for `mirrored` of `n` draws."""
    sd = 0.5 / np.sqrt(n)
    off = abs(mirrored / n - 0.5)
    if off > _FLIP_Z_FAIR * sd:
        return "fail"
    if last or off <= _FLIP_OFF - _FLIP_Z_OFF * sd:
        return "pass"
    return None


def _flip_share(flipped: list[bool], more, what: str) -> None:
    """The share of mirrored draws is 1/2, told apart from 0.49 and 0.51 on every run: `flipped`
    the draws so far, `more(k)` k more or a few over. Read in looks (_FLIP_LOOKS, from 51,000 to
    275,625 draws): a look fails a share beyond 5.3 standard deviations of 1/2 (a right answer,
    about 1e-7 a look) and passes one within 0.01 - 5.2 standard deviations of it (a rate of 0.49
    or 0.51 lands there about 1e-7 a look); at the last look the two meet, at 0.5 +- 0.005. A right
    answer stops after about 100,000 draws (within 200,000 in 99 runs of 100), 0.49 fails after
    about 85,000, 0.48 at the first look; rates between about 0.495 and 0.505 cannot be told from
    1/2 at this size and may pass either way (w6-02: 0.49 passed 6 of 6 runs at 51,000 draws with a
    band of +- 0.010)."""
    flips = list(flipped)
    for look in _FLIP_LOOKS:
        if look > len(flips):
            flips += more(look - len(flips))
        n, mirrored = len(flips), sum(flips)
        verdict = _flip_verdict(mirrored, n, look == _FLIP_LOOKS[-1])
        if verdict == "fail":
            band = _FLIP_Z_FAIR * 0.5 / np.sqrt(n)
            raise CheckFailed("flips half the items",
                              f"{what}: {mirrored / n:.2%} of {n:,} draws were mirrored, outside 50% +- {band:.2%}, "
                              f"where a fair coin stays at this size (the check draws {_FLIP_LOOKS[0]:,} to "
                              f"{_FLIP_LOOKS[-1]:,} times, as many as it takes to tell 1/2 from a rate "
                              f"{_FLIP_OFF:g} away, 0.49 or 0.51, on every run)",
                              "mirror with probability 1/2: rng.random() < 0.5 (exactly 0.5)")
        if verdict == "pass":
            return


@exercise("2.3", "Augmentations that differ across workers and epochs, reproducibly", points=2, time_limit_s=150)
def check_worker_seeding(dataset_class):
    with _ends_what_it_starts(), _torch_rng_kept():
        return _check_worker_seeding(dataset_class)


def _check_worker_seeding(dataset_class):
    expect_class(dataset_class, "a Dataset class WorkerSafeCropFlip(images, labels, padding=4)")
    rng, seed = fresh_rng()
    n = 2 * int(rng.integers(10, 14))
    h, w = int(rng.integers(7, 13)), int(rng.integers(7, 13))
    padding = int(rng.integers(1, 4))                 # two paddings a run, never the default 4
    other_padding = int(rng.integers(5, 7))           # below the image's size: no window is all padding
    images = rng.integers(1, 256, (n, h, w, 3), dtype=np.uint8)   # no zero pixels: padding is recognisable
    labels = [int(x) for x in rng.choice(10**6, n, replace=False)]
    dataset = dataset_class(images, labels, padding=padding)
    if len(dataset) != n:
        raise CheckFailed("has one item per image", f"len(dataset) is {len(dataset)}, expected {n}")

    # in the main process (num_workers=0): valid crops, and their statistics over many draws; the
    # padding given twice, then left at its default (4)
    configs = ((padding, dataset, f"padding={padding}"),
               (other_padding, dataset_class(images, labels, padding=other_padding), f"padding={other_padding}"),
               (4, dataset_class(images, labels), "padding left at its default"))
    flipped = []
    for pad, ds, how in configs:
        what = f"{n} images of {h}x{w}, {how}, drawn 60 times each in the main process (seed {seed})"
        indices = [i for _ in range(60) for i in range(n)]
        try:
            params = _params_of([ds[i] for i in indices], images, labels, indices, pad, what)
            _draw_statistics(params, pad, what, n)
        except CheckFailed as failed:
            # only what the padding decides is blamed on the default (q02 w23_02: every failure of the default
            # dataset was said to be its default padding)
            if ds is dataset or pad != 4 or failed.prop not in (
                    "returns a crop of the zero-padded image, flipped or not", "offsets cover 0..2*padding",
                    "offsets are uniform over 0..2*padding"):
                raise
            raise CheckFailed("pads by 4 by default", failed.detail,
                              "def __init__(self, images, labels, padding=4)") from None
        flipped += [p[2] for p in params]
    # 240 more draws of each item of the first dataset: the share flipped over 8,000 or more draws
    indices = [i for _ in range(240) for i in range(n)]
    what = f"{n} images of {h}x{w}, padding={padding}, drawn 240 more times each in the main process (seed {seed})"
    more = _params_of([dataset[i] for i in indices], images, labels, indices, padding, what)
    _draw_statistics(more, padding, what, n)          # with 20 draws or more of every (dy, dx) pair
    flipped += [p[2] for p in more]
    # the seed folded into fewer bits (seed // 2, float(), % 2**32, its halves XORed), judged in the main
    # process where the seed handed to NumPy shows it, on seed pairs any such fold maps onto one (w6-02)
    pairs = _seed_pairs(rng)
    _seed_folded(dataset_class, images, labels, padding, pairs)

    # with two workers (the dataset has been used in the main process already, as in a notebook)
    torch_seed = int(rng.integers(0, 2**31))
    what = f"{n} items, DataLoader(num_workers=2), torch.manual_seed({torch_seed})"
    run_a, run_a_epoch2 = _worker_run(dataset, images, labels, padding, torch_seed, what, epochs=2)
    pairs_equal = _fraction_equal(run_a[0::2], run_a[1::2])
    if pairs_equal > 0.5:
        hint = ("the two workers drew the same numbers: either one generator, made before the workers started "
                "(in __init__), was copied into each worker process with the dataset, or each worker made its own "
                "from a seed that is the same in every worker (a fixed number, or get_worker_info().seed - id, "
                "the loader's base seed): create the generator inside the worker, seeded from "
                "get_worker_info().seed itself, which differs from worker to worker")
        unused = dataset_class(images, labels, padding=padding)
        fresh_run, = _worker_run(unused, images, labels, padding, torch_seed, what)
        if _fraction_equal(fresh_run[0::2], fresh_run[1::2]) <= 0.5:
            hint = ("a dataset never used before works, but this one was used in the main process first "
                    "(as when you look at a sample in a notebook), and its generator was copied into "
                    "both workers: make a new generator whenever get_worker_info().seed differs from "
                    "the seed the current one was made with")
        raise CheckFailed("different augmentations in different workers",
                          f"{what}: worker 0 and worker 1 drew the same (dy, dx, flip) for {pairs_equal:.0%} of "
                          "their items (items 0 and 1, 2 and 3, ...)", hint)
    # the same item asked for twice in a row by the same worker (item k of the order goes to worker k % 2)
    order = [i for j in range(0, n, 2) for i in (j, j + 1, j, j + 1)]
    twice, = _worker_run(dataset, images, labels, padding, torch_seed, what, order=order)
    repeated = _fraction_equal(twice[0::4] + twice[1::4], twice[2::4] + twice[3::4])
    if repeated > 0.5:
        raise CheckFailed("draws anew for every item in a worker",
                          f"{what}: an item asked for twice by the same worker came out with the same crop and flip "
                          f"both times for {repeated:.0%} of the items",
                          "a generator made (or re-seeded) for every item repeats its draws whenever its seed "
                          "repeats: make it once per worker (when get_worker_info().seed differs from the seed "
                          "the current one was made with) and keep drawing from it")
    run_b, = _worker_run(dataset, images, labels, padding, torch_seed, what)
    if run_a != run_b:
        raise CheckFailed("reproducible under torch.manual_seed",
                          f"{what}, run twice: {1 - _fraction_equal(run_a, run_b):.0%} of the items differ",
                          "seed the generator from what torch gives each worker (get_worker_info().seed), "
                          "not from the clock, the pid or fresh OS entropy")
    run_c, = _worker_run(dataset, images, labels, padding, torch_seed + 1, what)
    if _fraction_equal(run_a, run_c) > 0.5:
        raise CheckFailed("follows the torch seed",
                          f"torch.manual_seed({torch_seed}) and torch.manual_seed({torch_seed + 1}) gave the same "
                          f"augmentations for {_fraction_equal(run_a, run_c):.0%} of the items",
                          "a seed made from the worker id, a fixed number or both (1234 + id) is the same in every "
                          "run: use get_worker_info().seed, which torch derives from its own seed")
    if _fraction_equal(run_a, run_a_epoch2) > 0.5:
        raise CheckFailed("new augmentations every epoch",
                          f"{what}: epoch 2 repeated {_fraction_equal(run_a, run_a_epoch2):.0%} of epoch 1's "
                          "augmentations",
                          "each epoch starts new workers from the main process's copy of the dataset; "
                          "a generator made once (in __init__ or the main process) restarts from the same "
                          "state every epoch")
    _main_process_seeding(dataset_class, images, labels, padding, int(rng.integers(0, 2**31)), pairs)
    _later_seed_followed(dataset_class, images, labels, padding,
                         (int(rng.integers(0, 2**30)), int(rng.integers(2**30, 2**31 - 1))))
    _generators_made(dataset_class, images, labels, padding,
                     f"{n} images of {h}x{w}, padding={padding}, a fresh dataset drawing each twice in the main process")
    _torch_rng_left_alone(dataset_class, images, labels, padding, int(rng.integers(0, 2**31)),
                          f"{n} images of {h}x{w}, padding={padding}, in the main process after "
                          "torch.manual_seed(s) and a few draws of the training's own")
    # last, the share mirrored, over as many draws as it takes to tell 1/2 from 0.49 and 0.51 (w6-02: 0.49
    # passed 6 of 6 runs at 51,000 draws): more, cheap ones, of small images padded by 1; last, so that an
    # answer that fails on its seeding does not wait for them
    small_images = rng.integers(1, 256, (n, 5, 5, 3), dtype=np.uint8)
    small = dataset_class(small_images, labels, padding=1)

    def more_flips(count):
        rounds = -(-count // n)
        indices = [i for _ in range(rounds) for i in range(n)]
        what = f"{n} images of 5x5, padding=1, drawn {rounds} times each in the main process (seed {seed})"
        return [p[2] for p in _params_of([small[i] for i in indices], small_images, labels, indices, 1, what)]

    _flip_share(flipped, more_flips, f"{n} images of {h}x{w} and of 5x5, in the main process (seed {seed})")
    return ("valid crops, offsets uniform over 0..2*padding and half flipped (two paddings and the default); each "
            "item drawn anew, workers differ, epochs differ, and a torch seed reproduces them, in workers and in "
            "the main process; torch's global generator left alone.")
