"""Grade submitted notebooks headless: `python -m course_utils.grade NOTEBOOK... [options]`.

For each submission the grader
1. tells which released lesson it is (content and `make student`'s metadata; a file named
   `NN-...` must be lesson NN) and takes the exercises and points from the course's own copy;
2. runs the learner's notebook in a fresh kernel (started by a runner process of its own, so that
   no kernel can reach the grader as its parent), in a private working folder, with every
   check cell replaced by the released one, which hands the exercise's object to the grader
   instead of grading it there; errors, timeouts, `sys.exit` and kernel deaths cost only the
   cells they hit; every process it started is killed when it ends (`grading.reap`);
3. after each wave of notebooks has run (`--jobs N` at a time, each on its own device with
   `--gpus 0,1,...`), runs every check alone, in the grader's own checker process (one forked
   process per check, on a quiet machine), with a seed recorded for regrading;
4. writes each submission's row as soon as it is graded: the results (`--json`), the CSV
   gradebook (`--csv`) and the executed copy (`--output-dir`), whatever happened to any other
   submission; then prints the table.

With `--json FILE` the results are written after every submission (a kill at any instant leaves
a valid file with every submission graded so far) and running the same command again grades only
what is missing (`course_utils.grading.results`); SIGINT and SIGTERM stop it cleanly.

A speed-graded check that found the machine too busy to judge speed ("not graded: the machine was
busy", status `busy`) is run again once every submission has been checked and the machine is
quieter (`--busy-retries`, `--busy-wait`; `course_utils.grading.busy`).

Exit status: 0 every exercise of every submission passed; 1 not; 2 bad arguments; 3 the
grader itself could not grade everything (a kernel that would not start, results that could not
be written, the course's own files changed during grading, a check the machine stayed too busy
for); 128 + N interrupted by signal N (130 Ctrl-C, 143 SIGTERM). See INSTRUCTORS.md.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_utils.grading import lessons as _lessons
from course_utils.grading.lessons import ROOT, Lesson, LessonError, check_calls

__all__ = ["grade", "check_cells", "main", "GradeOptions", "EXIT_PASSED", "EXIT_NOT_PASSED",
           "EXIT_USAGE", "EXIT_GRADER"]

EXIT_PASSED, EXIT_NOT_PASSED, EXIT_USAGE, EXIT_GRADER = 0, 1, 2, 3
DEFAULT_CELL_TIMEOUT_S = 900.0
DEFAULT_NOTEBOOK_TIMEOUT_S = 3600.0
CHECK_GRACE_S = 60.0          # at most, beyond a check's own time limit before its process is killed
_CLEAN_ENV = ("COURSE_RESULTS", "COURSE_STRICT", "COURSE_NOTEBOOK", "COURSE_CHECK_SEED", "COURSE_HANDIN_DIR")


def check_cells(path) -> list[str]:
    """Exercise ids of the check cells in a notebook, in order."""
    import nbformat
    nb = nbformat.read(str(path), as_version=4)
    ids = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            ids += check_calls(cell.source)
    return ids


@dataclass
class GradeOptions:
    smoke: bool = False
    cell_timeout_s: float = DEFAULT_CELL_TIMEOUT_S
    notebook_timeout_s: float = DEFAULT_NOTEBOOK_TIMEOUT_S
    jobs: int = 1
    seed: int | None = None
    output_dir: Path | None = None
    lesson: str | None = None          # the lesson every submission must be (else: from file names)
    solutions: Path | None = None      # the released lessons (default: the course's solutions/)
    gpus: tuple[str, ...] = ()         # devices for the notebooks running side by side (CUDA_VISIBLE_DEVICES values)
    quiet: bool = False
    json: Path | None = None           # the results file: written after every submission; a rerun resumes from it
    csv: Path | None = None            # the CSV gradebook, rebuilt from the results after every submission
    regrade: bool = False              # grade every submission again, also those whose results are kept
    run_id: str = ""                   # this run's process marker (course_utils.grading.reap), set by grade()
    busy_retries: int = 2              # tries again for a check that found the machine too busy (grading.busy)
    busy_wait_s: float = 120.0         # how long each of those tries waits for a quiet machine


@dataclass
class _Sub:
    path: Path
    sid: str
    lesson: Lesson | None = None
    expected: Lesson | None = None
    nb: object = None
    status: str = "graded"             # graded | not_graded | grader_error
    reason: str | None = None
    notes: list = field(default_factory=list)
    review: list = field(default_factory=list)
    records: list = field(default_factory=list)
    prepared: object = None
    execution: object = None
    work: Path | None = None
    index: int = 0                     # its number in the run (names its folders and process markers)
    handed: dict = field(default_factory=dict)   # exercise -> sha256 of the payload when the kernel ended
    notebook_s: float = 0.0
    checks_s: float = 0.0
    executed: str | None = None
    sha256: str | None = None          # of the submitted file, as read
    key: dict | None = None            # what its grade depends on (course_utils.grading.results)
    kept: dict | None = None           # its row from the results file, kept as it was

    @property
    def abspath(self) -> str:
        return str(self.path.resolve())

    def as_dict(self) -> dict:
        return {
            "submission": self.sid, "path": str(self.path),
            "lesson": self.lesson.name if self.lesson else None,
            "expected_lesson": self.expected.name if self.expected else None,
            "status": self.status, "reason": self.reason,
            "points": sum(r["points"] for r in self.records),
            "max_points": sum(r["max_points"] for r in self.records),
            "seconds": round(self.notebook_s + self.checks_s, 1), "notebook_s": round(self.notebook_s, 1),
            "checks_s": round(self.checks_s, 1), "executed": self.executed,
            "notes": self.notes, "review": self.review, "exercises": self.records,
        }


def _say(opts, text: str) -> None:
    if not opts.quiet:
        print(text, flush=True)


def _exercise_seed(seed: int, exercise_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{exercise_id}".encode()).digest()[:4], "little") & 0x7FFFFFFF


def _ids(paths: list[Path]) -> list[str]:
    """Names that tell submissions apart: paths relative to their common folder."""
    resolved = [p.resolve() for p in paths]
    if len(resolved) == 1:
        return [resolved[0].name]
    common = Path(os.path.commonpath([str(p.parent) for p in resolved]))
    return [p.relative_to(common).as_posix() for p in resolved]


def _read(sub: _Sub) -> None:
    import nbformat
    try:
        data = sub.path.read_bytes()
        sub.sha256 = hashlib.sha256(data).hexdigest()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        sub.status, sub.reason = "not_graded", f"the file cannot be read ({type(exc).__name__}: {exc})"
        return
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        what = "truncated (it stops before the end)" if not text.rstrip().endswith("}") else "not valid JSON"
        sub.status, sub.reason = "not_graded", (f"the file is not a notebook: its JSON is {what} "
                                                f"(line {exc.lineno}, column {exc.colno}: {exc.msg})")
        return
    try:
        if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
            raise ValueError("it has no list of cells")
        nb = nbformat.reads(text, as_version=4)
        for cell in nb.cells:
            if not isinstance(cell.get("source", ""), str) or cell.get("cell_type") not in ("code", "markdown", "raw"):
                raise ValueError("a cell has no source or an unknown type")
    except Exception as exc:
        sub.status, sub.reason = "not_graded", f"the file is not a notebook Jupyter can read ({exc})"
        return
    sub.nb = nb


def _missing_records(lesson: Lesson | None, message: str) -> list[dict]:
    if lesson is None:
        return []
    return [{"exercise": e.id, "title": e.title, "status": "missing", "points": 0, "max_points": e.points,
             "message": message, "seconds": 0.0, "seed": None} for e in lesson.exercises]


def _support_files(dest: Path) -> None:
    """What a lesson expects beside it (notebooks/scripts/ ...), copied: never the course's own."""
    source = ROOT / "notebooks"
    skip = shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints", "__pycache__", "profiles")
    dest.mkdir(parents=True, exist_ok=True)
    if not source.is_dir():
        return
    for entry in source.iterdir():
        if skip(str(source), [entry.name]):
            continue
        if entry.is_dir():
            shutil.copytree(entry, dest / entry.name, ignore=skip, dirs_exist_ok=True)
        else:
            shutil.copy2(entry, dest / entry.name)


def _tmp_dir(sub: _Sub, kind: str) -> str:
    """A temporary folder of the submission's own (TMPDIR), removed with the run's folder: what a
    lesson writes with `tempfile` (lesson 07's exercise files) stays private and leaves nothing.
    Kept short: sockets in it need paths under 108 bytes."""
    folder = sub.work.parent / f"{kind}{sub.index:03d}"
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)


def _kernel_env(opts: GradeOptions, sub: _Sub, handin: Path, slot: int = 0) -> dict:
    from course_utils.grading.reap import ENV
    env = {k: v for k, v in os.environ.items() if k not in _CLEAN_ENV}
    env.update({"COURSE_SMOKE": "1" if opts.smoke else "0", "COURSE_NOTEBOOK": sub.sid,
                "COURSE_HANDIN_DIR": str(handin), "PYTHONUNBUFFERED": "1",
                "TMPDIR": _tmp_dir(sub, "t"), ENV: f"{opts.run_id}/k{sub.index}"})
    if opts.gpus:   # each notebook running side by side gets a device of its own
        env["CUDA_VISIBLE_DEVICES"] = opts.gpus[slot % len(opts.gpus)]
    if opts.jobs > 1:   # notebooks running side by side share the cores instead of fighting for them
        from course_utils.env import usable_cores
        share = str(max(1, usable_cores() // opts.jobs))
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, share)
    return env


def _checker_env(opts: GradeOptions, sub: _Sub, exercise_id: str) -> dict:
    from course_utils.grading.reap import ENV
    env = {k: v for k, v in os.environ.items() if k not in _CLEAN_ENV}
    env.update({"COURSE_SMOKE": "1" if opts.smoke else "0", "COURSE_NOTEBOOK": sub.sid, "PYTHONUNBUFFERED": "1",
                "TMPDIR": _tmp_dir(sub, "c"), ENV: f"{opts.run_id}/c{sub.index}-{exercise_id}"})
    if opts.gpus:   # every check on the same device, so that speed-graded checks compare
        env["CUDA_VISIBLE_DEVICES"] = opts.gpus[0]
    return env


async def _execute_in_runner(sub: _Sub, opts: GradeOptions, env: dict) -> "object":
    """Run `sub.prepared` in a runner process of its own (`grading.runner`), which starts the kernel:
    the kernel's parent is that runner, never the grader. Returns the `kernel.Execution`; the
    executed notebook replaces `sub.prepared.nb`. A runner that dies (its kernel killed it) costs
    this notebook only: the cells from the one that was running on are reported as not run."""
    import pickle

    import nbformat

    from course_utils.grading import reap
    from course_utils.grading.kernel import Execution
    job = {"prepared": str(sub.work / "prepared.pkl"), "cwd": str(sub.work / "cwd"), "env": env,
           "cell_timeout_s": opts.cell_timeout_s, "notebook_timeout_s": opts.notebook_timeout_s,
           "log": str(sub.work / "kernel.log"), "executed": str(sub.work / "executed.ipynb"), "parent": os.getpid()}
    (sub.work / "prepared.pkl").write_bytes(pickle.dumps(sub.prepared))
    (sub.work / "job.json").write_text(json.dumps(job))
    runner_env = {k: v for k, v in os.environ.items() if k not in _CLEAN_ENV}
    runner_env.update({reap.ENV: env[reap.ENV], "JUPYTER_RUNTIME_DIR": str(sub.work / "runtime"),
                       "PYTHONUNBUFFERED": "1"})
    last, execution = None, None
    t0 = time.monotonic()
    with open(sub.work / "runner.log", "ab") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "course_utils.grading.runner", str(sub.work / "job.json"),
            stdin=subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=log, env=runner_env, cwd=str(ROOT),
            start_new_session=True, limit=1 << 24)
        try:
            while line := await proc.stdout.readline():
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if "cell" in message:
                    last = int(message["cell"])
                elif "execution" in message:
                    execution = message["execution"]
            await proc.wait()
        finally:
            if proc.returncode is None:
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass
                await proc.wait()
            reap.kill_marked(env[reap.ENV])   # its kernel, and anything the kernel started, with its marker
    if execution is not None and proc.returncode == 0:
        x = Execution(**{**execution, "failures": {int(k): v for k, v in execution["failures"].items()}})
        try:
            sub.prepared.nb = nbformat.read(str(sub.work / "executed.ipynb"), as_version=4)
        except Exception:
            pass
        return x
    how = f"was killed by {_signal_name(-proc.returncode)}" if proc.returncode < 0 else \
        f"exited with status {proc.returncode}"
    x = Execution(seconds=time.monotonic() - t0)
    if last is None:
        x.startup_error = f"the grader's runner for this notebook {how} before its kernel ran a cell (see runner.log)"
        x.not_run_from, x.not_run_reason = 0, "its runner stopped"
        return x
    x.failures[last] = (f"stopped the process that ran its kernel (the grader's runner for this notebook "
                        f"{how}: did the notebook kill its kernel's parent?)")
    x.not_run_from = last + 1
    x.not_run_reason = ("the notebook stopped the process that ran it (its outputs are lost; what it handed in "
                        "before was graded, and so were the other notebooks)")
    return x


def _signal_name(number: int) -> str:
    import signal as _signal
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


async def _run_notebook(sub: _Sub, opts: GradeOptions, work_root: Path, total: int, slot: int = 0) -> None:
    from course_utils.grading.prepare import prepare

    t0 = time.monotonic()
    index = sub.index
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in sub.sid)
    sub.work = work_root / f"{index:03d}-{safe}"
    cwd, handin = sub.work / "cwd", sub.work / "handin"
    _support_files(cwd)
    handin.mkdir(parents=True, exist_ok=True)
    sub.prepared = prepare(sub.nb, sub.lesson, smoke=opts.smoke)
    sub.notes += sub.prepared.notes
    _say(opts, f"[{index}/{total}] running {sub.sid} as {sub.lesson.label} "
               f"({'smoke' if opts.smoke else 'full size'}) ...")
    sub.execution = await _execute_in_runner(sub, opts, _kernel_env(opts, sub, handin, slot))
    for e in sub.lesson.exercises:
        payload = handin / f"{e.id}.pkl"
        if payload.exists():
            sub.handed[e.id] = hashlib.sha256(payload.read_bytes()).hexdigest()
    sub.notebook_s = time.monotonic() - t0
    x = sub.execution
    _say(opts, f"[{index}/{total}] {sub.sid}: ran in {x.seconds:.0f} s"
               + (f", {len(x.failures)} cell(s) failed" if x.failures else "")
               + (f", kernel restarted {x.restarts}x" if x.restarts else ""))


async def _run_all(subs: list[_Sub], opts: GradeOptions, work_root: Path, total: int | None = None) -> None:
    """Run the notebooks of `subs`, `opts.jobs` at a time."""
    slots: asyncio.Queue = asyncio.Queue()
    for slot in range(opts.jobs):
        slots.put_nowait(slot)
    for i, sub in enumerate(subs, start=1):
        sub.index = sub.index or i

    async def one(sub):
        slot = await slots.get()
        try:
            await _run_notebook(sub, opts, work_root, total or len(subs), slot)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            sub.status, sub.reason = "grader_error", f"the grader failed running it: {type(exc).__name__}: {exc}"
        finally:
            slots.put_nowait(slot)

    await asyncio.gather(*(one(s) for s in subs if s.status == "graded"))


class _Checker:
    """The trusted checker process (see course_utils.grading.checker)."""

    def __init__(self, modules: list[str], log: Path, marker: str = ""):
        self.modules, self.log, self.marker = modules, open(log, "ab"), marker
        self._start()

    def _start(self) -> None:
        from course_utils.grading.reap import ENV
        modules = self.modules
        env = {k: v for k, v in os.environ.items() if k not in _CLEAN_ENV}
        env["COURSE_GRADER_PID"] = str(os.getpid())   # the checker dies with the grader (reap.die_with_parent)
        if self.marker:
            env[ENV] = self.marker
        self.proc = subprocess.Popen([sys.executable, "-m", "course_utils.grading.checker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     env=env, cwd=str(ROOT), start_new_session=True)
        self._send({"preload": modules})
        ready = self._receive(600)
        if not ready or not ready.get("ready"):
            raise RuntimeError("the checker process did not start (see its log)")
        self.errors = ready.get("errors", {})
        self.next_id = 0

    def _send(self, message: dict) -> None:
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def _receive(self, timeout: float):
        import select
        deadline = time.monotonic() + timeout
        line = b""
        fd = self.proc.stdout.fileno()
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None and not select.select([fd], [], [], 0)[0]:
                return None
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                line += chunk
        return json.loads(line.decode())

    def run(self, task: dict) -> dict:
        self.next_id += 1
        task["id"] = self.next_id
        self._send(task)
        answer = self._receive(float(task["limit_s"]) + 60)
        if answer is None or answer.get("id") != task["id"]:
            raise RuntimeError("the checker process stopped answering")
        return answer

    @property
    def dead(self) -> bool:
        try:
            self.proc.wait(timeout=5)   # it closed its pipe: give the kernel a moment to reap it
        except subprocess.TimeoutExpired:
            return False
        return True

    def restart(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except Exception:
            pass
        self._start()

    def close(self, now: bool = False) -> None:
        """End the checker: politely (it finishes the check it runs), or `now`."""
        try:
            if now:
                self.proc.kill()
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()
        self.log.close()


def _grace(limit_s: float) -> float:
    """How long past its own limit a check's process may take to stop on its own (it ends what it
    started) before it is killed: half its limit, 5 to 60 s."""
    return min(CHECK_GRACE_S, max(5.0, limit_s / 2))


def _limit_sentence(exercise_id: str) -> str | None:
    from course_utils.checks import _core
    spec = _core._REGISTRY.get(exercise_id)
    return _core.limit_sentence(spec) if spec is not None else None


def _check_task(sub: _Sub, e, opts: GradeOptions, seed: int) -> dict:
    """What the checker needs to run exercise `e`'s check on what `sub` handed in."""
    return {"exercise": e.id, "payload": str(sub.work / "handin" / f"{e.id}.pkl"), "cwd": str(sub.work / "cwd"),
            "env": _checker_env(opts, sub, e.id), "seed": _exercise_seed(seed, e.id),
            "limit_s": e.time_limit_s + _grace(e.time_limit_s), "limit_sentence": _limit_sentence(e.id),
            "log": str(sub.work / f"check-{e.id}.log")}


def _check_one(sub: _Sub, checker: _Checker, opts: GradeOptions, seed: int) -> None:
    from course_utils.grading.review import pickle_flags
    prep, x = sub.prepared, sub.execution
    handin = sub.work / "handin"
    for e in sub.lesson.exercises:
        record = {"exercise": e.id, "title": e.title, "status": "missing", "points": 0, "max_points": e.points,
                  "message": "", "seconds": 0.0, "seed": None}
        learner = prep.exercise_cells.get(e.id)
        learner_failed = learner is not None and learner in x.failures
        context = f"{prep.label(learner)} {x.failures[learner]}" if learner_failed else ""
        payload, err = handin / f"{e.id}.pkl", handin / f"{e.id}.err"
        here = prep.handin_cells.get(e.id)
        if e.id in sub.handed and payload.exists():
            data = payload.read_bytes()
            sub.review += [f"exercise {e.id}: {flag}" for flag in pickle_flags(data)]
            if hashlib.sha256(data).hexdigest() != sub.handed[e.id]:
                record["status"], record["message"] = "error", (
                    "the object handed in changed after the notebook had finished (another process wrote it); "
                    "it was not graded")
            else:
                seed_e = _exercise_seed(seed, e.id)
                task = _check_task(sub, e, opts, seed)
                try:
                    answer = checker.run(task)
                except Exception as exc:
                    answer = {"status": "grader_error", "message": f"{exc}", "seconds": 0.0}
                    if checker.dead:   # killed from inside a check (or the grader's own crash): go on
                        code = checker.proc.returncode
                        answer = {"status": "error", "seconds": 0.0, "review": [
                                  f"killed the grader's checker process (exit status {code})"],
                                  "message": f"the grader's checker process died during this check (exit status "
                                             f"{code}); it was restarted for the checks after it"}
                        checker.restart()
                if answer["status"] == "grader_error":
                    sub.status, sub.reason = "grader_error", answer["message"]
                    record["status"], record["message"] = "error", f"not graded: {answer['message']}"
                else:
                    record.update(status=answer["status"], message=answer["message"], seconds=answer["seconds"],
                                  seed=seed_e)
                    sub.review += [f"exercise {e.id}: the object handed in {r}" for r in answer.get("review", [])]
                    if answer.get("left_behind"):
                        sub.notes.append(f"the check of exercise {e.id} left {answer['left_behind']} process(es) "
                                         "running; the grader killed them")
                    if record["status"] != "pass" and context:
                        record["message"] += f" (note: {context})"
        elif err.exists():
            text = err.read_text(errors="replace")[:2000]
            status = "missing" if text.startswith("missing:") else "error"
            text = text.removeprefix("missing:")
            record["status"] = "error" if learner_failed else status
            record["message"] = f"{context}; {text}" if context else text
        else:
            if here is not None and here in x.failures:
                record["message"] = f"its restored check cell {x.failures[here]}"
            elif x.not_run_from is not None and (here is None or here >= x.not_run_from):
                record["message"] = f"never reached: {x.not_run_reason}"
            else:
                record["message"] = "its check cell handed nothing in"
            if context:
                record["message"] = f"{context}; {record['message']}"
        record["points"] = e.points if record["status"] == "pass" else 0
        sub.records.append(record)


def _recheck_busy(subs: list[_Sub], checker: _Checker, opts: GradeOptions, seed: int, saved) -> None:
    """Run again, once the machine is quieter, every check that found it too busy to judge speed
    (`course_utils.grading.busy`); `saved(sub)` writes a submission's row again after its checks."""
    from course_utils.grading import busy
    for attempt in range(1, opts.busy_retries + 1):
        pending = [(sub, r) for sub in subs if sub.status == "graded" for r in sub.records if r["status"] == "busy"]
        if not pending:
            return
        quiet, others = busy.wait_until_quiet(opts.busy_wait_s, say=lambda text: _say(opts, text))
        _say(opts, f"running {len(pending)} check(s) again that found the machine busy (try {attempt} of "
                   f"{opts.busy_retries}" + ("" if quiet else f"; still busy: other programs use {others:.1f} cores")
                   + ") ...")
        for sub, record in pending:
            e = next(x for x in sub.lesson.exercises if x.id == record["exercise"])
            try:
                answer = checker.run(_check_task(sub, e, opts, seed))
            except Exception:
                if checker.dead:
                    checker.restart()
                continue          # it stays "not graded"
            if answer["status"] == "grader_error":
                continue
            record.update(status=answer["status"], message=answer["message"], seconds=answer["seconds"],
                          points=e.points if answer["status"] == "pass" else 0)
            if answer["status"] != "busy":
                record["message"] += f" (graded on try {attempt + 1}: the machine was busy before)"
            sub.review += [f"exercise {e.id}: the object handed in {r}" for r in answer.get("review", [])]
        for sub in {id(s): s for s, _ in pending}.values():
            left = busy.busy_exercises(sub.records)
            if left and attempt == opts.busy_retries:
                sub.notes.append(f"not graded: exercise(s) {', '.join(left)} found the machine too busy to judge speed "
                                 f"{opts.busy_retries + 1} times; run the same command again when it is quieter")
            saved(sub)


def _problems(sub: _Sub) -> None:
    """One sentence per cell that failed outside the exercises, and per kernel event."""
    prep, x = sub.prepared, sub.execution
    mine = set(prep.exercise_cells.values()) | set(prep.handin_cells.values())
    for index in sorted(x.failures):
        if index not in mine:
            sub.notes.append(f"{prep.label(index)} {x.failures[index]}")
    sub.notes += x.events
    if x.not_run_from is not None and x.not_run_reason:
        sub.notes.append(f"cells from {prep.label(x.not_run_from) if x.not_run_from < len(prep.nb.cells) else 'the end'} "
                         f"on were not run: {x.not_run_reason}")
    if x.startup_error:
        sub.status, sub.reason = "grader_error", x.startup_error


def _executed_copy(sub: _Sub, opts: GradeOptions, run: dict) -> None:
    import nbformat
    from course_utils.grading.report import verdict_line

    nb = copy.deepcopy(sub.prepared.nb)
    by_exercise = {r["exercise"]: r for r in sub.records}
    for e_id, index in sub.prepared.handin_cells.items():
        record = by_exercise.get(e_id)
        if record:
            nb.cells[index].outputs.append(nbformat.v4.new_output("stream", name="stdout",
                                                                  text=verdict_line(record) + "\n"))
    d = sub.as_dict()
    lines = [f"**Graded by `course_utils.grade`** ({'smoke' if opts.smoke else 'full size'}, seed {run['seed']}, "
             f"{run['started']}): **{d['points']}/{d['max_points']} points** as {sub.lesson.label}."]
    lines += [f"- note: {n}" for n in sub.notes] + [f"- REVIEW: {f}" for f in sub.review]
    summary = nbformat.v4.new_markdown_cell("\n".join(lines))
    from course_utils.grading.prepare import _unique
    summary["id"] = _unique("grader-summary", {c.get("id") for c in nb.cells})
    nb.cells.insert(0, summary)
    name = sub.sid if sub.sid.endswith(".ipynb") else sub.sid + ".ipynb"
    dest = Path(opts.output_dir) / name
    from course_utils.grading.results import atomic_write
    atomic_write(dest, nbformat.writes(nb) + "\n")
    sub.executed = str(dest)


def _identify(sub: _Sub, opts: GradeOptions, lessons: dict) -> None:
    sub.expected = _expected(opts, lessons, sub)
    _read(sub)
    if sub.nb is None:
        sub.records = _missing_records(sub.expected, f"not graded: {sub.reason}")
        return
    ident = _lessons.identify(sub.nb, lessons, expected=sub.expected)
    sub.lesson = ident.lesson
    if ident.note:
        sub.notes.append(ident.note)
    if ident.mismatch:
        announced = "--lesson" if opts.lesson else "its file name"
        what = ident.lesson.label if ident.lesson else "no released lesson"
        sub.status = "not_graded"
        sub.reason = (f"it is {what}, not {sub.expected.label} as {announced} says; rename it or grade it "
                      f"with --lesson {ident.lesson.name[:2] if ident.lesson else 'NN'}")
        sub.records = _missing_records(sub.expected, f"not graded: {sub.reason}")
        return
    if ident.lesson is None:
        sub.status, sub.reason = "not_graded", f"the grader cannot tell which lesson it is: {ident.note}"
        return
    if ident.lesson.error:
        sub.status, sub.reason = "grader_error", f"the course's {ident.lesson.label} cannot be graded: {ident.lesson.error}"
        sub.records = _missing_records(ident.lesson, f"not graded: {sub.reason}")
        return
    from course_utils.grading.lessons import released_lines
    from course_utils.grading.review import review_flags
    sub.review = review_flags(sub.nb, released_lines(ident.lesson))


def _expected(opts: GradeOptions, lessons: dict, sub: _Sub) -> Lesson | None:
    if opts.lesson:
        return lessons[opts.lesson]
    return _lessons.expected_from_name(sub.path.name, lessons)


def _resolve_lesson_arg(value: str, lessons: dict) -> str:
    for name, lesson in lessons.items():
        if value in (name, name[:2], str(lesson.number)):
            return name
    raise ValueError(f"--lesson {value!r} is not a released lesson ({', '.join(lessons)})")


class GradingInterrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived while grading (raised by the command line's handler)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _CannotSave(Exception):
    pass


def _course_sha256() -> str:
    """One sha256 of the course's own code (course_utils/): a change to it regrades everything."""
    from course_utils.grading.checker import course_fingerprint
    code = {k: v for k, v in course_fingerprint().items() if k.startswith("course_utils")}
    return hashlib.sha256(json.dumps(code, sort_keys=True).encode()).hexdigest()


def _pending_row(sub: _Sub, why: str) -> dict:
    row = sub.as_dict()
    row.update(status="pending", reason=why)
    row["exercises"] = _missing_records(sub.lesson, f"not graded yet: {why}")
    row["max_points"] = sum(r["max_points"] for r in row["exercises"])
    return row


def _keep(sub: _Sub, stored: dict | None, opts: GradeOptions) -> bool:
    """Is `stored` (this submission's row in the results file) still its result?"""
    from course_utils.grading.results import KEY_FIELDS
    if opts.regrade or not stored or stored.get("status") != "graded" or sub.key is None:
        return False
    if any(r.get("status") == "busy" for r in stored.get("exercises", [])):   # not graded yet: the machine was busy
        return False
    grading = stored.get("grading") or {}
    if any(grading.get(k) != sub.key[k] for k in KEY_FIELDS):
        return False
    if opts.output_dir:   # its executed copy must be where this run puts it
        name = sub.sid if sub.sid.endswith(".ipynb") else sub.sid + ".ipynb"
        dest = Path(opts.output_dir) / name
        if stored.get("executed") != str(dest) or not dest.exists():
            return False
    return True


def _finish(sub: _Sub, checker, opts: GradeOptions, seed: int, run: dict, total: int) -> None:
    """After its notebook ran: the notes, every check in the checker, the executed copy."""
    i = sub.index
    if sub.status != "graded" or sub.execution is None:
        if sub.status == "graded":
            sub.status, sub.reason = "grader_error", "its notebook did not run"
        sub.records = sub.records or _missing_records(sub.lesson, f"not graded: {sub.reason}")
        return
    _problems(sub)
    if sub.status != "graded":
        sub.records = _missing_records(sub.lesson, f"not graded: {sub.reason}")
        return
    _say(opts, f"[{i}/{total}] checking {sub.sid} (each check alone, in the grader's checker) ...")
    t_checks = time.monotonic()
    try:
        _check_one(sub, checker, opts, seed)
        sub.checks_s = time.monotonic() - t_checks
    except Exception as exc:   # the grader's own bug: this submission gets a row all the same
        sub.status, sub.reason = "grader_error", f"the grader failed checking it: {type(exc).__name__}: {exc}"
        done = {r["exercise"] for r in sub.records}
        sub.records += [r for r in _missing_records(sub.lesson, f"not graded: {sub.reason}") if r["exercise"] not in done]
        return
    d = sub.as_dict()
    _say(opts, f"[{i}/{total}] {sub.sid}: {d['points']}/{d['max_points']} points")
    if opts.output_dir:
        try:
            _executed_copy(sub, opts, run)
        except Exception as exc:
            sub.notes.append(f"its executed copy could not be written: {type(exc).__name__}: {exc}")


def grade(paths, options: GradeOptions | None = None) -> tuple[int, dict, list[dict]]:
    """Grade notebooks; returns (exit status, run information, the gradebook: one dict per submission).

    With `options.json`, the results file is written after every submission (atomically: a kill at
    any instant leaves a valid file holding every submission graded so far), and a run of the same
    command resumes: a submission whose file, released lesson, course and seed are unchanged keeps
    its result (`regrade=True` grades all again); rows of submissions not named stay in the file,
    and the gradebook returned is the file's. The exit status is that of the submissions named:
    0 all passed, 1 not, 3 the grader could not grade them all, 128 + N interrupted by signal N."""
    import dataclasses
    import signal as _signal

    from course_utils.grading import reap, report
    from course_utils.grading.results import ResultsFile
    opts = dataclasses.replace(options or GradeOptions(), run_id=f"grade-{secrets.token_hex(6)}")
    t_start = time.monotonic()
    results = ResultsFile(opts.json) if opts.json else None
    if results is not None:
        results.lock()   # ResultsError: another grader writes this file
    try:
        previous = results.load() if results is not None else None
        before = previous["grader"] if previous else {}
        seed = opts.seed if opts.seed is not None else (
            before["seed"] if isinstance(before.get("seed"), int) else secrets.randbelow(2**31))
        run = {"seed": seed, "smoke": opts.smoke, "cell_timeout_s": opts.cell_timeout_s,
               "notebook_timeout_s": opts.notebook_timeout_s, "jobs": opts.jobs, "gpus": list(opts.gpus),
               "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
               "host": platform.node(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
               "argv": sys.argv[1:], "lesson": opts.lesson, "run": opts.run_id, "complete": False,
               "interrupted": None, "exit_status": None, "graded_now": 0, "kept": 0, "pending": 0,
               "history": (before.get("history") or []) + ([{k: before.get(k) for k in (
                   "run", "started", "seconds", "graded_now", "kept", "complete", "interrupted", "exit_status")}]
                   if before else [])}
        if previous and opts.seed is None:
            _say(opts, f"seed {seed}, from {opts.json} (the seed of the run that wrote it)")
        if before and not before.get("complete") and str(before.get("run", "")).startswith("grade-"):
            reap.kill_marked(before["run"] + "/", prefix=True)   # what a killed run may have left running
        paths = [Path(p) for p in paths]
        seen, unique = set(), []
        for p in paths:
            key = p.resolve()
            if key not in seen:
                seen.add(key)
                unique.append(p)
        subs = [_Sub(p, sid) for p, sid in zip(unique, _ids(unique))] if unique else []
        grader_failure = None
        try:
            lessons = _lessons.released_lessons(opts.solutions)
            if opts.lesson:
                opts.lesson = _resolve_lesson_arg(opts.lesson, lessons)
        except (LessonError, ValueError) as exc:
            lessons, grader_failure = {}, f"the course's released lessons cannot be graded: {exc}"
        for sub in subs:
            if grader_failure:
                sub.status, sub.reason = "grader_error", grader_failure
                continue
            try:
                _identify(sub, opts, lessons)
            except Exception as exc:   # the grader's own bug: this submission still gets a row
                sub.status, sub.reason = "grader_error", f"the grader failed reading it: {type(exc).__name__}: {exc}"

        # what is kept from the results file, and the gradebook: its rows first, in their order
        course_sha = _course_sha256()
        book: dict[str, dict] = {}
        for row in (previous or {}).get("submissions", []):
            book[(row.get("grading") or {}).get("abspath") or str(Path(row["path"]).resolve())] = row
        for sub in subs:
            if sub.status == "graded" and sub.lesson is not None:
                sub.key = {"file_sha256": sub.sha256,
                           "lesson_sha256": hashlib.sha256(sub.lesson.path.read_bytes()).hexdigest(),
                           "course_sha256": course_sha, "seed": seed, "smoke": opts.smoke,
                           "cell_timeout_s": opts.cell_timeout_s, "notebook_timeout_s": opts.notebook_timeout_s}
                if _keep(sub, book.get(sub.abspath), opts):
                    sub.kept = dict(book[sub.abspath], submission=sub.sid, path=str(sub.path))
        to_grade = [s for s in subs if s.status == "graded" and s.kept is None]
        for i, sub in enumerate(to_grade, start=1):
            sub.index = i

        def row_of(sub: _Sub) -> dict:
            if sub.kept is not None:
                return sub.kept
            row = sub.as_dict()
            if sub.key is not None and sub.status == "graded":
                row["grading"] = dict(sub.key, abspath=sub.abspath, run=opts.run_id,
                                      graded_at=_dt.datetime.now().astimezone().isoformat(timespec="seconds"))
            return row

        for sub in subs:
            book[sub.abspath] = _pending_row(sub, "not graded yet") if sub in to_grade else row_of(sub)
            if sub.kept is not None:
                g = sub.kept.get("grading") or {}
                _say(opts, f"[kept] {sub.sid}: {sub.kept['points']}/{sub.kept['max_points']} points, graded "
                           f"{g.get('graded_at', 'before')} (its file, lesson, course and seed are unchanged; "
                           "--regrade grades it again)")
        named = [s.abspath for s in subs]

        def save() -> None:
            rows = list(book.values())
            mine = [book[a] for a in named]
            run.update(graded_now=sum(1 for s in to_grade if book[s.abspath]["status"] != "pending"),
                       kept=sum(1 for s in subs if s.kept is not None),
                       pending=sum(1 for r in mine if r["status"] == "pending"),
                       seconds=round(time.monotonic() - t_start, 1))
            try:
                if results is not None:
                    results.write(run, rows)
                if opts.csv:
                    report.write_csv(opts.csv, rows)
            except OSError as exc:
                raise _CannotSave(f"{type(exc).__name__}: {exc}") from None

        work_root = Path(tempfile.mkdtemp(prefix="course-grade-"))
        checker = None
        interrupted = None
        cannot_save = None
        try:
            save()
            if to_grade:
                # the checker starts before any submission runs, and imports the course's checks now
                modules = sorted({f"course_utils.checks.lesson{s.lesson.number:02d}" for s in to_grade})
                try:
                    checker = _Checker(modules, work_root / "checker.log", marker=f"{opts.run_id}/checker")
                    for module, error in checker.errors.items():
                        grader_failure = f"the course's checks ({module}) do not import: {error}"
                except Exception as exc:
                    grader_failure = f"the grader's checker process could not start: {exc}"
                if grader_failure:
                    for sub in to_grade:
                        sub.status, sub.reason = "grader_error", grader_failure
                        sub.records = _missing_records(sub.lesson, f"not graded: {grader_failure}")
                        book[sub.abspath] = row_of(sub)
                    to_grade = []
                    save()
            # in waves of --jobs notebooks side by side, then their checks alone on a quiet machine,
            # then their rows written: an interruption loses at most the wave that was running
            for start in range(0, len(to_grade), opts.jobs):
                wave = to_grade[start:start + opts.jobs]
                asyncio.run(_run_all(wave, opts, work_root, total=len(to_grade)))
                reap.kill_marked(opts.run_id + "/k", prefix=True)   # the checks measure a machine no notebook uses
                for sub in wave:
                    _finish(sub, checker, opts, seed, run, len(to_grade))
                    book[sub.abspath] = row_of(sub)
                    save()
            if checker is not None:   # the checks that found the machine too busy, once it is quieter

                def saved(sub: _Sub) -> None:
                    if opts.output_dir:
                        try:
                            _executed_copy(sub, opts, run)
                        except Exception as exc:
                            sub.notes.append(f"its executed copy could not be written: {type(exc).__name__}: {exc}")
                    book[sub.abspath] = row_of(sub)
                    save()
                _recheck_busy(to_grade, checker, opts, seed, saved)
        except KeyboardInterrupt as exc:
            interrupted = getattr(exc, "signum", _signal.SIGINT)
        except _CannotSave as exc:
            cannot_save = str(exc)
        finally:
            if checker is not None:
                checker.close(now=interrupted is not None)
            reap.kill_marked(opts.run_id + "/", prefix=True)   # anything a kernel or a check left running
            shutil.rmtree(work_root, ignore_errors=True)
        mine = [book[a] for a in named]
        if interrupted is not None:
            why = (f"grading was interrupted ({_signal_name(interrupted)}) before it was graded; run the same "
                   "command again to grade it")
            for sub in subs:
                if book[sub.abspath]["status"] == "pending":
                    book[sub.abspath] = _pending_row(sub, why)
            mine = [book[a] for a in named]
            code = 128 + int(interrupted)
            run["interrupted"] = _signal_name(interrupted)
        elif cannot_save or any(r["status"] in ("grader_error", "pending") for r in mine) or \
                any(e["status"] == "busy" for r in mine for e in r["exercises"]):   # not graded: the machine was busy
            code = EXIT_GRADER
        elif mine and all(r["status"] == "graded" and r["exercises"] and all(e["status"] == "pass" for e in r["exercises"])
                          for r in mine):
            code = EXIT_PASSED
        else:
            code = EXIT_NOT_PASSED
        run["exit_status"] = code
        run["complete"] = not any(r["status"] == "pending" for r in mine)
        if cannot_save:
            run["error"] = f"the results could not be written ({cannot_save}); grading stopped"
            _say(opts, f"the grader could not write its results ({cannot_save}): it stopped. "
                       f"{opts.json or opts.csv} still holds every submission graded before; free the space "
                       "and run the same command again to grade the rest.")
        else:
            try:
                save()
            except _CannotSave as exc:
                run["error"] = f"the results could not be written ({exc})"
                code = code if interrupted is not None else EXIT_GRADER
                run["exit_status"] = code
        return code, run, list(book.values())
    finally:
        if results is not None:
            results.close()


MAX_LIMIT_S = 7 * 24 * 3600.0   # a week: anything longer is a typo, not a limit


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a time limit must be a positive number of seconds")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a limit under 1 s leaves no time to start a kernel")
    if value > MAX_LIMIT_S:
        raise argparse.ArgumentTypeError(f"{text!r}: a limit over a week ({MAX_LIMIT_S:g} s) is not a limit")
    return value


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"--jobs {value}: use 1 to 64 notebooks at a time")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value < 2**31:
        raise argparse.ArgumentTypeError("a seed is a whole number from 0 to 2**31 - 1")
    return value


def main(argv=None) -> int:
    import signal as _signal

    from course_utils.grading.runner import light_imports
    light_imports()
    parser = argparse.ArgumentParser(prog="python -m course_utils.grade",
                                     description=__doc__.split("\n\n")[0],
                                     epilog="Exit status: 0 all passed, 1 not, 2 bad arguments, "
                                            "3 the grader could not grade everything, 128 + N interrupted by "
                                            "signal N (130 Ctrl-C, 143 SIGTERM): run the same command again to "
                                            "grade what is missing.")
    parser.add_argument("notebooks", nargs="+", help="submitted notebooks (identified by their paths)")
    parser.add_argument("--smoke", action="store_true", help="quick sizes (SMOKE parameter, COURSE_SMOKE=1)")
    parser.add_argument("--json", metavar="FILE", help="the results file: every result, written as soon as it is "
                        "graded; run the same command again to grade only what is missing")
    parser.add_argument("--csv", metavar="FILE", help="write the gradebook to FILE (CSV: a row per submission), "
                        "rebuilt after every submission")
    parser.add_argument("--regrade", action="store_true", help="grade every submission again, also those whose "
                        "result in the --json file is kept (same file, lesson, course and seed)")
    parser.add_argument("--output-dir", metavar="DIR", help="keep every executed copy in DIR (by submission path)")
    parser.add_argument("--timeout", type=_positive_seconds, default=DEFAULT_CELL_TIMEOUT_S, metavar="S",
                        help=f"seconds one cell may run (default {DEFAULT_CELL_TIMEOUT_S:g})")
    parser.add_argument("--notebook-timeout", type=_positive_seconds, default=DEFAULT_NOTEBOOK_TIMEOUT_S, metavar="S",
                        help=f"seconds one notebook may run in all (default {DEFAULT_NOTEBOOK_TIMEOUT_S:g})")
    parser.add_argument("--jobs", type=_jobs, default=1, metavar="N",
                        help="notebooks run side by side (checks always run one at a time; default 1)")
    parser.add_argument("--gpus", metavar="LIST", help="devices for the notebooks running side by side, e.g. 0,1 "
                        "(each gets one as CUDA_VISIBLE_DEVICES; the checks all run on the first)")
    parser.add_argument("--seed", type=_seed, metavar="S", help="the checks' seed (default: the --json file's, "
                        "else a new one; recorded)")
    parser.add_argument("--lesson", metavar="NN", help="the lesson every submission must be (default: from file names)")
    parser.add_argument("--busy-retries", type=int, default=2, metavar="N",
                        help="how many more times a speed-graded check that found the machine too busy to judge "
                             "speed runs, once the machine is quieter (default 2)")
    parser.add_argument("--busy-wait", type=_positive_seconds, default=120.0, metavar="S",
                        help="seconds each of those tries waits for the machine to be quiet (default 120)")
    parser.add_argument("--released", metavar="DIR", help="the released lessons to grade against "
                        "(default: this course's solutions/)")
    args = parser.parse_args(argv)
    gpus = tuple(g.strip() for g in (args.gpus or "").split(",") if g.strip())
    if args.gpus is not None and not gpus:
        parser.error("--gpus takes a comma-separated list of devices, e.g. 0,1 or MIG-<uuid>,MIG-<uuid>")
    if args.timeout > args.notebook_timeout:
        parser.error(f"--timeout {args.timeout:g} is longer than --notebook-timeout {args.notebook_timeout:g}")
    missing = [nb for nb in args.notebooks if not Path(nb).is_file()]
    if missing:
        parser.error("no such notebook: " + ", ".join(missing))
    if args.json and args.csv and Path(args.json).resolve() == Path(args.csv).resolve():
        parser.error("--json and --csv name the same file")
    from course_utils.grading import reap
    from course_utils.grading.checker import _non_dumpable
    from course_utils.grading.results import ResultsError
    _non_dumpable()
    opts = GradeOptions(smoke=args.smoke, cell_timeout_s=args.timeout, notebook_timeout_s=args.notebook_timeout,
                        jobs=args.jobs, seed=args.seed, output_dir=Path(args.output_dir) if args.output_dir else None,
                        lesson=args.lesson, solutions=Path(args.released) if args.released else None, gpus=gpus,
                        json=Path(args.json) if args.json else None, csv=Path(args.csv) if args.csv else None,
                        regrade=args.regrade, busy_retries=max(0, args.busy_retries), busy_wait_s=args.busy_wait)
    from course_utils.grading import report
    code, run, subs = EXIT_GRADER, {"seed": args.seed}, []
    fired: list[int] = []

    def stop(signum, frame):   # the first signal stops grading; the ones after it let the clean-up finish
        if not fired:
            fired.append(signum)
            raise GradingInterrupted(signum)

    handled = [s for s in (_signal.SIGINT, _signal.SIGTERM, getattr(_signal, "SIGHUP", None)) if s is not None]
    previous = {s: _signal.signal(s, stop) for s in handled}
    started = time.time()
    try:
        code, run, subs = grade(args.notebooks, opts)
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:   # before grading began
        code = 128 + int(getattr(exc, "signum", _signal.SIGINT))
        print("interrupted", file=sys.stderr)
    except Exception as exc:   # the grader's own bug: say so; the results file holds what was graded
        print(f"the grader failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        run["error"] = f"{type(exc).__name__}: {exc}"
        if args.json and Path(args.json).exists():
            try:
                subs = json.loads(Path(args.json).read_text())["submissions"]
            except Exception:
                pass
    finally:
        reap.kill_children(since=started)
        for s, handler in previous.items():
            _signal.signal(s, handler)
    print()
    print(report.table(subs))
    earned = sum(s["points"] for s in subs)
    possible = sum(s["max_points"] for s in subs)
    kept = run.get("kept") or 0
    if code >= 128:
        pending = run.get("pending", 0)
        verdict = (f"INTERRUPTED ({_signal_name(code - 128)}): {len(subs) - pending} of {len(subs)} submission(s) "
                   f"graded so far, {pending} not yet" + (f"; {args.json} holds them: run the same command again "
                                                          "to grade only what is missing" if args.json else
                                                          " (give --json FILE to resume a run)"))
    else:
        verdict = {EXIT_PASSED: "ALL CHECKS PASSED", EXIT_NOT_PASSED: "NOT ALL CHECKS PASSED",
                   EXIT_GRADER: "THE GRADER COULD NOT GRADE EVERYTHING"}.get(code, "THE GRADER FAILED")
        verdict += f": {earned}/{possible} points over {len(subs)} notebook(s)"
    if kept:
        verdict += f" ({kept} kept from {args.json}, {run.get('graded_now', 0)} graded now)"
    busy = sum(e["status"] == "busy" for s in subs for e in s["exercises"])
    if busy:
        verdict += (f"; {busy} check(s) not graded: the machine was too busy to judge speed, even after "
                    f"{args.busy_retries} more tries: run the same command again when it is quieter")
    print(f"\n{verdict}; seed {run.get('seed')} (regrade with --seed {run.get('seed')})")
    return code


if __name__ == "__main__":
    sys.exit(main())
