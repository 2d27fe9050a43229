"""notebooks/scripts/ddp_shards.py (lesson 07): its per-step all-reduce on the nccl path, run on the
virtual CUDA device with collectives that behave as nccl's (a host tensor is refused), in a
one-process gloo group; and the whole program under torchrun with spawned DataLoader workers."""
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("webdataset")


@pytest.fixture()
def ddp_shards(tmp_path):
    sys.path.insert(0, str(ROOT / "notebooks" / "scripts"))
    try:
        module = importlib.import_module("ddp_shards")
    finally:
        sys.path.remove(str(ROOT / "notebooks" / "scripts"))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield module
    dist.destroy_process_group()


def test_the_step_collective_uses_the_ranks_device_under_nccl(ddp_shards, tmp_path):
    from course_utils import shards
    from course_utils.checks.lesson07_ranks import NCCL_CPU_TENSOR, as_if_nccl
    from course_utils.checks.virtual_cuda import VirtualCuda

    rng = np.random.default_rng(0)
    data = shards.write_shards(tmp_path / "rgb", rng.integers(0, 256, (48, 32, 32, 3), dtype=np.uint8),
                               rng.integers(0, 10, 48), samples_per_shard=16)
    with VirtualCuda() as vc, as_if_nccl(vc):
        assert dist.get_backend() == "nccl"
        with pytest.raises(RuntimeError, match=NCCL_CPU_TENSOR):        # what the program did before
            dist.all_reduce(torch.ones(1))
        reader = shards.ShardReader(data, 8, keys=True)
        keys, sizes = ddp_shards.epoch(reader, 0, 0, vc.device)
    assert sum(len(k) for k in keys) == 48 and dict(sizes) == {8: 6}

