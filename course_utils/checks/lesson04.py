"""Checks for lesson 04 (GPU augmentation with DALI).

Every check builds the learner's DALI pipeline on fresh inputs: random CIFAR-style records
(noise images, so that a crop can only match one window) or a fresh folder of solid-colour
JPEGs of random sizes (so that a sample's colour and decoded size say which file it came from).
Where DALI cannot be imported, each check says so in one sentence.
"""
from __future__ import annotations

import math
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from .. import data
from ..crop_match import match_crops
from ..env import has_dali, usable_cores
from ._core import CheckFailed, WrongType, exercise, expect_callable
from ._util import forbids, fresh_rng

DALI_MISSING = ("NVIDIA DALI cannot be imported on this machine (install nvidia-dali-cuda120 at the version "
                "requirements.txt pins), so this exercise cannot be graded here.")


def _require_dali() -> None:
    if not has_dali():
        raise WrongType("DALI", DALI_MISSING)


def _threads() -> int:
    return max(1, min(2, usable_cores()))


def _devices() -> list[str]:
    return ["cpu"] + (["gpu"] if torch.cuda.is_available() else [])


def _expect_pipeline(pipe, what: str):
    from nvidia.dali import Pipeline
    if not isinstance(pipe, Pipeline):
        got = "None (did the function forget to return the pipeline?)" if pipe is None else type(pipe).__name__
        raise WrongType("type", f"{what} should return a DALI Pipeline (what calling a @pipeline_def "
                        f"function gives), but it returned {got}.")
    return pipe


def _num_outputs(pipe, needed: int, names: str) -> int:
    n = pipe.num_outputs   # builds the pipeline
    if n < needed:
        raise CheckFailed(f"has {needed} outputs", f"your pipeline has {n} output(s); expected {needed}: {names}",
                          "return them from the @pipeline_def function as a tuple, in that order")
    return n


def _random_records(rng, n: int) -> np.ndarray:
    records = rng.integers(0, 256, (n, data.RECORD_BYTES), dtype=np.uint8)
    records[:, 0] = rng.integers(0, 10, n)
    return records


def _sources(records, indices) -> np.ndarray:
    return np.ascontiguousarray(records[indices, 1:]).reshape(-1, 3, 32, 32)


def _to_numpy(tl) -> np.ndarray:
    """A DALI TensorList (CPU or GPU) as one NumPy array."""
    if type(tl).__name__ == "TensorListGPU":
        tl = tl.as_cpu()
    try:
        return np.array(tl.as_tensor())
    except Exception:   # samples of different shapes
        raise CheckFailed("every sample has the same shape", "the samples of one batch have different shapes",
                          "crop every image to the same size")


def _as_numpy(t) -> np.ndarray:
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


# -- 4.1 the CIFAR pipeline ------------------------------------------------------------------

class _BatchSource:
    """A batch-mode external source: `batches` batches of `batch_size` random records, then
    StopIteration. It remembers which records it gave for each iteration."""

    def __init__(self, records, batch_size, batches, rng):
        self.records, self.batch_size, self.batches = records, batch_size, batches
        self.order = rng.permutation(len(records))[:batch_size * batches]
        self.calls = 0

    def given(self, iteration):
        return self.order[iteration * self.batch_size:(iteration + 1) * self.batch_size]

    def __call__(self, info):
        self.calls += 1
        iteration = int(getattr(info, "iteration", info))
        if iteration >= self.batches:
            raise StopIteration
        idx = self.given(iteration)
        rows = self.records[idx]
        return (np.ascontiguousarray(rows[:, 1:]).reshape(-1, 3, 32, 32), rows[:, 0].astype(np.int64),
                idx.astype(np.int64))


def _diagnose_crops(out, src) -> str:
    """A hint for outputs that are not exact crops of the padded, normalised sources."""
    mean, std = data.CIFAR10_MEAN, data.CIFAR10_STD
    tries = [
        (dict(mean=(0, 0, 0), std=(1 / 255,) * 3), "the values are the raw 0..255 pixels: normalise with "
         "mean=[255*m for m in CIFAR10_MEAN], std=[255*s for s in CIFAR10_STD]"),
        (dict(mean=(0, 0, 0), std=(1, 1, 1)), "the values are scaled to 0..1 but not normalised: subtract the mean "
         "and divide by the std (both times 255, since the input is uint8)"),
        (dict(mean=data.CIFAR10_MEAN, std=data.CIFAR10_STD, fill=tuple(255 * m for m in mean)),
         "the padding is not black: pad the uint8 image with 0 *before* normalising (as torchvision's "
         "RandomCrop(32, padding=4) does), e.g. fn.crop(..., crop=(40, 40), out_of_bounds_policy='pad', fill_values=0)"),
        (dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)), "that is ImageNet's mean and std: use "
         "course_utils.data.CIFAR10_MEAN and CIFAR10_STD"),
    ]
    for kwargs, hint in tries:
        m = dict(mean=mean, std=std)
        m.update(kwargs)
        fill = m.pop("fill", 0.0)
        if match_crops(out, src, m["mean"], m["std"], fill=fill, atol=2e-2).exact_fraction > 0.9:
            return hint
    plain = match_crops(out, src, mean, std, atol=1e-3).exact
    upside_down = match_crops(np.ascontiguousarray(out[:, :, ::-1, :]), src, mean, std, atol=1e-3).exact
    if np.mean(plain | upside_down) > 0.9:
        return "the flip is vertical: mirror flips horizontally (crop_mirror_normalize's mirror argument)"
    return ("each sample must be a 32x32 window of its record padded with 4 black pixels on every side, "
            "flipped horizontally or not, normalised as (x/255 - mean) / std with CIFAR10_MEAN and CIFAR10_STD")


def _run_cifar(cifar_pipeline, records, batch_size, batches, device, rng):
    source = _BatchSource(records, batch_size, batches, rng)
    pipe = _expect_pipeline(cifar_pipeline(source, batch_size, device=device, num_threads=_threads(),
                                           seed=int(rng.integers(1, 2**31 - 1))), "cifar_pipeline(...)")
    _num_outputs(pipe, 3, "images, labels, indices")
    outs = []
    for k in range(batches):
        o = pipe.run()
        images = o[0]
        kind = type(images).__name__
        want = "TensorListGPU" if device == "gpu" else "TensorListCPU"
        if kind != want:
            raise CheckFailed("runs where it is asked to", f"device={device!r}: the images come out as {kind}, expected {want}",
                              "with device='gpu' move the images to the GPU (images.gpu()) before cropping, and "
                              "pass device_id=0 to the pipeline; with 'cpu' use device_id=None")
        layout = images.layout()
        x = _to_numpy(images)
        labels = _to_numpy(o[1]).reshape(-1)
        indices = _to_numpy(o[2]).reshape(-1)
        outs.append((x, labels, indices, layout, source.given(k)))
    return outs


def _check_seed(cifar_pipeline, records, batch_size, rng, seed):
    """The same seed draws the same augmentation; another seed, another."""
    def first_batch(pipe_seed):
        source = _BatchSource(records, batch_size, 1, np.random.default_rng(0))     # the same records each time
        pipe = _expect_pipeline(cifar_pipeline(source, batch_size, device="cpu", num_threads=_threads(),
                                               seed=pipe_seed), "cifar_pipeline(...)")
        return _to_numpy(pipe.run()[0])

    s = int(rng.integers(1, 2**31 - 2))
    a, b, c = first_batch(s), first_batch(s), first_batch(s + 1)
    if not np.array_equal(a, b):
        raise CheckFailed("reproducible under a seed", f"two pipelines built with seed={s} augmented the same records "
                          f"differently (seed {seed})", "pass `seed` on to @pipeline_def(..., seed=seed)")
    if np.array_equal(a, c):
        raise CheckFailed("follows the seed", f"seeds {s} and {s + 1} gave the same crops and flips (seed {seed})",
                          "pass `seed` on to @pipeline_def(..., seed=seed) instead of a number of your own")


@exercise("4.1", "The CIFAR pipeline: pad, random crop, flip and normalise in DALI", points=2)
@forbids("course_utils.dali_pipelines:cifar_train_pipeline")
def check_cifar_pipeline(cifar_pipeline):
    _require_dali()
    expect_callable(cifar_pipeline, "a function cifar_pipeline(source, batch_size, device='cpu', num_threads=2, "
                    "seed=0) that returns a DALI Pipeline")
    rng, seed = fresh_rng()
    batch_size = int(rng.integers(40, 90))
    batches = math.ceil(1100 / batch_size)
    records = _random_records(rng, batch_size * batches + int(rng.integers(0, 50)))
    for device in _devices():
        outs = _run_cifar(cifar_pipeline, records, batch_size, batches, device, rng)
        on = f"on the {device.upper()}" if device == "gpu" else "on the CPU"
        x, labels, indices, layout, given = outs[0]
        if x.shape != (batch_size, 3, 32, 32):
            hint = ("that is HWC: ask crop_mirror_normalize for output_layout='CHW'" if x.shape == (batch_size, 32, 32, 3)
                    else "crop to 32x32 after padding, and keep the batch dimension")
            raise CheckFailed("images are (B, 3, 32, 32)", f"{on}, batch of {batch_size}: yours {x.shape}", hint)
        if x.dtype != np.float32:
            raise CheckFailed("images are float32", f"{on}: yours {x.dtype}", "crop_mirror_normalize(..., dtype=types.FLOAT)")
        if layout != "CHW":
            raise CheckFailed("the layout is CHW", f"{on}: the images' layout is {layout!r}", "output_layout='CHW'")
        for k, (x, labels, indices, layout, given) in enumerate(outs):
            if len(indices) != len(given) or not np.array_equal(indices, given):
                raise CheckFailed("indices pass through unchanged", f"{on}, batch {k}: the third output is not the "
                                  f"indices the source gave (seed {seed})", "return the source's third output as it is")
            if len(labels) != len(given) or not np.array_equal(labels, records[given, 0]):
                raise CheckFailed("labels pass through unchanged", f"{on}, batch {k}: the labels are not the records' "
                                  f"labels (seed {seed})", "return the source's second output as it is")
        x_all = np.concatenate([o[0] for o in outs])
        idx_all = np.concatenate([o[4] for o in outs])
        src = _sources(records, idx_all)
        probe = match_crops(x_all[:64], src[:64], data.CIFAR10_MEAN, data.CIFAR10_STD)
        if not probe.exact.all():
            raise CheckFailed("each sample is an exact crop of its padded record, normalised",
                              f"{on}: {int((~probe.exact).sum())} of 64 samples match no 32x32 window (flipped or not) "
                              f"of their record padded by 4 (seed {seed})", _diagnose_crops(x_all[:64], src[:64]))
        found = match_crops(x_all, src, data.CIFAR10_MEAN, data.CIFAR10_STD)
        if not found.exact.all():
            raise CheckFailed("each sample is an exact crop of its padded record, normalised",
                              f"{on}: {int((~found.exact).sum())} of {len(found.exact)} samples match no window (seed {seed})",
                              _diagnose_crops(x_all[~found.exact][:64], src[~found.exact][:64]))
        _check_randomness(found, outs, on, seed)
    _check_seed(cifar_pipeline, records, batch_size, rng, seed)
    where = " and on the GPU" if len(_devices()) > 1 else ""
    return (f"{len(x_all)} samples on the CPU{where}: CHW float32, each an exact crop (offsets 0..8 uniform, "
            f"{found.flipped.mean():.0%} flipped) of its padded record, normalised; labels and indices intact; "
            "the seed reproduces it.")


def _check_randomness(found, outs, on, seed):
    n = len(found.dy)
    for axis, values in (("vertical", found.dy), ("horizontal", found.dx)):
        counts = np.bincount(values, minlength=9)
        if counts[4] == n:
            raise CheckFailed("crop offsets cover 0..8", f"{on}: every sample is the unpadded image (offset 4 of "
                              f"the padded one) (seed {seed})", "pad 4 black pixels on every side, then crop 32x32 "
                              "at a random position")
        if (counts == 0).any():
            missing = [int(v) for v in np.nonzero(counts == 0)[0]]
            raise CheckFailed("crop offsets cover 0..8", f"{on}: over {n} samples the {axis} offset never took "
                              f"the values {missing} (seed {seed})",
                              "draw the crop position per sample, uniformly over the 9 possible offsets")
    ends = float(np.mean(np.isin(np.concatenate([found.dy, found.dx]), [0, 8])))
    if not 0.165 <= ends <= 0.285:
        raise CheckFailed("crop offsets are uniform over 0..8", f"{on}: offsets 0 and 8 make up {ends:.1%} of "
                          f"{2 * n} draws; uniform over nine values gives 22.2% (seed {seed})",
                          "a continuous crop_pos in [0, 1] rounds to 0 and 8 half as often as to the other offsets: "
                          "draw from the nine values k/8 (fn.random.uniform(values=[k / 8 for k in range(9)]))")
    rate = float(found.flipped.mean())
    if not 0.4 <= rate <= 0.6:
        raise CheckFailed("flips half of the samples", f"{on}: {rate:.1%} of {n} samples are flipped (seed {seed})",
                          "mirror=fn.random.coin_flip(probability=0.5)")
    start = 0
    for k, o in enumerate(outs):
        b = len(o[0])
        sl = slice(start, start + b)
        combos = set(zip(found.dy[sl].tolist(), found.dx[sl].tolist(), found.flipped[sl].tolist()))
        if len(combos) == 1:
            raise CheckFailed("each sample draws its own crop and flip", f"{on}: every sample of batch {k} has "
                              "the same crop and flip", "random operators in a DALI pipeline draw one value per sample")
        start += b


# -- 4.2 exact epochs --------------------------------------------------------------------------

def _one_epoch(iterator, limit_batches, what):
    batches = []
    for out in iterator:
        if not isinstance(out, (list, tuple)) or not out or not isinstance(out[0], dict):
            raise CheckFailed("yields DALI's batches", f"{what}: each item should be DALIGenericIterator's list of one "
                              f"dict per pipeline; got {type(out).__name__}")
        batch = out[0]
        missing = [k for k in ("images", "labels", "indices") if k not in batch]
        if missing:
            raise CheckFailed("names the outputs images, labels, indices",
                              f"{what}: the batch has keys {sorted(batch)}; missing {missing}",
                              'DALIGenericIterator(pipe, ["images", "labels", "indices"], ...)')
        batches.append({k: _as_numpy(batch[k]) for k in ("images", "labels", "indices")})
        if len(batches) > limit_batches:
            raise CheckFailed("an epoch ends", f"{what}: more than {limit_batches} batches without the epoch ending",
                              "the source must raise StopIteration once the epoch's records are used up")
    return batches


def _epoch_summary(batches):
    sizes = [len(b["indices"].reshape(-1)) for b in batches]
    indices = np.concatenate([b["indices"].reshape(-1) for b in batches]) if batches else np.zeros(0, np.int64)
    return sizes, indices.astype(np.int64)


def _expect_exact_epoch(batches, records, members, batch_size, drop_last, what, seed):
    """The epoch visits each of `members` once (or, with drop_last, len//B*B distinct of them)."""
    sizes, idx = _epoch_summary(batches)
    n = len(members)
    if not batches:
        raise CheckFailed("yields every epoch", f"{what}: no batches at all",
                          "the source must start again each epoch: compute the batch from BatchInfo "
                          "(iteration, epoch_idx) rather than from a counter of your own, and create the "
                          "iterator with auto_reset=True")
    full, rest = divmod(n, batch_size)
    if drop_last:
        expected_sizes = [batch_size] * full
    else:
        expected_sizes = [batch_size] * full + ([rest] if rest else [])
    counts = Counter(idx.tolist())
    dupes = [k for k, c in counts.items() if c > 1]
    if dupes:
        raise CheckFailed("each record at most once per epoch", f"{what}: {len(dupes)} records came more than once "
                          f"(seed {seed})", "draw one permutation per epoch and cut it into batches")
    stray = set(counts) - set(members.tolist())
    if stray:
        raise CheckFailed("only this shard's records", f"{what}: {len(stray)} records that belong to no part of this "
                          f"shard (seed {seed})", "shard k of S gets positions floor(k*N/S) .. floor((k+1)*N/S) of the epoch's order")
    if not drop_last and len(idx) < n:
        hint = "the epoch must end with a partial batch of the remaining records"
        if len(idx) == full * batch_size and rest:
            hint = ("exactly the last partial batch is missing: a per-sample source (batch=False) drops it; return "
                    "whole batches from a batch=True source, the last one shorter, then raise StopIteration")
        raise CheckFailed("each record once per epoch", f"{what}: {n - len(idx)} of {n} records never came "
                          f"(batches of {batch_size}; seed {seed})", hint)
    if sizes != expected_sizes:
        raise CheckFailed("batch sizes follow the last-batch policy",
                          f"{what}: {n} records in batches of {batch_size} gave sizes {_sizes(sizes)}, expected "
                          f"{_sizes(expected_sizes)} (seed {seed})",
                          "full batches, then the remainder as one shorter batch" if not drop_last
                          else "with drop_last=True the partial last batch is left out")
    for b in batches:
        labels = b["labels"].reshape(-1)
        if len(labels) != len(b["indices"].reshape(-1)) or not np.array_equal(labels, records[b["indices"].reshape(-1), 0]):
            raise CheckFailed("labels match the records", f"{what}: a batch's labels are not its records' labels (seed {seed})")
        if tuple(b["images"].shape[1:]) != (3, 32, 32):
            raise CheckFailed("images are (b, 3, 32, 32)", f"{what}: yours {tuple(b['images'].shape)}")
    return idx


def _sizes(sizes):
    if len(sizes) <= 4:
        return str(sizes)
    return f"[{sizes[0]}, {sizes[1]}, ..., {sizes[-2]}, {sizes[-1]}] ({len(sizes)} batches)"


@exercise("4.2", "Exact epochs through DALI's PyTorch iterator", points=2)
@forbids("course_utils.dali_pipelines:CifarRecordBatches.__call__", "course_utils.dali_pipelines:CifarRecordBatches.epoch_order",
         "course_utils.dali_pipelines:shard_range", "course_utils.dali_pipelines:cifar_loader")
def check_epochs(cifar_epochs):
    _require_dali()
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    expect_callable(cifar_epochs, "a function cifar_epochs(records, batch_size, *, shuffle=True, seed=0, shard_id=0, "
                    "num_shards=1, drop_last=False, device='cpu', num_threads=2) that returns a DALIGenericIterator")
    rng, seed = fresh_rng()
    batch_size = int(rng.integers(32, 80))
    n = batch_size * int(rng.integers(5, 9)) + int(rng.integers(1, batch_size))
    while n % 3 == 0 or n % batch_size == 0:   # uneven shards and a partial last batch: exact tests both
        n += 1
    with tempfile.TemporaryDirectory(prefix="check-4.2-") as tmp:
        path = Path(tmp) / "records.bin"
        _random_records(rng, n).tofile(path)
        records = data.read_records(path)      # memory-mapped, as the lesson's records are
        everyone = np.arange(n)
        pipe_seed = int(rng.integers(0, 2**31 - 1))

        def make(**kw):
            it = cifar_epochs(records, batch_size, seed=pipe_seed, num_threads=_threads(), **kw)
            if not isinstance(it, DALIGenericIterator):
                raise WrongType("type", "cifar_epochs(...) should return DALI's PyTorch iterator "
                                "(nvidia.dali.plugin.pytorch.DALIGenericIterator), but it returned "
                                f"{'None' if it is None else type(it).__name__}.")
            return it

        limit = 3 * (n // batch_size + 2)
        it = make()
        first = _one_epoch(it, limit, "epoch 1")
        idx1 = _expect_exact_epoch(first, records, everyone, batch_size, False, "epoch 1", seed)
        second = _one_epoch(it, limit, "epoch 2 (a second for loop over the same iterator)")
        idx2 = _expect_exact_epoch(second, records, everyone, batch_size, False, "epoch 2", seed)
        if np.array_equal(idx1, idx2):
            raise CheckFailed("shuffles every epoch", "epochs 1 and 2 visited the records in the same order",
                              "draw the permutation from (seed, epoch): BatchInfo.epoch_idx tells the source the epoch")
        for e, idx in enumerate((idx1, idx2)):
            order = np.random.default_rng((pipe_seed, e)).permutation(n)
            if not np.array_equal(idx, order):
                raise CheckFailed("visits the epoch's order", f"epoch {e + 1} did not visit the records in the order "
                                  f"np.random.default_rng((seed, {e})).permutation(N) gives (seed {seed})",
                                  "the order of epoch e is np.random.default_rng((seed, e)).permutation(N), with the "
                                  "seed you are given and BatchInfo.epoch_idx")
        in_order = _one_epoch(make(shuffle=False), limit, "shuffle=False")
        _, idx = _epoch_summary(in_order)
        if not np.array_equal(idx, np.arange(n)):
            raise CheckFailed("shuffle=False keeps the records' order", f"with shuffle=False the epoch did not visit "
                              f"0, 1, 2, ... (seed {seed})", "without shuffle the order is np.arange(N)")
        # the images travel with their indices (the training augmentation of exercise 4.1)
        x = np.concatenate([b["images"] for b in first[:2]])
        idx = np.concatenate([b["indices"].reshape(-1) for b in first[:2]])
        found = match_crops(x, _sources(records, idx), data.CIFAR10_MEAN, data.CIFAR10_STD)
        if not found.exact.all():
            raise CheckFailed("images belong to their indices", f"{int((~found.exact).sum())} of {len(idx)} images are "
                              f"not an augmented crop of the record their index names (seed {seed})",
                              "images, labels and indices come out of one source call: keep them together, and "
                              "augment as in exercise 4.1")
        # drop_last
        it = make(drop_last=True)
        for e in (1, 2):
            _expect_exact_epoch(_one_epoch(it, limit, f"drop_last epoch {e}"), records, everyone, batch_size, True,
                                f"drop_last=True, epoch {e}", seed)
        # shards: disjoint, together the whole dataset, in both epochs
        shards = 3
        iterators = [make(shard_id=s, num_shards=shards) for s in range(shards)]
        for e in (1, 2):
            seen = []
            for s, it in enumerate(iterators):
                batches = _one_epoch(it, limit, f"shard {s} of {shards}, epoch {e}")
                _, idx = _epoch_summary(batches)
                lo, hi = s * n // shards, (s + 1) * n // shards
                if len(idx) != hi - lo:
                    raise CheckFailed("shards split the records evenly", f"shard {s} of {shards}, epoch {e}: "
                                      f"{len(idx)} records, expected {hi - lo} of {n} (seed {seed})",
                                      "shard k of S gets positions floor(k*N/S) .. floor((k+1)*N/S) of the epoch's order")
                _expect_exact_epoch(batches, records, np.unique(idx), batch_size, False,
                                    f"shard {s} of {shards}, epoch {e}", seed)
                seen.append(idx)
            allidx = np.concatenate(seen)
            if len(np.unique(allidx)) != n:
                overlap = len(allidx) - len(np.unique(allidx))
                raise CheckFailed("shards are disjoint and cover every record", f"epoch {e}: the {shards} shards "
                                  f"share {overlap} records and miss {n - len(np.unique(allidx))} (seed {seed})",
                                  "every shard must cut the same epoch order (same seed), each its own slice")
        gpu = ""
        if torch.cuda.is_available():
            it = make(device="gpu")
            batches = []
            for out in it:
                if not out[0]["images"].is_cuda:
                    raise CheckFailed("device='gpu' gives CUDA tensors", "the images of the GPU pipeline are on the CPU",
                                      "move the images to the GPU (.gpu()) inside the pipeline, device_id=0")
                batches.append({k: _as_numpy(out[0][k]) for k in ("images", "labels", "indices")})
            _expect_exact_epoch(batches, records, everyone, batch_size, False, "device='gpu', epoch 1", seed)
            gpu = " and on the GPU"
    return (f"{n} records in batches of {batch_size}: each once per epoch for two epochs, last batch "
            f"{n % batch_size} (or dropped), reshuffled, 3 disjoint shards covering all{gpu}.")


# -- 4.3 the JPEG pipeline -------------------------------------------------------------------

_CLASS_WORDS = ["dog", "Cat", "ant", "Zebra", "bird", "apple", "b10", "b9", "Moth", "eel", "fox", "Yak"]


def _jpeg_folder(rng, root: Path):
    """JPEGs of distinct sizes in 4-5 class folders; returns ({(label, h, w): rgb}, label_of,
    {(label, h, w): file number in its folder}). Green and blue are one colour per file (they
    say which file a crop came from); red rises from left to right (it says whether a crop was
    mirrored)."""
    from PIL import Image

    names = list(rng.choice(_CLASS_WORDS, int(rng.integers(4, 6)), replace=False))
    label_of = {name: i for i, name in enumerate(sorted(names))}    # DALI's rule: sorted folder names
    truth, used, number = {}, set(), {}
    for name in names:      # written in a shuffled, unsorted order
        (root / name).mkdir()
        for j in range(int(rng.integers(4, 8))):
            while True:
                h, w = int(rng.integers(40, 160)), int(rng.integers(40, 160))
                if (h, w) not in used:
                    used.add((h, w))
                    break
            rgb = rng.integers(20, 236, 3)
            pixels = np.empty((h, w, 3), np.uint8)
            pixels[:] = rgb
            pixels[:, :, 0] = np.linspace(30, 225, w).round().astype(np.uint8)[None, :]
            Image.fromarray(pixels).save(root / name / f"{j:03d}.jpg", quality=95)
            truth[(label_of[name], h, w)] = rgb
            number[(label_of[name], h, w)] = j
    return truth, label_of, number


def _mirrored(image) -> bool:
    """Whether a crop of a file whose red rises from left to right came out mirrored."""
    red = image[0].mean(axis=0)
    third = max(len(red) // 3, 1)
    return float(red[:third].mean()) > float(red[-third:].mean())


def _jpeg_epoch(jpeg_pipeline, root, batch_size, crop, device, shard_id, num_shards, rng, what):
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    pipe = _expect_pipeline(jpeg_pipeline(str(root), batch_size, crop=crop, device=device, shard_id=shard_id,
                                          num_shards=num_shards, num_threads=_threads(),
                                          seed=int(rng.integers(1, 2**31 - 1))), "jpeg_pipeline(...)")
    _num_outputs(pipe, 3, "images, labels, shapes")
    try:
        it = DALIGenericIterator(pipe, ["images", "labels", "shapes"], reader_name="Reader",
                                 last_batch_policy=LastBatchPolicy.PARTIAL)
    except RuntimeError as exc:
        if "Reader" in str(exc):
            raise CheckFailed("the reader is named 'Reader'", f"{what}: DALI's iterator found no operator named 'Reader'",
                              "fn.readers.file(..., name='Reader'): the iterator asks it for the epoch size")
        raise
    samples = []
    for out in it:
        b = out[0]
        images = _as_numpy(b["images"])
        if device == "gpu" and not b["images"].is_cuda:
            raise CheckFailed("device='gpu' decodes on the GPU", f"{what}: the images come back on the CPU",
                              "decode with fn.decoders.image(..., device='mixed')")
        labels = _as_numpy(b["labels"]).reshape(-1)
        if len(labels) == 0:
            # DALI pads every shard to the same number of batches; with PARTIAL, a shard whose
            # real samples end on a batch boundary gets one empty batch: not the learner's doing
            continue
        shapes = _as_numpy(b["shapes"]).reshape(len(labels), -1)
        if images.ndim != 4 or images.shape[1:] != (3, crop, crop):
            hint = ("that is HWC: output_layout='CHW'" if images.shape[1:] == (crop, crop, 3)
                    else f"random_resized_crop(..., size=(crop, crop)) with crop={crop}")
            raise CheckFailed("images are (B, 3, crop, crop)", f"{what}: crop={crop}, yours {tuple(images.shape)}", hint)
        if images.dtype != np.float32:
            raise CheckFailed("images are float32", f"{what}: yours {images.dtype}", "dtype=types.FLOAT")
        if shapes.shape[1] < 2:
            raise CheckFailed("the third output is the decoded shape", f"{what}: yours has {shapes.shape[1]} value(s) per sample",
                              "the decoded image's shape (H, W, C): images.shape() right after the decoder")
        for i in range(len(labels)):
            samples.append((int(labels[i]), int(shapes[i, 0]), int(shapes[i, 1]), images[i]))
    return samples


@exercise("4.3", "The JPEG pipeline: file reader, decoder, random resized crop, normalise", points=2)
@forbids("course_utils.dali_pipelines:jpeg_train_pipeline", "course_utils.dali_pipelines:jpeg_loader")
def check_jpeg_pipeline(jpeg_pipeline):
    _require_dali()
    expect_callable(jpeg_pipeline, "a function jpeg_pipeline(file_root, batch_size, *, crop=224, device='cpu', "
                    "shard_id=0, num_shards=1, num_threads=2, seed=0) that returns a DALI Pipeline")
    rng, seed = fresh_rng()
    mean = np.array([0.485, 0.456, 0.406], np.float32) * 255
    std = np.array([0.229, 0.224, 0.225], np.float32) * 255
    lo, hi = (0 - mean) / std, (255 - mean) / std
    with tempfile.TemporaryDirectory(prefix="check-4.3-") as tmp:
        root = Path(tmp)
        truth, label_of, number = _jpeg_folder(rng, root)
        keys = sorted(truth)
        batch_size = int(rng.integers(5, 9))
        crop = int(rng.choice([40, 48, 64]))
        summary, flips = [], []
        for device in _devices():
            on = "on the GPU (mixed decoder)" if device == "gpu" else "on the CPU"
            samples = _jpeg_epoch(jpeg_pipeline, root, batch_size, crop, device, 0, 1, rng, on)
            got = sorted((l, h, w) for l, h, w, _ in samples)
            if got != keys:
                _explain_mismatch(got, keys, label_of, on, seed)
            files = [(l, number[(l, h, w)]) for l, h, w, _ in samples]
            if files == sorted(files):
                raise CheckFailed("shuffles the files", f"{on}: the epoch read the {len(files)} files in folder order "
                                  f"(seed {seed})", "fn.readers.file(..., random_shuffle=True)")
            for label, h, w, image in samples:
                if image.min() < lo.min() - 0.05 or image.max() > hi.max() + 0.05:
                    raise CheckFailed("values are normalised", f"{on}: values from {image.min():.2f} to {image.max():.2f}; "
                                      f"normalised uint8 pixels lie in [{lo.min():.2f}, {hi.max():.2f}]",
                                      "crop_mirror_normalize with mean and std in 0..255 units: "
                                      "[255*m for m in IMAGENET_MEAN], [255*s for s in IMAGENET_STD]")
                expected = (truth[(label, h, w)] - mean) / std
                yours = image.reshape(3, -1).mean(axis=1)
                if np.abs(yours[1:] - expected[1:]).max() > 0.15:       # green and blue: one colour per file
                    hint = "normalise as (x - 255*mean) / (255*std) per channel, RGB order"
                    pixels = yours * std + mean       # back to 0..255, as if normalised right
                    if abs(pixels[0] - truth[(label, h, w)][2]) <= 8 and abs(pixels[1] - truth[(label, h, w)][1]) <= 8:
                        hint = "the channels are in BGR order: decode with output_type=types.RGB"
                    raise CheckFailed("each image is its file's colour, normalised",
                                      f"{on}: an image of green {int(truth[(label, h, w)][1])} and blue "
                                      f"{int(truth[(label, h, w)][2])} came out with green and blue means "
                                      f"{np.round(yours[1:], 2).tolist()}, expected {np.round(expected[1:], 2).tolist()} "
                                      f"(seed {seed})", hint)
                flips.append(_mirrored(image))
            summary.append(device)
        # shards: together one epoch of the folder, no file twice
        shards = [_jpeg_epoch(jpeg_pipeline, root, batch_size, crop, "cpu", s, 2, rng, f"shard {s} of 2")
                  for s in range(2)]
        flips += [_mirrored(image) for part in shards for _, _, _, image in part]
        parts = [sorted((l, h, w) for l, h, w, _ in part) for part in shards]
        if sorted(parts[0] + parts[1]) != keys or set(parts[0]) & set(parts[1]):
            raise CheckFailed("shard_id and num_shards split the files", f"shards 0 and 1 of 2 read {len(parts[0])} and "
                              f"{len(parts[1])} files of {len(keys)}, sharing {len(set(parts[0]) & set(parts[1]))} (seed {seed})",
                              "pass shard_id and num_shards to fn.readers.file")
        share = float(np.mean(flips))
        if not 0.1 <= share <= 0.9:        # about half of 30 and more samples: outside this, not a coin
            raise CheckFailed("mirrors about half of the images", f"{share:.0%} of {len(flips)} crops came out "
                              f"mirrored (seed {seed})",
                              "crop_mirror_normalize(..., mirror=fn.random.coin_flip(probability=0.5))")
    where = " and on the GPU" if "gpu" in summary else ""
    return (f"{len(keys)} JPEGs in {len(label_of)} class folders, one epoch on the CPU{where}: decoded sizes, "
            f"labels (sorted folders), {crop}x{crop} crops, normalised values, {share:.0%} mirrored, shuffled; two "
            "shards split the files.")


def _explain_mismatch(got, keys, label_of, on, seed):
    if len(got) != len(keys):
        raise CheckFailed("one epoch reads every file once", f"{on}: {len(got)} samples for {len(keys)} files (seed {seed})",
                          "read with fn.readers.file(file_root=..., name='Reader'); the iterator stops after one epoch")
    if sorted((h, w) for _, h, w in got) != sorted((h, w) for _, h, w in keys):
        raise CheckFailed("the third output is the decoded size", f"{on}: the (height, width) values are not the files' "
                          f"sizes (seed {seed})", "images.shape() right after fn.decoders.image, before any crop; "
                          "DALI shapes are (H, W, C)")
    raise CheckFailed("labels are the class folders' indices", f"{on}: the labels do not match the folders "
                      f"{sorted(label_of)} numbered 0.. in sorted order (seed {seed})",
                      "use the labels fn.readers.file returns with the files")
