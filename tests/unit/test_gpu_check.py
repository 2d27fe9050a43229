"""`make gpu-check` (course_utils.gpu_check): proven on a CPU before the first GPU runs it.

The dry run is the same command with COURSE_DEVICE=cpu, smoke sizes and a cheap subset of the
stages (setup, the GPU-marked tests, the ladder, lesson 00 through the grader). The other tests
check the parts a GPU session depends on without running them: the plan fits calls of 10
minutes, a stage that hangs is stopped with everything it started, the budget leaves stages for
the next call, and the report folder accumulates.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from course_utils import gpu_check

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.extended          # 75-130 s on 2 cores: `make test-all`
def test_the_dry_run_proves_the_command(tmp_path):
    out = tmp_path / "gpu-check"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("COURSE_DEVICE", None)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "course_utils.gpu_check", "--dry-run", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    seconds = time.perf_counter() - t0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert set(report["stages"]) == set(gpu_check.DRY_RUN_STAGES)
    assert all(s["status"] == "passed" and s["dry_run"] for s in report["stages"].values()), report["stages"]
    assert report["stages"]["lesson-00"]["points"] == report["stages"]["lesson-00"]["max_points"] == 1
    assert "skipped" in report["stages"]["tests"]["summary"] or torch.cuda.is_available()
    md = (out / "report.md").read_text()
    assert "DRY RUN" in md and "torch " + torch.__version__ in md and "| lesson-03 | not run yet |" in md
    assert "## The ladder on CPU" in md
    assert (out / "lessons" / "00.txt").read_text().count("--- cell") >= 3
    assert (out / "ladder.json").exists() and (out / "machine.json").exists() and (out / "logs" / "setup.log").exists()
    assert report["stages"]["graphs"]["cases"] >= 40 and (out / "graphs.json").exists()
    # a second call adds to the folder: with --pending nothing already there runs again
    again = subprocess.run([sys.executable, "-m", "course_utils.gpu_check", "--dry-run", "--out", str(out),
                            "--pending"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "[gpu-check] setup:" not in again.stdout
    assert json.loads((out / "report.json").read_text())["stages"] == report["stages"]
    print(f"dry run: {seconds:.0f} s")


@pytest.mark.parametrize("gpus", [1, 4])
def test_the_plan_fits_calls_of_ten_minutes(gpus):
    calls = gpu_check.plan(gpu_check.CALL_BUDGET_S, gpus=gpus)
    names = [s.name for call in calls for s in call]
    assert sorted(names) == sorted(s.name for s in gpu_check.STAGES) and len(set(names)) == len(names)
    for call in calls:
        assert len(call) == 1 or sum(gpu_check.estimate(s, gpus) for s in call) <= gpu_check.CALL_BUDGET_S
    assert calls[0][:3] == gpu_check.STAGES[:3], "setup, tests and the ladder come first"
    assert all(s.timeout_s <= 570 and s.estimate_s < s.timeout_s for s in gpu_check.STAGES)
    lessons = {p.name[:2] for p in (ROOT / "solutions").glob("*.ipynb")}
    assert lessons == {s.name.split("-")[1] for s in gpu_check.STAGES if s.name.startswith("lesson-")}


def test_a_stage_past_its_time_box_is_stopped_with_what_it_started(tmp_path):
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            "print('started', flush=True); time.sleep(120)")
    token = f"{os.getpid()}-{time.time()}"           # this test's processes, not another run's stages
    t0 = time.perf_counter()
    status, seconds = gpu_check.run_command([sys.executable, "-c", code], tmp_path / "log", 3,
                                            dict(os.environ, GPU_CHECK_TEST=token))
    assert status is None and seconds < 30 and time.perf_counter() - t0 < 30
    assert "time box of 3 s reached" in (tmp_path / "log").read_text()
    time.sleep(0.5)
    left = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("GPU_CHECK_TEST") == token and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc.pid)
        except (psutil.Error, OSError):
            pass
    assert not left, f"processes of the stage still alive: {left}"


def test_the_budget_leaves_stages_for_the_next_call(tmp_path, monkeypatch, capsys):
    ran, clock = [], [0.0]

    def fake_stage(run, stage):          # setup takes 100 s of the call, the others 1 s
        ran.append((stage.name, stage.timeout_s))
        clock[0] += 100.0 if stage.name == "setup" else 1.0
        return {"status": "passed", "summary": "fake", "seconds": 0.0, "dry_run": True}
    monkeypatch.setattr(gpu_check, "run_stage", fake_stage)
    stages = [gpu_check.Stage("setup", "a", 40, 180), gpu_check.Stage("ladder", "b", 150, 420),
              gpu_check.Stage("lesson-00", "c", 25, 180)]
    monkeypatch.setattr(gpu_check, "STAGES", stages)
    monkeypatch.setattr(gpu_check, "BY_NAME", {s.name: s for s in stages})
    out = tmp_path / "r"
    args = ["--dry-run", "--out", str(out), "--stage", "setup,ladder,lesson-00"]
    monkeypatch.setattr(gpu_check.time, "perf_counter", lambda: clock[0])
    assert gpu_check.main(args + ["--budget", "160"]) == 0
    # setup (40 s estimated) ran with its time box cut to the budget and took 100 s; ladder (150)
    # no longer fit in the 60 s left; lesson-00 (25) did, boxed to what was left
    assert ran == [("setup", 160), ("lesson-00", 60)]
    assert "ladder: left for the next call" in capsys.readouterr().out
    ran.clear()
    assert gpu_check.main(args + ["--pending", "--budget", "540"]) == 0
    assert ran == [("ladder", 420)]
    report = json.loads((out / "report.json").read_text())
    assert set(report["stages"]) == {"setup", "ladder", "lesson-00"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_without_a_gpu_it_says_to_dry_run(capsys):
    assert gpu_check.main(["--out", "/nonexistent/never-written"]) == 2
    assert "--dry-run" in capsys.readouterr().err


def test_notebook_text_keeps_printed_output(tmp_path):
    nb = {"cells": [{"cell_type": "code", "id": "a", "outputs": [{"output_type": "stream", "text": ["42 samples/s\n"]}]},
                    {"cell_type": "markdown", "id": "b", "source": "x"},
                    {"cell_type": "code", "id": "c", "outputs": [{"output_type": "error", "ename": "E", "evalue": "v"}]}]}
    (tmp_path / "n.ipynb").write_text(json.dumps(nb))
    text = gpu_check.notebook_text(tmp_path / "n.ipynb")
    assert "--- cell a\n42 samples/s" in text and "E: v" in text and "cell b" not in text


def test_graph_verdicts_name_every_disagreement():
    rows = [{"case": "a", "expected": "pass", "cpu": "pass", "cuda": "pass"},
            {"case": "b", "expected": "fail: x", "cpu": "fail: x", "cuda": "pass"},
            {"case": "c", "expected": "error", "cpu": "error", "cuda": "fail: y"},
            {"case": "d", "expected": "fail: x", "cpu": "fail: x", "cuda": "fail: trains differently"},
            {"case": "_processes", "expected": "", "cuda": "3 processes"}]
    both = gpu_check.graph_verdicts(rows, ["cpu", "cuda"])
    assert both["disagreements"] == ["b: cpu: fail: x | cuda: pass", "c: cpu: error | cuda: fail: y"]
    assert both["notes"] == ["d: cpu: fail: x | cuda: fail: trains differently"], "the same status is no disagreement"
    assert both["cases"] == 4 and "4 cases on cpu and cuda (3 processes on cuda): 2 disagree" in both["summary"]
    assert gpu_check.graph_verdicts(rows[:1], ["cpu", "cuda"])["summary"].endswith("every status agrees")
    alone = gpu_check.graph_verdicts(rows, ["cpu"])
    assert alone["disagreements"] == [] and "cpu only" in alone["summary"]


def test_the_real_device_grades_in_a_fresh_process_after_a_case_that_broke_capturing():
    """graph_step_cases._isolated, as on a GPU whose torch cannot capture after a failed capture (here
    the CPU can never capture, so every case that did not pass ends its process): the verdicts are
    those of one process, and the cases after a break are graded in a fresh one."""
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    import graph_step_cases as cases
    names = ["right", "item() while capturing", "returns float(loss)"]
    rows = cases._isolated("cpu", [0], names)
    assert rows.pop("_restarts") == 1      # right + item() in the first process, float(loss) in a second
    by_name = {c.name: c for c in cases.CASES}
    for name in names:
        assert rows[name]["cpu"] == cases._verdict(by_name[name], "cpu", [0])["cpu"], name


def test_the_plan_puts_the_issue_38_stages_first():
    names = [s.name for s in gpu_check.STAGES]
    assert names[:4] == ["setup", "graphs", "ladder", "check-8.1"]
    assert names.index("tests") < names.index("lesson-05") < names.index("lesson-03") < names.index("lesson-08")
    assert names.index("lesson-08") < names.index("lesson-04"), "DALI only after (a)-(c)"
    first = gpu_check.plan(480)[0]
    assert [s.name for s in first][:5] == names[:5] and sum(s.estimate_s for s in first) <= 480


def test_a_stage_skipped_for_want_of_dali_runs_again_with_pending(tmp_path, monkeypatch):
    ran = []

    def fake_stage(run, stage):
        ran.append(stage.name)
        return {"status": "skipped", "retry": True, "summary": "no DALI", "seconds": 0.0, "dry_run": True}
    monkeypatch.setattr(gpu_check, "run_stage", fake_stage)
    args = ["--dry-run", "--out", str(tmp_path), "--stage", "lesson-04", "--pending"]
    assert gpu_check.main(args) == 0 and gpu_check.main(args) == 0
    assert ran == ["lesson-04", "lesson-04"]


def test_the_gpu_call_script_runs_the_pending_stages_into_out(tmp_path):
    """benchmarks/gpu_call.sh, the one prepared GPU call, as a dry run of one stage: its report lands in
    $OUT/gpu-check and is kept for the warm machine's next call. (The tests stage, the quickest: the
    graphs stage, which grades every case of check 5.5, already runs in the dry run above.)"""
    keep = Path("/tmp/gpu-check")
    kept = keep.exists()
    env = dict(os.environ, OUT=str(tmp_path), BUDGET="300", GPU_CALL_NO_KERNEL="1",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("COURSE_DEVICE", None)
    try:
        done = subprocess.run(["bash", "benchmarks/gpu_call.sh", "--dry-run", "--stage", "tests"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        report = json.loads((tmp_path / "gpu-check" / "report.json").read_text())
        assert report["stages"]["tests"]["status"] == "passed"
        assert (tmp_path / "gpu-check" / "logs" / "tests.log").exists()
        assert (keep / "report.json").exists() and "gpu_check gets" in done.stdout
    finally:
        if not kept:
            import shutil
            shutil.rmtree(keep, ignore_errors=True)
