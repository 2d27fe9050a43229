"""Smoke sizes hold on any core count (issue 26, item 3).

On the first GPU box (16 usable cores) lesson 04's `loader_speed` cell raised StopIteration: 16
DataLoader workers with 2 batches each in flight asked for more batches than the smoke dataset
held. `COURSE_CORES` (read by `course_utils.env.usable_cores`) fakes the core count, so a 2-core
CI runs a lesson as a 16-core workstation would size it. Running every notebook again at 16 and
64 cores costs more than `make test` can spend (lesson 02 alone sweeps up to 128 workers at 64
cores: 7 minutes on 2 real cores), so:

- `tests/unit/test_env.py` proves the helpers the lessons size loaders with (`workers_for`,
  `batches_needed`) on every core count from 1 to 128;
- this file runs the lesson whose cells broke, at the core count that broke it. One run of every
  solution at 16 and at 64 faked cores (2026-11-25, `COURSE_CORES=N python -m course_utils.grade
  solutions/*.ipynb --smoke`) found no other failed cell.

Check verdicts are not asserted here: speed-graded checks fit their bars to the cores they are
told about, which a 2-core machine does not have.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSON_04 = next((ROOT / "solutions").glob("04-*.ipynb"))

pytestmark = [pytest.mark.notebook, pytest.mark.extended]   # `make test-all`


def test_lesson_04_runs_as_a_16_core_machine_sizes_it(tmp_path, record_duration):
    env = dict(os.environ, COURSE_SMOKE="1", COURSE_CORES="16", PYTHONUNBUFFERED="1",
               COURSE_RESULTS=str(tmp_path / "results.jsonl"), COURSE_NOTEBOOK=LESSON_04.name)
    env.pop("COURSE_STRICT", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                           "--nbval-current-env", "--nbval-cell-timeout=600", str(LESSON_04)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    record_duration(LESSON_04.name, time.perf_counter() - t0, "16 cores")
    output = f"{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    if proc.returncode != 0 and "StopIteration" not in proc.stdout + proc.stderr:   # not the known failure
        raise RuntimeError(f"a cell failed with COURSE_CORES=16:\n{output}")
    assert proc.returncode == 0, f"a cell failed with COURSE_CORES=16 (StopIteration):\n{output}"
