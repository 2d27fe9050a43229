"""CIFAR-10 in its original binary format (lesson 00 prepares it; every lesson reads it).

The binary version of CIFAR-10 is six files of 10,000 records each (`data_batch_1.bin` ..
`data_batch_5.bin`, `test_batch.bin`) plus `batches.meta.txt` (one class name per line). A
record is 3,073 bytes: one label byte, then 1,024 red, 1,024 green and 1,024 blue bytes of a
32x32 image, row by row.

Where the files come from (`prepare_cifar10()` decides, in this order):
1. a folder you name: `prepare_cifar10("path")` or env `COURSE_DATA`;
2. the real CIFAR-10 in `data/cifar-10-batches-bin` (put it there, or
   `python -m course_utils.data --download` fetches it: the only download in the course);
3. otherwise the embedded default: a deterministic *synthetic* dataset written in exactly the
   same format into `data/synthetic-cifar-10-batches-bin`. Its ten classes are coloured
   textures (stripes, rings, checks, spots) with random placement, colour and noise, so a
   small CNN learns them clearly above chance but not instantly. It is not real CIFAR-10, and
   every lesson says which one it used.

Nothing here ever returns a silently wrong dataset: a missing, truncated or wrong-size file
raises `CifarFormatError` naming the file, the size expected and how to regenerate it.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = [
    "RECORD_BYTES", "RECORDS_PER_FILE", "TRAIN_FILES", "TEST_FILES", "CIFAR10_MEAN", "CIFAR10_STD",
    "CifarFormatError", "CifarInfo", "prepare_cifar10", "validate_cifar_dir", "read_records",
    "decode_records", "load_cifar10_arrays", "CIFAR10Binary", "baseline_transform", "eval_transform",
    "write_synthetic_cifar10", "download_cifar10", "data_home",
]

RECORD_BYTES = 1 + 32 * 32 * 3          # 3073
RECORDS_PER_FILE = 10_000
FILE_BYTES = RECORD_BYTES * RECORDS_PER_FILE   # 30,730,000
TRAIN_FILES = [f"data_batch_{i}.bin" for i in range(1, 6)]
TEST_FILES = ["test_batch.bin"]
META_FILE = "batches.meta.txt"
SYNTHETIC_MARKER = "SYNTHETIC.txt"
# Per-channel mean and std of the real CIFAR-10 training set (the usual Normalize constants).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
SYNTHETIC_VERSION = "1"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CIFAR10_MD5 = "c32a1d4ab5d03f1284b67883e8d87530"


class CifarFormatError(RuntimeError):
    """A CIFAR-10 binary folder that is missing a file or has a file of the wrong size."""


@dataclass(frozen=True)
class CifarInfo:
    """Where the dataset lives and what it is."""
    root: Path
    synthetic: bool
    classes: tuple[str, ...]
    n_train: int
    n_test: int

    def describe(self) -> str:
        kind = ("SYNTHETIC stand-in for CIFAR-10 (generated locally, same binary format)"
                if self.synthetic else "real CIFAR-10")
        return (f"{kind}: {self.n_train:,} training + {self.n_test:,} test records of "
                f"{RECORD_BYTES} bytes in {self.root}")


def data_home() -> Path:
    """Folder for datasets: env COURSE_DATA_HOME, else `data/` at the course's root."""
    env = os.environ.get("COURSE_DATA_HOME")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parent.parent / "data"


# -- validation and reading ----------------------------------------------------------------

def _regen_hint(root: Path) -> str:
    if (root / SYNTHETIC_MARKER).exists():
        return "Regenerate it with `python -m course_utils.data --regenerate`."
    return ("Re-extract the real files from cifar-10-binary.tar.gz, or delete the folder to "
            "fall back to the generated default (`python -m course_utils.data --regenerate`).")


def validate_cifar_dir(root) -> CifarInfo:
    """Check every file of a CIFAR-10 binary folder exists with exactly the right size."""
    root = Path(root)
    if not root.is_dir():
        raise CifarFormatError(f"CIFAR-10 folder {root} does not exist.")
    for name in TRAIN_FILES + TEST_FILES:
        path = root / name
        if not path.exists():
            raise CifarFormatError(f"{path} is missing: expected {FILE_BYTES:,} bytes "
                                   f"({RECORDS_PER_FILE:,} records of {RECORD_BYTES} bytes). {_regen_hint(root)}")
        size = path.stat().st_size
        if size != FILE_BYTES:
            raise CifarFormatError(
                f"{path} has {size:,} bytes but a CIFAR-10 binary batch has {FILE_BYTES:,} "
                f"({RECORDS_PER_FILE:,} records of {RECORD_BYTES} bytes); the file is "
                f"{'truncated' if size < FILE_BYTES else 'too long'}. {_regen_hint(root)}")
    meta = root / META_FILE
    if not meta.exists():
        raise CifarFormatError(f"{meta} is missing (ten class names, one per line). {_regen_hint(root)}")
    classes = tuple(line.strip() for line in meta.read_text().splitlines() if line.strip())
    if len(classes) != 10:
        raise CifarFormatError(f"{meta} names {len(classes)} classes; CIFAR-10 has 10. {_regen_hint(root)}")
    return CifarInfo(root, (root / SYNTHETIC_MARKER).exists(), classes,
                     len(TRAIN_FILES) * RECORDS_PER_FILE, len(TEST_FILES) * RECORDS_PER_FILE)


def read_records(path) -> np.ndarray:
    """Memory-map one batch file as an (N, 3073) uint8 array of records (no copy)."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0 or size % RECORD_BYTES:
        raise CifarFormatError(f"{path} has {size:,} bytes, not a whole number of {RECORD_BYTES}-byte records.")
    return np.memmap(path, dtype=np.uint8, mode="r", shape=(size // RECORD_BYTES, RECORD_BYTES))


def decode_records(records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, 3073) records -> images (N, 32, 32, 3) uint8 HWC and labels (N,) int64."""
    records = np.asarray(records)
    labels = records[:, 0].astype(np.int64)
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def load_cifar10_arrays(root=None, *, train: bool = True, limit: int | None = None):
    """All training (or test) images and labels as arrays, at most `limit` of them."""
    info = prepare_cifar10(root)
    images, labels = [], []
    remaining = limit
    for name in (TRAIN_FILES if train else TEST_FILES):
        recs = read_records(info.root / name)
        if remaining is not None:
            recs = recs[:remaining]
        im, lb = decode_records(recs)
        images.append(im)
        labels.append(lb)
        if remaining is not None:
            remaining -= len(lb)
            if remaining <= 0:
                break
    return np.concatenate(images), np.concatenate(labels)


def prepare_cifar10(root=None, *, generate: bool = True) -> CifarInfo:
    """Find (or generate) the CIFAR-10 binary folder and validate it. See the module docstring."""
    candidates = []
    if root is not None:
        candidates.append(Path(root))
    elif os.environ.get("COURSE_DATA"):
        candidates.append(Path(os.environ["COURSE_DATA"]).expanduser())
    if candidates:
        base = candidates[0]
        sub = base / "cifar-10-batches-bin"
        return validate_cifar_dir(sub if sub.is_dir() and not (base / TRAIN_FILES[0]).exists() else base)
    real = data_home() / "cifar-10-batches-bin"
    if real.is_dir():
        return validate_cifar_dir(real)
    synthetic = data_home() / "synthetic-cifar-10-batches-bin"
    marker = synthetic / SYNTHETIC_MARKER
    if not (marker.exists() and marker.read_text().startswith(f"version {SYNTHETIC_VERSION}\n")):
        if not generate:
            raise CifarFormatError(f"No CIFAR-10 found in {data_home()}; run `python -m course_utils.data --regenerate`.")
        write_synthetic_cifar10(synthetic)
    return validate_cifar_dir(synthetic)


# -- the dataset and its transforms --------------------------------------------------------

def baseline_transform():
    """The seeds' baseline training transform: pad-4 random crop, horizontal flip, ToTensor, Normalize."""
    import torchvision.transforms as T
    return T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(CIFAR10_MEAN, CIFAR10_STD)])


def eval_transform():
    """Evaluation transform: ToTensor and Normalize only."""
    import torchvision.transforms as T
    return T.Compose([T.ToTensor(), T.Normalize(CIFAR10_MEAN, CIFAR10_STD)])


class CIFAR10Binary(Dataset):
    """CIFAR-10 read from its binary files, like `torchvision.datasets.CIFAR10`.

    Items are `(transform(PIL image), label)`; with no transform, `(PIL image, label)`.
    Images are held in one NumPy array (workers share it copy-on-write). `limit` keeps the
    first `limit` records (smoke runs).
    """

    def __init__(self, root=None, *, train: bool = True, transform=None, limit: int | None = None):
        self.info = prepare_cifar10(root)
        self.train = train
        self.transform = transform
        self.images, self.labels = load_cifar10_arrays(self.info.root, train=train, limit=limit)
        self.classes = self.info.classes

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        from PIL import Image
        image = Image.fromarray(self.images[index])
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])


# -- the embedded default: synthetic CIFAR-10 in the real format ----------------------------

SYNTHETIC_CLASSES = (
    "warm_hstripes", "cool_hstripes", "warm_vstripes", "cool_vstripes", "warm_rings",
    "cool_rings", "warm_checks", "cool_checks", "warm_spot", "cool_spot",
)


def _synthetic_images(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Images (N, 32, 32, 3) uint8 for `labels`: class = texture (label // 2) x palette (label % 2)."""
    n = len(labels)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32)
    yy, xx = yy[None], xx[None]
    cx = rng.uniform(9, 23, (n, 1, 1)).astype(np.float32)
    cy = rng.uniform(9, 23, (n, 1, 1)).astype(np.float32)
    radius = rng.uniform(5, 11, (n, 1, 1)).astype(np.float32)
    freq = rng.uniform(0.11, 0.2, (n, 1, 1)).astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, (n, 1, 1)).astype(np.float32)
    r = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
    texture = labels // 2
    pattern = np.empty((n, 32, 32), np.float32)
    for kind in range(5):
        idx = np.nonzero(texture == kind)[0]
        if not len(idx):
            continue
        f, p = freq[idx], phase[idx]
        if kind == 0:      # horizontal stripes
            v = np.sin(2 * np.pi * f * yy + p)
        elif kind == 1:    # vertical stripes
            v = np.sin(2 * np.pi * f * xx + p)
        elif kind == 2:    # rings around the object's centre
            v = np.sin(2 * np.pi * f * r[idx] + p)
        elif kind == 3:    # checks
            v = np.sin(2 * np.pi * f * xx + p) * np.sin(2 * np.pi * f * yy + p)
            v = np.tanh(4 * v)
        else:              # a soft spot
            v = 2 * np.exp(-(r[idx] / (0.45 * radius[idx])) ** 2) - 1
        pattern[idx] = 0.5 + 0.5 * v
    warm = np.array([0.72, 0.5, 0.36], np.float32)
    cool = np.array([0.36, 0.5, 0.72], np.float32)
    base = np.where((labels % 2 == 0)[:, None], warm, cool)
    fg = np.clip(base + 0.12 * rng.standard_normal((n, 3), dtype=np.float32), 0, 1)
    dark = fg * rng.uniform(0.3, 0.7, (n, 1)).astype(np.float32)
    bg = rng.uniform(0.2, 0.7, (n, 3)).astype(np.float32)
    mask = 1 / (1 + np.exp((r - radius) * 1.5))                    # a soft-edged disk
    obj = pattern[..., None] * fg[:, None, None] + (1 - pattern[..., None]) * dark[:, None, None]
    img = mask[..., None] * obj + (1 - mask[..., None]) * bg[:, None, None]
    img += 0.10 * rng.standard_normal(img.shape, dtype=np.float32)
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def _synthetic_file(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.repeat(np.arange(10), RECORDS_PER_FILE // 10)).astype(np.uint8)
    images = _synthetic_images(labels.astype(np.int64), rng)
    records = np.empty((RECORDS_PER_FILE, RECORD_BYTES), np.uint8)
    records[:, 0] = labels
    records[:, 1:] = images.transpose(0, 3, 1, 2).reshape(RECORDS_PER_FILE, -1)  # HWC -> CHW planes
    return records.tobytes()


def write_synthetic_cifar10(dest, *, seed: int = 2024) -> CifarInfo:
    """Write the deterministic synthetic dataset into `dest` (atomically: a temporary folder
    renamed into place, so two notebooks starting together cannot see half a dataset)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".synthetic-", dir=dest.parent))
    try:
        for i, name in enumerate(TRAIN_FILES + TEST_FILES):
            (tmp / name).write_bytes(_synthetic_file(seed + i))
        (tmp / META_FILE).write_text("\n".join(SYNTHETIC_CLASSES) + "\n")
        (tmp / SYNTHETIC_MARKER).write_text(
            f"version {SYNTHETIC_VERSION}\nseed {seed}\n"
            "A synthetic stand-in for CIFAR-10 written by course_utils.data in the real binary format.\n"
            "Classes are textures x palettes, not photographs. Put real CIFAR-10 in "
            "data/cifar-10-batches-bin to use it instead.\n")
        if dest.exists():
            shutil.rmtree(dest)
        try:
            tmp.rename(dest)
        except OSError:  # another process won the race and wrote the same bytes
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return validate_cifar_dir(dest)


def download_cifar10(dest=None) -> CifarInfo:
    """Download the real CIFAR-10 binary version (163 MB) into `data/` and check its MD5.
    Only called when you ask for it (`python -m course_utils.data --download`)."""
    import tarfile
    import urllib.request

    dest = Path(dest) if dest else data_home()
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / "cifar-10-binary.tar.gz"
    print(f"Downloading {CIFAR10_URL} -> {archive}")
    urllib.request.urlretrieve(CIFAR10_URL, archive)
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    if md5 != CIFAR10_MD5:
        raise CifarFormatError(f"{archive} has MD5 {md5}, expected {CIFAR10_MD5}: the download is damaged.")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return validate_cifar_dir(dest / "cifar-10-batches-bin")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.data", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--regenerate", action="store_true", help="rewrite the synthetic default dataset")
    group.add_argument("--download", action="store_true", help="download the real CIFAR-10 binary files")
    args = parser.parse_args(argv)
    if args.regenerate:
        info = write_synthetic_cifar10(data_home() / "synthetic-cifar-10-batches-bin")
    elif args.download:
        info = download_cifar10()
    else:
        info = prepare_cifar10()
    print(info.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
