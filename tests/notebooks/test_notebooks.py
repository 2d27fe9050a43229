"""Every notebook, executed headless in smoke mode, both directions.

- solutions/: graded by the grader's command line, as an instructor would (the checks run in the
  grader's checker process on the objects the notebook handed in): exit status 0, every
  exercise passes, one record per check cell, no cell raises, no note or review flag, and the
  NBVAL_CHECK_OUTPUT cells of the executed copy reproduce their recorded outputs (compared as
  nbval's lax mode compares them). One run per notebook proves both the lesson and the grader.
- notebooks/ (the student versions): run through the grader's command line (which restores the
  released check cells and runs the checks in its own checker process): the notebook runs to the
  end with no failed cell, there is one record per exercise, and every one is "not implemented".
- After either run, no process it started is left (a kernel, the grader's checker, torchrun and
  its ranks, DataLoader workers): each run's processes carry a marker in their environment.
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


def _compared(outputs) -> dict:
    """Outputs as nbval compares them (streams coalesced, metadata and tracebacks left out)."""
    from nbval.plugin import coalesce_streams, transform_streams_for_comparison
    import nbformat
    skip = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
            "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")
    flat: dict = {}
    for out in transform_streams_for_comparison(coalesce_streams([nbformat.from_dict(dict(o)) for o in outputs])):
        for key, value in out.items():
            if key in skip:
                continue
            if key == "data":
                for mime, data in value.items():
                    if mime not in skip:
                        flat.setdefault(mime, []).append(data)
            else:
                flat.setdefault(key, []).append(value)
    return flat


def _grade(path, tmp_path, env, *extra):
    out = tmp_path / "grades.json"
    proc = subprocess.run([sys.executable, "-m", "course_utils.grade", str(path), "--smoke", "--json", str(out), *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert out.exists(), f"the grader wrote no JSON:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    submission, = json.loads(out.read_text())["submissions"]
    return proc, submission


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_passes_every_check(path, tmp_path, record_duration):
    import nbformat
    expected = check_cells(path)
    assert expected, f"{path.name} has no check cells"
    t0 = time.perf_counter()
    env = _env()
    proc, submission = _grade(path, tmp_path, env, "--output-dir", str(tmp_path / "executed"))
    record_duration(path.name, time.perf_counter() - t0, "solution")
    assert not _left_behind(env), f"{path.name} left processes behind: {_left_behind(env, 0)}"
    assert submission["status"] == "graded" and submission["lesson"] == path.stem, submission
    assert not submission["notes"], "the solution did not run cleanly:\n" + "\n".join(submission["notes"])
    assert not submission["review"], submission["review"]
    records = submission["exercises"]
    assert sorted(r["exercise"] for r in records) == sorted(expected)
    failed = [f"{r['exercise']}: {r['status']}: {r['message']}" for r in records if r["status"] != "pass"]
    assert not failed, "checks did not pass:\n" + "\n".join(failed)
    assert proc.returncode == 0 and submission["points"] == submission["max_points"] > 0, proc.stdout[-4000:]
    # what nbval's lax mode asked of the run: no cell raised, NBVAL_CHECK_OUTPUT cells reproduce their outputs
    executed = nbformat.read(submission["executed"], as_version=4)
    raised = [f"{c.get('id')}: {o.get('ename')}: {o.get('evalue')}" for c in executed.cells if c.cell_type == "code"
              for o in c.outputs if o.get("output_type") == "error"]
    assert not raised, "cells raised:\n" + "\n".join(raised)
    ran = {c.get("id"): c for c in executed.cells}
    reference = nbformat.read(str(path), as_version=4)
    compared = 0
    for cell in reference.cells:
        if cell.cell_type == "code" and "NBVAL_CHECK_OUTPUT" in cell.source:
            assert cell.get("id") in ran, f"cell {cell.get('id')} did not run"
            assert _compared(ran[cell.get("id")].outputs) == _compared(cell.outputs), (
                f"cell {cell.get('id')} (NBVAL_CHECK_OUTPUT) no longer gives its recorded output:\n"
                f"recorded: {_compared(cell.outputs)}\nnow:      {_compared(ran[cell.get('id')].outputs)}")
            compared += 1
    assert compared == sum("NBVAL_CHECK_OUTPUT" in c.source for c in reference.cells if c.cell_type == "code")


@pytest.mark.parametrize("path", STUDENTS, ids=[p.stem for p in STUDENTS])
def test_student_notebook_passes_no_check(path, tmp_path, record_duration):
    expected = check_cells(path)
    t0 = time.perf_counter()
    env = _env()
    proc, submission = _grade(path, tmp_path, env)
    record_duration(path.name, time.perf_counter() - t0, "student")
    assert not _left_behind(env), f"{path.name} left processes behind: {_left_behind(env, 0)}"
    assert proc.returncode == 1, f"the grader should exit 1 for a student notebook:\n{proc.stdout[-4000:]}"
    assert submission["status"] == "graded" and submission["lesson"] == path.stem, submission
    assert not submission["notes"], "the student notebook did not run cleanly:\n" + "\n".join(submission["notes"])
    assert not submission["review"], submission["review"]
    records = submission["exercises"]
    assert sorted(r["exercise"] for r in records) == sorted(expected)
    passed = [r["exercise"] for r in records if r["status"] == "pass"]
    assert not passed, f"checks passed on the unsolved notebook: {passed}"
    assert all(r["status"] == "not_implemented" for r in records), \
        [f"{r['exercise']}: {r['status']}: {r['message']}" for r in records if r["status"] != "not_implemented"]
