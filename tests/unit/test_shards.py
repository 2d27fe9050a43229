"""course_utils.shards: the course's dataset as WebDataset shards, split by rank and worker,
cached, resumed mid-epoch, and read by DALI (lessons 04 and 07)."""
import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from course_utils import shards

pytest.importorskip("webdataset")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(230, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=230)
    return images, labels


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory, data):
    return shards.write_shards(tmp_path_factory.mktemp("shards") / "rgb", *data, samples_per_shard=40)


def _key(image):
    return bytes(np.asarray(image).reshape(-1))


def test_written_in_the_webdataset_layout_and_read_back_by_the_library(shard_set, data):
    import tarfile
    images, labels = data
    assert shard_set.sizes == [40] * 5 + [30] and len(shard_set.files) == 6
    with tarfile.open(shard_set.files[1]) as tar:
        names = tar.getnames()
    assert names[:2] == ["00000040.cls", "00000040.rgb"]
    samples = list(shards.iter_shard(shard_set.files[1], start=3))
    assert len(samples) == 37 and samples[0]["__key__"] == "00000043"
    image, label = shards.decode_sample(samples[0])
    assert np.array_equal(image, images[43]) and label == labels[43]
    assert shards.open_shards(shard_set.root).sizes == shard_set.sizes


@pytest.mark.parametrize("world, workers", [(1, 0), (2, 2), (3, 2), (4, 1)])
def test_every_sample_once_and_equal_batches_per_rank(shard_set, data, world, workers):
    images, _ = data
    seen, counts = [], []
    for rank in range(world):
        reader = shards.ShardReader(shard_set, 16, seed=3, rank=rank, world_size=world)
        reader.set_epoch(2)
        batches = list(DataLoader(reader, batch_size=None, num_workers=workers))
        counts.append(len(batches))
        assert all(1 <= len(y) <= 16 for _, y in batches)
        seen += [_key(x) for b, _ in batches for x in b]
    assert counts == [math.ceil(230 / (world * 16))] * world
    assert sorted(seen) == sorted(_key(x) for x in images)


def test_the_split_changes_with_the_epoch_and_follows_the_seed(shard_set):
    first = shards.epoch_batches(shard_set.sizes, 16, rank=0, world_size=2, epoch=0, seed=1)
    assert first == shards.epoch_batches(shard_set.sizes, 16, rank=0, world_size=2, epoch=0, seed=1)
    assert {s for b in first for s in b} != {s for b in shards.epoch_batches(shard_set.sizes, 16, rank=0, world_size=2,
                                                                            epoch=1, seed=1) for s in b}
    shards_read = {s for b in first for s, _ in b}
    assert len(shards_read) <= 4          # about half of the 6 shards, not all of them


def test_resume_with_set_epoch_start_and_with_stateful_dataloader(shard_set):
    pytest.importorskip("torchdata")
    from torchdata.stateful_dataloader import StatefulDataLoader
    reader = shards.ShardReader(shard_set, 16, seed=5, rank=1, world_size=2)
    reader.set_epoch(1)
    full = [y.tolist() for _, y in DataLoader(reader, batch_size=None, num_workers=2)]
    reader.set_epoch(1, start=3)
    assert [y.tolist() for _, y in DataLoader(reader, batch_size=None, num_workers=2)] == full[3:]
    reader.set_epoch(1)
    loader = StatefulDataLoader(reader, batch_size=None, num_workers=2)
    it = iter(loader)
    head = [next(it)[1].tolist() for _ in range(4)]
    state = loader.state_dict()
    del it
    again = StatefulDataLoader(reader, batch_size=None, num_workers=2)
    again.load_state_dict(state)
    assert head + [y.tolist() for _, y in again] == full         # nothing repeated, nothing skipped


def test_the_library_splitter_gives_unequal_batches_and_idle_workers(shard_set):
    # 6 shards of 40/30 samples over 4 ranks x 2 workers: ranks 2 and 3 get one shard each
    per_rank = [sum(shards.library_split(shard_set, rank=r, world_size=4, num_workers=2, batch_size=16))
                for r in range(4)]
    assert len(set(per_rank)) > 1
    assert 0 in shards.library_split(shard_set, rank=3, world_size=4, num_workers=2, batch_size=16)


def test_cache_copies_once_and_atomically(shard_set, tmp_path):
    cached, first = shards.cache_shards(shard_set, tmp_path / "cache")
    assert first["copied"] == 6 and first["kept"] == 0
    again, second = shards.cache_shards(shard_set, tmp_path / "cache")
    assert second == {"copied": 0, "kept": 6, "bytes_copied": 0}
    assert not list((tmp_path / "cache").glob(".*part"))
    assert [f.read_bytes() for f in cached.files] == [f.read_bytes() for f in shard_set.files]


def test_the_course_answer_refuses_to_run_in_a_check(monkeypatch, shard_set):
    monkeypatch.setenv(shards.GRADING_ENV, "1")
    with pytest.raises(RuntimeError, match="course's implementation"):
        shards.epoch_batches(shard_set.sizes, 16, rank=0, world_size=2, epoch=0)


def test_measure_sources_reads_every_image(shard_set, data, tmp_path):
    images, labels = data
    jpegs = shards.write_jpeg_files(tmp_path / "jpeg", images, labels)
    results = shards.measure_sources({"shards": (shards.ShardReader(shard_set, 32), shard_set.files),
                                      "jpeg": (jpegs, jpegs.files)}, batch_size=32, num_workers=0, epochs=1)
    assert [r.name for r in results] == ["shards", "jpeg"]
    assert all(r.images == 230 and r.warm_per_s > 0 for r in results)


def test_dali_reads_the_shards(shard_set, data):
    pytest.importorskip("nvidia.dali")
    images, labels = data
    indexes = shards.write_dali_indexes(shard_set)
    pipe = shards.dali_webdataset_pipeline(shard_set, 50, index_files=indexes, num_shards=2, shard_id=1)
    pipe.build()
    out = pipe.run()
    got = np.array(out[0].as_tensor())
    first = int(np.ceil(230 / 2))            # DALI's shard 1 starts half way through the samples
    assert np.array_equal(got, images[first:first + 50])
    assert np.array(out[1].as_tensor()).ravel().tolist() == labels[first:first + 50].tolist()


def test_library_split_is_what_webdataset_itself_deals(shard_set, monkeypatch):
    """`library_split` models webdataset's split_by_node + split_by_worker: the library, run for
    real (rank and world from the environment, as under torchrun), yields those batch counts."""
    import webdataset as wds
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "4")
        dataset = wds.WebDataset(shard_set.urls, nodesplitter=wds.split_by_node, shardshuffle=False,
                                 empty_check=False).to_tuple("rgb", "cls").batched(16, partial=True)
        batches = list(DataLoader(dataset, batch_size=None, num_workers=2))
        assert len(batches) == sum(shards.library_split(shard_set, rank=rank, world_size=4, num_workers=2,
                                                        batch_size=16))
