"""Data bigger than a node: the course's CIFAR-10 as WebDataset tar shards (lessons 04 and 07).

A dataset that does not fit on one node (or in its page cache) is stored as a few hundred
**shards**: tar files of a few hundred MB each, read front to back. This module writes the
course's dataset in the WebDataset layout with the real `webdataset` library (one tar member per
field of a sample: `00000042.rgb` holds its 32x32x3 uint8 pixels, `00000042.cls` its label as text,
or `00000042.jpg` its JPEG bytes), reads it back, and splits it between ranks and DataLoader
workers so that

- every sample is read exactly once per epoch, by one rank and one worker;
- every rank yields the same number of batches (a rank with one batch more waits forever at the
  all-reduce of that batch: lesson 07's hang);
- the split changes every epoch (seeded), and a resumed epoch continues where it stopped.

`epoch_batches()` is that split (the course's answer to exercise 7.5), `ShardStream` the
IterableDataset that deals it to the DataLoader's workers, `ShardReader` the one that reads the
samples from the tar files. `cache_shards()` copies shards to node-local storage once;
`measure_sources()` times shards against the packed CIFAR file and a folder of JPEG files;
`dali_webdataset_pipeline()` reads the same shards with DALI's `fn.readers.webdataset`.

`webdataset` (and `torchdata`, for `StatefulDataLoader`) are imported only when used: without
them these functions raise an ImportError that says what to install.
"""
from __future__ import annotations

import io
import math
import os
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

__all__ = ["MISSING", "have_webdataset", "ShardSet", "write_shards", "open_shards", "epoch_batches",
           "ShardStream", "ShardReader", "iter_shard", "decode_sample", "cache_shards", "SourceResult",
           "measure_sources", "write_jpeg_files", "library_split", "write_dali_indexes",
           "dali_webdataset_pipeline", "GRADING_ENV"]

MISSING = ("this part needs the `webdataset` package (and `torchdata` to resume a loader mid-epoch): "
           "pip install webdataset==1.0.2 torchdata==0.11.0 (both are in the course's requirements.txt)")
GRADING_ENV = "COURSE_GRADING_RANKS"     # set by lesson 07's check ranks: the course's answer refuses to run
IMAGE_SHAPE = (32, 32, 3)


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


# -- writing ----------------------------------------------------------------------------------------

@dataclass
class ShardSet:
    """Shards on disk: the tar files in order, how many samples each holds, and how pixels are stored."""
    root: Path
    files: list[Path]
    sizes: list[int]
    encoding: str                       # "rgb" (raw uint8 pixels) or "jpg"
    meta: dict = field(default_factory=dict, repr=False)

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


def write_shards(dest, images: np.ndarray, labels, *, samples_per_shard: int = 1000, encoding: str = "rgb",
                 quality: int = 90) -> ShardSet:
    """Write `images` ((N, 32, 32, 3) uint8) and `labels` as WebDataset tar shards under `dest`
    (emptied first), `samples_per_shard` samples per shard, with `webdataset.ShardWriter`. Each
    sample is `<key>.cls` (its label, as text) and `<key>.rgb` (its raw pixels, HWC) or `<key>.jpg`."""
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
    sizes = [min(samples_per_shard, len(images) - k * samples_per_shard) for k in range(len(files))]
    return ShardSet(dest, files, sizes, encoding)


def open_shards(root, *, samples_per_shard: int | None = None) -> ShardSet:
    """A ShardSet for shards already on disk (counts read from the tar files' member lists)."""
    import tarfile
    root = Path(root)
    files = sorted(root.glob("shard-*.tar"))
    if not files:
        raise FileNotFoundError(f"no shard-*.tar under {root}")
    sizes, encoding = [], "rgb"
    for f in files:
        with tarfile.open(f) as tar:
            names = [m.name for m in tar.getmembers() if m.isfile()]
        sizes.append(sum(n.endswith(".cls") for n in names))
        if any(n.endswith(".jpg") for n in names):
            encoding = "jpg"
    return ShardSet(root, files, sizes, encoding)


# -- reading one shard --------------------------------------------------------------------------------

def iter_shard(url, start: int = 0):
    """The samples of one shard, front to back, as the library reads them (`tarfile_samples`),
    from sample `start` on (the ones before are read and skipped: a tar has no index)."""
    from webdataset.tariterators import tarfile_samples
    for i, sample in enumerate(tarfile_samples([{"url": str(url)}])):
        if i >= start:
            yield sample


def decode_sample(sample: dict) -> tuple[np.ndarray, int]:
    """(image HWC uint8, label) from one WebDataset sample of these shards."""
    label = int(sample["cls"])
    if "rgb" in sample:
        image = np.frombuffer(sample["rgb"], np.uint8).reshape(IMAGE_SHAPE)
    else:
        import simplejpeg
        image = simplejpeg.decode_jpeg(sample["jpg"], colorspace="RGB")
    return image, label


# -- splitting an epoch between ranks and workers (exercise 7.5's answer) ------------------------------

def _not_for_grading(name):
    if os.environ.get(GRADING_ENV):
        raise RuntimeError(f"{name} is the course's implementation: the check grades your own code")


def epoch_batches(shard_sizes, batch_size: int, *, rank: int, world_size: int, epoch: int, seed: int = 0):
    """This rank's batches of one epoch, each a list of (shard, index) pairs (lesson 07, exercise 7.5).

    The shards are put in an order drawn from (seed, epoch), the same on every rank; that stream
    of samples (each shard front to back) is cut into `world_size` contiguous parts whose sizes
    differ by at most one, and rank r takes part r: it reads only about 1/world_size of the shards,
    each from one place on. Its part is cut into K = ceil(N / (world_size * batch_size)) batches of
    at most `batch_size` (the same K on every rank, so that no rank runs a step more than another;
    a rank's last batches may be a sample or so shorter). Every sample is in exactly one batch of
    one rank."""
    _not_for_grading("course_utils.shards.epoch_batches")
    sizes = [int(n) for n in shard_sizes]
    n = sum(sizes)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    k = math.ceil(n / (world_size * batch_size))
    if n // world_size < k:
        raise ValueError(f"{n} samples are too few for {world_size} ranks to run {k} batch(es) each")
    order = np.random.default_rng([seed, epoch]).permutation(len(sizes))
    bounds = [r * n // world_size for r in range(world_size + 1)]
    stream, position = [], 0
    for shard in order:              # only this rank's part of the stream is built
        lo, hi = max(bounds[rank], position), min(bounds[rank + 1], position + sizes[shard])
        stream.extend((int(shard), i - position) for i in range(lo, hi))
        position += sizes[shard]
    return [list(map(tuple, part.tolist())) for part in np.array_split(np.array(stream).reshape(-1, 2), k)]


def _rank_and_world(rank, world_size):
    if rank is not None and world_size is not None:
        return rank, world_size
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ShardStream(IterableDataset):
    """The batches (lists of (shard, index) pairs) of this rank and this DataLoader worker
    (lesson 07, exercise 7.5's answer). Use it with `DataLoader(stream, batch_size=None,
    num_workers=W)`: worker w yields the rank's batches w, w+W, w+2W, ..., so the DataLoader, which
    takes one batch from each worker in turn, gives them in the rank's order.

    `set_epoch(epoch, start=0)` before each epoch: `start` is the number of this epoch's batches
    the rank already trained on (a resumed job), and iteration continues with the next one.
    The rank and world size come from torch.distributed (or `rank=`, `world_size=`)."""

    def __init__(self, shard_sizes, batch_size, *, seed=0, rank=None, world_size=None):
        self.shard_sizes = [int(n) for n in shard_sizes]
        self.batch_size = int(batch_size)
        self.seed = seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch, start=0):
        self.epoch, self.start = int(epoch), int(start)

    def batches(self):
        """Every batch of this rank this epoch (all workers together), from `start` on."""
        rank, world = _rank_and_world(self.rank, self.world_size)
        return epoch_batches(self.shard_sizes, self.batch_size, rank=rank, world_size=world, epoch=self.epoch,
                             seed=self.seed)[self.start:]

    def __len__(self):
        rank, world = _rank_and_world(self.rank, self.world_size)
        return math.ceil(sum(self.shard_sizes) / (world * self.batch_size)) - self.start

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        yield from self.batches()[worker::workers]


class ShardReader(IterableDataset):
    """Reads the batches a stream deals (by default the course's `ShardStream`) from the shards'
    tar files: yields `(images, labels)`, uint8 (B, 32, 32, 3) and int64 (B,) (with `keys=True` also
    each sample's number, its `__key__`, to count who read what). Each worker keeps
    one shard open and reads it front to back; a batch that starts further on skips forward."""

    def __init__(self, shards: ShardSet, batch_size, *, seed=0, rank=None, world_size=None, stream=None,
                 keys: bool = False):
        self.shards, self.keys = shards, keys
        self.stream = stream if stream is not None else ShardStream(shards.sizes, batch_size, seed=seed, rank=rank,
                                                                    world_size=world_size)

    def set_epoch(self, epoch, start=0):
        self.stream.set_epoch(epoch, start)

    def __len__(self):
        return len(self.stream)

    def __iter__(self):
        current, position, samples = None, 0, None
        for batch in self.stream:
            images, labels, keys = [], [], []
            for shard, index in batch:
                shard, index = int(shard), int(index)
                if shard != current or index < position:
                    current, samples, position = shard, iter_shard(self.shards.files[shard], index), index
                elif index > position:
                    for _ in range(index - position):
                        next(samples)
                    position = index
                sample = next(samples)
                image, label = decode_sample(sample)
                keys.append(int(sample["__key__"]))
                position += 1
                images.append(image)
                labels.append(label)
            out = torch.from_numpy(np.stack(images)), torch.tensor(labels, dtype=torch.int64)
            yield (*out, torch.tensor(keys, dtype=torch.int64)) if self.keys else out


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


# -- a node-local cache ---------------------------------------------------------------------------------

def cache_shards(shards: ShardSet, cache_dir) -> tuple[ShardSet, dict]:
    """Copy each shard to `cache_dir` (node-local storage: a local SSD, or /dev/shm) unless an
    identical copy (same size, not older) is already there; copies go to a temporary name and are
    renamed, so a job that dies mid-copy never leaves a half shard that looks whole. Returns the
    cached ShardSet and what happened: {"copied": n, "kept": n, "bytes_copied": n}."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    files, copied, kept, nbytes = [], 0, 0, 0
    for f in shards.files:
        f = Path(f)
        target = cache_dir / f.name
        st = f.stat()
        if target.exists() and target.stat().st_size == st.st_size and target.stat().st_mtime >= st.st_mtime:
            kept += 1
        else:
            tmp = cache_dir / f".{f.name}.{os.getpid()}.part"
            shutil.copyfile(f, tmp)
            os.replace(tmp, target)
            copied += 1
            nbytes += st.st_size
        files.append(target)
    return ShardSet(cache_dir, files, list(shards.sizes), shards.encoding), \
        {"copied": copied, "kept": kept, "bytes_copied": nbytes}


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
    cold_per_s: float | None            # images/s, first epoch after the files were dropped from the cache


def _epoch_per_s(loader, count: int) -> float:
    t0 = time.perf_counter()
    seen = 0
    for images, labels in loader:
        seen += len(labels)
    elapsed = time.perf_counter() - t0
    if seen != count:
        raise RuntimeError(f"an epoch gave {seen} images, expected {count}")
    return count / elapsed


def measure_sources(sources: dict, *, batch_size: int = 256, num_workers: int = 2, epochs: int = 3,
                    cold: bool = True) -> list[SourceResult]:
    """Time one epoch of each source (`{name: (dataset, files)}`, or `(dataset, files, bytes)` when
    the files hold more than the images read: the bytes those images occupy; map-style datasets get a
    DataLoader with `batch_size`, a `ShardReader` yields its own batches) with `num_workers`
    workers: first cold (its files dropped from the page cache, where the system allows), then
    `epochs` warm epochs (the median is kept). All in one run, so the ratios compare like with like."""
    from .io_probe import evict
    out = []
    for name, (dataset, files, *nbytes) in sources.items():
        if isinstance(dataset, IterableDataset):
            loader = DataLoader(dataset, batch_size=None, num_workers=num_workers)
        else:
            loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
        count = len(dataset) if not isinstance(dataset, ShardReader) else dataset.shards.count
        cold_rate = None
        if cold and evict(files):
            cold_rate = _epoch_per_s(loader, count)
        warm = [_epoch_per_s(loader, count) for _ in range(epochs)]
        size = nbytes[0] if nbytes else sum(Path(f).stat().st_size for f in files)
        out.append(SourceResult(name, len(files), size, count, statistics.median(warm), cold_rate))
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
                             index_files=None, num_threads: int = 2, seed: int = 0, shuffle: bool = False):
    """A DALI CPU pipeline that reads the shards with `fn.readers.webdataset` (lesson 04): images
    (B, 32, 32, 3) uint8 and labels. DALI's own sharding (`shard_id`, `num_shards`) splits samples,
    and `pad_last_batch=True` keeps every shard's batch count equal. The label is the `.cls`
    member's text: one ASCII digit for CIFAR-10's classes, turned into a number by subtracting '0'."""
    from nvidia.dali import fn, pipeline_def, types
    if shards.encoding != "rgb":
        raise ValueError("this pipeline reads raw-pixel shards (encoding 'rgb')")

    index = {"index_paths": [str(p) for p in index_files]} if index_files else {}

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=None, seed=seed)
    def pipe():
        pixels, cls = fn.readers.webdataset(paths=shards.urls, **index, ext=["rgb", "cls"], shard_id=shard_id, num_shards=num_shards,
                                            random_shuffle=shuffle, pad_last_batch=True, name="shards",
                                            missing_component_behavior="error")
        images = fn.reshape(pixels, shape=list(IMAGE_SHAPE))
        labels = fn.cast(cls, dtype=types.INT32) - 48
        return images, labels

    return pipe()
