import numpy as np
import pytest
import torch

from course_utils import data


@pytest.fixture(scope="module")
def info():
    return data.prepare_cifar10()


def _fake_dir(tmp_path, records_per_file=data.RECORDS_PER_FILE, sizes=None):
    root = tmp_path / "cifar"
    root.mkdir(parents=True)
    for name in data.TRAIN_FILES + data.TEST_FILES:
        size = (sizes or {}).get(name, records_per_file * data.RECORD_BYTES)
        (root / name).write_bytes(bytes(size))
    (root / "batches.meta.txt").write_text("\n".join(f"c{i}" for i in range(10)) + "\n")
    return root


def test_the_default_dataset_has_the_real_layout(info):
    assert info.n_train == 50_000 and info.n_test == 10_000 and len(info.classes) == 10
    for name in data.TRAIN_FILES + data.TEST_FILES:
        assert (info.root / name).stat().st_size == 30_730_000
    if info.synthetic:
        assert "SYNTHETIC" in info.describe()


def test_records_decode_to_images_and_labels(info):
    records = data.read_records(info.root / "test_batch.bin")
    assert records.shape == (10_000, 3073)
    images, labels = data.decode_records(records[:5])
    assert images.shape == (5, 32, 32, 3) and images.dtype == np.uint8
    assert np.array_equal(labels, records[:5, 0])
    # red plane of record 0, pixel (row 2, column 7)
    assert images[0, 2, 7, 0] == records[0, 1 + 2 * 32 + 7]
    assert images[0, 2, 7, 2] == records[0, 1 + 2048 + 2 * 32 + 7]


def test_classes_are_balanced_and_learnable_structure_exists(info):
    images, labels = data.load_cifar10_arrays(info.root, train=True, limit=5000)
    assert len(labels) == 5000 and set(np.unique(labels)) == set(range(10))
    if info.synthetic:  # warm and cool palettes differ in the red-blue balance
        rb = images[..., 0].astype(float).mean((1, 2)) - images[..., 2].astype(float).mean((1, 2))
        assert rb[labels % 2 == 0].mean() > rb[labels % 2 == 1].mean() + 5


def test_synthetic_images_are_deterministic():
    a = data._synthetic_images(np.arange(10), np.random.default_rng(7))
    b = data._synthetic_images(np.arange(10), np.random.default_rng(7))
    assert a.dtype == np.uint8 and a.shape == (10, 32, 32, 3) and np.array_equal(a, b)


def test_a_truncated_file_names_itself_its_size_and_the_fix(tmp_path):
    root = _fake_dir(tmp_path, sizes={"data_batch_3.bin": 30_000_000})
    with pytest.raises(data.CifarFormatError) as err:
        data.validate_cifar_dir(root)
    msg = str(err.value)
    assert "data_batch_3.bin" in msg and "30,730,000" in msg and "truncated" in msg and "Re-extract" in msg


def test_a_missing_file_and_a_bad_meta_are_errors(tmp_path):
    root = _fake_dir(tmp_path)
    (root / "test_batch.bin").unlink()
    with pytest.raises(data.CifarFormatError, match="test_batch.bin is missing"):
        data.validate_cifar_dir(root)
    root2 = _fake_dir(tmp_path / "x")
    (root2 / "batches.meta.txt").write_text("a\nb\n")
    with pytest.raises(data.CifarFormatError, match="names 2 classes"):
        data.validate_cifar_dir(root2)


def test_course_data_env_points_at_a_folder(tmp_path, monkeypatch):
    root = _fake_dir(tmp_path)
    monkeypatch.setenv("COURSE_DATA", str(root))
    found = data.prepare_cifar10()
    assert found.root == root and not found.synthetic
    monkeypatch.setenv("COURSE_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(data.CifarFormatError, match="does not exist"):
        data.prepare_cifar10()


def test_dataset_and_baseline_transform(info):
    ds = data.CIFAR10Binary(train=False, limit=10, transform=data.baseline_transform())
    assert len(ds) == 10
    x, y = ds[3]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and 0 <= y < 10
    raw = data.CIFAR10Binary(train=False, limit=10)
    assert raw[3][0].size == (32, 32)


def test_regenerating_writes_the_marker(tmp_path):
    info = data.write_synthetic_cifar10(tmp_path / "syn", seed=3)
    assert info.synthetic and (tmp_path / "syn" / "SYNTHETIC.txt").read_text().startswith("version")
