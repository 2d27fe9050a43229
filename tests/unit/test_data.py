import errno
import os

import numpy as np
import pytest
import torch

from course_utils import data


@pytest.fixture(scope="module")
def info():
    return data.prepare_cifar10()


def _records(seed: int, n: int = data.RECORDS_PER_FILE) -> bytes:
    """n records with labels 0-9 in turn and made-up pixels (fast; not the generated default)."""
    records = np.empty((n, data.RECORD_BYTES), np.uint8)
    records[:, 0] = np.arange(n) % 10
    records[:, 1:] = ((seed * 7 + np.arange(data.RECORD_BYTES - 1)) % 251).astype(np.uint8)
    return records.tobytes()


def _fake_dir(tmp_path, records_per_file=data.RECORDS_PER_FILE, sizes=None):
    root = tmp_path / "cifar"
    root.mkdir(parents=True)
    for i, name in enumerate(data.TRAIN_FILES + data.TEST_FILES):
        size = (sizes or {}).get(name, records_per_file * data.RECORD_BYTES)
        blob = _records(i, records_per_file)
        (root / name).write_bytes(blob[:size] + bytes(max(0, size - len(blob))))
    (root / "batches.meta.txt").write_text("\n".join(f"c{i}" for i in range(10)) + "\n")
    return root


@pytest.fixture
def cheap_generator(monkeypatch):
    """The generated default's writer with fast made-up records (its format, sizes and checksums)."""
    monkeypatch.setattr(data, "_synthetic_file", _records)


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


def test_regenerating_writes_the_marker_with_checksums(tmp_path, cheap_generator):
    seen = []      # w4-01: lesson 00's hardware cell wrote the dataset silently for 16 s: it prints each file now
    info = data.write_synthetic_cifar10(tmp_path / "syn", seed=3, progress=lambda i, n, name: seen.append((i, n, name)))
    assert seen == [(i + 1, 6, name) for i, name in enumerate(data.TRAIN_FILES + data.TEST_FILES)]
    marker = (tmp_path / "syn" / "SYNTHETIC.txt").read_text()
    assert info.synthetic and marker.startswith(f"version {data.SYNTHETIC_VERSION}\n")
    assert marker.count("sha256 ") == 6
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".synthetic-")], "no temporary folder is left"


# -- wrong content of the right size ---------------------------------------------------------

def test_random_bytes_of_the_right_size_are_refused_naming_the_file_and_the_label(tmp_path):
    root = _fake_dir(tmp_path)
    junk = np.random.default_rng(0).integers(0, 256, data.FILE_BYTES, dtype=np.uint8)
    (root / "data_batch_2.bin").write_bytes(junk.tobytes())
    with pytest.raises(data.CifarFormatError) as err:
        data.validate_cifar_dir(root)
    msg = str(err.value)
    assert "data_batch_2.bin is not CIFAR-10 data" in msg and "labels are 0-9" in msg and "Re-extract" in msg
    assert msg.count(". ") <= 3 and "\n" not in msg


def test_a_zero_filled_file_is_refused(tmp_path):
    root = _fake_dir(tmp_path)
    (root / "test_batch.bin").write_bytes(bytes(data.FILE_BYTES))
    with pytest.raises(data.CifarFormatError, match="test_batch.bin is not CIFAR-10 data: .* only 1 of the ten classes"):
        data.validate_cifar_dir(root)


def test_a_changed_generated_file_fails_its_recorded_checksum_with_a_fix_for_that_folder(tmp_path, cheap_generator):
    root = tmp_path / "syn"
    data.write_synthetic_cifar10(root)
    with open(root / "data_batch_4.bin", "r+b") as f:   # one pixel, labels untouched
        f.seek(5 * data.RECORD_BYTES + 100)
        f.write(b"\x00")
    with pytest.raises(data.CifarFormatError) as err:
        data.validate_cifar_dir(root)
    msg = str(err.value)
    assert "data_batch_4.bin does not match the checksum recorded" in msg
    assert f"`python -m course_utils.data --regenerate {root}`" in msg


def test_with_course_data_set_the_suggested_fix_works_for_that_folder(tmp_path, monkeypatch, cheap_generator, capsys):
    shared = tmp_path / "shared"
    data.write_synthetic_cifar10(shared)
    (shared / "data_batch_1.bin").write_bytes(_records(99))          # right size, other content
    monkeypatch.setenv("COURSE_DATA", str(shared))
    with pytest.raises(data.CifarFormatError) as err:
        data.prepare_cifar10()
    fix = str(err.value).split("`")[1]
    assert fix == f"python -m course_utils.data --regenerate {shared}"
    assert data.main(fix.split()[3:]) == 0                            # the suggested command, as given
    assert data.prepare_cifar10().root == shared
    assert data.main(["--regenerate"]) == 0                           # bare: COURSE_DATA's folder, not data/
    assert str(shared) in capsys.readouterr().out
    real = _fake_dir(tmp_path / "real")
    (real / "data_batch_1.bin").write_bytes(bytes(data.FILE_BYTES))
    monkeypatch.setenv("COURSE_DATA", str(real))
    with pytest.raises(data.CifarFormatError, match="unset COURSE_DATA"):
        data.prepare_cifar10()
    assert data.main(["--regenerate"]) == 1                           # real files are never overwritten
    assert "left alone" in capsys.readouterr().err


# -- disks that cannot take it ------------------------------------------------------------------

def test_a_full_disk_is_one_sentence(tmp_path, monkeypatch, cheap_generator, capsys):
    monkeypatch.setattr(data.shutil, "disk_usage", lambda p: type("U", (), {"free": 10 << 20})())
    with pytest.raises(data.DataPreparationError) as err:
        data.write_synthetic_cifar10(tmp_path / "syn")
    assert str(err.value).startswith(f"Cannot write the generated CIFAR-10 into {tmp_path}: the disk is full")
    assert "COURSE_DATA_HOME" in str(err.value)
    monkeypatch.setenv("COURSE_DATA_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("COURSE_DATA", raising=False)
    assert data.main([]) == 1
    err_text = capsys.readouterr().err
    assert err_text.startswith("error: Cannot write") and err_text.count("\n") == 1 and "Traceback" not in err_text


def test_a_disk_that_fills_up_while_writing_leaves_nothing_behind(tmp_path, monkeypatch, cheap_generator):
    real_write = data.Path.write_bytes

    def write_bytes(self, blob):
        if self.name == "data_batch_3.bin":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, blob)
    monkeypatch.setattr(data.Path, "write_bytes", write_bytes)
    with pytest.raises(data.DataPreparationError, match="the disk is full"):
        data.write_synthetic_cifar10(tmp_path / "syn")
    assert [p.name for p in tmp_path.iterdir()] == [".syn.lock"]


def test_a_read_only_disk_is_one_sentence(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(data.tempfile, "mkdtemp", read_only)
    with pytest.raises(data.DataPreparationError, match=r"into .*: the disk is read-only\. Set COURSE_DATA_HOME"):
        data.write_synthetic_cifar10(tmp_path / "syn")
    monkeypatch.setattr(data.tempfile, "mkdtemp", lambda *a, **k: (_ for _ in ()).throw(PermissionError(errno.EACCES, "denied")))
    with pytest.raises(data.DataPreparationError, match="this user may not write there"):
        data.write_synthetic_cifar10(tmp_path / "syn")


def test_errors_show_as_one_sentence_in_a_notebook():
    err = data.CifarFormatError("x.bin is missing.")
    assert err._render_traceback_() == ["CifarFormatError: x.bin is missing."]


# -- several processes at once (real processes) --------------------------------------------------

_WORKER = r'''
import os, sys, time, types
from pathlib import Path
import numpy as np
# What is tested is file handling; torch (which course_utils.data imports for its Dataset class)
# would cost each process seconds of import: a stand-in module is enough here.
torch, utils, tud = types.ModuleType("torch"), types.ModuleType("torch.utils"), types.ModuleType("torch.utils.data")
tud.Dataset, torch.utils, utils.data = object, utils, tud
sys.modules.update({"torch": torch, "torch.utils": utils, "torch.utils.data": tud})
from course_utils import data

def records(seed, n=data.RECORDS_PER_FILE):
    r = np.empty((n, data.RECORD_BYTES), np.uint8)
    r[:, 0] = np.arange(n) % 10
    r[:, 1:] = ((seed * 7 + np.arange(data.RECORD_BYTES - 1)) % 251).astype(np.uint8)
    return r.tobytes()

def generate(seed):
    with open(os.environ["GEN_LOG"], "a") as f:
        f.write(f"{os.getpid()}\n")
    return records(seed)

data._synthetic_file = generate
role, peers, work = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
(work / f"ready-{os.getpid()}").touch()          # start together, once everyone has imported
while len(list(work.glob("ready-*"))) < peers:
    time.sleep(0.01)
dest = data.data_home() / data.SYNTHETIC_DIR
if role == "prepare":
    data.prepare_cifar10()
elif role == "regenerate":
    for _ in range(2):
        data.write_synthetic_cifar10(dest)
(work / f"done-{os.getpid()}").touch()
problems, reads = [], 0
end = time.time() + 60
while time.time() < end:   # read until every writer is done: never missing, never half there
    finished = len(list(work.glob("done-*"))) >= peers
    try:
        data._VERIFIED.clear()
        data.validate_cifar_dir(dest)
        np.asarray(data.read_records(dest / "test_batch.bin")[:2])
        reads += 1
    except Exception as exc:
        problems.append(f"{type(exc).__name__}: {exc}")
    if finished and reads:
        break
print("PROBLEMS", len(problems), problems[:2], "READS", reads)
'''


def _spawn(tmp_path, role, peers):
    import subprocess
    import sys as _sys
    env = dict(os.environ, COURSE_DATA_HOME=str(tmp_path / "home"), GEN_LOG=str(tmp_path / "gen.log"))
    env.pop("COURSE_DATA", None)
    return subprocess.Popen([_sys.executable, "-c", _WORKER, role, str(peers), str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_processes_preparing_at_once_write_it_once_and_never_lose_it(tmp_path):
    procs = [_spawn(tmp_path, "prepare", 2) for _ in range(2)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert all("PROBLEMS 0 " in out for out in outs), outs
    writers = set((tmp_path / "gen.log").read_text().split())
    assert len(writers) == 1, f"the dataset was generated by {len(writers)} processes"
    assert data.validate_cifar_dir(tmp_path / "home" / data.SYNTHETIC_DIR).synthetic


def test_a_reader_never_sees_the_dataset_missing_while_it_is_regenerated(tmp_path, cheap_generator):
    data.write_synthetic_cifar10(tmp_path / "home" / data.SYNTHETIC_DIR)
    reader, writer = _spawn(tmp_path, "read", 2), _spawn(tmp_path, "regenerate", 2)
    out_w, out_r = writer.communicate(timeout=240)[0], reader.communicate(timeout=240)[0]
    assert writer.returncode == 0 and reader.returncode == 0, (out_w, out_r)
    assert len((tmp_path / "gen.log").read_text().split()) == 12   # two whole regenerations happened
    assert "PROBLEMS 0 " in out_r, out_r
