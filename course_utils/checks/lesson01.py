"""Checks for lesson 01 (measure the baseline)."""
from __future__ import annotations

import copy
import math
import time
from collections import Counter

import numpy as np
import torch

from ..monitor import TIMELINE_KINDS, Timeline, synthetic_timeline
from ..sim import SimulatedAccelerator
from ._core import CheckFailed, exercise, expect_callable
from ._util import forbids, fresh_rng


# -- 1.1 a correct timer ---------------------------------------------------------------------

class _CountingFn:
    """A workload whose cost per call is scripted: host time (sleep, plus a little CPU work) and
    device time (asynchronous)."""

    def __init__(self, host_ms, device=None, device_ms=0.0, cpu_ms=0.0):
        self._host_ms, self._device, self._device_ms, self._cpu_ms = host_ms, device, device_ms, cpu_ms
        self.calls = 0

    def __call__(self):
        ms = self._host_ms(self.calls) if callable(self._host_ms) else self._host_ms
        self.calls += 1
        if self._cpu_ms:                  # CPU time the process really spends (not a sleep)
            end = time.process_time() + self._cpu_ms / 1e3
            while time.process_time() < end:
                pass
        if ms:
            time.sleep(ms / 1e3)
        if self._device is not None and self._device_ms:
            self._device.launch(self._device_ms)


def _as_ms(value, what):
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, (int, float, np.floating, np.integer)) or isinstance(value, bool):
        raise CheckFailed("returns a number of milliseconds", f"{what} returned {type(value).__name__}: {value!r}")
    return float(value)


@exercise("1.1", "A timer that tells the truth: warm-up, synchronise, median of repeats", points=2)
@forbids("course_utils.timing:benchmark")
def check_timer(time_it):
    expect_callable(time_it, "a function time_it(fn, device, warmup=3, repeats=10) -> milliseconds")
    # (a) plain CPU work (mostly waiting, as a call that waits for I/O does): the wall time, in
    # milliseconds, and the right count of calls
    fn = _CountingFn(5.0, cpu_ms=1.0)
    ms = _as_ms(time_it(fn, torch.device("cpu"), warmup=2, repeats=5), "time_it on a 6 ms CPU function")
    if 0.004 <= ms <= 0.025:
        raise CheckFailed("reports milliseconds", f"yours {ms:.4f} for a 6 ms function, expected about 6",
                          "time.perf_counter() counts seconds: multiply by 1000")
    if not 5.0 <= ms <= 20.0:
        hint = ("time the wall clock with time.perf_counter(): time.process_time() counts only the CPU time "
                "of this process, not the time spent waiting" if ms < 5.0 else "")
        raise CheckFailed("measures the wall time of a CPU function",
                          f"yours {ms:.3f} ms for a function that takes 6 ms (1 ms of CPU, 5 ms of waiting)", hint)
    if fn.calls != 7:
        raise CheckFailed("calls fn warmup + repeats times", f"warmup=2, repeats=5: yours called fn {fn.calls} times, expected 7")
    # (b) asynchronous device work: must synchronise before reading the clock
    device = SimulatedAccelerator(step_ms=0, max_queued=1000)  # a deep launch queue, as on CUDA
    try:
        fn = _CountingFn(0.0, device, device_ms=20.0)
        ms = _as_ms(time_it(fn, device, warmup=1, repeats=5), "time_it on asynchronous device work")
        if ms < 0.6 * 20:
            raise CheckFailed("waits for the device before reading the clock",
                              f"each call queues 20 ms of device work; yours measured {ms:.2f} ms",
                              "device work is asynchronous: call synchronize(device) before you start "
                              "the clock and again before you stop it")
        if ms > 1.6 * 20:
            raise CheckFailed("times one call at a time", f"each call queues 20 ms of device work; yours measured {ms:.2f} ms")
        if fn.calls != 6:
            raise CheckFailed("calls fn warmup + repeats times",
                              f"warmup=1, repeats=5: yours called fn {fn.calls} times, expected 6")
        # (c) the warm-up's device work is still queued when the timing starts: wait for it first
        fn = _CountingFn(0.0, device, device_ms=20.0)
        ms = _as_ms(time_it(fn, device, warmup=3, repeats=1), "time_it with device work left from the warm-up")
        if ms > 1.6 * 20:
            raise CheckFailed("waits for earlier work before starting the clock",
                              f"warmup=3 calls queue 60 ms of device work, then one timed call queues 20 ms; yours "
                              f"measured {ms:.1f} ms for it",
                              "synchronize(device) right before starting the clock, not only before stopping it")
        if fn.calls != 4:
            raise CheckFailed("calls fn warmup + repeats times",
                              f"warmup=3, repeats=1: yours called fn {fn.calls} times, expected 4")
        # (d) warm-up: the first calls are slow (lazy initialisation, autotuning)
        fn = _CountingFn(lambda i: 40.0 if i < 5 else 4.0)
        ms = _as_ms(time_it(fn, device, warmup=5, repeats=3), "time_it with slow first calls")
        if ms > 20:
            raise CheckFailed("excludes warm-up calls", f"the first 5 calls take 40 ms, later ones 4 ms; "
                              f"with warmup=5, repeats=3 yours reported {ms:.1f} ms",
                              "run fn `warmup` times before timing anything, and time only the `repeats` calls")
        # (e) one slow outlier among the timed calls must not move the result
        fn = _CountingFn(lambda i: 150.0 if i == 4 else 4.0)
        ms = _as_ms(time_it(fn, device, warmup=1, repeats=7), "time_it with one outlier")
        if ms > 15:
            raise CheckFailed("reports the median of the repeats", f"6 timed calls of 4 ms and one of 150 ms: "
                              f"yours reported {ms:.1f} ms (a mean would say ~25)", "statistics.median(times)")
        # (f) nor one fast one
        fn = _CountingFn(lambda i: 1.0 if i == 3 else 9.0)
        ms = _as_ms(time_it(fn, device, warmup=1, repeats=5), "time_it with one fast call")
        if ms < 6:
            raise CheckFailed("reports the median of the repeats", f"4 timed calls of 9 ms and one of 1 ms: yours "
                              f"reported {ms:.1f} ms (the minimum would say 1)", "statistics.median(times)")
    finally:
        device.close()
    # (g) a real GPU, when there is one
    if torch.cuda.is_available():
        cuda = torch.device("cuda", torch.cuda.current_device())
        a = torch.randn(4096, 4096, device=cuda)
        fn = lambda: a @ a  # noqa: E731
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(3):
            fn()
        start.record()
        for _ in range(10):
            fn()
        end.record()
        end.synchronize()
        expected = start.elapsed_time(end) / 10
        ms = _as_ms(time_it(fn, cuda, warmup=3, repeats=10), "time_it on a CUDA matmul")
        if not 0.5 * expected <= ms <= 2.0 * expected:
            raise CheckFailed("times CUDA work", f"a 4096x4096 matmul: yours {ms:.3f} ms, CUDA events say {expected:.3f} ms")
    return "warm-up skipped, device synchronised before and after, median reported, in milliseconds of wall time."


# -- 1.2 the data-stall fraction ---------------------------------------------------------------

def _reference_stall(log, skip_first):
    steps = log[skip_first:]
    if not steps:
        raise ValueError("no steps left")
    wait = sum(s["fetch_end"] - s["fetch_start"] for s in steps)
    return wait / (steps[-1]["step_end"] - steps[0]["fetch_start"])


def _random_log(rng, n, *, warm_wait=0.0, gap=True):
    t, log = rng.uniform(0, 100), []
    for i in range(n):
        start = t
        wait = rng.exponential(0.02) + (warm_wait if i == 0 else 0.0)
        compute = rng.uniform(0.005, 0.05)
        log.append({"fetch_start": start, "fetch_end": start + wait, "step_end": start + wait + compute})
        t = start + wait + compute + (rng.uniform(0.0, 0.03) if gap else 0.0)
    return log


@exercise("1.2", "The data-stall fraction from a step log")
@forbids("course_utils.timing:_wall_and_wait", "course_utils.timing:StepStats.stall_fraction")
def check_stall_fraction(stall_fraction):
    expect_callable(stall_fraction, "a function stall_fraction(step_log, skip_first=1) -> float")
    rng, seed = fresh_rng()
    cases = [(_random_log(rng, 12, warm_wait=2.0), 1, "a 12-step log whose first step waits 2 s"),
             (_random_log(rng, 40), 3, "a 40-step log, skip_first=3"),
             (_random_log(rng, 8), 0, "an 8-step log, skip_first=0"),
             (_random_log(rng, 25, gap=False), 1, "a 25-step log without gaps between steps")]
    no_wait = _random_log(rng, 6)
    for s in no_wait:
        s["step_end"] -= s["fetch_end"] - s["fetch_start"]
        s["fetch_end"] = s["fetch_start"]
    cases.append((no_wait, 1, "a log where batches never kept the loop waiting"))
    for log, skip, what in cases:
        original = copy.deepcopy(log)
        yours = stall_fraction(log, skip_first=skip)
        if log != original:
            raise CheckFailed("leaves the log unchanged", f"{what}: the list passed in was modified")
        if not isinstance(yours, (float, int, np.floating)) or isinstance(yours, bool):
            raise CheckFailed("returns a float", f"{what}: yours returned {type(yours).__name__}")
        expected = _reference_stall(log, skip)
        if not math.isclose(float(yours), expected, rel_tol=1e-6, abs_tol=1e-9):
            hint = ("wait = fetch_end - fetch_start for each counted step; divide their sum by the wall time "
                    "from the first counted step's fetch_start to the last step's step_end (gaps between "
                    "steps are part of the wall time)")
            if skip and math.isclose(float(yours), _reference_stall(log, 0), rel_tol=1e-6):
                hint = f"the first skip_first={skip} steps are warm-up: leave them out"
            elif math.isclose(float(yours), 100 * expected, rel_tol=1e-6):
                hint = "a fraction, between 0 and 1, not a percentage"
            raise CheckFailed("matches the definition", f"{what}: yours {float(yours):.6f}, expected {expected:.6f} "
                              f"(seed {seed})", hint)
    try:
        stall_fraction(_random_log(rng, 3), skip_first=3)
    except ValueError:
        pass
    except Exception as exc:
        raise CheckFailed("raises ValueError when no step is left",
                          f"3 steps with skip_first=3 raised {type(exc).__name__}: {exc}",
                          "check for an empty list of steps first and raise ValueError yourself") from None
    else:
        raise CheckFailed("raises ValueError when no step is left", "3 steps with skip_first=3 did not raise",
                          "a fraction of nothing is not 0: raise ValueError('no steps left after skipping')")
    return "matches the definition on five logs, warm-up excluded, gaps counted, empty case raises."


# -- 1.3 diagnose a timeline ---------------------------------------------------------------------

@exercise("1.3", "Diagnose recorded utilisation timelines", points=2)
def check_diagnose(diagnose):
    expect_callable(diagnose, "a function diagnose(timeline) -> 'input-bound' | 'compute-bound' | 'sync-bound'")
    rng, seed = fresh_rng()
    wrong, answers = [], Counter()
    total = 0
    for kind in TIMELINE_KINDS:
        for cores in (2, 4, 8, 16, 32):
            for _ in range(2):
                made = synthetic_timeline(kind, cores=cores, seconds=float(rng.uniform(4, 15)), rng=rng)
                # the same samples, without the label the example carries in its device text
                timeline = Timeline(t_s=made.t_s, cpu_percent=made.cpu_percent, gpu_util=made.gpu_util,
                                    device="a recorded device", host=f"{cores} cores", simulated=True)
                answer = diagnose(timeline)
                total += 1
                if not isinstance(answer, str) or answer not in TIMELINE_KINDS:
                    raise CheckFailed("answers one of the three labels",
                                      f"yours returned {answer!r}; expected one of {', '.join(TIMELINE_KINDS)}")
                answers[answer] += 1
                if answer != kind:
                    wrong.append(f"{kind} on {cores} cores -> yours '{answer}'")
    if len(answers) == 1:
        raise CheckFailed("tells the situations apart", f"yours always answers '{next(iter(answers))}'")
    if len(wrong) > 1:
        shown = "; ".join(wrong[:4]) + ("; ..." if len(wrong) > 4 else "")
        raise CheckFailed("diagnoses each situation", f"{len(wrong)} of {total} timelines misread (seed {seed}): {shown}",
                          "look at the device's mean utilisation first (busy nearly always?), then at "
                          "the CPU: are all cores saturated, or is most of the machine idle?")
    return f"{total - len(wrong)} of {total} timelines diagnosed correctly."
