"""Storing images: many small files or one packed file, encoded or raw (lesson 04).

The same images written in six ways, then read back and timed:

| format                  | what is stored                     | one image is                        |
|-------------------------|------------------------------------|-------------------------------------|
| `jpeg-files`            | one JPEG file per image (ImageNet) | open + read + close of its file     |
| `packed-jpeg`           | the JPEG bytes back to back in one file, with an index of offsets (what RecordIO, TFRecord and WebDataset's tar shards do) | one slice of one file |
| `lmdb-jpeg`             | the JPEG bytes in an LMDB database, one key per image | one B-tree look-up in a memory map |
| `hdf5-jpeg`             | the JPEG bytes in an HDF5 variable-length dataset | one element of the dataset |
| `raw-memmap`            | decoded uint8 pixels, N x H x W x 3, in one .npy file, memory-mapped | one slice, nothing to decode |
| `hdf5-raw`              | decoded uint8 pixels in HDF5, one chunk per image | one chunk, nothing to decode |

`measure_formats()` reports, for each: the size on disk, reading every image in order from the
disk (cold: dropped from the page cache first, see course_utils.io_probe) and from the page
cache (warm), the cost of one image at a random position (cold and warm), and, for the
encoded ones, the cost of decoding an image. From those, `images_per_s_model()` says how many
ready-to-use images per second each format gives for a disk of a given bandwidth: where
reading is the cost (a slow disk) and where decoding is (a fast one).

h5py and lmdb are optional: without them their formats are left out, with a sentence.
"""
from __future__ import annotations

import io
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .io_probe import evict, storage_read_bytes

__all__ = ["FORMATS", "StoredImages", "images_for_storage", "write_formats", "FormatResult", "measure_format",
           "measure_formats", "decode_jpeg", "images_per_s_model", "size_on_disk", "read_verdicts",
           "jpeg_error_structure"]

FORMATS = ("jpeg-files", "packed-jpeg", "lmdb-jpeg", "hdf5-jpeg", "raw-memmap", "hdf5-raw")
_DESCRIPTIONS = {
    "jpeg-files": "JPEG files, one per image",
    "packed-jpeg": "packed JPEGs: one file + offsets",
    "lmdb-jpeg": "LMDB, JPEG bytes per key",
    "hdf5-jpeg": "HDF5, JPEG bytes (variable length)",
    "raw-memmap": "raw uint8, np.memmap (.npy)",
    "hdf5-raw": "HDF5, raw uint8, chunk per image",
}


def size_on_disk(paths) -> int:
    """Bytes the files really occupy (allocated blocks, as `du` counts them, not their lengths)."""
    total = 0
    for p in paths:
        st = Path(p).stat()
        total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
    return total


def decode_jpeg(encoded: bytes) -> np.ndarray:
    """Decode JPEG bytes to RGB uint8 HWC with simplejpeg (libjpeg-turbo), the fastest CPU decoder
    of lesson 04's comparison."""
    import simplejpeg

    return simplejpeg.decode_jpeg(encoded, colorspace="RGB")


def images_for_storage(files, size: int = 224) -> np.ndarray:
    """Decode image files, resize the shorter side to `size` and crop the centre `size` x `size`
    (the usual evaluation transform), so that every format can hold the same images: (N, size,
    size, 3) uint8."""
    from PIL import Image

    out = np.empty((len(files), size, size, 3), np.uint8)
    for k, f in enumerate(files):
        with Image.open(f) as im:
            im = im.convert("RGB")
            w, h = im.size
            scale = size / min(w, h)
            im = im.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BILINEAR)
            left, top = (im.size[0] - size) // 2, (im.size[1] - size) // 2
            out[k] = np.asarray(im.crop((left, top, left + size, top + size)))
    return out


@dataclass
class StoredImages:
    """One format on disk: its files, whether images must be decoded, and how to read one."""
    name: str
    root: Path
    files: list[Path]
    encoded: bool
    count: int
    opener: object = field(repr=False, default=None)     # () -> reader with .get(i) and .close()

    @property
    def description(self) -> str:
        return _DESCRIPTIONS.get(self.name, self.name)

    def size_on_disk(self) -> int:
        return size_on_disk(self.files)

    def open(self):
        return self.opener()


# -- readers ------------------------------------------------------------------------------------

class _FileReader:
    def __init__(self, files):
        self.files = files

    def get(self, i):
        with open(self.files[i], "rb") as f:
            return f.read()

    def close(self):
        pass


class _PackedReader:
    def __init__(self, data_path, index_path):
        self.offsets = np.load(index_path)
        self.f = open(data_path, "rb", buffering=0)

    def get(self, i):
        start, stop = int(self.offsets[i]), int(self.offsets[i + 1])
        self.f.seek(start)
        return self.f.read(stop - start)

    def close(self):
        self.f.close()


class _LmdbReader:
    def __init__(self, path):
        import lmdb

        self.env = lmdb.open(str(path), readonly=True, lock=False, readahead=False, subdir=True)
        self.txn = self.env.begin(buffers=False)

    def get(self, i):
        return self.txn.get(b"%08d" % i)

    def close(self):
        self.txn.abort()
        self.env.close()


class _H5Reader:
    def __init__(self, path, raw):
        import h5py

        self.f = h5py.File(path, "r")
        self.ds = self.f["images"]
        self.raw = raw

    def get(self, i):
        value = self.ds[i]
        return value if self.raw else value.tobytes()

    def close(self):
        self.f.close()


class _MemmapReader:
    def __init__(self, path):
        self.images = np.load(path, mmap_mode="r")

    def get(self, i):
        return np.array(self.images[i])       # a copy: the pages are read now, as a loader would

    def close(self):
        del self.images


# -- writing ----------------------------------------------------------------------------------------

def _available(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def write_formats(images: np.ndarray, dest, *, quality: int = 90, formats=FORMATS) -> dict[str, StoredImages]:
    """Write `images` ((N, H, W, 3) uint8) in each of `formats` under `dest` (emptied first). The
    encoded formats hold the same JPEG bytes (PIL, `quality`, 4:2:0); the raw ones the pixels.
    Formats whose package is missing (h5py, lmdb) are left out."""
    from PIL import Image

    images = np.ascontiguousarray(images, dtype=np.uint8)
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be (N, H, W, 3) uint8, got {images.shape}")
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    n = len(images)
    encoded = []
    for im in images:
        buf = io.BytesIO()
        Image.fromarray(im).save(buf, format="JPEG", quality=quality)
        encoded.append(buf.getvalue())
    out = {}
    for name in formats:
        root = dest / name
        root.mkdir()
        if name == "jpeg-files":
            files = [root / f"{k:08d}.jpg" for k in range(n)]
            for f, b in zip(files, encoded):
                f.write_bytes(b)
            out[name] = StoredImages(name, root, files, True, n, lambda files=files: _FileReader(files))
        elif name == "packed-jpeg":
            data, index = root / "images.bin", root / "offsets.npy"
            with open(data, "wb") as f:
                for b in encoded:
                    f.write(b)
            np.save(index, np.concatenate([[0], np.cumsum([len(b) for b in encoded])]).astype(np.int64))
            out[name] = StoredImages(name, root, [data, index], True, n, lambda d=data, i=index: _PackedReader(d, i))
        elif name == "lmdb-jpeg":
            if not _available("lmdb"):
                continue
            import lmdb

            env = lmdb.open(str(root), map_size=max(1 << 24, 4 * sum(map(len, encoded))), subdir=True)
            with env.begin(write=True) as txn:
                for k, b in enumerate(encoded):
                    txn.put(b"%08d" % k, b)
            env.sync()
            env.close()
            files = sorted(p for p in root.iterdir() if p.name == "data.mdb")
            out[name] = StoredImages(name, root, files, True, n, lambda r=root: _LmdbReader(r))
        elif name in ("hdf5-jpeg", "hdf5-raw"):
            if not _available("h5py"):
                continue
            import h5py

            path = root / "images.h5"
            with h5py.File(path, "w") as f:
                if name == "hdf5-jpeg":
                    ds = f.create_dataset("images", (n,), dtype=h5py.vlen_dtype(np.uint8))
                    for k, b in enumerate(encoded):
                        ds[k] = np.frombuffer(b, np.uint8)
                else:
                    f.create_dataset("images", data=images, chunks=(1,) + images.shape[1:])
            out[name] = StoredImages(name, root, [path], name == "hdf5-jpeg", n,
                                     lambda p=path, raw=name == "hdf5-raw": _H5Reader(p, raw))
        elif name == "raw-memmap":
            path = root / "images.npy"
            np.save(path, images)
            out[name] = StoredImages(name, root, [path], False, n, lambda p=path: _MemmapReader(p))
        else:
            raise ValueError(f"unknown format {name!r}; known: {', '.join(FORMATS)}")
    return out


# -- measuring --------------------------------------------------------------------------------------

@dataclass
class FormatResult:
    """What one format costs (lesson 04). Times are per image, in microseconds."""
    name: str
    description: str
    images: int
    files: int
    size_on_disk: int
    read_cold_us: float | None          # reading every image in order, from the disk
    read_warm_us: float                 # the same from the page cache
    random_cold_us: float | None        # one image at a random position, from the disk
    random_warm_us: float               # the same from the page cache
    decode_us: float                    # decoding one image (0 for raw pixels)
    storage_share_cold: float | None = None   # share of the cold reads' bytes that came from storage
    read_cold_rounds: list = field(default_factory=list)    # each round's in-order cold read, us/image
    read_warm_rounds: list = field(default_factory=list)    # each round's in-order warm read, us/image

    @property
    def bytes_per_image(self) -> float:
        return self.size_on_disk / self.images

    @property
    def ready_warm_per_s(self) -> float:
        """Images per second ready to use (read + decoded) on one core, from the page cache."""
        return 1e6 / (self.read_warm_us + self.decode_us)

    @property
    def ready_cold_per_s(self) -> float | None:
        return None if self.read_cold_us is None else 1e6 / (self.read_cold_us + self.decode_us)


def _time_reads(reader, order) -> float:
    t0 = time.perf_counter()
    for i in order:
        reader.get(int(i))
    return (time.perf_counter() - t0) / len(order) * 1e6


def _decode_us(encoded: list, repeats: int) -> float:
    """Microseconds to decode one of these JPEGs (after one warm-up pass)."""
    for b in encoded:
        decode_jpeg(b)
    t0 = time.perf_counter()
    for _ in range(repeats):
        for b in encoded:
            decode_jpeg(b)
    return (time.perf_counter() - t0) / (repeats * len(encoded)) * 1e6


def measure_format(stored: StoredImages, *, random_reads: int = 200, repeats: int = 3, seed: int = 0,
                   cold: bool = True, decode_us: float | None = None) -> FormatResult:
    """Time one format: in order and at random, cold (each cold pass starts with the files dropped
    from the page cache) and warm (median of `repeats` passes), and its decoding (measured on up
    to 50 of its images unless `decode_us` is given: the encoded formats hold the same bytes)."""
    rng = np.random.default_rng(seed)
    in_order = np.arange(stored.count)
    at_random = rng.permutation(stored.count)[:random_reads]      # distinct: each one a first touch when cold
    read_cold = random_cold = share = None
    if cold and evict(stored.files):
        before = storage_read_bytes()
        reader = stored.open()
        try:
            read_cold = _time_reads(reader, in_order)
        finally:
            reader.close()
        after = storage_read_bytes()
        if before is not None and after is not None:
            share = min(1.0, (after - before) / max(1, stored.size_on_disk()))
        evict(stored.files)
        reader = stored.open()
        try:
            random_cold = _time_reads(reader, at_random)
        finally:
            reader.close()
    reader = stored.open()
    try:
        _time_reads(reader, in_order)                     # warm the page cache and the reader
        read_warm = statistics.median(_time_reads(reader, in_order) for _ in range(repeats))
        random_warm = statistics.median(_time_reads(reader, at_random) for _ in range(repeats))
        if not stored.encoded:
            decode_us = 0.0
        elif decode_us is None:
            decode_us = _decode_us([reader.get(int(i)) for i in in_order[: min(50, stored.count)]], repeats)
    finally:
        reader.close()
    return FormatResult(stored.name, stored.description, stored.count, len(stored.files), stored.size_on_disk(),
                        read_cold, read_warm, random_cold, random_warm, decode_us, share)


def measure_formats(stored: dict, *, rounds: int = 3, **kwargs) -> list[FormatResult]:
    """`measure_format` for every format written by `write_formats` (in the order of FORMATS), in
    `rounds` rounds that take turns between the formats (a busy moment of this machine lands on
    every format alike), one warm pass per round; each figure is the median of the rounds, and the
    in-order reads of every round are kept (`read_verdicts` compares them round by round). The
    decoding is timed once, on the first encoded format, and shared by the others (they hold the
    same JPEG bytes)."""
    names = [name for name in FORMATS if name in stored]
    per_round: dict[str, list[FormatResult]] = {name: [] for name in names}
    decode_us = None
    for _ in range(max(1, rounds)):
        for name in names:
            result = measure_format(stored[name], decode_us=decode_us,
                                    **{"repeats": 1 if rounds > 1 else 3, **kwargs})
            if stored[name].encoded and decode_us is None:
                decode_us = result.decode_us
            per_round[name].append(result)
    results = []
    for name in names:
        runs = per_round[name]

        def median(field_name):
            values = [getattr(r, field_name) for r in runs if getattr(r, field_name) is not None]
            return statistics.median(values) if values else None
        first = runs[0]
        results.append(FormatResult(first.name, first.description, first.images, first.files, first.size_on_disk,
                                    median("read_cold_us"), median("read_warm_us"), median("random_cold_us"),
                                    median("random_warm_us"), first.decode_us if decode_us is None else
                                    (decode_us if stored[name].encoded else 0.0), median("storage_share_cold"),
                                    [r.read_cold_us for r in runs if r.read_cold_us is not None],
                                    [r.read_warm_us for r in runs]))
    return results


def _rounds_say(mine: list, theirs: list, margin: float = 0.1, spread: float = 2.0) -> str:
    """'faster' or 'slower' (times: lower is faster) when every round says so by more than `margin`
    and the rounds' ratios lie within a factor `spread` of each other (w6-04: a warm read at
    1.04-1.36x in one run, "2.43x: slower" in the next: rounds that far apart show the load); every
    round one way but further apart: 'slower in every round, 2.39x to 80.86x the time (...)' (w8-04:
    that printed "the rounds disagree"); 'about the same' when every round is within the margin; "the
    rounds disagree" only where rounds point opposite ways; else undecided, some rounds within it."""
    ratios = [a / b for a, b in zip(mine, theirs) if b]
    if not ratios:
        return "not measured"
    shown = ", ".join(f"{r:.2f}x" for r in ratios)
    fast, slow = all(r < 1 - margin for r in ratios), all(r > 1 + margin for r in ratios)
    if fast or slow:
        word = "faster" if fast else "slower"
        if min(ratios) > 0 and max(ratios) / min(ratios) > spread:
            return (f"{word} in every round, {min(ratios):.2f}x to {max(ratios):.2f}x the time (the size moved more "
                    f"than {spread:g}x between rounds)")
        return word
    if all(abs(r - 1) <= margin for r in ratios):
        return "about the same"
    if any(r < 1 - margin for r in ratios) and any(r > 1 + margin for r in ratios):
        return "the rounds disagree: " + shown
    side = "faster" if any(r < 1 - margin for r in ratios) else "slower"
    return f"undecided: some rounds within {margin:.0%}, the others {side}: " + shown


def images_per_s_model(result: FormatResult, disk_mb_s, cores: int = 1) -> np.ndarray:
    """Ready images per second a format can give with a disk of `disk_mb_s` MB/s and `cores`
    cores decoding (each at the measured rate, warm reads): the smaller of what the disk
    delivers (bandwidth / bytes per image) and what the cores make ready. A model from the
    measurements, not a measurement: it ignores seeks and assumes perfect overlap."""
    disk_mb_s = np.asarray(disk_mb_s, dtype=float)
    by_disk = disk_mb_s * 1e6 / result.bytes_per_image
    by_cpu = cores * result.ready_warm_per_s
    return np.minimum(by_disk, by_cpu)


# -- what the measurements say (lesson 04 prints these under its tables) ---------------------------

def read_verdicts(results: list[FormatResult]) -> list[str]:
    """Sentences computed from `measure_formats()`'s results (lesson 04): what decoding costs
    against reading, and each packed format against one file per image, cold and warm. Each says
    only what the numbers say (faster or slower, by how much), with the format that won."""
    by_name = {r.name: r for r in results}
    lines = []
    files = by_name.get("jpeg-files")
    encoded = next((r for r in results if r.decode_us > 0), None)
    if encoded is not None:
        reference = files or encoded
        line = (f"decoding a JPEG costs {encoded.decode_us:,.0f} us here (simplejpeg, one core); reading one "
                f"({reference.description}) {reference.read_warm_us:,.1f} us from the page cache")
        if reference.read_cold_us is not None:
            line += f" and {reference.read_cold_us:,.1f} us from the disk"
        ratio = encoded.decode_us / reference.read_warm_us
        line += (f": decoding is {ratio:,.0f}x a warm read" if ratio >= 1 else
                 f": a warm read costs {1 / ratio:,.1f}x the decoding")
        if reference.read_cold_us is not None:
            cold = encoded.decode_us / reference.read_cold_us
            # w10-04: "decoding is 1.3x a cold one" in one run, "a cold read costs 1.0x the decoding" in the next:
            # where the cold reads' rounds put the ratio on both sides of 1, or more than 2x apart, the line
            # gives the rounds' range and says the load moved it, not one ratio
            rounds = [encoded.decode_us / t for t in reference.read_cold_rounds if t]
            if len(rounds) >= 2 and (min(rounds) < 1 < max(rounds) or max(rounds) > 2 * min(rounds)):
                line += (f"; against a cold read the disk's rounds give {min(rounds):,.1f}x to {max(rounds):,.1f}x "
                         "the decoding: this machine's load moved the cold reads more than that, no ratio from "
                         "this run")
            else:
                line += (f" and {cold:,.1f}x a cold one" if cold >= 1 else
                         f", and a cold read costs {1 / cold:,.1f}x the decoding")
        lines.append(line)
    if files is not None:
        rounds = len(files.read_warm_rounds)
        for r in results:
            if r is files:
                continue
            parts = []
            for what, mine, theirs, mine_rounds, their_rounds in (
                    ("cold", r.read_cold_us, files.read_cold_us, r.read_cold_rounds, files.read_cold_rounds),
                    ("warm", r.read_warm_us, files.read_warm_us, r.read_warm_rounds, files.read_warm_rounds)):
                if mine is None or theirs is None or theirs <= 0:
                    continue
                if mine_rounds and their_rounds:
                    word = _rounds_say(mine_rounds, their_rounds)
                else:
                    ratio = mine / theirs
                    word = "faster" if ratio < 0.9 else ("slower" if ratio > 1.1 else "about the same")
                parts.append(f"{what} {mine:,.1f} us ({mine / theirs:.2f}x: {word})")
            if parts:
                lines.append(f"{r.description}, read in order, against one file per image: " + "; ".join(parts))
        if rounds > 1:
            lines.append(f"(medians of {rounds} rounds that took turns between the formats; 'faster' or 'slower' "
                         "alone where every round said so by more than 10% and the rounds lie within 2x of each other; "
                         "'in every round, X to Y' where every round said so but the size moved more; 'the rounds "
                         "disagree' only where rounds point opposite ways)")
    memory = [r for r in results if r.storage_share_cold is not None and r.storage_share_cold < 0.5]
    if memory:
        lines.append(f"the cold passes of {len(memory)} of {len(results)} formats read less than half of their bytes "
                     "from storage (the kernel's count): this filesystem kept the files in memory despite the request "
                     "to drop them, so their 'cold' columns are warm readings too, differing by noise")
    inverted = [r for r in results if r.read_cold_us is not None and r.read_cold_us < 0.9 * r.read_warm_us]
    if inverted:
        lines.append(f"{', '.join(r.description for r in inverted)}: read faster cold than warm here, which no disk "
                     "does: at this size the two passes differ by this machine's noise more than by the disk")
    return lines


def jpeg_error_structure(original: np.ndarray, roundtrip: np.ndarray) -> dict:
    """Where a JPEG round trip changed the pixels (lesson 04), for (N, H, W, 3) uint8 images:

    - `detail`: the mean |error| in the quarter of pixels with the most local detail (a Laplacian
      of the original) over the quarter with the least: above 1 the error follows the image;
    - `blocking`: how much the error jumps between neighbouring pixels across the 8x8 blocks'
      edges, over the same jump inside the blocks: above 1, the blocks show;
    - `verdict`: a sentence that says what those two numbers show."""
    original = np.asarray(original, np.float64)
    err = np.asarray(roundtrip, np.float64) - original
    size = np.abs(err).mean(axis=3)
    grey = original.mean(axis=3)
    detail = np.abs(4 * grey[:, 1:-1, 1:-1] - grey[:, :-2, 1:-1] - grey[:, 2:, 1:-1]
                    - grey[:, 1:-1, :-2] - grey[:, 1:-1, 2:]).ravel()
    inner = size[:, 1:-1, 1:-1].ravel()
    low, high = np.quantile(detail, [0.25, 0.75])
    follows = float(inner[detail >= high].mean() / max(inner[detail <= low].mean(), 1e-9))
    jump_x = np.abs(np.diff(err, axis=2)).mean(axis=3)
    jump_y = np.abs(np.diff(err, axis=1)).mean(axis=3)
    edge_x = np.arange(jump_x.shape[2]) % 8 == 7
    edge_y = np.arange(jump_y.shape[1]) % 8 == 7
    blocking = float((jump_x[:, :, edge_x].mean() + jump_y[:, edge_y, :].mean())
                     / max(jump_x[:, :, ~edge_x].mean() + jump_y[:, ~edge_y, :].mean(), 1e-9))
    if follows >= 1.5:
        where = f"the error follows the image: {follows:.1f}x larger where it has detail than where it is flat"
    else:
        where = f"the error is spread over the image like noise ({follows:.1f}x between detailed and flat pixels)"
    blocks = (f", and jumps {blocking:.1f}x as much across the 8x8 blocks' edges as inside them: blocking"
              if blocking >= 1.2 else f", with no blocking to speak of ({blocking:.2f}x across the blocks' edges)")
    return {"blocking": blocking, "detail": follows, "verdict": where + blocks}
