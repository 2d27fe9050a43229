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
    # srun: note its own options, run the command (once: it stands for one node)
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ $1 == -* ]]; do echo "$1" >> "$FAKE_OUT.srun"; shift; done\n'
                                  'exec "$@"\n')
    # nvidia-smi lists every GPU of the machine, visible or not: the scripts must not count with it
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nprintf 'GPU 0\\nGPU 1\\nGPU 2\\nGPU 3\\nGPU 4\\n'\n")
    # python: answers torch.cuda.device_count() with 3 (the GPUs this process may use), and says it was asked
    (bin_dir / "python").write_text('#!/bin/bash\nif [[ "$*" == *"torch.cuda.device_count()"* ]]; then '
                                    'echo asked >> "$FAKE_OUT.python"; echo 3; else exec ' + sys.executable + ' "$@"; fi\n')
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


LESSON_07_PROGRAMS = ["ddp_hello.py", "ddp_train.py", "allreduce_bench.py", "ddp_hang.py", "ddp_exercises.py"]


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
             "SLURM_CPUS_PER_TASK": "32", "SLURM_GPUS_ON_NODE": "4", "SLURM_SUBMIT_DIR": "/shared/home/me/course"}
    calls, stdout = run_with_stand_ins(tmp_path, SCRIPTS / "ddp_train.sbatch", slurm)
    srun_options = (tmp_path / "calls.jsonl.srun").read_text().split()
    # srun >= 22.05 does not inherit sbatch's --cpus-per-task: without it the node's ranks share one core
    assert "--cpus-per-task=32" in srun_options and "--ntasks-per-node=1" in srun_options, srun_options
    assert len(calls) == 1, calls
    call = calls[0]
    t = call["torchrun"]
    assert t["nnodes"] == "2" and t["nproc_per_node"] == "4"
    assert t["rdzv_backend"] == "c10d" and t["rdzv_endpoint"] == "gpu-node-07:29742" and t["rdzv_id"] == "4242"
    # restarted workers go on from the last epoch written (x-07 F6)
    assert t["standalone"] is False and t["max_restarts"] == 3
    assert call["script"] == "notebooks/scripts/ddp_train.py"
    assert call["script_args"]["epochs"] == 30 and call["script_args"]["batch_size"] == 256
    # the checkpoint on the submit directory, which every node of a cluster sees (not node-local /tmp)
    assert call["script_args"]["checkpoint"] == "/shared/home/me/course/checkpoints/ddp_train-4242.pt"
    assert call["script_args"]["resume"] == "/shared/home/me/course/checkpoints/ddp_train-4242.resume.pt"
    assert call["omp"] == "4", "32 cores per node shared by 4 ranks, 4 of each rank's 8 for its DataLoader workers"
    assert "rendezvous at gpu-node-07:29742" in stdout


@pytest.mark.skipif(BASH is None, reason="needs bash")
@pytest.mark.parametrize("mode", ["c10d", "static"])
def test_multinode_script_runs_a_torchrun_that_torchrun_accepts(tmp_path, mode):
    env = {"HEAD": "10.1.2.3", "NNODES": "2", "NODE_RANK": "1", "RDZV": mode}
    calls, _ = run_with_stand_ins(tmp_path, SCRIPTS / "torchrun_multinode.sh", env, args=["--epochs", "5"])
    t = calls[0]["torchrun"]
    # counted by torch (3, as CUDA_VISIBLE_DEVICES and MIG leave them), not by nvidia-smi's list (5)
    assert t["nnodes"] == "2" and t["nproc_per_node"] == "3"
    assert (tmp_path / "calls.jsonl.python").read_text().split() == ["asked"]
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


CHECKPOINT_RANKS = """
import importlib.util, json, os, sys
from pathlib import Path
import torch, torch.distributed as dist
spec = importlib.util.spec_from_file_location("ddp_train", sys.argv[1])
ddp_train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ddp_train)
dist.init_process_group("gloo")
rank, out = dist.get_rank(), Path(sys.argv[2])
seen = {}
for case in ("shared", "node-local", "node-local, stale file"):
    torch.manual_seed(100 + rank)                  # each rank its own weights: rank 0's must reach everyone
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    folder = out / case.replace(" ", "").replace(",", "") / ("shared" if case == "shared" else f"node{rank}")
    folder.mkdir(parents=True, exist_ok=True)
    if case.endswith("stale file") and rank == 1:
        torch.save({k: torch.zeros_like(v) for k, v in model.state_dict().items()}, folder / "ckpt.pt")
    from_file = ddp_train.share_checkpoint(model, folder / "ckpt.pt", torch.device("cpu"))
    state = {k: v.tolist() for k, v in model.state_dict().items()}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, state)
    seen[case] = {"from_file": from_file, "same": all(s == everyone[0] for s in everyone)}
if rank == 0:
    torch.manual_seed(100)
    seen["rank 0's own"] = {k: v.tolist() for k, v in
                            torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).state_dict().items()}
    seen["final"] = everyone[0]
    (out / "seen.json").write_text(json.dumps(seen))
dist.destroy_process_group()
"""


def test_ddp_train_checkpoint_reaches_every_rank_even_from_a_node_local_path(tmp_path):
    """ddp_train.py's rank-0 I/O: on a path every rank sees, each reads the file; on a node-local
    one (each "node" its own folder here, as /tmp is on a cluster), the ranks notice, even where
    an older file of that name lies on the other node, and rank 0's weights arrive by broadcast."""
    from course_utils.launch import torchrun
    program = tmp_path / "ranks.py"
    program.write_text(CHECKPOINT_RANKS)
    torchrun(program, SCRIPTS / "ddp_train.py", tmp_path, nproc=2, backend="gloo", timeout_s=180, echo=False)
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["shared"] == {"from_file": True, "same": True}
    assert seen["node-local"] == {"from_file": False, "same": True}
    assert seen["node-local, stale file"] == {"from_file": False, "same": True}
    assert seen["final"] == seen["rank 0's own"]


def test_the_exercises_program_falls_back_to_the_course_and_refuses_to_be_graded(tmp_path, monkeypatch):
    """ddp_exercises.py (lesson 07's closure of exercises 7.2-7.4) runs the learner's function, the
    course's where the exercise is a stub; the course's answers refuse to run inside a check."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("ddp_exercises", SCRIPTS / "ddp_exercises.py")
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)

    def stub(*args):
        raise NotImplementedError("Exercise 7.3")

    assert program.run(stub, lambda *a: ("course", a), 1, 2) == (("course", (1, 2)), "the course's (exercise not done yet)")
    assert program.run(lambda *a: ("learner", a), stub, 3) == (("learner", (3,)), "yours")
    assert program.run(None, lambda *a: "course") == ("course", "the course's (exercise not done yet)")
    stub_file = tmp_path / "metrics_yours.py"
    stub_file.write_text("def global_metrics(loss_sum, correct, count):\n    raise NotImplementedError('Exercise 7.3')\n")
    assert program.learner_function(stub_file, "global_metrics") is not None
    assert program.learner_function(tmp_path / "missing.py", "global_metrics") is None
    monkeypatch.setenv("COURSE_GRADING_RANKS", "1")
    for answer in (program.course_global_metrics, program.course_accumulate, program.course_train_ddp):
        with pytest.raises(RuntimeError, match="the check grades your own code"):
            answer(*([None] * 3)) if answer is not program.course_train_ddp else answer(
                None, None, device=None, epochs=1, batch_size=1, lr=0.1, seed=0, checkpoint=None)
