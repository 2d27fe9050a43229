"""Is it I/O? The page cache, read throughput, and what iostat and iotop would show (lesson 01).

A training run waits for data for one of three reasons: the disk cannot deliver the bytes
(I/O-bound), the CPU cannot decode and augment them fast enough (CPU-bound), or it does not
wait at all and the device sets the pace (device-bound). This module measures the first one:

- `page_cache_fraction(path)`: how much of a file is in the page cache (Linux `mincore`);
- `evict(paths)`: drop files from the page cache without root (`posix_fadvise(DONTNEED)`), so
  that the next read comes from the disk: a *cold* read;
- `read_files(paths)` and `cold_and_warm_read(paths)`: read throughput from the disk and from
  the page cache, with the bytes that really came from storage (`/proc/self/io`);
- `ram_disk_read(paths)`: the same files read from a RAM disk (tmpfs), the experiment of the
  source articles;
- `ColdRecords`: a dataset whose every read comes from the disk, as for a dataset far larger
  than RAM;
- `IoMonitor`: a background sampler of what `iostat -x` (the disk: MB/s, reads/s, %util,
  r_await; the CPU: busy and iowait per core) and `iotop` (our processes' reads from storage
  against their read() calls) would show during a run, as an `IoTimeline`;
- `RecordedRun`: the figures of one run (stall fraction, CPU, iowait, disk) that exercise 1.4
  classifies as I/O-, CPU- or device-bound, from a monitor or made up by `synthetic_run`.

Linux gives every figure; elsewhere what the system does not report is None and said so.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from .disks import disk_of

__all__ = ["page_cache_fraction", "evict", "ReadResult", "read_files", "ColdWarm", "cold_and_warm_read",
           "ram_disk_read", "ColdRecords", "disk_capacity", "IoMonitor", "IoTimeline", "RecordedRun", "make_run",
           "synthetic_run", "RUN_KINDS", "storage_read_bytes"]

RUN_KINDS = ("io-bound", "cpu-bound", "device-bound")
_LINUX = sys.platform.startswith("linux")


# -- the page cache ------------------------------------------------------------------------------

def page_cache_fraction(path) -> float | None:
    """Share of `path`'s pages now in the page cache (0..1), through `mincore`; None where the
    system cannot tell (not Linux, an empty file)."""
    if not _LINUX:
        return None
    size = os.path.getsize(path)
    if size == 0:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            view = np.frombuffer(m, dtype=np.uint8)
            try:
                rc = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec)
            finally:
                del view
            if rc != 0:
                return None
            return float(np.count_nonzero(np.frombuffer(vec, dtype=np.uint8) & 1)) / pages
    except (OSError, ValueError, AttributeError):
        return None


def evict(paths, offset: int = 0, length: int = 0) -> bool:
    """Drop `paths` (or the byte range `offset`, `length` of each; 0 = to the end) from the page
    cache: written-back first, then `posix_fadvise(POSIX_FADV_DONTNEED)`. Needs no root and
    touches only these files (unlike `echo 3 > /proc/sys/vm/drop_caches`, which empties the
    whole machine's cache). Returns False where the system has no such call (macOS, Windows)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in ([paths] if isinstance(paths, (str, os.PathLike)) else paths):
        fd = os.open(path, os.O_RDONLY)
        try:
            try:
                os.fdatasync(fd)          # dirty pages cannot be dropped until written
            except OSError:
                pass
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def storage_read_bytes() -> int | None:
    """Bytes this process has read from storage so far (`read_bytes` in /proc/self/io: page-cache
    hits do not count); None where the system does not report it."""
    try:
        return int(psutil.Process().io_counters().read_bytes)
    except (AttributeError, psutil.Error, NotImplementedError):
        return None


@dataclass
class ReadResult:
    """One pass reading files: bytes, seconds, MB/s, and how many bytes came from storage."""
    files: int
    bytes: int
    seconds: float
    storage_bytes: int | None = None
    in_cache_before: float | None = None   # mean page-cache share of the files before the read
    where: str = ""

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else float("inf")

    @property
    def from_storage(self) -> float | None:
        """Share of the bytes read that came from storage rather than the page cache."""
        if self.storage_bytes is None or not self.bytes:
            return None
        return min(1.0, self.storage_bytes / self.bytes)

    def __str__(self) -> str:
        storage = f", {self.from_storage:.0%} from storage" if self.from_storage is not None else ""
        return (f"{self.bytes / 1e6:,.1f} MB in {self.seconds * 1e3:,.1f} ms = {self.mb_per_s:,.0f} MB/s"
                f"{storage}" + (f" ({self.where})" if self.where else ""))


def read_files(paths, block_size: int = 1 << 20, where: str = "") -> ReadResult:
    """Read every file start to end in blocks of `block_size` into one reused buffer (no
    decoding, no copies kept) and time it."""
    paths = [Path(p) for p in paths]
    cached = [page_cache_fraction(p) for p in paths]
    buf = bytearray(block_size)
    view = memoryview(buf)
    before = storage_read_bytes()
    total = 0
    t0 = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while True:
                n = f.readinto(view)
                if not n:
                    break
                total += n
    seconds = time.perf_counter() - t0
    after = storage_read_bytes()
    known = [c for c in cached if c is not None]
    return ReadResult(len(paths), total, seconds, None if before is None or after is None else after - before,
                      float(np.mean(known)) if known else None, where)


@dataclass
class ColdWarm:
    """A cold read (after dropping the files from the page cache) and a warm one (right after)."""
    cold: ReadResult | None
    warm: ReadResult
    method: str

    @property
    def speedup(self) -> float | None:
        return self.warm.mb_per_s / self.cold.mb_per_s if self.cold else None


def _fastest(results: list[ReadResult]) -> ReadResult:
    return max(results, key=lambda r: r.mb_per_s)


def cold_and_warm_read(paths, block_size: int = 1 << 20, warm_repeats: int = 3) -> ColdWarm:
    """Read `paths` cold (dropped from the page cache first, and checked) and then warm: the fastest
    of `warm_repeats` warm reads (one read of memory is easily slowed by other programs; the fastest
    is what memory gives). Where the files cannot be dropped from the cache, `cold` is None and
    `method` says why."""
    paths = [Path(p) for p in paths]
    dropped = evict(paths)
    left = [page_cache_fraction(p) for p in paths]
    known = [x for x in left if x is not None]
    if not dropped:
        cold, method = None, ("this system has no posix_fadvise: the files cannot be dropped from the page "
                              "cache without root, so no cold read is measured")
    elif known and max(known) > 0.05:
        cold, method = None, (f"posix_fadvise(DONTNEED) left {max(known):.0%} of a file in the page cache "
                              "(mapped by another process?): no cold read is measured")
    else:
        checked = "checked with mincore" if known else "not checkable here"
        cold = read_files(paths, block_size, where="cold: from the disk")
        method = f"dropped from the page cache with posix_fadvise(DONTNEED), {checked}"
    warm = _fastest([read_files(paths, block_size, where=f"warm: from the page cache, best of {warm_repeats} reads")
                     for _ in range(max(1, warm_repeats))])
    return ColdWarm(cold, warm, method)


def ram_disk_read(paths, ram_dir: str = "/dev/shm", block_size: int = 1 << 20, repeats: int = 3) -> ReadResult | None:
    """Copy `paths` to a RAM disk (tmpfs at `ram_dir`), read them there (the fastest of `repeats`
    reads, as for the warm read), delete the copies: what moving a dataset to a RAM disk buys. None
    where there is no tmpfs or not enough room."""
    if not os.path.isdir(ram_dir) or disk_of(ram_dir).fstype not in ("tmpfs", "ramfs"):
        return None
    paths = [Path(p) for p in paths]
    needed = sum(p.stat().st_size for p in paths)
    if shutil.disk_usage(ram_dir).free < 2 * needed:
        return None
    tmp = Path(tempfile.mkdtemp(prefix="course-ramdisk-", dir=ram_dir))
    try:
        copies = [Path(shutil.copyfile(p, tmp / p.name)) for p in paths]
        read_files(copies, block_size)                 # the first read of a fresh tmpfs file settles it
        return _fastest([read_files(copies, block_size, where=f"RAM disk: tmpfs at {ram_dir}, best of {repeats} reads")
                         for _ in range(max(1, repeats))])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class ColdRecords:
    """A dataset whose every sample is read from the disk, as when the dataset is far larger than
    RAM: the data files are cut into slots of `sample_bytes` (110 kB by default, the size of an
    average ImageNet JPEG, rounded up to whole pages); item `i` reads slot `i` and then drops it
    from the page cache, so no read is ever served from memory. It returns the first whole CIFAR
    record in the slot: `(uint8 tensor (3, 32, 32), label)`. No decoding, no augmentation: the
    CPU does almost nothing (lesson 01's I/O-bound run)."""

    def __init__(self, files, sample_bytes: int = 110_000, record_bytes: int = 3073):
        page = mmap.PAGESIZE
        self.files = [Path(f) for f in files]
        self.sample_bytes = -(-int(sample_bytes) // page) * page
        self.record_bytes = int(record_bytes)
        if self.sample_bytes < 2 * self.record_bytes:
            raise ValueError(f"sample_bytes must hold a whole record: at least {2 * record_bytes}")
        self.slots = [f.stat().st_size // self.sample_bytes for f in self.files]
        if not sum(self.slots):
            raise ValueError(f"the files are smaller than one sample of {self.sample_bytes} bytes")
        self._fds, self._pid = None, None
        evict(self.files)             # start cold: nothing of these files in the page cache

    def __len__(self) -> int:
        return sum(self.slots)

    def _open(self):
        if self._fds is None or self._pid != os.getpid():     # one set of descriptors per process
            self._fds, self._pid = [os.open(f, os.O_RDONLY) for f in self.files], os.getpid()
            for fd in self._fds:
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)     # no read-ahead
        return self._fds

    def __getitem__(self, index: int):
        import torch

        fds = self._open()
        index = int(index) % len(self)
        k = 0
        while index >= self.slots[k]:
            index -= self.slots[k]
            k += 1
        offset = index * self.sample_bytes
        data = os.pread(fds[k], self.sample_bytes, offset)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fds[k], offset, self.sample_bytes, os.POSIX_FADV_DONTNEED)
        start = -offset % self.record_bytes          # the first record that starts inside the slot
        record = np.frombuffer(data, dtype=np.uint8, count=self.record_bytes, offset=start)
        return torch.from_numpy(record[1:].reshape(3, 32, 32).copy()), int(record[0])

    def close(self) -> None:
        if self._fds is not None and self._pid == os.getpid():
            for fd in self._fds:
                os.close(fd)
        self._fds = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fds"] = None
        return state


# -- what iostat and iotop would show -----------------------------------------------------------

_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")


def _cpu_split(a, b) -> tuple[np.ndarray, np.ndarray]:
    """Per core, the busy share (user+nice+system+irq+softirq) and the iowait share, in %,
    between two `psutil.cpu_times(percpu=True)` readings."""
    busy, wait = [], []
    for x, y in zip(a, b):
        total = sum(getattr(y, f) - getattr(x, f) for f in x._fields
                    if f not in ("guest", "guest_nice"))   # guest time is already inside user time
        total = max(total, 1e-9)
        busy.append(100 * sum(getattr(y, f) - getattr(x, f) for f in _BUSY_FIELDS if hasattr(x, f)) / total)
        wait.append(100 * (getattr(y, "iowait", 0.0) - getattr(x, "iowait", 0.0)) / total)
    return np.clip(busy, 0, 100), np.clip(wait, 0, 100)


def _disk_counters(device: str | None):
    if device is None:
        return None
    try:
        return psutil.disk_io_counters(perdisk=True, nowrap=True).get(device)
    except Exception:
        return None


def _sched_seconds(pid: int) -> dict[int, tuple[float, float]] | None:
    """For each thread of process `pid`, the seconds it has run on a CPU and waited on a run queue
    for one (/proc/PID/task/*/schedstat, Linux, to the nanosecond): run + wait is the CPU the
    thread *wanted*, which busy neighbours cannot hide. Per thread, because a thread that ends
    takes its counts with it (a sum over the threads would drop, and read as 0 at the end of a
    run, issue 35). None where the system does not report it."""
    out = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run_ns, wait_ns = f.read().split()[:2]
        except (OSError, ValueError):
            continue
        out[int(tid)] = (int(run_ns) / 1e9, int(wait_ns) / 1e9)
    return out or None


def _sched_increase(now: dict, before: dict) -> tuple[float, float]:
    """(run, run + wait) seconds the threads in `now` added since `before` (a thread born since: all
    of its time; a thread that ended since: nothing more)."""
    run = wanted = 0.0
    for tid, (r, w) in now.items():
        r0, w0 = before.get(tid, (0.0, 0.0))
        run += max(0.0, r - r0)
        wanted += max(0.0, r + w - r0 - w0)
    return run, wanted


def _proc_io(pids_seen: dict) -> tuple | None:
    """(storage read bytes, read() bytes, CPU seconds, CPU-wanted seconds) of this process and its
    children, summed as increments since each process was last seen (workers that start mid-run
    count from 0). The CPU seconds are the scheduler's run time where Linux reports it per thread
    (on the same clock as the wait, so that used never exceeds used + waited for), else the
    process's CPU times (10 ms ticks); the last is None where schedstat is not available."""
    try:
        me = psutil.Process()
        procs = [me] + me.children(recursive=True)
    except psutil.Error:
        return None
    storage = chars = 0
    cpu = wanted = 0.0
    ok, sched_ok = False, True
    # A child that has exited is reaped by this process, and Linux then adds its I/O counts to
    # ours: take back what we already counted for it.
    alive = {p.pid for p in procs}
    gone = [pid for pid in pids_seen if pid not in alive and pid != me.pid]
    gone_bytes = (sum(pids_seen[pid][0] for pid in gone), sum(pids_seen[pid][1] for pid in gone))
    for pid in gone:
        del pids_seen[pid]
    for p in procs:
        try:
            with p.oneshot():
                c = p.io_counters() if hasattr(p, "io_counters") else None
                t = p.cpu_times()
        except (psutil.Error, NotImplementedError):
            continue
        sched = _sched_seconds(p.pid)
        sched_ok = sched_ok and sched is not None
        rb = int(c.read_bytes) if c is not None else 0
        rc = int(getattr(c, "read_chars", 0)) if c is not None else 0
        ok = ok or c is not None
        now = (rb, rc, t.user + t.system, sched or {})
        prev = pids_seen.get(p.pid)
        pids_seen[p.pid] = now
        if prev is None:
            if p.pid == me.pid:
                continue          # the first reading of this process: the baseline
            prev = (0, 0, 0.0, {})
        if p.pid == me.pid:
            prev = (prev[0] + gone_bytes[0], prev[1] + gone_bytes[1]) + prev[2:]
        storage += max(0, now[0] - prev[0])
        chars += max(0, now[1] - prev[1])
        if sched:
            run, want = _sched_increase(sched, prev[3])
            cpu += run
            wanted += want
        else:
            cpu += max(0.0, now[2] - prev[2])
    return (storage if ok else None, chars if ok else None, cpu, wanted if sched_ok else None)


@dataclass
class IoTimeline:
    """Samples from an `IoMonitor`: per-core CPU busy and iowait (%), the disk's read MB/s,
    reads/s, %util and r_await, our processes' reads (storage vs read() calls), the cores our
    processes used (this one and its DataLoader workers) and the cores they *wanted*: used, or
    waited for on a run queue while other programs had them (Linux schedstat), with whole-run
    totals in `totals` (lesson 01)."""
    t_s: np.ndarray
    cpu_busy: np.ndarray
    iowait: np.ndarray
    disk_read_mb_s: np.ndarray | None = None
    disk_reads_per_s: np.ndarray | None = None
    disk_util: np.ndarray | None = None
    ours_storage_mb_s: np.ndarray | None = None
    ours_read_mb_s: np.ndarray | None = None
    ours_cores: np.ndarray | None = None
    ours_wanted_cores: np.ndarray | None = None
    totals: dict = field(default_factory=dict)
    disk: str = ""
    host: str = ""

    @property
    def cores(self) -> int:
        return int(self.cpu_busy.shape[1]) if self.cpu_busy.ndim == 2 else 1

    def summary(self) -> dict:
        """Whole-run figures (from the first and last counters, so exact even for short runs)."""
        return dict(self.totals)

    def iostat(self) -> str:
        """The run as `iostat -x` would print it over the same interval."""
        t = self.totals
        busy, wait = np.asarray(t["cpu_busy"]), np.asarray(t["iowait"])
        lines = [f"avg-cpu:  %busy (user+system) {busy.mean():5.1f}   %iowait {wait.mean():5.1f}   "
                 f"%idle {max(0.0, 100 - busy.mean() - wait.mean()):5.1f}   (busiest core {busy.max():.0f}% busy, "
                 f"most iowait on one core {wait.max():.0f}%)"]
        if t.get("disk_read_mb_s") is None:
            lines.append("Device: no counters for the disk holding the data (not a local block device)")
        else:
            await_ms = t.get("r_await_ms")
            lines.append(f"{'Device':10s} {'r/s':>9s} {'rMB/s':>9s} {'r_await':>8s} {'%util':>6s}")
            lines.append(f"{self.disk.split(' ')[0]:10s} {t['disk_reads_per_s']:9.1f} {t['disk_read_mb_s']:9.1f} "
                         f"{'-' if await_ms is None else f'{await_ms:.2f}':>8s} {t['disk_util']:6.1f}")
        return "\n".join(lines)

    def iotop(self) -> str:
        """Our processes (this one and its workers) as `iotop` would show them."""
        t = self.totals
        if t.get("ours_storage_mb_s") is None:
            return "our processes: this system does not report per-process I/O"
        read = t.get("ours_read_mb_s") or 0.0
        cache = max(0.0, read - t["ours_storage_mb_s"])
        cores = f"; they used {t['ours_cores']:.2f} cores of CPU" if t.get("ours_cores") is not None else ""
        if t.get("ours_wanted_cores") is not None:
            cores += f" and waited for another {max(0.0, t['ours_wanted_cores'] - t['ours_cores']):.2f} taken by other programs"
        storage = t["ours_storage_mb_s"]
        if storage > read + 0.05:       # w4-01: more from storage than read() asked for reads as a contradiction
            why = (f"storage gave more than read() asked for: pages of memory-mapped files (np.memmap) and the "
                   f"kernel's read-ahead reach the disk without a read() call, and only the disk counts them")
        elif read > 0.05 and storage < 0.05:
            why = ("all of it came from the page cache (files already in memory, Python's own modules among them): "
                   "nothing from the disk")
        else:
            why = f"{cache:.1f} MB/s of it from the page cache, the rest from the disk"
        return (f"our processes: DISK READ {storage:.1f} MB/s from storage (what iotop shows){cores}; their read() "
                f"calls asked for {read:.1f} MB/s: {why}")

    def plot(self, ax=None, title: str | None = None, capacity_mb_s: float | None = None, legend: bool = True):
        """Three panels: CPU busy and iowait (mean over the machine's cores) with our processes'
        use and demand on the same scale, the disk's read MB/s (against its measured capacity, if
        given), and the disk's %util. Legends sit above the data, in headroom of their own
        (`legend=False` leaves them out: the other columns of a figure of several runs)."""
        import matplotlib.pyplot as plt

        own = ax is None
        if own:
            fig, ax = plt.subplots(3, 1, figsize=(8, 5.5), sharex=True)
        fig = ax[0].figure
        cpu_ax, mb_ax, util_ax = ax
        busy, wait = self.cpu_busy.mean(axis=1), self.iowait.mean(axis=1)
        cpu_ax.stackplot(self.t_s, busy, wait, colors=["tab:blue", "tab:orange"], alpha=0.6,
                         labels=["machine: busy", "machine: iowait"])
        if self.ours_cores is not None:
            scale = 100 / self.cores
            cpu_ax.plot(self.t_s, self.ours_cores * scale, color="black", lw=1.2, label="our processes: used")
            if self.ours_wanted_cores is not None:
                cpu_ax.plot(self.t_s, self.ours_wanted_cores * scale, color="black", lw=1, ls="--",
                            label="our processes: used + waited for")
        # the data below its peak (our processes may want more cores than the machine has), the legend above it
        peak = max([100.0] + [float(np.nanmax(v)) * 100 / self.cores for v in (self.ours_cores, self.ours_wanted_cores)
                              if v is not None and len(v)])
        cpu_ax.set_ylim(0, peak * (1.45 if legend else 1.05))
        cpu_ax.set_yticks([v for v in (0, 25, 50, 75, 100, 150, 200, 300, 400) if v <= peak])
        cpu_ax.set_ylabel("% of all cores")
        if legend:
            cpu_ax.legend(fontsize=7, loc="upper left", ncol=2, frameon=False)
        top = 1.0
        if self.disk_read_mb_s is not None:
            mb_ax.plot(self.t_s, self.disk_read_mb_s, color="tab:green", label="disk read")
            top = max(float(np.nanmax(self.disk_read_mb_s)) if len(self.t_s) else 0.0, capacity_mb_s or 0.0, 1.0)
            if capacity_mb_s:
                mb_ax.axhline(capacity_mb_s, color="tab:red", ls="--", lw=1,
                              label=f"its capacity for these reads ({capacity_mb_s:,.0f})")
            util_ax.plot(self.t_s, self.disk_util, color="tab:purple")
            if legend:
                mb_ax.legend(fontsize=7, loc="upper left", ncol=2, frameon=False)
        else:
            for a in (mb_ax, util_ax):
                a.text(0.5, 0.5, "no disk counters for this path", ha="center", va="center", transform=a.transAxes)
        mb_ax.set_ylabel("disk read MB/s")
        mb_ax.set_ylim(0, 1.45 * top)
        util_ax.set_ylim(0, 105)
        util_ax.set_ylabel("disk %util")
        util_ax.set_xlabel("seconds")
        if title:
            cpu_ax.set_title(title, fontsize=9)
        if own:
            fig.suptitle(f"disk: {self.disk}", fontsize=8)
            fig.tight_layout()
        return fig


class IoMonitor:
    """Sample what `iostat -x` and `iotop` would show while a block of code runs (lesson 01):

        with IoMonitor(path=data_file) as mon:
            ...
        print(mon.timeline.iostat())

    `path` picks the disk to watch (the block device holding it; see disks.disk_of)."""

    def __init__(self, path=None, *, interval_s: float = 0.1, device: str | None = None):
        self.info = disk_of(path) if path is not None else None
        self.device = device or (self.info.device if self.info else None)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = None
        self._rows = []
        self._pids = {}

    def __enter__(self) -> "IoMonitor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _snapshot(self):
        # Reading every thread's counters takes a while, longer when a busy Python thread holds the
        # GIL (tens of ms): the snapshot's time is the middle of its readings, not their start (a
        # time taken before them put the counts of one sample into the next, and the last sample
        # of a run could read as 0, issue 35's CI flake).
        start = time.perf_counter()
        cpu = psutil.cpu_times(percpu=True)
        disk = _disk_counters(self.device)
        ours = _proc_io(self._pids)
        return ((start + time.perf_counter()) / 2, cpu, disk, ours)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("this monitor is already running")
        self._first = self._last = self._snapshot()
        self._ours_total = [0, 0, 0.0, 0.0]
        self._thread = threading.Thread(target=self._run, name="io-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample(last=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self, last: bool = False) -> None:
        snap = self._snapshot()
        if last and self._rows and snap[0] - self._last[0] < self.interval_s / 2:
            # a stop right after a sample: a sliver of a sample (a few ms, no CPU tick in it) would
            # read as 0% at the end of every plot; the last sample takes it in instead
            start, end = self._rows.pop()
            if end[3] is not None and snap[3] is not None:     # our processes' counts are increments: add them
                merged = tuple(None if a is None or b is None else a + b for a, b in zip(end[3], snap[3]))
                self._rows.append((start, snap[:3] + (merged,)))
            else:
                self._rows.append((start, snap))
        else:
            self._rows.append((self._last, snap))
        if snap[3] is not None:
            for k in range(4):
                self._ours_total[k] += snap[3][k] or 0
        self._last = snap

    @staticmethod
    def _disk_rates(a, b, dt):
        if a is None or b is None:
            return None
        reads = b.read_count - a.read_count
        busy = getattr(b, "busy_time", None)
        util = None if busy is None else min(100.0, 100 * (busy - a.busy_time) / (dt * 1e3))
        await_ms = (b.read_time - a.read_time) / reads if reads > 0 and hasattr(b, "read_time") else None
        return (b.read_bytes - a.read_bytes) / dt / 1e6, reads / dt, util, await_ms

    @property
    def timeline(self) -> IoTimeline:
        from .env import cpu_name, usable_cores

        t0 = self._first[0]
        t, busy, wait, disk, ours = [], [], [], [], []
        for a, b in self._rows:
            dt = max(b[0] - a[0], 1e-9)
            t.append(b[0] - t0)
            cb, cw = _cpu_split(a[1], b[1])
            busy.append(cb)
            wait.append(cw)
            disk.append(self._disk_rates(a[2], b[2], dt))
            ours.append(None if b[3] is None else b[3])
        last = self._rows[-1][1] if self._rows else self._first
        span = max(last[0] - t0, 1e-9)
        tb, tw = _cpu_split(self._first[1], last[1])
        whole = self._disk_rates(self._first[2], last[2], span)
        have_disk = bool(disk) and all(d is not None for d in disk)
        have_cpu = bool(ours) and all(o is not None for o in ours)
        have_ours = have_cpu and all(o[0] is not None for o in ours)
        have_wanted = have_cpu and all(o[3] is not None for o in ours)
        dts = [max(b[0] - a[0], 1e-9) for a, b in self._rows]
        totals = {"seconds": span, "cpu_busy": tb, "iowait": tw,
                  "disk_read_mb_s": whole[0] if whole else None, "disk_reads_per_s": whole[1] if whole else None,
                  "disk_util": whole[2] if whole else None, "r_await_ms": whole[3] if whole else None,
                  "ours_storage_mb_s": self._ours_total[0] / span / 1e6 if have_ours else None,
                  "ours_read_mb_s": self._ours_total[1] / span / 1e6 if have_ours else None,
                  "ours_cores": self._ours_total[2] / span if have_cpu else None,
                  "ours_wanted_cores": self._ours_total[3] / span if have_wanted else None}
        col = (lambda k: np.array([d[k] if d[k] is not None else np.nan for d in disk])) if have_disk else (lambda k: None)
        return IoTimeline(
            t_s=np.asarray(t), cpu_busy=np.asarray(busy).reshape(len(t), -1), iowait=np.asarray(wait).reshape(len(t), -1),
            disk_read_mb_s=col(0), disk_reads_per_s=col(1), disk_util=col(2),
            ours_storage_mb_s=np.array([o[0] / dt / 1e6 for o, dt in zip(ours, dts)]) if have_ours else None,
            ours_read_mb_s=np.array([o[1] / dt / 1e6 for o, dt in zip(ours, dts)]) if have_ours else None,
            ours_cores=np.array([o[2] / dt for o, dt in zip(ours, dts)]) if have_cpu else None,
            ours_wanted_cores=np.array([o[3] / dt for o, dt in zip(ours, dts)]) if have_wanted else None,
            totals=totals, disk=self.info.label if self.info else (self.device or "none"),
            host=f"{cpu_name()}, {usable_cores()} usable cores ({psutil.cpu_count()} shown)")


# -- the disk's capacity for one kind of read ----------------------------------------------------

def disk_capacity(files, block_size: int = 110_000, *, readers: int = 4, seconds: float = 1.0,
                  seed: int = 0) -> ReadResult:
    """What the disk delivers for reads of `block_size` bytes at random places in `files`, with
    `readers` reads in flight at once (threads: `os.pread` releases the GIL), every read dropped
    from the page cache afterwards so that all of them come from the disk: the yardstick a run
    reading that way is compared with (as `fio --rw=randread --bs=... --iodepth=...` would
    measure). Runs for about `seconds` (lesson 01)."""
    page = mmap.PAGESIZE
    block = -(-int(block_size) // page) * page
    files = [Path(f) for f in files]
    slots = [(f, k * block) for f in files for k in range(f.stat().st_size // block)]
    if not slots:
        raise ValueError(f"the files are smaller than one block of {block} bytes")
    evict(files)
    fds = {f: os.open(f, os.O_RDONLY) for f in files}
    if hasattr(os, "posix_fadvise"):
        for fd in fds.values():
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)     # no read-ahead into the next block
    done = [0] * readers
    stop = time.perf_counter() + seconds

    def reader(k):
        rng = np.random.default_rng((seed, k))
        mine = slots[k::readers] or slots      # each reader its own slots: no two read the same pages at once
        while time.perf_counter() < stop:
            f, offset = mine[int(rng.integers(len(mine)))]
            done[k] += len(os.pread(fds[f], block, offset))
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fds[f], offset, block, os.POSIX_FADV_DONTNEED)

    before = storage_read_bytes()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=reader, args=(k,), daemon=True) for k in range(readers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for fd in fds.values():
            os.close(fd)
    elapsed = time.perf_counter() - t0
    after = storage_read_bytes()
    return ReadResult(len(files), sum(done), elapsed, None if before is None or after is None else after - before,
                      0.0, f"random {block // 1024} KiB reads, {readers} in flight, from the disk")


# -- recorded runs: the figures exercise 1.4 classifies -------------------------------------------

@dataclass
class RecordedRun:
    """The figures of one training run (lesson 01, exercise 1.4), each sampled T times:

    stall_fraction: share of the wall time the loop waited for data (lesson 01's definition);
    loader_cores: (T,) cores of CPU the processes that load data (this process and its
        DataLoader workers) used, or were ready to use but waited for while other programs
        had them: their demand for CPU, which busy neighbours cannot hide;
    loader_processes: how many such processes (1 + num_workers); usable_cores: the machine's;
    cpu_busy, iowait: (T, cores) % of each core busy (user+system), and idle while a task
        waited for the disk, machine-wide;
    disk_read_mb_s, disk_util: (T,) the data disk's read throughput and %util.
    """
    name: str
    stall_fraction: float
    loader_cores: np.ndarray
    loader_processes: int
    usable_cores: int
    cpu_busy: np.ndarray
    iowait: np.ndarray
    disk_read_mb_s: np.ndarray
    disk_util: np.ndarray
    samples_per_s: float | None = None
    device: str = ""
    disk: str = ""
    simulated: bool = False

    @classmethod
    def from_timeline(cls, name: str, timeline: IoTimeline, *, stall_fraction: float, loader_processes: int,
                      samples_per_s: float | None = None, device: str = "") -> "RecordedRun":
        """The figures of a run an `IoMonitor` watched (the loaders' CPU demand where Linux reports
        run-queue waits, else the CPU they used); raises ValueError where the system did not
        report per-process CPU or the disk's counters."""
        from .env import usable_cores

        demand = timeline.ours_wanted_cores if timeline.ours_wanted_cores is not None else timeline.ours_cores
        if demand is None:
            raise ValueError("this system did not report our processes' CPU times")
        if timeline.disk_read_mb_s is None or timeline.disk_util is None:
            raise ValueError("this timeline has no disk counters (the data is not on a local block device)")
        return cls(name, float(stall_fraction), demand.copy(), int(loader_processes), usable_cores(),
                   timeline.cpu_busy.copy(), timeline.iowait.copy(), np.nan_to_num(timeline.disk_read_mb_s).copy(),
                   np.nan_to_num(timeline.disk_util).copy(), samples_per_s, device, timeline.disk)

    def figures(self) -> str:
        """The run's figures in one line (means over the run)."""
        return (f"stall {self.stall_fraction:.0%}; loader {self.loader_cores.mean():.2f} cores "
                f"({self.loader_processes} process{'es' if self.loader_processes > 1 else ''}, {self.usable_cores} usable cores); "
                f"machine: busy {self.cpu_busy.mean():.0f}%, iowait {self.iowait.mean():.1f}%; "
                f"disk {self.disk_read_mb_s.mean():,.1f} MB/s, %util {self.disk_util.mean():.0f}")


def _with_mean(rng, target: float, n: int, spread: float, low: float = 0.0, high: float = 100.0) -> np.ndarray:
    """n noisy values in [low, high] whose mean is `target` (to 1e-9)."""
    x = np.clip(target + rng.normal(0, spread, n), low, high)
    for _ in range(200):
        gap = target - x.mean()
        if abs(gap) < 1e-12:
            break
        room = (high - x) if gap > 0 else (x - low)
        if room.sum() <= 0:
            break
        x = np.clip(x + gap * n * room / room.sum(), low, high)
    if abs(x.mean() - target) > 1e-9:
        x = np.full(n, float(target))
    return x


def make_run(rng: np.random.Generator, *, stall: float, loader_use: float, loader_processes: int, cores: int,
             disk_mb_s: float = 0.0, util: float = 0.0, iowait: float | None = None, others: float = 0.0,
             burst: float = 0.0, quiet_start: float = 0.0, at_end: bool = False, jitter: float = 0.04,
             samples: int = 60, name: str = "run") -> RecordedRun:
    """A made-up `RecordedRun` (labelled simulated) with exactly these means, for the exercise's
    check and for examples: the loading processes use `loader_use` of the cores they could use,
    min(loader_processes, cores) (a mean over the run, exact); the disk reads `disk_mb_s` at
    %util `util`; machine-wide iowait `iowait` (by default, the loaders' idle time shown as
    iowait when they read the disk); `others` cores of other programs' work. `burst` puts the
    loaders at full speed over the first share of the samples (start-up), `quiet_start` at rest
    (with `at_end`, those samples come last instead). `jitter`: the loaders' noise from sample to
    sample, as a share of the cores they could use."""
    n = samples
    k_burst, k_quiet = int(round(burst * n)), int(round(quiet_start * n))
    head = k_burst + k_quiet
    usable = min(loader_processes, cores)
    use = np.zeros(n)
    if k_burst:
        use[:k_burst] = rng.uniform(0.97, 1.0, k_burst)
    if k_quiet:
        use[k_burst:head] = rng.uniform(0.0, 0.03, k_quiet)
    rest = (loader_use * n - use.sum()) / (n - head)
    if not 0 <= rest <= 1:
        raise ValueError("this mean cannot follow that burst or quiet start")
    use[head:] = _with_mean(rng, rest, n - head, jitter, 0.0, 1.0)
    if at_end:
        use = np.roll(use, -head)
    loader_cores = use * usable
    # machine-wide per-core figures: the loaders' work spread over `usable` cores, other programs on the rest
    busy = np.clip(rng.normal(3, 1.5, (n, cores)), 0, 100)
    on = rng.choice(cores, size=usable, replace=False)
    busy[:, on] = np.clip(100 * use[:, None] + rng.normal(0, 2, (n, usable)), 0, 100)
    if others:
        spare = 100 - busy
        busy += spare * min(1.0, others / max(spare.sum() / 100 / n, 1e-9))
        busy = np.clip(busy, 0, 100)
    if iowait is None:
        iowait = float((100 - busy[:, on]).mean() * usable / cores) if disk_mb_s > 0 else 0.0
    wait = np.zeros((n, cores))
    if iowait > 0:
        room = 100 - busy
        wait = np.minimum(room * rng.uniform(0.6, 1.0, room.shape), room)
        mask = np.zeros(cores, bool)
        mask[on] = True
        wait[:, ~mask] *= 0.1
        wait *= iowait / wait.mean() if wait.mean() > 0 else 0
        wait = np.minimum(wait, room)
    disk = _with_mean(rng, disk_mb_s, n, 0.1 * disk_mb_s + 1e-9, 0.0, 1e6) if disk_mb_s else np.zeros(n)
    util_s = _with_mean(rng, util, n, 4.0) if util else np.zeros(n)
    return RecordedRun(name=name, stall_fraction=float(stall), loader_cores=loader_cores,
                       loader_processes=int(loader_processes), usable_cores=int(cores), cpu_busy=busy, iowait=wait,
                       disk_read_mb_s=disk, disk_util=util_s, device="made-up example (simulated)",
                       disk="made-up disk", simulated=True)


def synthetic_run(kind: str, rng: np.random.Generator | None = None, *, cores: int | None = None,
                  name: str = "run") -> RecordedRun:
    """A made-up run of one kind ("io-bound", "cpu-bound", "device-bound"), labelled simulated,
    for examples: varied core and worker counts, disks, %util and other programs (lesson 01)."""
    if kind not in RUN_KINDS:
        raise ValueError(f"kind must be one of {RUN_KINDS}, got {kind!r}")
    rng = rng or np.random.default_rng()
    cores = cores or int(rng.choice([2, 4, 8, 16, 32, 64]))
    processes = 1 + int(rng.choice([0, 1, 2, cores, 2 * cores]))
    disk = float(rng.choice([2.0, 40.0, 150.0, 450.0, 1500.0]))
    if kind == "device-bound":
        return make_run(rng, stall=rng.uniform(0.0, 0.09), loader_use=rng.uniform(0.1, 1.0), loader_processes=processes,
                        cores=cores, disk_mb_s=disk * rng.uniform(0, 1), util=rng.uniform(0, 100), name=name)
    if kind == "io-bound":
        return make_run(rng, stall=rng.uniform(0.2, 0.95), loader_use=rng.uniform(0.02, 0.6), loader_processes=processes,
                        cores=cores, disk_mb_s=disk, util=rng.uniform(20, 100), name=name)
    return make_run(rng, stall=rng.uniform(0.2, 0.95), loader_use=rng.uniform(0.88, 1.0), loader_processes=processes,
                    cores=cores, disk_mb_s=disk * rng.uniform(0, 0.5), util=rng.uniform(0, 100),
                    iowait=rng.uniform(0, 3), name=name)
