"""A generated ImageNet-style folder of JPEGs, one subdirectory per class (lesson 04).

ImageNet is distributed as JPEG files of varied sizes in one folder per class, which is what
`torchvision.datasets.ImageFolder` and DALI's `fn.readers.file` read. Nothing is downloaded:
`jpeg_folder()` writes such a folder under `data/` from the course's CIFAR-10 records (the
real ones when present, else the synthetic default). Each image is a CIFAR image upscaled to a
random ImageNet-like size (shorter side in `short_side`, aspect ratio 3:4 to 4:3), with fine
noise added so that the JPEG carries texture to decode (an upscaled 32x32 image alone would
be unrealistically smooth and cheap to decode), saved at `quality`.

The folder is cached: a marker file records the parameters, and a folder written with the same
parameters is reused. `list_jpeg_folder()` lists it the way DALI's file reader labels it:
class folders in sorted order, label = position in that order.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import data

__all__ = ["JpegFolder", "jpeg_folder", "write_jpeg_folder", "list_jpeg_folder"]

MARKER = "JPEG_FOLDER.json"
VERSION = 1


@dataclass(frozen=True)
class JpegFolder:
    """A folder of JPEGs in class subdirectories: its root, classes (sorted), and files with
    labels (lesson 04)."""
    root: Path
    classes: tuple[str, ...]
    files: tuple[Path, ...]
    labels: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.files)

    def total_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)

    def describe(self) -> str:
        return (f"{len(self.files)} JPEGs in {len(self.classes)} class folders "
                f"({self.total_bytes() / 2**20:.1f} MiB) in {self.root}")


def list_jpeg_folder(root) -> JpegFolder:
    """List a class-per-subdirectory folder of JPEGs with the labels DALI's `fn.readers.file`
    gives (class folders sorted by name, label = index in that order; files sorted within)
    (lesson 04)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder")
    classes = tuple(sorted(p.name for p in root.iterdir() if p.is_dir()))
    if not classes:
        raise FileNotFoundError(f"{root} has no class subdirectories")
    files, labels = [], []
    for label, name in enumerate(classes):
        for f in sorted((root / name).iterdir()):
            if f.suffix.lower() in (".jpg", ".jpeg"):
                files.append(f)
                labels.append(label)
    return JpegFolder(root, classes, tuple(files), tuple(labels))


def _image_sizes(rng: np.random.Generator, n: int, short_side) -> list[tuple[int, int]]:
    lo, hi = short_side
    sizes = []
    for _ in range(n):
        short = int(rng.integers(lo, hi + 1))
        aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))   # width / height
        if aspect >= 1:
            h, w = short, int(round(short * aspect))
        else:
            h, w = int(round(short / aspect)), short
        sizes.append((h, w))
    return sizes


def write_jpeg_folder(dest, *, images_per_class: int = 20, short_side=(160, 320), quality: int = 90,
                      noise: float = 6.0, seed: int = 0, cifar_root=None) -> JpegFolder:
    """Write `images_per_class` JPEGs for each of CIFAR-10's ten classes into `dest/<class>/`
    (atomically: a temporary folder renamed into place). See the module docstring (lesson 04)."""
    from PIL import Image

    dest = Path(dest)
    info = data.prepare_cifar10(cifar_root)
    images, labels = data.load_cifar10_arrays(info.root, train=True, limit=min(50_000, 40 * images_per_class * 10))
    rng = np.random.default_rng(seed)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".jpeg-folder-", dir=dest.parent))
    try:
        for label, name in enumerate(info.classes):
            (tmp / name).mkdir()
            pool = np.nonzero(labels == label)[0]
            if len(pool) < images_per_class:
                raise ValueError(f"class {name} has {len(pool)} images, fewer than images_per_class={images_per_class}")
            chosen = rng.choice(pool, images_per_class, replace=False)
            for j, (index, (h, w)) in enumerate(zip(chosen, _image_sizes(rng, images_per_class, short_side))):
                big = np.asarray(Image.fromarray(images[index]).resize((w, h), Image.BICUBIC), np.float32)
                big += rng.normal(0.0, noise, big.shape).astype(np.float32)
                Image.fromarray(np.clip(big + 0.5, 0, 255).astype(np.uint8)).save(
                    tmp / name / f"{name}_{j:05d}.jpg", quality=quality)
        params = {"version": VERSION, "images_per_class": images_per_class, "short_side": list(short_side),
                  "quality": quality, "noise": noise, "seed": seed, "cifar": str(info.root),
                  "synthetic_cifar": info.synthetic}
        (tmp / MARKER).write_text(json.dumps(params, indent=1) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        try:
            tmp.rename(dest)
        except OSError:   # another process wrote the same folder first
            pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return list_jpeg_folder(dest)


def jpeg_folder(dest=None, *, images_per_class: int = 20, short_side=(160, 320), quality: int = 90,
                seed: int = 0) -> JpegFolder:
    """The generated JPEG folder for these parameters, written on first use and reused after
    (under `data/jpeg-folder-<n>x10-<lo>-<hi>-q<quality>/` unless `dest` is given; lesson 04)."""
    if dest is None:
        dest = data.data_home() / f"jpeg-folder-{images_per_class}x10-{short_side[0]}-{short_side[1]}-q{quality}"
    dest = Path(dest)
    marker = dest / MARKER
    if marker.exists():
        try:
            params = json.loads(marker.read_text())
        except ValueError:
            params = {}
        same = (params.get("version") == VERSION and params.get("images_per_class") == images_per_class
                and params.get("short_side") == list(short_side) and params.get("quality") == quality
                and params.get("seed") == seed)
        if same:
            folder = list_jpeg_folder(dest)
            if len(folder) == 10 * images_per_class:
                return folder
    return write_jpeg_folder(dest, images_per_class=images_per_class, short_side=short_side,
                             quality=quality, seed=seed)
