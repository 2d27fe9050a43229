"""Lesson 07's GPU paths, on real GPUs (every test here skips without one; `make gpu-check` runs them).

On a CPU the programs run on gloo with CPU ranks (test_scripts.py, test_capstone_ddp.py, the
notebook tests); what only a GPU can show: ranks computing on their GPU (with gloo for a single
process, with nccl for several), bucket times read from CUDA events, the group bound to its
device before the first barrier, and check 7.3's virtual GPU beside a real one.
"""
import pytest
import torch

from course_utils.launch import launched_processes, torchrun

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")]

SMALL = ["--epochs", 1, "--steps", 4, "--batch-size", 32, "--width", 8, "--limit", 512, "--trace-steps", 2]


def _traces_are_on_the_device_clock(out):
    for trace in out["traces"]:
        assert trace["clock"] == "CUDA events"
        assert 0 < trace["last_grad_s"] <= trace["backward_s"] + 1e-4
        for bucket in trace["buckets"]:
            assert 0 <= bucket["start"] <= bucket["end"] <= trace["backward_s"] + 1e-4, bucket


def test_one_process_computes_on_its_gpu_through_gloo(tmp_path):
    run = torchrun("ddp_train.py", *SMALL, "--checkpoint", tmp_path / "c.pt", nproc=1, timeout_s=300, echo=False)
    out = run.result
    assert run.backend == "gloo" and run.device == "cuda" and out["backend"] == "gloo"
    assert "cuda" in out["device"] or torch.cuda.get_device_name(0) in out["device"]
    assert out["same_weights"] and out["checkpoint_from_file"]
    _traces_are_on_the_device_clock(out)
    assert run.survivors == [] and not launched_processes()


@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
def test_two_gpus_on_nccl_bound_to_their_devices(tmp_path):
    run = torchrun("ddp_train.py", *SMALL, "--checkpoint", tmp_path / "c.pt", nproc=2, timeout_s=300, echo=False)
    out = run.result
    assert run.backend == "nccl" and out["backend"] == "nccl" and out["same_weights"]
    _traces_are_on_the_device_clock(out)
    # bound with device_id before the first barrier: no guess about which GPU the barrier should use
    assert "using GPU" not in run.output and "devices used by this process are currently unknown" not in run.output
    firsts = [r["epochs"][0]["all_reduces_per_step"] for r in out["per_rank"]]
    assert all(f[0] == 1 and len(f) > 1 for f in firsts), firsts      # one bucket in the first step, rebuilt after


@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
def test_capstone_rung_on_two_gpus(tmp_path):
    out = torchrun("capstone_ddp.py", "--steps", 3, "--warmup", 1, "--batch-size", 32, "--limit", 512,
                   "--width", 8, nproc=2, timeout_s=300, echo=False).result
    assert out["backend"] == "nccl" and out["ddp"] and len(out["per_rank"]) == 2


def test_capstone_one_gpu_trains_unwrapped():
    out = torchrun("capstone_ddp.py", "--steps", 3, "--warmup", 1, "--batch-size", 32, "--limit", 512,
                   "--width", 8, nproc=1, timeout_s=300, echo=False).result
    assert out["world_size"] == 1 and not out["ddp"] and out["per_rank"][0]["steps"] == 3


def test_check_7_3_beside_a_real_gpu(tmp_path):
    """The virtual GPU of check 7.3's nccl pass sits beside the real ones; the solution passes
    and a tensor left in host memory still fails there."""
    from course_utils.checks import run_check
    header = ("import math\nimport torch\nimport torch.distributed as dist\n\n\ndef collective_device():\n"
              "    if dist.get_backend() == 'nccl':\n        return torch.device('cuda', torch.cuda.current_device())\n"
              "    return torch.device('cpu')\n\n\ndef global_metrics(loss_sum, correct, count):\n")
    body = ("    t = torch.tensor([loss_sum, correct, count], dtype=torch.float64{device})\n"
            "    dist.all_reduce(t)\n    s, c, n = t.tolist()\n"
            "    return (math.nan, math.nan) if n == 0 else (s / n, c / n)\n")
    right, host = tmp_path / "right.py", tmp_path / "host.py"
    right.write_text(header + body.format(device=", device=collective_device()"))
    host.write_text(header + body.format(device=""))
    assert run_check("7.3", right).status == "pass"
    result = run_check("7.3", host)
    assert result.status == "fail" and "collective_device()" in result.message, result.message
