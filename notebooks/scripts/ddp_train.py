"""Lesson 07: data-parallel training with DistributedDataParallel, one process per device.

    torchrun --standalone --nproc_per_node=2 ddp_train.py --epochs 2 --batch-size 64

Every rank runs this whole file. What makes it data-parallel:

1. `init_process_group` connects the ranks (torchrun set RANK, WORLD_SIZE, MASTER_ADDR...).
2. `DistributedSampler` gives each rank its own share of every epoch; `set_epoch(epoch)`
   reshuffles the shares each epoch (without it, every epoch repeats the first one's order).
3. `DistributedDataParallel` broadcasts rank 0's weights when it wraps the model, then, during
   every `backward()`, all-reduces (averages) the gradients bucket by bucket while the backward
   pass is still running, so every rank takes the same optimizer step.
4. Rank-0 I/O: one rank writes the checkpoint, the others wait at a barrier, then every rank
   reads it onto its own device (`map_location`).
5. Metrics are counted on each rank's share and all-reduced.

The training itself is the course's one loop, `course_utils.train.train` (a DDP-wrapped model
is an nn.Module like any other). Rank 0 reports what happened as JSON to the notebook.
"""
import argparse
import gc
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from course_utils.data import prepare_cifar10
from course_utils.device_data import AugmentBatch, cifar10_on_device, normalize_batch
from course_utils.env import device_label
from course_utils.launch import backend, rank_device, report
from course_utils.models import count_parameters, resnet18_cifar
from course_utils.train import train


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=None, help="at most this many steps per epoch")
    p.add_argument("--batch-size", type=int, default=64, help="per process: the global batch is N times this")
    p.add_argument("--limit", type=int, default=None, help="use the first LIMIT training records")
    p.add_argument("--width", type=int, default=None, help="ResNet-18 width (64 on a GPU, 16 on a CPU)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    p.add_argument("--trace-steps", type=int, default=3, help="extra steps whose all-reduces are timed")
    p.add_argument("--checkpoint", default=None, help="where rank 0 writes the checkpoint")
    p.add_argument("--thread-sweep", type=int, nargs="*", default=[],
                   help="after training, time a few steps with each of these CPU thread counts per rank")
    p.add_argument("--sweep-steps", type=int, default=3, help="steps per thread count (the first is warm-up)")
    return p.parse_args()


class CommLog:
    """A DDP communication hook that does DDP's usual all-reduce (average the bucket over the
    ranks) and records, for each bucket, when it was launched and when it finished."""

    def __init__(self):
        self.records = []

    def hook(self, state, bucket):
        start = time.perf_counter()
        index, nbytes = bucket.index(), bucket.buffer().numel() * bucket.buffer().element_size()
        future = default_hooks.allreduce_hook(state, bucket)

        def finished(fut):
            self.records.append({"bucket": index, "bytes": nbytes, "start": start, "end": time.perf_counter()})
            return fut.value()

        return future.then(finished)


def last_grad_clock(model):
    """Record when backward writes each parameter's gradient (the compute's end is the last one)."""
    stamps = {}
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: stamps.__setitem__(name, time.perf_counter()))
    return stamps


def traced_steps(ddp, comm, stamps, loader_iter, transform, optimizer, device, steps):
    """A few steps written out by hand, to time where the all-reduces fall inside backward."""
    traces = []
    for _ in range(steps):
        images, labels = next(loader_iter)
        images, labels = transform(images.to(device, non_blocking=True), labels.to(device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(images), labels)
        comm.records.clear()
        stamps.clear()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        loss.backward()                 # returns once every bucket's all-reduce has finished
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t1 = time.perf_counter()
        optimizer.step()
        traces.append({"backward_s": t1 - t0, "last_grad_s": max(stamps.values()) - t0,
                       "buckets": [{**r, "start": r["start"] - t0, "end": r["end"] - t0} for r in comm.records]})
    return traces


def main():
    args = parse_args()
    device = rank_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend(), timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    width = args.width or (64 if device.type == "cuda" else 16)

    # -- data: each rank holds the (uint8) images; the sampler decides which ones it trains on
    if rank == 0:
        prepare_cifar10()               # generate the embedded dataset once, not N times at once
    dist.barrier()
    images, labels = cifar10_on_device("cpu", train=True, limit=args.limit)
    train_set = TensorDataset(images, labels)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                        pin_memory=device.type == "cuda", drop_last=True,
                        persistent_workers=args.workers > 0)

    # -- the model: built on every rank; DDP copies rank 0's weights to the others when it wraps it
    torch.manual_seed(args.seed + rank)          # different on purpose: DDP's broadcast fixes it
    model = resnet18_cifar(width=width).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=args.bucket_mb)
    comm = CommLog()
    ddp.register_comm_hook(None, comm.hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)

    epochs, first_batches = [], []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        first_batches.append(list(sampler)[:4])     # the first indices this rank gets this epoch
        comm.records.clear()
        steps = min(args.steps, len(loader)) if args.steps else None     # never past one epoch
        result = train(ddp, loader, device=device, optimizer=optimizer, steps=steps, epochs=1,
                       batch_transform=AugmentBatch(), progress=False, desc=f"rank {rank}")
        steps = result.steps
        epochs.append({"epoch": epoch, "steps": steps, "samples_per_s": result.stats.samples_per_s,
                       "step_ms": result.stats.step_time_ms, "data_wait_ms": result.stats.data_wait_median_ms,
                       "loss": statistics.fmean(result.losses[-5:]) if result.losses else None,
                       "all_reduces": len(comm.records), "all_reduce_bytes": sum(r["bytes"] for r in comm.records)})
        if rank == 0:
            e = epochs[-1]
            print(f"epoch {epoch}: {steps} steps, {e['samples_per_s']:,.0f} samples/s on this rank, "
                  f"loss {e['loss']:.3f}, {e['all_reduces'] / max(steps, 1):.1f} all-reduces per step")

    # -- one step dissected: when does each bucket's all-reduce start, against the backward pass?
    stamps = last_grad_clock(model)
    traces = traced_steps(ddp, comm, stamps, iter(loader), AugmentBatch(), optimizer, device, args.trace_steps)

    # -- cores per rank: the same steps with other numbers of CPU threads in every rank
    sweep = []
    for threads in args.thread_sweep:
        torch.set_num_threads(threads)
        swept = train(ddp, loader, device=device, optimizer=optimizer, steps=min(args.sweep_steps, len(loader)),
                      batch_transform=AugmentBatch(), progress=False)
        sweep.append({"threads": threads, "samples_per_s": swept.stats.samples_per_s})
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))

    # -- are the replicas identical after training (before anyone reads the checkpoint, which would
    # make them so)? The max and the min over the ranks of a fingerprint of the weights must agree
    flat = torch.cat([p.detach().double().flatten() for p in model.parameters()])
    spread = torch.stack([flat.sum(), -flat.sum(), flat.abs().sum(), -flat.abs().sum()])
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    same_weights = bool(spread[0] + spread[1] == 0 and spread[2] + spread[3] == 0)

    # -- evaluation: each rank counts its own part of the test set; the counts are all-reduced
    test_images, test_labels = cifar10_on_device("cpu", train=False, limit=args.limit and max(args.limit // 5, 100))
    mine = range(rank, len(test_labels), world)     # disjoint and not padded: every image counted once
    model.eval()
    correct = seen = 0
    with torch.no_grad():
        for start in range(0, len(mine), 256):
            idx = torch.tensor(mine[start:start + 256])
            x, y = normalize_batch(test_images[idx].to(device), test_labels[idx].to(device))
            correct += (model(x).argmax(1) == y).sum().item()
            seen += len(y)
    counts = torch.tensor([correct, seen], dtype=torch.float64, device=device)
    dist.all_reduce(counts)
    accuracy = (counts[0] / counts[1]).item()

    # -- rank-0 I/O: one writer, a barrier, then everyone reads onto its own device
    checkpoint = Path(args.checkpoint or Path(tempfile.gettempdir()) / f"ddp-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}.pt")
    if rank == 0:
        torch.save(model.state_dict(), checkpoint)   # the plain model's state_dict: no "module." prefix
    dist.barrier()                                   # nobody reads before rank 0 has finished writing
    state = torch.load(checkpoint, map_location=device)
    model.load_state_dict(state)
    dist.barrier()
    if rank == 0 and args.checkpoint is None:
        checkpoint.unlink()

    per_rank = [None] * world
    dist.all_gather_object(per_rank, {"rank": rank, "pid": os.getpid(), "epochs": epochs, "thread_sweep": sweep,
                                      "first_indices": first_batches, "threads": torch.get_num_threads()})
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    report({"world_size": world, "backend": dist.get_backend(), "device": device_label(device),
            "width": width, "parameters": count_parameters(model), "grad_bytes": grad_bytes,
            "batch_size": args.batch_size, "global_batch": args.batch_size * world, "bucket_mb": args.bucket_mb,
            "per_rank": per_rank, "traces": traces, "accuracy": accuracy, "test_images": int(counts[1].item()),
            "same_weights": same_weights, "checkpoint": str(checkpoint)})
    # Free DDP (its reducer holds the process group and the comm hook's Python callbacks) while
    # Python is still fully alive. Left to the interpreter's exit, gloo's threads can be torn down
    # holding work that refers to Python objects, and a run that went well ends in SIGABRT
    # ("terminate called without an active exception"): 3 runs in 33 on a 2-core CPU.
    del ddp, optimizer, comm
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
