"""Lesson 08's multi-GPU rung: the final pipeline under DistributedDataParallel, one process per GPU.

    torchrun --standalone --nproc_per_node=N capstone_ddp.py --steps 200 --batch-size 128 --amp bf16 --channels-last

Launched by `course_utils.launch.torchrun` (lesson 07), which sets the backend and collects the
report. Every rank runs this whole file:

1. `init_process_group`; each rank's device is `rank_device()` (cuda:LOCAL_RANK on GPUs).
2. The data: the training set in this rank's device memory, its shard only (every rank the same
   permutation of the records, drawn on the device from (seed, epoch), split as
   DistributedSampler splits it; a new permutation each epoch, so no two ranks ever train on the
   same sample in one epoch, and nothing is copied from the host to reshuffle).
3. The pipeline: `DeviceLoader` over the shard and `AugmentBatch` on the device, with the final
   pipeline's mixed precision and memory format, exactly as lesson 08's device-resident rung.
   Every rank builds the same initial model (one seed), but draws its own random numbers for
   the augmentation (a generator per rank): ranks seeded alike would crop and flip their
   batches identically.
4. `DistributedDataParallel` all-reduces the gradients during backward; the loop is the
   course's one loop, `course_utils.train.train`, timed by its `StepTimer` on each rank.
   With one process there is nothing to average: the model trains unwrapped, so N = 1 is what
   one GPU reaches alone (and a one-process launch on gloo copies no gradients through the host).

Rank 0 reports every rank's samples/s; the notebook divides the sum by N times what one GPU
reached alone (the same program with N = 1): the scaling efficiency.
"""
import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from course_utils.device_data import AugmentBatch, DeviceLoader
from course_utils.env import device_label
from course_utils.ladder import TrainingSet
from course_utils.launch import init_process_group, report
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


def shard_order(n, rank, world, seed, epoch, device):
    """This rank's records for `epoch`, on `device`: a permutation drawn there from (seed, epoch),
    the same on every rank, of which rank r takes positions r, r + N, ... (no host copy)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator, device=device)[rank::world]


def rank_augmentation(seed, rank, device) -> AugmentBatch:
    """Random crop + flip + normalise on the device, from a generator of this rank's own: ranks
    seeded alike would draw the same crops and flips for every batch."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed * 1000 + rank)
    return AugmentBatch(generator=generator)


class ShardLoader:
    """Each pass: one epoch of this rank's shard, in batches on the device (`shard_order`)."""

    def __init__(self, images, labels, batch_size, rank, world, seed):
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.rank, self.world, self.seed, self.epoch = rank, world, seed, 0

    def __iter__(self):
        mine = shard_order(len(self.labels), self.rank, self.world, self.seed, self.epoch, self.images.device)
        self.epoch += 1
        shard = DeviceLoader(self.images.index_select(0, mine), self.labels.index_select(0, mine), self.batch_size,
                             seed=self.seed * 1000 + self.rank)
        yield from shard


def main():
    args = parse_args()
    device = init_process_group(timeout_s=120)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        TrainingSet.cifar10(limit=16)          # generate the embedded dataset once, not N times at once
    dist.barrier()
    training_set = TrainingSet.cifar10(limit=args.limit)
    images, labels = training_set.on_device(device)
    loader = ShardLoader(images, labels, args.batch_size, rank, world, args.seed)

    torch.manual_seed(args.seed)                # the same initial model on every rank
    width = args.width or (64 if device.type == "cuda" else 8)
    model = resnet18_cifar(width=width).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None) if world > 1 else model
    timer = StepTimer(device, skip_first=args.warmup)
    result = train(ddp, loader, device=device, steps=args.warmup + args.steps,
                   batch_transform=rank_augmentation(args.seed, rank, device),
                   amp=args.amp, channels_last=args.channels_last, timer=timer, progress=False, desc=f"rank {rank}")
    mine = {"rank": rank, "pid": os.getpid(), "samples_per_s": result.stats.samples_per_s,
            "stall_fraction": result.stats.stall_fraction, "steps": result.stats.steps,
            "device": device_label(device)}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    report({"world_size": world, "backend": dist.get_backend(), "batch_size": args.batch_size,
            "global_batch": args.batch_size * world, "width": width, "amp": args.amp,
            "channels_last": args.channels_last, "per_rank": everyone, "ddp": world > 1,
            "samples_per_s": sum(r["samples_per_s"] for r in everyone)})
    del ddp, model, result            # DDP freed before the group, not at interpreter exit (see ddp_train.py)
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
