"""Measuring input pipelines: throughput, epoch start-up and worker memory (lesson 02).

- `measure_loader(loader, device, steps)`: run `steps` timed training steps through the course's
  one loop (`course_utils.train.train`) and return its `StepStats` (samples/s, data-wait vs
  compute). Lesson 02 sweeps DataLoader settings with it; lesson 03 and the ladder reuse it.
- `in_flight_batches(loader)`: how many batches a DataLoader's workers prepare ahead.
- `epoch_times(loader, epochs)`: per epoch, the time to the first batch (worker start-up) and
  to the end of the epoch: what `persistent_workers` saves.
- `worker_memory(iterator)`: resident memory of each DataLoader worker process (RSS, USS, PSS),
  read through psutil: what copy-on-access costs.
- `CpuUse`: how many cores this process and its workers used during a block of code, and how
  many every other process on the machine used (a shared machine makes timings noisy).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

from .timing import StepStats, StepTimer

__all__ = ["measure_loader", "in_flight_batches", "EpochTime", "epoch_times", "ProcessMemory",
           "process_memory", "worker_pids", "worker_memory", "CpuUse"]


# -- throughput -------------------------------------------------------------------------------

def in_flight_batches(loader) -> int:
    """Batches a loader prepares ahead of the training loop, which the first steps get for free
    (so timing should start after them): a DataLoader's `num_workers * prefetch_factor` (0
    without workers), a DALI loader's `prefetch_queue_depth`, a `BackgroundLoader`'s
    `max_prefetch` (plus what the loader it wraps prepares), a `CudaPrefetcher`'s one batch
    (plus its loader's); 0 for any other iterable."""
    from .prefetch import BackgroundLoader, CudaPrefetcher

    if isinstance(loader, BackgroundLoader):
        return loader.max_prefetch + in_flight_batches(loader.loader)
    if isinstance(loader, CudaPrefetcher):
        return 1 + in_flight_batches(loader.loader)
    depth = getattr(loader, "prefetch_queue_depth", None)
    if isinstance(depth, int):
        return depth
    workers = int(getattr(loader, "num_workers", 0) or 0)
    if workers == 0:
        return 0
    return workers * int(getattr(loader, "prefetch_factor", None) or 2)


def measure_loader(loader, device, steps: int, *, model=None, warmup: int | None = None,
                   progress: bool = False, desc: str = "measure", **train_kwargs) -> StepStats:
    """Throughput of `loader` feeding `device`: `warmup + steps` steps of `train()`, `steps` timed.

    `loader` is any iterable of `(images, labels)` batches (it is iterated again, from the
    start, when an epoch ends before the steps are done). `device` is the simulated accelerator
    (then `model` may be None: each step is the simulated device step) or a torch device with a
    `model` to train. `warmup` untimed steps come first; by default 1 + the batches the loader's
    workers prepared ahead during start-up (`in_flight_batches`), so the timed steps see the
    steady state, not a full prefetch queue. Other keyword arguments go to `train()` (amp,
    channels_last, batch_transform, optimizer...). Returns the `StepStats` of the timed steps.
    Introduced in lesson 02.
    """
    from .train import train

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if getattr(device, "type", None) != "sim" and model is None:
        raise ValueError("measure_loader needs a model to train on a real device; with the simulated "
                         "accelerator (course_utils.sim.default_sim()) the model may be None")
    if warmup is None:
        warmup = 1 + in_flight_batches(loader)
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    timer = StepTimer(device, skip_first=warmup)
    result = train(model, _Epochs(loader), device=device, steps=warmup + steps, timer=timer, progress=progress,
                   desc=desc, **train_kwargs)
    if result.steps < warmup + steps:
        raise RuntimeError(f"the loader yielded {result.steps} batches, fewer than the {warmup + steps} needed")
    return result.stats


class _Epochs:
    """Iterates `loader` once per `iter()`, and raises if an epoch yields nothing (a one-shot
    iterator already used up would otherwise make a step-counted loop spin forever)."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        n = 0
        for batch in self.loader:
            n += 1
            yield batch
        if n == 0:
            raise RuntimeError("the loader yielded no batches (is it a one-shot iterator that is used up?)")


# -- epoch start-up ---------------------------------------------------------------------------

@dataclass
class EpochTime:
    """One pass over a loader: seconds until the first batch, seconds for the whole epoch."""
    first_batch_s: float
    total_s: float
    batches: int


def epoch_times(loader, epochs: int = 3, *, consume=None) -> list[EpochTime]:
    """Iterate `loader` for `epochs` full epochs and time each: `first_batch_s` is what starting
    the epoch costs (forking and initialising workers, filling their queues), `total_s` the
    whole epoch. `consume(batch)` is called on each batch (default: nothing). Lesson 02 uses it
    to show what `persistent_workers=True` saves."""
    out = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        first = None
        n = 0
        for batch in loader:
            if first is None:
                first = time.perf_counter() - t0
            if consume is not None:
                consume(batch)
            n += 1
        total = time.perf_counter() - t0
        out.append(EpochTime(first if first is not None else total, total, n))
    return out


# -- worker memory ----------------------------------------------------------------------------

@dataclass
class ProcessMemory:
    """Memory of one process in MiB.

    rss: resident pages, shared ones included (a page shared by 5 processes counts 5 times);
    uss: pages only this process holds (what it would free by exiting: its own copies);
    pss: resident pages with each shared page split between its sharers (sums to the truth).
    uss and pss are None where the platform cannot tell (they need /proc/PID/smaps, Linux)."""
    pid: int
    rss_mib: float
    uss_mib: float | None
    pss_mib: float | None


def process_memory(pid: int | None = None) -> ProcessMemory:
    """RSS, USS and PSS of process `pid` (default: this one), in MiB, read with psutil."""
    proc = psutil.Process(pid or os.getpid())
    try:
        full = proc.memory_full_info()
        uss = getattr(full, "uss", None)
        pss = getattr(full, "pss", None)
        rss = full.rss
    except (psutil.AccessDenied, NotImplementedError):
        rss, uss, pss = proc.memory_info().rss, None, None
    mib = 2.0 ** 20
    return ProcessMemory(proc.pid, rss / mib, None if uss is None else uss / mib,
                         None if pss is None else pss / mib)


def worker_pids(iterator) -> list[int]:
    """Process ids of the workers behind a running DataLoader iterator (`iter(loader)`), in
    worker order. An iterator with `num_workers=0` has none."""
    workers = getattr(iterator, "_workers", None)   # torch's multiprocessing iterator keeps them here
    if workers is None:
        return []
    return [w.pid for w in workers if w.pid is not None]


def worker_memory(iterator) -> list[ProcessMemory]:
    """`ProcessMemory` of each worker of a running DataLoader iterator (lesson 02): how much of
    the dataset each worker has ended up copying (USS) and its fair share of the rest (PSS)."""
    out = []
    for pid in worker_pids(iterator):
        try:
            out.append(process_memory(pid))
        except psutil.NoSuchProcess:
            continue
    return out


# -- who used the CPU -------------------------------------------------------------------------

def _busy_seconds(times) -> float:
    # guest time is already inside user time on Linux; idle and iowait are not busy
    return sum(getattr(times, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


def _own_seconds(proc: psutil.Process) -> dict:
    out = {}
    for p in [proc] + proc.children(recursive=True):
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:
            continue
    return out


class CpuUse:
    """Context manager: cores used during the block by this process and its children (workers)
    and by everything else on the machine (lesson 02).

        with CpuUse() as cpu:
            stats = measure_loader(loader, device, 50)
        print(cpu)   # e.g. "ours 1.9 cores, other processes 0.1 of 2 usable cores"

    `others_cores` is machine-wide busy time minus ours, per second of wall time: when another
    job shares the machine, it says how much of the CPU the measurement did not get."""

    def __init__(self):
        self.wall_s = self.ours_cores = self.others_cores = 0.0

    def __enter__(self) -> "CpuUse":
        self._proc = psutil.Process()
        self._own0 = _own_seconds(self._proc)
        t = os.times()
        self._reaped0 = t.children_user + t.children_system
        self._sys0 = _busy_seconds(psutil.cpu_times())
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = max(time.perf_counter() - self._t0, 1e-9)
        system = _busy_seconds(psutil.cpu_times()) - self._sys0
        own1 = _own_seconds(self._proc)
        live = sum(max(v - self._own0.get(pid, 0.0), 0.0) for pid, v in own1.items())
        t = os.times()
        reaped = (t.children_user + t.children_system) - self._reaped0   # workers that exited meanwhile
        ours = live + reaped
        self.wall_s = wall
        self.ours_cores = ours / wall
        self.others_cores = max(system - ours, 0.0) / wall

    def __str__(self) -> str:
        from .env import usable_cores
        return (f"ours {self.ours_cores:.1f} cores, other processes {self.others_cores:.1f} "
                f"(of {usable_cores()} usable cores) over {self.wall_s:.1f} s")
