"""How a check runs, reports and records (the machinery behind `check("N.M", obj)`).

A check function tests *properties* of what the learner wrote on fresh, seeded inputs and
raises `CheckFailed(property, detail, hint)` at the first property that does not hold. This
module turns that into one of these outcomes:

    pass             every property held
    fail             a property did not hold (or the object has the wrong type)
    not_implemented  the learner's code still raises NotImplementedError (the stub)
    error            the learner's code raised something else (its message and line are shown)
    busy             not graded: a speed-graded check measured while other programs took too much
                     of the machine to judge speed (`MachineBusy`); the grader runs it again later

Each outcome is printed as one readable sentence, appended as a JSON line to the file named by
env `COURSE_RESULTS` (when set), and with `COURSE_STRICT=1` anything but a pass raises.

Every check has a time limit fitted to what the course's own answer needs (`TIME_LIMITS_S`,
measured; a check may name its own), and the sentence says which limit fired.

The functions the checks compare with (`torch.equal`, `np.array_equal`, ...: `COMPARED`) are
captured when this module is imported, before any learner code: checks compare through those
captured originals (`trusted`), and a check during or before which the learner's code replaced
one of them fails with a sentence saying so, and a review flag for the instructor
(`CheckResult.review`); the originals are put back.

While a check runs, the learner's code may not change the profiler (`sys.setprofile`, also through
ctypes): checks watch which functions the learner's code calls with it (`Tripwire`), so a check
during which it was changed fails with a sentence saying so. An audit hook (which no code can
remove) sees every change; it is installed when this module is imported, before any learner code.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import math
import os
import re
import signal
import sys
import sysconfig
import threading
import time
import traceback
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ._busy import MachineBusy
import numpy
import numpy.testing
import torch
import torch.testing

__all__ = ["CheckFailed", "WrongType", "CheckError", "CheckResult", "exercise", "check", "run_check",
           "expect_callable", "expect_class", "close", "list_exercises", "Tripwire", "TIME_LIMITS_S",
           "MachineBusy", "calling", "trusted", "COMPARED"]

_REGISTRY: dict[str, "_Exercise"] = {}
DEFAULT_TIME_LIMIT_S = 300

# Each check's time limit, fitted to what the course's own answer needs: (limit, what the answer's
# check took). Measured through the grader's checker (a forked process per check, as graded) on a
# 2-core CPU without a GPU, shared with other work (load average 7 to 23), the slowest of 6 runs
# (`python tests/unit/gradekit.py measure 00 01 ... 08`). A pure function gets 10 s (its check takes
# well under a second); a check that times, trains or builds a pipeline gets about 20 times what it
# took there (room for a slower machine, a GPU's start-up, a busier host). A check that names its own
# limit (`@exercise(..., time_limit_s=...)`: the speed-graded 2.2 and 8.1, 2.3's worker processes,
# 7.2-7.4's torchrun launches) keeps it.
TIME_LIMITS_S: dict[str, tuple[float, float]] = {
    "0.1": (10, 0.1),
    "1.1": (30, 0.8), "1.2": (10, 0.2), "1.3": (10, 0.2), "1.4": (10, 0.3),
    "2.1": (10, 0.2),
    "3.1": (60, 2.7), "3.2": (90, 4.5), "3.3": (150, 7.6),
    "4.1": (60, 2.8), "4.2": (60, 2.2), "4.3": (60, 1.8),
    "5.1": (120, 5.3), "5.2": (30, 0.3), "5.3": (30, 0.2), "5.4": (90, 4.4),
    "6.1": (10, 0.2), "6.2": (10, 0.2), "6.3": (10, 0.2),
    "7.1": (10, 0.2),
    "8.2": (10, 0.6),
}


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
    status: str            # pass | fail | not_implemented | error | busy (not graded: the machine was busy)
    points: int
    max_points: int
    message: str
    notebook: str | None = None
    seconds: float = 0.0
    review: list = field(default_factory=list)   # for the instructor: what the submission tampered with

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def line(self) -> str:
        icon = {"pass": "PASS", "fail": "FAIL", "not_implemented": "TODO", "error": "ERROR", "busy": "BUSY"}[self.status]
        # not graded: no score to print, only what the exercise is worth (w6-02: "(0/3 points)" beside
        # "neither passed nor failed" read as a fail)
        score = (f"{self.max_points} point{'' if self.max_points == 1 else 's'} when graded" if self.status == "busy"
                 else f"{self.points}/{self.max_points} points")
        return f"[{icon}] Exercise {self.exercise} ({score}): {self.message}"


@dataclass
class _Exercise:
    id: str
    title: str
    points: int
    fn: object
    time_limit_s: float
    reference_s: float | None = None   # what the course's own answer took (when the limit was fitted to it)
    warmup: object = None              # run once per process before the first time limit starts (its imports)
    warmed: bool = False


def exercise(exercise_id: str, title: str, *, points: int = 1, time_limit_s: float | None = None,
             warmup=None):
    """Register a check function for exercise `exercise_id` ("N.M"). Its time limit is
    `time_limit_s` when given, else the measured one in `TIME_LIMITS_S`, else 300 s. `warmup`
    (no arguments, the course's own code only) runs once per process before the first time limit
    starts: the first imports a check's torch paths make (w6-06: 6.2's first call spent 3-15 s
    importing sympy) are not charged to its limit."""
    def register(fn):
        limit, reference = (time_limit_s, None) if time_limit_s is not None else \
            TIME_LIMITS_S.get(exercise_id, (DEFAULT_TIME_LIMIT_S, None))
        _REGISTRY[exercise_id] = _Exercise(exercise_id, title, points, fn, float(limit), reference, warmup)
        return fn
    return register


def limit_sentence(spec: "_Exercise") -> str:
    """'the check did not finish within its time limit of 10 s (...)': what a learner reads when it fires."""
    text = f"the check did not finish within its time limit of {spec.time_limit_s:g} s"
    if spec.reference_s is not None:
        took = "well under a second" if spec.reference_s < 1 else f"about {spec.reference_s:.0f} s"
        # measured once the libraries are loaded (a first call in a fresh process also imports them)
        text += f" (the course's own answer takes {took} here once its libraries are loaded)"
    return text


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
def _time_limit(seconds: float, sentence: str | None = None):
    """Raise TimeoutError in the main thread after `seconds` (no-op off the main thread / Windows)."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable or not seconds:
        yield
        return

    def on_alarm(signum, frame):
        raise TimeoutError(sentence or f"the check did not finish within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_STDLIB = tuple({str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("stdlib", "platstdlib")})


def _learner_line(exc: BaseException) -> str:
    """Where in the learner's code the exception came from: the last frame outside course_utils,
    the installed libraries and Python's standard library (`statistics.mean([])` raises inside
    statistics.py; the line to show is the learner's that called it)."""
    frames = traceback.extract_tb(exc.__traceback__)
    pkg = str(Path(__file__).resolve().parent.parent)
    for frame in reversed(frames):
        name = frame.filename
        if name.startswith("<frozen") or "site-packages" in name or "dist-packages" in name:
            continue
        path = name if name.startswith("<") else str(Path(name).resolve())
        if path.startswith(pkg) or path.startswith(_STDLIB):
            continue
        where = name if not name.startswith("<") and "ipykernel_" not in name else "your cell"
        return f" (at line {frame.lineno} of {where}: `{(frame.line or '').strip()}`)"
    return ""


_DALI_ASSERT = re.compile(r'^Assert on ".*" failed: ')


def _exception_text(exc: BaseException) -> str:
    """str(exc), but a DALI pipeline's error (a page of C++ context, the operator and the learner's
    line in the middle; w2-04) as its one useful sentence first: which operator, defined where, said
    what."""
    text = str(exc)
    if "Critical error in pipeline" not in text or "encountered:" not in text:
        return text
    lines = [ln.strip() for ln in text.splitlines()]
    said = next((ln for ln in lines[lines.index("encountered:") + 1:] if ln), "")
    said = _DALI_ASSERT.sub("", said)
    op = next((ln for ln in lines if ln.startswith("Error in ")), "")
    op = op[len("Error in "):].rstrip(",") if op else "a DALI operator"
    where = next((ln for ln in lines if ln.startswith("File ")), "")
    m = re.match(r'File "(.+)", line (\d+)', where)
    defined = f" (defined at line {m.group(2)} of {m.group(1)})" if m else ""
    return f"DALI stopped the pipeline: {op}{defined} said \"{said}\""


def _raised_by_course(exc: BaseException) -> bool:
    """True when `exc` was raised by the course's own code (a check), not by code it called."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and str(Path(frames[-1].filename).resolve()).startswith(_COURSE_DIR)


_CALLING_NOTE = "the check was calling "


@contextlib.contextmanager
def calling(what: str):
    """Inside the block a check calls the learner's code as `what` ("time_it(fn, device, warmup=3,
    repeats=1)"): an exception that code raises says so in its [ERROR] sentence, so that the learner
    can reproduce the call (a crash on repeats=1 names repeats=1)."""
    try:
        yield
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as exc:
        if hasattr(exc, "add_note") and not any(str(n).startswith(_CALLING_NOTE) for n in getattr(exc, "__notes__", ())):
            exc.add_note(_CALLING_NOTE + what)
        raise


def _calling_sentence(exc: BaseException) -> str:
    notes = [str(n) for n in getattr(exc, "__notes__", ()) if str(n).startswith(_CALLING_NOTE)]
    return f"; {notes[0]}" if notes else ""


class _LoadWatch:
    """What other programs took of this process's cores since it was made (`_busy.OthersCpu`): a
    check that runs past its time limit while they took half the usable cores or more is not
    blamed on the learner's code ("does your code loop forever ...") but reported busy."""

    def __init__(self):
        try:
            from ._busy import OthersCpu
            self._cpu = OthersCpu().__enter__()
        except Exception:          # no psutil, no /proc: the time-out keeps its usual sentence
            self._cpu = None

    def busy_sentence(self) -> str:
        if self._cpu is None:
            return ""
        try:
            self._cpu.__exit__(None, None, None)
        except Exception:
            return ""
        cpu = self._cpu
        if cpu.others_cores < max(0.5 * cpu.usable, 0.2):
            return ""
        return (f"while the machine was busy ({cpu.others_cores:.1f} of its {cpu.usable} usable cores taken by other "
                "programs during the check), which slows the check itself: your answer was neither passed nor "
                "failed. The grader runs this check again when the machine is quieter; in a notebook, run this "
                "cell again once the other programs are done (`top` shows them)")


def _finish_cut_imports(before: set) -> list[str]:
    """After an import a time limit cut half-way: Python drops the module whose code raised and each
    package above it, but keeps their submodules that had finished; a fresh import of the package
    then finds those in sys.modules and never names them on it again (w6-06: `module 'sympy' has no
    attribute 'logic'` on every later check until the kernel restarted). Import each dropped package
    again now, outside the limit (its finished submodules are not run twice: running torch's again
    would register its operators twice), then name every module first imported since `before` (a
    snapshot of sys.modules' keys) on its package where the name is missing. Returns the packages
    imported again."""
    new = [name for name in list(sys.modules) if name not in before]
    dropped = sorted({".".join(name.split(".")[:i]) for name in new for i in range(1, name.count(".") + 1)}
                     - set(sys.modules), key=lambda n: n.count("."))
    for name in dropped:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:
                pass
    for name in [n for n in list(sys.modules) if n not in before]:
        module, (parent, _, child) = sys.modules.get(name), name.rpartition(".")
        if module is not None and parent in sys.modules and not hasattr(sys.modules[parent], child):
            try:
                setattr(sys.modules[parent], child, module)
            except (AttributeError, TypeError):
                pass
    return dropped


def _warm(spec: "_Exercise") -> None:
    """The exercise's warm-up, once per process, outside its time limit (a failure is left to the check)."""
    if spec.warmup is None or spec.warmed:
        return
    spec.warmed = True
    try:
        spec.warmup()
    except Exception:
        pass


def run_check(exercise_id: str, obj, **kwargs) -> CheckResult:
    """Run a check and return its result (records it, but prints nothing)."""
    spec = _lookup(exercise_id)
    t0 = time.perf_counter()
    try:                # an argument the check does not take is the call's mistake, not the learner's code's
        inspect.signature(spec.fn).bind(obj, **kwargs)
    except TypeError as exc:
        takes = [p.name for p in list(inspect.signature(spec.fn).parameters.values())[1:]]
        result = CheckResult(exercise_id, "error", 0, spec.points,
                             f"check(\"{exercise_id}\", ...) was called with an argument it does not take ({exc}); "
                             + (f"it takes {', '.join(f'{t}=' for t in takes)} besides your answer"
                                if takes else "it takes your answer alone"),
                             os.environ.get("COURSE_NOTEBOOK"), 0.0)
        _record(result)
        return result
    _warm(spec)
    modules_before = set(sys.modules)
    replaced = _replaced_compared()          # before the check: what the learner's cells replaced
    seen = _GUARD.begin()
    load = _LoadWatch()           # what other programs took meanwhile, for a time-out's sentence
    try:
        with _time_limit(spec.time_limit_s, limit_sentence(spec)):
            message = spec.fn(obj, **kwargs) or "all properties hold."
        status = "pass"
    except NotImplementedError:
        status = "not_implemented"
        message = ("not implemented yet: replace `raise NotImplementedError` in the exercise cell "
                   "with your code, run that cell, then run this one again.")
    except CheckFailed as exc:
        status, message = "fail", exc.sentence()
    except MachineBusy as exc:   # too busy to judge speed: neither a pass nor a fail (the grader runs it again)
        if _raised_by_course(exc):
            status, message = "busy", exc.sentence()
        else:                    # the learner's code raised it: that is no measurement of the machine
            status = "error"
            message = f"your code raised MachineBusy, which only a check may raise{_learner_line(exc)}"
    except TimeoutError as exc:
        _finish_cut_imports(modules_before)   # an import it cut half-way must not break the next call
        # a check that knows the code made progress (timed rounds finished) says so on the exception (`progressed`)
        busy = None if getattr(exc, "progressed", False) else load.busy_sentence()
        if getattr(exc, "progressed", False):
            status, message = "error", f"{exc}"
        elif busy:      # the machine, not the code, may be why it ran long (w4-02: 2.3 at a load of 20)
            status, message = "busy", f"not graded: {exc}, {busy}"
        else:
            status, message = "error", f"{exc}: does your code loop forever or wait on something that never comes?"
    except KeyboardInterrupt:
        _finish_cut_imports(modules_before)
        raise
    except Exception as exc:  # the learner's code broke
        status = "error"
        message = (f"your code raised {type(exc).__name__}: {_exception_text(exc)}{_learner_line(exc)}"
                   f"{_calling_sentence(exc)}")
    finally:
        switched = _GUARD.end(seen)
        replaced += [name for name in _replaced_compared() if name not in replaced]
    review = []
    if replaced:
        review.append(f"replaced {', '.join(replaced[:4])}{' and more' if len(replaced) > 4 else ''} "
                      "(functions the checks compare with) in the check's process")
    if switched and status != "not_implemented":
        status, message = "fail", _switched_sentence(switched)
    elif replaced and status != "not_implemented":
        status, message = "fail", _replaced_sentence(replaced)
    result = CheckResult(exercise_id, status, spec.points if status == "pass" else 0, spec.points,
                         message, os.environ.get("COURSE_NOTEBOOK"), round(time.perf_counter() - t0, 3), review)
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


# -- what the checks compare with belongs to the checks ----------------------------------------------
# Captured when the checks are imported, before any learner code runs. A check compares through
# `trusted` (a replacement in torch or numpy cannot fool it), and `run_check` flags, and undoes,
# any replacement made before or during the check (`torch.equal = lambda *a: True`, also one
# written into the module's __dict__, or one that puts itself back once it has been called).

COMPARED = {
    "torch.equal": (torch, "equal"), "torch.allclose": (torch, "allclose"), "torch.isclose": (torch, "isclose"),
    "torch.testing.assert_close": (torch.testing, "assert_close"),
    "torch.Tensor.equal": (torch.Tensor, "equal"), "torch.Tensor.allclose": (torch.Tensor, "allclose"),
    "numpy.array_equal": (numpy, "array_equal"), "numpy.array_equiv": (numpy, "array_equiv"),
    "numpy.allclose": (numpy, "allclose"), "numpy.isclose": (numpy, "isclose"),
    "numpy.testing.assert_array_equal": (numpy.testing, "assert_array_equal"),
    "numpy.testing.assert_allclose": (numpy.testing, "assert_allclose"),
    "numpy.testing.assert_equal": (numpy.testing, "assert_equal"),
    "numpy.testing.assert_array_almost_equal": (numpy.testing, "assert_array_almost_equal"),
    "math.isclose": (math, "isclose"),
}
_ORIGINALS = {name: inspect.getattr_static(owner, attr) for name, (owner, attr) in COMPARED.items()}
_OWN = {name: attr in vars(owner) for name, (owner, attr) in COMPARED.items()}   # else inherited (torch.Tensor's)


class _Trusted:
    """The comparison functions as they were when the checks were imported (lesson checks:
    `trusted.torch_equal(a, b)`, `trusted.array_equal(a, b)`, ...)."""
    torch_equal = staticmethod(torch.equal)
    torch_allclose = staticmethod(torch.allclose)
    array_equal = staticmethod(_ORIGINALS["numpy.array_equal"])
    allclose = staticmethod(_ORIGINALS["numpy.allclose"])
    assert_array_equal = staticmethod(_ORIGINALS["numpy.testing.assert_array_equal"])
    isclose = staticmethod(_ORIGINALS["math.isclose"])


trusted = _Trusted()


def _replaced_compared() -> list[str]:
    """The names in `COMPARED` no longer bound to their originals; each is put back."""
    out = []
    for name, (owner, attr) in COMPARED.items():
        original = _ORIGINALS[name]
        try:
            now = inspect.getattr_static(owner, attr)
        except AttributeError:
            now = None
        if now is not original:
            out.append(name)
            try:
                if _OWN[name]:
                    setattr(owner, attr, original)
                else:
                    delattr(owner, attr)
            except (AttributeError, TypeError):
                pass
    return out


def _replaced_sentence(names: list[str]) -> str:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"property 'leaves the check's own functions alone' does not hold: your code replaced {shown} in the "
            "check's process. The check compares with them, so this run cannot be graded (the originals are "
            "back in place, and an instructor will see it). Hint: an answer never needs to replace a library's "
            "function")


# -- the profiler belongs to the checks while a check runs ------------------------------------------
# Captured when the checks are imported, before any learner code runs: what the learner's code
# replaces later (sys.setprofile = ...) does not reach these.

_COURSE_DIR = str(Path(__file__).resolve().parents[1]) + os.sep
_THREADING_FILE = getattr(threading, "__file__", "") or ""
_setprofile, _getprofile, _getframe = sys.setprofile, sys.getprofile, sys._getframe
_threading_setprofile, _threading_getprofile = threading.setprofile, threading.getprofile
_PROFILE_EVENTS = frozenset({"sys.setprofile", "sys._setprofileallthreads"})
_THREAD_START_CODE = threading.Thread.start.__code__
_UNWATCHING = {threading.setprofile.__code__: "threading.setprofile"}
if hasattr(threading, "setprofile_all_threads"):
    _UNWATCHING[threading.setprofile_all_threads.__code__] = "threading.setprofile_all_threads"
_RAW_THREAD_STARTS = frozenset(getattr(sys.modules.get("_thread"), n) for n in
                               ("start_new_thread", "start_new", "start_joinable_thread")
                               if hasattr(sys.modules.get("_thread"), n))


class _Guard:
    """Process-wide: how many checks run, which tripwires watch, and where code that is not the
    course's changed the profiler meanwhile (seen by `_audit`)."""

    def __init__(self):
        self.checks = 0
        self.switched: list[str] = []
        self.tripwires: list = []

    def begin(self) -> int:
        self.checks += 1
        return len(self.switched)

    def end(self, seen: int) -> list[str]:
        self.checks = max(0, self.checks - 1)
        out = self.switched[seen:]
        if not self.checks and not self.tripwires:
            del self.switched[:]
        return out


_GUARD = _Guard()


def _where(frame) -> str:
    if frame is None:
        return "from code outside Python"
    name = frame.f_code.co_filename
    place = "your cell" if name.startswith("<") or "ipykernel_" in name else Path(name).name
    return f"line {frame.f_lineno} of {place}"


def _audit(event, args):
    """The audit hook (sys.addaudithook: it cannot be removed). Cheap when nothing is watched."""
    if event in _PROFILE_EVENTS:
        if not (_GUARD.checks or _GUARD.tripwires):
            return
        try:
            frame = _getframe(1)   # the Python code that called sys.setprofile (or ctypes' PyEval_SetProfile)
        except ValueError:
            frame = None
        name = frame.f_code.co_filename if frame is not None else ""
        if name.startswith(_COURSE_DIR) or name == _THREADING_FILE:
            return   # the checks' own watch, or a thread the learner started taking it up
        _GUARD.switched.append(f"{event}, at {_where(frame)}")
    elif event == "exec" and _GUARD.tripwires and args and isinstance(args[0], types.CodeType):
        for trip in list(_GUARD.tripwires):
            trip._executed(args[0])


sys.addaudithook(_audit)


def _switched_sentence(switched: list[str]) -> str:
    return ("property 'leaves the profiler alone' does not hold: your code changed the profiler while the "
            f"check ran ({switched[0]}). Checks watch with it which functions your code calls, so this run "
            "cannot be graded. Hint: remove sys.setprofile (and any profiler) from your answer")


def _code_of(fn) -> list:
    """The code objects a forbidden function runs (unwrapping methods, properties, decorators)."""
    if isinstance(fn, types.CodeType):
        return [fn]
    if isinstance(fn, property):
        fn = fn.fget
    if isinstance(fn, (staticmethod, classmethod)) or hasattr(fn, "__func__"):
        fn = fn.__func__
    codes = []
    while fn is not None:
        code = getattr(fn, "__code__", None)
        if code is not None and code not in codes:
            codes.append(code)
        fn = getattr(fn, "__wrapped__", None)
    if not codes:
        raise TypeError(f"{fn!r} is not a Python function (name C functions in c_names=)")
    return codes


class Tripwire:
    """Functions the learner's code must not call while a check calls it: the course's own
    implementation of the exercise, or the check's reference. Lesson 06 and 08 use it:

        trip = Tripwire(scaling.predict_dp, scaling._device_ms, prop="computes the estimate itself",
                        why="that is the course's own model", hint="write the model with plain arithmetic")
        yours = trip.call(estimate_dp, costs, n, batch, loader)   # CheckFailed(prop) on a forbidden call

    What it catches: a Python function of `functions` by its code (also a fresh copy of it, from
    `importlib.reload` or an `exec` of its file); any Python function whose file ends with one of
    `files` ("torch/nn/parallel/comm.py"); a C function by its name in `c_names`. It watches with
    the profiler, in the threads the learner's code starts too; in a process the learner's code
    forks, a forbidden call raises. Switching the watch off (`sys.setprofile`, ctypes'
    `PyEval_SetProfile`, `threading.setprofile`, a thread started below `threading`) fails the
    check with a sentence saying so: the audit hook that sees it cannot be removed.
    Cost: one Python call per call the learner's code makes while it is watched (microseconds)."""

    def __init__(self, *functions, files=(), c_names=(), codes=(), prop: str = "is your own code",
                 why: str = "that is the course's own implementation of what this exercise asks",
                 hint: str = "write it yourself (reading the course's code is fine; calling it is not the exercise)"):
        found = [c for fn in functions for c in _code_of(fn)] + list(codes)
        self.codes = frozenset(found)
        self.keys = frozenset((c.co_filename, c.co_firstlineno, c.co_name) for c in found)
        self.sources = frozenset(c.co_filename for c in found)
        self.files = tuple(f.replace("\\", "/") for f in files)
        self.c_names = frozenset(c_names)
        self.prop, self.why, self.hint = prop, why, hint
        self.hit: str | None = None
        self.switched: str | None = None
        self._pid = os.getpid()
        self._depth = 0
        self._hook = self._profile   # one bound method: the profiler is compared by identity

    # what the watch sees
    def _trip(self, name: str) -> None:
        if self.hit is None:
            self.hit = name
        if os.getpid() != self._pid:   # a process the learner's code forked: its parent would never know
            raise CheckFailed(self.prop, f"your code called {name}: {self.why}", self.hint)

    def _switch(self, how: str) -> None:
        if self.switched is None:
            self.switched = how

    def _executed(self, code) -> None:
        if code.co_name == "<module>" and code.co_filename in self.sources:
            self._trip(f"a fresh copy of {Path(code.co_filename).name} (importlib.reload or exec of the course's file)")

    def _profile(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code in self.codes or (code.co_filename, code.co_firstlineno, code.co_name) in self.keys or (
                    self.files and code.co_filename.replace("\\", "/").endswith(self.files)):
                self._trip(f"{frame.f_globals.get('__name__', '?')}.{code.co_name}")
            elif code in _UNWATCHING:
                self._switch(f"{_UNWATCHING[code]}, at {_where(frame.f_back)}")
            elif code is _THREAD_START_CODE and _threading_getprofile() is not self._hook:
                self._switch(f"a thread started after the threads' profiler was changed, at {_where(frame.f_back)}")
        elif event == "c_call":
            if getattr(arg, "__name__", None) in self.c_names:
                self._trip(f"{getattr(arg, '__module__', None) or 'torch._C'}.{arg.__name__}")
            elif arg in _RAW_THREAD_STARTS and frame.f_code is not _THREAD_START_CODE:
                self._switch(f"a thread started with _thread, which no profiler follows, at {_where(frame)}")

    @contextlib.contextmanager
    def watching(self):
        """The watch is on inside the block; then `verdict()` says what it saw."""
        if self._depth:
            self._depth += 1
            try:
                yield self
            finally:
                self._depth -= 1
            return
        self.hit = self.switched = None
        self._pid = os.getpid()
        previous, previous_threads = _getprofile(), _threading_getprofile()
        _GUARD.tripwires.append(self)
        seen = len(_GUARD.switched)
        self._depth = 1
        _threading_setprofile(self._hook)
        _setprofile(self._hook)
        try:
            yield self
        finally:
            current = _getprofile()
            _setprofile(previous)
            _threading_setprofile(previous_threads)
            self._depth = 0
            if self in _GUARD.tripwires:
                _GUARD.tripwires.remove(self)
            others = _GUARD.switched[seen:]
            if others:
                self._switch(others[0])
            elif current is not self._hook:
                self._switch("the profiler was no longer the check's when your code returned")
            if not _GUARD.checks and not _GUARD.tripwires:
                del _GUARD.switched[:]

    def verdict(self, prop: str | None = None, why: str | None = None, hint: str | None = None) -> None:
        """Raise CheckFailed(prop) when the watched code switched the watch off or made a forbidden call
        (`prop`, `why` and `hint` override the tripwire's own for this verdict)."""
        prop = prop or self.prop
        if self.switched:
            raise CheckFailed(prop, f"your code switched off the check's watch on the functions it calls "
                              f"({self.switched}), so the check cannot tell what it called",
                              "leave sys.setprofile and threading.setprofile alone in your answer")
        if self.hit:
            raise CheckFailed(prop, f"your code called {self.hit}: {why or self.why}", hint or self.hint)

    def call(self, fn, *args, **kwargs):
        """`fn(*args, **kwargs)` with the watch on; its result, or CheckFailed(prop) (see `verdict`)."""
        with self.watching():
            try:
                out = fn(*args, **kwargs)
            except Exception:
                if self.hit is None and self.switched is None:
                    raise
                out = None
        self.verdict()
        return out
