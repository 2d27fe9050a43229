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
        # (d') one timed call after two slow warm-up calls: a loop whose first timed call is the
        # last warm-up call (timing from warmup - 1 on) reports the mean of 40 and 4 ms, or 40
        fn = _CountingFn(lambda i: 40.0 if i < 2 else 4.0)
        ms = _as_ms(time_it(fn, device, warmup=2, repeats=1), "time_it with warmup=2, repeats=1")
        if ms > 15:
            raise CheckFailed("excludes warm-up calls", f"the first 2 calls take 40 ms, later ones 4 ms; with "
                              f"warmup=2, repeats=1 yours reported {ms:.1f} ms for the one timed call",
                              "your timed calls include a warm-up call (the last one, judging by the number): "
                              "finish all `warmup` calls first, then time exactly `repeats` calls, each "
                              "between its own two synchronize(device) calls")
        if fn.calls != 3:
            raise CheckFailed("calls fn warmup + repeats times",
                              f"warmup=2, repeats=1: yours called fn {fn.calls} times, expected 3")
        # (d'') the defaults, as the spec states them: warmup=3, repeats=10
        fn = _CountingFn(lambda i: 40.0 if i < 3 else 2.0)
        ms = _as_ms(time_it(fn, device), "time_it(fn, device) with its defaults")
        if fn.calls != 13:
            raise CheckFailed("defaults to warmup=3, repeats=10",
                              f"time_it(fn, device): yours called fn {fn.calls} times, expected 3 + 10 = 13",
                              "def time_it(fn, device, warmup=3, repeats=10)")
        if ms > 15:
            raise CheckFailed("defaults to warmup=3, repeats=10",
                              f"time_it(fn, device), the first 3 calls 40 ms and the rest 2 ms: yours reported "
                              f"{ms:.1f} ms", "def time_it(fn, device, warmup=3, repeats=10)")
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
    cases.append((_random_log(rng, 10, warm_wait=1.5), None, "a 10-step log, skip_first left at its default"))
    for log, skip, what in cases:
        original = copy.deepcopy(log)
        yours = stall_fraction(log) if skip is None else stall_fraction(log, skip_first=skip)
        if log != original:
            raise CheckFailed("leaves the log unchanged", f"{what}: the list passed in was modified")
        if not isinstance(yours, (float, int, np.floating)) or isinstance(yours, bool):
            raise CheckFailed("returns a float", f"{what}: yours returned {type(yours).__name__}")
        default = skip is None
        skip = 1 if default else skip
        expected = _reference_stall(log, skip)
        if not math.isclose(float(yours), expected, rel_tol=1e-6, abs_tol=1e-9):
            hint = ("wait = fetch_end - fetch_start for each counted step; divide their sum by the wall time "
                    "from the first counted step's fetch_start to the last step's step_end (gaps between "
                    "steps are part of the wall time)")
            if default and any(math.isclose(float(yours), _reference_stall(log, k), rel_tol=1e-6) for k in (0, 2, 3)):
                raise CheckFailed("defaults to skip_first=1", f"{what}: yours {float(yours):.6f}, expected "
                                  f"{expected:.6f} (seed {seed})", "def stall_fraction(step_log, skip_first=1)")
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
    # small machines, every run: one saturated core is half of 2 cores and a third of 3, so a rule
    # that reads the mean over the cores as "how busy the CPU is" calls one busy thread input-bound
    small = [(_one_busy_thread(rng, cores), "sync-bound", cores) for cores in (2, 2, 3)]
    small.append((_saturated(rng, 2), "input-bound", 2))
    small_wrong = None
    for timeline, kind, cores in small:
        answer = diagnose(timeline)
        total += 1
        if not isinstance(answer, str) or answer not in TIMELINE_KINDS:
            raise CheckFailed("answers one of the three labels",
                              f"yours returned {answer!r}; expected one of {', '.join(TIMELINE_KINDS)}")
        answers[answer] += 1
        if answer != kind and small_wrong is None:
            small_wrong = (timeline, kind, cores, answer)
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
                    wrong.append((kind, cores, answer))
    if len(answers) == 1:
        raise CheckFailed("tells the situations apart", f"yours always answers '{next(iter(answers))}'")
    # one busy thread read as a busy CPU: wrong only where that thread is a large share of the cores
    small_only = all(k == "sync-bound" and a == "input-bound" and c <= 4 for k, c, a in wrong)
    if len(wrong) > 1 and not (small_only and small_wrong is not None):
        shown = "; ".join(f"{k} on {c} cores -> yours '{a}'" for k, c, a in wrong[:4]) + ("; ..." if len(wrong) > 4 else "")
        raise CheckFailed("diagnoses each situation", f"{len(wrong)} of {total} timelines misread (seed {seed}): {shown}",
                          "look at the device's mean utilisation first (busy nearly always?), then at "
                          "the CPU: are all cores saturated, or is most of the machine idle?")
    if small_wrong is not None:
        timeline, kind, cores, answer = small_wrong
        busiest = float(np.mean(timeline.cpu_percent, axis=0).max())
        mean = float(np.mean(timeline.cpu_percent))
        hint = ("on a machine of 2 or 3 cores one busy host thread is already a half or a third of the "
                "CPU: ask whether *every* core is saturated (input-bound) or about one (sync-bound), "
                "not whether the mean over the cores passes a share that only fits big machines"
                if kind == "sync-bound" else
                "every core is saturated and the device idles between batches: that is input-bound, "
                "on 2 cores as on 32")
        raise CheckFailed("diagnoses each situation, on small machines too",
                          f"{kind} on {cores} cores (busiest core {busiest:.0f}%, mean over the cores "
                          f"{mean:.0f}%, device {float(np.mean(timeline.gpu_util)):.0f}%): yours "
                          f"'{answer}' (seed {seed})", hint)
    return f"{total - len(wrong)} of {total} timelines diagnosed correctly (small machines included)."


def _recorded(made, cpu):
    return Timeline(t_s=made.t_s, cpu_percent=cpu, gpu_util=made.gpu_util, device="a recorded device",
                    host=f"{cpu.shape[1]} cores", simulated=True)


def _one_busy_thread(rng, cores):
    """Sync-bound on a small machine: the device takes turns with one saturated host thread while
    the other cores do a little background work."""
    made = synthetic_timeline("sync-bound", cores=cores, seconds=float(rng.uniform(5, 10)), rng=rng)
    n = len(made.t_s)
    cpu = np.clip(rng.normal(rng.uniform(12, 20), 3, (n, cores)), 0, 100)
    cpu[:, int(rng.integers(cores))] = np.clip(rng.normal(rng.uniform(93, 98), 2, n), 0, 100)
    return _recorded(made, cpu)


def _saturated(rng, cores):
    made = synthetic_timeline("input-bound", cores=cores, seconds=float(rng.uniform(5, 10)), rng=rng)
    return _recorded(made, made.cpu_percent)


# ===========================================================================================
# 1.4 I/O-, CPU- or device-bound? (issue 14: "Is it I/O?"; the runs come from course_utils.io_probe)
# ===========================================================================================

def _reference_run_kind(run) -> str:
    if run.stall_fraction < 0.10:
        return "device-bound"
    possible = min(run.loader_processes, run.usable_cores)
    return "cpu-bound" if float(np.mean(run.loader_cores)) >= 0.8 * possible else "io-bound"


def _run_cases(rng):
    """(group property, hint, [(run, what), ...]) in the order the check reports them."""
    from ..io_probe import RUN_KINDS, make_run, synthetic_run

    def run(**kw):
        return make_run(rng, name=f"run {int(rng.integers(1000))}", **kw)

    def cores():
        return int(rng.choice([16, 32, 64]))

    groups = []
    cases = []
    c = int(rng.choice([2, 4, 8]))
    cases.append((run(stall=rng.uniform(0.0, 0.08), loader_use=rng.uniform(0.92, 1.0), loader_processes=2 * c + 1, cores=c,
                      disk_mb_s=100, util=rng.uniform(20, 60)), f"workers busy on all {c} cores, yet the loop rarely waits"))
    c = int(rng.choice([2, 4, 8]))
    cases.append((run(stall=rng.uniform(0.0, 0.08), loader_use=rng.uniform(0.05, 0.3), loader_processes=c + 1, cores=c,
                      disk_mb_s=400, util=rng.uniform(95, 100)), "readers waiting on a busy disk, yet the loop rarely waits"))
    c = cores()
    cases.append((run(stall=rng.uniform(0.085, 0.0999), loader_use=rng.uniform(0.9, 1.0), loader_processes=1, cores=c,
                      util=rng.uniform(0, 30), disk_mb_s=5), "a loop that waits for data 8.5-10% of the time"))
    groups.append(("device-bound when the loop rarely waits for data",
                   "a loop that waits for data less than 10% of the time is paced by the device, whatever the "
                   "loader and the disk are doing: test stall_fraction first", cases))
    cases = []
    c = cores()
    cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.91, 1.0), loader_processes=1, cores=c,
                      disk_mb_s=rng.uniform(1, 20), util=rng.uniform(0, 20)),
                  f"num_workers=0: one process decoding on a machine of {c} cores"))
    c = int(rng.choice([2, 4, 8]))
    cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.91, 1.0), loader_processes=4 * c + 1, cores=c,
                      disk_mb_s=rng.uniform(50, 300), util=rng.uniform(95, 100), iowait=rng.uniform(1, 4)),
                  f"{4 * c} workers on {c} cores, the SSD never idle (%util ~100)"))
    c = int(rng.choice([4, 8, 16]))
    cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.91, 1.0), loader_processes=3, cores=c,
                      disk_mb_s=rng.uniform(100, 300), util=rng.uniform(80, 100), iowait=rng.uniform(6, 12)),
                  "2 workers decoding, with some iowait from cold reads"))
    groups.append(("CPU-bound when the loading processes are busy, whatever the core count",
                   "compare the loaders' cores (run.loader_cores) with what they could use, "
                   "min(loader_processes, usable_cores): one busy process on 64 cores is CPU-bound too. %util and "
                   "iowait are not evidence", cases))
    cases = []
    c = cores()
    cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.1, 0.5), loader_processes=3, cores=c,
                      disk_mb_s=rng.uniform(100, 500), util=rng.uniform(30, 70)),
                  f"2 workers waiting on reads on {c} cores (machine-wide iowait is small)"))
    c = int(rng.choice([2, 4, 8]))
    cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.1, 0.5), loader_processes=c + 1, cores=c,
                      disk_mb_s=rng.uniform(20, 200), util=rng.uniform(30, 90), others=0.9 * c),
                  "readers waiting on the disk while other programs keep the CPUs busy (no iowait shows)"))
    c = int(rng.choice([4, 8, 16]))
    cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.05, 0.4), loader_processes=c + 1, cores=c,
                      disk_mb_s=rng.uniform(200, 900), util=rng.uniform(15, 45)),
                  "workers waiting on a virtual disk whose %util stays low"))
    groups.append(("I/O-bound when the loading processes wait instead of computing",
                   "if the loop waits and the loaders are not busy computing, they are waiting for reads: iowait "
                   "averaged over many cores is small, and hidden when other programs use the CPUs", cases))
    cases = []
    c = int(rng.choice([2, 4, 8]))
    cases.append((run(stall=rng.uniform(0.1005, 0.13), loader_use=rng.uniform(0.9, 0.98), loader_processes=c + 1, cores=c,
                      jitter=0.005),
                  "a loop that waits 10-13% of the time, loaders busy"))
    c = int(rng.choice([2, 4, 8]))
    cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.81, 0.86), loader_processes=c + 1, cores=c,
                      disk_mb_s=50, util=20, jitter=0.002), "loaders at 81-86% of the cores they could use"))
    c = int(rng.choice([2, 4, 8]))
    cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.72, 0.79), loader_processes=c + 1, cores=c,
                      disk_mb_s=200, util=50, jitter=0.002), "loaders at 72-79% of the cores they could use"))
    groups.append(("uses the thresholds as specified",
                   "device-bound below a stall fraction of 0.10; CPU-bound from 0.8 x min(loader_processes, usable_cores) "
                   "cores on", cases))
    cases = []
    for at_end in (False, True):
        c = int(rng.choice([2, 4, 8]))
        cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.82, 0.86), loader_processes=c + 1, cores=c,
                          quiet_start=0.12, at_end=at_end),
                      f"CPU-bound workers, idle over the {'last' if at_end else 'first'} 12% of the run"))
        c = int(rng.choice([2, 4, 8]))
        cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.3, 0.5), loader_processes=c + 1, cores=c,
                          disk_mb_s=300, util=60, burst=rng.uniform(0.15, 0.25), at_end=at_end),
                      f"readers waiting on the disk, busy only over the {'last' if at_end else 'first'} 15-25% of the run"))
    groups.append(("judges the whole run (means over the samples)",
                   "average run.loader_cores over all its samples: not its peak, first or last sample", cases))
    cases = [(synthetic_run(kind, rng, name=f"run {int(rng.integers(1000))}"), f"a typical {kind} run")
             for kind in RUN_KINDS for _ in range(3)]
    groups.append(("classifies typical runs", "", cases))
    return groups


def _snapshot_run(run):
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in vars(run).items()}


def _same_run(run, snap) -> bool:
    now = vars(run)
    if now.keys() != snap.keys():
        return False
    for k, v in snap.items():
        if isinstance(v, np.ndarray):
            if not isinstance(now[k], np.ndarray) or now[k].shape != v.shape or not np.array_equal(now[k], v):
                return False
        elif now[k] != v:
            return False
    return True


@exercise("1.4", "I/O-, CPU- or device-bound? Classify recorded runs", points=2)
def check_classify_run(classify_run):
    expect_callable(classify_run, "a function classify_run(run) -> 'io-bound' | 'cpu-bound' | 'device-bound'")
    from ..io_probe import RUN_KINDS

    rng, seed = fresh_rng()
    groups = _run_cases(rng)
    answers, failures = Counter(), []
    for prop, hint, cases in groups:
        wrong = []
        for run, what in cases:
            expected = _reference_run_kind(run)
            snap = _snapshot_run(run)
            answer = classify_run(run)
            if not isinstance(answer, str) or answer not in RUN_KINDS:
                raise CheckFailed("answers one of the three labels",
                                  f"yours returned {answer!r} for {what}; expected one of {', '.join(RUN_KINDS)}")
            if not _same_run(run, snap):
                raise CheckFailed("leaves the run unchanged", f"the run ({what}) was modified by your function",
                                  "read the figures; work on copies (np.mean does not change its input)")
            answers[answer] += 1
            if answer != expected:
                wrong.append(f"{what} -> yours '{answer}', expected '{expected}'")
        if wrong:
            failures.append((prop, hint, wrong))
    if len(answers) == 1:
        raise CheckFailed("tells the runs apart", f"yours always answers '{next(iter(answers))}'")
    if failures:
        prop, hint, wrong = failures[0]
        shown = "; ".join(wrong[:3]) + ("; ..." if len(wrong) > 3 else "")
        raise CheckFailed(prop, f"{shown} (seed {seed})", hint)
    total = sum(len(cases) for _, _, cases in groups)
    return f"{total} recorded runs classified correctly."
