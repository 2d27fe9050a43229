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
  cannot open its pipes or memory through /proc.

What remains possible: the code the check calls runs in the forked process, so code written
to attack the grader (reaching into that process, or patching a library the check relies on)
can still forge the verdict of its own exercise. `course_utils.grading.review` flags the usual
ways of doing that; INSTRUCTORS.md says how to run the grader on untrusted code.

Protocol (JSON lines): stdin gets {"preload": [modules]} then one task per line,
{"id", "exercise", "payload", "cwd", "env", "seed", "limit_s", "log"}; stdout answers
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

STATUSES = ("pass", "fail", "not_implemented", "error")
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


_WATCHED = ("torch", "torch.nn.functional", "torch.testing", "torch.cuda", "numpy", "numpy.testing", "math",
            "builtins", "statistics", "time", "random", "os", "sys")


def _snapshot() -> dict:
    """Every function, class and module the checks lean on, by name (a tamper tripwire)."""
    names = [m for m in list(sys.modules) if m.startswith("course_utils")] + list(_WATCHED)
    out = {}
    for name in names:
        module = sys.modules.get(name)
        if module is None:
            continue
        for attr, value in list(vars(module).items()):
            if callable(value) or isinstance(value, type(sys)):
                out[f"{name}.{attr}"] = value
    return out


def _foreign(value) -> bool:
    """Code that comes from the submission, not from the environment or the course (libraries
    rebind their own functions when they import lazily: that is not tampering)."""
    code = getattr(value, "__code__", None) or getattr(getattr(value, "__func__", None), "__code__", None)
    if code is not None:
        trusted = (sys.prefix, sys.base_prefix, str(ROOT / "course_utils"))
        return not code.co_filename.startswith(trusted)
    return getattr(value, "__module__", None) == "__main__"


def _replaced(before: dict, after: dict) -> list[str]:
    return sorted(k for k, v in after.items() if k in before and before[k] is not v and _foreign(v))


def _child(task: dict, result_w: int) -> None:
    """In the forked process: load the handed-in object and run its check. Never returns."""
    status, message, t0 = "error", "", time.perf_counter()
    review: list[str] = []
    try:
        os.setpgid(0, 0)
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
        if _replaced(before, loaded):
            review.append("replaced " + ", ".join(_replaced(before, loaded)[:3]) + " while it was loaded")
        try:
            result = run_check(task["exercise"], obj, **(kwargs or {}))
            status, message = result.status, result.message
            changed = [k for k in _replaced(loaded, _snapshot()) if k not in _replaced(before, loaded)]
            if changed:
                review.append("left " + ", ".join(changed[:3]) + " replaced after its check")
        except SystemExit as exc:
            message = f"your code called sys.exit({exc.code if exc.code is not None else ''}) during the check"
        except KeyboardInterrupt:
            message = "your code raised KeyboardInterrupt during the check"
        except BaseException as exc:
            message = f"the check could not run: {type(exc).__name__}: {exc}"
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
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(task, w)
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
        return {"status": "error", "seconds": seconds,
                "message": f"the check did not finish within {limit:g} s and the grader stopped it: does your "
                           "code loop forever or wait on something that never comes?"}
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
