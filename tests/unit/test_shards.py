"""course_utils.shards: the course's dataset as WebDataset shards, split by rank and worker,
cached, resumed mid-epoch, and read by DALI (lessons 04 and 07).

The properties issue 34 asks for are measured from outside the course's code: the bytes each
DataLoader worker process read (the kernel's per-process counter, /proc/PID/io), the sizes of the
batches that come out, which samples share a batch in two epochs, and what a rank of a real
two-process group reads through spawned workers."""
import collections
import math
import multiprocessing as mp
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from course_utils import shards

pytest.importorskip("webdataset")

BIG_N, BIG_SHARD, BIG_BATCH = 6000, 500, 64          # the measurement: 12 shards of 500, batch 64


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(230, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=230)
    return images, labels


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory, data):
    return shards.write_shards(tmp_path_factory.mktemp("shards") / "rgb", *data, samples_per_shard=40)


@pytest.fixture(scope="module")
def big_set(tmp_path_factory):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(BIG_N, 32, 32, 3), dtype=np.uint8)
    return shards.write_shards(tmp_path_factory.mktemp("big") / "rgb", images, rng.integers(0, 10, BIG_N),
                               samples_per_shard=BIG_SHARD)


def _key(image):
    return bytes(np.asarray(image).reshape(-1))


def _quiet_loader(dataset, workers, **kw):
    with warnings.catch_warnings():          # more workers than this machine's 2 cores: on purpose
        warnings.simplefilter("ignore")
        return DataLoader(dataset, batch_size=None, num_workers=workers, **kw)


def test_written_in_the_webdataset_layout_with_a_manifest(shard_set, data):
    import tarfile
    images, labels = data
    assert shard_set.sizes == [40] * 5 + [30] and len(shard_set.files) == 6
    with tarfile.open(shard_set.files[1]) as tar:
        names = tar.getnames()
    assert names[:2] == ["00000040.cls", "00000040.rgb"]
    samples = list(shards.iter_shard(shard_set.files[1], start=3))       # the library reads them back
    assert len(samples) == 37 and samples[0]["__key__"] == "00000043"
    image, label = shards.decode_sample(samples[0])
    assert np.array_equal(image, images[43]) and label == labels[43]
    opened = shards.open_shards(shard_set.root)                         # from the manifest alone
    assert opened.sizes == shard_set.sizes and opened.sha256 == shard_set.sha256
    assert opened.offsets[1][3] == tarfile.open(shard_set.files[1]).getmember("00000043.cls").offset
    scanned = shards.open_shards(shard_set.root, scan=True)
    assert scanned.offsets == shard_set.offsets and scanned.nbytes == [f.stat().st_size for f in shard_set.files]


@pytest.mark.parametrize("world, workers", [(1, 0), (2, 2), (3, 2), (4, 1)])
def test_equal_counts_of_full_batches_and_each_policy(shard_set, data, world, workers):
    images, _ = data
    n, b = 230, 16
    for last in shards.POLICIES:
        seen, counts, sizes = [], [], collections.Counter()
        for rank in range(world):
            reader = shards.ShardReader(shard_set, b, seed=3, rank=rank, world_size=world, last=last)
            reader.set_epoch(2)
            batches = list(_quiet_loader(reader, workers))
            counts.append(len(batches))
            sizes.update(len(y) for _, y in batches)
            seen += [_key(x) for xs, _ in batches for x in xs]
        uses = collections.Counter(seen)
        assert len(set(counts)) == 1, (last, counts)
        if last == "drop":
            assert counts[0] == n // (world * b) and set(sizes) == {b}
            assert max(uses.values()) == 1 and n - len(uses) < world * b
        elif last == "pad":
            assert counts[0] == math.ceil(n / (world * b)) and set(sizes) == {b}
            assert len(uses) == n and sum(uses.values()) - n < world * b
        else:
            assert counts[0] == math.ceil(n / (world * b)) and max(sizes) <= b
            assert sorted(seen) == sorted(_key(x) for x in images)


def test_drop_leaves_out_other_samples_every_epoch(shard_set):
    left_out = []
    for epoch in range(3):
        got = {p for r in range(2) for b in shards.epoch_batches(shard_set.sizes, 16, rank=r, world_size=2,
                                                                  epoch=epoch, seed=1) for p in b}
        left_out.append({(s, i) for s, n in enumerate(shard_set.sizes) for i in range(n)} - got)
    assert all(0 < len(x) < 2 * 16 for x in left_out)
    assert left_out[0] != left_out[1] != left_out[2]


def test_the_split_changes_with_the_epoch_and_each_rank_reads_a_stretch(shard_set):
    first = shards.epoch_batches(shard_set.sizes, 16, rank=0, world_size=2, epoch=0, seed=1)
    assert first == shards.epoch_batches(shard_set.sizes, 16, rank=0, world_size=2, epoch=0, seed=1)
    assert {s for b in first for s in b} != {s for b in shards.epoch_batches(shard_set.sizes, 16, rank=0, world_size=2,
                                                                            epoch=1, seed=1) for s in b}
    assert len({s for b in first for s, _ in b}) <= 4          # about half of the 6 shards, not all of them


def test_the_plan_is_arithmetic_on_cumulative_sizes():
    # a 2 x 8 GPU job on 1,281 shards of 1,000: the rank's part is two numbers, not a list per worker
    sizes = [1000] * 1281
    plan = shards.epoch_plan(sizes, 256, rank=13, world_size=16, epoch=4, seed=0)
    assert plan.batches == 1_281_000 // (16 * 256) and plan.first < 1_281_000
    start = plan.first + 100 * 256
    shard, index = plan.locate([start])[0]
    assert 0 <= index < 1000 and shard == plan.order[np.searchsorted(plan.cum, start, side="right") - 1]


def test_worker_runs_and_resume_skips_follow_the_dataloaders_turns():
    runs = shards.worker_runs(46, 4)
    assert runs == [(0, 12), (12, 24), (24, 35), (35, 46)]
    # the DataLoader delivers worker w's j-th batch at position j*4 + w: after 7, 2 of worker 0's,
    # 2 of worker 1's, 2 of worker 2's, 1 of worker 3's
    assert shards.resume_skips(7, runs) == [2, 2, 2, 1]
    assert shards.resume_skips(46, runs) == [12, 12, 11, 11]


def test_shuffle_buffer_emits_a_permutation_after_initial(shard_set):
    order = shards.shuffle_order(500, 100, 30, np.random.default_rng(0))
    assert sorted(order.tolist()) == list(range(500))
    assert order[0] >= 0 and max(order[:10]) < 30 + 2 * 10             # nothing read far ahead at the start
    assert np.all(order <= np.arange(500) + 100)                         # never more than the buffer ahead
    assert np.mean(np.abs(order - np.arange(500))) > 20                  # and mixed well within it


def test_resume_with_set_epoch_start_and_with_stateful_dataloader(shard_set):
    pytest.importorskip("torchdata")
    from torchdata.stateful_dataloader import StatefulDataLoader
    for workers in (0, 2, 3):
        reader = shards.ShardReader(shard_set, 8, seed=5, rank=1, world_size=2)
        reader.set_epoch(1)
        full = [y.tolist() for _, y in _quiet_loader(reader, workers)]
        for start in (1, 3, 4):
            reader.set_epoch(1, start=start)
            assert [y.tolist() for _, y in _quiet_loader(reader, workers)] == full[start:], (workers, start)
        reader.set_epoch(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loader = StatefulDataLoader(reader, batch_size=None, num_workers=workers)
            it = iter(loader)
            head = [next(it)[1].tolist() for _ in range(4)]
            state = loader.state_dict()
            del it
            again = StatefulDataLoader(reader, batch_size=None, num_workers=workers)
            again.load_state_dict(state)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            tail = [y.tolist() for _, y in again]
        assert head + tail == full, workers                     # nothing repeated, nothing skipped
        assert not [w for w in said if "fast-forward" in str(w.message)]   # the dataset's own state, no replay


# -- the "Done when", measured from outside ---------------------------------------------------------

def _proc_rchar(pid) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar")


class StridedStream(IterableDataset):
    """The dealing the issue measured: worker w takes the rank's batches w, w+W, ... (every worker
    walks through the whole part to reach its own)."""

    def __init__(self, sizes, batch_size, rank, world):
        self.args = (sizes, batch_size, rank, world)

    def __iter__(self):
        sizes, b, rank, world = self.args
        info = get_worker_info()
        w, workers = (info.id, info.num_workers) if info else (0, 1)
        batches = shards.epoch_batches(sizes, b, rank=rank, world_size=world, epoch=0, last="exact")
        yield from batches[w::workers]


def _bytes_read_by_workers(reader, workers=4):
    """(bytes the DataLoader's worker processes read during one epoch, by the kernel's count of
    read() calls; keys yielded). The workers persist so their counters can be read afterwards."""
    loader = _quiet_loader(reader, workers, persistent_workers=True)
    it = iter(loader)
    pids = [w.pid for w in it._workers]
    before = {pid: _proc_rchar(pid) for pid in pids}       # workers are idle until the first batch is asked
    keys = [k.tolist() for _, _, k in it]
    read = sum(_proc_rchar(pid) - before[pid] for pid in pids)
    del it, loader
    return read, keys


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/PID/io counters")
def test_one_ranks_workers_read_each_byte_it_needs_about_once(big_set):
    reader = shards.ShardReader(big_set, BIG_BATCH, rank=1, world_size=2, keys=True)
    reader.set_epoch(0)
    read, keys = _bytes_read_by_workers(reader)
    touched = sorted({k // BIG_SHARD for batch in keys for k in batch})
    touched_bytes = sum(big_set.nbytes[s] for s in touched)
    assert read <= 1.5 * touched_bytes, f"{read / touched_bytes:.2f}x the bytes of the {len(touched)} shards it touches"
    assert read >= 0.5 * touched_bytes                      # the counter does see the reads
    # the measurement tells the two dealings apart: the strided one, read without an index
    naive = shards.ShardSet(big_set.root, big_set.files, big_set.sizes, big_set.encoding)     # no offsets
    strided = shards.ShardReader(naive, BIG_BATCH, stream=StridedStream(big_set.sizes, BIG_BATCH, 1, 2), keys=True)
    naive_read, _ = _bytes_read_by_workers(strided)
    assert naive_read > 2 * touched_bytes, f"{naive_read / touched_bytes:.2f}x"


def test_every_batch_has_batch_size_samples(big_set):
    for rank in range(2):
        reader = shards.ShardReader(big_set, BIG_BATCH, rank=rank, world_size=2, keys=True)
        reader.set_epoch(3)
        sizes = {len(k) for _, _, k in _quiet_loader(reader, 4)}
        assert sizes == {BIG_BATCH}


def _epoch_batches_of_both_ranks(big_set, epoch, **kw):
    out = []
    for rank in range(2):
        reader = shards.ShardReader(big_set, BIG_BATCH, rank=rank, world_size=2, keys=True, **kw)
        reader.set_epoch(epoch)
        out += [k.tolist() for _, _, k in _quiet_loader(reader, 4)]
    return out


def test_fewer_than_half_of_the_within_batch_neighbours_recur(big_set):
    """Neighbours: two samples next to each other in a batch, over the whole epoch (both ranks)."""
    shuffled = shards.neighbour_recurrence(*[_epoch_batches_of_both_ranks(big_set, e) for e in (0, 1)])
    shard_order_only = shards.neighbour_recurrence(*[_epoch_batches_of_both_ranks(big_set, e, shuffle_buffer=0)
                                                     for e in (0, 1)])
    assert shuffled < 0.5, shuffled
    assert shard_order_only > 0.9, shard_order_only        # what the measurement says of shard order alone


def _rank_reads(rank, store, root, out):
    """One rank of a two-process gloo group (no RANK/WORLD_SIZE in its environment): builds the
    course's reader in this (main) process, reads an epoch through 2 spawned workers."""
    import torch.distributed as dist
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        if rank == 1:           # rank 0 only makes the group (it would read its own part the same way)
            reader = shards.ShardReader(shards.open_shards(root), 16, keys=True)
            reader.set_epoch(0)
            loader = DataLoader(reader, batch_size=None, num_workers=2, multiprocessing_context="spawn", timeout=120)
            out.put([k for _, _, keys in loader for k in keys.tolist()])
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_a_stream_made_on_rank_1_of_2_deals_rank_1s_part_to_spawned_workers(shard_set, tmp_path):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_reads, args=(r, tmp_path / "store", shard_set.root, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = out.get(timeout=240)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    n, b = shard_set.count, 16
    assert len(got) == (n // (2 * b)) * b                          # its half, not all 230 samples
    expected = {40 * s + i for batch in shards.epoch_batches(shard_set.sizes, b, rank=1, world_size=2, epoch=0)
                for s, i in batch}
    rank0 = {40 * s + i for batch in shards.epoch_batches(shard_set.sizes, b, rank=0, world_size=2, epoch=0)
             for s, i in batch}
    assert set(got) == expected and not expected & rank0


def test_rank_is_resolved_in_the_main_process(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    stream = shards.ShardStream([10, 10], 4)
    assert (stream.rank, stream.world_size) == (1, 2)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    stream.set_epoch(1)                                    # read again at set_epoch, in the main process
    assert (stream.rank, stream.world_size) == (0, 1)
    with pytest.raises(ValueError, match="not in a world"):
        shards.ShardStream([10], 2, rank=2, world_size=2)


# -- the rest -------------------------------------------------------------------------------------------------

def test_the_library_splitter_gives_unequal_batches_and_idle_workers(shard_set):
    # 6 shards of 40/30 samples over 4 ranks x 2 workers: ranks 2 and 3 get one shard each
    per_rank = [sum(shards.library_split(shard_set, rank=r, world_size=4, num_workers=2, batch_size=16))
                for r in range(4)]
    assert len(set(per_rank)) > 1
    assert 0 in shards.library_split(shard_set, rank=3, world_size=4, num_workers=2, batch_size=16)


def test_cache_copies_once_per_node_with_a_content_check(shard_set, tmp_path):
    cached, first = shards.cache_shards(shard_set, tmp_path / "cache", local_rank=0)
    assert first["copied"] == 6 and first["kept"] == 0 and first["checked"] == 6
    again, second = shards.cache_shards(shard_set, tmp_path / "cache", local_rank=0)
    assert second == {"copied": 0, "kept": 6, "bytes_copied": 0, "checked": 6}
    assert not list((tmp_path / "cache").glob(".*part"))
    assert [f.read_bytes() for f in cached.files] == [f.read_bytes() for f in shard_set.files]
    # another rank of the node copies nothing and waits at the barrier
    met = []
    _, other = shards.cache_shards(shard_set, tmp_path / "cache2", local_rank=1, barrier=lambda: met.append(1))
    assert other["copied"] == 0 and met == [1] and not (tmp_path / "cache2").exists()
    # a damaged copy of the right size is found by its hash and copied again
    victim = cached.files[2]
    blob = bytearray(victim.read_bytes())
    blob[5000] ^= 0xFF
    victim.write_bytes(bytes(blob))
    _, third = shards.cache_shards(shard_set, tmp_path / "cache", local_rank=0)
    assert third["copied"] == 1 and victim.read_bytes() == shard_set.files[2].read_bytes()


def test_the_course_answer_refuses_to_run_in_a_check(monkeypatch, shard_set):
    monkeypatch.setenv(shards.GRADING_ENV, "1")
    with pytest.raises(RuntimeError, match="course's implementation"):
        shards.epoch_batches(shard_set.sizes, 16, rank=0, world_size=2, epoch=0)


def test_measure_sources_reads_every_image(shard_set, data, tmp_path):
    images, labels = data
    jpegs = shards.write_jpeg_files(tmp_path / "jpeg", images, labels)
    results = shards.measure_sources({"shards": (shards.ShardReader(shard_set, 32, last="exact"), shard_set.files),
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
    # int64 class indices, as F.cross_entropy wants them (a learner's walk found int32 here: issue 37)
    assert np.array(out[1].as_tensor()).dtype == np.int64


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


def test_the_split_comparison_measures_every_approach_and_reaches_spawned_workers(shard_set):
    """compare_splits on a small set (forked workers here); what a spawned worker would unpickle
    (dataset, sampler, collate and init functions) pickles."""
    import pickle
    pytest.importorskip("wids")
    for make in (lambda: shards._wds_loader(shard_set, 16, 1, 2, 2, 0, resampled=False),
                 lambda: shards._wds_loader(shard_set, 16, 1, 2, 2, 0, resampled=True),
                 lambda: shards._wids_loader(shard_set, 16, 1, 2, 2, 0),
                 lambda: shards._course_loader(shard_set, 16, 1, 2, 2, 0, "drop")):
        loader = make()
        pickle.dumps((loader.dataset, loader.sampler, loader.collate_fn, loader.worker_init_fn))
    rows = {r.name: r for r in shards.compare_splits(shard_set, 16, world=2, workers=2)}
    course = rows["course ShardReader (drop)"]
    assert course.batches_per_rank == [230 // 32] * 2 and course.batch_sizes == [16] and course.repeated == 0
    assert course.read_ratio is not None and course.read_ratio < 1.5
    assert rows["course ShardReader (drop, no shuffle buffer)"].recurrence > 0.5 > course.recurrence
    assert rows["webdataset: split_by_node + split_by_worker"].same_shards
    assert rows["webdataset: resampled + with_epoch"].repeated > 0


def test_round_verdict_needs_every_round():
    """w1-04: one short epoch per source flipped 'faster than' / 'slower than' between runs; a verdict
    now needs every round to agree."""
    assert shards.round_verdict([130, 125], [100, 100])[0] == "faster than"
    assert shards.round_verdict([80, 85], [100, 100])[0] == "slower than"
    assert shards.round_verdict([103, 95], [100, 100])[0] == "about as fast as"
    verdict, ratios = shards.round_verdict([150, 70], [100, 100])
    assert verdict == "undecided (the rounds disagree) against" and ratios == [1.5, 0.7]


def test_measure_sources_takes_turns_and_keeps_every_round(shard_set, data, tmp_path):
    images, labels = data
    jpegs = shards.write_jpeg_files(tmp_path / "jpeg", images, labels)
    results = shards.measure_sources({"shards": (shards.ShardReader(shard_set, 32, last="exact"), shard_set.files),
                                      "jpeg": (jpegs, jpegs.files)}, batch_size=32, num_workers=0, epochs=2)
    for r in results:
        # the median of two, up to rounding (a + (b - a) / 2 and numpy's (a + b) / 2 differ in the last bit: a
        # failure in this session's run, 55327.20714999975 against its own value one ulp off)
        assert len(r.warm_rounds) == 2 and r.warm_per_s == pytest.approx(sum(r.warm_rounds) / 2, rel=1e-12)
        assert len(r.cold_rounds) in (0, 2)


def test_round_verdict_with_a_spread_bar():
    """w6-04: rounds of 0.08x, 0.28x, 0.06x said 'slower than' in one run of lesson 04 and 4.11x,
    0.15x, 0.02x 'undecided' in the next; with `spread`, rounds further apart than that are undecided."""
    assert shards.round_verdict([8, 28, 6], [100, 100, 100])[0] == "slower than"
    # w8-04: all one way, far apart: say so, with the spread ("the rounds disagree" read as opposite sides)
    assert shards.round_verdict([8, 28, 6], [100, 100, 100], spread=2.0)[0] == (
        "slower in every round (by 0.06x to 0.28x: the size moved more than 2x) than")
    assert shards.round_verdict([411, 15, 2], [100, 100, 100], spread=2.0)[0] == "undecided (the rounds disagree) against"
    assert shards.round_verdict([105, 150], [100, 100])[0] == "undecided (some rounds within 10%, the others faster) against"
    assert shards.round_verdict([8, 12, 10], [100, 100, 100], spread=2.0)[0] == "slower than"
