"""Lesson 07: when a distributed job hangs or crawls, a triage you run on the machine itself.

    python notebooks/scripts/hang_triage.py                  # every check, about a minute
    python notebooks/scripts/hang_triage.py shm cores        # some of them
    python notebooks/scripts/hang_triage.py nccl --fitted-gbps 1.9 --nproc 8

Every check has a timeout: nothing here can hang. What this machine cannot show (no GPU, no
second GPU, no nccl-tests binary, no permission for a private mount namespace) is printed as the
command to run where it can, and what to look for.

- shm:   the shared memory DataLoader workers (and NCCL, within a node) pass data through.
         Reproduced in a private mount namespace with a tiny /dev/shm (`unshare`), where allowed.
- fr:    PyTorch's Flight Recorder: each rank's last collectives, dumped when one times out;
         run here on two gloo ranks with one collective too many on rank 0.
- spy:   `py-spy dump` of every rank of the course's own hang (ddp_hang.py), while it hangs: the
         Python stack of each process, the collective it waits in.
- mb:    `dist.monitored_barrier`: rank 0 names the rank that never arrived, at the call.
- nccl:  NCCL's peer-to-peer path (the `NCCL_P2P_DISABLE=1` test) and nccl-tests'
         `all_reduce_perf` against the bandwidth lesson 07 fitted.
- cores: cores and NUMA nodes per rank, `nvidia-smi topo -m`, and torchrun's `--numa-binding`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).resolve()
PY = sys.executable


def _run(cmd, timeout, env=None):
    """(returncode or 'timeout', output) of a command, never waiting longer than `timeout` s."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        return "timeout", out.decode(errors="replace") if isinstance(out, bytes) else out
    except FileNotFoundError as exc:
        return "missing", str(exc)


def _say(title):
    print(f"\n== {title} " + "=" * max(0, 70 - len(title)))


# -- shm -----------------------------------------------------------------------------------------

SAMPLE_MB, BATCH, WORKERS, PREFETCH = 1, 4, 2, 2


def child_shm():
    """A DataLoader whose workers send 4 MiB batches (what one does with /dev/shm)."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Big(Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            return torch.zeros(SAMPLE_MB * 1024 * 256)         # float32: SAMPLE_MB MiB

    for _ in DataLoader(Big(), batch_size=BATCH, num_workers=WORKERS, prefetch_factor=PREFETCH, timeout=30):
        pass
    print("LOADER FINISHED")


def check_shm():
    _say("shm: /dev/shm, where DataLoader workers hand over their batches")
    need_mb = WORKERS * PREFETCH * BATCH * SAMPLE_MB
    try:
        here = shutil.disk_usage("/dev/shm")
        print(f"/dev/shm here: {here.total / 2**20:,.0f} MiB, {here.free / 2**20:,.0f} MiB free")
    except OSError:
        print("/dev/shm: none here")
    print(f"a loader with {WORKERS} workers x prefetch_factor {PREFETCH} x batches of {BATCH * SAMPLE_MB} MiB keeps "
          f"up to {need_mb} MiB in flight there")
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        print("no `unshare` here: cannot make a private /dev/shm. In a container started with docker's default "
              "(--shm-size 64m) a loader that needs more stops with the errors below.")
        return
    verdicts = {}
    for size_mb in (need_mb // 4, need_mb * 4):
        inner = f"mount -t tmpfs -o size={size_mb}m tmpfs /dev/shm && exec {PY} {SCRIPT} --child-shm"
        code, out = _run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", inner], timeout=120)
        if "LOADER FINISHED" in out:
            verdicts[size_mb] = "finished"
        elif code == "timeout":
            verdicts[size_mb] = "did not finish within 120 s (stopped)"
        else:
            said = [line.strip() for line in out.splitlines()
                    if re.search(r"shared memory|No space left|Bus error|killed by signal|Operation not permitted"
                                 r"|cannot|unshare:|mount:", line)]
            verdicts[size_mb] = "failed: " + (said[-1] if said else f"exit status {code}")
        print(f"/dev/shm of {size_mb} MiB (private mount namespace): {verdicts[size_mb]}")
    if all(v.startswith("failed: unshare") or "Operation not permitted" in v or "mount:" in v
           for v in verdicts.values()):
        print("this machine does not allow a private mount namespace, so the failure is not reproduced; a container "
              "with a small /dev/shm shows the lines below")
    elif verdicts[need_mb * 4] == "finished" and verdicts[need_mb // 4] != "finished":
        print(f"the loader's workers keep about {need_mb} MiB in flight (computed): with {need_mb // 4} MiB of /dev/shm it "
              f"failed, with {need_mb * 4} MiB it ran (the two sizes tried; the edge itself, near {need_mb} MiB, was "
              "not)")
    print("what the learner sees with too small a /dev/shm: torch 2.14 `unable to allocate shared memory(shm) for file "
          "</torch_...>: No space left on device`; older torch and other libraries `DataLoader worker (pid N) is "
          "killed by signal: Bus error`; NCCL (ranks on one node) `unhandled system error` with NCCL_DEBUG=INFO "
          "naming /dev/shm/nccl-*. The fix: `docker run --shm-size=16g` (or `--ipc=host`); on Kubernetes an "
          "emptyDir with medium: Memory mounted on /dev/shm.")


# -- Flight Recorder --------------------------------------------------------------------------------

def child_fr(outdir):
    """Two ranks; rank 0 calls one all_reduce more, so rank 1's barrier meets it and times out."""
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(36))
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(36))       # the bug: a collective only rank 0 calls
        dist.barrier()
    except Exception as exc:                      # the timeout: dump what this rank recorded
        print(f"rank {rank}: {type(exc).__name__}: {str(exc)[:120]}")
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json
        dump = _dump_fr_trace_json()
        Path(outdir, f"rank{rank}.json").write_bytes(dump if isinstance(dump, bytes) else dump.encode())
    except (ImportError, RuntimeError, TypeError) as exc:
        print(f"rank {rank}: no Flight Recorder dump in this torch ({exc})")
    os._exit(0)


def check_fr():
    _say("fr: Flight Recorder, each rank's last collectives")
    sys.path.insert(0, str(SCRIPT.parents[2]))
    from course_utils.launch import LaunchError, torchrun

    with tempfile.TemporaryDirectory(prefix="fr-") as out:
        env = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
        try:
            torchrun(SCRIPT, "--child-fr", out, nproc=2, backend="gloo", env=env, timeout_s=90, echo=False,
                     check=False)
        except LaunchError as exc:
            print(f"the launch stopped: {str(exc).splitlines()[0]}")
        dumps = {}
        for rank in (0, 1):
            f = Path(out, f"rank{rank}.json")
            if f.exists():
                dumps[rank] = [(e.get("collective_seq_id"), e.get("profiling_name"), e.get("state"))
                               for e in json.loads(f.read_text()).get("entries", [])]
        if len(dumps) < 2 or not all(dumps.values()):
            print("no dump from every rank (this torch records nothing on gloo): on nccl set "
                  "TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_FR_DUMP_TEMP_FILE=/tmp/fr_ and "
                  "read the dumps with `torchfrtrace /tmp -p fr_`")
            return
        for rank, entries in dumps.items():
            print(f"rank {rank} recorded: " + ", ".join(f"#{s} {name} ({state})" for s, name, state in entries))
        for (s0, n0, _), (s1, n1, _) in zip(dumps[0], dumps[1]):
            if n0 != n1:
                print(f"first mismatch: collective #{s0} is {n0} on rank 0 but {n1} on rank 1: the ranks took "
                      "different paths before it")
                break
        else:
            print("the ranks recorded the same collectives")
    print("on nccl: TORCH_FR_BUFFER_SIZE=2000 (older torch: TORCH_NCCL_TRACE_BUFFER_SIZE) records the last 2,000 "
          "collectives; TORCH_NCCL_DUMP_ON_TIMEOUT=1 writes them when the watchdog fires, to "
          "TORCH_FR_DUMP_TEMP_FILE<rank>; `torchfrtrace DIR -p PREFIX` (python -m "
          "torch.distributed.flight_recorder.fr_trace) lines the ranks up and names the first one that differs")


# -- py-spy -------------------------------------------------------------------------------------------

def _py_spy():
    here = Path(PY).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def check_spy():
    _say("spy: py-spy dump of every rank, while the job hangs")
    import signal
    import time

    import psutil
    spy = _py_spy()
    if spy is None:
        print("py-spy is not installed here (pip install py-spy): on a hung job run `py-spy dump --pid PID` "
              "for each rank's pid (`pgrep -f train.py`); with --native it shows the C++ frames (NCCL) too")
        return
    program = SCRIPT.with_name("ddp_hang.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPT.parents[2]), os.environ.get("PYTHONPATH")]))}
    for leftover in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(leftover, None)
    job = subprocess.Popen([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(program),
                            "--timeout", "90"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                           start_new_session=True)
    stacks, deadline = {}, time.monotonic() + 75
    try:
        while time.monotonic() < deadline and len(stacks) < 2:
            time.sleep(2)
            try:
                ranks = [p for p in psutil.Process(job.pid).children(recursive=True)
                         if any("ddp_hang.py" in part for part in p.cmdline())]
            except psutil.Error:
                break
            for proc in ranks:
                code, out = _run([spy, "dump", "--pid", str(proc.pid)], timeout=20)
                waiting = [line.strip() for line in out.splitlines()
                           if re.search(r"\b(all_reduce|barrier|wait)\b", line) and "(" in line]
                rank = next((v for k, v in proc.environ().items() if k == "RANK"), "?")
                if code == 0 and waiting:
                    frames = [line.strip() for line in out.splitlines() if re.match(r"^\s+\w.* \(.*:\d+\)$", line)]
                    stacks[rank] = (proc.pid, frames)
        for rank, (pid, frames) in sorted(stacks.items()):
            print(f"rank {rank} (pid {pid}), innermost frame first:")
            for line in frames[:4]:
                print(f"    {line}")
        if len(stacks) == 2:
            where = {rank: next((f.split(" (")[0] for f in frames if re.search(r"all_reduce|barrier", f)), "?")
                     for rank, (_, frames) in stacks.items()}
            print("the two ranks wait in different collectives: " + ", ".join(f"rank {r} in {w}"
                                                                          for r, w in sorted(where.items()))
                  + (" (the program's bug: rank 0 took one step more)" if len(set(where.values())) > 1 else ""))
        elif not stacks:
            print("py-spy could not read the ranks here (it needs ptrace: in a container, --cap-add SYS_PTRACE)")
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
    print("on a cluster: `py-spy dump --pid PID` on every rank of every node (`srun --overlap` into the job's "
          "nodes), `--native` for the C++ frames; the rank whose stack differs is the one to read")


# -- monitored_barrier ---------------------------------------------------------------------------------

def child_mb():
    """Two ranks; rank 1 never reaches the barrier (it stopped, or took another path)."""
    import datetime
    import time

    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=3))
            print("rank 0: MB PASSED")
        except RuntimeError as exc:
            first = str(exc).splitlines()[0]
            print(f"rank 0: MB RAISED after {time.monotonic() - t0:.1f} s: {first[:200]}")
    else:
        time.sleep(6)                           # never calls the barrier in time
    os._exit(0)


def check_mb():
    _say("mb: monitored_barrier names the rank that did not arrive")
    sys.path.insert(0, str(SCRIPT.parents[2]))
    from course_utils.launch import LaunchError, torchrun
    try:
        run = torchrun(SCRIPT, "--child-mb", nproc=2, backend="gloo", timeout_s=90, echo=False, check=False)
        said = [line.split(": ", 1)[-1] for line in run.output.splitlines() if "MB " in line]
    except LaunchError as exc:
        said = [str(exc).splitlines()[0]]
    print(said[0] if said else "monitored_barrier printed nothing here")
    print("dist.monitored_barrier(timeout=...) (gloo, or a gloo group beside nccl) waits for every rank and names "
          "the ones that did not come; TORCH_DISTRIBUTED_DEBUG=DETAIL names the mismatched collective (lesson 07's "
          "hang); neither waits for nccl's 10-minute watchdog")


# -- NCCL ---------------------------------------------------------------------------------------------

def check_nccl(fitted_gbps=None, nproc=None):
    _say("nccl: peer-to-peer, and all_reduce_perf against the fitted bandwidth")
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nproc = nproc or gpus
    if gpus:
        try:
            print(f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, {gpus} GPU(s)")
        except Exception:
            print(f"{gpus} GPU(s); this torch reports no NCCL version")
    else:
        print("no GPU here: NCCL is not used (the course's ranks run gloo on the CPU)")
    if gpus >= 2:
        pairs = [(a, b, torch.cuda.can_device_access_peer(a, b)) for a in range(gpus) for b in range(gpus) if a != b]
        without = [(a, b) for a, b, ok in pairs if not ok]
        print(f"peer access between GPUs: {len(pairs) - len(without)} of {len(pairs)} pairs"
              + (f"; none between {without[:4]}" if without else ""))
    print("a job that hangs in its first all-reduce on one node, with NCCL_DEBUG=INFO stopping after `via P2P/IPC` "
          "or `P2P/CUMEM` lines: run it once with NCCL_P2P_DISABLE=1. If it then runs (slower, through host memory), "
          "the peer-to-peer path is broken: IOMMU/ACS settings on PCIe, a virtual machine, a container without "
          "--ipc=host; tell the admins, do not train with P2P off")
    perf = shutil.which("all_reduce_perf")
    if perf and gpus >= 2:
        code, out = _run([perf, "-b", "8", "-e", "256M", "-f", "4", "-g", str(gpus)], timeout=180)
        rows = [line.split() for line in out.splitlines() if re.match(r"^\s*\d+\s+\d+\s+float", line)]
        if rows:
            size, busbw = int(rows[-1][0]), float(rows[-1][7])
            print(f"all_reduce_perf, {gpus} GPUs: {busbw:.1f} GB/s bus bandwidth at {size / 2**20:.0f} MiB")
            if fitted_gbps:
                print(f"the course's fit: {fitted_gbps:.1f} GB/s ({fitted_gbps / busbw:.2f}x nccl-tests)")
        else:
            print(f"all_reduce_perf ran but printed no table (exit {code})")
    else:
        print("nccl-tests' all_reduce_perf " + ("is not installed" if not perf else "needs 2 GPUs") +
              f" here. Where it runs: `all_reduce_perf -b 8 -e 256M -f 4 -g {max(2, nproc or 2)}` (one process, "
              "all GPUs; `mpirun -np N all_reduce_perf -g 1` across nodes); its busbw column is the same bus "
              "bandwidth lesson 07 measures (its fit of latency + 2(N-1)/N x bytes / bandwidth, or its best size where "
              "the fit lies above every size)" +
              (f": {fitted_gbps:.2f} GB/s here" if fitted_gbps else "") +
              ". Well below the link's figure at 256 MiB: a slow or misconfigured link; equal: look elsewhere")


# -- cores and NUMA ----------------------------------------------------------------------------------------

def _cpulist(text):
    cpus = set()
    for part in text.strip().split(","):
        if "-" in part:
            a, b = part.split("-")
            cpus.update(range(int(a), int(b) + 1))
        elif part:
            cpus.add(int(part))
    return cpus


def check_cores(nproc=None):
    _say("cores: CPU cores and NUMA nodes per rank")
    sys.path.insert(0, str(SCRIPT.parents[2]))
    from course_utils.launch import default_nproc, torchrun_accepts, torchrun_module
    nproc = nproc or default_nproc()
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    nodes = {}
    for node in sorted(Path("/sys/devices/system/node").glob("node[0-9]*")):
        try:
            nodes[node.name] = _cpulist((node / "cpulist").read_text()) & mine
        except OSError:
            pass
    print(f"{len(mine)} usable cores, {len(nodes) or 'unknown number of'} NUMA node(s)"
          + (": " + ", ".join(f"{n} {len(c)} cores" for n, c in nodes.items()) if nodes else ""))
    per_rank = len(mine) / nproc
    print(f"{nproc} ranks: {per_rank:g} core{'' if per_rank == 1 else 's'} each, for the rank's main thread and its DataLoader workers"
          + (" (fewer than 2: the loader and the training loop share a core)" if per_rank < 2 else ""))
    if shutil.which("nvidia-smi"):
        code, out = _run(["nvidia-smi", "topo", "-m"], timeout=20)
        print("nvidia-smi topo -m:\n" + "\n".join("  " + line for line in out.strip().splitlines()[:20]))
        print("read the CPU Affinity and NUMA Affinity columns: a rank's workers belong on its GPU's NUMA node; "
              "between GPUs NV# is NVLink, PIX/PXB one PCIe switch, PHB/NODE through the CPU, SYS across sockets")
    else:
        print("no nvidia-smi here: on a GPU box `nvidia-smi topo -m` shows which NUMA node and cores sit next to each "
              "GPU, and how GPUs are linked (NV# NVLink, PIX/PXB PCIe switch, NODE/SYS through the CPUs)")
    option = next((o for o in ("--numa-binding", "--numa_binding") if torchrun_accepts(o)), None)
    if option:
        import importlib
        parser = importlib.import_module(torchrun_module()).get_args_parser()
        choices = next((a.choices for a in parser._actions if option in a.option_strings), None)
        print(f"this torchrun ({torchrun_module()}) accepts {option}" + (f" {{{', '.join(choices)}}}" if choices else "")
              + f": `torchrun {option}=node --nproc-per-node={nproc} train.py` pins each rank to its GPU's NUMA node")
    else:
        print(f"this torchrun ({torchrun_module()}) has no --numa-binding option: pin ranks with `numactl "
              "--cpunodebind=N --membind=N` (or taskset) in a wrapper per local rank")


CHECKS = ("shm", "fr", "spy", "mb", "nccl", "cores")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checks", nargs="*", help="shm, fr, spy, mb, nccl, cores (default: all)")
    parser.add_argument("--fitted-gbps", type=float, default=None, help="lesson 07's fitted bus bandwidth, GB/s")
    parser.add_argument("--nproc", type=int, default=None, help="ranks per node to plan for")
    parser.add_argument("--child-shm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-fr", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-mb", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_shm:
        return child_shm()
    if args.child_fr:
        return child_fr(args.child_fr)
    if args.child_mb:
        return child_mb()
    unknown = [c for c in args.checks if c not in CHECKS]
    if unknown:
        parser.error(f"unknown check(s) {unknown}: choose from {', '.join(CHECKS)}")
    for name in args.checks or CHECKS:
        {"shm": check_shm, "fr": check_fr, "spy": check_spy, "mb": check_mb, "nccl": lambda: check_nccl(args.fitted_gbps, args.nproc),
         "cores": lambda: check_cores(args.nproc)}[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
