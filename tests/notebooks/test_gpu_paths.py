"""The GPU code paths of every lesson, executed on a machine without a GPU.

- COURSE_DEVICE=cpu: every solution notebook runs with the real (narrow) model training on the
  CPU through the code a GPU runs (course_utils.target): dtype, shape and label bugs in the GPU
  branches fail here, not on a learner's GPU. Every check must pass in this mode too.
- COURSE_MP_START=spawn: the lessons that start DataLoader workers (02, 03) make that run with
  the `spawn` start method (macOS's and Windows' default), where workers cannot inherit what a
  notebook defined.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_utils.grade import check_cells

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
# the lessons whose own cells start DataLoader workers
WORKER_LESSONS = [p for p in SOLUTIONS if p.name.startswith(("02-", "03-"))]

pytestmark = pytest.mark.notebook


def _run_solution(path, tmp_path, **env_extra):
    env = dict(os.environ)
    env.pop("COURSE_STRICT", None)
    results = tmp_path / "results.jsonl"
    env.update({"COURSE_SMOKE": "1", "PYTHONUNBUFFERED": "1", "COURSE_RESULTS": str(results),
                "COURSE_NOTEBOOK": path.name}, **env_extra)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                           "--nbval-current-env", "--nbval-cell-timeout=600", str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    mode = " ".join(f"{k}={v}" for k, v in env_extra.items())
    assert proc.returncode == 0, f"{path.name} failed with {mode}:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    records = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    assert sorted(r["exercise"] for r in records) == sorted(check_cells(path)), \
        f"recorded checks {[r['exercise'] for r in records]} != check cells {check_cells(path)} with {mode}"
    failed = [f"{r['exercise']}: {r['status']}: {r['message']}" for r in records if r["status"] != "pass"]
    assert not failed, f"checks did not pass with {mode}:\n" + "\n".join(failed)


# Lesson 07 has no simulated mode: without a GPU it always trains the real model on the CPU
# (gloo, 2 processes), so its default run in test_notebooks.py already is this run.
CPU_DEVICE_RUNS = [p for p in SOLUTIONS if not p.name.startswith("07-")]


# `make test` runs the lessons whose GPU branches differ most from the simulator's (lesson 03's workers
# with spawn, streams, mixed precision, several devices, the capstone); 00, 01, 02 (8 minutes with spawned
# workers on 2 cores) and 04 run in the extended run
EXTENDED_ONLY = ("00-", "01-", "02-", "04-")
CPU_DEVICE_PARAMS = [pytest.param(p, id=p.stem, marks=[pytest.mark.extended] if p.name.startswith(EXTENDED_ONLY) else [])
                     for p in CPU_DEVICE_RUNS]


@pytest.mark.parametrize("path", CPU_DEVICE_PARAMS)
def test_solution_on_the_cpu_device(path, tmp_path, record_duration):
    """The worker lessons run this way with spawned workers as well: one run proves both (the
    start method and the device are independent), which keeps `make test` inside its budget."""
    t0 = time.perf_counter()
    extra = {"COURSE_MP_START": "spawn"} if path in WORKER_LESSONS else {}
    _run_solution(path, tmp_path, COURSE_DEVICE="cpu", **extra)
    record_duration(path.name, time.perf_counter() - t0, "cpu+spawn" if extra else "cpu-device")
