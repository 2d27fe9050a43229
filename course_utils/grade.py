"""Grade submitted notebooks headless: `python -m course_utils.grade NOTEBOOK... [options]`.

For each submission the grader
1. tells which released lesson it is (content and `make student`'s metadata; a file named
   `NN-...` must be lesson NN) and takes the exercises and points from the course's own copy;
2. runs the learner's notebook in a fresh kernel, in a private working folder, with every
   check cell replaced by the released one, which hands the exercise's object to the grader
   instead of grading it there; errors, timeouts, `sys.exit` and kernel deaths cost only the
   cells they hit; every process it started is killed when it ends (`grading.reap`);
3. after all notebooks have run (`--jobs N` at a time, each on its own device with
   `--gpus 0,1,...`), runs every check alone, in the grader's own checker process (one forked
   process per check, on a quiet machine), with a seed recorded for regrading;
4. prints a table and writes the JSON (`--json`), a CSV gradebook (`--csv`) and the executed
   copies (`--output-dir`), whatever happened to any one submission.

Exit status: 0 every exercise of every submission passed; 1 not; 2 bad arguments; 3 the
grader itself could not grade everything (a kernel that would not start, an interrupted run,
the course's own files changed during grading). See INSTRUCTORS.md.
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
    run_id: str = ""                   # this run's process marker (course_utils.grading.reap), set by grade()


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
        text = sub.path.read_text(encoding="utf-8")
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


async def _run_notebook(sub: _Sub, opts: GradeOptions, work_root: Path, index: int, total: int,
                        slot: int = 0) -> None:
    from course_utils.grading.kernel import execute
    from course_utils.grading.prepare import prepare

    t0 = time.monotonic()
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in sub.sid)
    sub.work = work_root / f"{index:03d}-{safe}"
    sub.index = index
    cwd, handin = sub.work / "cwd", sub.work / "handin"
    _support_files(cwd)
    handin.mkdir(parents=True, exist_ok=True)
    sub.prepared = prepare(sub.nb, sub.lesson, smoke=opts.smoke)
    sub.notes += sub.prepared.notes
    _say(opts, f"[{index}/{total}] running {sub.sid} as {sub.lesson.label} "
               f"({'smoke' if opts.smoke else 'full size'}) ...")
    sub.execution = await execute(sub.prepared, cwd=cwd, env=_kernel_env(opts, sub, handin, slot),
                                  cell_timeout=opts.cell_timeout_s, notebook_timeout=opts.notebook_timeout_s,
                                  log_path=sub.work / "kernel.log")
    for e in sub.lesson.exercises:
        payload = handin / f"{e.id}.pkl"
        if payload.exists():
            sub.handed[e.id] = hashlib.sha256(payload.read_bytes()).hexdigest()
    sub.notebook_s = time.monotonic() - t0
    x = sub.execution
    _say(opts, f"[{index}/{total}] {sub.sid}: ran in {x.seconds:.0f} s"
               + (f", {len(x.failures)} cell(s) failed" if x.failures else "")
               + (f", kernel restarted {x.restarts}x" if x.restarts else ""))


async def _run_all(subs: list[_Sub], opts: GradeOptions, work_root: Path) -> None:
    slots: asyncio.Queue = asyncio.Queue()
    for slot in range(opts.jobs):
        slots.put_nowait(slot)
    runnable = [s for s in subs if s.status == "graded"]

    async def one(i, sub):
        slot = await slots.get()
        try:
            await _run_notebook(sub, opts, work_root, i, len(runnable), slot)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            sub.status, sub.reason = "grader_error", f"the grader failed running it: {type(exc).__name__}: {exc}"
        finally:
            slots.put_nowait(slot)

    await asyncio.gather(*(one(i, s) for i, s in enumerate(runnable, start=1)))


class _Checker:
    """The trusted checker process (see course_utils.grading.checker)."""

    def __init__(self, modules: list[str], log: Path, marker: str = ""):
        self.modules, self.log, self.marker = modules, open(log, "ab"), marker
        self._start()

    def _start(self) -> None:
        from course_utils.grading.reap import ENV
        modules = self.modules
        env = {k: v for k, v in os.environ.items() if k not in _CLEAN_ENV}
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

    def close(self) -> None:
        try:
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


def _check_one(sub: _Sub, checker: _Checker, opts: GradeOptions, seed: int) -> None:
    from course_utils.grading.review import pickle_flags
    prep, x = sub.prepared, sub.execution
    handin = sub.work / "handin"
    cwd = sub.work / "cwd"
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
                task = {"exercise": e.id, "payload": str(payload), "cwd": str(cwd), "env": _checker_env(opts, sub, e.id),
                        "seed": seed_e, "limit_s": e.time_limit_s + _grace(e.time_limit_s),
                        "limit_sentence": _limit_sentence(e.id),
                        "log": str(sub.work / f"check-{e.id}.log")}
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
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(dest))
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


def grade(paths, options: GradeOptions | None = None) -> tuple[int, dict, list[dict]]:
    """Grade notebooks; returns (exit status, run information, one dict per submission)."""
    import dataclasses
    opts = dataclasses.replace(options or GradeOptions(), run_id=f"grade-{secrets.token_hex(6)}")
    t_start, started = time.monotonic(), time.time()
    seed = opts.seed if opts.seed is not None else secrets.randbelow(2**31)
    run = {"seed": seed, "smoke": opts.smoke, "cell_timeout_s": opts.cell_timeout_s,
           "notebook_timeout_s": opts.notebook_timeout_s, "jobs": opts.jobs, "gpus": list(opts.gpus),
           "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
           "host": platform.node(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
           "argv": sys.argv[1:], "lesson": opts.lesson}
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

    runnable = [s for s in subs if s.status == "graded"]
    work_root = Path(tempfile.mkdtemp(prefix="course-grade-"))
    checker = None
    interrupted = False
    try:
        if runnable:
            # the checker starts before any submission runs, and imports the course's checks now
            modules = sorted({f"course_utils.checks.lesson{s.lesson.number:02d}" for s in runnable})
            try:
                checker = _Checker(modules, work_root / "checker.log", marker=f"{opts.run_id}/checker")
                for module, error in checker.errors.items():
                    grader_failure = f"the course's checks ({module}) do not import: {error}"
            except Exception as exc:
                grader_failure = f"the grader's checker process could not start: {exc}"
            if grader_failure:
                for s in runnable:
                    s.status, s.reason = "grader_error", grader_failure
                    s.records = _missing_records(s.lesson, f"not graded: {grader_failure}")
                runnable = []
        try:
            asyncio.run(_run_all(runnable, opts, work_root))
        except KeyboardInterrupt:
            interrupted = True
        from course_utils.grading import reap
        reap.kill_marked(opts.run_id + "/k", prefix=True)   # the checks measure a machine no submission uses
        if reap.is_subreaper():   # and what a kernel orphaned without its marker (env -i, double fork)
            reap.kill_children(keep=[checker.proc.pid] if checker is not None else [], since=started)
        for i, sub in enumerate(runnable, start=1):
            if sub.status != "graded" or sub.execution is None:
                if sub.status == "graded":
                    sub.status, sub.reason = "grader_error", "grading was interrupted before it ran"
                sub.records = sub.records or _missing_records(sub.lesson, f"not graded: {sub.reason}")
                continue
            if interrupted:
                sub.status, sub.reason = "grader_error", "grading was interrupted"
                sub.records = _missing_records(sub.lesson, "not graded: grading was interrupted")
                continue
            _problems(sub)
            if sub.status != "graded":
                sub.records = _missing_records(sub.lesson, f"not graded: {sub.reason}")
                continue
            _say(opts, f"[{i}/{len(runnable)}] checking {sub.sid} (each check alone, in the grader's checker) ...")
            t_checks = time.monotonic()
            try:
                _check_one(sub, checker, opts, seed)
                sub.checks_s = time.monotonic() - t_checks
            except KeyboardInterrupt:
                interrupted = True
                sub.status, sub.reason = "grader_error", "grading was interrupted"
                sub.records = _missing_records(sub.lesson, "not graded: grading was interrupted")
                continue
            except Exception as exc:   # the grader's own bug: this submission gets a row all the same
                sub.status, sub.reason = "grader_error", f"the grader failed checking it: {type(exc).__name__}: {exc}"
                done = {r["exercise"] for r in sub.records}
                sub.records += [r for r in _missing_records(sub.lesson, f"not graded: {sub.reason}")
                                if r["exercise"] not in done]
                continue
            d = sub.as_dict()
            _say(opts, f"[{i}/{len(runnable)}] {sub.sid}: {d['points']}/{d['max_points']} points")
            if opts.output_dir:
                try:
                    _executed_copy(sub, opts, run)
                except Exception as exc:
                    sub.notes.append(f"its executed copy could not be written: {type(exc).__name__}: {exc}")
    finally:
        if checker is not None:
            checker.close()
        from course_utils.grading import reap
        reap.kill_marked(opts.run_id + "/", prefix=True)   # anything a kernel or a check left running
        shutil.rmtree(work_root, ignore_errors=True)
    run["seconds"] = round(time.monotonic() - t_start, 1)
    out = [s.as_dict() for s in subs]
    if any(s.status == "grader_error" for s in subs) or interrupted:
        code = EXIT_GRADER
    elif subs and all(s.status == "graded" and s.records and all(r["status"] == "pass" for r in s.records)
                      for s in subs):
        code = EXIT_PASSED
    else:
        code = EXIT_NOT_PASSED
    run["exit_status"] = code
    return code, run, out


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
    parser = argparse.ArgumentParser(prog="python -m course_utils.grade",
                                     description=__doc__.split("\n\n")[0],
                                     epilog="Exit status: 0 all passed, 1 not, 2 bad arguments, "
                                            "3 the grader could not grade everything.")
    parser.add_argument("notebooks", nargs="+", help="submitted notebooks (identified by their paths)")
    parser.add_argument("--smoke", action="store_true", help="quick sizes (SMOKE parameter, COURSE_SMOKE=1)")
    parser.add_argument("--json", metavar="FILE", help="write every result to FILE (JSON)")
    parser.add_argument("--csv", metavar="FILE", help="write the gradebook to FILE (CSV: a row per submission)")
    parser.add_argument("--output-dir", metavar="DIR", help="keep every executed copy in DIR (by submission path)")
    parser.add_argument("--timeout", type=_positive_seconds, default=DEFAULT_CELL_TIMEOUT_S, metavar="S",
                        help=f"seconds one cell may run (default {DEFAULT_CELL_TIMEOUT_S:g})")
    parser.add_argument("--notebook-timeout", type=_positive_seconds, default=DEFAULT_NOTEBOOK_TIMEOUT_S, metavar="S",
                        help=f"seconds one notebook may run in all (default {DEFAULT_NOTEBOOK_TIMEOUT_S:g})")
    parser.add_argument("--jobs", type=_jobs, default=1, metavar="N",
                        help="notebooks run side by side (checks always run one at a time; default 1)")
    parser.add_argument("--gpus", metavar="LIST", help="devices for the notebooks running side by side, e.g. 0,1 "
                        "(each gets one as CUDA_VISIBLE_DEVICES; the checks all run on the first)")
    parser.add_argument("--seed", type=_seed, metavar="S", help="the checks' seed (default: a new one, recorded)")
    parser.add_argument("--lesson", metavar="NN", help="the lesson every submission must be (default: from file names)")
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
    from course_utils.grading import reap
    from course_utils.grading.checker import _non_dumpable
    _non_dumpable()
    opts = GradeOptions(smoke=args.smoke, cell_timeout_s=args.timeout, notebook_timeout_s=args.notebook_timeout,
                        jobs=args.jobs, seed=args.seed, output_dir=Path(args.output_dir) if args.output_dir else None,
                        lesson=args.lesson, solutions=Path(args.released) if args.released else None, gpus=gpus)
    from course_utils.grading import report
    code, run, subs = EXIT_GRADER, {"seed": args.seed}, []
    try:
        started = time.time()
        with reap.subreaper():   # a kernel's orphans become ours while grading, and are killed at its end
            try:
                code, run, subs = grade(args.notebooks, opts)
            finally:
                reap.kill_children(since=started)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    except Exception as exc:   # the grader's own bug: say so, still write what there is
        print(f"the grader failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        run["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if args.json:
            report.write_json(args.json, run, subs)
        if args.csv:
            report.write_csv(args.csv, subs)
    print()
    print(report.table(subs))
    earned = sum(s["points"] for s in subs)
    possible = sum(s["max_points"] for s in subs)
    verdict = {EXIT_PASSED: "ALL CHECKS PASSED", EXIT_NOT_PASSED: "NOT ALL CHECKS PASSED",
               EXIT_GRADER: "THE GRADER COULD NOT GRADE EVERYTHING"}[code]
    print(f"\n{verdict}: {earned}/{possible} points over {len(subs)} notebook(s); seed {run.get('seed')} "
          f"(regrade with --seed {run.get('seed')})")
    return code


if __name__ == "__main__":
    sys.exit(main())
