"""Lesson 07: data-parallel training with DistributedDataParallel, one process per device.

    torchrun --standalone --nproc_per_node=2 ddp_train.py --epochs 2 --batch-size 64

Every rank runs this whole file. What makes it data-parallel:

1. `init_process_group` connects the ranks (torchrun set RANK, WORLD_SIZE, MASTER_ADDR...).
2. `DistributedSampler` gives each rank its own share of every epoch; `set_epoch(epoch)`
   reshuffles the shares each epoch (without it, every epoch repeats the first one's order).
3. `DistributedDataParallel` broadcasts rank 0's weights when it wraps the model, then, during
   every `backward()`, all-reduces (averages) the gradients bucket by bucket while the backward
   pass is still running, so every rank takes the same optimizer step. A model with buffers
   (BatchNorm's running statistics) also gets rank 0's buffers broadcast at the start of every
   training forward (`broadcast_buffers=True`, the default): the running statistics are rank 0's,
   not an average over the ranks (`nn.SyncBatchNorm` computes the batch statistics over all ranks).
4. Rank-0 I/O: one rank writes the checkpoint, the others wait at a barrier, then every rank
   reads it onto its own device (`map_location`). On several machines the checkpoint must be
   on a filesystem every node sees (`--checkpoint`; by default the directory the job was
   started from, which a cluster's nodes share); where it is not, rank 0 sends its weights
   by broadcast instead, and says so.
5. Metrics are counted on each rank's share and all-reduced, with the model read back from the
   checkpoint, so that every rank evaluates one and the same state (weights and BN buffers).
6. Elastic restarts (`torchrun --max-restarts=N`, `--nnodes=MIN:MAX`): torchrun restarts every
   worker with the same arguments after a failure or a change of membership. With `--resume PATH`,
   rank 0 writes the model, the optimizer and the epoch there after every epoch, and a restarted
   job goes on from the last one written (a changed world size changes the global batch and
   each rank's share of the data: the learning rate was fitted to the old one).

The training itself is the course's one loop, `course_utils.train.train` (a DDP-wrapped model
is an nn.Module like any other). Rank 0 reports what happened as JSON to the notebook.
"""
import argparse
import gc
import os
import statistics
import time
from collections import Counter
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
from course_utils.launch import init_process_group, report
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
    p.add_argument("--bucket-mb", type=float, default=None,
                   help="DDP's bucket_cap_mb (default: DDP's own, 25 MiB with a small first bucket; an explicit "
                        "value switches the small first bucket off)")
    p.add_argument("--resume", default=None,
                   help="rank 0 writes model, optimizer and epoch here after every epoch; a (re)started job "
                        "that finds the file goes on from there (for torchrun --max-restarts)")
    p.add_argument("--trace-steps", type=int, default=3, help="extra steps whose all-reduces are timed")
    p.add_argument("--checkpoint", default="ddp_train_checkpoint.pt",
                   help="where rank 0 writes the checkpoint: a path every node sees (default: in the directory "
                        "the job started from, which SLURM's nodes share)")
    p.add_argument("--thread-sweep", type=int, nargs="*", default=[],
                   help="after training, time a few steps with each of these CPU thread counts per rank")
    p.add_argument("--sweep-steps", type=int, default=3, help="steps per thread count (the first is warm-up)")
    return p.parse_args()


class CommLog:
    """A DDP communication hook that does DDP's usual all-reduce (average the bucket over the
    ranks) and notes, for each bucket, the step it belongs to and, while `timing` is on, when
    its all-reduce was handed over and when it finished.

    Which clock: with gloo (CPU tensors) the host's. Gloo runs the all-reduce on its own threads
    and completes the bucket's future when the numbers are there. With nccl the host's clock says
    nothing: the future completes as soon as the all-reduce is *queued* on NCCL's stream, long
    before it ran. There the times are CUDA events: one recorded on the compute stream when the
    bucket is handed over (the all-reduce cannot start before that point of the stream), one
    recorded in the future's callback, which runs on a stream made to wait for the all-reduce:
    the moment it finished on the GPU. `resolve()` turns them into seconds after a reference."""

    def __init__(self, device):
        self.records, self.step, self.timing = [], 0, False
        self.cuda = device.type == "cuda"

    def new_step(self, *_):
        """A forward pre-hook on the DDP model: each forward pass starts a step."""
        self.step += 1

    def stamp(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def hook(self, state, bucket):
        start = self.stamp() if self.timing else None
        index, nbytes, step = bucket.index(), bucket.buffer().numel() * bucket.buffer().element_size(), self.step
        future = default_hooks.allreduce_hook(state, bucket)

        def finished(fut):
            self.records.append({"bucket": index, "bytes": nbytes, "step": step, "start": start,
                                 "end": self.stamp() if self.timing else None})
            return fut.value()

        return future.then(finished)

    def per_step(self) -> list[int]:
        """All-reduces in each step recorded so far, in step order."""
        counts = Counter(r["step"] for r in self.records)
        return [counts[s] for s in sorted(counts)]


def seconds_since(t0, stamp) -> float:
    """Seconds from `t0` to `stamp`: host clock readings, or CUDA events (after a synchronize)."""
    if isinstance(stamp, float):
        return stamp - t0
    return t0.elapsed_time(stamp) / 1e3


def last_grad_clock(model, comm):
    """Record when backward writes each parameter's gradient (the compute's end is the last one),
    on the same clock as `comm`: an event on the stream that computed it, on a GPU."""
    stamps = {}
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: stamps.__setitem__(name, comm.stamp()))
    return stamps


def traced_steps(ddp, comm, stamps, loader_iter, transform, optimizer, device, steps):
    """A few steps written out by hand, to time where the all-reduces fall inside backward."""
    traces = []
    comm.timing = True
    for _ in range(steps):
        images, labels = next(loader_iter)
        images, labels = transform(images.to(device, non_blocking=True), labels.to(device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(images), labels)
        comm.records.clear()
        stamps.clear()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = comm.stamp()
        loss.backward()     # gloo: returns once every bucket's all-reduce has finished; nccl: once they are queued
        t1 = comm.stamp()   # nccl: on the stream, which DDP made wait for the all-reduces
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        optimizer.step()
        traces.append({"backward_s": seconds_since(t0, t1),
                       "last_grad_s": max(seconds_since(t0, t) for t in stamps.values()),
                       "clock": "CUDA events" if comm.cuda else "host clock",
                       "buckets": [{**r, "start": seconds_since(t0, r["start"]), "end": seconds_since(t0, r["end"])}
                                   for r in comm.records]})
    comm.timing = False
    return traces


def same_file_everywhere(path: Path, device) -> bool:
    """Whether every rank sees the very file rank 0 wrote (the same size and modification time,
    rank 0's sent to all): false on a node-local path such as /tmp, on a multi-node job, even
    where an older file of that name happens to exist."""
    stat = path.stat() if path.exists() else None
    mine = torch.tensor([stat.st_size, stat.st_mtime_ns] if stat else [-1, -1], dtype=torch.int64, device=device)
    rank0 = mine.clone()
    dist.broadcast(rank0, src=0)
    same = torch.tensor([int(torch.equal(mine, rank0))], dtype=torch.int64, device=device)
    dist.all_reduce(same, op=dist.ReduceOp.MIN)      # one answer for all ranks: they must take the same path
    return bool(same.item())


def share_checkpoint(model, checkpoint: Path, device) -> bool:
    """Rank-0 I/O: rank 0 writes the plain model's state_dict, everyone waits, every rank reads it
    onto its own device. Where some rank cannot see rank 0's file (a node-local path on a
    multi-node job), rank 0's weights go to every rank by broadcast instead. True if read from the file."""
    if dist.get_rank() == 0:
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), checkpoint)   # the plain model's state_dict: no "module." prefix
    dist.barrier()                                   # nobody reads before rank 0 has finished writing
    if same_file_everywhere(checkpoint, device):
        model.load_state_dict(torch.load(checkpoint, map_location=device))
        return True
    if dist.get_rank() == 0:
        print(f"not every rank sees {checkpoint}: on several machines put the checkpoint on a filesystem "
              "they share (--checkpoint); sending rank 0's weights by broadcast instead", flush=True)
    with torch.no_grad():
        for tensor in model.state_dict().values():   # the model's own storage: broadcast fills it in place
            dist.broadcast(tensor, src=0)
    return False


def resume(path, model, optimizer, device) -> int:
    """The epoch to start from: 0, or the one after the last epoch `save_resume_state` wrote."""
    if not path or not Path(path).exists():
        return 0
    state = torch.load(path, map_location=device)          # every rank reads it onto its own device
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if dist.get_rank() == 0:
        print(f"resumed from {path}: epoch {state['epoch']} was done (written by a job of {state['world_size']} "
              f"ranks; this one has {dist.get_world_size()})", flush=True)
    return int(state["epoch"]) + 1


def save_resume_state(path, model, optimizer, epoch) -> None:
    """Rank 0 writes the state after an epoch, to a temporary name first: a rank killed while writing
    leaves the previous epoch's file whole. The others wait, so that no rank runs ahead of the file."""
    if dist.get_rank() == 0:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                    "world_size": dist.get_world_size()}, partial)
        os.replace(partial, path)
    dist.barrier()


def main():
    args = parse_args()
    device = init_process_group(timeout_s=120)   # cuda:LOCAL_RANK or the CPU; nccl bound to that GPU
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
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
              **({} if args.bucket_mb is None else {"bucket_cap_mb": args.bucket_mb}))
    comm = CommLog(device)
    ddp.register_comm_hook(None, comm.hook)
    ddp.register_forward_pre_hook(comm.new_step)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)

    epochs, first_batches = [], []
    first_epoch = resume(args.resume, model, optimizer, device)
    for epoch in range(first_epoch, args.epochs):
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
                       "all_reduces": len(comm.records), "all_reduce_bytes": sum(r["bytes"] for r in comm.records),
                       "all_reduces_per_step": comm.per_step()})
        if rank == 0:
            e = epochs[-1]
            print(f"epoch {epoch}: {steps} steps, {e['samples_per_s']:,.0f} samples/s on this rank, "
                  f"loss {e['loss']:.3f}, all-reduces per step {e['all_reduces_per_step']}")
        if args.resume:
            save_resume_state(args.resume, model, optimizer, epoch)

    # -- one step dissected: when does each bucket's all-reduce start, against the backward pass?
    stamps = last_grad_clock(model, comm)
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

    # -- rank-0 I/O: one writer, a barrier, then everyone reads onto its own device. Every rank
    # then evaluates the same state: DDP broadcast rank 0's BatchNorm buffers at the start of the
    # last training forward, and each rank's own batch has changed them since.
    from_file = share_checkpoint(model, Path(args.checkpoint).resolve(), device)

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

    per_rank = [None] * world
    dist.all_gather_object(per_rank, {"rank": rank, "pid": os.getpid(), "epochs": epochs, "thread_sweep": sweep,
                                      "first_indices": first_batches, "threads": torch.get_num_threads()})
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    report({"world_size": world, "backend": dist.get_backend(), "device": device_label(device),
            "width": width, "parameters": count_parameters(model), "grad_bytes": grad_bytes,
            "batch_size": args.batch_size, "global_batch": args.batch_size * world, "bucket_mb": args.bucket_mb,
            "train_records": len(train_set), "seed": args.seed,
            "per_rank": per_rank, "traces": traces, "accuracy": accuracy, "test_images": int(counts[1].item()),
            "same_weights": same_weights, "checkpoint": str(Path(args.checkpoint).resolve()),
            "checkpoint_from_file": from_file})
    # Free DDP (its reducer holds the process group and the comm hook's Python callbacks) while
    # Python is still fully alive. Left to the interpreter's exit, gloo's threads can be torn down
    # holding work that refers to Python objects, and a run that went well ends in SIGABRT
    # ("terminate called without an active exception"): 3 runs in 33 on a 2-core CPU.
    del ddp, optimizer, comm
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
