"""Data bigger than a node: the course's CIFAR-10 as WebDataset tar shards (lessons 04 and 07).

A dataset that does not fit on one node (or in its page cache) is stored as a few hundred
**shards**: tar files of a few hundred MB each, read front to back. This module writes the
course's dataset in the WebDataset layout with the real `webdataset` library (one tar member per
field of a sample: `00000042.rgb` holds its 32x32x3 uint8 pixels, `00000042.cls` its label as text,
or `00000042.jpg` its JPEG bytes), with a **manifest** beside the shards (`manifest.json`: each
shard's sample count, size, SHA-256 and where each sample starts), and deals it to ranks and
DataLoader workers the way a 2 x 8 GPU job needs:

- **one read per shard per rank**: the epoch's stream (the shards in a seeded order, each front to
  back) is cut into one contiguous part per rank, and each DataLoader worker of that rank reads a
  contiguous run of its part, starting mid-shard with one seek (the manifest says where each
  sample starts), so every byte a rank needs is read once per epoch;
- **equal counts of full batches**: every rank yields the same number of batches of exactly
  `batch_size` samples. `last="drop"` (the default) leaves out fewer than world_size x batch_size
  samples per epoch, other ones every epoch; `last="pad"` repeats that many (wrapping around the
  stream, as `DistributedSampler` pads); `last="exact"` (evaluation) reads every sample once, in
  batches that may be a sample short;
- **real shuffling**: the shards' order changes every epoch, and each worker passes its run through
  a seeded shuffle buffer (`shuffle_buffer` samples, emitting once `initial` are in), so that the
  samples of one batch are not the neighbours of one shard again next epoch;
- **the rank and world size are read in the main process** (at construction and at `set_epoch`:
  from torch.distributed, else from torchrun's `RANK`/`WORLD_SIZE`), never inside a worker,
  which under the spawn or forkserver start methods has no process group;
- **exact resume**: `set_epoch(epoch, start=k)` continues after the rank's first k batches (with
  the same number of ranks and workers: see `ShardStream`).

`epoch_plan()` is the arithmetic (cumulative shard sizes, no epoch-long lists), `ShardStream` the
IterableDataset that deals it to the DataLoader's workers (the course's answer to exercise 7.5),
`ShardReader` the one that reads the samples from the tar files. `cache_shards()` copies shards to
node-local storage once per node, with a content check; `measure_sources()` times shards against
the packed CIFAR file and a folder of JPEG files; `dali_webdataset_pipeline()` reads the same
shards with DALI's `fn.readers.webdataset`.

`webdataset` (and `torchdata`, for `StatefulDataLoader`) are imported only when used: without
them these functions raise an ImportError that says what to install.
"""
from __future__ import annotations

import collections
import hashlib
import importlib.util
import io
import json
import math
import os
import shutil
import statistics
import tarfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

__all__ = ["MISSING", "have_webdataset", "ShardSet", "write_shards", "open_shards", "write_manifest", "epoch_plan",
           "epoch_batches", "worker_runs", "resume_skips", "shuffle_order", "ShardStream", "ShardReader",
           "iter_shard", "decode_sample", "cache_shards", "SourceResult", "measure_sources", "write_jpeg_files",
           "library_split", "neighbour_recurrence", "write_dali_indexes", "dali_webdataset_pipeline",
           "resolve_rank", "compare_splits", "SplitResult", "GRADING_ENV", "POLICIES"]

MISSING = ("this part needs the `webdataset` package (and `torchdata` to resume a loader mid-epoch): "
           "pip install webdataset==1.0.2 torchdata==0.11.0 (both are in the course's requirements.txt)")
GRADING_ENV = "COURSE_GRADING_RANKS"     # set by lesson 07's check ranks: the course's answer refuses to run
IMAGE_SHAPE = (32, 32, 3)
MANIFEST = "manifest.json"
POLICIES = ("drop", "pad", "exact")
SHUFFLE_BUFFER, SHUFFLE_INITIAL = 1000, 250       # samples per worker (webdataset's .shuffle(1000, initial=...))
WIDS_CACHE = ".wids-cache"                         # where compare_splits lets wids copy the shards


def have_webdataset() -> bool:
    try:
        import webdataset  # noqa: F401
        return True
    except ImportError:
        return False


def _wds():
    try:
        import webdataset
    except ImportError as exc:
        raise ImportError(MISSING) from exc
    return webdataset


# -- writing, and the manifest ----------------------------------------------------------------------

@dataclass
class ShardSet:
    """Shards on disk: the tar files in order, how many samples each holds, how pixels are stored,
    and (from the manifest) each shard's size in bytes, SHA-256, and the byte offset where each of
    its samples starts (plus the end of the last one), which lets a reader start mid-shard."""
    root: Path
    files: list[Path]
    sizes: list[int]
    encoding: str                       # "rgb" (raw uint8 pixels) or "jpg"
    nbytes: list[int] = field(default_factory=list, repr=False)
    sha256: list[str] = field(default_factory=list, repr=False)
    offsets: list[list[int]] | None = field(default=None, repr=False)

    @property
    def count(self) -> int:
        return sum(self.sizes)

    @property
    def urls(self) -> list[str]:
        return [str(f) for f in self.files]

    def size_on_disk(self) -> int:
        return sum(Path(f).stat().st_size for f in self.files)


def _encode_jpeg(image: np.ndarray, quality: int) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _sha256(path, chunk=1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _sample_offsets(path) -> tuple[int, list[int]]:
    """(samples, [byte offset of each sample's first member header..., end of the last member])."""
    offsets, end, key = [], 0, None
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            stem = member.name.split(".", 1)[0]
            if stem != key:
                offsets.append(member.offset)
                key = stem
            end = member.offset_data + ((member.size + 511) // 512) * 512
    return len(offsets), offsets + [end]


def write_manifest(shards: ShardSet) -> Path:
    """Write `manifest.json` beside the shards: what every rank would otherwise learn by scanning
    every tar at start-up (sample counts), a content check for node-local copies (size, SHA-256),
    and where each sample starts (what wids' and DALI's index files hold)."""
    entries = []
    for k, f in enumerate(shards.files):
        count, offsets = _sample_offsets(f)
        entries.append({"name": Path(f).name, "samples": count, "bytes": Path(f).stat().st_size,
                        "sha256": _sha256(f), "offsets": offsets})
    shards.sizes = [e["samples"] for e in entries]
    shards.nbytes = [e["bytes"] for e in entries]
    shards.sha256 = [e["sha256"] for e in entries]
    shards.offsets = [e["offsets"] for e in entries]
    path = Path(shards.root) / MANIFEST
    path.write_text(json.dumps({"format": "feed-the-gpu shards 1", "encoding": shards.encoding, "shards": entries}))
    return path


def write_shards(dest, images: np.ndarray, labels, *, samples_per_shard: int = 1000, encoding: str = "rgb",
                 quality: int = 90) -> ShardSet:
    """Write `images` ((N, 32, 32, 3) uint8) and `labels` as WebDataset tar shards under `dest`
    (emptied first), `samples_per_shard` samples per shard, with `webdataset.ShardWriter`, and the
    manifest beside them. Each sample is `<key>.cls` (its label, as text) and `<key>.rgb` (its raw
    pixels, HWC) or `<key>.jpg`; the key is the sample's number in `images`."""
    wds = _wds()
    if encoding not in ("rgb", "jpg"):
        raise ValueError(f"encoding must be 'rgb' or 'jpg', not {encoding!r}")
    images = np.ascontiguousarray(images, dtype=np.uint8)
    labels = np.asarray(labels)
    if images.ndim != 4 or images.shape[1:] != IMAGE_SHAPE or len(images) != len(labels):
        raise ValueError(f"images must be (N, 32, 32, 3) uint8 with one label each, got {images.shape} "
                         f"and {labels.shape}")
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with wds.ShardWriter(str(dest / "shard-%06d.tar"), maxcount=samples_per_shard, verbose=0) as sink:
        for i, (image, label) in enumerate(zip(images, labels)):
            payload = image.tobytes() if encoding == "rgb" else _encode_jpeg(image, quality)
            sink.write({"__key__": f"{i:08d}", "cls": int(label), encoding: payload})
    files = sorted(dest.glob("shard-*.tar"))
    shards = ShardSet(dest, files, [], encoding)
    write_manifest(shards)
    return shards


def open_shards(root, *, scan: bool = False) -> ShardSet:
    """The ShardSet under `root`, from its manifest (one small file read, however many shards);
    without a manifest (or with `scan=True`) every tar's member list is read, and the manifest
    written for next time."""
    root = Path(root)
    manifest = root / MANIFEST
    if manifest.exists() and not scan:
        spec = json.loads(manifest.read_text())
        entries = spec["shards"]
        return ShardSet(root, [root / e["name"] for e in entries], [e["samples"] for e in entries], spec["encoding"],
                        [e["bytes"] for e in entries], [e["sha256"] for e in entries],
                        [e["offsets"] for e in entries])
    files = sorted(root.glob("shard-*.tar"))
    if not files:
        raise FileNotFoundError(f"no shard-*.tar under {root}")
    encoding = "rgb"
    with tarfile.open(files[0]) as tar:
        if any(n.endswith(".jpg") for n in tar.getnames()):
            encoding = "jpg"
    shards = ShardSet(root, files, [], encoding)
    write_manifest(shards)
    return shards


# -- reading samples ------------------------------------------------------------------------------------

def iter_shard(url, start: int = 0):
    """The samples of one shard, front to back, as the webdataset library reads them
    (`tarfile_samples`), from sample `start` on (the ones before are read and skipped: without an
    index a tar cannot be entered mid-way)."""
    from webdataset.tariterators import tarfile_samples
    for i, sample in enumerate(tarfile_samples([{"url": str(url)}])):
        if i >= start:
            yield sample


def _parse_members(blob: bytes) -> dict:
    """One sample's tar members (a 512-byte header, then the data padded to 512 bytes, each) as a
    webdataset-style dict: {"__key__": ..., "cls": b"3", "rgb": b"..."}. Only the fields a ustar
    header needs are read (name, size, type); pax extended headers (which Python's tarfile writes
    before members) are skipped."""
    sample, pos = {}, 0
    while pos + 512 <= len(blob):
        header = blob[pos:pos + 512]
        if not header.strip(b"\0"):                  # the end-of-archive blocks
            break
        size = int(header[124:136].strip(b"\0 ") or b"0", 8)
        kind = header[156:157]
        if kind in (b"0", b"\0"):                     # a regular file
            name = header[:100].split(b"\0", 1)[0].decode()
            prefix = header[345:500].split(b"\0", 1)[0].decode() if header[257:262] == b"ustar" else ""
            stem, ext = (prefix + "/" + name if prefix else name).split(".", 1)
            sample["__key__"] = stem
            sample[ext] = blob[pos + 512:pos + 512 + size]
        pos += 512 + ((size + 511) // 512) * 512
    return sample


def decode_sample(sample: dict) -> tuple[np.ndarray, int]:
    """(image HWC uint8, label) from one WebDataset sample of these shards."""
    label = int(sample["cls"])
    if "rgb" in sample:
        image = np.frombuffer(sample["rgb"], np.uint8).reshape(IMAGE_SHAPE)
    else:
        import simplejpeg
        image = simplejpeg.decode_jpeg(sample["jpg"], colorspace="RGB")
    return image, label


# -- rank and world size, resolved where the process group lives ----------------------------------------

def resolve_rank(rank=None, world_size=None) -> tuple[int, int]:
    """(rank, world_size): as given, else from torch.distributed where it is initialised, else
    from torchrun's RANK and WORLD_SIZE, else (0, 1). Call it in the main process: a DataLoader
    worker started by spawn or forkserver (macOS, Python 3.14's default on Linux) has no process
    group, and would take itself for rank 0 of 1."""
    if rank is not None and world_size is not None:
        rank, world_size = int(rank), int(world_size)
    else:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        else:
            rank, world_size = 0, 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    return rank, world_size


# -- the epoch's plan: arithmetic on cumulative shard sizes -------------------------------------------------

def _not_for_grading(name):
    if os.environ.get(GRADING_ENV):
        raise RuntimeError(f"{name} is the course's implementation: the check grades your own code")


@dataclass
class RankPlan:
    """One rank's part of one epoch, as arithmetic: the epoch's stream is the shards in `order`,
    each front to back (N samples, `cum[j]` of them before the j-th shard of the order); this rank
    reads stream positions `first`, `first + 1`, ... (modulo N: padding wraps around), cut into
    `batches` batches of the sizes `batch_sizes(k)` gives. No per-sample list is built."""
    order: np.ndarray
    cum: np.ndarray
    n: int
    first: int
    batches: int
    batch_size: int
    sizes: list[int] | None = None      # "exact": the sizes of the rank's batches; else all batch_size

    def batch_length(self, k: int) -> int:
        return self.sizes[k] if self.sizes is not None else self.batch_size

    def batch_start(self, k: int) -> int:
        """Offset of batch k in the rank's part."""
        return int(sum(self.sizes[:k])) if self.sizes is not None else k * self.batch_size

    def locate(self, positions) -> list[tuple[int, int]]:
        """(shard, index) of stream positions (taken modulo N)."""
        p = np.asarray(positions, dtype=np.int64) % self.n
        j = np.searchsorted(self.cum, p, side="right") - 1
        return list(zip(self.order[j].tolist(), (p - self.cum[j]).tolist()))


def epoch_plan(shard_sizes, batch_size: int, *, rank: int, world_size: int, epoch: int, seed: int = 0,
               last: str = "drop") -> RankPlan:
    """This rank's part of one epoch (lesson 07, exercise 7.5's answer): the shards in an order
    drawn from (seed, epoch), the same on every rank, chained into one stream.

    - "drop": K = N // (world_size x batch_size) full batches per rank; the ranks' parts are
      consecutive stretches of K x batch_size samples starting at an offset drawn from (seed,
      epoch), so the fewer than world_size x batch_size samples left out sit at both ends of the
      stream, and change every epoch;
    - "pad": K = ceil(N / (world_size x batch_size)) full batches per rank; the stream wraps
      around, so that fewer than world_size x batch_size samples come twice (as DistributedSampler
      pads);
    - "exact": K = ceil(N / (world_size x batch_size)) batches per rank of every sample once: rank
      r takes positions r*N//world_size to (r+1)*N//world_size, cut into K batches of nearly equal
      size (some a sample or so short of batch_size: two shapes an epoch)."""
    sizes = np.asarray([int(n) for n in shard_sizes], dtype=np.int64)
    if last not in POLICIES:
        raise ValueError(f"last must be one of {POLICIES}, not {last!r}")
    n, batch_size = int(sizes.sum()), int(batch_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(sizes))
    cum = np.concatenate([[0], np.cumsum(sizes[order])[:-1]])
    per_step = world_size * batch_size
    if last == "drop":
        k = n // per_step
        if k == 0:
            raise ValueError(f"{n} samples are too few for {world_size} ranks x batches of {batch_size}")
        offset = int(rng.integers(0, n - k * per_step + 1))
        return RankPlan(order, cum, n, offset + rank * k * batch_size, k, batch_size)
    k = math.ceil(n / per_step)
    if last == "pad":
        return RankPlan(order, cum, n, rank * k * batch_size, k, batch_size)
    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    if hi - lo < k:
        raise ValueError(f"{n} samples are too few for {world_size} ranks to run {k} batch(es) each")
    bounds = [j * (hi - lo) // k for j in range(k + 1)]
    return RankPlan(order, cum, n, lo, k, batch_size, [bounds[j + 1] - bounds[j] for j in range(k)])


def epoch_batches(shard_sizes, batch_size: int, *, rank: int, world_size: int, epoch: int, seed: int = 0,
                  last: str = "drop"):
    """This rank's batches of one epoch, each a list of (shard, index) pairs, in the stream's order
    (the whole plan as lists: for small datasets and for reading; `epoch_plan` is the arithmetic)."""
    _not_for_grading("course_utils.shards.epoch_batches")
    plan = epoch_plan(shard_sizes, batch_size, rank=rank, world_size=world_size, epoch=epoch, seed=seed, last=last)
    pairs = plan.locate(np.arange(plan.first, plan.first + plan.batch_start(plan.batches)))
    return [pairs[plan.batch_start(k):plan.batch_start(k) + plan.batch_length(k)] for k in range(plan.batches)]


def worker_runs(batches: int, workers: int) -> list[tuple[int, int]]:
    """[lo, hi) of the rank's batches each DataLoader worker reads: contiguous runs whose lengths
    differ by at most one, the longer ones first (so the DataLoader, which takes one batch from each
    worker in turn, delivers worker w's j-th batch at position j x workers + w)."""
    workers = max(1, workers)
    counts = [batches // workers + (1 if w < batches % workers else 0) for w in range(workers)]
    starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
    return [(int(starts[w]), int(starts[w + 1])) for w in range(workers)]


def resume_skips(start: int, runs: list[tuple[int, int]]) -> list[int]:
    """How many of its batches each worker had delivered when the rank had delivered `start`
    (the DataLoader takes worker 0's, 1's, ... in turn): worker w's j-th at position j*W + w.
    A resumed DataLoader asks worker 0 first again, so the rank's (start+1)-th batch must come from
    its worker 0: worker w of the resumed loader takes the run of worker (w + start) % W."""
    workers = len(runs)
    return [min(hi - lo, max(0, -(-(start - w) // workers))) for w, (lo, hi) in enumerate(runs)]


def shuffle_order(n: int, buffer: int, initial: int, rng) -> np.ndarray:
    """The order a shuffle buffer emits n samples read in order 0..n-1 (webdataset's
    `.shuffle(buffer, initial=initial)`, computed on positions alone so that a resumed epoch can
    replay it): nothing comes out until `initial` samples are in; then each sample read (two while
    the buffer grows towards `buffer`) pushes out one drawn at random; the rest drain at random."""
    if buffer <= 1 or n <= 1:
        return np.arange(n)
    initial = max(1, min(initial, buffer))
    draws = rng.random(2 * n + 2)
    out, buf, read, d = [], [], 0, 0
    while read < n and len(buf) < initial:
        buf.append(read)
        read += 1
    while buf:
        for _ in range(2 if len(buf) < buffer else 1):
            if read < n:
                buf.append(read)
                read += 1
        k = int(draws[d] * len(buf))
        d += 1
        buf[k], buf[-1] = buf[-1], buf[k]
        out.append(buf.pop())
    return np.asarray(out, dtype=np.int64)


# -- the stream each DataLoader worker iterates ----------------------------------------------------------

class ShardStream(IterableDataset):
    """The batches (lists of (shard, index) pairs) of this rank and this DataLoader worker
    (lesson 07, exercise 7.5's answer). Use it with `DataLoader(stream, batch_size=None,
    num_workers=W)`: worker w reads a contiguous run of the rank's batches (`worker_runs`), through
    a shuffle buffer of `shuffle_buffer` samples (0: none); the DataLoader takes one batch from
    each worker in turn.

    The rank and world size are resolved here, in the main process (`resolve_rank`: given,
    torch.distributed, else RANK/WORLD_SIZE), at construction and again at each `set_epoch`, and
    travel to the workers with the object (pickled, under spawn).

    `set_epoch(epoch, start=0)` before each epoch: `start` is the number of this epoch's batches
    the rank already trained on (a resumed job), and iteration continues with the next one. Resume
    is exact only with the same number of ranks and of DataLoader workers as before: the split
    depends on both (a job resumed on another world size must finish the epoch with the old split,
    or start the next epoch)."""

    def __init__(self, shard_sizes, batch_size, *, seed=0, rank=None, world_size=None, last="drop",
                 shuffle_buffer=SHUFFLE_BUFFER, initial=SHUFFLE_INITIAL):
        if last not in POLICIES:
            raise ValueError(f"last must be one of {POLICIES}, not {last!r}")
        self.shard_sizes = [int(n) for n in shard_sizes]
        self.batch_size = int(batch_size)
        self.seed, self.last = seed, last
        self.shuffle_buffer, self.initial = int(shuffle_buffer), int(initial)
        self._given = (rank, world_size)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch, start=0):
        self.epoch, self.start = int(epoch), int(start)
        self.rank, self.world_size = resolve_rank(*self._given)

    def plan(self) -> RankPlan:
        return epoch_plan(self.shard_sizes, self.batch_size, rank=self.rank, world_size=self.world_size,
                          epoch=self.epoch, seed=self.seed, last=self.last)

    def __len__(self):
        return self.plan().batches - self.start

    def samples_per_epoch(self) -> int:
        """Samples this rank yields in a whole epoch."""
        plan = self.plan()
        return plan.batch_start(plan.batches)

    def worker_schedule(self, worker: int, workers: int, *, delivered: int = 0):
        """(read, batches) of one worker: the (shard, index) pairs it reads, in reading order (front
        to back), and the batches it yields, from its first one not yet delivered on. After
        `set_epoch(epoch, start=k)`, worker w takes the run of worker (w + k) % W: the rank's
        (k+1)-th batch comes from that worker, and the DataLoader asks worker 0 first. `delivered`:
        batches this worker already yielded (restored from its own state_dict)."""
        plan = self.plan()
        runs = worker_runs(plan.batches, workers)
        role = (worker + self.start) % workers       # a resumed loader starts with worker 0 again
        lo, hi = runs[role]
        skip = min(hi - lo, resume_skips(self.start, runs)[role] + delivered)
        first, last = plan.batch_start(lo), plan.batch_start(hi)
        if self.last == "exact" or self.shuffle_buffer <= 1:
            order = np.arange(last - first)
        else:
            rng = np.random.default_rng([self.seed, self.epoch, self.rank, role, 7])
            order = shuffle_order(last - first, self.shuffle_buffer, self.initial, rng)
        cuts = [plan.batch_start(k) - first for k in range(lo, hi + 1)]
        wanted = order[cuts[skip]:]
        pairs = plan.locate(plan.first + first + np.arange(last - first))
        batches = [[pairs[i] for i in order[cuts[j]:cuts[j + 1]]] for j in range(skip, hi - lo)]
        read = [pairs[i] for i in np.sort(wanted)]
        return read, batches

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        yield from self.worker_schedule(worker, workers)[1]


class ShardReader(IterableDataset):
    """Reads the batches a stream deals (by default the course's `ShardStream`) from the shards'
    tar files: yields `(images, labels)`, uint8 (B, 32, 32, 3) and int64 (B,) (with `keys=True` also
    each sample's number, its `__key__`, to count who read what).

    Each worker reads its samples front to back: one seek where its run starts mid-shard (the
    manifest's offsets), then one read per sample; samples the shuffle buffer holds back wait in
    memory (at most `shuffle_buffer` of them). A stream without a reading order (a learner's) is read
    in the order it yields, seeking where it jumps; without offsets a jump means reading the shard
    from its start."""

    def __init__(self, shards: ShardSet, batch_size, *, seed=0, rank=None, world_size=None, stream=None,
                 keys: bool = False, last: str = "drop", shuffle_buffer: int = SHUFFLE_BUFFER,
                 initial: int = SHUFFLE_INITIAL):
        self.shards, self.keys = shards, keys
        self.stream = stream if stream is not None else ShardStream(
            shards.sizes, batch_size, seed=seed, rank=rank, world_size=world_size, last=last,
            shuffle_buffer=shuffle_buffer, initial=initial)

    def set_epoch(self, epoch, start=0):
        self.stream.set_epoch(epoch, start)

    def __len__(self):
        return len(self.stream)

    def samples_per_epoch(self) -> int:
        if hasattr(self.stream, "samples_per_epoch"):
            return self.stream.samples_per_epoch()
        return self.shards.count

    # torchdata's Stateful protocol: StatefulDataLoader calls these on each worker's copy (after
    # every batch, and before iterating on resume), so a resumed worker continues its own run
    # instead of replaying the epoch ("naively fast-forwarding").
    def state_dict(self) -> dict:
        return {"epoch": self.stream.epoch, "start": self.stream.start, "delivered": self._delivered}

    def load_state_dict(self, state: dict) -> None:
        self.stream.set_epoch(state["epoch"], state["start"])
        self._restored = int(state["delivered"])

    _delivered, _restored = 0, 0

    def _batches_and_reads(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if hasattr(self.stream, "worker_schedule"):
            read, batches = self.stream.worker_schedule(worker, workers, delivered=self._restored)
            return batches, iter(read)
        return self.stream, None

    def __iter__(self):
        batches, reads = self._batches_and_reads()
        self._delivered, self._restored = self._restored, 0
        files, cache = _OpenShards(self.shards), {}
        try:
            for batch in batches:
                images, labels, keys = [], [], []
                for shard, index in batch:
                    pair = (int(shard), int(index))
                    if reads is None:
                        sample = files.read(*pair)
                    else:                      # read ahead until it is in (padding may read a sample twice)
                        while pair not in cache:
                            nxt = next(reads)
                            cache.setdefault(nxt, []).append(files.read(*nxt))
                        sample = cache[pair].pop()
                        if not cache[pair]:
                            del cache[pair]
                    image, label = decode_sample(sample)
                    images.append(image)
                    labels.append(label)
                    keys.append(int(sample["__key__"]))
                out = torch.from_numpy(np.stack(images)), torch.tensor(labels, dtype=torch.int64)
                self._delivered += 1
                yield (*out, torch.tensor(keys, dtype=torch.int64)) if self.keys else out
        finally:
            files.close()


class _OpenShards:
    """The open shard of one worker and where its file position is: a sample at that position is
    one read; another position is one seek (with the manifest's offsets) or, without them, a read
    of the shard from its start."""

    def __init__(self, shards: ShardSet):
        self.shards = shards
        self.current, self.file, self.next_index, self.samples = None, None, 0, None

    def _open(self, shard):
        self.close()
        self.current = shard
        self.file = open(self.shards.files[shard], "rb", buffering=0)
        self.next_index = 0

    def read(self, shard: int, index: int) -> dict:
        offsets = self.shards.offsets[shard] if self.shards.offsets else None
        if offsets is None:                    # no index: the library's reader, from the start if need be
            if shard != self.current or index < self.next_index:
                self.close()
                self.current, self.samples, self.next_index = shard, iter_shard(self.shards.files[shard]), 0
            while self.next_index < index:
                next(self.samples)
                self.next_index += 1
            self.next_index += 1
            return next(self.samples)
        if shard != self.current or self.file is None:
            self._open(shard)
            self.next_index = -1
        if index != self.next_index:
            self.file.seek(offsets[index])
        blob = self.file.read(offsets[index + 1] - offsets[index])
        self.next_index = index + 1
        return _parse_members(blob)

    def close(self):
        if self.file is not None:
            self.file.close()
        self.file, self.current, self.samples = None, None, None


def library_split(shards: ShardSet, *, rank: int, world_size: int, num_workers: int, batch_size: int):
    """What webdataset's own splitters deal (`split_by_node`, then `split_by_worker`: whole shards,
    rank r taking every world_size-th shard, its worker w every num_workers-th of those): the
    number of batches each worker of this rank would yield, with `batched(batch_size)` (the last
    partial batch kept), computed from the shard sizes in one process (lesson 04)."""
    mine = list(range(len(shards.sizes)))[rank::world_size]
    out = []
    for worker in range(max(1, num_workers)):
        theirs = mine[worker::max(1, num_workers)]
        out.append(math.ceil(sum(shards.sizes[s] for s in theirs) / batch_size))
    return out


def neighbour_recurrence(epoch_a, epoch_b) -> float:
    """Of the neighbours of `epoch_a` (two samples next to each other in a batch; batches given as
    lists of sample keys), the fraction that are neighbours in a batch of `epoch_b` again: near 1.0
    when only the shards' order was shuffled (a batch is a stretch of one shard, read in the same
    order every epoch), near 0 with a shuffle buffer (lesson 04)."""
    def pairs(batches):
        return {frozenset((int(a), int(b))) for batch in batches for a, b in zip(list(batch), list(batch)[1:])}
    first = pairs(epoch_a)
    return len(first & pairs(epoch_b)) / max(1, len(first))


# -- the libraries' own answers, measured on the same shards (lesson 04) ----------------------------------

@dataclass
class SplitResult:
    """How one way of dealing shards did on one epoch of every rank (lesson 04's table)."""
    name: str
    batches_per_rank: list[int]
    batch_sizes: list[int]              # the distinct batch sizes seen
    samples: int                        # yielded by all ranks together in epoch 0
    distinct: int
    repeated: int
    missing: int
    same_shards: bool                   # did rank 1 read the very same shards in both epochs?
    missing_changed: bool               # were other samples missing in epoch 1 than in epoch 0?
    recurrence: float                   # neighbours of epoch 0 that are neighbours again in epoch 1
    read_ratio: float | None            # rank 1's workers' bytes read / bytes of the shards it touched
    per_s: float                        # rank 1's samples per second in epoch 0
    note: str = ""


def _proc_rchar(pid) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _keys_of(batch):
    """The sample numbers of one batch, whatever the loader's batch looks like."""
    if isinstance(batch, dict):
        keys = batch["__key__"]
    elif isinstance(batch, (list, tuple)) and len(batch) == 3 and isinstance(batch[2], torch.Tensor):
        keys = batch[2]
    elif isinstance(batch, (list, tuple)) and len(batch) == 1:
        keys = batch[0]
    else:
        keys = batch
    if isinstance(keys, torch.Tensor):
        return [int(k) for k in keys.tolist()]
    return [int(k) for k in keys]


RCHAR_DIR = "COURSE_RCHAR_DIR"        # where each worker notes its read counter once it is ready


def _note_rchar(worker_id):
    """worker_init_fn: note this worker's count of bytes read so far, after its start-up (a
    spawned worker has imported torch by then: those reads are not the data's)."""
    folder = os.environ.get(RCHAR_DIR)
    value = _proc_rchar(os.getpid())
    if folder and value is not None:
        Path(folder, str(os.getpid())).write_text(str(value))


def _one_epoch(loader, workers, measure_bytes):
    import tempfile
    with tempfile.TemporaryDirectory(prefix="rchar-") as folder:
        os.environ[RCHAR_DIR] = folder
        try:
            it = iter(loader)
            pids = [w.pid for w in getattr(it, "_workers", [])] if workers else []
            t0 = time.perf_counter()
            batches = [_keys_of(b) for b in it]
            seconds = time.perf_counter() - t0
            read = None
            if measure_bytes and pids:
                before = {pid: Path(folder, str(pid)) for pid in pids}
                after = {pid: _proc_rchar(pid) for pid in pids}
                if all(f.exists() for f in before.values()) and all(v is not None for v in after.values()):
                    read = sum(after[p] - int(before[p].read_text()) for p in pids)
            del it
        finally:
            os.environ.pop(RCHAR_DIR, None)
    return batches, read, seconds


def _wds_loader(shards, batch_size, rank, world, workers, epoch, *, resampled):
    wds = _wds()
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)     # what webdataset reads
    if resampled:         # every worker draws shards with replacement; with_epoch fixes its count
        per_worker = shards.count // (world * max(1, workers) * batch_size)
        if per_worker < 1:
            raise ValueError(f"{shards.count} samples are too few for {world} ranks x {workers} workers x batches of {batch_size}")
        dataset = (wds.WebDataset(shards.urls, resampled=True, seed=epoch, nodesplitter=None, empty_check=False)
                   .shuffle(SHUFFLE_BUFFER, initial=SHUFFLE_INITIAL).to_tuple("__key__")
                   .batched(batch_size, partial=False).with_epoch(per_worker))
    else:
        dataset = (wds.WebDataset(shards.urls, nodesplitter=wds.split_by_node, shardshuffle=len(shards.urls),
                                  seed=epoch, empty_check=False)
                   .shuffle(SHUFFLE_BUFFER, initial=SHUFFLE_INITIAL).to_tuple("__key__")
                   .batched(batch_size, partial=True))
    return DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=bool(workers),
                      worker_init_fn=_note_rchar)


def _wids_keys(samples):
    """wids' samples as their numbers (a module-level function: spawned workers unpickle it)."""
    return [int(s["__key__"]) for s in samples]


def _wids_loader(shards, batch_size, rank, world, workers, epoch):
    import contextlib
    import wids
    with contextlib.redirect_stderr(io.StringIO()):         # it prints a line for every dataset made
        dataset = wids.ShardListDataset([{"url": str(f), "nsamples": n} for f, n in zip(shards.files, shards.sizes)],
                                        transformations=[], cache_dir=str(Path(shards.root) / WIDS_CACHE),
                                        lru_size=len(shards.files))
    # wids.DistributedChunkedSampler's own arithmetic (it takes the rank from torch.distributed only:
    # without a process group it falls back to rank 0 of 1, whatever rank= says)
    chunk = (len(dataset) + world - 1) // world
    lo, hi = rank * chunk, min(rank * chunk + chunk, len(dataset))
    sampler = wids.ChunkedSampler(dataset, num_samples=(lo, hi), chunksize=1000, seed=0, shuffle=True)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                      collate_fn=_wids_keys, persistent_workers=bool(workers), worker_init_fn=_note_rchar)


def compare_splits(shards: ShardSet, batch_size: int, *, world: int = 2, workers: int = 2,
                   names=None) -> list[SplitResult]:
    """Deal the shards to `world` ranks x `workers` DataLoader workers with each approach (computed
    rank by rank in this process; the libraries read the rank from RANK/WORLD_SIZE, as under
    torchrun), two epochs, and measure from outside: batches per rank and their sizes, samples
    repeated or missing, whether rank 1 read the same shards both epochs, neighbours that recur,
    the bytes rank 1's workers read (the kernel's count of read() calls, /proc/PID/io) against
    the bytes of the shards it touched, and its samples per second (lesson 04)."""
    key_shard = np.repeat(np.arange(len(shards.sizes)), shards.sizes)     # keys are 0..N-1 in shard order
    approaches = {
        "webdataset: split_by_node + split_by_worker": lambda r, e: _wds_loader(shards, batch_size, r, world, workers,
                                                                              e, resampled=False),
        "webdataset: resampled + with_epoch": lambda r, e: _wds_loader(shards, batch_size, r, world, workers, e,
                                                                     resampled=True),
        "wids: indexed, DistributedChunkedSampler": lambda r, e: _wids_loader(shards, batch_size, r, world, workers, e),
        "course ShardReader (drop)": lambda r, e: _course_loader(shards, batch_size, r, world, workers, e, "drop"),
        "course ShardReader (drop, no shuffle buffer)": lambda r, e: _course_loader(shards, batch_size, r, world,
                                                                                   workers, e, "drop", buffer=0),
        "course ShardReader (exact, for evaluation)": lambda r, e: _course_loader(shards, batch_size, r, world,
                                                                                 workers, e, "exact"),
    }
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
    out = []
    try:
        for name, make in approaches.items():
            if names is not None and name not in names:
                continue
            if name.startswith("wids"):
                if importlib.util.find_spec("wids") is None:
                    continue
                shutil.rmtree(Path(shards.root) / WIDS_CACHE, ignore_errors=True)    # its cache starts empty
            epochs, read, seconds = {0: {}, 1: {}}, None, 0.0
            for epoch in (0, 1):
                for rank in range(world):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        batches, nbytes, s = _one_epoch(make(rank, epoch), workers, rank == world - 1 and epoch == 0)
                    epochs[epoch][rank] = batches
                    if rank == world - 1 and epoch == 0:
                        read, seconds = nbytes, s
            first = [k for r in range(world) for b in epochs[0][r] for k in b]
            counts = collections.Counter(first)
            last = world - 1
            touched = {int(key_shard[k]) for b in epochs[0][last] for k in b}
            touched_bytes = sum(shards.nbytes[s] for s in touched) if shards.nbytes else None
            mine = sum(len(b) for b in epochs[0][last])
            out.append(SplitResult(
                name, [len(epochs[0][r]) for r in range(world)],
                sorted({len(b) for r in range(world) for b in epochs[0][r]}), len(first), len(counts),
                len(first) - len(counts), shards.count - len(counts),
                touched == {int(key_shard[k]) for b in epochs[1][last] for k in b},
                set(range(shards.count)) - set(counts) != set(range(shards.count)) - {k for r in range(world)
                                                                                    for b in epochs[1][r] for k in b},
                neighbour_recurrence([b for r in range(world) for b in epochs[0][r]],
                                     [b for r in range(world) for b in epochs[1][r]]),
                read / touched_bytes if read is not None and touched_bytes else None,
                mine / seconds if seconds else 0.0,
                "copies each shard it needs into its cache directory, then memory-maps the copy" if name.startswith("wids")
                else ""))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


def _course_loader(shards, batch_size, rank, world, workers, epoch, last, buffer=SHUFFLE_BUFFER):
    reader = ShardReader(shards, batch_size, rank=rank, world_size=world, keys=True, last=last, shuffle_buffer=buffer)
    reader.set_epoch(epoch)
    return DataLoader(reader, batch_size=None, num_workers=workers, persistent_workers=bool(workers),
                      worker_init_fn=_note_rchar)


# -- a node-local cache ---------------------------------------------------------------------------------

def cache_shards(shards: ShardSet, cache_dir, *, local_rank: int | None = None, barrier=None) -> tuple[ShardSet, dict]:
    """Copy each shard to `cache_dir` (node-local storage: a local SSD, or /dev/shm) once per node:
    the node's local rank 0 copies (to a temporary name, hashed on the way, renamed once complete
    and matching the manifest's SHA-256, so a job that dies mid-copy never leaves a half shard that
    looks whole), then every rank of the node meets at `barrier()` (`torch.distributed.barrier`
    under DDP) and uses the copies. A copy already there is kept when its size matches and (with a
    manifest) its hash does. `local_rank` defaults to env LOCAL_RANK (torchrun's), else 0. Returns
    the cached ShardSet and what happened: {"copied": n, "kept": n, "bytes_copied": n, "checked": n}."""
    cache_dir = Path(cache_dir)
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
    report = {"copied": 0, "kept": 0, "bytes_copied": 0, "checked": 0}
    files = [cache_dir / Path(f).name for f in shards.files]
    if local_rank == 0:
        cache_dir.mkdir(parents=True, exist_ok=True)
        for k, (f, target) in enumerate(zip(shards.files, files)):
            want = shards.sha256[k] if shards.sha256 else None
            size = Path(f).stat().st_size
            if target.exists() and target.stat().st_size == size and (want is None or _sha256(target) == want):
                report["kept"] += 1
                report["checked"] += want is not None
                continue
            tmp = cache_dir / f".{target.name}.{os.getpid()}.part"
            h = hashlib.sha256()
            with open(f, "rb") as src, open(tmp, "wb") as dst:
                while block := src.read(1 << 20):
                    h.update(block)
                    dst.write(block)
            if want is not None and h.hexdigest() != want:
                tmp.unlink()
                raise OSError(f"{f} does not match its manifest's SHA-256: the shard changed or the copy is corrupt")
            os.replace(tmp, target)
            report["copied"] += 1
            report["bytes_copied"] += size
            report["checked"] += want is not None
        if (Path(shards.root) / MANIFEST).exists():
            shutil.copyfile(Path(shards.root) / MANIFEST, cache_dir / MANIFEST)
    if barrier is not None:
        barrier()
    return ShardSet(cache_dir, files, list(shards.sizes), shards.encoding, list(shards.nbytes),
                    list(shards.sha256), shards.offsets), report


# -- the same images as a packed file and as a folder of JPEG files --------------------------------------

class PackedImages(Dataset):
    """The CIFAR binary format: one packed file of 3,073-byte records (label + CHW pixels), read
    by offset (a memory map), decoded to HWC uint8."""

    def __init__(self, path, count: int):
        self.path, self.count = Path(path), count
        self.records = None

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        if self.records is None:
            from .data import read_records
            self.records = read_records(self.path)
        record = np.array(self.records[i])
        return torch.from_numpy(record[1:].reshape(3, 32, 32).transpose(1, 2, 0).copy()), int(record[0])


class JpegFiles(Dataset):
    """One JPEG file per image (the ImageNet layout), decoded with simplejpeg."""

    def __init__(self, files, labels):
        self.files, self.labels = list(files), list(labels)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        import simplejpeg
        with open(self.files[i], "rb") as f:
            image = simplejpeg.decode_jpeg(f.read(), colorspace="RGB")
        return torch.from_numpy(image), int(self.labels[i])


def write_jpeg_files(dest, images, labels, *, quality: int = 90) -> JpegFiles:
    """The same images as one JPEG file each, in a folder per class (ImageNet's layout)."""
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    files = []
    for i, (image, label) in enumerate(zip(images, labels)):
        folder = dest / f"class{int(label):02d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{i:08d}.jpg"
        path.write_bytes(_encode_jpeg(np.ascontiguousarray(image), quality))
        files.append(path)
    return JpegFiles(files, [int(x) for x in labels])


# -- measuring ---------------------------------------------------------------------------------------

@dataclass
class SourceResult:
    """One way of storing the same images, read through a DataLoader (lesson 04)."""
    name: str
    files: int
    size_on_disk: int
    images: int
    warm_per_s: float                   # images/s, from the page cache (median of the warm epochs)
    cold_per_s: float | None            # images/s, after the files were dropped from the cache (median)
    warm_rounds: list = field(default_factory=list)    # each round's warm epoch, images/s
    cold_rounds: list = field(default_factory=list)    # each round's cold epoch, images/s (empty: not measured)


def round_verdict(mine: list, theirs: list, *, margin: float = 0.1, spread: float | None = None) -> tuple[str, list]:
    """How the rates `mine` compare with `theirs`, measured in the same rounds (lesson 04): the
    per-round ratios, and "faster than" / "slower than" only when every round says so by more than
    `margin` (and, with `spread`, the rounds lie within that factor of each other), "about as fast as"
    when every round is within it. Every round one way by more than `margin` but further apart than
    `spread`: "faster in every round (by X to Y: the size moved more than 2x) than" (w8-04: rounds at
    0.31x, 0.12x, 0.14x printed "the rounds disagree"; w6-04: 0.08x, 0.28x, 0.06x said a plain "slower
    than" one run and 4.11x, 0.15x, 0.02x "undecided" the next). "undecided (the rounds disagree)
    against" only where rounds point opposite ways; some rounds within `margin` and the others one way:
    "undecided (some rounds within 10%, the others faster) against"."""
    ratios = [a / b for a, b in zip(mine, theirs) if b]
    if not ratios:
        return "not measured", []
    up, down = all(r > 1 + margin for r in ratios), all(r < 1 - margin for r in ratios)
    if up or down:
        word = "faster" if up else "slower"
        if spread is not None and min(ratios) > 0 and max(ratios) / min(ratios) > spread:
            return (f"{word} in every round (by {min(ratios):.2f}x to {max(ratios):.2f}x: the size moved more than "
                    f"{spread:g}x) than"), ratios
        return f"{word} than", ratios
    if all(abs(r - 1) <= margin for r in ratios):
        return "about as fast as", ratios
    if any(r > 1 + margin for r in ratios) and any(r < 1 - margin for r in ratios):
        return "undecided (the rounds disagree) against", ratios
    side = "faster" if any(r > 1 + margin for r in ratios) else "slower"
    return f"undecided (some rounds within {margin:.0%}, the others {side}) against", ratios


def _epoch_per_s(loader, count: int) -> float:
    """Images per second over one epoch of `loader`, timed from its first batch (the workers'
    start-up and the first batch's latency are not the source's speed)."""
    seen, timed, t0 = 0, 0, None
    for images, labels in loader:
        seen += len(labels)
        if t0 is None:
            t0 = time.perf_counter()
        else:
            timed += len(labels)
    elapsed = time.perf_counter() - t0 if t0 is not None else 0.0
    if seen != count:
        raise RuntimeError(f"an epoch gave {seen} images, expected {count}")
    return timed / elapsed if elapsed > 0 and timed else float("nan")


def measure_sources(sources: dict, *, batch_size: int = 256, num_workers: int = 2, epochs: int = 3,
                    cold: bool = True) -> list[SourceResult]:
    """Time each source (`{name: (dataset, files)}`, or `(dataset, files, bytes)` when the files hold
    more than the images read: the bytes those images occupy; map-style datasets get a DataLoader
    with `batch_size`, a `ShardReader` yields its own batches) with `num_workers` workers, in
    `epochs` rounds that take turns between the sources (a busy moment of this machine lands on
    every source alike, not on one): in each round, each source reads one epoch cold (its files
    dropped from the page cache, where the system allows) and one warm. The workers persist between
    a source's epochs and every epoch is timed from its first batch, so the workers' start-up is not
    counted. The medians and each round's figures are kept (`round_verdict` compares them). A
    `ShardReader` counts the samples it yields in an epoch (all of them with `last="exact"`)."""
    from .io_probe import evict
    loaders, counts = {}, {}
    for name, (dataset, files, *nbytes) in sources.items():
        kw = dict(num_workers=num_workers, persistent_workers=num_workers > 0)
        if isinstance(dataset, IterableDataset):
            loaders[name] = DataLoader(dataset, batch_size=None, **kw)
        else:
            loaders[name] = DataLoader(dataset, batch_size=batch_size, **kw)
        counts[name] = dataset.samples_per_epoch() if isinstance(dataset, ShardReader) else len(dataset)
    cold_rounds = {name: [] for name in sources}
    warm_rounds = {name: [] for name in sources}
    for _ in range(max(1, epochs)):
        for name, (dataset, files, *nbytes) in sources.items():
            if cold and evict(files):
                cold_rounds[name].append(_epoch_per_s(loaders[name], counts[name]))
            warm_rounds[name].append(_epoch_per_s(loaders[name], counts[name]))
    out = []
    for name, (dataset, files, *nbytes) in sources.items():
        size = nbytes[0] if nbytes else sum(Path(f).stat().st_size for f in files)
        colds = cold_rounds[name]
        out.append(SourceResult(name, len(files), size, counts[name], statistics.median(warm_rounds[name]),
                                statistics.median(colds) if colds else None, warm_rounds[name], colds))
    del loaders
    return out


# -- DALI's webdataset reader ------------------------------------------------------------------------------

def write_dali_indexes(shards: ShardSet) -> list[Path]:
    """The index file DALI's `fn.readers.webdataset` reads beside each shard (written with DALI's
    own `wds2idx` tool; without one DALI scans every tar at start-up)."""
    from wds2idx import IndexCreator
    out = []
    for f in shards.files:
        idx = Path(f).with_suffix(".idx")
        with IndexCreator(str(f), str(idx), verbose=False) as creator:
            creator.create_index()
        out.append(idx)
    return out


def dali_webdataset_pipeline(shards: ShardSet, batch_size: int, *, shard_id: int = 0, num_shards: int = 1,
                             index_files=None, num_threads: int = 2, seed: int = 0, shuffle: bool = False,
                             initial_fill: int = 1024, stick_to_shard: bool = False):
    """A DALI CPU pipeline that reads the shards with `fn.readers.webdataset` (lesson 04): images
    (B, 32, 32, 3) uint8 and labels. DALI's own sharding (`shard_id`, `num_shards`) splits the
    samples (not the tar files) into `num_shards` contiguous slices; with `stick_to_shard=False`
    (DALI's default) each pipeline moves on to the next slice every epoch, so over the epochs a rank
    reads every slice (and its node-local cache must hold them all); `stick_to_shard=True` keeps it
    on its slice. `pad_last_batch=True` repeats a slice's last sample to fill its last batch, so
    every pipeline yields the same number of batches. `shuffle=True` is DALI's `random_shuffle`: a
    buffer of `initial_fill` samples read in order, drawn from at random (a buffer shuffle, like
    webdataset's `.shuffle(n)`, not a permutation of the epoch). The label is the `.cls` member's
    text: one ASCII digit for CIFAR-10's classes, turned into a number by subtracting '0', int64."""
    from nvidia.dali import fn, pipeline_def, types
    if shards.encoding != "rgb":
        raise ValueError("this pipeline reads raw-pixel shards (encoding 'rgb')")

    index = {"index_paths": [str(p) for p in index_files]} if index_files else {}

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=None, seed=seed)
    def pipe():
        pixels, cls = fn.readers.webdataset(paths=shards.urls, **index, ext=["rgb", "cls"], shard_id=shard_id,
                                            num_shards=num_shards, random_shuffle=shuffle, initial_fill=initial_fill,
                                            stick_to_shard=stick_to_shard, pad_last_batch=True, name="shards",
                                            missing_component_behavior="error")
        images = fn.reshape(pixels, shape=list(IMAGE_SHAPE))
        # int64 class indices, as F.cross_entropy wants them (lesson 04's rule for every loader)
        labels = fn.cast(fn.cast(cls, dtype=types.INT32) - 48, dtype=types.INT64)
        return images, labels

    return pipe()
