"""Every notebook, executed headless in smoke mode, both directions, through the grader.

All the notebooks a session selects are graded in ONE run of the grader's command line, as an
instructor grades a batch (the notebooks one after another, then every check alone in the
grader's checker process, on the objects each notebook handed in); each test reads its row:

- solutions/: every exercise passes, one record per check cell, no cell raises, no note or
  review flag, and the NBVAL_CHECK_OUTPUT cells of the executed copy reproduce their recorded
  outputs (compared as nbval's lax mode compares them). The grader exits 0 when only solutions
  were graded, 1 with student notebooks among them.
- notebooks/ (the student versions): the notebook runs to the end with no failed cell, one
  record per exercise, and every one is "not implemented".
- No process the run started is left (a kernel, the grader's checker, torchrun and its ranks,
  DataLoader workers): its processes carry a marker in their environment.

The grader's log goes to build/notebook-tests.log while it runs.
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


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory):
    """Every notebook this session selected, graded in ONE run of the grader's command line (as an
    instructor grades a batch: the notebooks one after another, then every check alone in the
    grader's checker; one start-up instead of one per notebook). Its log: build/notebook-tests.log."""
    me = request.module.__name__
    paths = []
    for item in request.session.items:
        path = getattr(item, "callspec", None) and item.callspec.params.get("path")
        if path is not None and item.module.__name__ == me and path not in paths:
            paths.append(path)
    tmp = tmp_path_factory.mktemp("graded")
    out, env = tmp / "grades.json", _env()
    log = ROOT / "build" / "notebook-tests.log"
    log.parent.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, "-m", "course_utils.grade", *map(str, paths), "--smoke",
                               "--timeout", "600", "--notebook-timeout", "1200", "--json", str(out),
                               "--output-dir", str(tmp / "executed")],
                              cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, text=True,
                              timeout=300 + 600 * len(paths))
    seconds = time.perf_counter() - t0
    text = log.read_text()
    assert out.exists(), f"the grader wrote no JSON:\n{text[-4000:]}"
    data = json.loads(out.read_text())
    by = {Path(sub["path"]).resolve(): sub for sub in data["submissions"]}
    assert set(by) == {p.resolve() for p in paths}, sorted(by)
    all_passed = all(r["status"] == "pass" for sub in by.values() for r in sub["exercises"])
    overhead = (seconds - sum(sub["seconds"] for sub in by.values())) / len(by)   # start-up, shared
    return {"by": by, "left": _left_behind(env), "overhead_s": overhead, "code": proc.returncode,
            "expected_code": 0 if all_passed else 1, "log": text}


def _graded(graded, path, record_duration, how):
    submission = graded["by"][path.resolve()]
    record_duration(path.name, submission["seconds"] + graded["overhead_s"], how)
    assert not graded["left"], f"the graded run left processes behind: {graded['left']}"
    assert graded["code"] == graded["expected_code"], \
        f"the grader's exit status {graded['code']}, not {graded['expected_code']}:\n{graded['log'][-4000:]}"
    assert submission["status"] == "graded" and submission["lesson"] == path.stem, submission
    assert not submission["notes"], f"{path} did not run cleanly:\n" + "\n".join(submission["notes"])
    assert not submission["review"], submission["review"]
    assert sorted(r["exercise"] for r in submission["exercises"]) == sorted(check_cells(path))
    return submission


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_passes_every_check(path, graded, record_duration):
    import nbformat
    assert check_cells(path), f"{path.name} has no check cells"
    submission = _graded(graded, path, record_duration, "solution")
    records = submission["exercises"]
    failed = [f"{r['exercise']}: {r['status']}: {r['message']}" for r in records if r["status"] != "pass"]
    assert not failed, "checks did not pass:\n" + "\n".join(failed)
    assert submission["points"] == submission["max_points"] > 0
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
def test_student_notebook_passes_no_check(path, graded, record_duration):
    records = _graded(graded, path, record_duration, "student")["exercises"]
    passed = [r["exercise"] for r in records if r["status"] == "pass"]
    assert not passed, f"checks passed on the unsolved notebook: {passed}"
    assert all(r["status"] == "not_implemented" for r in records), \
        [f"{r['exercise']}: {r['status']}: {r['message']}" for r in records if r["status"] != "not_implemented"]
