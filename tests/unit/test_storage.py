"""course_utils.storage: the same images in six formats, read back and timed (lesson 04)."""
import io
import sys

import numpy as np
import pytest
from PIL import Image

from course_utils import storage
from course_utils.hardware import disk_of


@pytest.fixture
def images():
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:48, 0:48]
    base = np.stack([yy * 5, xx * 5, (yy + xx) * 2], axis=-1).astype(np.uint8)
    return np.stack([np.clip(base.astype(int) + rng.integers(-8, 9, base.shape), 0, 255).astype(np.uint8)
                     for _ in range(12)])


def test_every_format_holds_the_same_images(images, tmp_path):
    stored = storage.write_formats(images, tmp_path / "formats")
    assert list(stored) == list(storage.FORMATS)
    jpeg_bytes = None
    for name, fmt in stored.items():
        assert fmt.count == 12 and fmt.size_on_disk() > 0 and fmt.description
        reader = fmt.open()
        try:
            items = [reader.get(i) for i in range(12)]
        finally:
            reader.close()
        if fmt.encoded:
            jpeg_bytes = jpeg_bytes or items
            assert items == jpeg_bytes, f"{name} does not hold the same JPEG bytes"
            decoded = storage.decode_jpeg(items[3])
            assert decoded.shape == images[3].shape and np.abs(decoded.astype(int) - images[3]).mean() < 6
        else:
            assert all(np.array_equal(a, b) for a, b in zip(items, images)), f"{name} changed the pixels"
    assert stored["jpeg-files"].size_on_disk() >= stored["packed-jpeg"].size_on_disk() - 4096   # blocks per file
    assert stored["raw-memmap"].size_on_disk() >= images.nbytes


def test_measuring_gives_every_figure(images, tmp_path):
    stored = storage.write_formats(images, tmp_path / "formats", formats=("packed-jpeg", "raw-memmap"))
    results = storage.measure_formats(stored, random_reads=8, repeats=1)
    assert [r.name for r in results] == ["packed-jpeg", "raw-memmap"]
    jpeg, raw = results
    assert jpeg.decode_us > 0 and raw.decode_us == 0
    assert raw.bytes_per_image > 4 * jpeg.bytes_per_image * 0.5 and raw.ready_warm_per_s > 0
    cold_possible = sys.platform.startswith("linux") and disk_of(tmp_path).fstype not in ("tmpfs", "ramfs")
    if cold_possible:
        assert jpeg.read_cold_us is not None and jpeg.random_cold_us is not None and jpeg.ready_cold_per_s > 0
    bandwidth = np.array([1.0, 10.0, 1e5])
    model = storage.images_per_s_model(jpeg, bandwidth, cores=2)
    assert model[0] == pytest.approx(1e6 / jpeg.bytes_per_image)          # the disk is the limit
    assert model[-1] == pytest.approx(2 * jpeg.ready_warm_per_s)          # the cores are the limit
    assert (np.diff(model) >= 0).all()


def test_formats_without_their_package_are_left_out(images, tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "_available", lambda module: module != "lmdb")
    stored = storage.write_formats(images, tmp_path / "formats")
    assert "lmdb-jpeg" not in stored and "hdf5-jpeg" in stored


def test_images_for_storage_crops_the_centre(tmp_path):
    picture = np.zeros((60, 90, 3), np.uint8)
    picture[:, 30:60] = 255                        # a white band in the middle third
    path = tmp_path / "band.png"
    Image.fromarray(picture).save(path)
    out = storage.images_for_storage([path], size=30)
    assert out.shape == (1, 30, 30, 3) and out.dtype == np.uint8
    assert out[0, :, 10:20].min() > 200 and out[0, :, :3].max() < 50     # the band, in the middle of the crop


def test_write_formats_rejects_wrong_shapes(tmp_path):
    with pytest.raises(ValueError):
        storage.write_formats(np.zeros((3, 8, 8), np.uint8), tmp_path / "x")
