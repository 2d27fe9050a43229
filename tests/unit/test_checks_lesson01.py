import statistics
import time

import numpy as np

from course_utils.checks import run_check
from course_utils.timing import synchronize


def time_it(fn, device, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def no_sync(fn, device, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def no_warmup(fn, device, warmup=3, repeats=10):
    return time_it(fn, device, warmup=0, repeats=repeats + warmup)


def mean_not_median(fn, device, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return sum(times) / len(times)


def seconds(fn, device, warmup=3, repeats=10):
    return time_it(fn, device, warmup, repeats) / 1e3


def test_timer_right_and_wrong():
    assert run_check("1.1", time_it).status == "pass"
    assert "waits for the device" in run_check("1.1", no_sync).message
    assert "excludes warm-up" in run_check("1.1", no_warmup).message
    assert "median" in run_check("1.1", mean_not_median).message
    assert "reports milliseconds" in run_check("1.1", seconds).message


def stall(log, skip_first=1):
    steps = log[skip_first:]
    if not steps:
        raise ValueError("no steps")
    return sum(s["fetch_end"] - s["fetch_start"] for s in steps) / (steps[-1]["step_end"] - steps[0]["fetch_start"])


def test_stall_fraction_right_and_wrong():
    assert run_check("1.2", stall).status == "pass"

    def no_skip(log, skip_first=1):
        return stall(log, 0)
    assert "warm-up" in run_check("1.2", no_skip).message

    def ignores_gaps(log, skip_first=1):
        steps = log[skip_first:]
        if not steps:
            raise ValueError
        wait = sum(s["fetch_end"] - s["fetch_start"] for s in steps)
        return wait / sum(s["step_end"] - s["fetch_start"] for s in steps)
    assert "matches the definition" in run_check("1.2", ignores_gaps).message

    def empty_zero(log, skip_first=1):
        return stall(log, skip_first) if log[skip_first:] else 0.0
    assert "raises ValueError" in run_check("1.2", empty_zero).message


def diagnose(tl):
    if np.mean(tl.gpu_util) >= 85:
        return "compute-bound"
    return "input-bound" if np.mean(tl.cpu_percent) >= 80 else "sync-bound"


def test_diagnosis_right_and_wrong():
    assert run_check("1.3", diagnose).status == "pass"
    assert "tells the situations apart" in run_check("1.3", lambda tl: "input-bound").message
    assert "one of the three labels" in run_check("1.3", lambda tl: "slow").message

    def busiest_core(tl):  # confuses one busy thread with saturated cores
        if np.mean(tl.gpu_util) >= 85:
            return "compute-bound"
        return "input-bound" if np.mean(tl.cpu_percent, axis=0).max() >= 80 else "sync-bound"
    assert "diagnoses each situation" in run_check("1.3", busiest_core).message


def test_stubs_are_not_implemented():
    def stub(*args, **kwargs):
        raise NotImplementedError
    for ex in ("1.1", "1.2", "1.3"):
        assert run_check(ex, stub).status == "not_implemented"
