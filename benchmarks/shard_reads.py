"""Issue 34's measurements of the course's shard reader, from outside its code (lessons 04 and 07).

    .venv/bin/python benchmarks/shard_reads.py [--images 6000] [--shard 500] [--batch 64] [--workers 4]

- the bytes one rank's DataLoader worker processes read in an epoch (the kernel's count of their
  read() calls, /proc/PID/io), against the bytes of the shards that rank touches; the same for the
  dealing the issue measured (worker w takes the rank's batches w, w+W, ..., read without an index);
- the batch sizes every rank yields;
- the share of an epoch's within-batch neighbours (over both ranks) that recur the next epoch,
  with the shuffle buffer and without;
- the libraries' splits on the same shards (`shards.compare_splits`, 2 ranks x 2 workers).
"""
import argparse
import collections
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset, get_worker_info  # noqa: E402

from course_utils import shards  # noqa: E402
from course_utils.data import load_cifar10_arrays  # noqa: E402


class Strided(IterableDataset):
    """The dealing issue 34 measured: worker w takes the rank's batches w, w+W, ..."""

    def __init__(self, sizes, batch, rank, world):
        self.args = sizes, batch, rank, world

    def __iter__(self):
        sizes, batch, rank, world = self.args
        info = get_worker_info()
        w, workers = (info.id, info.num_workers) if info else (0, 1)
        yield from shards.epoch_batches(sizes, batch, rank=rank, world_size=world, epoch=0, last="exact")[w::workers]


def bytes_read(reader, workers):
    loader = DataLoader(reader, batch_size=None, num_workers=workers, persistent_workers=True)
    it = iter(loader)
    pids = [w.pid for w in it._workers]
    before = {p: shards._proc_rchar(p) for p in pids}
    keys = [k.tolist() for _, _, k in it]
    return sum(shards._proc_rchar(p) - before[p] for p in pids), keys


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--shard", type=int, default=500)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    images, labels = load_cifar10_arrays(train=True, limit=args.images)
    root = Path(tempfile.mkdtemp(prefix="shard-reads-"))
    data = shards.write_shards(root / "rgb", images, labels, samples_per_shard=args.shard)
    print(f"{len(data.files)} shards of {args.shard} ({data.size_on_disk() / 2**20:.1f} MiB), rank 1 of 2, "
          f"{args.workers} workers, batch {args.batch}")
    reader = shards.ShardReader(data, args.batch, rank=1, world_size=2, keys=True)
    reader.set_epoch(0)
    read, keys = bytes_read(reader, args.workers)
    touched = {k // args.shard for b in keys for k in b}
    touched_bytes = sum(data.nbytes[s] for s in touched)
    print(f"course reader: workers read {read / touched_bytes:.2f}x the bytes of the {len(touched)} shards rank 1 "
          f"touches; batch sizes {sorted(collections.Counter(len(b) for b in keys).items())}")
    plain = shards.ShardSet(data.root, data.files, data.sizes, data.encoding)      # no offsets: no seeking
    strided = shards.ShardReader(plain, args.batch, stream=Strided(data.sizes, args.batch, 1, 2), keys=True)
    read2, keys2 = bytes_read(strided, args.workers)
    print(f"the issue's strided dealing, read without an index: {read2 / touched_bytes:.2f}x; batch sizes "
          f"{sorted(collections.Counter(len(b) for b in keys2).items())}")
    for buffer in (shards.SHUFFLE_BUFFER, 0):
        epochs = []
        for epoch in (0, 1):
            batches = []
            for rank in range(2):
                r = shards.ShardReader(data, args.batch, rank=rank, world_size=2, keys=True, shuffle_buffer=buffer)
                r.set_epoch(epoch)
                batches += [k.tolist() for _, _, k in DataLoader(r, batch_size=None, num_workers=args.workers)]
            epochs.append(batches)
        print(f"shuffle buffer {buffer}: {shards.neighbour_recurrence(*epochs):.1%} of epoch 0's within-batch "
              "neighbours recur in epoch 1")
    for r in shards.compare_splits(data, args.batch, world=2, workers=2):
        ratio = f"{r.read_ratio:.2f}x" if r.read_ratio is not None else "-"
        print(f"{r.name:44s} batches/rank {r.batches_per_rank} sizes {r.batch_sizes} repeated {r.repeated} missing "
              f"{r.missing} same shards {r.same_shards} neighbours {r.recurrence:.1%} read {ratio} "
              f"{r.per_s:,.0f} samples/s")


if __name__ == "__main__":
    main()
