"""Lesson 01's checks, proven by their mutants (each fails on its property on every seed)."""
import statistics
import time
from time import perf_counter

import numpy as np
import pytest

from course_utils.checks import run_check
from course_utils.timing import synchronize
from mutants import Mutant, passes, rejected


# -- 1.1 ------------------------------------------------------------------------------------
# Check 1.1 draws nothing at random: its scripted workloads are the same every run, so one seed
# proves each mutant (the check sleeps about half a second per run).

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


def sync_only_before_stopping(fn, device, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def sync_only_before_starting(fn, device, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def no_warmup(fn, device, warmup=3, repeats=10):
    return time_it(fn, device, warmup=0, repeats=repeats + warmup)


def times_the_warmup_too(fn, device, warmup=3, repeats=10):
    times = []
    for _ in range(warmup + repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _timed(fn, device, warmup, repeats):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def mean_not_median(fn, device, warmup=3, repeats=10):
    return statistics.mean(_timed(fn, device, warmup, repeats))


def min_not_median(fn, device, warmup=3, repeats=10):
    return min(_timed(fn, device, warmup, repeats))


def one_block(fn, device, warmup=3, repeats=10):       # the whole loop timed once: a mean
    for _ in range(warmup):
        fn()
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    synchronize(device)
    return (time.perf_counter() - t0) * 1e3 / repeats


def seconds(fn, device, warmup=3, repeats=10):
    return time_it(fn, device, warmup, repeats) / 1e3


def process_time(fn, device, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.process_time()
        fn()
        synchronize(device)
        times.append((time.process_time() - t0) * 1e3)
    return statistics.median(times)


def one_repeat_too_many(fn, device, warmup=3, repeats=10):
    return time_it(fn, device, warmup, repeats + 1)


def always_ten_repeats(fn, device, warmup=3, repeats=10):
    return time_it(fn, device, warmup, 10)


def times_the_last_warmup_call(fn, device, warmup=3, repeats=10):   # the timed loop starts one call early
    for _ in range(warmup - 1):
        fn()
    times = []
    for _ in range(repeats + 1):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def default_warmup_of_one(fn, device, warmup=1, repeats=10):
    return time_it(fn, device, warmup, repeats)


def default_of_five_repeats(fn, device, warmup=3, repeats=5):
    return time_it(fn, device, warmup, repeats)


def upper_median(fn, device, warmup=3, repeats=10):           # issue 35: the upper middle value
    times = _timed(fn, device, warmup, repeats)
    return sorted(times)[len(times) // 2]


def median_low(fn, device, warmup=3, repeats=10):
    return statistics.median_low(_timed(fn, device, warmup, repeats))


def median_high(fn, device, warmup=3, repeats=10):
    return statistics.median_high(_timed(fn, device, warmup, repeats))


def first_timed_call_as_warmup(fn, device, warmup=3, repeats=10):   # one more warm-up, dropped from the median
    times = _timed(fn, device, warmup, repeats)
    return statistics.median(times[1:] or times)


def half_the_timed_calls(fn, device, warmup=3, repeats=10):
    times = _timed(fn, device, warmup, repeats)
    return statistics.median(times[:max(repeats // 2, 1)])


def trimmed_mean(fn, device, warmup=3, repeats=10):            # crashes on repeats=1 (the check calls it so)
    return statistics.mean(sorted(_timed(fn, device, warmup, repeats))[1:-1])


def trimmed_mean_guarded(fn, device, warmup=3, repeats=10):
    times = sorted(_timed(fn, device, warmup, repeats))
    return statistics.mean(times[1:-1] or times)


def numpy_percentile_60(fn, device, warmup=3, repeats=10):
    return float(np.percentile(_timed(fn, device, warmup, repeats), 60))


_KEPT = []


def keeps_timings_between_calls(fn, device, warmup=3, repeats=10):   # w2-01: a module-level list, extended
    for _ in range(warmup):
        fn()
    _KEPT.extend(_timed(fn, device, 0, repeats))
    return statistics.median(_KEPT)


def max_not_median(fn, device, warmup=3, repeats=10):
    return max(_timed(fn, device, warmup, repeats))


# right answers a learner wrote (w2-01)
def synchronises_once_after_the_warmup(fn, device, warmup=3, repeats=10):
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


def percentile_50(fn, device, warmup=3, repeats=10):
    return float(np.percentile(_timed(fn, device, warmup, repeats), 50))


def wall_clock_time_time(fn, device, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.time()
        fn()
        synchronize(device)
        times.append((time.time() - t0) * 1e3)
    return statistics.median(times)


def wraps_benchmark(fn, device, warmup=3, repeats=10):
    from course_utils.timing import benchmark
    return benchmark(fn, device=device, warmup=warmup, repeats=repeats).median_ms


MUTANTS_11 = [
    Mutant("no synchronize", no_sync, "waits for the device before reading the clock"),
    Mutant("synchronize only before stopping", sync_only_before_stopping,
           "waits for earlier work before starting the clock"),
    Mutant("synchronize only before starting", sync_only_before_starting,
           "waits for the device before reading the clock"),
    Mutant("no warm-up", no_warmup, "excludes warm-up calls"),
    Mutant("times the warm-up too", times_the_warmup_too, "excludes warm-up calls"),
    Mutant("mean, not median", mean_not_median, "reports the median of the repeats"),
    Mutant("minimum, not median", min_not_median, "reports the median of the repeats"),
    Mutant("one block, divided", one_block, "reports the median of the repeats"),
    Mutant("seconds", seconds, "reports milliseconds"),
    Mutant("time.process_time", process_time, "measures the wall time of a CPU function"),
    Mutant("one repeat too many", one_repeat_too_many, "calls fn warmup + repeats times"),
    Mutant("always ten repeats", always_ten_repeats, "calls fn warmup + repeats times"),
    Mutant("wraps course_utils.timing.benchmark", wraps_benchmark, "is your own code"),
    Mutant("the first timed call is the last warm-up call", times_the_last_warmup_call, "excludes warm-up calls",
           words="include a warm-up call"),
    Mutant("default warmup=1", default_warmup_of_one, "defaults to warmup=3, repeats=10"),
    Mutant("default repeats=5", default_of_five_repeats, "defaults to warmup=3, repeats=10"),
    # issue 35: the median's neighbours, each named in its hint
    Mutant("the upper median, sorted(times)[n // 2]", upper_median, "reports the median of the repeats",
           words="the upper of the two middle values"),
    Mutant("statistics.median_low", median_low, "reports the median of the repeats",
           words="the lower of the two middle values"),
    Mutant("statistics.median_high", median_high, "reports the median of the repeats",
           words="the upper of the two middle values"),
    Mutant("the first timed call dropped", first_timed_call_as_warmup, "reports the median of the repeats",
           words="the median of the timed calls after the first"),
    Mutant("half the timed calls", half_the_timed_calls, "reports the median of the repeats",
           words="the median of the first half"),
    Mutant("a trimmed mean, guarded", trimmed_mean_guarded, "reports the median of the repeats", words="a trimmed mean"),
    Mutant("the 60th percentile", numpy_percentile_60, "reports the median of the repeats"),
    Mutant("one block, divided, names the mean", one_block, "reports the median of the repeats", words="the mean"),
    # w2-01: state kept between calls; the slowest call named, with no leftover aside about a mean
    Mutant("timings kept between calls", keeps_timings_between_calls, "keeps nothing from an earlier call",
           words="the earlier call's timings"),
    Mutant("the slowest call", max_not_median, "reports the median of the repeats", words="yours matches the slowest call"),
    # an answer that crashes on repeats=1: the [ERROR] names the learner's line and the call
    Mutant("a trimmed mean, crashing on repeats=1", trimmed_mean, "StatisticsError", status="error",
           words="repeats=1"),
]


# w3-01: wrong answers that passed (real sleeps hid them) and messages that named another slip
def every_other_call(fn, device, warmup=3, repeats=10):
    return statistics.median(_timed(fn, device, warmup, repeats)[::2])


def odd_positions(fn, device, warmup=3, repeats=10):
    times = _timed(fn, device, warmup, repeats)
    return statistics.median(times[1::2] or times)


def last_timed_call_dropped(fn, device, warmup=3, repeats=10):
    times = _timed(fn, device, warmup, repeats)
    return statistics.median(times[:-1] or times)


def second_half(fn, device, warmup=3, repeats=10):
    times = _timed(fn, device, warmup, repeats)
    return statistics.median(times[len(times) // 2:])


def whole_ms(fn, device, warmup=3, repeats=10):
    return round(time_it(fn, device, warmup, repeats))


def even_ms(fn, device, warmup=3, repeats=10):
    return round(time_it(fn, device, warmup, repeats), 0) // 2 * 2


def float32_median(fn, device, warmup=3, repeats=10):            # right (w3-01)
    return float(np.median(np.array(_timed(fn, device, warmup, repeats), dtype=np.float32)))


def perf_counter_bound_at_import(fn, device, warmup=3, repeats=10):   # right: `from time import perf_counter`
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = perf_counter()
        fn()
        synchronize(device)
        times.append((perf_counter() - t0) * 1e3)
    return statistics.median(times)


def perf_counter_ns_timer(fn, device, warmup=3, repeats=10):     # right: integer nanoseconds
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter_ns()
        fn()
        synchronize(device)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(times)


def timeit_repeat(fn, device, warmup=3, repeats=10):           # right (w4-01): timeit's own default timer
    import timeit
    for _ in range(warmup):
        fn()
    synchronize(device)
    t = timeit.repeat(lambda: (fn(), synchronize(device)), number=1, repeat=repeats)
    return statistics.median(t) * 1e3


def timeit_timer_default(fn, device, warmup=3, repeats=10):      # right: timeit.Timer() with no timer=
    import timeit
    for _ in range(warmup):
        fn()
    synchronize(device)
    return statistics.median(timeit.Timer(lambda: (fn(), synchronize(device))).repeat(repeats, 1)) * 1e3


def extra_sync_each_warmup(fn, device, warmup=3, repeats=10):    # right (w4-01): a harmless sync per warm-up
    for _ in range(warmup):
        fn()
        synchronize(device)
    return time_it(fn, device, 0, repeats)


def clock_before_presync(fn, device, warmup=3, repeats=10):      # w4-01: the clock starts, then the sync
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        synchronize(device)
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


MUTANTS_11 += [
    Mutant("the clock started before the sync (w4-01)", clock_before_presync,
           "waits for earlier work before starting the clock", words="must come before the clock starts"),
    Mutant("one clock around the loop names it (w4-01)", one_block, "reports the median of the repeats",
           words="one clock around the whole loop"),
    Mutant("every other timed call (w3-01)", every_other_call, "reports the median of the repeats",
           words="every other timed call (times[::2])"),
    Mutant("the timed calls at odd positions (w3-01)", odd_positions, "reports the median of the repeats",
           words="odd positions (times[1::2])"),
    Mutant("the last timed call dropped (w3-01)", last_timed_call_dropped, "reports the median of the repeats",
           words="the timed calls but the last (times[:-1])"),
    Mutant("the second half of the timed calls (w3-01)", second_half, "reports the median of the repeats",
           words="the second half of the timed calls"),
    Mutant("rounded to whole ms (w3-01)", whole_ms, "reports the median of the repeats",
           words="always a whole number of milliseconds"),
    Mutant("rounded to an even ms (w3-01)", even_ms, "reports the median of the repeats",
           words="always a whole number of milliseconds"),
]


def test_the_timer_cases_tell_every_neighbour_apart():
    from course_utils.checks.lesson01 import _NEIGHBOURS, _STATISTIC_CASES, _close
    rows = [[f(timed) for timed, _ in _STATISTIC_CASES] for _, f, _ in _NEIGHBOURS]
    medians = [statistics.median(timed) for timed, _ in _STATISTIC_CASES]
    for (what, _, _), row in zip(_NEIGHBOURS, rows):
        assert any(not _close(v, m) for v, m in zip(row, medians)), what
        assert any(not _close(round(v), v) or not float(v).is_integer() for v in row)
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            assert any(not _close(a, b) for a, b in zip(rows[i], rows[j])), (_NEIGHBOURS[i][0], _NEIGHBOURS[j][0])


def test_the_timer_check_ignores_the_machines_load():
    """w3-01: under load, real sleeps overshot and failed right answers; the check's clock makes
    each scripted call take exactly its time: a busy process beside it changes nothing."""
    import multiprocessing
    stop = multiprocessing.Event()
    busy = multiprocessing.Process(target=_spin, args=(stop,), daemon=True)
    busy.start()
    try:
        for k in range(30):
            result = run_check("1.1", float32_median if k % 10 == 9 else time_it)
            assert result.status == "pass", result.message
        result = run_check("1.1", every_other_call)
        assert "every other timed call" in result.message, result.message
    finally:
        stop.set()
        busy.join(5)


def _spin(stop):
    while not stop.is_set():
        pass


def test_the_timer_check_restores_the_clocks():
    before = (time.perf_counter, time.time, time.monotonic, time.process_time, time.perf_counter_ns)
    run_check("1.1", time_it)
    run_check("1.1", trimmed_mean)          # one that raises
    assert (time.perf_counter, time.time, time.monotonic, time.process_time, time.perf_counter_ns) == before
    assert perf_counter is before[0]
    import timeit
    defaults = (timeit.timeit.__defaults__, timeit.repeat.__defaults__, timeit.Timer.__init__.__defaults__)
    run_check("1.1", timeit_repeat)
    assert (timeit.timeit.__defaults__, timeit.repeat.__defaults__, timeit.Timer.__init__.__defaults__) == defaults
    assert timeit.Timer.__init__.__defaults__[2] is time.perf_counter


def test_timer_passes():
    passes("1.1", time_it, range(1))


@pytest.mark.parametrize("answer", [synchronises_once_after_the_warmup, percentile_50, wall_clock_time_time,
                                    float32_median, perf_counter_bound_at_import, perf_counter_ns_timer,
                                    timeit_repeat, timeit_timer_default, extra_sync_each_warmup],
                         ids=lambda f: f.__name__)
def test_other_right_timers_pass(answer):
    passes("1.1", answer, range(1))


def test_no_leftover_aside_in_the_median_messages():
    for answer in (max_not_median, min_not_median):
        message = run_check("1.1", answer).message
        assert "would say" not in message, message


def test_kept_timings_fail_again_when_the_check_runs_twice():
    for _ in range(2):
        result = run_check("1.1", keeps_timings_between_calls)
        assert result.status == "fail" and "keeps nothing from an earlier call" in result.message, result.message


@pytest.mark.parametrize("mutant", MUTANTS_11, ids=repr)
def test_timer_mutants_rejected(mutant):
    rejected("1.1", mutant, range(1))


def test_a_crash_names_the_learners_line_not_statistics_py():
    result = run_check("1.1", trimmed_mean)
    assert "statistics.py" not in result.message, result.message
    assert "test_checks_lesson01.py" in result.message and "statistics.mean(sorted(" in result.message, result.message
    assert "the check was calling time_it(fn, device, warmup=5, repeats=1)" in result.message, result.message


# -- 1.2 ------------------------------------------------------------------------------------

def stall(log, skip_first=1):
    steps = log[skip_first:]
    if not steps:
        raise ValueError("no steps")
    return sum(s["fetch_end"] - s["fetch_start"] for s in steps) / (steps[-1]["step_end"] - steps[0]["fetch_start"])


def no_skip(log, skip_first=1):
    return stall(log, 0)


def skips_one_more(log, skip_first=1):
    if not log[skip_first + 1:]:
        raise ValueError("no steps")
    return stall(log, skip_first + 1)


def always_skips_one(log, skip_first=1):
    return stall(log, 1)


def ignores_gaps(log, skip_first=1):                 # wait / (wait + compute): gaps left out
    steps = log[skip_first:]
    if not steps:
        raise ValueError
    wait = sum(s["fetch_end"] - s["fetch_start"] for s in steps)
    return wait / sum(s["step_end"] - s["fetch_start"] for s in steps)


def wall_from_first_fetch_end(log, skip_first=1):
    steps = log[skip_first:]
    if not steps:
        raise ValueError
    wait = sum(s["fetch_end"] - s["fetch_start"] for s in steps)
    return wait / (steps[-1]["step_end"] - steps[0]["fetch_end"])


def wall_to_last_fetch_end(log, skip_first=1):
    steps = log[skip_first:]
    if not steps:
        raise ValueError
    wait = sum(s["fetch_end"] - s["fetch_start"] for s in steps)
    return wait / (steps[-1]["fetch_end"] - steps[0]["fetch_start"])


def percent(log, skip_first=1):
    return 100 * stall(log, skip_first)


def median_ratio(log, skip_first=1):                 # median wait over median step: a slightly off statistic
    steps = log[skip_first:]
    if not steps:
        raise ValueError
    return statistics.median(s["fetch_end"] - s["fetch_start"] for s in steps) / \
        statistics.median(s["step_end"] - s["fetch_start"] for s in steps)


def empty_zero(log, skip_first=1):
    return stall(log, skip_first) if log[skip_first:] else 0.0


def empty_index_error(log, skip_first=1):
    steps = log[skip_first:]
    wall = steps[-1]["step_end"] - steps[0]["fetch_start"]
    return sum(s["fetch_end"] - s["fetch_start"] for s in steps) / wall


def deletes_warmup_in_place(log, skip_first=1):
    del log[:skip_first]
    return stall(log, 0)


def default_skip_of_zero(log, skip_first=0):
    return stall(log, skip_first)


def needs_two_steps(log, skip_first=1):             # "a fraction needs at least two steps"
    if len(log[skip_first:]) < 2:
        raise ValueError("too few steps")
    return stall(log, skip_first)


def equal_lengths_only(log, skip_first=1):          # raises only when exactly as many are skipped as logged
    if skip_first == len(log):
        raise ValueError("no steps")
    steps = log[skip_first:]
    return sum(s["fetch_end"] - s["fetch_start"] for s in steps) / (steps[-1]["step_end"] - steps[0]["fetch_start"])


def wall_over_every_entry(log, skip_first=1):       # the waits counted, the wall time of the whole log
    steps = log[skip_first:]
    if not steps:
        raise ValueError
    return sum(s["fetch_end"] - s["fetch_start"] for s in steps) / (log[-1]["step_end"] - log[0]["fetch_start"])


def wraps_step_stats(log, skip_first=1):
    from course_utils.timing import _wall_and_wait
    steps = log[skip_first:]
    if not steps:
        raise ValueError("no steps")
    wall, wait = _wall_and_wait(steps)
    return wait / wall


def float32_timestamps(log, skip_first=1):          # w2-01: torch.tensor(...) makes float32
    import torch
    steps = log[skip_first:]
    if not steps:
        raise ValueError("no steps")
    t = torch.tensor([[s["fetch_start"], s["fetch_end"], s["step_end"]] for s in steps])
    return float((t[:, 1] - t[:, 0]).sum() / (t[-1, 2] - t[0, 0]))


def float32_numpy(log, skip_first=1):
    steps = log[skip_first:]
    if not steps:
        raise ValueError("no steps")
    f = np.float32
    wait = sum(f(s["fetch_end"]) - f(s["fetch_start"]) for s in steps)
    return float(wait / (f(steps[-1]["step_end"]) - f(steps[0]["fetch_start"])))


_CACHE = {}


def cached_first_answer(log, skip_first=1):         # w3-01: the first call's result returned on every later call
    if "r" not in _CACHE:
        _CACHE["r"] = stall(log, skip_first)
    return _CACHE["r"]


_MEMO = {}


def memo_by_length(log, skip_first=1):               # w4-01: a cache keyed by the log's length
    key = (len(log), skip_first)
    if key not in _MEMO:
        _MEMO[key] = stall(log, skip_first)
    return _MEMO[key]


def per_step(statistic):
    def stall_fraction(log, skip_first=1):
        steps = log[skip_first:]
        if not steps:
            raise ValueError("no steps")
        return statistic([(s["fetch_end"] - s["fetch_start"]) / (s["step_end"] - s["fetch_start"]) for s in steps])
    return stall_fraction


def drops_last_step(log, skip_first=1):
    steps = log[skip_first:]
    if not steps:
        raise ValueError("no steps")
    steps = steps[:-1] or steps
    return sum(s["fetch_end"] - s["fetch_start"] for s in steps) / (steps[-1]["step_end"] - steps[0]["fetch_start"])


def rounded_3(log, skip_first=1):
    return round(stall(log, skip_first), 3)


def outliers_dropped(log, skip_first=1):
    steps = log[skip_first:]
    if not steps:
        raise ValueError("no steps")
    waits = [s["fetch_end"] - s["fetch_start"] for s in steps]
    med = statistics.median(waits)
    return sum(w for w in waits if w <= 3 * med + 1e-9) / (steps[-1]["step_end"] - steps[0]["fetch_start"])


def sorts_in_place(log, skip_first=1):              # right (w4-01): a no-op on an ordered log
    log.sort(key=lambda s: s["fetch_start"])
    return stall(log, skip_first)


def wall_max_min(log, skip_first=1):                # right (w4-01)
    steps = log[skip_first:]
    if not steps:
        raise ValueError("no steps")
    wall = max(s["step_end"] for s in steps) - min(s["fetch_start"] for s in steps)
    return min(sum(s["fetch_end"] - s["fetch_start"] for s in steps) / wall, 1.0)


MUTANTS_12 = [
    Mutant("a cache keyed by the log's length (w4-01)", memo_by_length, "keeps nothing from an earlier call",
           words="the value yours returned for"),
    Mutant("the mean of per-step fractions (w4-01)", per_step(statistics.mean), "matches the definition",
           words="the mean of each step's own fraction"),
    Mutant("the median of per-step fractions (w4-01)", per_step(statistics.median), "matches the definition",
           words="the median of each step's own fraction"),
    Mutant("the last step dropped (w4-01)", drops_last_step, "matches the definition", words="leaves out the last step"),
    Mutant("rounded to 3 places (w4-01)", rounded_3, "matches the definition", words="rounded"),
    Mutant("outliers dropped (w4-01)", outliers_dropped, "matches the definition", words="leaves out the longest waits"),
    Mutant("warm-up not skipped", no_skip, "matches the definition", words="warm-up"),
    Mutant("skips one more", skips_one_more, "matches the definition", words="one more than skip_first"),
    Mutant("float32 timestamps, torch.tensor", float32_timestamps, "matches the definition", words="float32"),
    Mutant("float32 arithmetic, numpy", float32_numpy, "matches the definition", words="float32"),
    Mutant("always skips one", always_skips_one, "matches the definition"),
    Mutant("gaps left out", ignores_gaps, "matches the definition"),
    Mutant("wall from the first fetch_end", wall_from_first_fetch_end, "matches the definition"),
    Mutant("wall to the last fetch_end", wall_to_last_fetch_end, "matches the definition"),
    Mutant("a percentage", percent, "matches the definition", words="percentage"),
    Mutant("median wait / median step", median_ratio, "matches the definition"),
    Mutant("0 when empty", empty_zero, "raises ValueError when no step is left"),
    Mutant("IndexError when empty", empty_index_error, "raises ValueError when no step is left"),
    Mutant("deletes the warm-up in place", deletes_warmup_in_place, "leaves the log unchanged"),
    Mutant("wraps the course's StepTimer arithmetic", wraps_step_stats, "is your own code"),
    Mutant("default skip_first=0", default_skip_of_zero, "defaults to skip_first=1"),
    Mutant("needs two steps", needs_two_steps, "too few steps", status="error", words="skip_first=4"),
    Mutant("raises only when skip_first == len(log)", equal_lengths_only, "raises ValueError when no step is left",
           words="skip_first=5"),
    Mutant("the wall time of every entry", wall_over_every_entry, "matches the definition"),
    Mutant("the first answer cached (w3-01)", cached_first_answer, "keeps nothing from an earlier call",
           words="the value yours returned for"),
]


def test_stall_fraction_passes():
    passes("1.2", stall, range(30))


@pytest.mark.parametrize("answer", [sorts_in_place, wall_max_min], ids=lambda f: f.__name__)
def test_other_right_stall_fractions_pass(answer):
    passes("1.2", answer, range(3))


def test_a_float32_answer_shows_two_different_numbers(monkeypatch):
    """w2-01: 'yours 0.475046, expected 0.475046' for a float32 answer: the numbers must differ as printed."""
    import re
    for seed in range(1, 4):
        monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
        message = run_check("1.2", float32_timestamps).message
        yours, expected = re.search(r"yours ([0-9.]+), expected ([0-9.]+)", message).groups()
        assert yours != expected, message


@pytest.mark.parametrize("mutant", MUTANTS_12, ids=repr)
def test_stall_fraction_mutants_rejected(mutant):
    rejected("1.2", mutant, range(30))


# -- 1.3 ------------------------------------------------------------------------------------
# The rules: compute-bound from a mean device utilisation of 85%; else input-bound from 0.8 x cores
# of the course's own cores (timeline.ours_cores) on average; else sync-bound.

def diagnose(tl):
    if np.mean(tl.gpu_util) >= 85:
        return "compute-bound"
    return "input-bound" if np.mean(tl.ours_cores) >= 0.8 * tl.cores else "sync-bound"


def diagnose_in_percent(tl):                         # the same rule written another way: passes
    if np.mean(tl.gpu_util / 100) >= 0.85:
        return "compute-bound"
    return "input-bound" if np.mean(tl.ours_cores / tl.cores * 100) >= 80 else "sync-bound"


def rule(device=lambda g: np.mean(g) >= 85, cpu=lambda tl: np.mean(tl.ours_cores) >= 0.8 * tl.cores):
    def diagnose_(tl):
        if device(np.asarray(tl.gpu_util)):
            return "compute-bound"
        return "input-bound" if cpu(tl) else "sync-bound"
    return diagnose_


def always_input_bound(tl):
    return "input-bound"


def answers_in_words(tl):
    return "slow"


def reads_the_label(tl):                            # the examples' device text names their kind
    for kind in ("input-bound", "compute-bound", "sync-bound"):
        if kind in tl.device:
            return kind
    return "sync-bound"


def swaps_input_and_sync(tl):
    if np.mean(tl.gpu_util) >= 85:
        return "compute-bound"
    return "sync-bound" if np.mean(tl.ours_cores) >= 0.8 * tl.cores else "input-bound"


def ignores_the_cpu(tl):
    return "compute-bound" if np.mean(tl.gpu_util) >= 85 else "input-bound"


def sorts_in_place(tl):
    tl.ours_cores.sort()
    return diagnose(tl)


def middle_half(x):
    return np.mean(x[len(x) // 4: len(x) - len(x) // 4])


def trimmed(x, share=0.1):
    k = int(len(x) * share)
    return np.mean(np.sort(x)[k: len(x) - k])


def both(part):
    """The rule with gpu_util and ours_cores both read through `part` (a slice of the samples)."""
    return rule(device=lambda g: np.mean(part(g)) >= 85, cpu=lambda tl: np.mean(part(tl.ours_cores)) >= 0.8 * tl.cores)


def rules_swapped(tl):
    if np.mean(tl.ours_cores) >= 0.8 * tl.cores:
        return "input-bound"
    return "compute-bound" if np.mean(tl.gpu_util) >= 85 else "sync-bound"


def diagnose_float32(tl):                            # right (w2-01): float32 means
    g, o = np.asarray(tl.gpu_util, np.float32), np.asarray(tl.ours_cores, np.float32)
    if np.mean(g, dtype=np.float32) >= 85:
        return "compute-bound"
    return "input-bound" if np.mean(o, dtype=np.float32) >= 0.8 * tl.cores else "sync-bound"


def _machine_cores():
    import os
    return os.cpu_count()


MACHINE = dict(cpu=lambda tl: np.mean(tl.cpu_percent) >= 80)          # the old rule: every process's CPU
MUTANTS_13 = [
    Mutant("always input-bound", always_input_bound, "tells the situations apart"),
    Mutant("a label of its own", answers_in_words, "answers one of the three labels"),
    Mutant("reads the example's label", reads_the_label, "tells the situations apart"),
    Mutant("ignores the CPU", ignores_the_cpu, "diagnoses each situation"),
    Mutant("input and sync swapped", swaps_input_and_sync, "diagnoses each situation"),
    Mutant("sorts ours_cores in place", sorts_in_place, "leaves the timeline unchanged"),
    Mutant("the busiest core", rule(cpu=lambda tl: np.mean(tl.cpu_percent, axis=0).max() >= 80), "diagnoses each situation"),
    Mutant("the peak device utilisation", rule(device=lambda g: g.max() >= 85),
           "judges the whole run (means over every sample)", words="the peak (the largest sample)"),     # w5-01: named
    Mutant("device threshold 45%", rule(device=lambda g: np.mean(g) >= 45), "uses the thresholds as specified"),
    Mutant("the last sample", rule(device=lambda g: g[-1] >= 85, cpu=lambda tl: tl.ours_cores[-1] >= 0.8 * tl.cores),
           "judges the whole run (means over every sample)", words="the last sample"),
    # issue 35: every process's CPU, on a 2-core machine whose other core another program holds
    Mutant("every process's CPU, mean >= 80%", rule(**MACHINE), "reads the course's own cores, not the whole machine's"),
    Mutant("every process's CPU, mean >= 60%", rule(cpu=lambda tl: np.mean(tl.cpu_percent) >= 60),
           "reads the course's own cores, not the whole machine's"),
    Mutant("every process's CPU, mean >= 55%", rule(cpu=lambda tl: np.mean(tl.cpu_percent) >= 55),
           "reads the course's own cores, not the whole machine's"),
    Mutant("the peak of the machine-wide mean", rule(cpu=lambda tl: np.mean(tl.cpu_percent, axis=1).max() >= 80),
           "reads the course's own cores, not the whole machine's"),
    Mutant("the course's and the others' cores", rule(cpu=lambda tl: np.mean(tl.ours_cores + tl.others_cores) >= 0.8 * tl.cores),
           "reads the course's own cores, not the whole machine's"),
    # the thresholds: each side of the edge, and on it
    Mutant("the course's cores, >= 60%", rule(cpu=lambda tl: np.mean(tl.ours_cores) >= 0.6 * tl.cores),
           "uses the thresholds as specified"),
    Mutant("the course's cores, >= 75%", rule(cpu=lambda tl: np.mean(tl.ours_cores) >= 0.75 * tl.cores),
           "uses the thresholds as specified"),
    Mutant("the course's cores, > 80%", rule(cpu=lambda tl: np.mean(tl.ours_cores) > 0.8 * tl.cores),
           "uses the thresholds as specified"),
    Mutant("the course's cores, >= 81%", rule(cpu=lambda tl: np.mean(tl.ours_cores) >= 0.81 * tl.cores),
           "uses the thresholds as specified"),
    Mutant("the course's share rounded to 2 places", rule(cpu=lambda tl: round(np.mean(tl.ours_cores) / tl.cores, 2) >= 0.8),
           "uses the thresholds as specified"),
    Mutant("device > 85%", rule(device=lambda g: np.mean(g) > 85), "uses the thresholds as specified"),
    Mutant("device >= 84%", rule(device=lambda g: np.mean(g) >= 84), "uses the thresholds as specified"),
    Mutant("device >= 86%", rule(device=lambda g: np.mean(g) >= 86), "uses the thresholds as specified"),
    Mutant("device mean rounded", rule(device=lambda g: round(np.mean(g)) >= 85), "uses the thresholds as specified"),
    # the whole run: the mean's neighbours, and runs whose start and end differ from their middle
    Mutant("the course's peak", rule(cpu=lambda tl: tl.ours_cores.max() >= 0.8 * tl.cores),
           "judges the whole run (means over every sample)"),
    Mutant("the course's median", rule(cpu=lambda tl: np.median(tl.ours_cores) >= 0.8 * tl.cores),
           "judges the whole run (means over every sample)"),
    Mutant("the course over the middle half", rule(cpu=lambda tl: middle_half(tl.ours_cores) >= 0.8 * tl.cores),
           "judges the whole run (means over every sample)"),
    Mutant("the course's 10% trimmed mean", rule(cpu=lambda tl: trimmed(tl.ours_cores) >= 0.8 * tl.cores),
           "judges the whole run (means over every sample)"),
    Mutant("the device's median", rule(device=lambda g: np.median(g) >= 85), "judges the whole run (means over every sample)"),
    Mutant("the device over the middle half", rule(device=lambda g: middle_half(g) >= 85),
           "judges the whole run (means over every sample)"),
    Mutant("the device's 10% trimmed mean", rule(device=lambda g: trimmed(g) >= 85),
           "judges the whole run (means over every sample)"),
]
# w2-01: parts of the run passed on every seed; each is named from the answers (the decisive runs are in
# every seed's draw: fewer seeds prove them)
MUTANTS_13_W2 = [
    Mutant("the last sample left out", both(lambda x: x[:-1]), "judges the whole run (means over every sample)",
           words="gpu_util[:-1] (or [:-2], ...: the last samples left out) and ours_cores[:-1]"),
    Mutant("the device's last sample left out", rule(device=lambda g: np.mean(g[:-1]) >= 85),
           "judges the whole run (means over every sample)", words="as if it averaged gpu_util[:-1]"),
    Mutant("the course's last sample left out", rule(cpu=lambda tl: np.mean(tl.ours_cores[:-1]) >= 0.8 * tl.cores),
           "judges the whole run (means over every sample)", words="as if it averaged ours_cores[:-1]"),
    Mutant("the last two samples left out", both(lambda x: x[:-2]), "judges the whole run (means over every sample)",
           words="the last samples left out"),
    Mutant("the last five samples left out", both(lambda x: x[:-5]), "judges the whole run (means over every sample)",
           words="the last samples left out"),
    Mutant("the first and the last sample left out", both(lambda x: x[1:-1]),
           "judges the whole run (means over every sample)", words="[1:-1]"),
    Mutant("the first sample left out", both(lambda x: x[1:]), "judges the whole run (means over every sample)",
           words="gpu_util[1:]"),
    Mutant("every other sample", both(lambda x: x[::2]), "judges the whole run (means over every sample)",
           words="[::2] (every other sample)"),
    Mutant("every other sample, from the second", both(lambda x: x[1::2]),
           "judges the whole run (means over every sample)", words="[1::2] (every other sample)"),
    Mutant("the course's cores against 0.8, not scaled", rule(cpu=lambda tl: np.mean(tl.ours_cores) >= 0.8),
           "diagnoses each situation", words="compared the course's cores with 0.8:"),
    Mutant("0.8 x (cores - 1)", rule(cpu=lambda tl: np.mean(tl.ours_cores) >= 0.8 * (tl.cores - 1)),
           "diagnoses each situation", words="0.8 x (timeline.cores - 1)"),
    Mutant("os.cpu_count(), not timeline.cores", rule(cpu=lambda tl: np.mean(tl.ours_cores) >= 0.8 * _machine_cores()),
           "diagnoses each situation", words="os.cpu_count()"),
    Mutant("the rules swapped", rules_swapped, "diagnoses each situation", words="apply the rules in order"),
]


def test_a_threshold_cut_to_whole_cores_is_named_on_every_seed(monkeypatch):
    """w3-01: int(0.8 * cores) was told to read the course's own cores (which it did); whichever
    group fails first on a seed, the hint names the cut threshold."""
    answer = rule(cpu=lambda tl: np.mean(tl.ours_cores) >= int(0.8 * tl.cores))
    for seed in range(10):
        monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
        result = run_check("1.3", answer)
        assert result.status == "fail" and "cut to whole cores (int(0.8 x timeline.cores)" in result.message, result.message
        assert "property 'uses the thresholds as specified'" in result.message, result.message   # w4-01


def test_cores_kept_from_the_first_timeline_are_named(monkeypatch):
    """w4-01: the first timeline's cores kept in a global was told it read os.cpu_count() (both were 2)."""
    kept = []

    def cores_cached(tl):
        if not kept:
            kept.append(tl.cores)
        if np.mean(tl.gpu_util) >= 85:
            return "compute-bound"
        return "input-bound" if np.mean(tl.ours_cores) >= 0.8 * kept[0] else "sync-bound"
    for seed in range(3):                 # the first call of the run, and calls in later runs of the check
        monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
        result = run_check("1.3", cores_cached)
        assert "property 'keeps nothing from an earlier call'" in result.message, result.message
        assert "as the first one the check handed it had" in result.message and "os.cpu_count" not in result.message


def diagnose_rebuilt_from_every_process(tl):       # right (w3-01): every process's CPU less the others'
    if np.mean(tl.gpu_util) >= 85:
        return "compute-bound"
    ours = np.mean(tl.cpu_percent.sum(axis=1)) / 100 - np.mean(tl.others_cores)
    return "input-bound" if ours >= 0.8 * tl.cores else "sync-bound"


def diagnose_rebuilt_per_sample(tl):
    if np.mean(tl.gpu_util) >= 85:
        return "compute-bound"
    ours = np.mean(tl.cpu_percent.sum(axis=1) / 100 - tl.others_cores)
    return "input-bound" if ours / tl.cores >= 0.8 else "sync-bound"


def test_the_course_rebuilt_from_every_process_passes_on_every_seed():
    passes("1.3", diagnose_rebuilt_from_every_process, range(30))
    passes("1.3", diagnose_rebuilt_per_sample, range(30))


def test_diagnosis_passes():
    passes("1.3", diagnose, range(30))
    passes("1.3", diagnose_in_percent, range(30))
    passes("1.3", diagnose_float32, range(30))


@pytest.mark.parametrize("mutant", MUTANTS_13, ids=repr)
def test_diagnosis_mutants_rejected(mutant):
    rejected("1.3", mutant, range(30))


@pytest.mark.parametrize("mutant", MUTANTS_13_W2, ids=repr)
def test_diagnosis_near_misses_of_the_second_walk_rejected(mutant):
    rejected("1.3", mutant, range(10))


def test_the_shared_machine_case_of_issue_35():
    """One busy thread on 2 cores while another program holds the second core: every process's CPU
    reads 100%, the course's own cores one; the rule must read the course's."""
    from course_utils.checks.lesson01 import _reference_diagnosis, _timeline
    rng = np.random.default_rng(0)
    tl = _timeline(np.full(50, 40.0), np.full(50, 1.0), 2, rng, others=1.0)
    assert np.mean(tl.cpu_percent) > 95 and _reference_diagnosis(tl) == "sync-bound"


def test_stubs_are_not_implemented():
    def stub(*args, **kwargs):
        raise NotImplementedError
    for ex in ("1.1", "1.2", "1.3"):
        assert run_check(ex, stub).status == "not_implemented"


def test_pure_function_checks_give_up_in_seconds():
    """An endless loop in a pure function cost 316 s before its cell failed (issue 21): the checks
    whose references take well under a second keep the grader's fitted limit (`TIME_LIMITS_S`), at
    most 30 s, and at least 20 times what the course's own answer took there."""
    from course_utils.checks._core import _lookup, TIME_LIMITS_S
    for ex in ("0.1", "1.1", "1.2", "1.3", "1.4", "2.1", "5.3"):
        limit, reference_s = TIME_LIMITS_S[ex]
        assert _lookup(ex).time_limit_s == limit, ex
        assert limit <= 30 and limit >= 10 * reference_s, (ex, limit, reference_s)
