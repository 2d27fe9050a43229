"""Every notebook, executed headless in smoke mode, both directions.

- solutions/: run through nbval in lax mode (cells must not raise; NBVAL_CHECK_OUTPUT cells
  must reproduce their stored outputs), with the check results recorded: every check passes
  and there is one record per check cell.
- notebooks/ (the student versions): run through the grader's command line: the notebook runs
  to the end, there is one record per check cell, and none passes.
- After either run, no process it started is left (a kernel, torchrun and its ranks, DataLoader
  workers): each run's processes carry a marker in their environment.
"""
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from course_utils.grade import check_cells

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
STUDENTS = sorted((ROOT / "notebooks").glob("*.ipynb"))

pytestmark = pytest.mark.notebook


def _env(**extra):
    env = dict(os.environ)
    env.pop("COURSE_STRICT", None)
    env.update({"COURSE_SMOKE": "1", "PYTHONUNBUFFERED": "1", "COURSE_TEST_RUN": uuid.uuid4().hex}, **extra)
    return env


def _left_behind(env, wait_s=15.0):
    """Processes still alive that carry this run's marker (waiting a little: DataLoader workers
    notice a dead parent within a few seconds)."""
    import psutil
    marker = env["COURSE_TEST_RUN"]
    deadline = time.time() + wait_s
    while True:
        alive = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get("COURSE_TEST_RUN") == marker and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{proc.pid}: {' '.join(proc.cmdline())[:100]}")
            except (psutil.Error, OSError):
                pass
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.5)


def test_there_are_notebooks():
    assert SOLUTIONS, "no notebooks in solutions/"
    assert [p.name for p in SOLUTIONS] == [p.name for p in STUDENTS], "solutions/ and notebooks/ differ: run `make student`"


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_passes_every_check(path, tmp_path, record_duration):
    results = tmp_path / "results.jsonl"
    expected = check_cells(path)
    assert expected, f"{path.name} has no check cells"
    t0 = time.perf_counter()
    env = _env(COURSE_RESULTS=str(results), COURSE_NOTEBOOK=path.name)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-current-env",
                           "--nbval-cell-timeout=600", str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    record_duration(path.name, time.perf_counter() - t0, "solution")
    assert proc.returncode == 0, f"nbval failed on {path.name}:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    assert not _left_behind(env), f"{path.name} left processes behind: {_left_behind(env, 0)}"
    records = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    assert sorted(r["exercise"] for r in records) == sorted(expected), \
        f"recorded checks {[r['exercise'] for r in records]} != check cells {expected}"
    failed = [f"{r['exercise']}: {r['status']}: {r['message']}" for r in records if r["status"] != "pass"]
    assert not failed, "checks did not pass:\n" + "\n".join(failed)


@pytest.mark.parametrize("path", STUDENTS, ids=[p.stem for p in STUDENTS])
def test_student_notebook_passes_no_check(path, tmp_path, record_duration):
    out = tmp_path / "grades.json"
    expected = check_cells(path)
    t0 = time.perf_counter()
    env = _env()
    proc = subprocess.run([sys.executable, "-m", "course_utils.grade", str(path), "--smoke", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    record_duration(path.name, time.perf_counter() - t0, "student")
    assert not _left_behind(env), f"{path.name} left processes behind: {_left_behind(env, 0)}"
    assert proc.returncode == 1, f"the grader should exit 1 for a student notebook:\n{proc.stdout[-4000:]}"
    records = json.loads(out.read_text())
    crashed = [r for r in records if r["status"] in ("crashed", "missing")]
    assert not crashed, "the student notebook did not run to the end:\n" + "\n".join(r["message"] for r in crashed)
    assert sorted(r["exercise"] for r in records) == sorted(expected)
    passed = [r["exercise"] for r in records if r["status"] == "pass"]
    assert not passed, f"checks passed on the unsolved notebook: {passed}"
    assert all(r["status"] == "not_implemented" for r in records), \
        [f"{r['exercise']}: {r['status']}: {r['message']}" for r in records if r["status"] != "not_implemented"]
