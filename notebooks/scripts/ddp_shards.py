"""Lesson 07: exercise 7.5's ShardStream reading the course's tar shards on every rank.

    torchrun --standalone --nproc_per_node=2 ddp_shards.py --stream shards_yours.py --shards DIR

Each rank builds a DataLoader with 2 workers over `ShardReader` (course_utils.shards), which reads
the batches your `ShardStream` deals from the WebDataset tar files. Every step all-reduces one
number, as DDP's backward would, on the rank's device (its GPU under nccl, which refuses host
memory): a rank with a batch more waits there, and the short collective timeout turns that into an
error instead of a hang. Then it counts, across the ranks, how often each sample came, the batch
sizes, and whether an epoch resumed after `--resume-at` batches (a fresh stream,
`set_epoch(epoch, start=k)`) continues where the full epoch went on. `--start-method spawn` (or env
COURSE_MP_START) starts the DataLoader's workers with spawn, as macOS and Python 3.14 do. Where your
`ShardStream` is not written yet (NotImplementedError), the course's stands in, and the report says so.
"""
import argparse
import collections
import importlib
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from course_utils.launch import init_process_group, report
from course_utils.shards import ShardReader, ShardStream, open_shards


def load_stream(path):
    """Your ShardStream, imported by its module's name (its folder put on sys.path, which spawned
    workers inherit), so that a worker started by spawn can unpickle it."""
    if not path:
        return ShardStream, "the course's ShardStream"
    sys.path.insert(0, str(Path(path).resolve().parent))
    cls = importlib.import_module(Path(path).stem).ShardStream
    try:
        probe = cls([4, 4], 2, seed=0)
        probe.set_epoch(0)
        next(iter(probe), None)
    except NotImplementedError:
        return ShardStream, "the course's ShardStream (yours raises NotImplementedError)"
    return cls, "your ShardStream"


def step_collective(device):
    """The step's gradient all-reduce, in miniature, on the rank's device: under nccl a host tensor
    would be refused ("Tensors must be CUDA and dense")."""
    dist.all_reduce(torch.ones(1, device=device))


def epoch(reader, workers, epoch_no, device, start=0, start_method=None):
    reader.set_epoch(epoch_no, start)
    keys, sizes = [], collections.Counter()
    context = {"multiprocessing_context": start_method} if start_method and workers else {}
    for _, labels, k in DataLoader(reader, batch_size=None, num_workers=workers, **context):
        step_collective(device)
        keys.append(k.tolist())
        sizes[len(labels)] += 1
    return keys, sizes


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stream", default=None)
    parser.add_argument("--shards", required=True)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--resume-at", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-method", default=os.environ.get("COURSE_MP_START") or None,
                        help="how DataLoader workers start: fork, spawn, forkserver (default: the platform's)")
    args = parser.parse_args()
    device = init_process_group(timeout_s=20)
    rank, world = dist.get_rank(), dist.get_world_size()
    cls, used = load_stream(args.stream)
    shards = open_shards(args.shards)
    reader = ShardReader(shards, args.batch_size, stream=cls(shards.sizes, args.batch_size, seed=args.seed), keys=True)
    t0 = time.perf_counter()
    out = {"rank": rank}
    try:
        keys, sizes = epoch(reader, args.workers, 0, device, start_method=args.start_method)
        out["batches"], out["batch_sizes"] = len(keys), {str(b): c for b, c in sorted(sizes.items())}
        out["seconds"] = time.perf_counter() - t0
        out["keys0"] = [k for batch in keys for k in batch]
        full, _ = epoch(reader, args.workers, 1, device, start_method=args.start_method)
        resumed = ShardReader(shards, args.batch_size, stream=cls(shards.sizes, args.batch_size, seed=args.seed),
                              keys=True)
        tail, _ = epoch(resumed, args.workers, 1, device, start=args.resume_at, start_method=args.start_method)
        out["resumed_ok"] = tail == full[args.resume_at:]
        out["keys1"] = [k for batch in full for k in batch]
    except Exception as exc:             # a rank with a batch more: its all-reduce times out
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    gathered = [None] * world
    try:
        dist.all_gather_object(gathered, out)
    except Exception:
        gathered = [out]
    if rank == 0:
        total = shards.count
        summary = {"used": used, "world": world, "workers": args.workers, "samples": total,
                   "shards": len(shards.files), "batch_size": args.batch_size, "resume_at": args.resume_at,
                   "per_rank": [{k: v for k, v in g.items() if not k.startswith("keys")} for g in gathered if g]}
        summary["start_method"] = args.start_method or "the platform's default"
        for e in (0, 1):
            got = [k for g in gathered if g for k in g.get(f"keys{e}", [])]
            summary[f"epoch{e}"] = {"read": len(got), "distinct": len(set(got)), "missing": total - len(set(got)),
                                    "repeated": len(got) - len(set(got))}
        summary["rank0_changed"] = set(gathered[0].get("keys0", [])) != set(gathered[0].get("keys1", []))
        report(summary)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
