"""Lesson 01's checks after walk w6-01: the three wrong answers that passed (1.1 warm-up off by one
and at-least-one warm-up, both calling fn 4 times for warmup=0, repeats=3; 1.4 each sample clipped
to the cap before averaging) fail on every seed, a timer that holds every output fails (the contract
says it keeps none), and the messages that pointed elsewhere name the slip. Check 1.1 draws nothing
at random (one seed proves it); 1.2 and 1.4 draw their inputs (a few seeds, each a fraction of a second)."""
import datetime
import statistics
import time

import numpy as np
import pytest

from course_utils.timing import synchronize
from mutants import Mutant, passes, rejected


# -- 1.1 ------------------------------------------------------------------------------------

def warmup_off_by_one(fn, device, warmup=3, repeats=10):     # w6-01 1.1-14
    for _ in range(warmup - 1):       # "the first timed call finishes the warm-up"
        fn()
    times = []
    for _ in range(repeats + 1):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:])


def at_least_one_warmup(fn, device, warmup=3, repeats=10):   # w6-01 1.1-20
    for _ in range(max(warmup, 1)):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def keeps_outputs_alive(fn, device, warmup=3, repeats=10):   # w6-01 1.1-26
    outs = []
    for _ in range(warmup):
        outs.append(fn())
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        outs.append(fn())
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _cuda_only_sync(device):
    if getattr(device, "type", None) == "cuda":
        synchronize(device)


def cuda_only_sync(fn, device, warmup=3, repeats=10):        # w6-01 1.1-11
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _cuda_only_sync(device)
        t0 = time.perf_counter()
        fn()
        _cuda_only_sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def datetime_now(fn, device, warmup=3, repeats=10):          # right (w6-01 1.1-28): a wall clock of microseconds
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = datetime.datetime.now()
        fn()
        synchronize(device)
        times.append((datetime.datetime.now() - t0).total_seconds() * 1e3)
    return statistics.median(times)


def keeps_the_latest_output(fn, device, warmup=3, repeats=10):   # right: `out = fn()` holds one at a time
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    del out
    return statistics.median(times)


MUTANTS_11 = [
    Mutant("warm-up off by one, first timed call dropped (w6-01)", warmup_off_by_one, "calls fn warmup + repeats times",
           words="warmup=0, repeats=3: yours called fn 4 times"),
    Mutant("always one warm-up call (w6-01)", at_least_one_warmup, "calls fn warmup + repeats times",
           words="warmup=0 means no warm-up call"),
    Mutant("every output kept alive (w6-01)", keeps_outputs_alive, "keeps no output of fn",
           words="in device memory while the later calls run"),
    Mutant("a sync on CUDA devices only (w6-01)", cuda_only_sync, "waits for the device before reading the clock",
           words="yours skipped this device's synchronisation"),
]


@pytest.mark.parametrize("mutant", MUTANTS_11, ids=repr)
def test_timer_mutants_of_w6_rejected(mutant):
    rejected("1.1", mutant, range(1))


@pytest.mark.parametrize("answer", [datetime_now, keeps_the_latest_output], ids=lambda f: f.__name__)
def test_right_timers_of_w6_pass(answer):
    passes("1.1", answer, range(1))


def test_from_datetime_import_datetime_passes():
    """`from datetime import datetime` binds the class in the timer's module: the check scripts it there too."""
    namespace = {}
    exec("from datetime import datetime\nimport statistics\nfrom course_utils.timing import synchronize\n"
         "def time_it(fn, device, warmup=3, repeats=10):\n"
         "    for _ in range(warmup):\n        fn()\n    times = []\n"
         "    for _ in range(repeats):\n        synchronize(device); t0 = datetime.now(); fn(); synchronize(device)\n"
         "        times.append((datetime.now() - t0).total_seconds() * 1e3)\n"
         "    return statistics.median(times)\n", namespace)
    passes("1.1", namespace["time_it"], range(1))
    assert datetime.datetime.now().year >= 2024        # the real class is back


# -- 1.2 ------------------------------------------------------------------------------------

_TOTAL = {"wait": 0.0, "wall": 0.0}


def running_total(step_log, skip_first=1):                 # w6-01 1.2-17
    steps = step_log[skip_first:]
    if not steps:
        raise ValueError("empty")
    _TOTAL["wait"] += sum(s["fetch_end"] - s["fetch_start"] for s in steps)
    _TOTAL["wall"] += steps[-1]["step_end"] - steps[0]["fetch_start"]
    return _TOTAL["wait"] / _TOTAL["wall"]


def test_a_global_running_total_is_named():
    rejected("1.2", Mutant("a global running total (w6-01)", running_total, "keeps nothing from an earlier call",
                           words="a value kept between calls in a global"), range(3))


# -- 1.4 ------------------------------------------------------------------------------------

def clip_per_sample(run):                                   # w6-01 1.4-10
    if run.stall_fraction < 0.10:
        return "device-bound"
    possible = min(run.loader_processes, run.usable_cores)
    return "cpu-bound" if np.mean(np.minimum(run.loader_cores, possible)) >= 0.8 * possible else "io-bound"


def test_clipping_each_sample_to_the_cap_is_rejected():
    rejected("1.4", Mutant("each sample clipped to the cap (w6-01)", clip_per_sample,
                           "averages run.loader_cores as recorded",
                           words="as if it cut each sample of run.loader_cores"), range(4))


def one_sync_at_the_end(fn, device, warmup=3, repeats=10):   # w6-01 1.1-25: lap times between launches
    for _ in range(warmup):
        fn()
    synchronize(device)
    marks = []
    for _ in range(repeats):
        marks.append(time.perf_counter())
        fn()
    synchronize(device)
    marks.append(time.perf_counter())
    return statistics.median((b - a) * 1e3 for a, b in zip(marks, marks[1:]))


def test_one_sync_at_the_end_is_told_each_call_needs_its_own():
    rejected("1.1", Mutant("one sync after the loop (w6-01)", one_sync_at_the_end,
                           "waits for the device before reading the clock",
                           words="each timed call needs its own synchronize(device)"), range(1))
