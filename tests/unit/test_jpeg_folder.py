"""course_utils.jpeg_folder: the generated ImageNet-style folder of JPEGs."""
import numpy as np
import pytest
from PIL import Image

from course_utils import data
from course_utils.jpeg_folder import jpeg_folder, list_jpeg_folder, write_jpeg_folder


def test_writes_class_folders_of_jpegs_of_varied_sizes(tmp_path):
    folder = write_jpeg_folder(tmp_path / "jpegs", images_per_class=3, short_side=(48, 64), seed=1)
    info = data.prepare_cifar10()
    assert folder.classes == tuple(sorted(info.classes))
    assert len(folder) == 30 and folder.labels.count(0) == 3
    sizes = set()
    for path, label in zip(folder.files, folder.labels):
        assert path.parent.name == folder.classes[label]
        with Image.open(path) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            w, h = im.size
        assert 48 <= min(h, w) <= 64 and 0.7 < w / h < 1.45
        sizes.add((h, w))
    assert len(sizes) > 10          # varied sizes, as in ImageNet
    assert folder.total_bytes() > 0 and "30 JPEGs in 10 class folders" in folder.describe()


def test_is_cached_and_regenerated_when_parameters_change(tmp_path):
    dest = tmp_path / "cached"
    first = jpeg_folder(dest, images_per_class=2, short_side=(40, 50))
    stamp = first.files[0].stat().st_mtime_ns
    again = jpeg_folder(dest, images_per_class=2, short_side=(40, 50))
    assert again.files == first.files and again.files[0].stat().st_mtime_ns == stamp
    other = jpeg_folder(dest, images_per_class=1, short_side=(40, 50))
    assert len(other) == 10


def test_labels_follow_sorted_folder_names(tmp_path):
    for name in ["zebra", "Apple", "mango"]:
        (tmp_path / name).mkdir()
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / name / "a.jpg")
    (tmp_path / "mango" / "notes.txt").write_text("not an image")
    folder = list_jpeg_folder(tmp_path)
    assert folder.classes == ("Apple", "mango", "zebra")
    assert folder.labels == (0, 1, 2) and len(folder) == 3
    with pytest.raises(FileNotFoundError):
        list_jpeg_folder(tmp_path / "Apple")
