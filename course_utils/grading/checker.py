"""The trusted check runner: `python -m course_utils.grading.checker` (started by the grader).

It is started before any submission runs, imports the course's checks, and then, for each
exercise a submission handed in, forks one process that loads the handed-in object, runs
`run_check` on it and sends the verdict back through a pipe of its own. So:

- nothing the submission's notebook did (redefining `check`, writing a results file,
  patching the checks in its kernel) reaches a verdict: the verdict is computed here;
- each check starts from the same clean state: what the code of one exercise does to its
  process cannot touch another exercise's check;
- `sys.exit`, `os._exit`, a crash, an infinite loop or a check past its time limit end that
  one process, with one sentence, and grading goes on;
- every process a check started (torchrun and its ranks in lesson 07, DataLoader workers, a
  daemon) is killed when the check is done (`course_utils.grading.reap`);
- on Linux the runner makes itself non-dumpable, so a process of the same (non-root) user
  cannot open its pipes or memory through /proc; it, and each check, die with their parent;
- a submission that rebinds a function the checks compare or measure with (torch.equal,
  numpy.array_equal, time.perf_counter, a method of torch.Tensor, a function of the course), while
  its object is loaded or while its check runs, even one it puts back before the check ends, gets
  no points for that exercise ("leaves the check's own functions alone"), and a review flag.

What remains possible: the code the check calls runs in the forked process, so code written
to attack the grader by other means (reaching into the check's frames or objects, writing a
module's namespace dictionary directly) can still forge the verdict of its own exercise.
`course_utils.grading.review` flags the usual ways of doing that; INSTRUCTORS.md says how to run
the grader on untrusted code.

Protocol (JSON lines): stdin gets {"preload": [modules]} then one task per line,
{"id", "exercise", "payload", "cwd", "env", "seed", "limit_s", "log"} (and "limit_sentence", what
to say when `limit_s` runs out); stdout answers
{"ready": ...} and then {"id", "status", "message", "seconds"} per task.
"""
from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import sys
import time
from pathlib import Path

STATUSES = ("pass", "fail", "not_implemented", "error", "busy")
MAX_RESULT_BYTES = 1 << 16
ROOT = Path(__file__).resolve().parents[2]


def _non_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): /proc/<pid>/fd and /mem of this process become unreadable to
    other processes of the same user (not to root). Inherited by forks, reset by exec."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except Exception:
        pass


def course_fingerprint(root: Path = ROOT) -> dict[str, str]:
    """sha256 of the course's own code and released lessons (a tripwire for a submission that
    rewrites them on disk while a batch is graded)."""
    files = sorted((root / "course_utils").rglob("*.py")) + sorted((root / "solutions").glob("*.ipynb"))
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _changed(baseline: dict[str, str]) -> str | None:
    now = course_fingerprint()
    for name in sorted(set(baseline) | set(now)):
        if baseline.get(name) != now.get(name):
            return name
    return None


_WATCHED = ("torch", "torch.nn", "torch.nn.functional", "torch.testing", "torch.cuda", "torch.linalg", "numpy",
            "numpy.testing", "numpy.linalg", "math", "cmath", "builtins", "operator", "functools", "copy",
            "statistics", "time", "random", "os", "sys")
_WATCHED_CLASSES = ("torch.Tensor", "torch.nn.Module")
_COURSE = str(ROOT / "course_utils")
_LIBRARIES = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})


def _resolve(dotted: str):
    module, _, attr = dotted.rpartition(".")
    return getattr(sys.modules.get(module), attr, None)


def _snapshot() -> dict:
    """Every function and class the checks lean on, by name: the attributes of the course's modules
    and of the libraries they compare with, and the methods of tensors and modules."""
    names = [m for m in list(sys.modules) if m.startswith("course_utils")] + list(_WATCHED)
    out = {}
    for name in names:
        module = sys.modules.get(name)
        if module is None:
            continue
        for attr, value in list(vars(module).items()):
            if callable(value) and not isinstance(value, type(sys)):
                out[f"{name}.{attr}"] = value
    for dotted in _WATCHED_CLASSES:
        cls = _resolve(dotted)
        if isinstance(cls, type):
            for attr, value in list(vars(cls).items()):
                if not isinstance(value, (str, bytes, int, float, type(None), tuple, frozenset)):
                    out[f"{dotted}.{attr}"] = value
    return out


def _code(value):
    value = getattr(value, "func", value)   # functools.partial: what it calls
    return getattr(value, "__code__", None) or getattr(getattr(value, "__func__", None), "__code__", None) or \
        getattr(getattr(value, "fget", None), "__code__", None)


def _is_course(value) -> bool:
    code = _code(value)
    return code is not None and code.co_filename.startswith(_COURSE)


def _rebinding(old, new) -> bool:
    """Is `new` in place of `old` tampering? Not when it is the course's own code (the virtual CUDA
    device patches torch.cuda while a check runs, and puts it back), a module (a lazy import), or a
    library wrapping its own function (torch's dynamo wraps torch.manual_seed when it is first
    imported)."""
    if old is new or isinstance(new, type(sys)) or _is_course(new):
        return False
    code = _code(new)
    wraps_old = getattr(new, "__wrapped__", None) is old
    return not (wraps_old and code is not None and code.co_filename.startswith(_LIBRARIES))


def _replaced(before: dict, after: dict) -> list[str]:
    """What was rebound between two snapshots (see `_rebinding`)."""
    return sorted(k for k, v in after.items() if k in before and _rebinding(before[k], v))


_getframe = sys._getframe   # before any submission code


def _writer() -> str:
    """'learner' when the code assigning (seen through library frames) is the submission's."""
    frame = _getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_COURSE):
            return "course"
        if not (name.startswith((*_LIBRARIES, "<frozen")) or name == "<string>"):
            return "learner"
        frame = frame.f_back
    return "library"


_WRITES: list[str] = []


class _Recorded(type(sys)):
    """A watched module's class while a check runs: it notes every function the submission's code
    rebinds on it, even one it puts back before the check ends."""

    def __setattr__(self, name, value):
        old = self.__dict__.get(name)
        if callable(old) and _rebinding(old, value) and _writer() == "learner":
            _WRITES.append(f"{self.__name__}.{name}")
        super().__setattr__(name, value)

    def __delattr__(self, name):
        if callable(self.__dict__.get(name)) and _writer() == "learner":
            _WRITES.append(f"{self.__name__}.{name}")
        super().__delattr__(name)


def _record_writes() -> None:
    for name in _WATCHED:
        module = sys.modules.get(name)
        if module is not None and type(module) is type(sys):
            try:
                module.__class__ = _Recorded
            except TypeError:
                pass


def _tampered_sentence(names: list[str]) -> str:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"property 'leaves the check's own functions alone' does not hold: your code replaced {shown} in the "
            "check's process. The check compares and measures with them, so its verdict cannot be trusted. "
            "Hint: an answer never needs to replace a library's or the course's function")


def _child(task: dict, result_w: int, checker_pid: int | None = None) -> None:
    """In the forked process: load the handed-in object and run its check. Never returns."""
    status, message, t0 = "error", "", time.perf_counter()
    review: list[str] = []
    try:
        os.setpgid(0, 0)
        from course_utils.grading.reap import die_with_parent
        die_with_parent(checker_pid)   # the check ends with the checker
        log = os.open(task["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        os.chdir(task["cwd"])
        os.environ.clear()
        os.environ.update(task["env"])
        import tempfile
        tempfile.tempdir = None   # TMPDIR is the submission's own folder
        seed = int(task["seed"])
        os.environ["COURSE_CHECK_SEED"] = str(seed)
        import random

        import numpy as np
        import torch
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        import faulthandler
        faulthandler.enable()
        from course_utils.checks import run_check
        payload = Path(task["payload"]).read_bytes()
        before = _snapshot()
        _record_writes()
        try:
            import cloudpickle  # noqa: F401  (the payload needs its reconstructors)
            import pickle
            obj, kwargs, sources = pickle.loads(payload)
        except BaseException as exc:
            message = (f"the object handed in could not be loaded in the grader's checker "
                       f"({type(exc).__name__}: {exc}): does it depend on something only the notebook had?")
            raise _Done from None
        import linecache
        if isinstance(sources, dict):
            linecache.cache.update(sources)
        loaded = _snapshot()
        at_load = sorted(set(_replaced(before, loaded)) | set(_WRITES))
        if at_load:
            review.append("replaced " + ", ".join(at_load[:3]) + " while it was loaded")
        checks_saw: list = []
        try:
            result = run_check(task["exercise"], obj, **(kwargs or {}))
            status, message = result.status, result.message
            checks_saw = list(getattr(result, "review", None) or [])   # a replacement the check undid itself
        except SystemExit as exc:
            message = f"your code called sys.exit({exc.code if exc.code is not None else ''}) during the check"
        except KeyboardInterrupt:
            message = "your code raised KeyboardInterrupt during the check"
        except BaseException as exc:
            message = f"the check could not run: {type(exc).__name__}: {exc}"
        during = [k for k in sorted(set(_replaced(loaded, _snapshot())) | set(_WRITES)) if k not in at_load]
        if during:
            review.append("replaced " + ", ".join(during[:3]) + " during its check")
        if checks_saw and not (at_load or during):
            review += [str(r) for r in checks_saw]
        tampered = at_load + during
        if tampered and status != "not_implemented":
            status, message = "fail", _tampered_sentence(tampered)
    except _Done:
        pass
    except BaseException as exc:
        message = f"the grader's checker failed before the check: {type(exc).__name__}: {exc}"
    data = json.dumps({"status": status, "message": str(message), "review": review,
                       "seconds": round(time.perf_counter() - t0, 3)}).encode()[:MAX_RESULT_BYTES]
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(result_w, view):]
    finally:
        os._exit(0)


class _Done(Exception):
    pass


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def run_task(task: dict, baseline: dict | None = None) -> dict:
    """Fork, run one check, and turn whatever happened into {status, message, seconds}."""
    t0 = time.monotonic()
    if baseline is not None:
        changed = _changed(baseline)
        if changed:
            return {"status": "grader_error", "seconds": 0.0,
                    "message": f"the course's own file {changed} changed while grading (did a submission "
                               "rewrite it?); run the grader on untrusted code as INSTRUCTORS.md says"}
    try:        # the check's warm-up (its first imports: the course's code only) here, once, not in every fork
        from course_utils.checks import _core
        _core._warm(_core._lookup(task["exercise"]))
    except Exception:
        pass
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(task, w, parent)
    os.close(w)
    limit = float(task["limit_s"])
    chunks, size, status_code, killed = [], 0, None, False
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass
    while True:
        ready, _, _ = select.select([r], [], [], 0.1)
        if ready:
            chunk = os.read(r, 65536)
            if chunk and size < MAX_RESULT_BYTES:
                chunks.append(chunk)
                size += len(chunk)
        done, status_code = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - t0 > limit:
            killed = True
            _killpg(pid)
            _, status_code = os.waitpid(pid, 0)
            break
    os.set_blocking(r, False)
    try:
        while size < MAX_RESULT_BYTES and (chunk := os.read(r, 65536)):
            chunks.append(chunk)
            size += len(chunk)
    except (BlockingIOError, OSError):
        pass
    os.close(r)
    _killpg(pid)   # DataLoader workers or other processes the check left behind
    seconds = round(time.monotonic() - t0, 3)
    if killed:
        said = task.get("limit_sentence") or f"the check did not finish within {limit:g} s"
        return {"status": "error", "seconds": seconds,
                "message": f"{said}, and the grader stopped it: does your code loop forever or wait on "
                           "something that never comes?"}
    try:
        answer = json.loads(b"".join(chunks).decode())
        if answer.get("status") not in STATUSES:
            raise ValueError(answer.get("status"))
        review = [str(r)[:300] for r in answer.get("review", [])][:5] if isinstance(answer.get("review"), list) else []
        return {"status": answer["status"], "message": str(answer.get("message", ""))[:2000], "seconds": seconds,
                "review": review}
    except Exception:
        pass
    if os.WIFSIGNALED(status_code):
        name = _signal_name(os.WTERMSIG(status_code))
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        return {"status": "error", "seconds": seconds,
                "message": f"the check's process was killed by {name}{hint} before it gave a verdict"}
    code = os.WEXITSTATUS(status_code) if os.WIFEXITED(status_code) else status_code
    return {"status": "error", "seconds": seconds,
            "message": f"the check's process exited with status {code} before it gave a verdict "
                       "(os._exit or a crash in your code?)"}


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def main() -> int:
    from course_utils.grading import reap
    _non_dumpable()
    reap.become_subreaper()   # what a check leaves behind (torchrun in its own session...) stays ours to kill
    grader = os.environ.pop("COURSE_GRADER_PID", None)
    if grader:
        reap.die_with_parent(int(grader))   # a grader killed with SIGKILL takes its checker with it
    baseline = course_fingerprint()
    out = sys.stdout
    sys.stdout = sys.stderr   # anything a check module prints at import goes to the log, not the protocol
    first = json.loads(sys.stdin.readline() or "{}")
    errors = {}
    for module in first.get("preload", []):
        try:
            __import__(module)
        except BaseException as exc:
            errors[module] = f"{type(exc).__name__}: {exc}"
    import cloudpickle  # noqa: F401
    out.write(json.dumps({"ready": True, "errors": errors}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        task = json.loads(line)
        try:
            answer = run_task(task, baseline)
        except Exception as exc:
            answer = {"status": "grader_error", "seconds": 0.0, "message": f"{type(exc).__name__}: {exc}"}
        # nothing a check started outlives it: its torchrun and ranks, workers, daemons
        left = reap.kill_children() + reap.kill_marked((task.get("env") or {}).get(reap.ENV, ""))
        if left:
            answer["left_behind"] = len(left)
        answer["id"] = task.get("id")
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
