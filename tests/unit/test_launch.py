"""The torchrun launcher (lesson 07): results from rank 0, output by rank, threads per rank, clear
errors, and no process left behind after a timeout, a Ctrl-C, or the death of the launching
process. The ranks here are small Python programs that do not import torch, so each launch
costs little more than torchrun's own start-up."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from course_utils import launch
from course_utils.launch import LaunchError, LaunchTimeout, report, threads_per_rank, torchrun

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
OLD_TORCHRUN = "torchrun_without_prefix"      # tests/unit/torchrun_without_prefix.py: torch 2.11's options


def use_old_torchrun(monkeypatch):
    """Launch through a torchrun whose parser lacks --log-line-prefix-template, as torch 2.11's."""
    monkeypatch.setenv("COURSE_TORCHRUN_MODULE", OLD_TORCHRUN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE)] + ([os.environ["PYTHONPATH"]]
                                                                     if os.environ.get("PYTHONPATH") else [])))
    monkeypatch.syspath_prepend(str(HERE))


def program(tmp_path, body, name="prog.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def marked(key, value):
    """Processes alive whose environment has key=value (what a launch leaves behind)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(key) == value and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            pass
    return found


def wait_until_gone(key, value, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        alive = marked(key, value)
        if not alive:
            return []
        time.sleep(0.25)
    return [(p.pid, " ".join(p.cmdline())[:120]) for p in marked(key, value)]


@pytest.mark.parametrize("which", ["installed", "without the prefix option"])
def test_result_output_threads_backend_and_two_nodes(tmp_path, monkeypatch, which):
    """Two torchrun agents ("nodes") of one process each, meeting through a c10d rendezvous: rank
    0's report comes back, every line is prefixed by its global rank, the backend and the threads
    per rank are set, extra variables reach the ranks, nothing is left behind. The same through a
    torchrun without --log-line-prefix-template (torch 2.11's), which gets the prefix from the
    environment instead: the option is passed only where the parser accepts it."""
    if which != "installed":
        use_old_torchrun(monkeypatch)
    prog = program(tmp_path, """
        import os
        from course_utils.launch import report
        rank = int(os.environ["RANK"])
        print(f"hello from {rank}", flush=True)
        report({"rank": rank, "world": int(os.environ["WORLD_SIZE"]), "local": os.environ["LOCAL_RANK"],
                "omp": os.environ["OMP_NUM_THREADS"], "backend": os.environ["COURSE_BACKEND"],
                "extra": os.environ["EXTRA"]})
    """)
    result = torchrun(prog, nnodes=2, nproc=1, backend="gloo", timeout_s=120, echo=False, env={"EXTRA": "yes"})
    assert result.ok and result.returncode == 0
    assert result.result == {"rank": 0, "world": 2, "local": "0", "omp": str(threads_per_rank(2)),
                             "backend": "gloo", "extra": "yes"}
    assert result.lines(0) == ["hello from 0"] and result.lines(1) == ["hello from 1"]
    assert "[rank 1] hello from 1" in result.output.splitlines()
    assert len(result.commands) == 2 and all("--rdzv_backend=c10d" in c for c in result.commands)
    assert result.survivors == []
    passed = any(a.startswith("--log_line_prefix_template") for a in result.command)
    assert passed == (which == "installed") == launch.torchrun_accepts("--log_line_prefix_template")
    assert result.command[2] == ("torch.distributed.run" if which == "installed" else OLD_TORCHRUN)


def test_the_stand_in_torchrun_rejects_the_option_as_torch_2_11_does(monkeypatch):
    """The stand-in must fail as torch 2.11's torchrun failed on the GPU box, or the test above proves nothing."""
    use_old_torchrun(monkeypatch)
    proc = subprocess.run([sys.executable, "-m", OLD_TORCHRUN, "--standalone", "--nproc_per_node=1",
                           "--log_line_prefix_template=[rank${rank}]:", "prog.py"], capture_output=True, text=True,
                          env=dict(os.environ), timeout=120)
    assert proc.returncode == 2 and "unrecognized arguments: --log_line_prefix_template" in proc.stderr, proc.stderr
    assert not launch.torchrun_accepts("--log_line_prefix_template")
    assert launch.torchrun_accepts("--nproc_per_node") and launch.torchrun_accepts("--tee")


@pytest.mark.parametrize("gpus, nproc, mig, expected", [
    (0, 2, False, "gloo"),      # the CPU
    (1, 1, False, "gloo"),      # one process: nobody to talk to
    (8, 1, False, "gloo"),
    (1, 1, True, "gloo"),       # a MIG seat
    (2, 2, False, "nccl"),      # a GPU per rank
    (8, 8, False, "nccl"),
    (1, 2, False, "gloo"),      # more ranks than GPUs: nccl would put two on one GPU
    (2, 2, True, "gloo"),
])
def test_default_backend(monkeypatch, gpus, nproc, mig, expected):
    monkeypatch.setattr(launch, "_cuda_count", lambda: gpus)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-5c1e9f0a-aaaa" if mig else ",".join(map(str, range(gpus))))
    assert launch.default_backend(nproc) == expected
    assert launch.is_mig() == mig


@pytest.mark.parametrize("gpus, nproc, nnodes, backend, device, expected", [
    (0, 2, 1, None, None, ("gloo", "cpu")),
    (1, 1, 1, None, None, ("gloo", "cuda")),      # one GPU: one rank computes on it, through gloo
    (2, 2, 1, None, None, ("nccl", "cuda")),
    (2, 2, 1, "gloo", None, ("gloo", "cpu")),     # an explicit gloo: CPU ranks (the hang demo, the checks)
    (2, 1, 2, None, None, ("gloo", "cpu")),       # two "nodes" on one machine
    (2, 2, 1, "nccl", None, ("nccl", "cuda")),
])
def test_backend_and_device_of_a_launch(monkeypatch, gpus, nproc, nnodes, backend, device, expected):
    monkeypatch.setattr(launch, "_cuda_count", lambda: gpus)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert launch.choose_backend_and_device(nproc, nnodes, backend, device) == expected
    with pytest.raises(ValueError):
        launch.choose_backend_and_device(2, 1, "nccl", "cpu")


@pytest.mark.parametrize("gpus, world, per_node, expected", [
    (4, 8, 4, ("nccl", "cuda")),      # 2 nodes x 4 GPUs (the SLURM script)
    (1, 2, 1, ("nccl", "cuda")),      # 2 nodes x 1 GPU: several ranks, a GPU each
    (1, 1, 1, ("gloo", "cuda")),      # one process on one GPU
    (0, 2, 2, ("gloo", "cpu")),
])
def test_a_rank_under_a_plain_torchrun_picks_backend_and_device(monkeypatch, gpus, world, per_node, expected):
    """Started without the course's launcher (sbatch, torchrun_multinode.sh), a rank decides alone."""
    monkeypatch.setattr(launch, "_cuda_count", lambda: gpus)
    for name in ("COURSE_BACKEND", "COURSE_RANK_DEVICE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert (launch.backend(), launch.rank_device().type) == expected


def test_a_rank_reads_its_device_from_the_launcher(monkeypatch):
    import torch
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("COURSE_BACKEND", "gloo")
    monkeypatch.setenv("COURSE_RANK_DEVICE", "cuda")
    assert launch.rank_device() == torch.device("cuda", 1) and launch.backend() == "gloo"
    monkeypatch.setenv("COURSE_RANK_DEVICE", "cpu")
    assert launch.rank_device() == torch.device("cpu")


def test_a_failing_rank_is_named_with_its_error(tmp_path):
    prog = program(tmp_path, """
        import os, time
        if os.environ["RANK"] == "1":
            raise ValueError("rank one cannot count")
        time.sleep(60)          # rank 0 would wait: torchrun stops it when rank 1 fails
    """)
    with pytest.raises(LaunchError) as info:
        torchrun(prog, nproc=2, backend="gloo", timeout_s=120, echo=False)
    assert "rank 1: ValueError: rank one cannot count" in str(info.value).splitlines()[0]   # the grader shows line 1
    assert info.value.result.returncode != 0 and info.value.result.seconds < 60
    assert not info.value.result.ok and info.value.result.survivors == []


def test_a_rank_killed_by_a_signal_is_named_on_the_first_line(tmp_path):
    # a rank that aborts leaves no Python traceback: only torchrun's summary says which one and how
    prog = program(tmp_path, """
        import os, sys, time
        if os.environ["RANK"] == "1":
            print("terminate called without an active exception", flush=True)
            os.abort()
        time.sleep(60)
    """)
    with pytest.raises(LaunchError) as info:
        torchrun(prog, nproc=2, backend="gloo", timeout_s=120, echo=False)
    first = str(info.value).splitlines()[0]
    assert "rank 1 was killed by SIGABRT (terminate called without an active exception)" in first, first
    assert info.value.result.survivors == []


def test_a_node_that_fails_does_not_leave_the_other_waiting(tmp_path, monkeypatch):
    """Two "nodes"; rank 0 reports, then dies on its way out (as gloo's threads can abort a process
    at exit), and node 1's torchrun stays alive after its rank has finished, as an agent waits at
    the exit barrier for a node that is gone (a stand-in torchrun does that every time). The
    launcher stops it soon after the failure instead of at the launch's timeout, names the
    failure, and keeps rank 0's report."""
    monkeypatch.setenv("COURSE_TORCHRUN_MODULE", "torchrun_lingering")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE)] + ([os.environ["PYTHONPATH"]]
                                                                     if os.environ.get("PYTHONPATH") else [])))
    monkeypatch.syspath_prepend(str(HERE))
    prog = program(tmp_path, """
        import os
        from course_utils.launch import report
        report({"rank": int(os.environ["RANK"])})
        if os.environ["RANK"] == "0":
            os.abort()
    """)
    t0 = time.perf_counter()
    with pytest.raises(LaunchError) as info:
        torchrun(prog, nnodes=2, nproc=1, backend="gloo", timeout_s=300, echo=False)
    assert time.perf_counter() - t0 < 120, "the launch waited for the lost node"
    assert not info.value.result.timed_out
    assert "rank 0 was killed by SIGABRT" in str(info.value).splitlines()[0], str(info.value)
    assert info.value.result.result == {"rank": 0} and info.value.result.survivors == []


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        torchrun("ddp_hello.py", timeout_s=0)
    with pytest.raises(FileNotFoundError):
        torchrun("no_such_program.py", timeout_s=10)
    with pytest.raises(ValueError):
        torchrun("ddp_hello.py", nproc=-1, timeout_s=10)


def test_report_only_counts_on_rank_0(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    monkeypatch.setenv("COURSE_RESULT_FILE", str(target))
    monkeypatch.setenv("RANK", "1")
    report({"a": 1})
    assert not target.exists()
    monkeypatch.setenv("RANK", "0")
    report({"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}


HANGING = """
    import multiprocessing, os, subprocess, sys, time
    # a forked child (like a DataLoader worker), and a grandchild that escapes into its own session
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
    child.start()
    loose = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}"), "w") as f:
        f.write(f"{os.getpid()} {child.pid} {loose.pid}")
    time.sleep(600)
"""


def test_timeout_stops_every_process_of_the_launch(tmp_path):
    prog = program(tmp_path, HANGING)
    mark = uuid.uuid4().hex
    t0 = time.perf_counter()
    with pytest.raises(LaunchTimeout) as info:
        torchrun(prog, tmp_path, nproc=2, backend="gloo", timeout_s=15, echo=False, env={"TEST_MARK": mark})
    assert time.perf_counter() - t0 < 15 + 15
    pids = [int(p) for r in (0, 1) if (tmp_path / f"rank{r}").exists() for p in (tmp_path / f"rank{r}").read_text().split()]
    assert len(pids) == 6, "the ranks did not start within the timeout: the test proves nothing"
    assert info.value.result.timed_out and info.value.result.survivors == []
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert wait_until_gone("TEST_MARK", mark, 1) == []


DRIVER = """
    import faulthandler, signal, sys
    faulthandler.register(signal.SIGUSR1, all_threads=True)     # the test asks where it is stuck
    # A Jupyter kernel handles SIGINT (its stop button). This driver stands in for one, so it must
    # too: started under a test run that a non-interactive shell put in the background, it would
    # inherit SIGINT *ignored* (Python then installs no handler) and Ctrl-C would never arrive.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from course_utils.launch import torchrun
    torchrun(sys.argv[1], sys.argv[2], nproc=2, backend="gloo", timeout_s=300, echo=False)
"""
LIGHT_RANK = """
    import os, sys, time
    with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
"""
TORCH_RANK = """
    import os, sys, time
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader
    dist.init_process_group("gloo")
    loader = DataLoader(list(range(64)), batch_size=4, num_workers=2, persistent_workers=True)
    next(iter(loader))                           # two worker processes per rank are running now
    with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}"), "w") as f:
        f.write(str(os.getpid()))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))           # rank 1 never comes: a hang
    time.sleep(600)
"""


def _signal_state(pid):
    """Blocked, ignored, caught and pending signals and the threads of a process (from /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return {k: v.strip() for k, v in (line.split(":", 1) for line in f)
                    if k in ("SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd", "Threads", "State")}
    except OSError as exc:
        return str(exc)


def _fail_stuck(proc, mark, how, before):
    """Say where the launcher is stuck (its Python stacks, its signal state), then clean up."""
    after = _signal_state(proc.pid)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(2)
    proc.kill()
    out, _ = proc.communicate()
    left = [(p.pid, " ".join(p.cmdline())[:120]) for p in marked("TEST_MARK", mark)]
    for p in marked("TEST_MARK", mark):
        p.kill()
    pytest.fail(f"the launcher had not exited 60 s after {how}; still alive with the mark: {left}; its signal "
                f"state before {before}, after {after}; its output and stacks:\n{out[-6000:]}")


@pytest.mark.parametrize("how", ["ctrl-c", "killed"])
def test_interrupting_or_killing_the_launcher_leaves_nothing(tmp_path, how):
    """Ctrl-C (the notebook's stop button) during a hung launch whose ranks run DataLoader workers
    stops all of them. If the launching process is killed outright (a kernel that dies), the
    kernel tells torchrun (PR_SET_PDEATHSIG), which stops its ranks."""
    prog = program(tmp_path, TORCH_RANK if how == "ctrl-c" else LIGHT_RANK)
    driver = program(tmp_path, DRIVER, "driver.py")
    mark = uuid.uuid4().hex
    env = dict(os.environ, TEST_MARK=mark, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(driver), str(prog), str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 90
    while not all((tmp_path / f"rank{r}").exists() for r in (0, 1)):
        assert time.time() < deadline and proc.poll() is None, "the ranks never started"
        time.sleep(0.2)
    if how == "ctrl-c":
        workers = [c for r in (0, 1) for c in psutil.Process(int((tmp_path / f"rank{r}").read_text())).children()]
        assert len(workers) >= 4, "expected two DataLoader workers per rank"
    before = _signal_state(proc.pid)
    proc.send_signal(signal.SIGINT if how == "ctrl-c" else signal.SIGKILL)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        _fail_stuck(proc, mark, how, before)
    if how == "ctrl-c":
        assert "KeyboardInterrupt" in out
    assert wait_until_gone("TEST_MARK", mark, 30) == []


def test_processes_left_behind_are_this_processs_launches_not_another_sessions():
    """x-07 F9: on a shared machine another session's launch (another worktree's grading run) was
    listed as "processes left behind" by the lesson. Launch ids begin with the launching pid."""
    other = subprocess.Popen(["sleep", "30"], env={**os.environ, launch.LAUNCH_ID_ENV: "99999-othersession"})
    ours = subprocess.Popen(["sleep", "30"], env={**os.environ, launch.LAUNCH_ID_ENV: f"{os.getpid()}-abc"})
    try:
        time.sleep(0.2)
        pids = [p.pid for p in launch.launched_processes()]
        assert ours.pid in pids and other.pid not in pids
        assert other.pid in [p.pid for p in launch.launched_processes(anyone=True)]
        assert [p.pid for p in launch.launched_processes("99999-othersession")] == [other.pid]
    finally:
        for p in (other, ours):
            p.kill()
            p.wait()


def test_left_behind_waits_for_a_process_on_its_way_out_and_names_the_rest():
    """w3-07: 'processes left behind: [psutil.Process(pid=29869, ...)]', a rank still exiting, in a raw repr."""
    env = {**os.environ, launch.LAUNCH_ID_ENV: f"{os.getpid()}-leaving"}
    leaving = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"], env=env)
    staying = subprocess.Popen(["sleep", "30"], env={**env, launch.LAUNCH_ID_ENV: f"{os.getpid()}-staying"})
    try:
        said = launch.left_behind(wait_s=3)
        assert f"pid {staying.pid} (sleep" in said and str(leaving.pid) not in said and "psutil" not in said, said
    finally:
        for p in (leaving, staying):
            p.kill()
            p.wait()
    assert launch.left_behind(wait_s=1) == "none"
