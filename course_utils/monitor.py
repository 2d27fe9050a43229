"""What `watch nvidia-smi` and `htop` would show, recorded and plotted inline (lesson 01).

`UtilizationMonitor` samples in a background thread, about every 100 ms:
- the GPU the lesson trains on, through nvidia-ml-py (NVML): utilisation and memory. NVML
  numbers GPUs in PCI order and ignores `CUDA_VISIBLE_DEVICES`, CUDA numbers them fastest
  first among the visible ones, so `cuda:0` is often not NVML's GPU 0: the monitor finds the
  torch device's GPU by its UUID (else its PCI bus id), never by index;
- the simulated accelerator's busy share when one is passed, labelled simulated;
- per-core CPU utilisation through psutil (what `htop` shows: every process on the machine),
  split into the **course's own processes** (this kernel and its children: DataLoader
  workers, torchrun ranks) and **everything else** on the machine, in cores.

    with UtilizationMonitor(device=run_on) as mon:     # run_on: cuda:N, cpu, or the simulator
        train(...)
    mon.timeline.plot()

`course_utils.live.LiveMonitor` shows the same samples live in a notebook (ipywidgets).
Sampling costs well under 1% of one core (`benchmarks/monitor_overhead.py` measures it).
"""
from __future__ import annotations

import bisect
import os
import textwrap
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import psutil

__all__ = ["UtilizationMonitor", "Timeline", "synthetic_timeline", "TIMELINE_KINDS", "nvml_handle_for", "nvml_call",
           "nvml_constant", "nvml_open", "nvml_close", "nvml_find", "nvml_reading", "nvml_text"]

TIMELINE_KINDS = ("input-bound", "compute-bound", "sync-bound")


@dataclass
class Timeline:
    """Samples from a `UtilizationMonitor` run (or built by hand for an exercise).

    t_s: (T,) seconds since start; cpu_percent: (T, cores) per-core utilisation in %, every
    process on the machine; gpu_util: (T,) device utilisation in % or None; gpu_mem_mb: (T,)
    device memory used or None; ours_cores / others_cores: (T,) cores busy with the course's
    own processes (this kernel and its children) and with every other process, or None.
    """
    t_s: np.ndarray
    cpu_percent: np.ndarray
    gpu_util: np.ndarray | None = None
    gpu_mem_mb: np.ndarray | None = None
    device: str = ""
    host: str = ""
    simulated: bool = False
    marks: list = field(default_factory=list)
    ours_cores: np.ndarray | None = None
    others_cores: np.ndarray | None = None

    @property
    def cores(self) -> int:
        return int(self.cpu_percent.shape[1]) if self.cpu_percent.ndim == 2 else 1

    def summary(self) -> dict:
        """Means over the run: device utilisation, CPU per core, the busiest core, and (when
        recorded) the cores used by the course's processes and by other processes."""
        cpu = np.asarray(self.cpu_percent, dtype=float)
        out = {
            "samples": int(len(self.t_s)),
            "cpu_mean_percent": float(cpu.mean()) if cpu.size else 0.0,
            "cpu_busiest_core_percent": float(cpu.mean(axis=0).max()) if cpu.size else 0.0,
        }
        if self.gpu_util is not None and len(self.gpu_util):
            out["device_util_mean_percent"] = float(np.mean(self.gpu_util))
        if self.ours_cores is not None and len(self.ours_cores):
            out["ours_cores_mean"] = float(np.mean(self.ours_cores))
            out["others_cores_mean"] = float(np.mean(self.others_cores))
        return out

    def plot(self, ax=None, title: str | None = None):
        """Device utilisation (and memory), per-core CPU, and, when recorded, the cores used by
        the course's processes against everything else (one panel each)."""
        import matplotlib.pyplot as plt

        split = self.ours_cores is not None
        own_figure = ax is None
        if own_figure:
            rows = 3 if split else 2
            fig, axes = plt.subplots(rows, 1, figsize=(9, 6.6 if split else 5), sharex=True,
                                     gridspec_kw={"height_ratios": [1, 1, 0.8][:rows]})
        else:
            axes = ax
            fig = axes[0].figure
        dev_ax, cpu_ax = axes[0], axes[1]
        who_ax = axes[2] if split and len(axes) > 2 else None
        if self.gpu_util is not None:
            # NVML's figure is the share of each sample period in which any kernel ran (however few SMs
            # it kept busy), not how busy the GPU is; the simulator's is its exact busy share, copies included
            what = "simulated device busy %" if self.simulated else "GPU utilisation %\n(NVML: any kernel running)"
            dev_ax.plot(self.t_s, self.gpu_util, color="tab:green", label=what)
            dev_ax.fill_between(self.t_s, self.gpu_util, color="tab:green", alpha=0.2)
            dev_ax.set_ylim(0, 105)
            dev_ax.set_ylabel(what)
            if self.gpu_mem_mb is not None and not self.simulated:
                mem_ax = dev_ax.twinx()
                mem_ax.plot(self.t_s, self.gpu_mem_mb, color="tab:purple", alpha=0.6)
                mem_ax.set_ylabel("GPU memory used, MiB\n(NVML: every process, CUDA contexts included)",
                                  color="tab:purple", fontsize=8)
        else:
            dev_ax.text(0.5, 0.5, "no device readings (no GPU, no simulated accelerator)",
                        ha="center", va="center", transform=dev_ax.transAxes)
            dev_ax.set_yticks([])
        if own_figure:
            dev_ax.set_title(textwrap.fill(f"device: {self.device or 'none'}", 110), fontsize=9, loc="left")
        else:
            dev_ax.set_title(title or self.device, fontsize=10)
        cpu = np.asarray(self.cpu_percent, dtype=float)
        if self.cores <= MAX_CORE_LINES:
            # a style of its own per core, wider lines first: two cores at the same 100% stay both visible
            styles = ["-", "--", ":", "-."]
            for core in range(self.cores):
                cpu_ax.plot(self.t_s, cpu[:, core], lw=2.2 - 1.2 * core / max(self.cores - 1, 1), alpha=0.8,
                            ls=styles[core % len(styles)], label=f"core {core}")
            if self.cores > 1 and len(cpu) and float(np.nanmax(cpu.max(axis=1) - cpu.min(axis=1))) < 3:
                cpu_ax.text(0.99, 0.04, f"the {self.cores} cores' lines lie on top of each other (within 3 points "
                            "all along)", transform=cpu_ax.transAxes, ha="right", va="bottom", fontsize=7)
        else:                                          # a line per core is unreadable on a big node: the spread
            cpu_ax.fill_between(self.t_s, cpu.min(axis=1), cpu.max(axis=1), color="tab:blue", alpha=0.2,
                                label=f"{self.cores} cores: least to most busy")
            cpu_ax.plot(self.t_s, np.median(cpu, axis=1), color="tab:blue", lw=1, label="median core")
            cpu_ax.legend(fontsize=7, loc="upper left", ncol=2, frameon=False)
        cpu_ax.set_ylabel("CPU % per core\n(all processes)" if split else "CPU % per core")
        if own_figure:
            cpu_ax.set_title(f"host: {self.host}", fontsize=9, loc="left")
        if self.cores <= 4:                            # the legend above the data, in headroom of its own
            cpu_ax.set_ylim(0, 135)
            cpu_ax.set_yticks([0, 25, 50, 75, 100])
            cpu_ax.legend(fontsize=7, loc="upper left", ncol=min(self.cores, 4), frameon=False)
        else:
            cpu_ax.set_ylim(0, 105)
        if who_ax is not None:
            ours = np.asarray(self.ours_cores, dtype=float)
            others = np.asarray(self.others_cores, dtype=float)
            who_ax.stackplot(self.t_s, ours, others, colors=["tab:blue", "tab:grey"], alpha=0.6,
                             labels=["the course (this kernel and its workers)", "other processes"])
            who_ax.set_ylim(0, self.cores * 1.45)
            who_ax.set_yticks(np.linspace(0, self.cores, min(self.cores, 4) + 1))
            who_ax.set_ylabel("cores busy")
            who_ax.legend(fontsize=7, loc="upper left", ncol=2, frameon=False)
        (who_ax or cpu_ax).set_xlabel("seconds")
        for t, label in self.marks:
            for a in axes:
                a.axvline(t, color="grey", ls="--", lw=0.8)
            dev_ax.text(t, 100, f" {label}", fontsize=7, va="top")
        if own_figure:
            fig.suptitle(title or ("Utilisation timeline" + (" (simulated device)" if self.simulated else "")))
            fig.tight_layout()
        return fig


class _CourseProcesses:
    """CPU seconds used by this process and its descendants (DataLoader workers, torchrun
    ranks): the course's own processes.

    Each read takes the CPU times of the processes already known (some microseconds each).
    The process tree is rescanned every `rescan_s`: on Linux through /proc/PID/task/*/children
    (our own threads' children only: some tens of microseconds, so at every sample), elsewhere
    (or where the kernel lacks that file) through psutil, which reads every process on the machine
    (milliseconds on a busy one), so every 2 s. A new child is found up to `rescan_s` late (a
    sweep of DataLoader workers starts new ones at every point): the CPU time it used
    before it was found is handed back as *late* time, to be spread over the samples since it
    was born (on Linux, read from /proc; elsewhere, since the scan before: a child born just
    before it was found then looks busy for longer and less busy than it was, and the rest of
    its time shows as other processes'). A child that came and went between two scans is
    counted when it is reaped (`os.times()`): the time a known child used after its last read
    is spread over the samples since that read, a child that no scan found over the last
    `rescan_s`."""

    def __init__(self, rescan_s: float | None = None):
        self.me = psutil.Process()
        self.fast = _children_of(self.me.pid) is not None
        self.rescan_s = rescan_s if rescan_s is not None else (0.05 if self.fast else 2.0)

    def start(self) -> None:
        self._scanned_at = 0.0
        self._start_perf = time.perf_counter()
        self._me_last = _cpu_seconds(self.me)
        self._reaped_last = _reaped_seconds()
        self._procs: dict[int, psutil.Process] = {}
        self._last: dict[int, float] = {}     # a child's CPU seconds when last read
        self._gone: dict[int, float] = {}     # children that ended: their last reading
        self._late: list[tuple[float, float]] = []
        self._next_scan = 0.0
        self._read_at = 0.0                   # seconds after start of the last read
        self._scan(first=True)

    def _scan(self, first: bool = False) -> None:
        previous = getattr(self, "_scanned_at", 0.0)      # a child found now was born after it
        self._scanned_at = time.perf_counter() - self._start_perf
        self._next_scan = time.perf_counter() + self.rescan_s
        try:
            children = _descendants(self.me.pid) if self.fast else [c.pid for c in self.me.children(recursive=True)]
        except psutil.Error:
            return
        for pid in children:
            if pid in self._procs:
                continue
            try:
                child = psutil.Process(pid)
                seconds = _cpu_seconds(child)
            except psutil.Error:
                continue
            self._procs[pid] = child
            self._last[pid] = seconds
            if not first:                                     # its life so far, counted now
                born = _age_s(pid)
                since = previous if born is None else max(previous, self._scanned_at - born)
                self._late.append((since, seconds))

    def rescan_now(self) -> None:
        """Look for new children at the next read, whatever the rescan interval."""
        self._next_scan = 0.0

    def read(self) -> tuple[float, list[tuple[float, float]]]:
        """CPU seconds since the last read, and late time as (since_s, seconds) pairs, where
        since_s is when (seconds after start) that time began to be spent."""
        if time.perf_counter() >= self._next_scan:
            self._scan()
        me = _cpu_seconds(self.me)
        delta = me - self._me_last
        self._me_last = me
        for pid, proc in list(self._procs.items()):
            try:
                seconds = _cpu_seconds(proc)
            except psutil.Error:
                self._gone[pid] = self._last.pop(pid)
                del self._procs[pid]
                continue
            delta += max(seconds - self._last[pid], 0.0)
            self._last[pid] = seconds
        # a direct child that was reaped moved its whole CPU time into os.times(): what of it
        # was never read while it lived is late time (a child found by no scan: all of it)
        reaped = _reaped_seconds()
        unseen = reaped - self._reaped_last - sum(self._gone.values())
        self._reaped_last = reaped
        now = time.perf_counter() - self._start_perf
        # known children that ended used it since the last read; a child no scan found, since
        # it was born, at most `rescan_s` ago
        since = self._read_at if self._gone else max(now - self.rescan_s, 0.0)
        self._gone.clear()
        self._read_at = now
        late, self._late = self._late, []
        if unseen > 0.005:
            late.append((since, unseen))
        return max(delta, 0.0), late


def _busy_percent(before, after, previous=None) -> list[float]:
    """Each core's busy share (%) between two `psutil.cpu_times(percpu=True)` readings: all but idle
    and iowait, as htop and psutil count it. Read from the two readings themselves, not through
    `psutil.cpu_percent`, which keeps its last reading per thread (psutil 7): a first call from a
    thread that did not prime it reads 0% (issue 35: a spurious 0% first sample), and a call from
    another thread reads since that thread's last call. A core whose counters did not tick between
    the readings keeps its `previous` value."""
    out = []
    for k, (x, y) in enumerate(zip(before, after)):
        delta = {f: getattr(y, f) - getattr(x, f) for f in x._fields}
        total = sum(v for f, v in delta.items() if f not in ("guest", "guest_nice"))   # guest is inside user
        if total <= 0:
            out.append(float(previous[k]) if previous is not None and k < len(previous) else 0.0)
            continue
        idle = delta.get("idle", 0.0) + delta.get("iowait", 0.0)
        out.append(min(max(100.0 * (total - idle) / total, 0.0), 100.0))
    return out


def _children_of(pid: int) -> list[int] | None:
    """Direct children of `pid` from /proc/PID/task/*/children (Linux with CONFIG_PROC_CHILDREN),
    or None where that file does not exist."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    children = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                children += [int(x) for x in f.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue            # the thread ended meanwhile
            return None             # no such file on this kernel
        except OSError:
            continue
    return children


def _age_s(pid: int) -> float | None:
    """How many seconds ago process `pid` started (Linux: its start time in /proc/PID/stat against
    /proc/uptime, to about 10 ms), or None where that cannot be read."""
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return max(uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 0.0)   # field 22: starttime
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in _children_of(todo.pop()) or []:
            out.append(child)
            todo.append(child)
    return out


def _cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _reaped_seconds() -> float:
    t = os.times()
    return t.children_user + t.children_system


MAX_CORE_LINES = 16   # more host cores than this are plotted as a band (least to most busy) and a median


class UtilizationMonitor:
    """Sample device and per-core CPU utilisation in a background thread (context manager).

    `device` is what the lesson trains on (`Target.run_on`): a CUDA device (its GPU is read
    through NVML, found by UUID or PCI bus id), the CPU (no device readings), or a
    `SimulatedAccelerator` (its busy share, labelled simulated). `sim=` is the older name of
    the same argument. With neither, the current CUDA device when there is one (which respects
    `CUDA_VISIBLE_DEVICES` and the `torch.cuda.set_device(local_rank)` of a DDP script).
    `on_sample(monitor)` is called from the sampling thread after every sample (the live
    widget refreshes through it).
    """

    def __init__(self, interval_s: float = 0.1, *, device=None, sim=None, on_sample=None):
        if device is not None and sim is not None and device is not sim:
            raise ValueError("pass the device once: `device=` (`sim=` is the older name of the same argument)")
        self.interval_s = interval_s
        target = device if device is not None else sim
        self.sim = target if hasattr(target, "busy_seconds") else None
        self.cuda_device = None if self.sim is not None else _cuda_device(target)
        self.cpu_target = target is not None and self.sim is None and self.cuda_device is None
        self.on_sample = on_sample
        self._stop = threading.Event()
        self._thread = None
        self._lock = threading.Lock()
        self._t, self._dt, self._cpu, self._gpu, self._mem, self._ours = [], [], [], [], [], []
        self._marks = []
        self._nvml = None
        self._nvml_note = ""
        self._t0 = None
        self._course = _CourseProcesses()
        self._host = self._device_name = ""
        self.sample_seconds = 0.0     # CPU time the sampling thread spent sampling (its cost)

    # -- context manager -----------------------------------------------------------------
    def __enter__(self) -> "UtilizationMonitor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("this monitor is already running")
        if self.cuda_device is not None:
            self._nvml, self._nvml_note = nvml_handle_for(self.cuda_device)
        self._cpu_times = psutil.cpu_times(percpu=True)   # each sample: the busy share of each core since the last
        self._course.start()
        self._last_busy = self.sim.busy_seconds() if self.sim is not None else 0.0
        from .env import cpu_name, usable_cores
        self._host = f"{cpu_name()}, {usable_cores()} usable cores ({psutil.cpu_count()} shown)"
        self._device_name = self.device_name
        self._t0 = self._last_t = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="utilization-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._course.rescan_now()   # children born since the last scan (workers of a short run) are ours too
        if not self._t or time.perf_counter() - self._last_t >= self.interval_s / 2:
            self._sample()  # one last sample up to now (unless the last one was just taken)
        else:
            _, late = self._course.read()
            with self._lock:
                for since, seconds in late:
                    self._spread(since, seconds)
        if self._nvml is not None:
            nvml_close()

    def mark(self, label: str) -> None:
        """Put a labelled vertical line on the timeline at this moment."""
        self._marks.append((time.perf_counter() - self._t0, label))

    # -- sampling ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            cpu0 = time.thread_time()
            self._sample()
            self.sample_seconds += time.thread_time() - cpu0
            if self.on_sample is not None:
                try:
                    self.on_sample(self)
                except Exception as err:   # a broken view must not stop the sampling
                    self.on_sample = None
                    print(f"live view stopped: {err!r}")

    def _sample(self) -> None:
        now = time.perf_counter()
        dt = max(now - self._last_t, 1e-9)
        times = psutil.cpu_times(percpu=True)
        cpu = _busy_percent(self._cpu_times, times, self._cpu[-1] if self._cpu else None)
        self._cpu_times = times
        ours_s, late = self._course.read()
        gpu = mem = None
        if self.sim is not None:
            busy = self.sim.busy_seconds()
            gpu = min(100.0, 100.0 * (busy - self._last_busy) / dt)
            self._last_busy = busy
        elif self._nvml is not None:
            gpu, mem = nvml_reading(self._nvml)
        with self._lock:
            self._t.append(now - self._t0)
            self._dt.append(dt)
            self._cpu.append(cpu)
            self._ours.append(ours_s)
            for since, seconds in late:
                self._spread(since, seconds)
            if gpu is not None or self.sim is not None or self._nvml is not None:
                self._gpu.append(np.nan if gpu is None else gpu)
                self._mem.append(np.nan if mem is None else mem)
        self._last_t = now

    def _spread(self, since: float, seconds: float) -> None:
        """Add `seconds` of CPU time to the samples after `since`, in proportion to their length."""
        first = next((i for i in range(len(self._t)) if self._t[i] > since), len(self._t) - 1)
        span = sum(self._dt[first:])
        for i in range(first, len(self._t)):
            self._ours[i] += seconds * self._dt[i] / span

    @property
    def device_name(self) -> str:
        from .env import device_label
        if self.sim is not None:
            return device_label(self.sim)
        if self._nvml is not None:
            return f"{_nvml_name(self._nvml)} ({self.cuda_device}, found in NVML by {self._nvml_note})"
        if self.cuda_device is not None:
            return f"{self.cuda_device}: no NVML readings ({self._nvml_note})"
        if self.cpu_target:
            return "the CPU itself (no separate device: its work shows in the cores)"
        return "none"

    @property
    def timeline(self) -> Timeline:
        """Every sample so far, as a `Timeline` (also while the monitor runs)."""
        return self.recent(None)

    def recent(self, seconds: float | None) -> Timeline:
        """The samples of the last `seconds` (all of them for None), as a `Timeline`."""
        from .env import cpu_name, usable_cores
        with self._lock:
            first = 0
            if seconds is not None and self._t:
                first = bisect.bisect_left(self._t, self._t[-1] - seconds)
            t, dt, cpu, gpu, mem, ours = (x[first:] for x in (self._t, self._dt, self._cpu, self._gpu, self._mem,
                                                               self._ours))
        cpu = np.asarray(cpu, dtype=float).reshape(len(t), -1)
        # CPU times tick every 10 ms: over a very short sample the rate is noise; no more than every core
        ours = np.minimum(np.asarray(ours, dtype=float) / np.maximum(np.asarray(dt, dtype=float), 1e-9),
                          float(cpu.shape[1]))
        machine = cpu.sum(axis=1) / 100.0
        mem = np.asarray(mem, dtype=float)
        return Timeline(
            t_s=np.asarray(t),
            cpu_percent=cpu,
            gpu_util=np.asarray(gpu, dtype=float) if gpu else None,
            gpu_mem_mb=mem if len(mem) and not np.all(np.isnan(mem)) else None,
            device=self._device_name or self.device_name,
            host=self._host or f"{cpu_name()}, {usable_cores()} usable cores ({psutil.cpu_count()} shown)",
            simulated=self.sim is not None,
            marks=list(self._marks),
            ours_cores=ours,
            others_cores=np.maximum(machine - ours, 0.0),
        )


# -- NVML: the torch device's GPU, by UUID or PCI bus id ------------------------------------

def _cuda_device(target):
    """The torch CUDA device to read through NVML, or None (CPU, no GPU, no torch CUDA)."""
    import torch
    if target is None:
        if not torch.cuda.is_available():
            return None
        return torch.device("cuda", torch.cuda.current_device())
    device = torch.device(target) if not isinstance(target, torch.device) else target
    if device.type != "cuda":
        return None
    return torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())


def _cuda_identity(device) -> tuple[list[str], str | None]:
    """NVML UUID strings to try, and the PCI bus id, of a torch CUDA device."""
    import torch
    props = torch.cuda.get_device_properties(device.index)
    uuids = []
    raw = getattr(props, "uuid", None)
    if raw is not None:
        text = str(raw)
        if text.startswith(("GPU-", "MIG-")):
            uuids.append(text)
        else:
            uuids += [f"GPU-{text}", f"MIG-{text}"]
    pci = None
    if all(hasattr(props, k) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        pci = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    return uuids, pci


def nvml_call(function: str, *args):
    """`pynvml.<function>(*args)`, or None when NVML does not report it. The function is looked
    up inside the guard: a binding that lacks it (an older or newer nvidia-ml-py), an NVMLError
    (not supported on this GPU, a vGPU or MIG slice, a lost driver) or no NVML at all give None,
    never an exception. Every NVML query of the course goes through here (lesson 00's report
    died on a binding without nvmlDeviceGetEnforcedPowerManagementLimit)."""
    try:
        import pynvml
        return getattr(pynvml, function)(*args)
    except Exception:
        return None


def nvml_constant(name: str, default):
    """A pynvml constant, or `default` when the binding lacks it (or there is none)."""
    try:
        import pynvml
        return getattr(pynvml, name, default)
    except Exception:
        return default


def nvml_open() -> str | None:
    """Start NVML (nvmlInit; pair it with `nvml_close()`). None when it started; otherwise why
    not, in words."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as err:
        return f"NVML not available: {type(err).__name__}: {err}"
    return None


def nvml_close() -> None:
    """nvmlShutdown, guarded (NVML counts its starts: one close per successful open)."""
    nvml_call("nvmlShutdown")


def nvml_find(device) -> tuple[object | None, str]:
    """The NVML handle of a torch CUDA device, NVML already started (`nvml_open`): matched by
    UUID, else PCI bus id, never by index; `(None, reason)` when no NVML GPU matches."""
    try:
        uuids, pci = _cuda_identity(device)
    except Exception as err:
        return None, f"cannot read {device}'s UUID and PCI bus id: {err}"
    for uuid in uuids:
        for value in (uuid, uuid.encode()):       # nvidia-ml-py versions take str or bytes
            handle = nvml_call("nvmlDeviceGetHandleByUUID", value)
            if handle is not None:
                return handle, "UUID"
    if pci is not None:
        handle = nvml_call("nvmlDeviceGetHandleByPciBusId", pci)
        if handle is not None:
            return handle, "PCI bus id"
    return None, f"no NVML GPU has {device}'s UUID or PCI bus id"


def nvml_handle_for(device) -> tuple[object | None, str]:
    """The NVML handle of the GPU behind a torch CUDA device, and how it was found (or why not).

    NVML ignores `CUDA_VISIBLE_DEVICES` and numbers GPUs in PCI order; CUDA numbers only the
    visible ones, fastest first unless `CUDA_DEVICE_ORDER=PCI_BUS_ID`. So the GPU is matched
    by its UUID, else by its PCI bus id, never by index. Returns `(None, reason)` when NVML is
    missing or no GPU matches (then the timeline has no device readings, and says why). With a
    handle, NVML stays started: call `nvml_close()` when done with it (lessons 01 and 06)."""
    why = nvml_open()
    if why is not None:
        return None, why
    handle, how = nvml_find(device)
    if handle is None:
        nvml_close()
    return handle, how


def nvml_reading(handle) -> tuple[float | None, float | None]:
    """Utilisation % and memory used (MiB) of an NVML handle; None for what NVML does not
    report (MIG slices report memory but not utilisation; vGPUs may report neither)."""
    util = nvml_call("nvmlDeviceGetUtilizationRates", handle)
    info = nvml_call("nvmlDeviceGetMemoryInfo", handle)
    try:
        util = None if util is None else float(util.gpu)
    except Exception:
        util = None
    try:
        mem = None if info is None else info.used / 2**20
    except Exception:
        mem = None
    return util, mem


def nvml_text(value) -> str | None:
    """An NVML string (bytes in older bindings) as text; None stays None."""
    return value.decode(errors="replace") if isinstance(value, bytes) else (None if value is None else str(value))


def _nvml_name(handle) -> str:
    return nvml_text(nvml_call("nvmlDeviceGetName", handle)) or "an NVIDIA GPU (NVML did not report its name)"


def synthetic_timeline(kind: str, *, cores: int = 8, seconds: float = 10.0, interval_s: float = 0.1,
                       rng: np.random.Generator | None = None, others: float = 0.0) -> Timeline:
    """An illustrative (made-up, labelled simulated) timeline of one of three situations, with the
    split a `UtilizationMonitor` records: the cores the course's own processes kept busy
    (`ours_cores`) and every other program's (`others_cores`):

    - "input-bound": the loader's workers saturate every CPU core, the device idles between batches;
    - "compute-bound": the device busy nearly all the time, the CPU with room to spare;
    - "sync-bound": device and host take turns: the device idles while one host thread works
      (a `.item()` or a copy every step, or all the loading in the main process), and the course
      keeps about one core busy.
    `others`: cores' worth of other programs' work on the machine (a shared machine), on top of a
    little background. Lesson 01's diagnosis exercise reads these.
    """
    if kind not in TIMELINE_KINDS:
        raise ValueError(f"kind must be one of {TIMELINE_KINDS}, got {kind!r}")
    rng = rng or np.random.default_rng()
    n = int(seconds / interval_s)
    t = np.arange(n) * interval_s

    def busy(mean, jitter, size):
        return np.clip(rng.normal(mean, jitter, size), 0, 100)

    if kind == "compute-bound":
        gpu = busy(rng.uniform(93, 99), 2.0, n)
        ours = busy(rng.uniform(15, 60), 10, (n, cores))
    else:
        period = rng.integers(3, 8)       # samples per step: a saw-tooth of busy and idle
        duty = rng.uniform(0.25, 0.45)   # busy less than half the samples: the median reads idle
        phase = (np.arange(n) + rng.integers(0, period)) % period
        gpu = np.where(phase < max(1, int(duty * period)), busy(92, 5, n), busy(5, 4, n))
        if kind == "input-bound":
            ours = busy(rng.uniform(90, 98), 3, (n, cores))
        else:
            ours = busy(rng.uniform(0, 4), 2, (n, cores))       # the kernel's other threads, a little
            main = rng.integers(cores)
            ours[:, main] = busy(rng.uniform(80, 98), 5, n)
    background = busy(rng.uniform(1, 5), 2, (n, cores))
    if others:
        room = 100 - ours - background
        background = background + room * min(1.0, others * 100 / max(room.sum(axis=1).mean(), 1e-9))
    cpu = np.clip(ours + background, 0, 100)
    ours_cores = ours.sum(axis=1) / 100
    return Timeline(t_s=t, cpu_percent=cpu, gpu_util=gpu, device=f"synthetic example ({kind}), simulated",
                    host=f"synthetic example, {cores} cores", simulated=True, ours_cores=ours_cores,
                    others_cores=np.maximum(cpu.sum(axis=1) / 100 - ours_cores, 0.0))
