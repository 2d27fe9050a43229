"""The GPU run in one command: `make gpu-check` (`python -m course_utils.gpu_check`).

On a machine with one or more GPUs (no network needed: only the wheels
`../shared/tools/gpu-box-wheels.sh` brings), it runs, each stage in a process of its own with a
time box, so that one failure or hang does not stop the rest:

- `setup`: versions (GPU, driver, CUDA, cuDNN, torch, DALI), bf16 natively or not, one batch
  through DALI's GPU stages, the notebook stack the grader needs;
- `tests`: the GPU-marked unit tests (`pytest -m gpu tests/unit`);
- `ladder`: `python -m course_utils.ladder` at full size (every rung, DALI's and bf16's included);
- `lesson-00` ... `lesson-08`: each solution notebook at full size through the grader
  (`python -m course_utils.grade`), which runs the lesson's own measurements and its checks;
- `parity`, `monitor`, `ddp`: the measurements the README lists beside the lessons (parity's
  tolerance at 200 steps, the monitor's cost on a quiet machine, NCCL's all-reduce and DDP
  scaling with 2+ GPUs).

Everything goes into one report folder (default `build/gpu-check/`): `report.json` and
`report.md` (GPU, driver, CUDA, torch and DALI versions, the date, every stage's verdict and
time), each stage's log, the ladder's JSON and chart, the graded notebooks' JSON, their executed
copies and their printed output as text. The folder accumulates: a later call adds its stages to
what is there, so a GPU session whose calls are limited to 10 minutes runs the stages in pieces:

    python -m course_utils.gpu_check --plan                      # the stages, their estimates, the calls
    python -m course_utils.gpu_check --pending --budget 540      # as many stages as fit in 9 minutes
    python -m course_utils.gpu_check --stage ladder --only 03,08 # named stages; --only picks lessons

`--dry-run` runs the same command on a CPU (COURSE_DEVICE=cpu, smoke sizes, a cheap subset):
`make test` runs it (tests/unit/test_gpu_check.py), so the command is proven before a GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = "COURSE_GPU_CHECK"          # every process a stage starts carries it (killed when its time is up)
DEFAULT_OUT = ROOT / "build" / "gpu-check"
CALL_BUDGET_S = 540                # a GPU session's call is limited to 10 minutes: 9 of them for stages
LESSONS = [f"{n:02d}" for n in range(9)]


@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    estimate_s: int      # on one H100 at full size: measured 2026-11-24 where said, else a guess
    timeout_s: int       # the time box
    basis: str = "estimate"


# In the order a session should run them (issue 38): (a) what only a GPU can say and that decides what
# the course grades (check 5.5's answers through the real capture), (b) the ladder and the capstone's
# check at full size, (c) the GPU-marked tests and lessons 05, 03, 08 through the grader, (d) DALI on
# the GPU only when its parts were brought (../shared/GPU.md), then the rest. Estimates are for one H100
# at full size, from the 2026-11-24 run where it measured the stage (plus the checks' time on this
# 2-core box), guessed elsewhere; every report records the real times.
STAGES = [
    Stage("setup", "versions, bf16, one batch through DALI's GPU stages, the notebook stack", 40, 180),
    Stage("graphs", "check 5.5's right and wrong answers through the real torch.cuda.graph beside the "
          "CPU emulation's verdicts (tests/unit/graph_step_cases.py): every disagreement printed", 45, 240,
          "45 cases: 9 s for the emulation on this 2-core box; the real capture of a small model is quicker"),
    Stage("ladder", "the optimisation ladder at full size, the CUDA-graph rung included", 100, 420,
          "lessons 03 and 08 climb it inside 90 s"),
    Stage("check-8.1", "the capstone's check 8.1 at full size: its reference passes, the course's baseline fails",
          90, 360, "a timed check of ~18 s per pipeline on this box; the reference's parity stage two short runs"),
    Stage("tests", "the GPU-marked unit tests", 90, 300, "20 GPU tests ran in the 2026-11-24 run"),
    Stage("lesson-05", "mixed precision, memory against batch size, CUDA graphs", 165, 420, "notebook 145 s measured"),
    Stage("lesson-03", "pinned against pageable copies, the prefetcher", 100, 300, "86 s measured"),
    Stage("lesson-08", "capstone at full size, check 8.1's GPU bar, the report card", 165, 480,
          "notebook 78-94 s measured"),
    Stage("lesson-04", "DALI on the GPU against its CPU pipeline and torchvision; JPEG gap (skipped at once "
          "where DALI was not brought)", 330, 570),
    Stage("lesson-01", "the baseline, the timeline, the ceiling", 125, 360, "115 s measured"),
    Stage("lesson-00", "the setup lesson and its hardware report", 20, 180),
    Stage("lesson-02", "the workers sweep", 320, 570, "notebook 247 s measured"),
    Stage("lesson-06", "DataParallel on one GPU (for real with 2+)", 150, 480),
    Stage("lesson-07", "DDP with one process per GPU on nccl", 240, 570),
    Stage("parity", "parity's tolerance at 200 steps on the GPU", 90, 420),
    Stage("monitor", "the monitor's cost on a quiet machine", 60, 240),
    Stage("ddp", "NCCL all-reduce fit and DDP scaling (2+ GPUs; skipped with one)", 300, 570),
]
BY_NAME = {s.name: s for s in STAGES}
DRY_RUN_STAGES = ["setup", "graphs", "tests", "ladder", "lesson-00"]


# -- running a stage ----------------------------------------------------------------------------

def _kill_marked(value: str) -> None:
    """SIGKILL every process (but this one) whose environment carries MARK=value."""
    import psutil
    me, procs = os.getpid(), []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != me and proc.environ().get(MARK) == value:
                procs.append(proc)
        except (psutil.Error, OSError):
            continue
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


def run_command(cmd: list[str], log: Path, timeout_s: float, env: dict) -> tuple[int | None, float]:
    """Run `cmd` (its output to `log`) for at most `timeout_s`; on time out, it and everything it
    started are killed. Returns (exit status or None when it timed out, seconds)."""
    marker = f"{uuid.uuid4().hex}"
    env = dict(env, **{MARK: marker, "PYTHONUNBUFFERED": "1"})
    t0 = time.perf_counter()
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            code = None
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            out.write(f"\n[gpu-check] time box of {timeout_s:.0f} s reached: stopped\n")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            _kill_marked(marker)
    return code, time.perf_counter() - t0


class Run:
    """One invocation: where the report goes, dry run or not, and the environment of its stages."""

    def __init__(self, out: Path, *, dry_run: bool):
        self.out, self.dry_run = Path(out), dry_run
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        self.env = dict(os.environ)
        self.env.setdefault("PYTHONPATH", str(ROOT))
        if str(ROOT) not in self.env["PYTHONPATH"].split(os.pathsep):
            self.env["PYTHONPATH"] = os.pathsep.join([self.env["PYTHONPATH"], str(ROOT)])
        if dry_run:
            self.env.setdefault("COURSE_DEVICE", "cpu")
            self.env["COURSE_SMOKE"] = "1"
        else:
            self.env.pop("COURSE_SMOKE", None)

    def command(self, name: str, cmd: list[str], timeout_s: float, env: dict | None = None) -> dict:
        log = self.out / "logs" / f"{name}.log"
        log.write_text("")
        code, seconds = run_command(cmd, log, timeout_s, dict(self.env, **(env or {})))
        status = "timed out" if code is None else ("passed" if code == 0 else "failed")
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        return {"status": status, "exit_status": code, "seconds": round(seconds, 1),
                "log": str(log.relative_to(self.out)), "tail": tail}


def stage_setup(run: Run, stage: Stage) -> dict:
    code = ("import json, sys; from course_utils import gpu_check; "
            "json.dump(gpu_check.machine_facts(gpu=sys.argv[2] == 'gpu'), open(sys.argv[1], 'w'), indent=2, "
            "default=str)")
    facts_file = run.out / "machine.json"
    result = run.command(stage.name, [sys.executable, "-c", code, str(facts_file), "cpu" if run.dry_run else "gpu"],
                         stage.timeout_s)
    if facts_file.exists():
        facts = json.loads(facts_file.read_text())
        problems = [p for p in facts.get("problems", [])]
        result["summary"] = facts.get("dali_gpu", "")
        if problems:
            result["status"] = "failed" if result["status"] == "passed" else result["status"]
            result["summary"] += " | " + "; ".join(problems)
    return result


def stage_tests(run: Run, stage: Stage) -> dict:
    junit = run.out / "tests.xml"
    targets = ["tests/unit/test_env.py", "tests/unit/test_gpu_paths.py"] if run.dry_run else ["tests/unit"]
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
           "--continue-on-collection-errors", *targets]
    result = run.command(stage.name, cmd, stage.timeout_s)
    if result["exit_status"] == 5:                 # pytest: nothing collected
        result["status"] = "failed"
    if junit.exists():
        import xml.etree.ElementTree as ET
        suite = ET.parse(junit).getroot()
        suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
        result["summary"] = (f"{passed} passed, {counts['failures'] + counts['errors']} failed, "
                             f"{counts['skipped']} skipped")
        result["counts"] = counts
    return result


def stage_ladder(run: Run, stage: Stage) -> dict:
    cmd = [sys.executable, "-m", "course_utils.ladder", "--json", str(run.out / "ladder.json"),
           "--plot", str(run.out / "ladder.png")]
    if run.dry_run:
        cmd += ["--smoke", "--steps", "3", "--limit", "1024", "--batch-size", "32", "--model", "tiny",
                "--rungs", "baseline,device-resident"]
    result = run.command(stage.name, cmd, stage.timeout_s)
    if (run.out / "ladder.json").exists():
        rungs = json.loads((run.out / "ladder.json").read_text()).get("rungs", [])
        result["summary"] = "of the ceiling: " + ", ".join(
            f"{r['name']} {r['fraction_of_ceiling']:.0%}" if "fraction_of_ceiling" in r else f"{r['name']} skipped"
            for r in rungs)
    return result


def stage_graphs(run: Run, stage: Stage) -> dict:
    """(a) Each of check 5.5's cases graded by the emulated capture on the virtual CUDA device ("cpu")
    and, on a GPU, by the real torch.cuda.graph ("cuda"): the verdicts side by side, every case where
    they disagree named (the emulation is then wrong there: fix it, see graph_capture.RULES)."""
    rows_file = run.out / "graphs.json"
    devices = ["cpu"] if run.dry_run else ["cpu", "cuda"]
    cmd = [sys.executable, "tests/unit/graph_step_cases.py", "--json", str(rows_file)]
    for device in devices:
        cmd += ["--device", device]
    result = run.command(stage.name, cmd, stage.timeout_s)
    if rows_file.exists():
        rows = json.loads(rows_file.read_text())
        result.update(graph_verdicts(rows, devices))
        if result["status"] == "passed" and result.get("disagreements"):
            result["status"] = "failed"
    return result


def graph_verdicts(rows: list[dict], devices: list[str]) -> dict:
    """What the graphs stage reports: the cases, and those whose verdicts differ between the devices in
    their status (pass, fail, error). The property a failure names may differ and still agree: the
    emulation can say why a rebound input trains on the first batch, a GPU only that it trains
    differently; those are listed as notes."""
    cases = [row for row in rows if not row["case"].startswith("_")]

    def status(row, device):
        return str(row.get(device, "")).split(":")[0]
    bad = [row for row in cases if len({status(row, d) for d in devices}) > 1]
    named = [row for row in cases if row not in bad and len({row.get(d) for d in devices}) > 1]
    show = lambda row: f"{row['case']}: " + " | ".join(f"{d}: {row.get(d)}" for d in devices)   # noqa: E731
    if len(devices) < 2:
        return {"summary": f"{len(cases)} cases graded on {devices[0]} only (a GPU compares them with the real "
                           "capture)", "disagreements": [], "notes": [], "cases": len(cases)}
    processes = [f"{row[d]} on {d}" for row in rows if row["case"] == "_processes" for d in devices if row.get(d)]
    summary = (f"{len(cases)} cases on {' and '.join(devices)}"
               + (f" ({', '.join(processes)})" if processes else "") + ": "
               + (f"{len(bad)} disagree: " + "; ".join(map(show, bad)) if bad else "every status agrees")
               + (f"; {len(named)} agree on the status, not on the property named" if named else ""))
    return {"summary": summary, "disagreements": [show(r) for r in bad], "notes": [show(r) for r in named],
            "cases": len(cases)}


def stage_check81(run: Run, stage: Stage) -> dict:
    """(b) Check 8.1 at full size (smoke in a dry run): the reference pipeline must pass and the
    course's baseline must fail, each graded once (benchmarks/check_bars.py)."""
    rows_file = run.out / "check-81.json"
    cmd = [sys.executable, "benchmarks/check_bars.py", "8.1", "--runs", "1", "--json", str(rows_file),
           "--only", "reference,the course's baseline"]
    result = run.command(stage.name, cmd, stage.timeout_s, env={"COURSE_SMOKE": "1" if run.dry_run else "0"})
    if rows_file.exists():
        rows = json.loads(rows_file.read_text())
        result["summary"] = "; ".join(f"{r['answer']}: {r['status']} (expected {r['expected']}, {r['seconds']} s): "
                                      f"{r['message'][:200]}" for r in rows)
    return result


def dali_importable() -> bool:
    from importlib.util import find_spec
    try:
        return find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):
        return False


def stage_lesson(run: Run, stage: Stage) -> dict:
    number = stage.name.split("-")[1]
    if number == "04" and not run.dry_run and not dali_importable():
        return {"status": "skipped", "retry": True, "summary": "DALI is not importable here: bring its parts "
                "first, one call each (../shared/GPU.md); a later `--pending` call runs it"}
    notebooks = sorted((ROOT / "solutions").glob(f"{number}-*.ipynb"))
    if not notebooks:
        return {"status": "skipped", "summary": f"no solutions/{number}-*.ipynb"}
    grades = run.out / "grades" / f"{number}.json"
    executed = run.out / "executed"
    grades.parent.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "course_utils.grade", *map(str, notebooks), "--json", str(grades),
           "--output-dir", str(executed), "--notebook-timeout", str(max(60, stage.timeout_s - 30)),
           "--timeout", str(max(60, stage.timeout_s - 30))]
    if run.dry_run:
        cmd.append("--smoke")
    result = run.command(stage.name, cmd, stage.timeout_s)
    if grades.exists():
        sub = json.loads(grades.read_text())["submissions"][0]
        result["points"], result["max_points"] = sub["points"], sub["max_points"]
        failed = [f"{e['exercise']} {e['status']}: {e['message'][:160]}" for e in sub["exercises"]
                  if e["status"] != "pass"]
        result["summary"] = (f"{sub['points']}/{sub['max_points']} points, notebook {sub.get('notebook_s')} s, "
                             f"checks {sub.get('checks_s')} s" + "".join(f"; {n}" for n in sub.get("notes", []))
                             + "".join(f"; {f}" for f in failed))
        if result["status"] == "passed" and (failed or sub.get("notes")):
            result["status"] = "failed"
        copy = Path(sub.get("executed") or "")
        if copy.is_file():
            text = run.out / "lessons" / f"{number}.txt"
            text.parent.mkdir(exist_ok=True)
            text.write_text(notebook_text(copy))
            result["output"] = str(text.relative_to(run.out))
    return result


def stage_benchmark(run: Run, stage: Stage) -> dict:
    import torch
    if stage.name == "ddp":
        if torch.cuda.device_count() < 2:
            return {"status": "skipped", "summary": f"needs 2 or more GPUs ({torch.cuda.device_count()} here): "
                                                    "NCCL's all-reduce and DDP scaling are not measured"}
        cmd = [sys.executable, "benchmarks/ddp_cpu.py", "--json", str(run.out / "ddp.json")]
    elif stage.name == "parity":
        cmd = [sys.executable, "benchmarks/parity_tolerance.py", "--steps", "200", "--repeats", "4",
               "--json", str(run.out / "parity.json")]
    else:
        cmd = [sys.executable, "benchmarks/monitor_overhead.py", "--rounds", "3", "--steps", "30"]
    result = run.command(stage.name, cmd, stage.timeout_s)
    result["summary"] = " / ".join(result["tail"][-3:])[:400]
    return result


def notebook_text(path: Path) -> str:
    """Every code cell's printed output of an executed notebook, as text (figures left out)."""
    nb = json.loads(Path(path).read_text())
    parts = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        texts = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                texts.append("".join(out.get("text", "")))
            elif out.get("output_type") in ("execute_result", "display_data"):
                texts.append("".join(out.get("data", {}).get("text/plain", "")))
            elif out.get("output_type") == "error":
                texts.append(f"{out.get('ename')}: {out.get('evalue')}")
        if any(t.strip() for t in texts):
            parts.append(f"--- cell {cell.get('id')}\n" + "\n".join(t.rstrip() for t in texts))
    return "\n".join(parts) + "\n"


def run_stage(run: Run, stage: Stage) -> dict:
    started = datetime.datetime.now().isoformat(timespec="seconds")
    t0 = time.perf_counter()
    try:
        if stage.name == "setup":
            result = stage_setup(run, stage)
        elif stage.name == "tests":
            result = stage_tests(run, stage)
        elif stage.name == "ladder":
            result = stage_ladder(run, stage)
        elif stage.name == "graphs":
            result = stage_graphs(run, stage)
        elif stage.name == "check-8.1":
            result = stage_check81(run, stage)
        elif stage.name.startswith("lesson-"):
            result = stage_lesson(run, stage)
        else:
            result = stage_benchmark(run, stage)
    except Exception as err:           # the stage's own failure must not stop the others
        result = {"status": "error", "summary": f"gpu_check itself failed: {type(err).__name__}: {err}"}
    result.setdefault("seconds", round(time.perf_counter() - t0, 1))
    result.update({"stage": stage.name, "what": stage.what, "started": started, "dry_run": run.dry_run,
                   "estimate_s": stage.estimate_s, "timeout_s": stage.timeout_s})
    return result


# -- the machine and the report -------------------------------------------------------------------

def machine_facts(gpu: bool = True) -> dict:
    """What the report's header says: GPUs, driver, CUDA, cuDNN, torch, torchvision, DALI (with
    its import error), bf16, one batch of DALI on the GPU, the notebook stack; and `problems`,
    what will stop later stages (no GPU among them when `gpu`)."""
    import platform

    import torch

    from . import env
    from .report import _driver_version
    facts = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
             "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
             "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
             "driver": _driver_version(), "torchvision": env._module_version("torchvision"),
             "dali": env._module_version("nvidia.dali"), "dali_advice": env.dali_advice(),
             "nvidia_ml_py": _dist_version("nvidia-ml-py"), "cpu": env.cpu_name(), "usable_cores": env.usable_cores(),
             "gpus": env.env_report().gpus, "fast_amp": env.fast_amp(), "problems": []}
    ok, facts["dali_gpu"] = env.dali_gpu_check()
    if ok is False:
        facts["problems"].append("DALI failed on the GPU")
    missing = [m for m in ("papermill", "nbclient", "ipykernel", "nbformat", "pytest")
               if env._module_version(m) is None]
    if missing:
        facts["problems"].append(f"missing for the grader and the tests: {', '.join(missing)} "
                                 "(bring them with ../shared/tools/gpu-box-wheels.sh)")
    try:
        from jupyter_client.kernelspec import find_kernel_specs
        if "python3" not in find_kernel_specs():
            facts["problems"].append("no 'python3' Jupyter kernel: run `python3 -m ipykernel install --user`")
    except Exception as err:
        facts["problems"].append(f"cannot list Jupyter kernels: {err}")
    if gpu and not torch.cuda.is_available():
        facts["problems"].append("no CUDA GPU visible to PyTorch")
    return facts


def _dist_version(name: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def load_report(out: Path) -> dict:
    path = Path(out) / "report.json"
    if path.exists():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            pass
    return {"stages": {}}


def write_report(out: Path, report: dict) -> None:
    out = Path(out)
    machine = out / "machine.json"
    if machine.exists():
        report["machine"] = json.loads(machine.read_text())
    report["updated"] = datetime.datetime.now().isoformat(timespec="seconds")
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "report.md").write_text(markdown(report))


def markdown(report: dict) -> str:
    m = report.get("machine") or {}
    gpus = "; ".join(f"{g['name']} ({g.get('memory_gib', 0):.0f} GiB, compute capability {g.get('capability')})"
                     for g in m.get("gpus", [])) or "none seen"
    dry = any(s.get("dry_run") for s in report["stages"].values())
    lines = [f"# GPU check{' (DRY RUN on a CPU: smoke sizes, nothing here is a GPU figure)' if dry else ''}", "",
             f"- GPUs: {gpus}",
             f"- driver {m.get('driver') or 'not reported'}, CUDA {m.get('cuda')}, cuDNN {m.get('cudnn')}, "
             f"torch {m.get('torch')}, torchvision {m.get('torchvision')}, DALI {m.get('dali') or 'not importable'}, "
             f"nvidia-ml-py {m.get('nvidia_ml_py')}, Python {m.get('python')}",
             f"- host {m.get('host')}: {m.get('cpu')}, {m.get('usable_cores')} usable cores",
             f"- {m.get('dali_gpu', 'setup not run yet')}",
             *([f"- DALI: {m['dali_advice']}"] if m.get("dali_advice") else []),
             *([f"- problems: {'; '.join(m['problems'])}"] if m.get("problems") else []),
             f"- setup run {m.get('date', '?')}; report updated {report.get('updated')}", "",
             "| stage | status | seconds (estimate) | summary |", "|---|---|---:|---|"]
    for stage in STAGES:
        s = report["stages"].get(stage.name)
        if s is None:
            lines.append(f"| {stage.name} | not run yet | ({stage.estimate_s}) | {stage.what} |")
            continue
        summary = str(s.get("summary", "")).replace("|", "/").replace("\n", " ")
        lines.append(f"| {stage.name} | {s['status']} | {s.get('seconds', '?')} ({stage.estimate_s}) | {summary} |")
    ladder = Path(report.get("out", "")) / "ladder.json"
    if ladder.exists():
        climb = json.loads(ladder.read_text())
        lines += ["", f"## The ladder on {climb.get('device')} ({climb.get('date')})", "",
                  "| rung | samples/s | of the ceiling | vs baseline |", "|---|---:|---:|---:|",
                  f"| model-only ceiling | {climb['ceiling']['samples_per_s']:,.0f} | 100% | |"]
        for r in climb.get("rungs", []):
            if r.get("skipped"):
                lines.append(f"| {r['name']} | skipped: {r['skipped']} | | |")
            else:
                speedup = r.get("speedup_over_baseline")
                lines.append(f"| {r['name']} | {r['samples_per_s']:,.0f} | {r['fraction_of_ceiling']:.0%} | "
                             + (f"{speedup:.1f}x |" if speedup else "|"))
    lines += ["", "Files: `machine.json`, `ladder.json` and `ladder.png`, `grades/NN.json`, each lesson's printed "
              "output in `lessons/NN.txt`, the executed notebooks in `executed/`, every stage's log in `logs/`."]
    return "\n".join(lines) + "\n"


def estimate(stage: Stage, gpus: int) -> int:
    """A stage's estimated seconds with `gpus` GPUs (`ddp` skips at once with fewer than 2)."""
    if stage.name == "ddp" and gpus < 2:
        return 5
    return stage.estimate_s


def fits(stage: Stage, left: float | None, ran: int, gpus: int = 1) -> bool:
    """Whether `stage` starts in a call with `left` seconds of its budget (None: no budget) after
    `ran` stages: its estimate must fit, except for a call's first stage (it is cut to the budget)."""
    return left is None or (left >= 30 and (estimate(stage, gpus) <= left or not ran))


def plan(budget_s: int = CALL_BUDGET_S, stages=None, gpus: int = 1) -> list[list[Stage]]:
    """The calls `--pending --budget budget_s` makes of the stages, by their estimates: each call
    takes, in order, every pending stage that still fits (as `main` does)."""
    pending, calls = list(STAGES if stages is None else stages), []
    while pending:
        call, used = [], 0.0
        for stage in pending:
            if fits(stage, budget_s - used, len(call), gpus):
                call.append(stage)
                used += estimate(stage, gpus)
        calls.append(call)
        pending = [s for s in pending if s not in call]
    return calls


def _select(args, done: dict) -> list[Stage]:
    names = [n.strip() for item in args.stage or [] for n in item.split(",") if n.strip()]
    if args.only:
        names += [f"lesson-{n.strip().zfill(2)}" for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown stage(s) {', '.join(unknown)}; the stages: {', '.join(BY_NAME)}")
    if not names:
        names = DRY_RUN_STAGES if args.dry_run else [s.name for s in STAGES]
    chosen = [s for s in STAGES if s.name in names]
    if args.pending:              # a stage skipped for want of something a later call may bring runs again
        chosen = [s for s in chosen if s.name not in done or done[s.name].get("retry")]
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the report folder (default build/gpu-check)")
    parser.add_argument("--stage", action="append", help="stage(s) to run, comma-separated (default: all)")
    parser.add_argument("--only", help="lessons to grade, e.g. 03,08 (adds their lesson-NN stages)")
    parser.add_argument("--pending", action="store_true", help="skip the stages the report folder already has")
    parser.add_argument("--budget", type=float, help="seconds for this call: a stage whose estimate no longer "
                        "fits is left for the next call, and none runs past it")
    parser.add_argument("--dry-run", action="store_true", help="on a CPU: COURSE_DEVICE=cpu, smoke sizes, "
                        "the stages " + ", ".join(DRY_RUN_STAGES) + " (what `make test` runs)")
    parser.add_argument("--plan", action="store_true", help="print the stages and the calls that fit them")
    args = parser.parse_args(argv)

    import torch
    gpus = max(1, torch.cuda.device_count() if torch.cuda.is_available() else 1)
    if args.plan:
        budget = int(args.budget or CALL_BUDGET_S)
        for i, call in enumerate(plan(budget, gpus=gpus), 1):
            print(f"call {i} ({sum(estimate(s, gpus) for s in call)} s estimated, budget {budget} s): "
                  f"python -m course_utils.gpu_check --pending --budget {budget}")
            for s in call:
                print(f"    {s.name:10s} ~{estimate(s, gpus):4d} s ({s.basis}; time box {s.timeout_s} s): {s.what}")
        print(f"in all ~{sum(estimate(s, gpus) for s in STAGES)} s of stages with {gpus} GPU(s), estimated "
              "(see STAGES); each report records the real times")
        return 0
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU is visible to PyTorch here. On a CPU, `--dry-run` proves the command "
              "(COURSE_DEVICE=cpu, smoke sizes).", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    run = Run(out, dry_run=args.dry_run)
    report = load_report(out)
    report["out"] = str(out)
    chosen = _select(args, report["stages"])
    t0, ran = time.perf_counter(), 0
    for stage in chosen:
        left = None if args.budget is None else args.budget - (time.perf_counter() - t0)
        if not fits(stage, left, ran, gpus):
            print(f"[gpu-check] {stage.name}: left for the next call ({left:.0f} s of the budget left, "
                  f"~{stage.estimate_s} s estimated)", flush=True)
            continue
        box = stage if left is None or left >= stage.timeout_s else Stage(
            stage.name, stage.what, stage.estimate_s, int(left), stage.basis)
        print(f"[gpu-check] {stage.name}: {stage.what} (time box {box.timeout_s} s) ...", flush=True)
        result = run_stage(run, box)
        ran += 1
        report["stages"][stage.name] = result
        write_report(out, report)
        print(f"[gpu-check] {stage.name}: {result['status']} in {result['seconds']} s. {result.get('summary', '')}",
              flush=True)
    write_report(out, report)
    pending = [s.name for s in STAGES if s.name not in report["stages"]]
    print(f"[gpu-check] report: {out / 'report.md'}" + (f"; not run yet: {', '.join(pending)}" if pending else ""))
    bad = [n for n, s in report["stages"].items() if s["status"] in ("failed", "timed out", "error")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
