"""notebooks/scripts/hang_triage.py (lesson 07): every check finishes, says what it saw, and
reproduces here what this machine allows (a tiny /dev/shm, the Flight Recorder's dumps)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "notebooks" / "scripts" / "hang_triage.py"


def _run(*args, timeout=240):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_every_check_runs_and_says_what_it_saw():
    p = _run()
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    for title in ("== shm:", "== fr:", "== spy:", "== mb:", "== nccl:", "== cores:"):
        assert title in out
    # /dev/shm: reproduced in a private mount namespace where allowed, else said so
    assert ("(private mount namespace): failed: " in out and "(private mount namespace): finished" in out) or \
        "does not allow a private mount namespace" in out or "no `unshare` here" in out, out
    # Flight Recorder: each rank's collectives and the first that differs (rank 0 has one all_reduce more)
    assert ("first mismatch: collective #2 is gloo:all_reduce on rank 0 but gloo:barrier on rank 1" in out
            or "no dump from every rank" in out), out
    # py-spy: each rank's stack while the course's own hang hangs, the two collectives named
    assert ("the two ranks wait in different collectives: rank 0 in all_reduce, rank 1 in barrier" in out
            or "py-spy is not installed here" in out or "py-spy could not read the ranks" in out), out
    # monitored_barrier names the missing rank at the call, after its own 3 s timeout
    assert "Rank 1 failed to pass monitoredBarrier in 3000 ms" in out, out
    assert "usable cores" in out and "NUMA node" in out
    assert "--numa-binding" in out


def test_unknown_check_is_refused():
    p = _run("disk", timeout=60)
    assert p.returncode == 2 and "unknown check" in p.stderr
