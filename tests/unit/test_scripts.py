"""The programs in notebooks/scripts/ (lesson 07): they compile, and the SLURM template and the
multi-node launcher are well-formed: valid bash, valid #SBATCH directives, and, run with stand-in
`srun`/`scontrol`/`torchrun` commands and a SLURM environment, a torchrun command line that
torchrun's own argument parser accepts, pointing at a training script whose own parser accepts
its arguments."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "notebooks" / "scripts"
BASH = shutil.which("bash")

# the sbatch options the template may use, and what their values look like
SBATCH_OPTIONS = {
    "job-name": r"[\w.-]+", "nodes": r"\d+(-\d+)?", "ntasks-per-node": r"\d+", "gpus-per-node": r"(\w+:)?\d+",
    "cpus-per-task": r"\d+", "time": r"(\d+-)?\d{1,2}:\d{2}:\d{2}", "output": r"[\w%./-]+", "error": r"[\w%./-]+",
    "partition": r"[\w,-]+", "account": r"[\w-]+", "mem": r"\d+[KMGT]?", "exclusive": r"",
}

# torchrun stand-in: parse the arguments with torchrun's own parser, then the training script's
# arguments with the script's own parser, and record the result as JSON
FAKE_TORCHRUN = """
import json, os, sys
sys.path.insert(0, {root!r})
from torch.distributed.run import get_args_parser
args = get_args_parser().parse_args(sys.argv[1:])
script = os.path.join({root!r}, args.training_script)
import importlib.util
spec = importlib.util.spec_from_file_location("training_script", script)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.argv = [script] + list(args.training_script_args)
parsed = vars(module.parse_args())
with open(os.environ["FAKE_OUT"], "a") as f:
    f.write(json.dumps({{"torchrun": {{k: v for k, v in vars(args).items() if k != "training_script_args"}},
                         "script": os.path.relpath(script, {root!r}), "script_args": parsed,
                         "omp": os.environ.get("OMP_NUM_THREADS")}}) + "\\n")
"""


def stand_ins(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f"#!{sys.executable}\n" + FAKE_TORCHRUN.format(root=str(ROOT)))
    (bin_dir / "scontrol").write_text("#!/bin/sh\n"
                                      '[ "$1 $2" = "show hostnames" ] && printf "gpu-node-07\\ngpu-node-08\\n"\n')
    # srun: drop its own options, run the command (once: it stands for one node)
    (bin_dir / "srun").write_text("#!/bin/bash\nwhile [[ $1 == -* ]]; do shift; done\nexec \"$@\"\n")
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nprintf 'GPU 0\\nGPU 1\\nGPU 2\\n'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def run_with_stand_ins(tmp_path, script, env, args=()):
    out = tmp_path / "calls.jsonl"
    full_env = {"PATH": f"{stand_ins(tmp_path)}:{os.environ['PATH']}", "FAKE_OUT": str(out),
                "HOME": str(tmp_path), **env}
    proc = subprocess.run([BASH, str(script), *args], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in out.read_text().splitlines()], proc.stdout


LESSON_07_PROGRAMS = ["ddp_hello.py", "ddp_train.py", "allreduce_bench.py", "ddp_hang.py"]


def test_every_program_compiles():
    programs = sorted(SCRIPTS.glob("*.py"))
    assert {p.name for p in programs} >= set(LESSON_07_PROGRAMS)
    for path in programs:
        compile(path.read_text(), str(path), "exec")
    for name in LESSON_07_PROGRAMS:
        assert (SCRIPTS / name).read_text().startswith('"""Lesson 07'), f"{name} should say what it is in its docstring"


@pytest.mark.skipif(BASH is None, reason="needs bash")
@pytest.mark.parametrize("name", ["ddp_train.sbatch", "torchrun_multinode.sh"])
def test_shell_scripts_are_valid_bash(name):
    proc = subprocess.run([BASH, "-n", str(SCRIPTS / name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_sbatch_directives_are_well_formed():
    lines = (SCRIPTS / "ddp_train.sbatch").read_text().splitlines()
    assert lines[0] == "#!/bin/bash"
    first_command = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    directives = [(i, line) for i, line in enumerate(lines) if line.startswith("#SBATCH")]
    assert directives, "no #SBATCH lines"
    assert all(i < first_command for i, _ in directives), "sbatch ignores #SBATCH lines after the first command"
    seen = set()
    for _, line in directives:
        m = re.fullmatch(r"#SBATCH --([a-z-]+)(?:=(\S+))?", line.strip())
        assert m, f"not a long-form directive: {line!r}"
        option, value = m.group(1), m.group(2) or ""
        assert option in SBATCH_OPTIONS, f"unknown sbatch option --{option}"
        assert re.fullmatch(SBATCH_OPTIONS[option], value), f"--{option}={value} is malformed"
        assert option not in seen, f"--{option} given twice"
        seen.add(option)
    assert {"nodes", "ntasks-per-node", "gpus-per-node", "cpus-per-task", "time"} <= seen
    assert "--ntasks-per-node=1" in "\n".join(lines), "one torchrun per node"


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_sbatch_template_runs_a_torchrun_that_torchrun_accepts(tmp_path):
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu-node-[07-08]", "SLURM_NNODES": "2",
             "SLURM_CPUS_PER_TASK": "32", "SLURM_GPUS_ON_NODE": "4"}
    calls, stdout = run_with_stand_ins(tmp_path, SCRIPTS / "ddp_train.sbatch", slurm)
    assert len(calls) == 1, calls
    call = calls[0]
    t = call["torchrun"]
    assert t["nnodes"] == "2" and t["nproc_per_node"] == "4"
    assert t["rdzv_backend"] == "c10d" and t["rdzv_endpoint"] == "gpu-node-07:29500" and t["rdzv_id"] == "4242"
    assert t["standalone"] is False and t["max_restarts"] == 0
    assert call["script"] == "notebooks/scripts/ddp_train.py"
    assert call["script_args"]["epochs"] == 30 and call["script_args"]["batch_size"] == 256
    assert call["omp"] == "8", "32 cores per node shared by 4 ranks"
    assert "rendezvous at gpu-node-07:29500" in stdout


@pytest.mark.skipif(BASH is None, reason="needs bash")
@pytest.mark.parametrize("mode", ["c10d", "static"])
def test_multinode_script_runs_a_torchrun_that_torchrun_accepts(tmp_path, mode):
    env = {"HEAD": "10.1.2.3", "NNODES": "2", "NODE_RANK": "1", "RDZV": mode}
    calls, _ = run_with_stand_ins(tmp_path, SCRIPTS / "torchrun_multinode.sh", env, args=["--epochs", "5"])
    t = calls[0]["torchrun"]
    assert t["nnodes"] == "2" and t["nproc_per_node"] == "3"        # the stand-in nvidia-smi lists 3 GPUs
    if mode == "c10d":
        assert t["rdzv_backend"] == "c10d" and t["rdzv_endpoint"] == "10.1.2.3:29500"
    else:
        assert t["master_addr"] == "10.1.2.3" and t["master_port"] == 29500 and t["node_rank"] == 1
    assert calls[0]["script_args"]["epochs"] == 5


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_multinode_script_says_what_is_missing(tmp_path):
    proc = subprocess.run([BASH, str(SCRIPTS / "torchrun_multinode.sh")], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"]})
    assert proc.returncode != 0 and "set HEAD" in proc.stderr
