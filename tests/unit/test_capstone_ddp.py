"""Lesson 08's multi-GPU rung, `notebooks/scripts/capstone_ddp.py`, launched as the capstone launches it
(lesson 07's `course_utils.launch.torchrun`), here on gloo with 2 CPU processes and a tiny workload: the
program a machine with 2+ GPUs runs under nccl, run end to end (about 15 s, nearly all start-up)."""
from course_utils.launch import launched_processes, torchrun


def test_the_ddp_rung_trains_on_every_rank_and_reports_them_all():
    run = torchrun("capstone_ddp.py", "--steps", 3, "--warmup", 1, "--batch-size", 16, "--limit", 256,
                   "--width", 4, nproc=2, timeout_s=180, echo=False)
    out = run.result
    assert run.ok and run.survivors == [] and not launched_processes()
    assert out["world_size"] == 2 and out["backend"] == "gloo" and out["global_batch"] == 32
    assert sorted(r["rank"] for r in out["per_rank"]) == [0, 1]
    assert all(r["steps"] == 3 and r["samples_per_s"] > 0 for r in out["per_rank"])
    assert out["samples_per_s"] == sum(r["samples_per_s"] for r in out["per_rank"])
