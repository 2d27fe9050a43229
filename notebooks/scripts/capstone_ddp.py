"""Lesson 08's multi-GPU rung: the final pipeline under DistributedDataParallel, one process per GPU.

    torchrun --standalone --nproc_per_node=N capstone_ddp.py --steps 200 --batch-size 128 --amp bf16 --channels-last

Launched by `course_utils.launch.torchrun` (lesson 07), which sets the backend and collects the
report. Every rank runs this whole file:

1. `init_process_group`; each rank's device is `rank_device()` (cuda:LOCAL_RANK with nccl).
2. The data: the training set in this rank's device memory, its shard only (every rank the same
   permutation of the records, split as DistributedSampler splits it; a new permutation each
   epoch, so no two ranks ever train on the same sample in one epoch).
3. The pipeline: `DeviceLoader` over the shard and `AugmentBatch` on the device, with the final
   pipeline's mixed precision and memory format, exactly as lesson 08's device-resident rung.
4. `DistributedDataParallel` all-reduces the gradients during backward; the loop is the
   course's one loop, `course_utils.train.train`, timed by its `StepTimer` on each rank.

Rank 0 reports every rank's samples/s; the notebook divides the sum by N times what one GPU
reached alone (the same program with N = 1): the scaling efficiency.
"""
import argparse
import os
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from course_utils.device_data import AugmentBatch, DeviceLoader
from course_utils.env import device_label
from course_utils.ladder import TrainingSet
from course_utils.launch import backend, rank_device, report
from course_utils.models import resnet18_cifar
from course_utils.timing import StepTimer
from course_utils.train import train


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200, help="timed steps per rank")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (cuDNN autotuning, allocator)")
    p.add_argument("--batch-size", type=int, default=128, help="per GPU: the global batch is N times this")
    p.add_argument("--limit", type=int, default=None, help="use the first LIMIT training records")
    p.add_argument("--width", type=int, default=None, help="ResNet-18 width (64 on a GPU, 8 on a CPU)")
    p.add_argument("--amp", default=None, choices=[None, "bf16", "fp16"])
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


class ShardLoader:
    """Each pass: one epoch of this rank's shard, in batches on the device. The permutation of
    epoch e is drawn from (seed, e), the same on every rank; rank r takes positions r, r + N, ..."""

    def __init__(self, images, labels, batch_size, rank, world, seed):
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.rank, self.world, self.seed, self.epoch = rank, world, seed, 0

    def __iter__(self):
        order = np.random.default_rng((self.seed, self.epoch)).permutation(len(self.labels))[self.rank::self.world]
        self.epoch += 1
        mine = torch.from_numpy(order).to(self.images.device)
        shard = DeviceLoader(self.images.index_select(0, mine), self.labels.index_select(0, mine), self.batch_size,
                             seed=self.seed * 1000 + self.rank)
        yield from shard


def main():
    args = parse_args()
    device = rank_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    dist.init_process_group(backend(), timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        TrainingSet.cifar10(limit=16)          # generate the embedded dataset once, not N times at once
    dist.barrier()
    training_set = TrainingSet.cifar10(limit=args.limit)
    images, labels = training_set.on_device(device)
    loader = ShardLoader(images, labels, args.batch_size, rank, world, args.seed)

    torch.manual_seed(args.seed)
    width = args.width or (64 if device.type == "cuda" else 8)
    model = resnet18_cifar(width=width).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    timer = StepTimer(device, skip_first=args.warmup)
    result = train(ddp, loader, device=device, steps=args.warmup + args.steps, batch_transform=AugmentBatch(),
                   amp=args.amp, channels_last=args.channels_last, timer=timer, progress=False, desc=f"rank {rank}")
    mine = {"rank": rank, "pid": os.getpid(), "samples_per_s": result.stats.samples_per_s,
            "stall_fraction": result.stats.stall_fraction, "steps": result.stats.steps,
            "device": device_label(device)}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    report({"world_size": world, "backend": dist.get_backend(), "batch_size": args.batch_size,
            "global_batch": args.batch_size * world, "width": width, "amp": args.amp,
            "channels_last": args.channels_last, "per_rank": everyone,
            "samples_per_s": sum(r["samples_per_s"] for r in everyone)})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
