"""NVIDIA DALI input pipelines: CIFAR-10 from its binary records, and a JPEG folder (lesson 04).

DALI runs a whole batch through a graph of operators in C++ threads (no GIL, no worker
processes), on the CPU or, with a GPU, on the GPU. This module holds the pipelines lesson 04
demonstrates and later lessons reuse:

- `RecordStore`: the CIFAR-10 binary files of a split, memory-mapped, indexable as one array.
- `CifarRecordBatches`: DALI's *external source* for those records: a callable whose answer
  depends only on (batch `i`, epoch `e`): that batch (shuffled per epoch, sharded like DALI's readers, last batch
  partial or dropped) and raises `StopIteration` at the end of the epoch.
- `cifar_train_pipeline()`: pad 4, random 32x32 crop, horizontal flip, normalise to CHW float
  (`fn.crop` + `fn.crop_mirror_normalize`), on the CPU or the GPU.
- `cifar_loader()`: all of that behind DALI's PyTorch iterator, as an iterable of
  `(images, labels)` batches that `course_utils.train.train` accepts.
- `jpeg_train_pipeline()` / `jpeg_loader()`: file reader, decoder (`mixed` = GPU decoding
  when there is a GPU), random resized crop, flip and normalise, for ImageNet-style folders.

Under DistributedDataParallel every rank must run the same number of training steps (a rank with
one more waits for ever in an all-reduce the others never join): `cifar_loader` with
`drop_last=True` (its default when sharded) gives every shard `(N // shards) // batch_size` full
batches, and `jpeg_loader` uses DALI's FILL policy with `pad_last_batch=True` (every shard the
same number of full batches). `DaliLoader` never skips a batch: an empty one is an error.
- `decode_pipeline()`: decode a list of encoded JPEGs, to time DALI's decoder.

DALI is imported lazily, inside the functions that need it, so `course_utils` imports and works
without it; `require_dali()` raises a one-sentence `ImportError` where it is missing.
Devices are DALI's words, "cpu" or "gpu" (a `torch.device` is accepted too).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import data
from .env import has_dali, usable_cores

__all__ = [
    "same_graph",
    "IMAGENET_MEAN", "IMAGENET_STD", "require_dali", "dali_device", "dali_threads", "shard_range",
    "RecordStore", "CifarRecordBatches", "cifar_train_pipeline", "DaliLoader", "cifar_loader",
    "jpeg_train_pipeline", "jpeg_loader", "decode_pipeline", "feeding_verdict",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DALI_MISSING = ("NVIDIA DALI cannot be imported here (install the nvidia-dali wheel at the version "
                "requirements.txt pins), so the DALI pipelines cannot run")


def require_dali() -> None:
    """Raise ImportError with one sentence when NVIDIA DALI cannot be imported (lesson 04)."""
    if not has_dali():
        raise ImportError(DALI_MISSING + ".")


def dali_device(device) -> tuple[str, int | None]:
    """("cpu", None) or ("gpu", index) for "cpu", "gpu", "cuda", "cuda:1" or a torch.device
    (lesson 04: DALI names devices "cpu"/"gpu" and wants the GPU's index as `device_id`)."""
    kind = device if isinstance(device, str) else getattr(device, "type", None)
    index = None if isinstance(device, str) else getattr(device, "index", None)
    if isinstance(kind, str) and ":" in kind:
        kind, index = kind.split(":", 1)[0], int(kind.split(":", 1)[1])
    if kind in ("cpu", "sim"):       # the simulated accelerator's batches live on the host
        return "cpu", None
    if kind in ("gpu", "cuda"):
        if index is None:           # this process's GPU: LOCAL_RANK under torchrun, else the current one
            import torch
            from .env import local_cuda_index
            index = local_cuda_index() if torch.cuda.is_available() else 0
        return "gpu", int(index)
    raise ValueError(f"device must be 'cpu' or 'gpu' (or a torch.device); got {device!r}")


def dali_threads() -> int:
    """DALI's CPU threads for one process (lesson 04): its share of the cores it may use, the usable
    cores divided by `LOCAL_WORLD_SIZE` (the processes torchrun started on this node; 1 without
    torchrun), less one for the process's own training loop, and at least 1. Eight ranks on 16 cores
    get 1 thread each, not 16 (8 x 16 threads on 16 cores would crowd out the training loops; lesson
    07 budgets the cores per rank the same way); one process on 16 cores gets 15."""
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(1, usable_cores() // ranks - 1)


def shard_range(n: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """The slice [start, stop) of `n` samples that shard `shard_id` of `num_shards` gets, by the
    formula DALI's readers use: floor(id * n / shards) .. floor((id + 1) * n / shards)
    (lesson 04; DistributedDataParallel in lesson 07 gives each process one shard)."""
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id must be in 0..{num_shards - 1}; got {shard_id}")
    return shard_id * n // num_shards, (shard_id + 1) * n // num_shards


# -- the records ---------------------------------------------------------------------------

class RecordStore:
    """CIFAR-10 binary records of several files, memory-mapped (nothing is read until used) and
    indexed as one (N, 3073) array: `store.take(indices)` copies just the rows asked for
    (lesson 04: what DALI's external source reads from)."""

    def __init__(self, parts, limit: int | None = None):
        parts = list(parts)
        # paths are kept so that a pickled store (DALI's parallel external source, spawned workers)
        # reopens its memory maps instead of carrying a copy of every record
        self._reopen = ([str(p) for p in parts], limit) if all(isinstance(p, (str, Path)) for p in parts) else None
        arrays = [data.read_records(p) if isinstance(p, (str, Path)) else np.asarray(p) for p in parts]
        for a in arrays:
            if a.ndim != 2 or a.shape[1] != data.RECORD_BYTES or a.dtype != np.uint8:
                raise ValueError(f"records must be (N, {data.RECORD_BYTES}) uint8; got {a.shape} {a.dtype}")
        if limit is not None:
            kept, left = [], limit
            for a in arrays:
                if left <= 0:
                    break
                kept.append(a[:left])
                left -= len(kept[-1])
            arrays = kept
        self.parts = arrays
        self.offsets = np.cumsum([0] + [len(a) for a in arrays])

    @classmethod
    def from_cifar(cls, root=None, *, train: bool = True, limit: int | None = None) -> "RecordStore":
        """The training (or test) split of the course's CIFAR-10 (`data.prepare_cifar10`)."""
        info = data.prepare_cifar10(root)
        names = data.TRAIN_FILES if train else data.TEST_FILES
        return cls([info.root / name for name in names], limit=limit)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getstate__(self):
        if self._reopen is not None:
            return {"reopen": self._reopen}
        return self.__dict__

    def __setstate__(self, state):
        if "reopen" in state:
            paths, limit = state["reopen"]
            self.__init__(paths, limit=limit)
        else:
            self.__dict__.update(state)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self), data.RECORD_BYTES)

    def take(self, indices) -> np.ndarray:
        """Rows `indices` (any order) as a new contiguous (k, 3073) uint8 array."""
        indices = np.asarray(indices, np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"record index out of range 0..{len(self) - 1}")
        if len(self.parts) == 1:
            return np.ascontiguousarray(self.parts[0][indices])
        out = np.empty((len(indices), data.RECORD_BYTES), np.uint8)
        part = np.searchsorted(self.offsets, indices, side="right") - 1
        for p in np.unique(part):
            where = part == p
            out[where] = self.parts[p][indices[where] - self.offsets[p]]
        return out

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.take(np.arange(len(self))[index])
        if np.isscalar(index):
            return self.take([index])[0]
        return self.take(index)


def _take(records, indices) -> np.ndarray:
    if hasattr(records, "take") and not isinstance(records, np.ndarray):
        return records.take(indices)
    return np.asarray(records[np.asarray(indices)])


class CifarRecordBatches:
    """DALI external source (batch mode) over CIFAR-10 records (lesson 04): called with a
    `nvidia.dali.types.BatchInfo` (iteration within the epoch, epoch index), it returns
    `(images (b, 3, 32, 32) uint8 CHW, labels (b,) int64, indices (b,) int64)` and raises
    `StopIteration` once the epoch is over (again on every later call of that epoch: DALI's
    prefetching asks past the end).

    - The order of epoch `e` is a permutation drawn from `(seed, e)`, the same in every process,
      so shards of one epoch never overlap; `shuffle=False` keeps the file order.
    - Shard `shard_id` of `num_shards` gets the slice `shard_range()` of that order.
    - The last batch is partial; with `drop_last=True` every shard yields the same number of full
      batches, `(N // num_shards) // batch_size` (the shards differ by a record at most, so a
      longer shard's last full batch is left out too: under DistributedDataParallel every rank must
      run the same number of steps). Without `drop_last` the shards' counts may differ by one:
      for evaluation, where each rank's results are summed.
    What it returns depends on its arguments alone (it caches the current epoch's permutation,
    nothing else), so DALI may call it ahead, or from worker processes.
    """

    def __init__(self, records, batch_size: int, *, shuffle: bool = True, seed: int = 0, shard_id: int = 0,
                 num_shards: int = 1, drop_last: bool = False):
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.records, self.batch_size = records, int(batch_size)
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        self.shard_id, self.num_shards = int(shard_id), int(num_shards)
        self.start, self.stop = shard_range(len(records), self.shard_id, self.num_shards)

    @property
    def num_samples(self) -> int:
        """Samples of this shard in one epoch (before dropping a partial last batch)."""
        return self.stop - self.start

    def __len__(self) -> int:
        """Batches per epoch (with `drop_last`, the same in every shard)."""
        if self.drop_last:
            return (len(self.records) // self.num_shards) // self.batch_size
        full, rest = divmod(self.num_samples, self.batch_size)
        return full + (1 if rest else 0)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The record indices this shard visits in `epoch`, in order (a function of seed and
        epoch alone; the last two epochs' orders are cached, as drawing a permutation of 50,000
        for every batch would cost more than reading the batch)."""
        epoch = int(epoch)
        cache = self.__dict__.setdefault("_orders", {})
        if epoch not in cache:
            n = len(self.records)
            order = np.random.default_rng((self.seed, epoch)).permutation(n) if self.shuffle else np.arange(n)
            cache[epoch] = order[self.start:self.stop]
            for old in sorted(cache)[:-2]:
                del cache[old]
        return cache[epoch]

    def __call__(self, info):
        iteration = int(getattr(info, "iteration", info))
        epoch = int(getattr(info, "epoch_idx", 0))
        if iteration >= len(self):
            raise StopIteration
        first = iteration * self.batch_size
        indices = self.epoch_order(epoch)[first:first + self.batch_size]
        rows = _take(self.records, indices)
        images = np.ascontiguousarray(rows[:, 1:]).reshape(-1, 3, 32, 32)
        return images, rows[:, 0].astype(np.int64), indices.astype(np.int64)


# -- the CIFAR pipeline --------------------------------------------------------------------

def cifar_train_pipeline(source, *, batch_size: int, device="cpu", num_threads: int | None = None,
                         seed: int = 0, prefetch_queue_depth: int = 2, augment: bool = True, pad: int = 4,
                         mean=data.CIFAR10_MEAN, std=data.CIFAR10_STD, with_offsets: bool = False):
    """A DALI pipeline (not yet built) over a batch `source` like `CifarRecordBatches` (lesson 04).

    Outputs `images` (B, 3, 32, 32) float32 CHW, normalised `(x/255 - mean) / std`, then
    `labels` and `indices` as the source gave them. With `augment`, each sample is padded with
    `pad` black pixels, cropped back to 32x32 at a random offset (0..2*pad, uniform, on each
    axis) and flipped horizontally with probability 1/2, like torchvision's
    `RandomCrop(32, padding=4)` + `RandomHorizontalFlip()`. `with_offsets` adds three outputs:
    the crop's top-left corner y, x in the padded image, and the flip (0/1).
    On "gpu" the images go to the GPU right after the source and are cropped and normalised there.
    """
    require_dali()
    from nvidia.dali import fn, pipeline_def, types

    where, device_id = dali_device(device)
    positions = [i / (2 * pad) for i in range(2 * pad + 1)] if pad else [0.0]

    @pipeline_def(batch_size=batch_size, num_threads=num_threads or dali_threads(), device_id=device_id,
                  seed=seed, prefetch_queue_depth=prefetch_queue_depth)
    def graph():
        images, labels, indices = fn.external_source(
            source=source, num_outputs=3, batch=True, batch_info=True, layout=["CHW", "", ""],
            dtype=[types.UINT8, types.INT64, types.INT64])
        if where == "gpu":
            images = images.gpu()
        mean255 = [255 * m for m in mean]
        std255 = [255 * s for s in std]
        if not augment:
            out = fn.crop_mirror_normalize(images, mean=mean255, std=std255, dtype=types.FLOAT,
                                           output_layout="CHW")
            return out, labels, indices
        size = 32 + 2 * pad
        padded = fn.crop(images, crop=(size, size), out_of_bounds_policy="pad", fill_values=0)
        # crop_pos is a fraction of the slack (size - 32): values k / (2 pad) land on whole pixels
        pos_y = fn.random.uniform(values=positions)
        pos_x = fn.random.uniform(values=positions)
        flip = fn.random.coin_flip(probability=0.5)
        out = fn.crop_mirror_normalize(padded, crop=(32, 32), crop_pos_y=pos_y, crop_pos_x=pos_x, mirror=flip,
                                       mean=mean255, std=std255, dtype=types.FLOAT, output_layout="CHW")
        if with_offsets:
            # k / (2 pad) * (2 pad) is exactly k in float32; DALI's cast rounds to nearest
            offset_y = fn.cast(pos_y * (2 * pad), dtype=types.INT32)
            offset_x = fn.cast(pos_x * (2 * pad), dtype=types.INT32)
            return out, labels, indices, offset_y, offset_x, flip
        return out, labels, indices

    return graph()


def same_graph(a, b) -> bool | None:
    """Whether two pipelines (built or not) have the same graph: the same operators, in the same
    order, with the same arguments and inputs, and the same pipeline settings (batch size,
    threads, prefetching, executor, seed, device). None where this DALI keeps its graph elsewhere.
    Lesson 04 (w9-04): a learner's pipeline that builds exactly the course's graph was judged
    "slower in every turn" by a throughput comparison; the same graph is the same work, so the
    lesson says so instead of ranking the two on this machine's noise."""
    try:
        return _graph_signature(a) == _graph_signature(b)
    except AttributeError:
        return None


def _graph_signature(pipe):
    if not getattr(pipe, "_py_graph_built", False):
        pipe._build_graph()
    rename = sorted(((op._name, f"op{k}") for k, op in enumerate(pipe._ops)), key=lambda kv: -len(kv[0]))
    ops = []
    for op in pipe._ops:
        text = "\n".join(sorted(line.strip() for line in str(op._spec).splitlines()    # keyword order aside
                                if not line.strip().startswith(("_origin_stack", "_module"))))
        for name, new in rename:           # operator names carry ids: the position in the graph instead
            text = text.replace(name, new)
        ops.append(text)
    settings = tuple(getattr(pipe, name, None) for name in ("max_batch_size", "num_threads", "device_id", "seed",
                                                            "prefetch_queue_depth", "exec_async", "exec_pipelined"))
    return settings, tuple(ops)


class DaliLoader:
    """DALI's PyTorch iterator as an iterable of `(images, labels)` batches, one epoch per pass
    (lesson 04; what `course_utils.train.train` and the ladder consume).

    `iterator` is the `DALIGenericIterator` (auto_reset, so each `for` loop is a new epoch);
    `len()` is the number of batches per epoch. Images come back on the pipeline's device (a
    CUDA tensor for a GPU pipeline), labels as int64.

    Every batch the iterator gives is yielded: a training loop under DistributedDataParallel must
    run the same number of steps on every rank, so a batch is never skipped. An empty batch (what
    DALI's PARTIAL policy gives a shard whose padded last batch holds no real sample) raises
    `RuntimeError`, unless `skip_empty=True`: for evaluation only, where the ranks' counts are
    summed and no collective runs per batch."""

    def __init__(self, iterator, batches_per_epoch: int | None, *, device: str, description: str = "",
                 prefetch_queue_depth: int = 2, skip_empty: bool = False):
        self.iterator = iterator
        self.batches_per_epoch = batches_per_epoch
        self.prefetch_queue_depth = prefetch_queue_depth     # batches DALI prepares ahead
        self.device = device
        self.description = description
        self.skip_empty = skip_empty

    def __len__(self) -> int:
        if self.batches_per_epoch is None:
            raise TypeError("this loader does not know its length")
        return self.batches_per_epoch

    def __iter__(self):
        for outputs in self.iterator:
            batch = outputs[0]
            if batch["labels"].shape[0] == 0:
                if self.skip_empty:
                    continue
                raise RuntimeError(f"{self}: an empty batch. DALI's PARTIAL policy gives one to a shard whose real "
                                   "samples end on a batch boundary while a longer shard still has a batch; skipping "
                                   "it would leave this rank one training step short of the others (a hang under "
                                   "DistributedDataParallel): train with LastBatchPolicy.FILL and pad_last_batch=True")
            yield batch["images"], batch["labels"].reshape(-1).long()

    def __repr__(self) -> str:
        return f"DaliLoader({self.description or self.device})"


def cifar_loader(records=None, batch_size: int = 256, *, device="cpu", train: bool = True, shuffle: bool = True,
                 augment: bool = True, seed: int = 0, shard_id: int = 0, num_shards: int = 1,
                 drop_last: bool | None = None, num_threads: int | None = None, limit: int | None = None,
                 prefetch_queue_depth: int = 2) -> DaliLoader:
    """CIFAR-10 through DALI as `(images, labels)` batches (lesson 04): `CifarRecordBatches` ->
    `cifar_train_pipeline` -> `DALIGenericIterator`. `records` defaults to the course's
    training (or test) split, memory-mapped; `shard_id`/`num_shards` give this process its
    share for DistributedDataParallel (lesson 07), with the same `seed` in every process (the
    order of the records follows it; each shard's augmentation draws from its own seed).
    `drop_last` defaults to True when sharded (every rank the same number of full batches, for
    training) and to False otherwise (the last batch short); pass `drop_last=False` to a sharded
    evaluation loader, whose ranks may then run one batch more or less (sum their results)."""
    require_dali()
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    if drop_last is None:
        drop_last = num_shards > 1
    if records is None:
        records = RecordStore.from_cifar(train=train, limit=limit)
    source = CifarRecordBatches(records, batch_size, shuffle=shuffle, seed=seed, shard_id=shard_id,
                                num_shards=num_shards, drop_last=drop_last)
    pipe = cifar_train_pipeline(source, batch_size=batch_size, device=device, num_threads=num_threads,
                                seed=seed + 7919 * shard_id, augment=augment,
                                prefetch_queue_depth=prefetch_queue_depth)
    # size=-1: the source ends the epoch (StopIteration); its last batch is already partial
    # (or dropped), so the iterator needs no size or last-batch padding of its own.
    iterator = DALIGenericIterator(pipe, ["images", "labels", "indices"], auto_reset=True)
    where, _ = dali_device(device)
    return DaliLoader(iterator, len(source), device=where,
                      description=f"DALI CIFAR-10 on {where}, batch {batch_size}, shard {shard_id}/{num_shards}",
                      prefetch_queue_depth=prefetch_queue_depth)


# -- JPEG folders --------------------------------------------------------------------------

def jpeg_train_pipeline(file_root, *, batch_size: int, crop: int = 224, device="cpu",
                        num_threads: int | None = None, seed: int = 0, shard_id: int = 0, num_shards: int = 1,
                        shuffle: bool = True, reader_name: str = "Reader", with_shapes: bool = False,
                        mean=IMAGENET_MEAN, std=IMAGENET_STD, prefetch_queue_depth: int = 2):
    """An ImageNet-style training pipeline (not yet built) over a folder of class subfolders
    (lesson 04).

    `fn.readers.file` (named `reader_name`, sharded, last batch padded) -> `fn.decoders.image`
    ("mixed": decoded on the GPU by nvJPEG when `device` is a GPU) -> `fn.random_resized_crop`
    to `crop` x `crop` -> `fn.crop_mirror_normalize` (random flip, ImageNet mean/std, CHW
    float). Outputs `images`, `labels` (class folder's index in sorted order) and, with
    `with_shapes`, the decoded image's shape (H, W, C).

    `shuffle` asks the reader for `shuffle_after_epoch=True`: a new permutation of every file
    each epoch, drawn from `shuffle_after_epoch_seed` (DALI 2.4; `seed` here, the same in every
    process; without it DALI uses a fixed seed, the same order in every run) and the epoch's
    number, so every shard cuts its slice of the same permutation (as `DistributedSampler` with
    `set_epoch`), and a shard's files change from epoch to epoch. (`random_shuffle=True` instead
    shuffles the file list once, with a fixed seed, then draws each sample at random from a buffer
    of `initial_fill` samples read in that order: with more files than the buffer, a local shuffle
    of the same order every epoch.) The augmentation draws from `seed + shard_id`: each rank its own
    crops and flips (the same seed on every rank would give sample j of every rank's batch the same
    window and flip). `pad_last_batch=True` keeps every epoch whole; with DALI's FILL policy it
    also gives every shard the same number of batches, which DistributedDataParallel needs
    (`jpeg_loader`).
    """
    require_dali()
    from nvidia.dali import fn, pipeline_def, types

    where, device_id = dali_device(device)

    order = dict(shuffle_after_epoch=True, shuffle_after_epoch_seed=int(seed)) if shuffle else {}

    @pipeline_def(batch_size=batch_size, num_threads=num_threads or dali_threads(), device_id=device_id,
                  seed=seed + shard_id, prefetch_queue_depth=prefetch_queue_depth)
    def graph():
        jpegs, labels = fn.readers.file(file_root=str(file_root), shard_id=shard_id, num_shards=num_shards,
                                        pad_last_batch=True, name=reader_name, **order)
        images = fn.decoders.image(jpegs, device="mixed" if where == "gpu" else "cpu", output_type=types.RGB)
        shapes = images.shape()
        images = fn.random_resized_crop(images, size=(crop, crop))
        images = fn.crop_mirror_normalize(images, mirror=fn.random.coin_flip(probability=0.5),
                                          mean=[255 * m for m in mean], std=[255 * s for s in std],
                                          dtype=types.FLOAT, output_layout="CHW")
        if with_shapes:
            return images, labels, shapes
        return images, labels

    return graph()


def jpeg_loader(file_root, batch_size: int = 64, *, crop: int = 224, device="cpu", num_threads: int | None = None,
                seed: int = 0, shard_id: int = 0, num_shards: int = 1, last_batch: str = "fill") -> DaliLoader:
    """The JPEG pipeline behind DALI's PyTorch iterator (lesson 04); the reader tells the iterator its shard
    size (`reader_name`). `last_batch="fill"` (training): DALI's FILL policy with the reader's
    `pad_last_batch=True`: every shard yields the same number of full batches, the last one filled with
    copies of the shard's last file, and every epoch stays whole (measured on DALI 2.4: DROP with
    `pad_last_batch=True` leaves the padding batch in the pipeline, and the next epoch starts with it).
    `last_batch="partial"` (evaluation): every file once, the last batch short; a shard whose files end
    on a batch boundary gets an empty batch from DALI, skipped here, so the ranks' counts may differ
    by one: sum their results, and run no collective per batch."""
    require_dali()
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    if last_batch not in ("fill", "partial"):
        raise ValueError(f"last_batch must be 'fill' (training) or 'partial' (evaluation); got {last_batch!r}")
    pipe = jpeg_train_pipeline(file_root, batch_size=batch_size, crop=crop, device=device, num_threads=num_threads,
                               seed=seed, shard_id=shard_id, num_shards=num_shards)
    policy = LastBatchPolicy.FILL if last_batch == "fill" else LastBatchPolicy.PARTIAL
    iterator = DALIGenericIterator(pipe, ["images", "labels"], reader_name="Reader", last_batch_policy=policy,
                                   auto_reset=True)
    where, _ = dali_device(device)
    return DaliLoader(iterator, len(iterator), device=where, skip_empty=last_batch == "partial",
                      description=f"DALI JPEG folder on {where}, batch {batch_size}, crop {crop}, "
                                  f"shard {shard_id}/{num_shards}, last batch {last_batch}")


def decode_pipeline(encoded, *, batch_size: int, device="cpu", num_threads: int | None = None,
                    prefetch_queue_depth: int = 2):
    """A pipeline that decodes the JPEG byte strings `encoded`, `batch_size` at a time, cycling
    through them forever ("mixed" decoding on a GPU). One output: the decoded HWC uint8 images
    (lesson 04's decoder comparison)."""
    require_dali()
    from nvidia.dali import fn, pipeline_def, types

    where, device_id = dali_device(device)
    arrays = [np.frombuffer(b, np.uint8) for b in encoded]
    if not arrays:
        raise ValueError("no encoded images given")

    def source(info):
        first = (int(info) * batch_size) % len(arrays)
        return [arrays[(first + k) % len(arrays)] for k in range(batch_size)]

    @pipeline_def(batch_size=batch_size, num_threads=num_threads or dali_threads(), device_id=device_id,
                  prefetch_queue_depth=prefetch_queue_depth, seed=0)
    def graph():
        jpegs = fn.external_source(source=source, batch=True, dtype=types.UINT8, ndim=1)
        return fn.decoders.image(jpegs, device="mixed" if where == "gpu" else "cpu", output_type=types.RGB)

    return graph()


# -- what the lesson's runs say -------------------------------------------------------------------

def feeding_verdict(fed: dict, turns: dict | None = None) -> list[str]:
    """Sentences for the runs against the model-only ceiling (lesson 04): `fed` maps a loader's
    name to `(fraction of the ceiling, fraction of the time the loop waited for data)`. Two
    different figures: the first says how well the device was fed, the second how much of the
    loop's time went to waiting (a loader can keep the loop waiting often and still feed the
    device most of the time, if the device's queue absorbs it).

    `turns` (optional) maps the same names to every turn's samples/s, the loaders run in turns:
    then the best against the worst is said turn by turn, as a range, and a verdict only where
    every turn gives it (w2-04: the best turns alone said "4.5x" in one run and "6.7x" in the
    next, each from one lucky turn)."""
    def note(fraction, stall):
        # w8-04: "144% of the ceiling, waiting for data 26%" read as a contradiction, unsaid
        if fraction > 1:
            return (" (above the ceiling: the ceiling is the model alone, measured in turns of its own at another "
                    "moment of this machine's load, so a share above 100% is that load's difference, not a feed)")
        if fraction > 1 - stall + 0.05:
            # w10-04: "waiting for data 29% of the time (more than the 71% ...)" read as 29 > 71: the clause
            # belongs to the share of the ceiling, and now follows it
            return (f" (a share above the {1 - stall:.0%} of the time the loop was not waiting for data: the "
                    "device's queue kept working while the loop waited, or the ceiling's own turns ran slower)")
        return ""
    lines = [f"{name}: {fraction:.0%} of the ceiling" + note(fraction, stall)
             + f", the loop waiting for data {stall:.0%} of the time" for name, (fraction, stall) in fed.items()]
    if len(fed) >= 2:
        ranked = sorted(fed, key=lambda k: fed[k][0], reverse=True)
        best, worst = ranked[0], ranked[-1]
        per_turn = []
        if turns and len(turns.get(best, [])) >= 2 and len(turns[best]) == len(turns.get(worst, [])):
            per_turn = [a / b for a, b in zip(turns[best], turns[worst]) if b > 0]
        if len(per_turn) >= 2:
            shown = ", ".join(f"{r:.1f}x" for r in per_turn)
            low, high = min(per_turn), max(per_turn)
            span = f"{low:.1f}x" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f}x"
            if low >= 1.1:
                lines.append(f"{best} fed the device {span} as well as {worst}, turn by turn ({shown}): "
                             "every turn says so; the factor moves with this machine's load")
            elif high < 1.1 and low > 1 / 1.1:
                lines.append(f"{best} and {worst} fed the device about as well in every turn ({shown})")
            elif low > 1:      # w8-04: "disagree" only where turns point opposite ways
                lines.append(f"{best} against {worst}, turn by turn: {shown}: better in every turn, but some by "
                             "less than 10%, so this run does not say by how much, nor that it is more than noise")
            else:
                lines.append(f"{best} against {worst}, turn by turn: {shown}: the turns disagree, so this run "
                             "does not say which fed the device better")
        elif fed[worst][0] > 0 and fed[best][0] / fed[worst][0] >= 1.1:
            lines.append(f"{best} fed the device {fed[best][0] / fed[worst][0]:.1f}x as well as {worst} in this run")
        else:
            lines.append(f"{best} and {worst} fed the device about as well in this run")
    return lines
