"""Run a learner's answer again after its check, within the check's own time limit.

A lesson uses the learner's answer once more after its check cell ("your function at work").
A check gives up after its fitted time limit (`_core.TIME_LIMITS_S`, or the limit the check
names); the cell after it must not wait longer, or an answer that loops forever, which its check
already stopped in seconds, hangs the lesson (and the grader, until its cell timeout, 15 minutes).
So every such cell runs the learner's code inside `within_check_limit`:

    from course_utils.checks import OverCheckLimit, within_check_limit

    try:
        with within_check_limit("1.2", "your stall_fraction"):
            yours = stall_fraction(log)
        print(f"... {yours:.1%} ...")
    except NotImplementedError:
        print("Exercise 1.2 is not done yet: ...")
    except OverCheckLimit as stop:
        print(f"{stop}; the course's StepStats says ...")      # one sentence, then the course's answer

`OverCheckLimit` derives from BaseException (as KeyboardInterrupt does), so an `except Exception`
in the learner's code does not swallow it; until the block ends it is raised again every second.
Course work the learner's code calls does not count: `with within_check_limit("1.1", "your time_it")
as bound: time_it(bound.excluded(step), device)` stops the countdown while `step` runs.
`call_within_check_limit("1.2", fn, *args, **kwargs)` is the same for one call. The limit is the
check's own (`check_time_limit("1.2")`), so a cell stops an answer exactly when its check would.

It works where the checks' own limit works: in the main thread of a process on a system with
`signal.setitimer` (Linux, macOS: every Jupyter kernel). Elsewhere the block runs unbounded.
An alarm already set (an enclosing `within_check_limit`, a check's limit) is kept: the shorter one
fires, and the outer one is re-armed with what is left of it afterwards.

Introduced for issue 35 (lessons 00-03, 06 and 08 use it).
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time

from ._core import _lookup

__all__ = ["OverCheckLimit", "CheckLimit", "within_check_limit", "call_within_check_limit", "check_time_limit"]


class OverCheckLimit(BaseException):
    """The learner's code ran past its check's time limit in a lesson cell, and was stopped there.
    `str()` is the one sentence to print; `exercise` and `limit_s` say which limit."""

    def __init__(self, exercise: str, limit_s: float, what: str):
        self.exercise, self.limit_s, self.what = exercise, limit_s, what
        super().__init__(f"{what} did not finish within {limit_s:g} s, the time limit of check {exercise}, "
                         "and was stopped here")


def check_time_limit(exercise_id: str) -> float:
    """The time limit, in seconds, of exercise `exercise_id`'s check (the one its check cell uses)."""
    return _lookup(exercise_id).time_limit_s


def _usable() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


class CheckLimit:
    """What `within_check_limit` yields: `limit_s`, and `excluded(fn)`, a wrapper of a function of
    the course's that the learner's code calls (the training step a timer times): while it runs, the
    countdown stands still, so that the limit bounds the learner's own code, as in its check, and
    not the course's work around it (a CPU step that takes seconds on a busy machine)."""

    def __init__(self, limit_s: float, armed: bool):
        self.limit_s, self._armed = limit_s, armed

    def excluded(self, fn):
        if not self._armed:
            return fn

        def course_work(*args, **kwargs):
            left, interval = signal.getitimer(signal.ITIMER_REAL)
            if not left:
                return fn(*args, **kwargs)
            signal.setitimer(signal.ITIMER_REAL, 0)
            try:
                return fn(*args, **kwargs)
            finally:
                signal.setitimer(signal.ITIMER_REAL, left, interval)
        course_work.__wrapped__ = fn
        return course_work


@contextlib.contextmanager
def within_check_limit(exercise_id: str, what: str = "your code", *, limit_s: float | None = None):
    """The block may run for as long as exercise `exercise_id`'s check may (`limit_s` overrides it,
    for tests); past that, `OverCheckLimit` is raised in it, and again every second until it ends.
    Yields a `CheckLimit` (its `excluded(fn)` keeps the course's own work out of the count)."""
    limit = float(limit_s) if limit_s is not None else check_time_limit(exercise_id)
    if not _usable() or limit <= 0:
        yield CheckLimit(limit, False)
        return
    stop = OverCheckLimit(exercise_id, limit, what)
    outer_left, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()

    def on_alarm(signum, frame):
        if outer_left and time.monotonic() - started >= outer_left - 1e-3 and previous not in (None, signal.SIG_DFL,
                                                                                              signal.SIG_IGN):
            previous(signum, frame)            # the enclosing limit is the one that ran out
        raise stop

    previous = signal.signal(signal.SIGALRM, on_alarm)
    first = min(limit, outer_left) if outer_left else limit
    signal.setitimer(signal.ITIMER_REAL, first, 1.0)
    try:
        yield CheckLimit(limit, True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_left:
            left = outer_left - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), outer_interval)


def call_within_check_limit(exercise_id: str, fn, *args, what: str | None = None, **kwargs):
    """`fn(*args, **kwargs)` within exercise `exercise_id`'s check time limit (see `within_check_limit`);
    `what` names it in the sentence (default: "your <function name>")."""
    name = what or f"your {getattr(fn, '__name__', type(fn).__name__)}"
    with within_check_limit(exercise_id, name):
        return fn(*args, **kwargs)
