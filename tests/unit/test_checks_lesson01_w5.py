"""Lesson 01's checks after walk w5-01: the three wrong answers that passed (1.1 rounded to 0.1 ms,
1.1 a result memoised per fn, 1.2 a result memoised per log object) fail on every seed, and the
slips whose messages pointed elsewhere are named. Check 1.1 draws nothing at random (one seed
proves it); 1.2-1.4 are pure functions of a few ms per run (a few seeds each)."""
import statistics
import time

import numpy as np
import pytest

from course_utils.checks import run_check
from course_utils.timing import synchronize
from mutants import Mutant, passes, rejected


# -- 1.1 ------------------------------------------------------------------------------------

def _timed(fn, device):
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return (time.perf_counter() - t0) * 1e3


def _median(fn, device, warmup, repeats):
    for _ in range(warmup):
        fn()
    return statistics.median(_timed(fn, device) for _ in range(repeats))


def rounded_01(fn, device, warmup=3, repeats=10):        # w5-01 w11_13: "a tidy number"
    return round(_median(fn, device, warmup, repeats), 1)


def rounded_001(fn, device, warmup=3, repeats=10):
    return round(_median(fn, device, warmup, repeats), 2)


_CACHE = {}


def memo_per_fn(fn, device, warmup=3, repeats=10):      # w5-01 w11_20: memoised per function
    if fn in _CACHE:
        return _CACHE[fn]
    _CACHE[fn] = _median(fn, device, warmup, repeats)
    return _CACHE[fn]


def numpy_median_time_time(fn, device, warmup=3, repeats=10):   # right (w5-01 w11_19)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.time()
        fn()
        synchronize(device)
        times.append((time.time() - t0) * 1000)
    return float(np.median(times))


def one_sync_after_warmup(fn, device, warmup=3, repeats=10):    # right (w5-01 w11_17)
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


MUTANTS_11 = [
    Mutant("rounded to 0.1 ms (w5-01)", rounded_01, "reports the median of the repeats", words="rounded to 0.1 ms"),
    Mutant("rounded to 0.01 ms", rounded_001, "reports the median of the repeats", words="rounded to 0.01 ms"),
    Mutant("a result memoised per fn (w5-01)", memo_per_fn, "keeps nothing from an earlier call",
           words="a dict keyed by fn"),
]


@pytest.mark.parametrize("mutant", MUTANTS_11, ids=repr)
def test_timer_mutants_of_w5_rejected(mutant):
    rejected("1.1", mutant, range(1))


@pytest.mark.parametrize("answer", [numpy_median_time_time, one_sync_after_warmup], ids=lambda f: f.__name__)
def test_right_timers_of_w5_pass(answer):
    passes("1.1", answer, range(1))


# -- 1.2 ------------------------------------------------------------------------------------

def _waits(steps):
    return sum(s["fetch_end"] - s["fetch_start"] for s in steps)


def _steps(log, skip_first):
    steps = log[skip_first:]
    if not steps:
        raise ValueError("no steps")
    return steps


_SEEN = {}


def memo_per_log(step_log, skip_first=1):                 # w5-01 w12_18
    key = (id(step_log), skip_first)
    if key not in _SEEN:
        steps = _steps(step_log, skip_first)
        _SEEN[key] = _waits(steps) / (steps[-1]["step_end"] - steps[0]["fetch_start"])
    return _SEEN[key]


def sum_of_step_spans(log, skip_first=1):                 # w12_02 (and w12_16: wait / (wait + compute))
    steps = _steps(log, skip_first)
    return _waits(steps) / sum(s["step_end"] - s["fetch_start"] for s in steps)


def wall_from_fetch_end(log, skip_first=1):               # w12_03
    steps = _steps(log, skip_first)
    return _waits(steps) / (steps[-1]["step_end"] - steps[0]["fetch_end"])


def wall_to_last_fetch_start(log, skip_first=1):          # w12_04
    steps = _steps(log, skip_first)
    wall = steps[-1]["fetch_start"] - steps[0]["fetch_start"]
    return _waits(steps) / wall if wall > 0 else 1.0


def median_wait_times_n(log, skip_first=1):               # w12_09
    steps = _steps(log, skip_first)
    w = statistics.median(s["fetch_end"] - s["fetch_start"] for s in steps) * len(steps)
    return w / (steps[-1]["step_end"] - steps[0]["fetch_start"])


def wall_from_the_warmup(log, skip_first=1):              # w12_11
    steps = _steps(log, skip_first)
    return _waits(steps) / (log[-1]["step_end"] - log[0]["fetch_start"])


def gaps_as_waiting(log, skip_first=1):                   # w12_12
    steps = _steps(log, skip_first)
    w = steps[0]["fetch_end"] - steps[0]["fetch_start"]
    for prev, s in zip(steps, steps[1:]):
        w += s["fetch_end"] - prev["step_end"]
    return w / (steps[-1]["step_end"] - steps[0]["fetch_start"])


MUTANTS_12 = [
    Mutant("a result memoised per log object (w5-01)", memo_per_log, "keeps nothing from an earlier call",
           words="a StepTimer's log grows"),
    Mutant("the steps' own time, gaps left out (w5-01)", sum_of_step_spans, "matches the definition",
           words="yours divides by the steps' own time"),
    Mutant("the wall from the first fetch_end (w5-01)", wall_from_fetch_end, "matches the definition",
           words="starts the wall time at the first counted step's fetch_end"),
    Mutant("the wall to the last fetch_start (w5-01)", wall_to_last_fetch_start, "matches the definition",
           words="ends the wall time at the last step's fetch_start"),
    Mutant("the median wait times n (w5-01)", median_wait_times_n, "matches the definition",
           words="the median wait times the number of steps"),
    Mutant("the wall from the warm-up entry (w5-01)", wall_from_the_warmup, "matches the definition",
           words="from step_log[0], the warm-up"),
    Mutant("the gaps counted as waiting (w5-01)", gaps_as_waiting, "matches the definition",
           words="counts the gap before each fetch"),
]


@pytest.mark.parametrize("mutant", MUTANTS_12, ids=repr)
def test_stall_fraction_mutants_of_w5_rejected(mutant):
    rejected("1.2", mutant, range(4))


def test_a_memo_per_log_fails_on_its_property_when_ids_come_back():
    """Run after run in one process, a memo keyed by id(log) meets ids of earlier runs' freed logs:
    it still fails on 'keeps nothing from an earlier call' (an equal copy gets another answer)."""
    _SEEN.clear()
    rejected("1.2", Mutant("memo per log, again", memo_per_log, "keeps nothing from an earlier call"), range(8))


# -- 1.3 ------------------------------------------------------------------------------------

def _diagnose(device, course, cores=lambda tl: tl.cores):
    def diagnose(tl):
        if device(tl.gpu_util) >= 85:
            return "compute-bound"
        return "input-bound" if course(tl.ours_cores) >= 0.8 * cores(tl) else "sync-bound"
    return diagnose


def fraction_units(tl):                                   # w13_11
    if np.mean(tl.gpu_util) >= 0.85:
        return "compute-bound"
    return "input-bound" if np.mean(tl.ours_cores) >= 0.8 * tl.cores else "sync-bound"


MUTANTS_13 = [
    Mutant("utilisation as a fraction (w5-01)", fraction_units, "tells the situations apart",
           words="as if timeline.gpu_util were a fraction"),
    Mutant("the peaks (w5-01)", _diagnose(np.max, np.max), "judges the whole run (means over every sample)",
           words="the peak (the largest sample)"),
    Mutant("the last sample (w5-01)", _diagnose(lambda x: x[-1], lambda x: x[-1]),
           "judges the whole run (means over every sample)", words="the last sample"),
    Mutant("8 cores, as in the examples (w5-01)", _diagnose(np.mean, np.mean, lambda tl: 8), "diagnoses each situation",
           words="as if every timeline had 8 cores"),
]


@pytest.mark.parametrize("mutant", MUTANTS_13, ids=repr)
def test_diagnosis_mutants_of_w5_rejected(mutant):
    rejected("1.3", mutant, range(3))


# -- 1.4 ------------------------------------------------------------------------------------

def _classify(stall=lambda r: r.stall_fraction < 0.10, could=lambda r: min(r.loader_processes, r.usable_cores)):
    def classify_run(run):
        if stall(run):
            return "device-bound"
        return "cpu-bound" if np.mean(run.loader_cores) >= 0.8 * could(run) else "io-bound"
    return classify_run


def no_cap_per_process(run):                              # w14_16
    if run.stall_fraction < 0.10:
        return "device-bound"
    per = np.mean(run.loader_cores) / run.loader_processes
    return "cpu-bound" if per >= 0.8 * run.usable_cores / run.loader_processes else "io-bound"


MUTANTS_14 = [
    Mutant("the stall in percent (w5-01)", _classify(stall=lambda r: r.stall_fraction < 10), "tells the runs apart",
           words="as if run.stall_fraction were a percentage"),
    Mutant("loader processes not capped at the usable cores (w5-01)", _classify(could=lambda r: r.loader_processes),
           "CPU-bound when the loading processes are busy, whatever the core count",
           words="cap it, min(run.loader_processes, run.usable_cores)"),
    Mutant("every usable core (w5-01)", no_cap_per_process,
           "CPU-bound when the loading processes are busy, whatever the core count",
           words="a loading process uses one core at most"),
]


@pytest.mark.parametrize("mutant", MUTANTS_14, ids=repr)
def test_classify_mutants_of_w5_rejected(mutant):
    rejected("1.4", mutant, range(3))
