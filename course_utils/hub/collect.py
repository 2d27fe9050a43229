"""`make collect LESSON=NN`: the class's gradebook for one lesson.

1. Copies each learner's notebook (`~learner/feed-the-gpu/NN-....ipynb`) into
   `submissions/<learner>/`, skipping, by name, each learner who has none. The learners are the
   hub's (its plan in the state folder), else HUB_LEARNERS. As root a notebook is read without
   following links and only when it is the learner's own regular file: a learner cannot hand in
   another's work, or a file of the system's, by linking to it.
2. Grades them (`course_utils.grade`, smoke sizes unless GRADE_FLAGS says otherwise) into
   `build/grades-NN.json`, `build/gradebook-NN.csv` and `build/graded-NN/`. As root the grader runs
   as the hub's grader account (HUB_GRADER_USER, `ftg-grader`), with the learners' environment, in
   a folder of its own (HUB_SHARED/grading/NN): the learners' code never runs as root, and the
   grader can resume there (run the same command again). Without root it runs as you.

Exit status: the grader's (0 all passed, 1 not, 3 not everything graded: see INSTRUCTORS.md),
2 when nothing could be collected.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from .accounts import COURSE_FOLDER, demote
from .settings import ROOT, HubError, read_learners

__all__ = ["main", "released_name", "read_own_notebook", "MAX_BYTES"]

MAX_BYTES = 64 * 2**20


def released_name(lesson: str) -> str:
    """The student notebook's file name for lesson `lesson` ('02', '2' or '02-dataloader-workers')."""
    number = lesson.split("-")[0]
    if not number.isdigit():
        raise HubError(f"LESSON={lesson!r}: give the lesson's number, e.g. LESSON=02")
    found = sorted((ROOT / "notebooks").glob(f"{int(number):02d}-*.ipynb"))
    if not found:
        raise HubError(f"there is no lesson {int(number):02d} in {ROOT / 'notebooks'}")
    return found[0].name


def read_own_notebook(home: str, name: str, uid: int | None) -> bytes:
    """`home/feed-the-gpu/name`, opened without following links; with `uid`, only a regular file
    that account owns, of at most MAX_BYTES. FileNotFoundError when there is none; PermissionError
    (with a sentence) when it is not theirs to hand in."""
    import errno
    flags = os.O_RDONLY | os.O_NOFOLLOW
    fds = []
    try:
        fds.append(os.open(home, flags | os.O_DIRECTORY))
        try:
            fds.append(os.open(COURSE_FOLDER, flags | os.O_DIRECTORY, dir_fd=fds[-1]))
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):   # a link (or a file) where the folder should be
                raise PermissionError(f"{home}/{COURSE_FOLDER} is a link or a file, not the learner's own "
                                      "folder") from None
            raise
        try:
            fds.append(os.open(name, flags | os.O_NONBLOCK, dir_fd=fds[-1]))
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PermissionError(f"{COURSE_FOLDER}/{name} is a link, not the learner's own notebook") from None
            raise
        st = os.fstat(fds[-1])
        if not stat.S_ISREG(st.st_mode):
            raise PermissionError(f"{COURSE_FOLDER}/{name} is not a regular file")
        if uid is not None and st.st_uid != uid:
            raise PermissionError(f"{COURSE_FOLDER}/{name} belongs to uid {st.st_uid}, not to the learner")
        if st.st_size > MAX_BYTES:
            raise PermissionError(f"{COURSE_FOLDER}/{name} is {st.st_size / 2**20:.0f} MiB, over the "
                                  f"{MAX_BYTES // 2**20} MiB a notebook may be")
        with os.fdopen(os.dup(fds[-1]), "rb") as f:
            return f.read(MAX_BYTES + 1)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PermissionError(f"{home} is a link or a file, not the learner's own home") from None
        raise
    finally:
        for fd in fds:
            os.close(fd)


def _state() -> Path:
    return Path(os.environ.get("HUB_STATE") or ROOT / ".hub").expanduser().absolute()


def _plan() -> dict:
    """The plan of the hub that ran with this state folder (its learners, homes, grader), or {}."""
    path = _state() / "plan.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _learners(plan: dict) -> list[str]:
    if plan:
        return plan["learners"]
    if os.environ.get("HUB_LEARNERS"):
        return read_learners(os.environ["HUB_LEARNERS"])
    raise HubError(f"no hub has run with the state folder {_state()} and HUB_LEARNERS is unset: say whose notebooks "
                   "to collect (HUB_LEARNERS=alice,bob, or HUB_STATE= the hub's state folder)")


def _home(name: str, plan: dict) -> tuple[str, int | None]:
    single = plan.get("single_user") if plan else os.environ.get("HUB_SINGLE_USER", "") in ("1", "true", "yes")
    if single:
        return str(_state() / "homes" / name), None
    import pwd
    entry = pwd.getpwnam(name)
    return entry.pw_dir, entry.pw_uid


def collect(lesson: str, submissions: Path, say=print) -> tuple[list[Path], list[str]]:
    """Copy each learner's notebook into `submissions/<learner>/`: (the copies, sentences for those skipped)."""
    name = released_name(lesson)
    plan = _plan()
    learners = _learners(plan)
    copies, skipped = [], []
    for learner in learners:
        try:
            home, uid = _home(learner, plan)
            if os.geteuid() != 0:
                uid = None
            data = read_own_notebook(home, name, uid)
        except KeyError:
            skipped.append(f"{learner}: no account on this machine (never started?)")
            continue
        except FileNotFoundError:
            skipped.append(f"{learner}: no {name} in their {COURSE_FOLDER}/ (skipped)")
            continue
        except PermissionError as exc:
            skipped.append(f"{learner}: not collected: {exc}")
            continue
        dest = submissions / learner / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".ipynb.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        copies.append(dest)
    for line in skipped:
        say(f"  {line}")
    say(f"collected {len(copies)} of {len(learners)} learners' {name} into {submissions}/")
    return copies, skipped


def _grade_as_grader(copies: list[Path], number: str, grader_args: list[str], out: Path, say) -> int:
    """As root: stage the copies where the grader's account can read them, grade as that account
    with the learners' Python, bring the results back into `out`."""
    import pwd
    plan = _plan()
    grader = pwd.getpwnam(plan["grader_user"])
    staging = Path(plan["shared"]) / "grading" / number
    for sub in ("submissions", "out", "home", "tmp", "data"):
        (staging / sub).mkdir(parents=True, exist_ok=True)
    shutil.rmtree(staging / "submissions")
    (staging / "submissions").mkdir()
    for copy in copies:
        dest = staging / "submissions" / copy.parent.name / copy.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(copy, dest)
    for folder, dirs, files in os.walk(staging):
        os.chown(folder, grader.pw_uid, grader.pw_gid)
        for f in files:
            os.chown(os.path.join(folder, f), grader.pw_uid, grader.pw_gid)
    os.chmod(staging, 0o700)
    os.chmod(staging.parent, 0o711)
    staged = sorted(str(p) for p in (staging / "submissions").glob(f"*/{number}-*.ipynb"))
    env = {"PATH": f"{Path(plan['python']).parent}:/usr/bin:/bin", "HOME": str(staging / "home"),
           "TMPDIR": str(staging / "tmp"), "LANG": "C.UTF-8", "COURSE_DATA": plan["data"],
           "COURSE_DATA_HOME": str(staging / "data"), "PYTHONUNBUFFERED": "1"}
    for key in ("COURSE_DEVICE", "CUDA_VISIBLE_DEVICES"):
        if key in os.environ:
            env[key] = os.environ[key]
    cmd = [plan["python"], "-m", "course_utils.grade", *staged, "--json", str(staging / "out" / "grades.json"),
           "--csv", str(staging / "out" / "gradebook.csv"), "--output-dir", str(staging / "out" / "graded"),
           *grader_args]
    say(f"grading as {grader.pw_name} (the learners' code never runs as root), in {staging}")
    code = subprocess.run(cmd, env=env, cwd=str(staging), preexec_fn=demote(grader.pw_uid, grader.pw_gid)).returncode
    out.mkdir(parents=True, exist_ok=True)
    for src, dest in ((staging / "out" / "grades.json", out / f"grades-{number}.json"),
                      (staging / "out" / "gradebook.csv", out / f"gradebook-{number}.csv")):
        if src.exists():
            shutil.copyfile(src, dest)
    if (staging / "out" / "graded").is_dir():
        shutil.rmtree(out / f"graded-{number}", ignore_errors=True)
        shutil.copytree(staging / "out" / "graded", out / f"graded-{number}")
    return code


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.hub.collect", description=__doc__.split("\n")[0],
                                     epilog="Other options go to the grader (e.g. --smoke, --jobs 2).")
    parser.add_argument("--lesson", required=True, help="the lesson's number, e.g. 02")
    parser.add_argument("--submissions", default=str(ROOT / "submissions"), help="where the copies go")
    parser.add_argument("--output", default=str(ROOT / "build"), help="where the gradebook goes")
    args, grader_args = parser.parse_known_args(argv)
    try:
        number = released_name(args.lesson)[:2]
        copies, _ = collect(args.lesson, Path(args.submissions))
        if not copies:
            print("nothing to grade")
            return 2
        out = Path(args.output)
        plan = _plan()
        if os.geteuid() == 0 and plan and not plan.get("single_user"):
            code = _grade_as_grader(copies, number, grader_args, out, print)
        else:
            out.mkdir(parents=True, exist_ok=True)
            code = subprocess.run([sys.executable, "-m", "course_utils.grade", *map(str, copies),
                                   "--json", str(out / f"grades-{number}.json"),
                                   "--csv", str(out / f"gradebook-{number}.csv"),
                                   "--output-dir", str(out / f"graded-{number}"), *grader_args]).returncode
    except HubError as exc:
        print(f"make collect: {exc}", file=sys.stderr)
        return 2
    print(f"the gradebook: {out / f'gradebook-{number}.csv'} (every message: {out / f'grades-{number}.json'})")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
