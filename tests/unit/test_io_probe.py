"""course_utils.io_probe: the page cache, cold and warm reads, the I/O monitor (lesson 01)."""
import os
import sys
import time

import numpy as np
import pytest

from course_utils import io_probe
from course_utils.hardware import disk_of
from course_utils.io_probe import (ColdRecords, IoMonitor, RecordedRun, cold_and_warm_read, disk_capacity, evict,
                                   make_run, page_cache_fraction, read_files, storage_read_bytes)

LINUX = sys.platform.startswith("linux")


@pytest.fixture
def data_file(tmp_path):
    if disk_of(tmp_path).fstype in ("tmpfs", "ramfs"):
        pytest.skip("the temporary folder is in RAM: nothing to read from a disk")
    path = tmp_path / "blob.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes())
    return path


@pytest.mark.skipif(not LINUX, reason="mincore and posix_fadvise are Linux calls")
def test_evict_empties_the_page_cache_and_a_cold_read_comes_from_storage(data_file):
    read_files([data_file])
    assert page_cache_fraction(data_file) > 0.9
    assert evict([data_file]) is True
    assert page_cache_fraction(data_file) < 0.05
    result = cold_and_warm_read([data_file])
    assert result.cold is not None, result.method
    assert result.cold.bytes == result.warm.bytes == 8 << 20
    if storage_read_bytes() is not None:
        assert result.cold.from_storage > 0.9 and result.warm.from_storage < 0.1
    assert "posix_fadvise" in result.method and result.speedup > 0


def test_read_files_counts_every_byte(data_file, tmp_path):
    other = tmp_path / "small.bin"
    other.write_bytes(b"x" * 1000)
    result = read_files([data_file, other], block_size=1 << 16, where="here")
    assert result.files == 2 and result.bytes == (8 << 20) + 1000 and result.mb_per_s > 0
    assert "MB/s" in str(result) and "here" in str(result)


def test_ram_disk_read_cleans_up(data_file):
    result = io_probe.ram_disk_read([data_file])
    if result is None:
        pytest.skip("no tmpfs here")
    assert result.bytes == 8 << 20 and "RAM disk" in result.where
    assert not [p for p in os.listdir("/dev/shm") if p.startswith("course-ramdisk-")]


@pytest.mark.skipif(not LINUX, reason="posix_fadvise is a Linux call")
def test_cold_records_reads_every_sample_from_storage(data_file):
    ds = ColdRecords([data_file], sample_bytes=64 << 10)
    assert len(ds) == (8 << 20) // (64 << 10)
    image, label = ds[3]
    assert tuple(image.shape) == (3, 32, 32) and str(image.dtype) == "torch.uint8" and 0 <= label < 256
    raw = data_file.read_bytes()[3 * (64 << 10):]
    start = -3 * (64 << 10) % 3073
    assert label == raw[start] and bytes(image.flatten().numpy()) == raw[start + 1:start + 3073]
    evict([data_file])
    before = storage_read_bytes()
    for i in (5, 5, 6, 5):
        ds[i]
    if before is not None:
        assert storage_read_bytes() - before >= 4 * (64 << 10)      # the repeated item came from the disk again
    assert page_cache_fraction(data_file) < 0.05


@pytest.mark.skipif(not LINUX, reason="posix_fadvise is a Linux call")
def test_disk_capacity_reads_from_the_disk(data_file):
    result = disk_capacity([data_file], 128 << 10, readers=2, seconds=0.2)
    assert result.bytes > 0 and result.mb_per_s > 0 and "2 in flight" in result.where
    if result.storage_bytes is not None:
        assert result.from_storage > 0.9


def test_io_monitor_records_what_iostat_and_iotop_show(data_file):
    evict([data_file])
    with IoMonitor(data_file, interval_s=0.02) as mon:
        read_files([data_file])
        busy_until = time.perf_counter() + 0.25       # CPU time is counted in 10 ms ticks: give it several
        while time.perf_counter() < busy_until:
            sum(range(10_000))
    tl = mon.timeline
    assert len(tl.t_s) >= 1 and tl.cpu_busy.shape == tl.iowait.shape == (len(tl.t_s), tl.cores)
    assert ((tl.cpu_busy >= 0) & (tl.cpu_busy <= 100)).all()
    totals = tl.summary()
    assert totals["seconds"] > 0 and totals["ours_cores"] is not None and totals["ours_cores"] > 0
    assert "%iowait" in tl.iostat() and "our processes" in tl.iotop()
    if LINUX and tl.disk_read_mb_s is not None:
        assert totals["disk_read_mb_s"] > 0 and "r_await" in tl.iostat()
        if totals["ours_storage_mb_s"] is not None:
            assert totals["ours_storage_mb_s"] * totals["seconds"] > 4      # at least half of the 8 MB cold
        run = RecordedRun.from_timeline("read", tl, stall_fraction=0.5, loader_processes=1)
        assert run.loader_cores.shape == tl.t_s.shape and "stall 50%" in run.figures()
    import matplotlib
    matplotlib.use("Agg")
    fig = tl.plot(title="a read", capacity_mb_s=500.0)
    assert len(fig.axes) == 3


def test_make_run_refuses_impossible_means():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        make_run(rng, stall=0.5, loader_use=0.99, loader_processes=2, cores=2, quiet_start=0.5)
    with pytest.raises(ValueError):
        make_run(rng, stall=0.5, loader_use=0.5, loader_processes=2, cores=2, cpu="half") if False else \
            io_probe.synthetic_run("gpu-bound", rng)


def test_a_thread_that_ends_takes_nothing_back_from_the_cpu_counted():
    """schedstat is per thread: a thread that ended is gone from /proc, and a sum over the threads
    drops (it read as 0 at the end of every run, issue 35). Increments are per thread."""
    from course_utils.io_probe import _sched_increase
    before = {1: (2.0, 1.0), 2: (5.0, 0.5)}
    assert _sched_increase({1: (2.5, 1.25)}, before) == pytest.approx((0.5, 0.75))      # thread 2 ended
    assert _sched_increase({1: (2.0, 1.0), 3: (0.25, 0.5)}, before) == pytest.approx((0.25, 0.75))   # 3 is new


def test_the_monitor_never_shows_used_above_wanted_nor_a_sliver_at_the_end(data_file):
    import threading
    import time
    from course_utils.io_probe import IoMonitor

    import hashlib
    buf = bytes(1 << 20)

    def spin(seconds):
        # busy in C with the GIL released, as a training step is: a pure-Python spin starves the
        # monitor's thread of the GIL on a loaded machine (two samples in 0.3 s), which is not
        # what this test is about
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            hashlib.sha256(buf)
    with IoMonitor(data_file, interval_s=0.05) as mon:
        t = threading.Thread(target=spin, args=(0.15,))        # a thread that ends before the monitor
        t.start()
        spin(0.3)
        t.join()
    tl = mon.timeline
    if tl.ours_wanted_cores is None:
        pytest.skip("no schedstat here")
    assert (tl.ours_cores <= tl.ours_wanted_cores + 1e-9).all()
    assert np.diff(np.r_[0.0, tl.t_s]).min() >= 0.05 / 2 - 1e-3       # no sliver of a sample
    assert tl.ours_wanted_cores[-1] > 0.2                                 # the last sample is not a spurious 0


def test_the_iotop_line_says_where_the_reads_came_from():
    """w4-01: 'DISK READ 6.4 MB/s from storage ... read() calls asked for 0.5 MB/s' read as a contradiction."""
    from types import SimpleNamespace
    from course_utils.io_probe import IoTimeline

    def line(storage, read):
        return IoTimeline.iotop(SimpleNamespace(totals={"ours_storage_mb_s": storage, "ours_read_mb_s": read,
                                                        "ours_cores": 1.0, "ours_wanted_cores": None}))
    assert "pages of memory-mapped files" in line(6.4, 0.5)
    assert "all of it came from the page cache" in line(0.0, 0.5)
    assert "0.5 MB/s of it from the page cache, the rest from the disk" in line(100.0, 100.5)
