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

Nothing here ever returns a silently wrong dataset: a missing, truncated or wrong-size file,
a file whose labels are not CIFAR-10's (0-9, all ten classes), or a generated file that no
longer matches the checksum recorded when it was written, raises `CifarFormatError` in one
sentence naming the file and a fix that works for that folder. Several processes may prepare
the generated default at once (two notebooks, `make test` beside a lesson): one writes it into
a temporary folder and renames it into place, the others wait for it; a finished dataset is
never deleted under a reader. A read-only or full disk is one sentence (`DataPreparationError`).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
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
    "write_synthetic_cifar10", "download_cifar10", "data_home", "DataPreparationError", "SYNTHETIC_DIR",
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
SYNTHETIC_VERSION = "2"     # 2: the marker records each file's sha256
SYNTHETIC_DIR = "synthetic-cifar-10-batches-bin"
SYNTHETIC_BYTES = (len(TRAIN_FILES) + len(TEST_FILES)) * FILE_BYTES
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CIFAR10_MD5 = "c32a1d4ab5d03f1284b67883e8d87530"


class CifarFormatError(RuntimeError):
    """A CIFAR-10 binary folder with a missing, wrong-size or wrong-content file (one sentence)."""

    def _render_traceback_(self):   # IPython shows the sentence, not a traceback through this module
        return [f"{type(self).__name__}: {self}"]


class DataPreparationError(CifarFormatError):
    """The dataset could not be written: a read-only or full disk, or no permission (one sentence)."""


def _disk_error(exc: OSError, folder: Path, what: str = "the generated CIFAR-10") -> DataPreparationError:
    """One sentence for an OSError met while writing `what` into `folder`."""
    fix = ("Set COURSE_DATA_HOME to a writable folder with room for it, or COURSE_DATA to a folder "
           "that already holds CIFAR-10.")
    if exc.errno == errno.ENOSPC or exc.errno == getattr(errno, "EDQUOT", None):
        why = f"the disk is full (it needs {SYNTHETIC_BYTES / 1e6:,.0f} MB)"
    elif exc.errno == errno.EROFS:
        why = "the disk is read-only"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        why = "this user may not write there"
    else:
        why = f"{exc.strerror or type(exc).__name__}"
    return DataPreparationError(f"Cannot write {what} into {folder}: {why}. {fix}")


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

def _regen_hint(root: Path, source: str | None = None) -> str:
    """A fix that works for this folder, given how it was chosen (argument, COURSE_DATA, default)."""
    root = Path(root)
    if (root / SYNTHETIC_MARKER).exists():
        return f"Regenerate it with `python -m course_utils.data --regenerate {root}`."
    if source == "env":
        return (f"Re-extract cifar-10-binary.tar.gz into {root}, or unset COURSE_DATA to use the "
                "generated default.")
    if source == "argument":
        return (f"Re-extract cifar-10-binary.tar.gz into {root}, or call prepare_cifar10() without a "
                "folder to use the generated default.")
    return (f"Re-extract cifar-10-binary.tar.gz into {root.parent} (`python -m course_utils.data "
            f"--download` does it), or delete {root} to fall back to the generated default.")


def _recorded_sha256(root: Path) -> dict[str, str]:
    marker = root / SYNTHETIC_MARKER
    sums = {}
    for line in marker.read_text().splitlines() if marker.exists() else []:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "sha256":
            sums[parts[1]] = parts[2]
    return sums


_VERIFIED: dict[str, tuple] = {}   # folder -> the files' (inode, size, mtime) when last verified


def _stamp(root: Path) -> tuple:
    out = []
    for name in TRAIN_FILES + TEST_FILES + [META_FILE, SYNTHETIC_MARKER]:
        try:
            st = (root / name).stat()
            out.append((name, st.st_ino, st.st_size, st.st_mtime_ns))
        except FileNotFoundError:
            out.append((name, None))
    return tuple(out)


def _check_contents(root: Path, source: str | None) -> None:
    """Labels in range and all ten classes in every batch file; for the generated default, the
    sha256 recorded when it was written. Done once per process per version of the files."""
    stamp = _stamp(root)
    if _VERIFIED.get(str(root)) == stamp:
        return
    for name in TRAIN_FILES + TEST_FILES:
        path = root / name
        labels = np.memmap(path, dtype=np.uint8, mode="r")[::RECORD_BYTES]
        if int(labels.max()) > 9:
            bad = int(np.argmax(labels > 9))
            raise CifarFormatError(
                f"{path} is not CIFAR-10 data: record {bad:,} has label {int(labels[bad])}, but CIFAR-10's labels "
                f"are 0-9 (is it a damaged or foreign file?). {_regen_hint(root, source)}")
        present = np.unique(labels)
        if len(present) < 10:
            raise CifarFormatError(
                f"{path} is not CIFAR-10 data: its {len(labels):,} records hold only {len(present)} of the ten "
                f"classes (is it zero-filled or a foreign file?). {_regen_hint(root, source)}")
    recorded = _recorded_sha256(root)
    for name, expected in recorded.items():
        path = root / name
        with open(path, "rb") as f:
            actual = hashlib.file_digest(f, "sha256").hexdigest()
        if actual != expected:
            raise CifarFormatError(
                f"{path} does not match the checksum recorded when the course generated it (sha256 "
                f"{actual[:12]}..., recorded {expected[:12]}...): the file was changed or damaged. "
                f"{_regen_hint(root, source)}")
    _VERIFIED[str(root)] = stamp


def validate_cifar_dir(root, *, source: str | None = None) -> CifarInfo:
    """Check every file of a CIFAR-10 binary folder: present, exactly the right size, labels of
    CIFAR-10, and for the generated default its recorded checksums. `source` says how the folder
    was chosen ("argument", "env", "real", "synthetic"), so that the suggested fix fits it."""
    root = Path(root)
    if not root.is_dir():
        raise CifarFormatError(f"CIFAR-10 folder {root} does not exist."
                               + (" Check COURSE_DATA." if source == "env" else ""))
    for name in TRAIN_FILES + TEST_FILES:
        path = root / name
        if not path.exists():
            raise CifarFormatError(f"{path} is missing: expected {FILE_BYTES:,} bytes "
                                   f"({RECORDS_PER_FILE:,} records of {RECORD_BYTES} bytes). {_regen_hint(root, source)}")
        size = path.stat().st_size
        if size != FILE_BYTES:
            raise CifarFormatError(
                f"{path} has {size:,} bytes but a CIFAR-10 binary batch has {FILE_BYTES:,} "
                f"({RECORDS_PER_FILE:,} records of {RECORD_BYTES} bytes); the file is "
                f"{'truncated' if size < FILE_BYTES else 'too long'}. {_regen_hint(root, source)}")
    meta = root / META_FILE
    if not meta.exists():
        raise CifarFormatError(f"{meta} is missing (ten class names, one per line). {_regen_hint(root, source)}")
    classes = tuple(line.strip() for line in meta.read_text().splitlines() if line.strip())
    if len(classes) != 10:
        raise CifarFormatError(f"{meta} names {len(classes)} classes; CIFAR-10 has 10. {_regen_hint(root, source)}")
    _check_contents(root, source)
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


def _current(folder: Path) -> bool:
    marker = folder / SYNTHETIC_MARKER
    try:
        return marker.read_text().startswith(f"version {SYNTHETIC_VERSION}\n")
    except OSError:
        return False


@contextlib.contextmanager
def _locked(folder: Path):
    """An exclusive lock beside `folder` (flock on `.<name>.lock`), so that one process at a time
    prepares it; without a writable place for the lock (a read-only share) there is nothing to lock."""
    try:
        import fcntl
        folder.parent.mkdir(parents=True, exist_ok=True)
        handle = open(folder.parent / f".{folder.name}.lock", "a+")
    except (ImportError, OSError):
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare_cifar10(root=None, *, generate: bool = True, progress=None) -> CifarInfo:
    """Find (or generate) the CIFAR-10 binary folder and validate it. See the module docstring.
    `progress(i, n, name)`, if given, is called after each of the n files written (lesson 00 prints it)."""
    if root is not None or os.environ.get("COURSE_DATA"):
        source = "argument" if root is not None else "env"
        base = Path(root) if root is not None else Path(os.environ["COURSE_DATA"]).expanduser()
        sub = base / "cifar-10-batches-bin"
        return validate_cifar_dir(sub if sub.is_dir() and not (base / TRAIN_FILES[0]).exists() else base,
                                  source=source)
    real = data_home() / "cifar-10-batches-bin"
    if real.is_dir():
        return validate_cifar_dir(real, source="real")
    synthetic = data_home() / SYNTHETIC_DIR
    if _current(synthetic):
        try:
            return validate_cifar_dir(synthetic, source="synthetic")
        except CifarFormatError:
            pass   # perhaps replaced under us this instant: look again while holding the lock
    if not generate and not _current(synthetic):
        raise CifarFormatError(f"No CIFAR-10 found in {data_home()}; run `python -m course_utils.data --regenerate`.")
    with _locked(synthetic):
        if not _current(synthetic):
            write_synthetic_cifar10(synthetic, locked=True, progress=progress)
        return validate_cifar_dir(synthetic, source="synthetic")


# -- the dataset and its transforms --------------------------------------------------------

def baseline_transform():
    """The source articles' baseline training transform (lesson 00): pad-4 random crop, horizontal flip,
    ToTensor, Normalize."""
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


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd, rename_exchange = -100, 2
        done = libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
        return done == 0
    except (AttributeError, OSError):
        return False


def write_synthetic_cifar10(dest, *, seed: int = 2024, locked: bool = False, progress=None) -> CifarInfo:
    """Write the deterministic synthetic dataset into `dest`.

    It is written into a temporary folder beside `dest` with each file's sha256 in its marker,
    then moved into place in one step: renamed when `dest` does not exist yet, swapped with the
    old folder atomically when it does (so a reader never sees `dest` missing or half written),
    and another process preparing it at the same time waits on a lock instead of racing."""
    dest = Path(dest)
    if not locked:
        with _locked(dest):
            return write_synthetic_cifar10(dest, seed=seed, locked=True, progress=progress)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(dest.parent).free
        if free < SYNTHETIC_BYTES + (64 << 20):
            raise OSError(errno.ENOSPC, "No space left on device")
        tmp = Path(tempfile.mkdtemp(prefix=".synthetic-", dir=dest.parent))
    except OSError as exc:
        raise _disk_error(exc, dest.parent) from None
    try:
        sums = []
        for i, name in enumerate(TRAIN_FILES + TEST_FILES):
            blob = _synthetic_file(seed + i)
            (tmp / name).write_bytes(blob)
            sums.append(f"sha256 {name} {hashlib.sha256(blob).hexdigest()}\n")
            if progress is not None:
                progress(i + 1, len(TRAIN_FILES + TEST_FILES), name)
        (tmp / META_FILE).write_text("\n".join(SYNTHETIC_CLASSES) + "\n")
        (tmp / SYNTHETIC_MARKER).write_text(
            f"version {SYNTHETIC_VERSION}\nseed {seed}\n" + "".join(sums) +
            "A synthetic stand-in for CIFAR-10 written by course_utils.data in the real binary format.\n"
            "Classes are textures x palettes, not photographs. Put real CIFAR-10 in "
            "data/cifar-10-batches-bin to use it instead.\n")
        for f in tmp.iterdir():
            with open(f, "rb") as handle:
                os.fsync(handle.fileno())
        if not dest.exists():
            try:
                tmp.rename(dest)
            except OSError:
                if not dest.exists():
                    raise
                # it appeared meanwhile (a writer that took no lock): keep the finished one
        elif not _exchange(tmp, dest):
            old = Path(tempfile.mkdtemp(prefix=".old-", dir=dest.parent))
            dest.rename(old / "data")      # where atomic exchange is missing, the gap is this one rename
            tmp.rename(dest)
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise _disk_error(exc, dest.parent) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)   # the temporary folder, or the old data swapped into it
    _VERIFIED.pop(str(dest), None)
    return validate_cifar_dir(dest, source="synthetic")


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


def _regenerate_target(folder) -> Path:
    """Where `--regenerate` writes: the folder given, else COURSE_DATA's, else the default."""
    if folder:
        target = Path(folder).expanduser()
    elif os.environ.get("COURSE_DATA"):
        target = Path(os.environ["COURSE_DATA"]).expanduser()
    else:
        return data_home() / SYNTHETIC_DIR
    if target.is_dir() and any(target.iterdir()) and not (target / SYNTHETIC_MARKER).exists():
        raise CifarFormatError(f"{target} holds files that are not the course's generated dataset (real "
                               "CIFAR-10?); it was left alone. Re-extract cifar-10-binary.tar.gz there, or "
                               "regenerate into an empty folder.")
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.data", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--regenerate", nargs="?", const="", metavar="FOLDER",
                       help="rewrite the generated dataset (into FOLDER, else COURSE_DATA's folder, else data/)")
    group.add_argument("--download", action="store_true", help="download the real CIFAR-10 binary files")
    args = parser.parse_args(argv)
    try:
        if args.regenerate is not None:
            info = write_synthetic_cifar10(_regenerate_target(args.regenerate))
        elif args.download:
            info = download_cifar10()
        else:
            info = prepare_cifar10()
    except CifarFormatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(info.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
