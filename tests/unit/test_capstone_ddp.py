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


def _capstone():
    import importlib.util

    from course_utils.launch import SCRIPTS
    spec = importlib.util.spec_from_file_location("capstone_ddp", SCRIPTS / "capstone_ddp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shards_are_drawn_on_the_device_disjoint_and_new_each_epoch():
    import torch
    capstone = _capstone()
    n, world = 103, 3
    for epoch in range(3):
        shards = [capstone.shard_order(n, r, world, 7, epoch, torch.device("cpu")) for r in range(world)]
        assert all(s.dtype == torch.int64 and s.device.type == "cpu" for s in shards)
        assert sorted(torch.cat(shards).tolist()) == list(range(n))          # disjoint, and every record
        again = capstone.shard_order(n, 1, world, 7, epoch, torch.device("cpu"))
        assert torch.equal(again, shards[1])                                  # every rank draws the same permutation
    assert not torch.equal(capstone.shard_order(n, 0, world, 7, 0, torch.device("cpu")),
                           capstone.shard_order(n, 0, world, 7, 1, torch.device("cpu")))


def test_each_rank_augments_with_its_own_random_numbers():
    import torch
    capstone = _capstone()
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    labels = torch.zeros(64, dtype=torch.int64)
    out = [capstone.rank_augmentation(0, rank, torch.device("cpu"))(images, labels)[0] for rank in (0, 1, 0)]
    assert not torch.equal(out[0], out[1])          # ranks seeded alike would crop and flip alike
    assert torch.equal(out[0], out[2])              # and each rank's draws are reproducible
