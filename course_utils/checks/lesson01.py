"""Checks for lesson 01 (measure the baseline)."""
from __future__ import annotations

import copy
import os
import statistics
import time
from collections import Counter
from contextlib import contextmanager

import numpy as np
import torch

from ..monitor import TIMELINE_KINDS, Timeline, synthetic_timeline
from ..sim import SimulatedAccelerator
from ._core import CheckFailed, calling, exercise, expect_callable, trusted
from ._util import forbids, fresh_rng


# -- 1.1 a correct timer ---------------------------------------------------------------------

class _VirtualClock:
    """The clocks a timer may read, replaced while the learner's time_it runs by one that only the
    check's scripted functions move, by exactly their cost (w3-01: real sleeps on a loaded machine
    overshot by tens of ms and failed right answers, and no seed could reproduce it). Wall clocks:
    time.perf_counter, monotonic, time (and their _ns forms), timeit.default_timer; CPU clocks:
    time.process_time, thread_time. A name bound to one of them in time_it's module (from time
    import perf_counter) is replaced too. Every wall reading moves it by 0.1 microseconds.
    datetime.datetime.now/today/utcnow read it too (w6-01: a datetime.now() timer, a wall clock of
    microseconds, is a right answer: its readings carry the check's clock to the microsecond)."""

    _WALL, _CPU = ("perf_counter", "monotonic", "time"), ("process_time", "thread_time")

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        self._epoch = time.time() - self.wall

    def advance(self, wall_ms: float, cpu_ms: float = 0.0) -> None:
        self.wall += wall_ms / 1e3
        self.cpu += cpu_ms / 1e3

    def _fakes(self) -> dict:
        def tick():
            self.wall += 1e-7
            return self.wall
        fakes = {"perf_counter": tick, "monotonic": tick, "time": lambda: self._epoch + tick()}
        fakes.update({name: (lambda: self.cpu) for name in self._CPU})
        for name in self._WALL + self._CPU:
            fakes[name + "_ns"] = (lambda f=fakes[name]: int(round(f() * 1e9)))
        return fakes

    def _datetime(self, wall):
        import datetime as _dt

        class datetime(_dt.datetime):      # noqa: N801 - the name a learner's code prints
            @classmethod
            def now(cls, tz=None):
                return _dt.datetime.fromtimestamp(wall(), tz)

            @classmethod
            def today(cls):
                return _dt.datetime.fromtimestamp(wall())

            @classmethod
            def utcnow(cls):
                return _dt.datetime.fromtimestamp(wall(), _dt.timezone.utc).replace(tzinfo=None)
        return datetime

    @contextmanager
    def installed(self, time_it):
        import datetime as datetime_module
        import timeit
        fakes = self._fakes()
        originals = {name: getattr(time, name) for name in fakes}
        by_id = {id(f): fakes[name] for name, f in originals.items()}
        real_datetime = datetime_module.datetime
        fake_datetime = self._datetime(fakes["time"])
        by_id[id(real_datetime)] = fake_datetime
        g = getattr(time_it, "__globals__", None)
        bound = {k: v for k, v in g.items() if any(v is f for f in originals.values()) or v is real_datetime} \
            if isinstance(g, dict) else {}
        default_timer = timeit.default_timer
        # timeit.timeit, timeit.repeat and Timer() bound default_timer as a default argument at import
        # (w4-01: timeit.repeat(...) of a right answer read the real clock): their defaults too
        with_defaults = [f for f in (timeit.timeit, timeit.repeat, timeit.Timer.__init__)
                         if getattr(f, "__defaults__", None)]
        defaults = {f: f.__defaults__ for f in with_defaults}
        try:
            for name, f in fakes.items():
                setattr(time, name, f)
            timeit.default_timer = fakes["perf_counter"]
            datetime_module.datetime = fake_datetime
            for f in with_defaults:
                f.__defaults__ = tuple(by_id.get(id(d), d) if any(d is o for o in originals.values()) else d
                                       for d in f.__defaults__)
            for k, v in bound.items():
                g[k] = by_id[id(v)]
            yield self
        finally:
            for name, f in originals.items():
                setattr(time, name, f)
            timeit.default_timer = default_timer
            datetime_module.datetime = real_datetime
            for f, d in defaults.items():
                f.__defaults__ = d
            for k, v in bound.items():
                g[k] = v


class _Output:
    """What a scripted call returns (a training step returns its loss, a forward pass its
    activations): the check counts how many of them a timer still holds when fn is called."""


class _CountingFn:
    """A workload whose cost per call is scripted: host time (waiting, plus a little CPU work) and
    device time (asynchronous). With a clock, the host time only moves that clock (no real
    sleep): the check's verdict then never depends on the machine's load. Each call returns an
    _Output; `most_held` is the most earlier outputs still alive when a call began."""

    def __init__(self, host_ms, device=None, device_ms=0.0, cpu_ms=0.0, clock=None):
        import weakref
        self._host_ms, self._device, self._device_ms, self._cpu_ms = host_ms, device, device_ms, cpu_ms
        self._clock = clock
        self.calls = 0
        self._outputs = weakref.WeakSet()
        self.most_held = 0

    def __call__(self):
        ms = self._host_ms(self.calls) if callable(self._host_ms) else self._host_ms
        self.calls += 1
        self.most_held = max(self.most_held, len(self._outputs))
        if self._clock is not None:
            self._clock.advance(ms + self._cpu_ms, self._cpu_ms)
        else:
            if self._cpu_ms:                  # CPU time the process really spends (not a sleep)
                end = time.process_time() + self._cpu_ms / 1e3
                while time.process_time() < end:
                    pass
            if ms:
                time.sleep(ms / 1e3)
        if self._device is not None and self._device_ms:
            self._device.launch(self._device_ms)
        out = _Output()
        self._outputs.add(out)
        return out


def _time(time_it, fn, device, what, clock=None, **kwargs):
    """time_it(fn, device, **kwargs) in milliseconds (on the check's clock, when given); an
    exception says which call raised it."""
    args = ", ".join(f"{k}={v}" for k, v in kwargs.items())
    where = "cpu" if isinstance(device, torch.device) and device.type == "cpu" else "device"
    with calling(f"time_it(fn, {where}{', ' + args if args else ''}) ({what})"):
        if clock is None:
            return _as_ms(time_it(fn, device, **kwargs), f"time_it on {what}")
        with clock.installed(time_it):
            value = time_it(fn, device, **kwargs)
        return _as_ms(value, f"time_it on {what}")


# The statistics a timer might report instead of the median of its timed calls: (what it is, how
# it is computed, the advice), for hints that name the learner's own near miss.
_MIDDLE = "with an even number of calls the median is the mean of the two middle ones (statistics.median)"
_NEIGHBOURS = [     # in the order a tie is named in (the same value from two of them: the likelier slip)
    ("the mean", statistics.mean, "one slow call moves a mean (and one clock around the whole loop, divided by "
     "repeats, is that mean): time each call on its own, between its two synchronize(device) calls, and report "
     "the middle value"),
    ("the upper of the two middle values (sorted(times)[len(times) // 2])", lambda t: sorted(t)[len(t) // 2], _MIDDLE),
    ("the lower of the two middle values (statistics.median_low)", lambda t: sorted(t)[(len(t) - 1) // 2], _MIDDLE),
    ("a trimmed mean (the mean without the fastest and the slowest call)",
     lambda t: statistics.mean(sorted(t)[1:-1] or t), "one more slow call moves it; the median is the middle value"),
    ("the median of the timed calls after the first (times[1:])", lambda t: statistics.median(t[1:] or t),
     "the first timed call is not warm-up (the `warmup` calls before it are): every one of the `repeats` "
     "timed calls counts"),
    ("the median of the timed calls but the last (times[:-1])", lambda t: statistics.median(t[:-1] or t),
     "the last timed call counts like the others: every one of the `repeats` timed calls counts"),
    ("the median of the first half of the timed calls", lambda t: statistics.median(t[:max(len(t) // 2, 1)]),
     "every one of the `repeats` timed calls counts"),
    ("the median of the second half of the timed calls (times[len(times) // 2:])",
     lambda t: statistics.median(t[len(t) // 2:]), "every one of the `repeats` timed calls counts"),
    ("the median of every other timed call (times[::2])", lambda t: statistics.median(t[::2]),
     "every one of the `repeats` timed calls counts, not one in two"),
    ("the median of the timed calls at odd positions (times[1::2])", lambda t: statistics.median(t[1::2] or t),
     "every one of the `repeats` timed calls counts, not one in two"),
    ("the fastest call", min, "the minimum hides how long a call usually takes; the median is the middle value"),
    ("the slowest call", max, "one slow call decides it; the median is the middle value"),
]


def _close(yours: float, value: float) -> bool:
    """Equal to within what the check's clock (0.0001 ms a reading; time.time()'s float keeps 0.00024 ms)
    and a float32 median can account for: 0.002 ms and 1e-5 of the value. Tighter than a rounding to
    0.01 ms on the cases below (w5-01: a median rounded to 0.1 ms passed a tolerance of 0.03 ms)."""
    return abs(yours - value) <= 0.002 + 1e-5 * abs(value)


def _statistic_hint(results) -> str:
    """The hint for a timer that did not report the median of the check's scripted timed calls:
    the neighbour of the median it matches on every case (results: (timed calls, yours) pairs),
    or that it rounds, when it does."""
    for what, f, advice in _NEIGHBOURS:
        if all(_close(yours, f(timed)) for timed, yours in results) and \
                any(not _close(f(timed), statistics.median(timed)) for timed, _ in results):
            value = next(f(timed) for timed, yours in results if not _close(yours, statistics.median(timed)))
            return f"yours matches {what} on every one of the check's cases (about {value:.1f} ms here): {advice}"
    medians = [statistics.median(timed) for timed, _ in results]
    if all(float(yours).is_integer() for _, yours in results) and not all(float(m).is_integer() for m in medians):
        m = next(m for m in medians if not float(m).is_integer())
        return (f"yours is always a whole number of milliseconds, where the median is {m:g} ms here: report the "
                f"median as measured, not rounded (on a 4.4 ms step, a whole ms is a 9% error)")
    for digits, step in ((1, "0.1 ms"), (2, "0.01 ms")):       # w5-01: rounded to 0.1 ms
        if all(round(float(yours), digits) == float(yours) for _, yours in results) and \
                any(not _close(round(m, digits), m) for m in medians):
            m = next(m for m in medians if not _close(round(m, digits), m))
            return (f"yours is always rounded to {step}, where the median is {m:g} ms here: report the median as "
                    f"measured, not rounded (a 0.04 ms kernel rounded to {step} reads "
                    f"{round(0.04, digits):g} ms); round only where you print it")
    return "statistics.median(times), over all the `repeats` timed calls"


def _as_ms(value, what):
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, (int, float, np.floating, np.integer)) or isinstance(value, bool):
        raise CheckFailed("returns a number of milliseconds", f"{what} returned {type(value).__name__}: {value!r}")
    return float(value)


# Scripted timed calls (ms) on which the median and its neighbours disagree, each case aimed at one
# near miss (issues 35, 37): (timed calls' ms, what the case is), after one warm-up call as long as
# the first timed call. The check's clock makes the times exact: no value is a whole number of ms,
# and two medians (4.437, 9.236) lie 0.003 ms or more from a multiple of 0.01 ms (w5-01: a median
# rounded to 0.1 ms passed), so a median rounded to 1, 0.1 or 0.01 ms is seen; every neighbour of
# the median differs from it on some case and from every other neighbour on some case (tests/unit: test_the_timer_cases_tell_every_neighbour_apart).
_STATISTIC_CASES = [
    ([4.437, 4.437, 4.437, 150.0, 4.437, 4.437, 4.437], "6 timed calls of 4.437 ms and one of 150 ms"),  # one slow call
    ([9.236, 9.236, 1.2, 9.236, 9.236], "4 timed calls of 9.236 ms and one of 1.2 ms"),      # one fast call
    ([5.3, 60.3, 20.3], "3 timed calls of 5.3, 60.3 and 20.3 ms"),                           # the first or the last dropped
    ([60.3, 60.3, 5.3, 5.3, 5.3], "5 timed calls of 60.3, 60.3, 5.3, 5.3 and 5.3 ms"),       # only the first half
    ([5.3, 5.3, 45.3, 45.3], "4 timed calls of 5.3, 5.3, 45.3 and 45.3 ms"),                 # an even count: the middles
    ([5.3, 5.3, 5.3, 5.3, 60.3, 60.3], "6 timed calls of 5.3, 5.3, 5.3, 5.3, 60.3 and 60.3 ms"),   # a trimmed mean
    ([5.3, 60.3, 5.3, 60.3, 60.3], "5 timed calls of 5.3, 60.3, 5.3, 60.3 and 60.3 ms"),     # one call in two
]


@exercise("1.1", "A timer that tells the truth: warm-up, synchronise, median of repeats", points=2)
@forbids("course_utils.timing:benchmark")
def check_timer(time_it):
    expect_callable(time_it, "a function time_it(fn, device, warmup=3, repeats=10) -> milliseconds")
    cpu = torch.device("cpu")
    # Every scripted CPU function runs on the check's own clock (w3-01): its calls take exactly their
    # scripted time whatever the machine's load, so a verdict is the same on every run.
    clock = _VirtualClock()

    def timed(script, what, cpu_ms=0.0, **kwargs):
        fn = _CountingFn(script, cpu_ms=cpu_ms, clock=clock)
        return fn, _time(time_it, fn, cpu, what, clock=clock, **kwargs)

    # (0) nothing kept from an earlier call (w2-01: a module-level list of timings, extended by every
    # call): eleven 1 ms calls, then three 40 ms calls, whose median is 40 ms whatever came before. First,
    # so that no earlier call of this check (nor an earlier run of it) feeds a wrong median to the others;
    # a result under 0.5 ms (seconds, process_time) is left to the cases that name those
    timed(1.0, "a 1 ms function", warmup=1, repeats=11)
    _, ms = timed(40.0, "a 40 ms function, right after timing a 1 ms one", warmup=1, repeats=3)
    if 0.5 <= ms < 0.6 * 40:
        raise CheckFailed("keeps nothing from an earlier call",
                          f"time_it(fn, cpu, warmup=1, repeats=11) on a 1 ms function, then time_it(fn, cpu, warmup=1, "
                          f"repeats=3) on a 40 ms one: yours reported {ms:.1f} ms for the 40 ms function",
                          "each call of time_it starts a list of its own (times = [] inside the function): yours "
                          "reports a median that still holds the earlier call's timings")
    # (0') the same function timed twice, its step changed in between (w5-01: a result memoised per fn
    # reported the first timing again, calling fn 0 times): 2 ms a call, then 20 ms a call
    cost = [2.0]
    fn, first = timed(lambda i: cost[0], "a 2 ms function", warmup=1, repeats=3)
    cost[0], calls = 20.0, fn.calls
    ms = _time(time_it, fn, cpu, "the same function, now 20 ms a call", clock=clock, warmup=1, repeats=3)
    if fn.calls == calls or (0.5 <= ms < 0.6 * 20 and trusted.isclose(ms, first, rel_tol=1e-6)):
        raise CheckFailed("keeps nothing from an earlier call",
                          f"time_it(fn, cpu, warmup=1, repeats=3) on a function of 2 ms a call (yours {first:.1f} ms), "
                          f"then on the same fn, now 20 ms a call: yours reported {ms:.1f} ms and called fn "
                          f"{fn.calls - calls} times (expected 4)",
                          "time fn afresh on every call of time_it: a result kept per function (a dict keyed by fn) "
                          "reports the first timing again after the step changed, without calling fn")
    # (a) plain CPU work (mostly waiting, as a call that waits for I/O does): the wall time, in
    # milliseconds, and the right count of calls
    fn, cpu_ms = timed(5.0, "a 6 ms CPU function", cpu_ms=1.0, warmup=2, repeats=5)
    if 0.004 <= cpu_ms <= 0.025:
        raise CheckFailed("reports milliseconds", f"yours {cpu_ms:.4f} for a 6 ms function, expected about 6",
                          "time.perf_counter() counts seconds: multiply by 1000")
    if cpu_ms < 5.0:
        saw = ("1 ms, its CPU time only" if 0.5 <= cpu_ms < 2.0 else
               "almost nothing: yours read a clock that did not move while fn ran")
        raise CheckFailed("measures the wall time of a CPU function",
                          f"yours {cpu_ms:.3f} ms for a function that takes 6 ms (1 ms of CPU, 5 ms of waiting): "
                          f"the check's clock moved by 6 ms for each call, and yours saw {saw}",
                          "time the wall clock with time.perf_counter() (or timeit.default_timer): "
                          "time.process_time() counts only the CPU time of this process, not the time spent "
                          "waiting; the check scripts time.perf_counter, monotonic, time, timeit's timer and "
                          "datetime.datetime.now(), and no other clock")
    if fn.calls != 7:
        raise CheckFailed("calls fn warmup + repeats times", f"warmup=2, repeats=5: yours called fn {fn.calls} times, expected 7")
    if fn.most_held > 2:       # w6-01: every output kept in a list until time_it returned
        raise CheckFailed("keeps no output of fn",
                          f"warmup=2, repeats=5: when fn was called for the {fn.most_held + 1}th time, yours still "
                          f"held the {fn.most_held} values the earlier calls returned",
                          "call fn() and drop what it returns (or keep only the latest): a timer that holds every "
                          "output keeps, on a GPU, each call's tensors (and any autograd graph they carry) in device "
                          "memory while the later calls run, so those calls run with less memory than the code you "
                          "are timing would have, and a long timing can run out of it")
    # (b) asynchronous device work: must synchronise before reading the clock (the simulated device
    # runs in real time; its bounds leave a loaded machine room: 0.6x to 2.5x)
    device = SimulatedAccelerator(step_ms=0, max_queued=1000)  # a deep launch queue, as on CUDA
    syncs = [0]
    device_sync = device.synchronize

    def counted_sync():        # w6-01: a timer that synchronised only a device of type 'cuda'
        syncs[0] += 1
        device_sync()
    device.synchronize = counted_sync
    try:
        fn = _CountingFn(0.0, device, device_ms=20.0)
        ms = _time(time_it, fn, device, "asynchronous device work", warmup=1, repeats=5)
        for _ in range(2):     # load only ever adds time: a result too long is tried again (the shortest counts)
            if ms <= 2.5 * 20:
                break
            fn = _CountingFn(0.0, device, device_ms=20.0)
            ms = min(ms, _time(time_it, fn, device, "asynchronous device work", warmup=1, repeats=5))
        if ms < 0.6 * 20 and syncs[0] == 0:
            raise CheckFailed("waits for the device before reading the clock",
                              f"each call queues 20 ms of device work on the course's simulated device (its type is "
                              f"'{device.type}', not 'cuda'); yours measured {ms:.2f} ms and never synchronised it",
                              "yours skipped this device's synchronisation (a sync only when device.type == 'cuda', "
                              "or torch.cuda.synchronize(), waits for no other device): call course_utils.timing's "
                              "synchronize(device) for every device, it waits for whichever kind it is handed "
                              "(and returns at once for the CPU)")
        if ms < 0.6 * 20:
            raise CheckFailed("waits for the device before reading the clock",
                              f"each call queues 20 ms of device work; yours measured {ms:.2f} ms, synchronising "
                              f"the device {syncs[0]} times in all for {fn.calls} calls",
                              "device work is asynchronous: each timed call needs its own synchronize(device) "
                              "before you start the clock and another before you stop it (a sync once, after the "
                              "loop, leaves every call's clock stopped before its work ran)")
        if ms > 2.5 * 20:      # (a busy host delays the simulated device by some ms: room for it)
            raise CheckFailed("times one call at a time", f"each call queues 20 ms of device work; yours measured {ms:.2f} ms")
        if fn.calls != 6:
            raise CheckFailed("calls fn warmup + repeats times",
                              f"warmup=1, repeats=5: yours called fn {fn.calls} times, expected 6")
        # (c) the warm-up's device work is still queued when the timing starts: wait for it first
        for _ in range(3):     # one timed call, on a loaded machine maybe late: the shortest of 3 tries counts
            fn = _CountingFn(0.0, device, device_ms=20.0)
            ms = _time(time_it, fn, device, "device work left from the warm-up", warmup=5, repeats=1)
            if ms <= 3 * 20 or fn.calls != 6:
                break
        if ms > 3 * 20:
            raise CheckFailed("waits for earlier work before starting the clock",
                              f"warmup=5 calls queue 100 ms of device work, then one timed call queues 20 ms; yours "
                              f"measured {ms:.1f} ms for it",
                              "yours timed the warm-up's queued work too: the synchronize(device) that waits for "
                              "it must come before the clock starts (a sync just after starting the clock, or none "
                              "at all, puts that work inside the first timing)")
        if fn.calls != 6:
            raise CheckFailed("calls fn warmup + repeats times",
                              f"warmup=5, repeats=1: yours called fn {fn.calls} times, expected 6")
    finally:
        device.close()
    # (d) warm-up: the first calls are slow (lazy initialisation, autotuning)
    _, ms = timed(lambda i: 40.0 if i < 5 else 4.0, "slow first calls", warmup=5, repeats=3)
    if ms > 20:
        raise CheckFailed("excludes warm-up calls", f"the first 5 calls take 40 ms, later ones 4 ms; "
                          f"with warmup=5, repeats=3 yours reported {ms:.1f} ms",
                          "run fn `warmup` times before timing anything, and time only the `repeats` calls")
    # (d') one timed call after two slow warm-up calls: a loop whose first timed call is the
    # last warm-up call (timing from warmup - 1 on) reports the mean of 40 and 4 ms, or 40
    fn, ms = timed(lambda i: 40.0 if i < 2 else 4.0, "two slow warm-up calls, then one", warmup=2, repeats=1)
    if ms > 15:
        raise CheckFailed("excludes warm-up calls", f"the first 2 calls take 40 ms, later ones 4 ms; with "
                          f"warmup=2, repeats=1 yours reported {ms:.1f} ms for the one timed call",
                          "your timed calls include a warm-up call (the last one, judging by the number): "
                          "finish all `warmup` calls first, then time exactly `repeats` calls, each "
                          "between its own two synchronize(device) calls")
    if fn.calls != 3:
        raise CheckFailed("calls fn warmup + repeats times",
                          f"warmup=2, repeats=1: yours called fn {fn.calls} times, expected 3")
    # (d0) no warm-up at all (w6-01: a loop of warmup - 1 warm-up calls and repeats + 1 timed ones,
    # the first dropped, and one that always warms up once, both called fn 4 times for warmup=0, repeats=3)
    fn, no_warmup_ms = timed(lambda i: (30.3, 4.3, 12.3, 50.3)[min(i, 3)], "no warm-up, then 3 calls", warmup=0,
                             repeats=3)
    if fn.calls != 3:
        raise CheckFailed("calls fn warmup + repeats times",
                          f"warmup=0, repeats=3: yours called fn {fn.calls} times, expected 3",
                          "warmup=0 means no warm-up call: time every one of the `repeats` calls, the first "
                          "included (for _ in range(warmup) runs no call when warmup is 0; no extra call, no "
                          "timed call dropped)")
    # (d'') the defaults, as the spec states them: warmup=3, repeats=10
    fn, ms = timed(lambda i: 40.0 if i < 3 else 2.0, "its defaults")
    if fn.calls != 13:
        raise CheckFailed("defaults to warmup=3, repeats=10",
                          f"time_it(fn, device): yours called fn {fn.calls} times, expected 3 + 10 = 13",
                          "def time_it(fn, device, warmup=3, repeats=10)")
    if ms > 15:
        raise CheckFailed("defaults to warmup=3, repeats=10",
                          f"time_it(fn, device), the first 3 calls 40 ms and the rest 2 ms: yours reported "
                          f"{ms:.1f} ms", "def time_it(fn, device, warmup=3, repeats=10)")
    # (e) timed calls on which the median's neighbours disagree with it (issue 35): one slow and
    # one fast outlier, the mean of the two middle values for an even count, every timed call
    # counted (none dropped, trimmed or skipped), not rounded. All cases first: the hint names the
    # statistic that matches yours on every one of them.
    results, failed = [], None
    for timed_ms, what in _STATISTIC_CASES:
        script = timed_ms[:1] + timed_ms
        fn, ms = timed(lambda i, script=script: script[min(i, len(script) - 1)], what, warmup=1, repeats=len(timed_ms))
        if fn.calls != len(script):
            raise CheckFailed("calls fn warmup + repeats times", f"warmup=1, repeats={len(timed_ms)}: "
                              f"yours called fn {fn.calls} times, expected {len(script)}")
        results.append((timed_ms, ms))
        if failed is None and not _close(ms, statistics.median(timed_ms)):
            failed = (timed_ms, what, ms)
    if failed is not None:
        timed_ms, what, ms = failed
        raise CheckFailed("reports the median of the repeats",
                          f"warmup=1, then {what}: the median is {statistics.median(timed_ms):g} ms; yours reported "
                          f"{ms:.2f} ms", _statistic_hint(results))
    # (d0') with no warm-up, the median of the 3 calls (after the cases that name a statistic)
    if not _close(no_warmup_ms, 12.3):
        raise CheckFailed("reports the median of the repeats",
                          f"warmup=0, then 3 timed calls of 30.3, 4.3 and 12.3 ms: the median is 12.3 ms; yours "
                          f"reported {no_warmup_ms:.2f} ms", "with warmup=0 every call is timed, the first one too")
    # (a') the CPU function once more: one call takes 6 ms
    if cpu_ms > 20.0:
        raise CheckFailed("measures one call of a CPU function",
                          f"yours {cpu_ms:.3f} ms for a function that takes 6 ms (1 ms of CPU, 5 ms of waiting)",
                          "time each of the `repeats` calls on its own (not all of them in one block, nor the "
                          "warm-up with them) and report the median of those times")
    # (h) a real GPU, when there is one
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
        ms = _time(time_it, fn, cuda, "a CUDA matmul", warmup=3, repeats=10)
        if not 0.5 * expected <= ms <= 2.0 * expected:
            raise CheckFailed("times CUDA work", f"a 4096x4096 matmul: yours {ms:.3f} ms, CUDA events say {expected:.3f} ms")
    return ("warm-up skipped, device synchronised before and after, the median of every timed call (even counts "
            "and single calls included), in milliseconds of wall time.")


# -- 1.2 the data-stall fraction ---------------------------------------------------------------

def _reference_stall(log, skip_first):
    steps = log[skip_first:]
    if not steps:
        raise ValueError("no steps left")
    wait = sum(s["fetch_end"] - s["fetch_start"] for s in steps)
    return wait / (steps[-1]["step_end"] - steps[0]["fetch_start"])


def _float32_stall(log, skip_first):
    """The reference on timestamps rounded to float32 (what torch.tensor(...) or np.float32 make of them)."""
    rounded = [{k: float(np.float32(v)) for k, v in s.items()} for s in log]
    return _reference_stall(rounded, skip_first)


def _rounded(yours, expected) -> bool:
    """Whether yours is the expected fraction rounded to 1 to 6 decimal places."""
    return any(trusted.isclose(float(yours), round(expected, d), rel_tol=0, abs_tol=1e-12) for d in range(1, 7))


def _per_step(log, skip, statistic, yours) -> bool:
    """Whether yours is `statistic` of the counted steps' own fractions (wait / that step's time)."""
    steps = log[skip:]
    if len(steps) < 2:
        return False
    value = statistic([(s["fetch_end"] - s["fetch_start"]) / (s["step_end"] - s["fetch_start"]) for s in steps])
    return trusted.isclose(float(yours), value, rel_tol=1e-6)


def _stall_slip(log, skip, yours):
    """The hint naming the slip yours matches on this log (w5-01: seven slips got the definition
    restated), or None: (value the slip gives, what it did) in the order tried."""
    steps = log[skip:]
    if not steps:
        return None
    first, last = steps[0], steps[-1]
    waits = [s["fetch_end"] - s["fetch_start"] for s in steps]
    wait = sum(waits)
    own = sum(s["step_end"] - s["fetch_start"] for s in steps)
    gap_wait = waits[0] + sum(s["fetch_end"] - p["step_end"] for p, s in zip(steps, steps[1:]))
    wall = last["step_end"] - first["fetch_start"]
    slips = [
        (lambda: wait / own, "yours divides by the steps' own time (the sum of step_end - fetch_start, or of wait + "
         "compute): the gaps between steps are left out of it. Divide by the wall time from the first counted step's "
         "fetch_start to the last step's step_end, gaps included"),
        (lambda: wait / (last["step_end"] - first["fetch_end"]), "yours starts the wall time at the first counted "
         "step's fetch_end: start it at its fetch_start (the first wait is part of the run)"),
        (lambda: wait / (last["fetch_start"] - first["fetch_start"]), "yours ends the wall time at the last step's "
         "fetch_start: end it at the last step's step_end (its wait and compute are part of the run)"),
        (lambda: wait / (last["fetch_end"] - first["fetch_start"]), "yours ends the wall time at the last step's "
         "fetch_end: end it at the last step's step_end (its compute is part of the run)"),
        (lambda: wait / (log[-1]["step_end"] - log[0]["fetch_start"]), "yours sums the counted steps' waits but "
         "measures the wall time from step_log[0], the warm-up: take both from step_log[skip_first] on"),
        (lambda: statistics.median(waits) * len(waits) / wall, "yours matches the median wait times the number of "
         "steps: sum the waits themselves (the long waits are the stall this fraction measures)"),
        (lambda: gap_wait / wall, "yours counts the gap before each fetch (from the previous step's step_end) as "
         "waiting: a step's wait is its own fetch_end - fetch_start; the gaps count in the wall time only"),
    ]
    for value, hint in slips:
        try:
            if trusted.isclose(float(yours), value(), rel_tol=1e-6):
                return hint
        except (ZeroDivisionError, ValueError):
            continue
    return None


def _without_longest(log, skip, yours) -> bool:
    """Whether yours is the fraction with the k longest waits left out (outliers dropped), k up to half."""
    steps = log[skip:]
    waits = sorted(s["fetch_end"] - s["fetch_start"] for s in steps)
    wall = steps[-1]["step_end"] - steps[0]["fetch_start"] if steps else 0.0
    return wall > 0 and any(trusted.isclose(float(yours), sum(waits[:-k]) / wall, rel_tol=1e-6)
                            for k in range(1, len(waits) // 2 + 1))


def _both(yours: float, expected: float) -> str:
    """'yours Y, expected E' with as many digits as it takes for two different numbers to look different."""
    for digits in range(6, 13):
        a, b = f"{yours:.{digits}f}", f"{expected:.{digits}f}"
        if a != b:
            break
    return f"yours {a}, expected {b}"


def _random_log(rng, n, *, warm_wait=0.0, gap=True):
    # time.perf_counter() counts from an arbitrary point: on a machine up for hours its readings are
    # 1e4 s and more, where float32 keeps only milliseconds (w2-01: float32 arithmetic was off in the 6th digit)
    t, log = rng.uniform(1e4, 1e5), []
    for i in range(n):
        start = t
        wait = rng.exponential(0.02) + (warm_wait if i == 0 else 0.0)
        compute = rng.uniform(0.005, 0.05)
        log.append({"fetch_start": start, "fetch_end": start + wait, "step_end": start + wait + compute})
        t = start + wait + compute + (rng.uniform(0.0, 0.03) if gap else 0.0)
    return log


_KEEPS_NOTHING = ("compute the fraction from the step_log passed in, on every call: nothing kept between calls (no "
                  "module-level cache or list, no result kept per list or per id(step_log): a StepTimer's log grows "
                  "while the loop runs, so the same list holds new steps at the next call)")


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
    cases.append((_random_log(rng, 5, warm_wait=1.0), 4, "a 5-step log, skip_first=4: one step left"))
    # w4-01: a cache keyed by the log's length returned the first 12-step log's fraction for another
    # 12-step log: a second one, its waits three times as long (a different fraction on every seed)
    again = _random_log(rng, 12, warm_wait=2.0)
    for s_ in again[1:]:
        extra = 2 * (s_["fetch_end"] - s_["fetch_start"])
        s_["fetch_end"] += extra
        s_["step_end"] += extra
    for i in range(1, len(again)):           # keep the steps in order, as a real log is
        shift = again[i - 1]["step_end"] + 0.001 - again[i]["fetch_start"]
        if shift > 0:
            for k in again[i]:
                again[i][k] += shift
    cases.append((again, 1, "another 12-step log, its batches three times as slow"))
    earlier = []       # (what, yours) of the calls before: an answer that repeats one of them keeps state
    for log, skip, what in cases:
        original = copy.deepcopy(log)
        with calling(f"stall_fraction(log) on {what}" if skip is None else f"stall_fraction(log, skip_first={skip}) on {what}"):
            yours = stall_fraction(log) if skip is None else stall_fraction(log, skip_first=skip)
        if log != original:
            raise CheckFailed("leaves the log unchanged", f"{what}: the list passed in was modified")
        if not isinstance(yours, (float, int, np.floating)) or isinstance(yours, bool):
            raise CheckFailed("returns a float", f"{what}: yours returned {type(yours).__name__}")
        default = skip is None
        skip = 1 if default else skip
        expected = _reference_stall(log, skip)
        if not trusted.isclose(float(yours), expected, rel_tol=1e-6, abs_tol=1e-9):
            coarse = trusted.isclose(float(yours), _float32_stall(log, skip), rel_tol=1e-4) or \
                _rounded(yours, expected)     # float32, or rounded: few values, two logs may share one
            before = [] if coarse else [w for w, y in earlier if trusted.isclose(float(yours), y, rel_tol=1e-9, abs_tol=1e-12)]
            # a value kept from an earlier run of the check: the same answer for another log (of another
            # length, or of this one's: w4-01 keyed its cache by the length)
            for probe in ([] if before or coarse else (_random_log(rng, 9), _random_log(rng, len(log)))):
                try:
                    again = float(stall_fraction(probe, skip_first=skip))
                except Exception:
                    again = None
                if again is not None and trusted.isclose(again, float(yours), rel_tol=1e-9, abs_tol=1e-12) and \
                        not trusted.isclose(_reference_stall(probe, skip), expected, rel_tol=1e-6):
                    before = [f"another log it handed yours next (a {len(probe)}-step log, expected "
                              f"{_reference_stall(probe, skip):.6f})"]
                    break
            if not before:       # w5-01: a result kept per list (by id) answers another value for an equal copy
                copies = [copy.deepcopy(log) for _ in range(5)]      # all alive at once: five ids never seen
                for c in copies:
                    try:
                        other = float(stall_fraction(c) if default else stall_fraction(c, skip_first=skip))
                    except Exception:
                        continue
                    if not trusted.isclose(other, float(yours), rel_tol=1e-9, abs_tol=1e-12):
                        try:           # w6-01: a global running total answers anew on the same list
                            twice = float(stall_fraction(c) if default else stall_fraction(c, skip_first=skip))
                        except Exception:
                            twice = other
                        kept = ("a value kept between calls in a global (a running total over every log, say), "
                                f"not from the steps the list holds: on that same copy, asked again, yours returned "
                                f"{twice:.6f}"
                                if not trusted.isclose(twice, other, rel_tol=1e-9, abs_tol=1e-12) else
                                "something kept from an earlier call per list (such as id(step_log)), not from the "
                                "steps the list holds")
                        raise CheckFailed("keeps nothing from an earlier call",
                                          f"{what}: {_both(float(yours), expected)}; on an equal copy of this log "
                                          f"yours returned {other:.6f} (seed {seed}): yours answers from {kept}",
                                          _KEEPS_NOTHING)
            if before:           # w3-01: a module-level cache returned the first log's value for every later log
                raise CheckFailed("keeps nothing from an earlier call",
                                  f"{what}: {_both(float(yours), expected)}, the value yours returned for {before[0]} "
                                  f"(seed {seed})",
                                  _KEEPS_NOTHING)
            hint = ("wait = fetch_end - fetch_start for each counted step; divide their sum by the wall time "
                    "from the first counted step's fetch_start to the last step's step_end (gaps between "
                    "steps are part of the wall time)")
            if default and any(trusted.isclose(float(yours), _reference_stall(log, k), rel_tol=1e-6) for k in (0, 2, 3)):
                raise CheckFailed("defaults to skip_first=1", f"{what}: {_both(float(yours), expected)} (seed {seed})",
                                  "def stall_fraction(step_log, skip_first=1)")
            if skip and trusted.isclose(float(yours), _reference_stall(log, 0), rel_tol=1e-6):
                hint = f"the first skip_first={skip} steps are warm-up: leave them out"
            elif len(log) > skip + 1 and trusted.isclose(float(yours), _reference_stall(log, skip + 1), rel_tol=1e-6):
                hint = (f"yours leaves out {skip + 1} steps, one more than skip_first={skip}: step_log[skip_first:] "
                        "leaves out exactly skip_first (the first counted step is step_log[skip_first])")
            elif skip > 1 and trusted.isclose(float(yours), _reference_stall(log, skip - 1), rel_tol=1e-6):
                hint = (f"yours leaves out {skip - 1} steps, one fewer than skip_first={skip}: step_log[skip_first:] "
                        "leaves out exactly skip_first")
            elif trusted.isclose(float(yours), 100 * expected, rel_tol=1e-6):
                hint = "a fraction, between 0 and 1, not a percentage"
            elif _per_step(log, skip, statistics.mean, yours):
                hint = ("yours matches the mean of each step's own fraction (wait / step time): that weighs a short "
                        "step like a long one and leaves the gaps between steps out; sum the waits, then divide "
                        "once, by the wall time of all the counted steps")
            elif _per_step(log, skip, statistics.median, yours):
                hint = ("yours matches the median of each step's own fraction (wait / step time): the fraction of "
                        "the run spent waiting is one sum of waits divided once by the run's wall time")
            elif len(log) > skip + 1 and trusted.isclose(float(yours), _reference_stall(log[:-1], skip), rel_tol=1e-6):
                hint = ("yours leaves out the last step: every step from step_log[skip_first] to the end counts, "
                        "the last one included (its step_end closes the wall time)")
            elif _rounded(yours, expected):
                hint = ("yours is the right fraction, rounded: return it as computed, not rounded (round only "
                        "where you print it)")
            elif _without_longest(log, skip, yours):
                hint = ("yours leaves out the longest waits: every counted step's wait counts, the slow ones "
                        "first of all (a long wait for a batch is the stall this fraction measures)")
            elif trusted.isclose(float(yours), _float32_stall(log, skip), rel_tol=1e-4):
                hint = ("yours matches the definition computed in float32, which keeps about 7 digits: these "
                        "timestamps are perf_counter seconds around 1e4 to 1e5, so float32 keeps only milliseconds of "
                        "them. Compute in Python floats (float64): torch.tensor(...) and np.float32 make float32 "
                        "(torch.tensor(..., dtype=torch.float64) does not)")
            else:
                hint = _stall_slip(log, skip, yours) or hint
            raise CheckFailed("matches the definition", f"{what}: {_both(float(yours), expected)} (seed {seed})", hint)
        earlier.append((what, float(yours)))
    # w5-01: a result memoised per log object (its id) returned a stale value for a StepTimer.log read
    # mid-run and again at the end: the same list, read after 8 steps, then after 8 more whose batches
    # are five times as slow (its fraction moves by more than any tolerance on every seed)
    growing = _random_log(rng, 8)
    with calling("stall_fraction(log) on an 8-step log read mid-run"):
        first = stall_fraction(growing)
    more = _random_log(rng, 8)
    shift = growing[-1]["step_end"] + 0.002 - more[0]["fetch_start"]
    for s_ in more:
        stretch = 4 * (s_["fetch_end"] - s_["fetch_start"])
        growing.append({"fetch_start": s_["fetch_start"] + shift, "fetch_end": s_["fetch_end"] + shift + stretch,
                        "step_end": s_["step_end"] + shift + stretch})
        shift += stretch
    with calling("stall_fraction(log) on the same log, 8 steps longer"):
        again = stall_fraction(growing)
    expected = _reference_stall(growing, 1)
    if not isinstance(again, (float, int, np.floating)) or isinstance(again, bool):
        raise CheckFailed("returns a float", f"a log read again after it grew: yours returned {type(again).__name__}")
    if not trusted.isclose(float(again), expected, rel_tol=1e-6, abs_tol=1e-9):
        if not (isinstance(first, (float, int, np.floating)) and
                trusted.isclose(float(again), float(first), rel_tol=1e-9, abs_tol=1e-12)):
            raise CheckFailed("matches the definition", f"a 16-step log: {_both(float(again), expected)} (seed {seed})",
                              "wait = fetch_end - fetch_start for each counted step; divide their sum by the wall time "
                              "from the first counted step's fetch_start to the last step's step_end")
        raise CheckFailed("keeps nothing from an earlier call",
                          f"a log read after 8 steps (yours {float(first):.6f}), then the same list read again after 8 "
                          f"more steps whose batches were five times as slow: {_both(float(again), expected)}, the "
                          f"value yours returned for the shorter log (seed {seed})",
                          _KEEPS_NOTHING)
    for steps, skip in ((3, 3), (3, 5), (0, 0)):          # none left: exactly as many skipped, more, an empty log
        try:
            stall_fraction(_random_log(rng, steps), skip_first=skip)
        except ValueError:
            pass
        except Exception as exc:
            raise CheckFailed("raises ValueError when no step is left",
                              f"{steps} steps with skip_first={skip} raised {type(exc).__name__}: {exc}",
                              "check for an empty list of steps first and raise ValueError yourself") from None
        else:
            raise CheckFailed("raises ValueError when no step is left", f"{steps} steps with skip_first={skip} did not raise",
                              "a fraction of nothing is not 0: raise ValueError('no steps left after skipping')")
    return ("matches the definition on eight logs (one step left included) and on a log that grew between two "
            "calls, warm-up excluded, gaps counted, empty cases raise.")


# -- 1.3 diagnose a timeline ---------------------------------------------------------------------
# The rules (the exercise states them): compute-bound when the device was busy 85% of the time or
# more, on average over the run; else input-bound when the course's own processes kept at least
# 80% of the machine's cores busy, on average over the run; else sync-bound. The course's own
# cores (`timeline.ours_cores`), not every process's: on a shared machine other programs fill the
# cores htop shows (issue 35: a 2-core machine whose second core another program holds).

DEVICE_BUSY, OURS_SHARE = 85.0, 0.8


def _reference_diagnosis(timeline) -> str:
    if float(np.mean(timeline.gpu_util)) >= DEVICE_BUSY:
        return "compute-bound"
    return "input-bound" if float(np.mean(timeline.ours_cores)) >= OURS_SHARE * timeline.cores else "sync-bound"


def _timeline(gpu, ours, cores, rng, others=0.0, what=""):
    """A recorded-looking Timeline with these device and course readings: per-core CPU that adds up
    to the course's cores plus `others` cores of other programs (and a little background)."""
    gpu, ours = np.asarray(gpu, dtype=float), np.asarray(ours, dtype=float)
    n = len(gpu)
    assert len(ours) == n, (len(ours), n)
    cpu = np.zeros((n, cores))
    for j, c in enumerate(rng.permutation(cores)):  # the course's cores filled one after another
        cpu[:, c] = 100 * np.clip(ours - j, 0.0, 1.0)
    room = 100 - cpu
    background = np.minimum(room, rng.uniform(0, 4, (n, cores)))
    if others:
        spare = room - background
        background = background + spare * min(1.0, others / max(spare.sum(axis=1).mean() / 100, 1e-9))
    total = np.clip(cpu + background, 0, 100)
    return Timeline(t_s=np.arange(n) * 0.1, cpu_percent=total, gpu_util=gpu, device="a recorded device",
                    host=f"{cores} cores", simulated=True, ours_cores=ours,
                    others_cores=np.maximum(total.sum(axis=1) / 100 - ours, 0.0))


def _series(rng, mean, n, spread, low, high):
    from ..io_probe import _with_mean
    return _with_mean(rng, mean, n, spread, low, high)


def _flat(rng, mean, n, amplitude):
    """n readings within `amplitude` of `mean` whose mean is `mean` (to rounding): every statistic of
    them (median, peak, trimmed mean, one sample) falls on the same side of a threshold further away."""
    x = rng.uniform(-amplitude, amplitude, n)
    return mean + (x - x.mean()) / 2


# Formulations of "on average over the run, at least X" a learner may write, as (value, threshold)
# pairs: an input on the edge must lie exactly on it under all of them (floating point).
def _device_forms(g):
    return [(np.mean(g), DEVICE_BUSY), (np.mean(g / 100), DEVICE_BUSY / 100), (np.mean(g) / 100, DEVICE_BUSY / 100),
            (statistics.mean(g.tolist()), DEVICE_BUSY), (sum(g.tolist()) / len(g), DEVICE_BUSY)]


def _ours_forms(o, cores):
    return [(np.mean(o), OURS_SHARE * cores), (np.mean(o) / cores, OURS_SHARE), (np.mean(o / cores), OURS_SHARE),
            (100 * np.mean(o) / cores, 100 * OURS_SHARE), (np.mean(o / cores * 100), 100 * OURS_SHARE),
            (statistics.mean(o.tolist()), OURS_SHARE * cores), (sum(o.tolist()) / len(o) / cores, OURS_SHARE)]


def _rebuilt_ours_forms(tl):
    """The course's mean cores rebuilt from every process's CPU less the other programs' (equal to
    mean(ours_cores) but for floating point), as (value, threshold) pairs."""
    total = tl.cpu_percent.sum(axis=1) / 100
    rebuilt = [np.mean(tl.cpu_percent.sum(axis=1)) / 100 - np.mean(tl.others_cores), np.mean(total - tl.others_cores),
               np.mean(total) - np.mean(tl.others_cores)]
    return [(v, OURS_SHARE * tl.cores) for v in rebuilt] + [(v / tl.cores, OURS_SHARE) for v in rebuilt]


def _on_edge(x, forms, *args) -> bool:
    return all(value == threshold for value, threshold in forms(x, *args))


def _exactly(target, n, forms, *args):
    """About n readings, all equal to `target`, whose mean is exactly `target` under every formulation in
    `forms` (>= holds and > does not, however the learner writes the mean; every other statistic agrees)."""
    for m in range(n, n + 200):
        x = np.full(m, float(target))
        if _on_edge(x, forms, *args):
            return x
    raise RuntimeError(f"the check found no readings exactly on the edge {target}")


def _first_cores(machine: int) -> int:
    """The cores of the first timeline check 1.3 hands over: 16, or 32 on a 16-core machine."""
    return 32 if machine == 16 else 16


def _diagnosis_groups(rng):
    """(property, hint, [(timeline, what), ...]) in the order the check reports them. Each group
    varies one thing; in the others every statistic of every reading agrees (issue 35)."""
    groups, n = [], 100

    def quiet_device(m=n):                       # a device far below 85% whatever the statistic
        return _flat(rng, rng.uniform(15, 35), m, 10.0)

    def one_thread(cores, m=n):                  # the course keeping about one core busy
        return _flat(rng, rng.uniform(0.9, 1.1), m, 0.05)

    cases = []
    for kind in TIMELINE_KINDS:
        for cores in (2, 4, 8, 16, 32):
            for _ in range(2):
                made = synthetic_timeline(kind, cores=cores, seconds=float(rng.uniform(4, 15)), rng=rng)
                timeline = Timeline(t_s=made.t_s, cpu_percent=made.cpu_percent, gpu_util=made.gpu_util,
                                    device="a recorded device", host=f"{cores} cores", simulated=True,
                                    ours_cores=made.ours_cores, others_cores=made.others_cores)
                cases.append((timeline, f"a typical {kind} run on {cores} cores"))
    # w4-01: the first timeline handed over never has this machine's cores (a kept first one is told apart
    # from os.cpu_count()); the draws are those of every seed before, in another order
    first = _first_cores(os.cpu_count() or 1)
    cases.sort(key=lambda case: case[0].cores != first)
    # two busy threads on 16 cores: sync-bound, however many cores the machine running the check has
    # (w2-01: os.cpu_count() for timeline.cores, on a 2-core machine, failed here only on some seeds)
    cases.append((_timeline(_flat(rng, rng.uniform(20, 40), n, 5.0), _flat(rng, rng.uniform(1.9, 2.1), n, 0.05), 16, rng),
                  "two busy host threads on 16 cores"))
    for cores in (2, 8):            # both rules hold: the first decides (w2-01: the rules swapped passed on some seeds)
        cases.append((_timeline(_flat(rng, rng.uniform(92, 98), n, 2.0), _flat(rng, 0.95 * cores, n, 0.02), cores, rng),
                      f"a device about 95% busy while the course's workers keep all {cores} cores busy"))
    groups.append(("diagnoses each situation", "apply the rules in order: the device's utilisation averaged over "
                   "the run first (85% or more: compute-bound), then the cores the course's own processes kept "
                   "busy, timeline.ours_cores averaged over the run (at least 0.8 x timeline.cores: input-bound), "
                   "else sync-bound", cases))

    cases = []
    for cores in (2, 2, 3, 4):
        cases.append((_timeline(quiet_device(), one_thread(cores), cores, rng, others=cores - 1.0),
                      f"one busy host thread on {cores} cores while other programs hold the other {cores - 1}"))
    cases.append((_timeline(quiet_device(), _flat(rng, rng.uniform(1.85, 1.95), n, 0.04), 2, rng),
                  "workers saturating a quiet 2-core machine"))
    groups.append(("reads the course's own cores, not the whole machine's",
                   "every process's CPU (timeline.cpu_percent) counts the other programs of a shared machine too: "
                   "htop shows every core busy while the course kept one; read timeline.ours_cores, the cores the "
                   "course's own processes (this kernel and its workers) kept busy", cases))

    cases = []
    cores = int(rng.choice([2, 4, 8]))
    gpu = _exactly(DEVICE_BUSY, n, _device_forms)
    cases.append((_timeline(gpu, one_thread(cores, len(gpu)), cores, rng), "a device busy exactly 85% of the time"))
    for low, high in ((40.0, 50.0), (50.0, 70.0), (70.0, 84.0), (84.0, 84.5), (84.6, 84.99), (85.01, 85.4),
                      (85.5, 86.0), (86.0, 92.0)):
        workers = bool(rng.integers(2))                            # input-bound below 85%, or sync-bound
        ours = _flat(rng, 0.95 * cores, n, 0.02) if workers else one_thread(cores)
        cases.append((_timeline(_flat(rng, rng.uniform(low, high), n, 0.005), ours, cores, rng),
                      f"a device busy {low:g}-{high:g}% of the time, {'workers on every core' if workers else 'one thread'}"))
    for cores, target in ((5, 4.0), (10, 8.0), (20, 16.0)):
        ours = _exactly(target, n, _ours_forms, cores)
        for _ in range(100):     # w3-01: the course's cores rebuilt from every process's CPU minus the others'
            tl = _timeline(quiet_device(len(ours)), ours, cores, rng)   # must land on the edge's right side too
            if all(value >= threshold for value, threshold in _rebuilt_ours_forms(tl)):
                break
        cases.append((tl, f"the course's processes keeping exactly 80% of {cores} cores busy"))
    for low, high in ((0.5, 0.6), (0.6, 0.7), (0.7, 0.79), (0.79, 0.7949), (0.795, 0.7995), (0.7996, 0.7999),
                      (0.8001, 0.8049), (0.805, 0.81), (0.81, 0.9)):
        cores = int(rng.choice([2, 3, 4]))
        share = float(rng.uniform(low, high))
        cases.append((_timeline(quiet_device(), _flat(rng, share * cores, n, 1e-5), cores, rng),
                      f"the course's processes keeping {low:.2%}-{high:.2%} of {cores} cores busy"))
    groups.append(("uses the thresholds as specified",
                   "compute-bound from a mean device utilisation of 85% on (85% itself included); input-bound from "
                   "0.8 x timeline.cores of the course's cores on (exactly 0.8 x cores included), compared as they "
                   "are, not rounded: on 2 cores one busy thread with helpers can keep 1.5 cores busy, which is "
                   "not every core", cases))

    cases = []
    for at in ("start", "end"):
        cores = int(rng.choice([2, 4, 8]))
        ours = one_thread(cores)
        burst = slice(0, 8) if at == "start" else slice(n - 8, n)
        ours[burst] = cores                                        # workers starting (or ending) at full speed
        cases.append((_timeline(quiet_device(), ours, cores, rng),
                      f"one busy thread on {cores} cores, every core busy over the {at} of the run (8 of 100 samples)"))
        gpu = _flat(rng, 60.0, n, 10.0)
        gpu[burst] = 100.0                                         # a burst of queued work
        cases.append((_timeline(gpu, one_thread(2), 2, rng), f"a device about 60% busy, 100% over the {at} of the run"))
    cores = int(rng.choice([2, 4]))

    def mixed(values_counts):
        x = np.concatenate([np.full(k, v) for v, k in values_counts])
        rng.shuffle(x)
        return x
    cases.append((_timeline(quiet_device(), mixed([(0.9 * cores, 60), (0.4 * cores, 40)]), cores, rng),
                  f"the course at 90% of {cores} cores in 60 samples, 40% in 40 (a mean of 70%, a median of 90%)"))
    cases.append((_timeline(quiet_device(), mixed([(0.75 * cores, 60), (0.98 * cores, 40)]), cores, rng),
                  f"the course at 75% of {cores} cores in 60 samples, 98% in 40 (a mean of 84%, a median of 75%)"))
    cases.append((_timeline(mixed([(92.0, 60), (70.0, 40)]), one_thread(2), 2, rng),
                  "a device 92% busy in 60 samples, 70% in 40 (a mean of 83%, a median of 92%)"))
    cases.append((_timeline(mixed([(80.0, 60), (98.0, 40)]), one_thread(2), 2, rng),
                  "a device 80% busy in 60 samples, 98% in 40 (a mean of 87%, a median of 80%)"))
    middle = np.r_[np.zeros(25), np.ones(50), np.zeros(25)]
    cases.append((_timeline(quiet_device(), cores * (0.1 + 0.85 * middle), cores, rng),
                  f"the course at 95% of {cores} cores over the middle half of the run, 10% over its start and end"))
    cases.append((_timeline(quiet_device(), cores * (1.0 - 0.28 * middle), cores, rng),
                  f"the course at 100% of {cores} cores over the start and end of the run, 72% over its middle half"))
    cases.append((_timeline(20.0 + 77.0 * middle, one_thread(2), 2, rng),
                  "a device 97% busy over the middle half of the run, 20% over its start and end"))
    cases.append((_timeline(quiet_device(), np.r_[np.zeros(10), np.full(90, 0.845 * cores)], cores, rng),
                  f"the course idle over the first 10 samples, then at 84.5% of {cores} cores (a mean of 76%)"))
    cases.append((_timeline(quiet_device(), np.r_[np.full(90, 0.79 * cores)[:88], np.full(12, float(cores))], cores, rng),
                  f"the course at 79% of {cores} cores, then every core over the last 12 samples (a mean of 81.5%)"))
    cases.append((_timeline(np.r_[np.zeros(10), np.full(90, 94.0)], one_thread(2), 2, rng),
                  "a device idle over the first 10 samples, then 94% busy (a mean of 84.6%)"))
    # every sample, the last ones too (w2-01: x[:-1] ... x[:-5] and x[::2] passed): runs whose first or
    # last sample alone, and every other sample, move the mean across a threshold, on both sides of it
    cases.append((_timeline(np.r_[np.full(90, 94.0), np.zeros(10)], one_thread(2), 2, rng),
                  "a device 94% busy, idle over the last 10 samples (a mean of 84.6%; 85.5% without its last sample)"))
    cases.append((_timeline(np.r_[np.full(95, 84.22), np.full(5, 100.0)], one_thread(2), 2, rng),
                  "a device 84.2% busy, then 100% over the last 5 samples (a mean of 85.01%; 84.86% without its last "
                  "sample)"))
    cases.append((_timeline(np.r_[np.full(5, 100.0), np.full(95, 84.22)], one_thread(2), 2, rng),
                  "a device 100% busy over the first 5 samples, then 84.2% (a mean of 85.01%; 84.86% without its first "
                  "sample)"))
    cases.append((_timeline(np.tile([100.0, 68.0], n // 2), one_thread(2), 2, rng),
                  "a device 100% and 68% busy in turn, sample by sample (a mean of 84%; every other sample reads 100%)"))
    cases.append((_timeline(np.tile([68.0, 100.0], n // 2), one_thread(2), 2, rng),
                  "a device 68% and 100% busy in turn, sample by sample (a mean of 84%; every other sample, from the "
                  "second, reads 100%)"))
    cores = int(rng.choice([2, 4]))
    cases.append((_timeline(quiet_device(), np.r_[np.full(95, 0.79 * cores), np.full(5, float(cores))], cores, rng),
                  f"the course at 79% of {cores} cores, then every core over the last 5 samples (a mean of 80.05%; "
                  "79.85% without its last sample)"))
    cases.append((_timeline(quiet_device(), np.r_[np.full(95, 0.84 * cores), np.zeros(5)], cores, rng),
                  f"the course at 84% of {cores} cores, idle over the last 5 samples (a mean of 79.8%; 80.6% without "
                  "its last sample)"))
    cases.append((_timeline(quiet_device(), np.r_[np.zeros(5), np.full(95, 0.84 * cores)], cores, rng),
                  f"the course idle over the first 5 samples, then at 84% of {cores} cores (a mean of 79.8%; 80.6% "
                  "without its first sample)"))
    spike = np.r_[np.zeros(45), np.ones(10), np.zeros(45)]                 # 10 samples in the middle
    cases.append((_timeline(83.4 + 16.6 * spike, one_thread(2), 2, rng),
                  "a device 83.4% busy, 100% over 10 samples in the middle of the run (a mean of 85.06%; a 10% "
                  "trimmed mean of 83.4%)"))
    cases.append((_timeline(quiet_device(), cores * (0.782 + 0.218 * spike), cores, rng),
                  f"the course at 78.2% of {cores} cores, every core over 10 samples in the middle of the run (a mean "
                  "of 80.4%; a 10% trimmed mean of 78.2%)"))
    cases.append((_timeline(quiet_device(), cores * np.tile([1.0, 0.58], n // 2), cores, rng),
                  f"the course at 100% and 58% of {cores} cores in turn, sample by sample (a mean of 79%; every other "
                  "sample reads 100%)"))
    cases.append((_timeline(quiet_device(), cores * np.tile([0.58, 1.0], n // 2), cores, rng),
                  f"the course at 58% and 100% of {cores} cores in turn, sample by sample (a mean of 79%; every other "
                  "sample, from the second, reads 100%)"))
    groups.append(("judges the whole run (means over every sample)",
                   "average gpu_util and ours_cores over all the samples, the first and the last included: not the "
                   "peak, the median, a trimmed mean, one sample, the middle of the run, nor a part of it (x[1:], "
                   "x[:-1] or x[::2] leave samples out)", cases))
    return groups


# Parts of the run a learner may average instead of every sample (w2-01): (how it reads, the slice).
_LAST = "[:-1] (or [:-2], ...: the last samples left out)"
_SUBSETS = [("[1:] (the first sample left out)", lambda x: x[1:]),
            (_LAST, lambda x: x[:-1]), (_LAST, lambda x: x[:-2]), (_LAST, lambda x: x[:-5]),
            ("[1:-1] (the first and the last sample left out)", lambda x: x[1:-1]),
            ("[::2] (every other sample)", lambda x: x[::2]), ("[1::2] (every other sample)", lambda x: x[1::2])]


def _trimmed(x, share=0.1):
    k = int(len(x) * share)
    return np.mean(np.sort(x)[k: len(x) - k])


# Other statistics in place of the mean: not named (the group's hint lists them), but a candidate
# that gives the same answers as one of them is not named either.
_OTHER_STATISTICS = [np.median, np.max, _trimmed, lambda x: np.mean(x[len(x) // 4: len(x) - len(x) // 4]),
                     lambda x: x[-1], lambda x: x[0]]
# Their names, for 1.3's hints (w5-01); 1.4's group hint names them already
_STATISTIC_NAMES = ["the median", "the peak (the largest sample)", "a trimmed mean", "the mean of the middle half",
                    "the last sample (what a live monitor shows at the end)", "the first sample"]


def _named_slip(records, candidates):
    """The hint of the one candidate rule that gives the learner's answer on every input the check
    handed it (`records`: (input, answer) pairs), or None when none does, or candidates with other
    hints (or none) do too: a slip named from the answers themselves, only where they single it out."""
    matching = []
    for rule, hint, *prop in candidates:       # (rule, hint) or (rule, hint, the property it breaks)
        try:
            if all(rule(x) == answer for x, answer in records):
                matching.append((hint, prop[0] if prop else None))
        except Exception:                      # a candidate that cannot read some input explains nothing
            continue
    return matching[0] if len({h for h, _ in matching}) == 1 and matching[0][0] is not None else (None, None)


def _diagnosis_slips():
    """Rules a learner may write instead of 1.3's, each with the hint that names it."""
    import os

    def rule(device=lambda tl: np.mean(tl.gpu_util), course=lambda tl: np.mean(tl.ours_cores),
             cores=lambda tl: OURS_SHARE * tl.cores):
        def diagnose_(tl):
            if float(device(tl)) >= DEVICE_BUSY:
                return "compute-bound"
            return "input-bound" if float(course(tl)) >= cores(tl) else "sync-bound"
        return diagnose_
    machine = os.cpu_count() or 1
    slips = [(rule(cores=lambda tl: OURS_SHARE),
              "yours answers as if it compared the course's cores with 0.8: the rule compares them with 0.8 x "
              "timeline.cores (0.8 alone is 80% of one core)"),
             (rule(cores=lambda tl: OURS_SHARE * (tl.cores - 1)),
              "yours answers as if it compared the course's cores with 0.8 x (timeline.cores - 1): the rule counts "
              "every core of the machine, 0.8 x timeline.cores"),
             (rule(cores=lambda tl: int(OURS_SHARE * tl.cores)),
              "yours answers as if the threshold were cut to whole cores (int(0.8 x timeline.cores): 1 core on a "
              "2-core machine): compare with 0.8 x timeline.cores as it is, 1.6 cores on 2",
              "uses the thresholds as specified"),
             (rule(cores=lambda tl: round(OURS_SHARE * tl.cores)),
              "yours answers as if the threshold were rounded to whole cores (round(0.8 x timeline.cores)): compare "
              "with 0.8 x timeline.cores as it is", "uses the thresholds as specified"),
             (rule(cores=lambda tl: OURS_SHARE * machine),
              f"yours answers as if it read the cores of the machine running the check (os.cpu_count() = {machine}): "
              "the timeline was recorded elsewhere, on timeline.cores cores; compare with 0.8 x timeline.cores")]
    # w5-01: utilisation read as a fraction (answers 'compute-bound' for every timeline): the unit named
    slips.append((rule(device=lambda tl: 100 * np.mean(tl.gpu_util)),
                  "yours answers as if timeline.gpu_util were a fraction (compared with 0.85): it is in percent, "
                  "0 to 100; compare its mean with 85"))
    # w5-01: a fixed core count (the examples' 8 cores, say) in place of timeline.cores
    for k in (2, 4, 8, 16, 32):
        if k not in (_first_cores(machine), machine):     # those two are named below and above
            slips.append((rule(cores=lambda tl, k=k: OURS_SHARE * k),
                          f"yours answers as if every timeline had {k} cores: read timeline.cores from the timeline "
                          f"passed in (the machine it was recorded on), and compare with 0.8 x timeline.cores"))
    # w4-01: the first timeline's cores kept for every later one (its core count is never this machine's)
    first = _first_cores(machine)
    slips.append((rule(cores=lambda tl: OURS_SHARE * first),
                  f"yours answers as if every timeline had {first} cores, as the first one the check handed it "
                  "had: read timeline.cores from the timeline passed in, on every call (nothing kept from an "
                  "earlier call)", "keeps nothing from an earlier call"))
    for what, part in _SUBSETS:
        slips.append((rule(device=lambda tl, part=part: np.mean(part(tl.gpu_util)),
                           course=lambda tl, part=part: np.mean(part(tl.ours_cores))),
                      f"yours answers as if it averaged gpu_util{what} and ours_cores{what}: every sample counts, "
                      "the first and the last included"))
        slips.append((rule(device=lambda tl, part=part: np.mean(part(tl.gpu_util))),
                      f"yours answers as if it averaged gpu_util{what}: every sample counts, the first and the last "
                      "included"))
        slips.append((rule(course=lambda tl, part=part: np.mean(part(tl.ours_cores))),
                      f"yours answers as if it averaged ours_cores{what}: every sample counts, the first and the last "
                      "included"))
    for stat, name in zip(_OTHER_STATISTICS, _STATISTIC_NAMES):
        # w5-01: the peak and the last sample got the generic hint; each statistic named (one hint for any
        # reading it was applied to, so that a rule matching on both readings and on one is still named)
        hint = (f"yours answers as if it took {name} of the readings (gpu_util, ours_cores), where the rules "
                "average every sample over the run (np.mean)") if name else None
        slips += [(rule(device=lambda tl, stat=stat: stat(tl.gpu_util), course=lambda tl, stat=stat: stat(tl.ours_cores)),
                   hint, "judges the whole run (means over every sample)"),
                  (rule(device=lambda tl, stat=stat: stat(tl.gpu_util)), hint, "judges the whole run (means over every sample)"),
                  (rule(course=lambda tl, stat=stat: stat(tl.ours_cores)), hint,
                   "judges the whole run (means over every sample)")]
    return slips


@exercise("1.3", "Diagnose recorded utilisation timelines", points=2)
def check_diagnose(diagnose):
    expect_callable(diagnose, "a function diagnose(timeline) -> 'input-bound' | 'compute-bound' | 'sync-bound'")
    rng, seed = fresh_rng()
    groups = _diagnosis_groups(rng)
    answers, failures, total, records = Counter(), [], 0, []
    for prop, hint, cases in groups:
        wrong = []
        for timeline, what in cases:
            expected = _reference_diagnosis(timeline)
            snap = (timeline.gpu_util.copy(), timeline.ours_cores.copy(), timeline.cpu_percent.copy())
            with calling(f"diagnose(timeline) on {what}"):
                answer = diagnose(timeline)
            total += 1
            if not isinstance(answer, str) or answer not in TIMELINE_KINDS:
                raise CheckFailed("answers one of the three labels",
                                  f"yours returned {answer!r} for {what}; expected one of {', '.join(TIMELINE_KINDS)}")
            if not all(trusted.array_equal(a, b) for a, b in zip(snap, (timeline.gpu_util, timeline.ours_cores,
                                                                        timeline.cpu_percent))):
                raise CheckFailed("leaves the timeline unchanged", f"the timeline ({what}) was modified by your function",
                                  "read the arrays; np.mean, np.median and comparisons do not change them")
            answers[answer] += 1
            records.append((timeline, answer))
            if answer != expected:
                ours = float(np.mean(timeline.ours_cores))
                wrong.append(f"{what} (device {float(np.mean(timeline.gpu_util)):.1f}%, the course {ours:.2f} of "
                             f"{timeline.cores} cores, {ours / timeline.cores:.1%}; every process "
                             f"{float(np.mean(timeline.cpu_percent)):.0f}%) -> yours '{answer}', expected '{expected}'")
        if wrong:
            failures.append((prop, hint, wrong))
    if len(answers) == 1:
        named, _ = _named_slip(records, _diagnosis_slips())
        raise CheckFailed("tells the situations apart", f"yours always answers '{next(iter(answers))}'", named or "")
    if failures:
        prop, hint, wrong = failures[0]
        shown = "; ".join(wrong[:2]) + (f"; and {len(wrong) - 2} more" if len(wrong) > 2 else "")
        named, named_prop = _named_slip(records, _diagnosis_slips())
        raise CheckFailed(named_prop or prop, f"{shown} (seed {seed})", named or hint)
    return f"{total} timelines diagnosed correctly (shared machines, thresholds and whole runs included)."


# ===========================================================================================
# 1.4 I/O-, CPU- or device-bound? (issue 14: "Is it I/O?"; the runs come from course_utils.io_probe)
# ===========================================================================================

def _reference_run_kind(run) -> str:
    if run.stall_fraction < 0.10:
        return "device-bound"
    possible = min(run.loader_processes, run.usable_cores)
    return "cpu-bound" if float(np.mean(run.loader_cores)) >= 0.8 * possible else "io-bound"


def _loader_forms(lc, possible):
    return [(np.mean(lc), OURS_SHARE * possible), (np.mean(lc) / possible, OURS_SHARE),
            (np.mean(lc / possible), OURS_SHARE), (float(np.mean(lc)), 0.8 * possible),
            (statistics.mean(lc.tolist()), OURS_SHARE * possible), (sum(lc.tolist()) / len(lc) / possible, OURS_SHARE)]


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
    groups.append(("device-bound when the loop rarely waits for data",
                   "a loop that waits for data less than 10% of the time is paced by the device, whatever the "
                   "loader and the disk are doing: test stall_fraction first", cases))
    cases = []
    c = cores()
    cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.91, 1.0), loader_processes=1, cores=c,
                      disk_mb_s=rng.uniform(1, 20), util=rng.uniform(0, 20), jitter=0.02),
                  f"num_workers=0: one process decoding on a machine of {c} cores"))
    c = int(rng.choice([2, 4, 8]))
    cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.91, 1.0), loader_processes=4 * c + 1, cores=c,
                      disk_mb_s=rng.uniform(50, 300), util=rng.uniform(95, 100), iowait=rng.uniform(1, 4), jitter=0.02),
                  f"{4 * c} workers on {c} cores, the SSD never idle (%util ~100)"))
    c = int(rng.choice([4, 8, 16]))
    cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.91, 1.0), loader_processes=3, cores=c,
                      disk_mb_s=rng.uniform(100, 300), util=rng.uniform(80, 100), iowait=rng.uniform(6, 12), jitter=0.02),
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
    c = int(rng.choice([8, 16]))        # w3-01: 3 loading processes (the main one and 2 workers), not 2
    cases.append((run(stall=rng.uniform(0.3, 0.9), loader_use=rng.uniform(0.58, 0.66), loader_processes=3, cores=c,
                      disk_mb_s=rng.uniform(100, 300), util=rng.uniform(40, 80), jitter=0.01),
                  f"2 workers (3 loading processes with the main one) on {c} cores keeping 1.7-2.0 cores busy: "
                  f"58-66% of the 3 cores they could use"))
    groups.append(("I/O-bound when the loading processes wait instead of computing",
                   "if the loop waits and the loaders are not busy computing, they are waiting for reads: iowait "
                   "averaged over many cores is small, and hidden when other programs use the CPUs", cases))
    # w3-01: a container (a CPU quota or an affinity mask) on a big machine: its loaders could use
    # run.usable_cores, fewer than the machine's cores (run.cpu_busy's columns)
    cases = []
    for usable, machine, processes in ((int(rng.choice([2, 4])), int(rng.choice([16, 32])), 9),
                                       (int(rng.choice([4, 6])), int(rng.choice([32, 64])), 13)):
        share = float(rng.uniform(0.91, 0.97))      # clear of every threshold slip (0.7, 0.9, rounding)
        cases.append((_on_a_bigger_machine(run(stall=rng.uniform(0.3, 0.9), loader_use=share, loader_processes=processes,
                                               cores=usable, disk_mb_s=rng.uniform(50, 200), util=rng.uniform(20, 60),
                                               jitter=0.01), machine, rng),
                      f"{processes - 1} workers in a container allowed {usable} of its machine's {machine} cores, "
                      f"keeping {100 * share:.0f}% of those {usable} busy"))
    groups.append(("reads the cores the run's machine let the loaders use (run.usable_cores)",
                   "a container or a CPU quota lets the loaders use run.usable_cores, fewer than the machine's cores "
                   "(run.cpu_busy has a column per core of the machine): they could use min(run.loader_processes, "
                   "run.usable_cores)", cases))
    # the thresholds, on both sides and on the edge; every loader statistic agrees in these runs
    cases = []
    for low, high in ((0.085, 0.0949), (0.095, 0.0995), (0.0996, 0.09999), (0.10, 0.10), (0.10001, 0.1004),
                      (0.1005, 0.1049), (0.105, 0.13)):
        c = int(rng.choice([2, 4, 8]))
        stall = low if low == high else float(rng.uniform(low, high))
        what = "exactly 10%" if low == high else f"{100 * low:g}-{100 * high:g}%"
        cases.append((run(stall=stall, loader_use=rng.uniform(0.9, 0.98), loader_processes=c + 1, cores=c, jitter=0.002,
                          disk_mb_s=5, util=rng.uniform(0, 30)),
                      f"a loop that waits for data {what} of the time, loaders busy"))
    # w4-01: a mean just below 0.8 x 3 = 2.4 cores, which float16 (spacing 1/512 there) rounds up past it
    c = int(rng.choice([4, 8]))
    share = float(rng.uniform(0.79983, 0.79997))
    made = run(stall=rng.uniform(0.3, 0.9), loader_use=share, loader_processes=3, cores=c, jitter=0.0, disk_mb_s=100,
               util=40)
    made.loader_cores = 3 * _flat(rng, share, len(made.loader_cores), 1e-6)
    cases.append((made, f"2 workers on {c} cores, using {100 * share:.3f}% of the 3 cores they could (just below 80%)"))
    for processes, c in ((5, 8), (10, 16), (6, 5), (20, 32)):    # exactly 0.8 x min(loader_processes, usable_cores)
        possible = min(processes, c)
        lc = _exactly(OURS_SHARE * possible, 60, _loader_forms, possible)
        made = run(stall=rng.uniform(0.3, 0.9), loader_use=OURS_SHARE, loader_processes=processes, cores=c, jitter=0.0,
                   disk_mb_s=100, util=40, samples=len(lc))
        made.loader_cores = lc
        cases.append((made, f"{processes - 1} workers on {c} cores, using exactly 80% of the {possible} cores they could"))
    for low, high in ((0.5, 0.7), (0.7, 0.79), (0.79, 0.7949), (0.795, 0.7999), (0.8001, 0.8049), (0.805, 0.81),
                      (0.81, 0.86)):
        c = int(rng.choice([2, 4, 8]))
        share = float(rng.uniform(low, high))
        made = run(stall=rng.uniform(0.3, 0.9), loader_use=share, loader_processes=c + 1, cores=c, disk_mb_s=200,
                   util=50, jitter=0.0)
        made.loader_cores = c * _flat(rng, share, len(made.loader_cores), abs(share - OURS_SHARE) / 4)
        cases.append((made, f"loaders at {100 * low:g}-{100 * high:g}% of the cores they could use"))
    groups.append(("uses the thresholds as specified",
                   "device-bound below a stall fraction of 0.10 (0.10 itself is not below it); CPU-bound from "
                   "0.8 x min(loader_processes, usable_cores) cores on (exactly 0.8 x included); compare the "
                   "figures as they are, not rounded", cases))
    # the whole run: runs whose statistics disagree, and whose start and end differ from their middle
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
    n = 60

    def shaped(share, what, c=None):
        c = c or int(rng.choice([2, 4, 8]))
        made = run(stall=rng.uniform(0.3, 0.9), loader_use=float(np.mean(share)), loader_processes=c + 1, cores=c,
                   disk_mb_s=150, util=40, samples=len(share))
        made.loader_cores = np.asarray(share, dtype=float) * c
        cases.append((made, what))

    def mixed(*value_counts):
        x = np.concatenate([np.full(k, v) for v, k in value_counts])
        rng.shuffle(x)
        return x
    shaped(mixed((0.9, 36), (0.6, 24)), "loaders at 90% in 36 samples, 60% in 24 (a mean of 78%, a median of 90%)")
    shaped(mixed((0.75, 36), (0.95, 24)), "loaders at 75% in 36 samples, 95% in 24 (a mean of 83%, a median of 75%)")
    middle = np.r_[np.zeros(15), np.ones(30), np.zeros(15)]
    shaped(0.1 + 0.85 * middle, "loaders at 95% over the middle half of the run, 10% over its start and end (a mean of 52.5%)")
    shaped(1.0 - 0.3 * middle, "loaders at 100% over the start and end of the run, 70% over its middle half (a mean of 85%)")
    shaped(np.r_[np.zeros(6), np.full(54, 0.87)], "loaders idle over the first 6 samples, then at 87% (a mean of 78.3%)")
    shaped(np.r_[np.full(53, 0.79), np.full(7, 1.0)], "loaders at 79%, then at 100% over the last 7 samples (a mean of 81.5%)")
    # every sample, the first and the last too (w2-01: x[1:], x[:-1], x[1:-1], x[:-2] passed, x[::2] on some
    # seeds): runs whose first or last sample alone, or every other sample, moves the mean across 80%
    shaped(np.r_[np.zeros(5), np.full(55, 0.865)],
           "loaders idle over the first 5 samples, then at 86.5% (a mean of 79.3%; 80.6% without the first sample)")
    shaped(np.r_[np.full(55, 0.865), np.zeros(5)],
           "loaders at 86.5%, idle over the last 5 samples (a mean of 79.3%; 80.6% without the last sample)")
    shaped(np.r_[np.full(5, 1.0), np.full(55, 0.7836)],
           "loaders at 100% over the first 5 samples, then at 78.4% (a mean of 80.2%; 79.8% without the first sample)")
    shaped(np.r_[np.full(55, 0.7836), np.full(5, 1.0)],
           "loaders at 78.4%, then at 100% over the last 5 samples (a mean of 80.2%; 79.8% without the last sample)")
    shaped(np.tile([1.0, 0.58], n // 2),
           "loaders at 100% and 58% in turn, sample by sample (a mean of 79%; every other sample reads 100%)")
    shaped(np.tile([0.58, 1.0], n // 2),
           "loaders at 58% and 100% in turn, sample by sample (a mean of 79%; every other sample, from the second, "
           "reads 100%)")
    groups.append(("judges the whole run (means over the samples)",
                   "average run.loader_cores over all its samples, the first and the last included: not its peak, "
                   "median, a trimmed mean, the middle of the run, one sample, nor a part of it (x[1:], x[:-1] or "
                   "x[::2] leave samples out)", cases))
    # w6-01: samples above the cap (one process with helper threads showed 1.2-1.5 cores in this
    # lesson's runs): the mean is taken as recorded; clipping each sample to the cap first lowers it
    # below 80% in every one of these runs, whose mean is at or above it
    cases = []
    for processes, c, high, low in ((1, int(rng.choice([2, 4, 16])), 1.5, 0.2), (3, 2, 2.6, 1.0),
                                    (2, int(rng.choice([4, 8])), 2.9, 0.5)):
        possible = min(processes, c)
        made = run(stall=rng.uniform(0.3, 0.9), loader_use=0.85, loader_processes=processes, cores=c, disk_mb_s=100,
                   util=40, jitter=0.0)
        made.loader_cores = np.tile([high, low], len(made.loader_cores) // 2).astype(float)
        mean, clipped = (high + low) / 2, (min(high, possible) + low) / 2
        cases.append((made, f"{processes} loading process{'es' if processes > 1 else ''} on {c} cores at {high:g} and "
                            f"{low:g} cores in turn (a mean of {mean:g} cores, {mean / possible:.0%} of the {possible} "
                            f"they could use; {clipped / possible:.0%} if each sample is first cut to {possible})"))
    groups.append(("averages run.loader_cores as recorded",
                   "average run.loader_cores as they are, without cutting any sample to the cap: a process with "
                   "helper threads can show more than one core in a sample, and that demand counts; the cap, "
                   "min(run.loader_processes, run.usable_cores), is only what the mean is compared with", cases))
    cases = [(synthetic_run(kind, rng, name=f"run {int(rng.integers(1000))}"), f"a typical {kind} run")
             for kind in RUN_KINDS for _ in range(3)]
    groups.append(("classifies typical runs", "", cases))
    return groups


def _on_a_bigger_machine(run, machine, rng):
    """The run as recorded in a container on a machine of `machine` cores: its per-core figures
    gain the machine's other cores (nearly idle), run.usable_cores stays what the container allowed."""
    extra = machine - run.cpu_busy.shape[1]
    n = run.cpu_busy.shape[0]
    run.cpu_busy = np.concatenate([run.cpu_busy, np.clip(rng.normal(3, 1.5, (n, extra)), 0, 100)], axis=1)
    run.iowait = np.concatenate([run.iowait, np.zeros((n, extra))], axis=1)
    return run


def _snapshot_run(run):
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in vars(run).items()}


def _same_run(run, snap) -> bool:
    now = vars(run)
    if now.keys() != snap.keys():
        return False
    for k, v in snap.items():
        if isinstance(v, np.ndarray):
            if not isinstance(now[k], np.ndarray) or now[k].shape != v.shape or not trusted.array_equal(now[k], v):
                return False
        elif now[k] != v:
            return False
    return True


def _run_slips():
    """Rules a learner may write instead of 1.4's, each with the hint that names it."""
    import os

    def rule(used=lambda r: np.mean(r.loader_cores), could=lambda r: min(r.loader_processes, r.usable_cores),
             stall=lambda r: r.stall_fraction):
        def classify_(r):
            if stall(r) < 0.10:
                return "device-bound"
            return "cpu-bound" if float(used(r)) >= OURS_SHARE * could(r) else "io-bound"
        return classify_
    machine = os.cpu_count() or 1
    rounding = ("yours answers as if it rounded the figures before comparing them (round(stall_fraction, 1) makes "
                "0.05 into 0.1, which is not below 0.10; a rounded mean of run.loader_cores can cross 0.8 x what the "
                "loaders could use): compare them as they are, not rounded")
    slips = [(rule(stall=lambda r, d=d: round(r.stall_fraction, d), used=used), rounding,
              "uses the thresholds as specified")
             for d in (1, 2) for used in (lambda r: np.mean(r.loader_cores),
                                          lambda r: round(float(np.mean(r.loader_cores)), 1))]

    def float16_mean(r):       # compared in float16 too (NumPy 2 keeps a Python float's threshold in float16)
        if r.stall_fraction < 0.10:
            return "device-bound"
        mean = np.mean(np.asarray(r.loader_cores).astype(np.float16))
        return "cpu-bound" if mean >= OURS_SHARE * min(r.loader_processes, r.usable_cores) else "io-bound"
    float16 = ("yours answers as if it averaged run.loader_cores in float16, which keeps about 3 significant "
               "digits (2.3996 cores becomes 2.4004, past 0.8 x 3 = 2.4): compute the mean in float64 (or "
               "float32), as NumPy does by default")
    slips += [(rule(used=lambda r: np.mean(r.loader_cores.astype(np.float16))), float16,      # w4-01
               "uses the thresholds as specified"), (float16_mean, float16, "uses the thresholds as specified")]
    slips += [(rule(could=lambda r: 1),
              "yours answers as if the loaders could use one core: they could use min(run.loader_processes, "
              "run.usable_cores), one core per loading process at most, and no more than the machine's"),
             (rule(could=lambda r: min(r.loader_processes, machine)),
              f"yours answers as if it read the cores of the machine running the check (os.cpu_count() = {machine}): "
              "the run was recorded elsewhere; its machine let the loaders use run.usable_cores"),
             (rule(could=lambda r: machine),
              f"yours answers as if it read the cores of the machine running the check (os.cpu_count() = {machine}): "
              "the loaders could use min(run.loader_processes, run.usable_cores)"),
             (rule(could=lambda r: min(r.loader_processes, r.cpu_busy.shape[1])),
              "yours answers as if the loaders could use every core of the run's machine (run.cpu_busy.shape[1]): "
              "a container or a CPU quota allows them run.usable_cores, which can be fewer"),
             (rule(stall=lambda r: r.stall_fraction / 100),         # w5-01: compared with 10 (percent)
              "yours answers as if run.stall_fraction were a percentage (compared with 10): it is a fraction, 0 "
              "to 1; device-bound below 0.10"),
             (rule(could=lambda r: r.loader_processes),              # w5-01: not capped at the usable cores
              "yours answers as if the loaders could use one core per loading process, however few cores the "
              "machine lets them have (8 workers on 2 cores can use 2, not 9): cap it, min(run.loader_processes, "
              "run.usable_cores)"),
             (rule(could=lambda r: r.usable_cores),
              "yours answers as if the loaders could use every usable core: a loading process uses one core at "
              "most (one process on 16 cores can use 1): min(run.loader_processes, run.usable_cores)"),
             (rule(could=lambda r: min(r.loader_processes - 1, r.usable_cores) or 1),
              "yours answers as if only the workers loaded: run.loader_processes already counts every loading "
              "process, the main one and its num_workers workers (1 + num_workers): use it as it is")]
    slips.append((rule(used=lambda r: np.mean(np.minimum(r.loader_cores, min(r.loader_processes, r.usable_cores)))),
                  "yours answers as if it cut each sample of run.loader_cores to min(run.loader_processes, "
                  "run.usable_cores) before averaging: average the samples as recorded (a process with helper "
                  "threads can show more than one core, and that demand counts); the cap is only what the mean is "
                  "compared with", "averages run.loader_cores as recorded"))     # w6-01
    for what, part in _SUBSETS:
        slips.append((rule(used=lambda r, part=part: np.mean(part(r.loader_cores))),
                      f"yours answers as if it averaged run.loader_cores{what}: every sample counts, the first and "
                      "the last included"))
    slips += [(rule(used=lambda r, stat=stat: stat(r.loader_cores)), None) for stat in _OTHER_STATISTICS]
    return slips


@exercise("1.4", "I/O-, CPU- or device-bound? Classify recorded runs", points=2)
def check_classify_run(classify_run):
    expect_callable(classify_run, "a function classify_run(run) -> 'io-bound' | 'cpu-bound' | 'device-bound'")
    from ..io_probe import RUN_KINDS

    rng, seed = fresh_rng()
    groups = _run_cases(rng)
    answers, failures, records = Counter(), [], []
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
            records.append((run, answer))
            if answer != expected:
                wrong.append(f"{what} -> yours '{answer}', expected '{expected}'")
        if wrong:
            failures.append((prop, hint, wrong))
    if len(answers) == 1:
        named, _ = _named_slip(records, _run_slips())
        raise CheckFailed("tells the runs apart", f"yours always answers '{next(iter(answers))}'", named or "")
    if failures:
        prop, hint, wrong = failures[0]
        shown = "; ".join(wrong[:3]) + ("; ..." if len(wrong) > 3 else "")
        named, named_prop = _named_slip(records, _run_slips())
        raise CheckFailed(named_prop or prop, f"{shown} (seed {seed})", named or hint)
    total = sum(len(cases) for _, _, cases in groups)
    return f"{total} recorded runs classified correctly."
