"""How a check runs, reports and records (the machinery behind `check("N.M", obj)`).

A check function tests *properties* of what the learner wrote on fresh, seeded inputs and
raises `CheckFailed(property, detail, hint)` at the first property that does not hold. This
module turns that into one of four outcomes:

    pass             every property held
    fail             a property did not hold (or the object has the wrong type)
    not_implemented  the learner's code still raises NotImplementedError (the stub)
    error            the learner's code raised something else (its message and line are shown)

Each outcome is printed as one readable sentence, appended as a JSON line to the file named by
env `COURSE_RESULTS` (when set), and with `COURSE_STRICT=1` anything but a pass raises.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["CheckFailed", "WrongType", "CheckError", "CheckResult", "exercise", "check", "run_check",
           "expect_callable", "expect_class", "close", "list_exercises"]

_REGISTRY: dict[str, "_Exercise"] = {}
DEFAULT_TIME_LIMIT_S = 300


class CheckFailed(Exception):
    """A property of the learner's code that does not hold."""

    def __init__(self, prop: str, detail: str = "", hint: str = ""):
        super().__init__(prop)
        self.prop, self.detail, self.hint = prop, detail, hint

    def sentence(self) -> str:
        out = f"property '{self.prop}' does not hold"
        if self.detail:
            out += f": {self.detail}"
        if self.hint:
            out += f". Hint: {self.hint}"
        return out


class WrongType(CheckFailed):
    """The learner handed the check something of the wrong kind."""

    def sentence(self) -> str:
        return self.detail


class CheckError(AssertionError):
    """Raised by `check()` under COURSE_STRICT=1 when the result is not a pass."""


@dataclass
class CheckResult:
    exercise: str
    status: str            # pass | fail | not_implemented | error
    points: int
    max_points: int
    message: str
    notebook: str | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def line(self) -> str:
        icon = {"pass": "PASS", "fail": "FAIL", "not_implemented": "TODO", "error": "ERROR"}[self.status]
        return f"[{icon}] Exercise {self.exercise} ({self.points}/{self.max_points} points): {self.message}"


@dataclass
class _Exercise:
    id: str
    title: str
    points: int
    fn: object
    time_limit_s: float


def exercise(exercise_id: str, title: str, *, points: int = 1, time_limit_s: float = DEFAULT_TIME_LIMIT_S):
    """Register a check function for exercise `exercise_id` ("N.M")."""
    def register(fn):
        _REGISTRY[exercise_id] = _Exercise(exercise_id, title, points, fn, time_limit_s)
        return fn
    return register


def _lesson_module(exercise_id: str) -> str:
    lesson = exercise_id.split(".", 1)[0]
    return f"{__package__}.lesson{int(lesson):02d}"


def _lookup(exercise_id: str) -> _Exercise:
    if not isinstance(exercise_id, str) or "." not in exercise_id:
        raise ValueError(f"an exercise id looks like '1.2'; got {exercise_id!r}")
    if exercise_id not in _REGISTRY:
        try:
            importlib.import_module(_lesson_module(exercise_id))
        except ModuleNotFoundError as exc:
            if exc.name != _lesson_module(exercise_id):
                raise
    if exercise_id not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "none loaded"
        raise ValueError(f"there is no exercise {exercise_id!r} (known: {known})")
    return _REGISTRY[exercise_id]


def list_exercises(lesson: int) -> list[str]:
    """Exercise ids registered for a lesson."""
    importlib.import_module(_lesson_module(f"{lesson}.0"))
    return sorted(k for k in _REGISTRY if int(k.split(".")[0]) == lesson)


# -- type guards with clear sentences ---------------------------------------------------------

def expect_callable(obj, what: str) -> None:
    """Fail with a sentence when `obj` is not callable (`what` describes what was expected)."""
    if not callable(obj):
        raise WrongType("type", f"expected {what}, but got {_describe(obj)}. Pass the function itself "
                        "(its name, without calling it).")


def expect_class(obj, what: str) -> None:
    if not isinstance(obj, type):
        raise WrongType("type", f"expected {what} (a class), but got {_describe(obj)}. Pass the class itself.")


def _describe(obj) -> str:
    if obj is None:
        return "None (did the cell above forget to return or define it?)"
    text = repr(obj)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"an object of type {type(obj).__name__}: {text}"


def close(yours, expected, *, rtol: float = 0.0, atol: float = 0.0) -> bool:
    """abs(yours - expected) <= atol + rtol * abs(expected), for numbers."""
    return abs(float(yours) - float(expected)) <= atol + rtol * abs(float(expected))


# -- running one check --------------------------------------------------------------------------

@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise TimeoutError in the main thread after `seconds` (no-op off the main thread / Windows)."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable or not seconds:
        yield
        return

    def on_alarm(signum, frame):
        raise TimeoutError(f"the check did not finish within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _learner_line(exc: BaseException) -> str:
    """Where in the learner's code the exception came from (the last frame outside course_utils)."""
    frames = traceback.extract_tb(exc.__traceback__)
    pkg = str(Path(__file__).resolve().parent.parent)
    for frame in reversed(frames):
        if not str(Path(frame.filename).resolve()).startswith(pkg) and "site-packages" not in frame.filename:
            where = frame.filename if not frame.filename.startswith("<") else "your cell"
            return f" (at line {frame.lineno} of {where}: `{(frame.line or '').strip()}`)"
    return ""


def run_check(exercise_id: str, obj, **kwargs) -> CheckResult:
    """Run a check and return its result (records it, but prints nothing)."""
    spec = _lookup(exercise_id)
    t0 = time.perf_counter()
    try:
        with _time_limit(spec.time_limit_s):
            message = spec.fn(obj, **kwargs) or "all properties hold."
        status = "pass"
    except NotImplementedError:
        status = "not_implemented"
        message = ("not implemented yet: replace `raise NotImplementedError` in the exercise cell "
                   "with your code, run that cell, then run this one again.")
    except CheckFailed as exc:
        status, message = "fail", exc.sentence()
    except TimeoutError as exc:
        status, message = "error", f"{exc}: does your code loop forever or wait on something that never comes?"
    except Exception as exc:  # the learner's code broke
        status = "error"
        message = f"your code raised {type(exc).__name__}: {exc}{_learner_line(exc)}"
    result = CheckResult(exercise_id, status, spec.points if status == "pass" else 0, spec.points,
                         message, os.environ.get("COURSE_NOTEBOOK"), round(time.perf_counter() - t0, 3))
    _record(result)
    return result


def check(exercise_id: str, obj, **kwargs) -> None:
    """Grade exercise `exercise_id` on `obj` and print the verdict (the notebooks' check cells)."""
    result = run_check(exercise_id, obj, **kwargs)
    print(result.line())
    sys.stdout.flush()
    if os.environ.get("COURSE_STRICT") == "1" and not result.passed:
        raise CheckError(result.line())


def _record(result: CheckResult) -> None:
    path = os.environ.get("COURSE_RESULTS")
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(asdict(result)) + "\n")
