"""Lesson 07: exercise 7.5's ShardStream reading the course's tar shards on every rank.

    torchrun --standalone --nproc_per_node=2 ddp_shards.py --stream shards_yours.py --shards DIR

Each rank builds a DataLoader with 2 workers over `ShardReader` (course_utils.shards), which reads
the batches your `ShardStream` deals from the WebDataset tar files. Every step all-reduces one
number, as DDP's backward would: a rank with a batch more waits there, and the short collective
timeout turns that into an error instead of a hang. Then it checks, across the ranks, that every
sample came exactly once, and that an epoch resumed after `--resume-at` batches (a fresh
stream, `set_epoch(epoch, start=k)`) continues where the full epoch went on. Where your
`ShardStream` is not written yet (NotImplementedError), the course's stands in, and the report
says so.
"""
import argparse
import importlib.util
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from course_utils.launch import init_process_group, report
from course_utils.shards import ShardReader, ShardStream, open_shards


def load_stream(path):
    if not path:
        return ShardStream, "the course's ShardStream"
    spec = importlib.util.spec_from_file_location("shards_yours", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls = module.ShardStream
    try:
        probe = cls([4, 4], 2, seed=0)
        probe.set_epoch(0)
        next(iter(probe), None)
    except NotImplementedError:
        return ShardStream, "the course's ShardStream (yours raises NotImplementedError)"
    return cls, "your ShardStream"


def epoch(reader, workers, epoch_no, start=0):
    reader.set_epoch(epoch_no, start)
    keys, batches = [], 0
    for _, labels, k in DataLoader(reader, batch_size=None, num_workers=workers):
        dist.all_reduce(torch.ones(1))           # the step's gradient all-reduce, in miniature
        keys.append(k.tolist())
        batches += 1
    return batches, keys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stream", default=None)
    parser.add_argument("--shards", required=True)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--resume-at", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    init_process_group(timeout_s=20)
    rank, world = dist.get_rank(), dist.get_world_size()
    cls, used = load_stream(args.stream)
    shards = open_shards(args.shards)
    reader = ShardReader(shards, args.batch_size, stream=cls(shards.sizes, args.batch_size, seed=args.seed), keys=True)
    t0 = time.perf_counter()
    out = {"rank": rank}
    try:
        out["batches"], keys = epoch(reader, args.workers, 0)
        out["seconds"] = time.perf_counter() - t0
        out["keys0"] = [k for batch in keys for k in batch]
        _, full = epoch(reader, args.workers, 1)
        resumed = ShardReader(shards, args.batch_size, stream=cls(shards.sizes, args.batch_size, seed=args.seed),
                              keys=True)
        _, tail = epoch(resumed, args.workers, 1, start=args.resume_at)
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
        for e in (0, 1):
            got = [k for g in gathered if g for k in g.get(f"keys{e}", [])]
            summary[f"epoch{e}"] = {"read": len(got), "distinct": len(set(got)), "missing": total - len(set(got))}
        summary["rank0_changed"] = set(gathered[0].get("keys0", [])) != set(gathered[0].get("keys1", []))
        report(summary)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
