"""What `watch nvidia-smi` and `htop` would show, recorded and plotted inline (lesson 01).

`UtilizationMonitor` samples in a background thread, about every 100 ms:
- GPU utilisation and memory through nvidia-ml-py (NVML) when an NVIDIA GPU is present,
- the simulated accelerator's busy share when one is passed (`sim=`), labelled simulated,
- per-core CPU utilisation through psutil.

    with UtilizationMonitor(sim=device) as mon:
        train(...)
    mon.timeline.plot()

Sampling costs a few tens of microseconds every 100 ms (`benchmarks/monitor_overhead.py`
measures its overhead on a training loop).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import psutil

__all__ = ["UtilizationMonitor", "Timeline", "synthetic_timeline", "TIMELINE_KINDS"]

TIMELINE_KINDS = ("input-bound", "compute-bound", "sync-bound")


@dataclass
class Timeline:
    """Samples from a `UtilizationMonitor` run (or built by hand for an exercise).

    t_s: (T,) seconds since start; cpu_percent: (T, cores) per-core utilisation in %;
    gpu_util: (T,) device utilisation in % or None; gpu_mem_mb: (T,) device memory used or None.
    """
    t_s: np.ndarray
    cpu_percent: np.ndarray
    gpu_util: np.ndarray | None = None
    gpu_mem_mb: np.ndarray | None = None
    device: str = ""
    host: str = ""
    simulated: bool = False
    marks: list = field(default_factory=list)

    @property
    def cores(self) -> int:
        return int(self.cpu_percent.shape[1]) if self.cpu_percent.ndim == 2 else 1

    def summary(self) -> dict:
        """Mean device utilisation, mean CPU per core and the busiest core's mean, in %."""
        cpu = np.asarray(self.cpu_percent, dtype=float)
        out = {
            "samples": int(len(self.t_s)),
            "cpu_mean_percent": float(cpu.mean()) if cpu.size else 0.0,
            "cpu_busiest_core_percent": float(cpu.mean(axis=0).max()) if cpu.size else 0.0,
        }
        if self.gpu_util is not None and len(self.gpu_util):
            out["device_util_mean_percent"] = float(np.mean(self.gpu_util))
        return out

    def plot(self, ax=None, title: str | None = None):
        """Two panels: device utilisation (and memory), then per-core CPU utilisation."""
        import matplotlib.pyplot as plt

        own_figure = ax is None
        if own_figure:
            fig, axes = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
        else:
            axes = ax
            fig = axes[0].figure
        dev_ax, cpu_ax = axes
        if self.gpu_util is not None:
            what = "simulated device busy %" if self.simulated else "GPU utilisation %"
            dev_ax.plot(self.t_s, self.gpu_util, color="tab:green", label=what)
            dev_ax.fill_between(self.t_s, self.gpu_util, color="tab:green", alpha=0.2)
            dev_ax.set_ylim(0, 105)
            dev_ax.set_ylabel(what)
            if self.gpu_mem_mb is not None and not self.simulated:
                mem_ax = dev_ax.twinx()
                mem_ax.plot(self.t_s, self.gpu_mem_mb, color="tab:purple", alpha=0.6)
                mem_ax.set_ylabel("GPU memory MB", color="tab:purple")
        else:
            dev_ax.text(0.5, 0.5, "no device readings (no GPU, no simulated accelerator)",
                        ha="center", va="center", transform=dev_ax.transAxes)
        if own_figure:
            dev_ax.set_title(f"device: {self.device or 'none'}", fontsize=9, loc="left")
        else:
            dev_ax.set_title(title or self.device, fontsize=10)
        cpu = np.asarray(self.cpu_percent, dtype=float)
        for core in range(self.cores):
            cpu_ax.plot(self.t_s, cpu[:, core], lw=1, alpha=0.8, label=f"core {core}")
        cpu_ax.set_ylim(0, 105)
        cpu_ax.set_ylabel("CPU % per core")
        cpu_ax.set_xlabel("seconds")
        if own_figure:
            cpu_ax.set_title(f"host: {self.host}", fontsize=9, loc="left")
        if self.cores <= 4:
            cpu_ax.legend(fontsize=7, loc="upper right", ncol=min(self.cores, 4))
        for t, label in self.marks:
            for a in (dev_ax, cpu_ax):
                a.axvline(t, color="grey", ls="--", lw=0.8)
            dev_ax.text(t, 100, f" {label}", fontsize=7, va="top")
        if own_figure:
            fig.suptitle(title or ("Utilisation timeline" + (" (simulated device)" if self.simulated else "")))
            fig.tight_layout()
        return fig


class UtilizationMonitor:
    """Sample device and per-core CPU utilisation in a background thread (context manager)."""

    def __init__(self, interval_s: float = 0.1, *, gpu_index: int | None = 0, sim=None):
        self.interval_s = interval_s
        self.sim = sim
        self.gpu_index = gpu_index
        self._stop = threading.Event()
        self._thread = None
        self._t, self._cpu, self._gpu, self._mem = [], [], [], []
        self._marks = []
        self._nvml = None
        self._t0 = None

    # -- context manager -----------------------------------------------------------------
    def __enter__(self) -> "UtilizationMonitor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("this monitor is already running")
        if self.sim is None and self.gpu_index is not None:
            self._nvml = _open_nvml(self.gpu_index)
        psutil.cpu_percent(percpu=True)  # prime: the next call reports usage since now
        self._last_busy = self.sim.busy_seconds() if self.sim is not None else 0.0
        self._t0 = self._last_t = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="utilization-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._sample()  # one last sample up to now
        if self._nvml is not None:
            _close_nvml()

    def mark(self, label: str) -> None:
        """Put a labelled vertical line on the timeline at this moment."""
        self._marks.append((time.perf_counter() - self._t0, label))

    # -- sampling ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        now = time.perf_counter()
        self._t.append(now - self._t0)
        self._cpu.append(psutil.cpu_percent(percpu=True))
        if self.sim is not None:
            busy = self.sim.busy_seconds()
            dt = max(now - self._last_t, 1e-9)
            self._gpu.append(min(100.0, 100.0 * (busy - self._last_busy) / dt))
            self._last_busy = busy
        elif self._nvml is not None:
            import pynvml
            util = pynvml.nvmlDeviceGetUtilizationRates(self._nvml)
            mem = pynvml.nvmlDeviceGetMemoryInfo(self._nvml)
            self._gpu.append(float(util.gpu))
            self._mem.append(mem.used / 2**20)
        self._last_t = now

    @property
    def timeline(self) -> Timeline:
        from .env import device_label, cpu_name, usable_cores
        if self.sim is not None:
            device = device_label(self.sim)
        elif self._nvml is not None:
            device = f"{_nvml_name(self._nvml)} (NVML)"
        else:
            device = "none"
        return Timeline(
            t_s=np.asarray(self._t),
            cpu_percent=np.asarray(self._cpu, dtype=float).reshape(len(self._t), -1),
            gpu_util=np.asarray(self._gpu) if self._gpu else None,
            gpu_mem_mb=np.asarray(self._mem) if self._mem else None,
            device=device,
            host=f"{cpu_name()}, {usable_cores()} usable cores ({psutil.cpu_count()} shown)",
            simulated=self.sim is not None,
            marks=list(self._marks),
        )


def _open_nvml(index: int):
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None


def _close_nvml() -> None:
    try:
        import pynvml
        pynvml.nvmlShutdown()
    except Exception:
        pass


def _nvml_name(handle) -> str:
    import pynvml
    name = pynvml.nvmlDeviceGetName(handle)
    return name.decode() if isinstance(name, bytes) else name


def synthetic_timeline(kind: str, *, cores: int = 8, seconds: float = 10.0, interval_s: float = 0.1,
                       rng: np.random.Generator | None = None) -> Timeline:
    """An illustrative (made-up, labelled simulated) timeline of one of three situations:

    - "input-bound": every CPU core saturated by loader workers, the device idle between batches;
    - "compute-bound": the device busy nearly all the time, the CPU with room to spare;
    - "sync-bound": device and host take turns: the device idles while one host thread works
      (a `.item()` or a copy every step), and the other cores are idle too.
    Lesson 01's diagnosis exercise reads these.
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
        cpu = busy(rng.uniform(15, 60), 10, (n, cores))
    else:
        period = rng.integers(3, 8)       # samples per step: a saw-tooth of busy and idle
        duty = rng.uniform(0.3, 0.6)
        phase = (np.arange(n) + rng.integers(0, period)) % period
        gpu = np.where(phase < duty * period, busy(92, 5, n), busy(5, 4, n))
        if kind == "input-bound":
            cpu = busy(rng.uniform(90, 98), 3, (n, cores))
        else:
            cpu = busy(rng.uniform(3, 12), 4, (n, cores))
            main = rng.integers(cores)
            cpu[:, main] = busy(rng.uniform(80, 98), 5, n)
    return Timeline(t_s=t, cpu_percent=cpu, gpu_util=gpu, device=f"synthetic example ({kind}), simulated",
                    host=f"synthetic example, {cores} cores", simulated=True)
