"""A simulated accelerator for machines without a GPU: a model of a real, measured GPU box (lesson 01).

Most learners without a GPU, every workshop on CPU machines and all of CI see the course through
this device, so it has to tell the truth a real GPU tells. It is a model of one measured machine:
an NVIDIA H100 with 16 host cores per GPU, on which the course ran on 2026-11-24 (torch 2.11,
CUDA 13; every figure below is in the README's section "GPU: one NVIDIA H100 (2026-11-24)"). What that box
showed, and what this device therefore reproduces:

- **The host launches every kernel.** Eager PyTorch launches each of the ~390 kernels of a
  ResNet-18 training step from the host, about 28 us each there. At batch 128 that is 11 ms of
  host time per step against 7.5 ms of GPU work (TF32): the step is *launch-bound*, the GPU idles
  between kernels, and cheaper arithmetic does not help (bf16 autocast adds host work: 14 ms).
  A bigger batch launches the same kernels for more samples; a CUDA graph replays the whole step
  with one launch (the step then costs the GPU's own work: 3.3 ms in bf16 + channels_last).
- **The GPU's own work** is the step's time with the host's launches removed (a captured CUDA
  graph replayed): linear in the batch, fitted through batch 128 and 512 for each precision.
- **Loading CIFAR on one core of that host** (PIL crop + flip + ToTensor + Normalize,
  `num_workers=0`) ran at 3,157 samples/s, so the model-only ceiling was about 3.5x one core's
  loader and the baseline reached about 20% of it.

**Scaled to this host.** A fast workstation core and a slow VM core must both see that box's
picture, so the whole box is scaled to this CPU: `host_speed()` measures how fast one core here
runs the same baseline loader, and every time of the profile (host launches and GPU work alike)
is multiplied by `scale = 3,157 / (this host's samples/s)`. On a core half as fast as the H100
box's, the simulated GPU is half as fast too: the ratios (ceiling against one core's loader,
launch against GPU work) are the measured ones. The label of every figure says so.

**How it runs.** `step()` first spends the step's launch time *on the host*, in the calling
thread, as real CPU work (a quarter of it holding Python's GIL, the rest in C code that releases
it: an estimate of how much of eager PyTorch's dispatch is Python), and queues the GPU's work
on the device's timeline as it goes. The device is a *virtual clock*: each piece of work starts
when the device is free and its input has been launched, and ends its duration later; events
record those times exactly, `synchronize()` sleeps (GIL released) until the queue is empty, and
nothing is timed by a thread that could be late. So loading and overlap behave as beside a real
GPU, a busy host slows the launches (as it would) but never the device's own work, and the
device's busy time (`busy_seconds`: the share of time it works, copies included) is exact. NVML's
"GPU utilisation" on a real GPU is a sampled, kernel-only version of it (the share of each 1/6 to
1 s period in which any kernel ran, however few SMs it used): expect it to differ.

Work a real GPU would do *on the device* besides the model step (normalising or augmenting a
batch there, lesson 03) is charged as a GPU stream would run it: each tensor operation costs the
host one launch and the device `kernel_us` plus its bytes at `bandwidth_gbs` (an estimate for
H100-class memory; the course has not measured its own small kernels on a GPU yet). It is
computed on the host, so its results are real; computing them here takes the host longer than
launching them would on a GPU's host, and the difference is taken off the next step's launch
time, so that the host spends what a GPU's host spends. It reaches the device three ways:
`run(fn, ...)` (computed and charged; returns the result); `run_timed(fn, ...)` (the training
loop's `batch_transform`: computed for the first batch of each shape, charged for every batch);
and *simulated device memory* (`SimDeviceTensor`, what `TrainingSet.on_device(sim)` gives):
while a training loop runs on this device, every operation on such tensors, in a loader or in
the loop, is device work. Batches that a GPU would have to copy from host memory (anything not
in simulated device memory) are charged the copy at the measured pinned bandwidth, queued on the
device's one timeline.

**What it does not model: copies.** There is one timeline and no copy engine, so a copy never
overlaps the device's compute (on a GPU a side stream's copy does), and the training loop charges
every host batch as a *pinned, non-blocking* copy (what `pin_memory=True` gives on a GPU).
`copy_in(batch, pinned=False)` charges the other kind, a copy from pageable memory as
`.to(device)` makes it: the host waits for the work already queued, then for the copy, at the
measured pageable bandwidth (6.1 GB/s on the H100 box against 52.8 pinned). Lesson 03's
"prefetcher" rung is therefore, beside the simulator, a background thread whose batches are
charged no copy at all (the best a side stream could do).

`SimulatedAccelerator(step_ms=...)` without a profile is a plain fixed-time device (no launch
cost), for tests and for lessons that study one effect in isolation.

Everything measured with it is a *simulation*: its `label` says so, names the box it stands for
and the scale, and every figure built from it must carry that label.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SimulatedAccelerator", "SimEvent", "GpuProfile", "H100", "default_sim", "host_speed", "HostSpeed",
           "SimDeviceTensor", "on_device", "is_on_device",
           "DEFAULT_STEP_MS", "DEFAULT_PER_SAMPLE_MS", "DEFAULT_KERNEL_US", "DEFAULT_BANDWIDTH_GBS"]


@dataclass(frozen=True)
class GpuProfile:
    """The measured behaviour of one GPU box for the course's CIFAR ResNet-18 (see the module
    docstring). Times are milliseconds on that box, unscaled.

    eager_host_ms: host time to launch one eager training step, by precision ("fp32" covers TF32
        convolutions, PyTorch's default; "bf16"/"fp16" are autocast, which adds host work).
    device_ms: the GPU's own work per step, `a + b * batch`, by (precision, channels_last).
    graph_host_ms: host time to replay a captured CUDA graph of the step (one launch).
    kernels_per_step: kernels one step launches (the launch queue holds `queue_kernels`).
    host_loader_samples_per_s: one host core running the course's baseline loader (0 workers).
    """
    name: str
    measured: str
    source: str
    host_cores: int
    host_loader_samples_per_s: float
    eager_host_ms: dict
    device_ms: dict
    graph_host_ms: float
    kernels_per_step: int
    kernel_launch_us: float
    kernel_us: float
    bandwidth_gbs: float
    pinned_copy_gbs: float
    queue_kernels: int = 1024
    pageable_copy_gbs: float = 6.1
    notes: dict = field(default_factory=dict)

    def step_ms(self, batch_size: int, amp: str | None = None, channels_last: bool = False,
                graph: bool = False) -> tuple[float, float]:
        """(host ms, device ms) of one training step of `batch_size` samples on this box."""
        precision = "fp32" if amp in (None, "fp32") else amp
        if precision not in self.eager_host_ms:
            raise ValueError(f"no figures for precision {amp!r}; the profile has {sorted(self.eager_host_ms)}")
        a, b = self.device_ms[(precision, bool(channels_last))]
        device = a + b * max(int(batch_size), 0)
        host = self.graph_host_ms if graph else self.eager_host_ms[precision]
        return host, device


# The H100 the course ran on, 2026-11-24: NVIDIA H100 80GB HBM3 (132 SMs, driver 580.159.04),
# 16-core Intel Xeon VM, torch 2.11.0+cu130, cuDNN 9.19. Figures from the measurements of that run
# (the README's section "GPU: one NVIDIA H100 (2026-11-24)" gives them):
# - eager step, batch 128: TF32 10.5 / 11.7 ms (ladder ceiling 12.9), bf16 14.9, fp16 + scaler
#   12.8, bf16 + channels_last 12.2 / 17.4; batch 512: TF32 26.1, bf16 22.0, fp16 20.3, bf16 +
#   channels_last 13.2 / 17.6 (two runs where two figures are given);
# - the same step captured as a CUDA graph and replayed (the GPU's own work): batch 128 TF32 7.5 ms,
#   bf16 + channels_last 3.3 ms; batch 512 TF32 25.5 ms, bf16 + channels_last 9.6 ms; 384-405
#   kernels per step; a narrow (width 8) step as a graph 1.22 ms against 11.0 ms eager;
# - host launch per eager step: where the GPU's work is far shorter than the eager step, the eager
#   step is the host's launch time: TF32 ~11 ms (10.5, 11.7, and the ladder's ceiling 10.5-12.9:
#   390 kernels, ~28 us each); autocast ~13.5 ms (bf16 + channels_last at batch 128: 12.2 and
#   17.4 in the probes, 10.5 and 14.8 in two ladder runs; bf16 14.9, whose GPU work is well under it);
# - fp16 with a GradScaler reads on the host whether a gradient overflowed: a sync every step;
# - fp32 with TF32 off is GPU-bound: 17.7 ms at 128, 70.8 ms at 512;
# - bf16 and fp16 without channels_last: not captured as graphs; their GPU work is taken from the
#   batch-512 eager steps (22.0, 20.3 ms, above the ~14 ms launch time, so GPU-bound) with the
#   fixed part of the measured channels_last fit;
# - one core's baseline loader: 3,157 samples/s alone; pinned host-to-device copy 52.8 GB/s.
H100 = GpuProfile(
    name="H100",
    measured="2026-11-24",
    source="the README's \"GPU: one NVIDIA H100 (2026-11-24)\": NVIDIA H100 80GB HBM3, 16-core Xeon host, "
           "torch 2.11.0+cu130",
    host_cores=16,
    host_loader_samples_per_s=3157.0,
    eager_host_ms={"fp32": 11.0, "bf16": 13.5, "fp16": 13.5},
    device_ms={
        ("fp32", False): (1.5, 0.0469),      # 7.5 ms at 128, 25.5 ms at 512 (TF32 convolutions)
        ("fp32", True): (1.5, 0.0469),       # channels_last alone: not measured, taken as fp32
        ("bf16", True): (1.2, 0.0164),       # 3.3 ms at 128, 9.6 ms at 512
        ("fp16", True): (1.2, 0.0164),       # not captured: taken as bf16 + channels_last
        ("bf16", False): (1.2, 0.0406),      # 22.0 ms eager at 512, GPU-bound
        ("fp16", False): (1.2, 0.0373),      # 20.3 ms eager at 512, GPU-bound
    },
    graph_host_ms=0.1,
    kernels_per_step=390,
    kernel_launch_us=28.0,
    kernel_us=4.0,
    bandwidth_gbs=1500.0,
    pinned_copy_gbs=52.8,
    pageable_copy_gbs=6.1,
    notes={"fp32 TF32 off, batch 128/512 (ms)": (17.7, 70.8),
           "width-8 step, batch 32: eager / CUDA graph / reduce-overhead / fused SGD (ms)": (11.0, 1.22, 4.28, 9.5)},
)

# The older names, kept for code that builds costs from them (lesson 06's stage model): the GPU's
# own work per step of the profile above, `DEFAULT_STEP_MS + DEFAULT_PER_SAMPLE_MS * batch`.
DEFAULT_STEP_MS = H100.device_ms[("fp32", False)][0]
DEFAULT_PER_SAMPLE_MS = H100.device_ms[("fp32", False)][1]
DEFAULT_KERNEL_US = H100.kernel_us
DEFAULT_BANDWIDTH_GBS = H100.bandwidth_gbs

# Share of a launch spent holding Python's GIL (module code, argument parsing) rather than in C++
# dispatch and the driver, which release it. An estimate, not a measurement.
GIL_SHARE = 0.25


# -- this host's speed ----------------------------------------------------------------------------

@dataclass(frozen=True)
class HostSpeed:
    """How fast one core of this host runs the course's baseline loader, and how it was found."""
    samples_per_s: float
    how: str


_HOST_SPEED: HostSpeed | None = None
_HOST_LOCK = threading.Lock()


def host_speed(refresh: bool = False) -> HostSpeed:
    """One core of this host running the course's baseline loader (PIL crop + flip + ToTensor +
    Normalize, a DataLoader with num_workers=0, batches of 128), in samples per second of CPU
    time: measured once per process (about half a second: the best of three timings of 4 batches,
    after one), or taken from env COURSE_SIM_HOST_RATE (samples/s) when set, so that runs can be
    reproduced. CPU time, not wall time: other programs busy on the machine slow the loading and
    the simulated launches alike as the run goes (both are CPU work), and must not also slow the
    calibration, or a busy moment would be counted twice."""
    global _HOST_SPEED
    with _HOST_LOCK:
        if _HOST_SPEED is None or refresh:
            fixed = os.environ.get("COURSE_SIM_HOST_RATE", "").strip()
            if fixed:
                rate = float(fixed)
                if not rate > 0:
                    raise ValueError(f"COURSE_SIM_HOST_RATE must be a positive number of samples/s, got {fixed!r}")
                _HOST_SPEED = HostSpeed(rate, "COURSE_SIM_HOST_RATE")
            else:
                _HOST_SPEED = HostSpeed(_measure_loader_rate(), "measured")
        return _HOST_SPEED


def _measure_loader_rate(batch_size: int = 128, batches: int = 4, repeats: int = 3) -> float:
    import numpy as np
    from torch.utils.data import DataLoader

    from . import data

    class Images(data.CIFAR10Binary):          # the course's dataset class, on arrays in memory
        def __init__(self, images, labels, transform):
            self.images, self.labels, self.transform = images, labels, transform

    n = batch_size * (batches + 1)
    rng = np.random.default_rng(0)
    dataset = Images(rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), np.zeros(n, np.int64),
                     data.baseline_transform())
    best = 0.0
    for _ in range(repeats):
        batches_iter = iter(DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=0))
        next(batches_iter)                                   # start-up is not the loader's speed
        t0 = time.thread_time()
        for _ in range(batches):
            next(batches_iter)
        best = max(best, batch_size * batches / max(time.thread_time() - t0, 1e-6))
    return best


# -- the host's share of the work -----------------------------------------------------------------

_BURN_BUFFER = bytes(1 << 20)
_hash_bytes_per_s = 0.0


def burn_host(seconds: float, gil_share: float = GIL_SHARE, chunk_s: float = 0.002) -> None:
    """Spend `seconds` of this thread's CPU time, as a host launching kernels does: `gil_share`
    of it in a Python loop holding the GIL, the rest hashing a buffer (C code that releases the
    GIL), in chunks of `chunk_s`. Counted in the thread's CPU time, so a busy machine stretches
    it in wall time, as it stretches real launches."""
    global _hash_bytes_per_s
    if seconds <= 0:
        return
    view = memoryview(_BURN_BUFFER)
    end = time.thread_time() + seconds
    while True:
        now = time.thread_time()
        left = end - now
        if left <= 0:
            return
        chunk = min(chunk_s, left)
        held_until = now + gil_share * chunk
        while time.thread_time() < held_until:
            pass
        free_s = (1.0 - gil_share) * chunk
        if _hash_bytes_per_s <= 0:
            t0 = time.thread_time()
            hashlib.sha256(view[:1 << 18]).digest()
            _hash_bytes_per_s = (1 << 18) / max(time.thread_time() - t0, 1e-6)
        n = min(len(view), max(4096, int(free_s * _hash_bytes_per_s)))
        t0 = time.thread_time()
        hashlib.sha256(view[:n]).digest()                   # releases the GIL (buffers over 2 KiB)
        spent = time.thread_time() - t0
        if spent > 0:
            _hash_bytes_per_s = 0.8 * _hash_bytes_per_s + 0.2 * n / spent


# -- counting device-side work --------------------------------------------------------------------

class _KernelCost(TorchDispatchMode):
    """Counts the tensor operations run inside it and the bytes they read and write (views,
    which move no data, are free; an argument is counted at most at its storage's size, so a view
    of overlapping windows is not charged once per window)."""

    def __init__(self):
        super().__init__()
        self.kernels = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False):
            self.kernels += 1
            self.bytes += _read_bytes(args) + _read_bytes(kwargs) + _nbytes(out)
        return out


def _read_bytes(obj) -> int:
    """The bytes an operation can read from `obj`: a tensor's, capped at its storage's size."""
    if isinstance(obj, torch.Tensor):
        try:
            return min(obj.numel() * obj.element_size(), obj.untyped_storage().nbytes())
        except (RuntimeError, NotImplementedError):
            return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_read_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_read_bytes(o) for o in obj.values())
    return 0


def _nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_nbytes(o) for o in obj.values())
    return 0


def _counted(fn, *args, **kwargs):
    """Compute `fn(*args, **kwargs)` here, uncharged, counting its tensor operations: returns
    (its result, operations, bytes, host CPU seconds spent computing it). Meanwhile no simulator
    is active, so tensors in simulated device memory do not charge their operations a second
    time. `SimulatedAccelerator.run` and `SimulatedDataParallel.run` charge what it counts."""
    cost = _KernelCost()
    t0 = time.thread_time()
    _ACTIVE.append(None)
    try:
        with cost:
            result = fn(*args, **kwargs)
    finally:
        _ACTIVE.pop()
    return result, cost.kernels, cost.bytes, time.thread_time() - t0


# -- the simulated device's memory ----------------------------------------------------------------

_ACTIVE: list = []          # the simulated accelerator whose training loop is running (innermost last)

# Tensor calls that read a device tensor on the host (its values leave the device), or ask for
# nothing but its metadata: no kernel, nothing to charge.
_TO_HOST = frozenset({"cpu", "numpy", "tolist", "item", "__repr__", "__str__", "__format__", "__array__",
                      "__float__", "__int__", "__bool__", "__index__", "__reduce_ex__", "__deepcopy__"})
_METADATA = frozenset({"__get__", "__set__", "size", "dim", "__len__", "numel", "stride", "is_contiguous",
                       "data_ptr", "element_size", "storage_offset", "untyped_storage", "get_device", "__hash__",
                       "__contains__", "is_floating_point", "is_complex", "ndimension",
                       "nelement", "__iter__"})


class SimDeviceTensor(torch.Tensor):
    """A tensor in the simulated accelerator's "device memory" (host memory, as the simulator has
    no other): what `TrainingSet.on_device(sim)` and the ladder's `ctx.on_device()` give beside
    the simulator. While a training loop runs on that simulator (`train()`), every operation on
    such a tensor, wherever it runs (in the loop, in a loader, in a batch transform), is device
    work: its result is computed here, and it is charged as `SimulatedAccelerator.run` charges
    work (the host pays its launches, the device its kernels and bytes). Results stay in device
    memory; `.cpu()`, `.numpy()`, `.item()` and the like bring values to the host as plain
    tensors. Outside a training loop it behaves as an ordinary tensor. A batch made of such
    tensors needs no copy to the device."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if name in _TO_HOST or (name == "to" and _names_the_host(args, kwargs)):
            with torch._C.DisableTorchFunctionSubclass():
                return _plain(func(*args, **kwargs))
        sim = _ACTIVE[-1] if _ACTIVE else None
        if sim is None:
            with torch._C.DisableTorchFunctionSubclass():
                return _on_device(func(*args, **kwargs))
        return sim._device_op(func, args, kwargs)


def _names_the_host(args, kwargs) -> bool:
    for a in list(args[1:]) + list(kwargs.values()):
        if isinstance(a, torch.device) or (isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda", "meta")):
            return True
    return False


def _on_device(out):
    if type(out) is torch.Tensor:
        return out.as_subclass(SimDeviceTensor)
    if isinstance(out, (tuple, list)) and any(type(o) is torch.Tensor for o in out):
        return type(out)(_on_device(o) for o in out) if not hasattr(out, "_fields") else type(out)(*(_on_device(o) for o in out))
    return out


def _plain(out):
    if isinstance(out, SimDeviceTensor):
        return out.as_subclass(torch.Tensor)
    if isinstance(out, (tuple, list)) and any(isinstance(o, SimDeviceTensor) for o in out):
        return type(out)(_plain(o) for o in out) if not hasattr(out, "_fields") else type(out)(*(_plain(o) for o in out))
    return out


def on_device(tensor: torch.Tensor) -> SimDeviceTensor:
    """`tensor` (sharing its memory) as a tensor in the simulated device's memory."""
    return tensor.as_subclass(SimDeviceTensor)


def is_on_device(batch) -> bool:
    """Whether every tensor of `batch` (a tensor, tuple, list or dict of them) is in the simulated
    device's memory."""
    if isinstance(batch, torch.Tensor):
        return isinstance(batch, SimDeviceTensor)
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (tuple, list)):
        tensors = [b for b in batch if isinstance(b, torch.Tensor)]
        return bool(tensors) and all(isinstance(b, SimDeviceTensor) for b in tensors)
    return False


# -- the device -----------------------------------------------------------------------------------

class SimEvent:
    """Like `torch.cuda.Event(enable_timing=True)`: the moment the device reaches it (`time_s`, on
    the host's `time.perf_counter()` clock), known when it is recorded."""

    def __init__(self, time_s: float):
        self.time_s = time_s

    def synchronize(self) -> None:
        _sleep_until(self.time_s)

    def query(self) -> bool:
        return time.perf_counter() >= self.time_s

    def elapsed_time(self, end: "SimEvent") -> float:
        """Milliseconds between this event and `end` (waits until both are reached)."""
        self.synchronize()
        end.synchronize()
        return (end.time_s - self.time_s) * 1e3


class SimulatedAccelerator:
    """A stand-in device (see the module docstring).

    With a `profile` (`default_sim()` gives the course's): each `step()` costs the profile's host
    launch time and GPU work for its batch, precision, memory format and launch mode, times
    `scale`. Without one: a fixed device time of `step_ms` (+ `per_sample_ms` per sample) and
    `host_ms` of launch time.

    The launch queue holds `max_queued` units of work: steps for a fixed-time device, kernels for
    a profiled one (CUDA's queue holds about a thousand kernels: a few training steps); launching
    into a full queue blocks the host, as CUDA does.
    """

    type = "sim"

    def __init__(self, step_ms: float | None = None, *, per_sample_ms: float = 0.0, host_ms: float = 0.0,
                 profile: GpuProfile | None = None, scale: float = 1.0, max_queued: int | None = None,
                 kernel_us: float | None = None, bandwidth_gbs: float | None = None,
                 launch_us: float | None = None, host_note: str = ""):
        if profile is None and step_ms is None:
            step_ms = 20.0
        if (step_ms is not None and step_ms < 0) or per_sample_ms < 0 or host_ms < 0:
            raise ValueError("step_ms, per_sample_ms and host_ms must be >= 0")
        if not scale > 0:
            raise ValueError("scale must be > 0")
        self.profile = profile
        self.scale = float(scale)
        self.step_ms = None if step_ms is None else float(step_ms)
        self.per_sample_ms = float(per_sample_ms)
        self.host_ms = float(host_ms)
        base_kernel_us = profile.kernel_us if profile else DEFAULT_KERNEL_US
        base_bandwidth = profile.bandwidth_gbs if profile else DEFAULT_BANDWIDTH_GBS
        self.kernel_us = float(kernel_us if kernel_us is not None else base_kernel_us * self.scale)
        self.bandwidth_gbs = float(bandwidth_gbs if bandwidth_gbs is not None else base_bandwidth / self.scale)
        if self.kernel_us < 0 or not self.bandwidth_gbs > 0:
            raise ValueError("kernel_us must be >= 0 and bandwidth_gbs > 0")
        self.launch_us = float(launch_us if launch_us is not None
                               else (profile.kernel_launch_us * self.scale if profile else 0.0))
        self.copy_gbs = (profile.pinned_copy_gbs / self.scale) if profile else None
        self.pageable_copy_gbs = (profile.pageable_copy_gbs / self.scale) if profile else None
        if max_queued is None:
            max_queued = profile.queue_kernels if profile else 32
        if max_queued < 1:
            raise ValueError("max_queued must be >= 1")
        self.max_queued = int(max_queued)
        self.host_note = host_note
        self.charged_ms = 0.0        # device time charged by run() so far
        self.charged_kernels = 0
        self.copied_bytes = 0        # host-to-device copies charged so far
        self.launched_host_s = 0.0   # host time spent launching steps and device-side work
        self.steps_run = 0
        self._credit_s = 0.0             # host time computing device work beyond its launches (see run)
        self._timed: dict = {}           # (id(fn), argument shapes) -> (fn, kernels, device ms, batch size)
        self._lock = threading.Lock()
        self._pending: deque = deque()   # (start, end, units) of launched work not yet finished
        self._queued_units = 0
        self._tail = 0.0                 # when the last launched work ends
        self._launched_s = 0.0           # device seconds launched so far
        self._closed = False

    # -- what lessons call -------------------------------------------------------------
    @property
    def label(self) -> str:
        if self.profile is None:
            per = f" + {self.per_sample_ms:g} ms/sample" if self.per_sample_ms else ""
            host = f", {self.host_ms:g} ms host launch" if self.host_ms else ""
            return (f"simulated accelerator ({self.step_ms:g} ms/step{per}{host}; on-device tensor work charged "
                    f"at {self.kernel_us:g} us/kernel + {self.bandwidth_gbs:g} GB/s; host {_host()})")
        p = self.profile
        return f"simulated {p.name} (measured {p.measured}), scaled x{self.scale:.2f} to this CPU ({_host()})"

    def describe(self) -> str:
        """A paragraph: what this device stands for and what one step costs here."""
        if self.profile is None:
            return self.label
        host, dev = self.step_cost_ms(128)
        note = f" ({self.host_note})" if self.host_note else ""
        return (f"{self.label}{note}. A training step of 128 samples costs the host {host:.1f} ms of kernel "
                f"launches and the device {dev:.1f} ms of work (fp32/TF32, eager); figures from "
                f"{self.profile.source}, times x{self.scale:.2f}.")

    def step_cost_ms(self, batch_size: int = 128, *, amp: str | None = None, channels_last: bool = False,
                     graph: bool = False) -> tuple[float, float]:
        """(host ms, device ms) one step of `batch_size` samples costs here."""
        if self.profile is None:
            return self.host_ms, self.step_ms + self.per_sample_ms * batch_size
        host, device = self.profile.step_ms(batch_size, amp, channels_last, graph)
        return host * self.scale, device * self.scale

    def step_time_ms(self, batch_size: int = 0, **kwargs) -> float:
        """Device time one step of `batch_size` samples costs (the GPU's own work)."""
        return self.step_cost_ms(batch_size, **kwargs)[1]

    def ceiling_step_ms(self, batch_size: int = 128, **kwargs) -> float:
        """What one step takes when nothing else slows it: the longer of its launch and its work."""
        host, device = self.step_cost_ms(batch_size, **kwargs)
        return max(host, device)

    def step(self, batch=None, *, amp: str | None = None, channels_last: bool = False, graph: bool = False) -> None:
        """Launch one training step on `batch` (a batch, or its number of samples): spend its launch
        time on the host, queue its work on the device as the launches go, and return (the device
        finishes it later, asynchronously). `amp`, `channels_last` and `graph` (a captured CUDA
        graph replayed) pick which measured step it costs."""
        n = _batch_size(batch)
        host_ms, device_ms = self.step_cost_ms(n, amp=amp, channels_last=channels_last, graph=graph)
        if self.profile is None or graph or host_ms <= 0:
            pieces, units = 1, 1                       # one launch: a fixed-time step, a graph replay
        else:
            pieces, units = 8, max(1, self.profile.kernels_per_step // 8)
        credit, self._credit_s = min(self._credit_s, host_ms / 1e3), 0.0
        for _ in range(pieces):                        # the device starts on the first kernels while
            self._burn((host_ms / 1e3 - credit) / pieces)   # the host is still launching the rest
            self.launch(device_ms / pieces, units=units)
        if amp == "fp16" and self.profile is not None and not graph:
            self.synchronize()                         # GradScaler reads found_inf on the host: a sync per step
        self.steps_run += 1

    def run(self, fn, *args, **kwargs):
        """Device-side tensor work: compute `fn(*args, **kwargs)` now (on the host, so the result is
        real) and queue on the device, before whatever is launched next, the time a GPU stream would
        take for its operations: `kernel_us` each plus their bytes at `bandwidth_gbs`. The host pays
        each operation's launch (`launch_us`); computing the results here usually takes the host
        longer than launching them would, and the difference is taken off the launch time of the
        next step (never more than that), so that the host spends what a GPU's host spends.
        Returns what `fn` returns."""
        result, kernels, nbytes, host_s = _counted(fn, *args, **kwargs)
        self._charge(kernels, nbytes, host_s)
        return result

    def run_timed(self, fn, *args) -> int:
        """Device-side work whose result only needs to be timed (the training loop's
        `batch_transform` beside the simulator, where no model reads it): the first call for each
        `fn` and shapes/dtypes of the arguments is computed for real by `run()` (so a transform that
        fails, fails here) and its operations and bytes are counted; later calls with the same
        shapes are charged those operations, launches and all, without computing them again (a CPU
        computing a GPU's work would only make the host look slower than a GPU's host is).
        A callable that says `compute_every_batch = True` (a check that keeps every batch the model
        got, to verify it) is computed every time, through `run()`. Returns the batch size of the
        result."""
        if getattr(fn, "compute_every_batch", False):
            return _batch_size(self.run(fn, *args))
        key = (id(fn), _signature(args))
        known = self._timed.get(key)
        if known is None:
            before_k, before_ms = self.charged_kernels, self.charged_ms
            out = self.run(fn, *args)
            known = (fn, self.charged_kernels - before_k, self.charged_ms - before_ms, _batch_size(out))
            self._timed[key] = known
            return known[3]
        _, kernels, ms, size = known
        self._burn(kernels * self.launch_us / 1e6)
        self.charged_ms += ms
        self.charged_kernels += kernels
        self.launch(ms, units=max(kernels, 1) if self.profile else 1)
        return size

    def _device_op(self, func, args, kwargs):
        """One operation on tensors in this device's memory, while its training loop runs: computed
        here, charged as `run` charges work, its result left in device memory."""
        cost = _KernelCost()
        t0 = time.thread_time()
        with cost, torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if cost.kernels:
            self._charge(cost.kernels, cost.bytes, time.thread_time() - t0)
        return _on_device(out)

    def _charge(self, kernels: int, nbytes: int, computed_s: float) -> None:
        """Charge `kernels` operations moving `nbytes`, whose results took the host `computed_s` to
        compute here: the host pays their launches (what computing them took counts as paid, the
        rest of it is taken off the next step's launch), the device their kernels and bytes."""
        launch_s = kernels * self.launch_us / 1e6
        self._burn(launch_s - computed_s)
        self._credit_s += max(0.0, computed_s - launch_s)
        ms = kernels * self.kernel_us / 1e3 + nbytes / (self.bandwidth_gbs * 1e9) * 1e3
        self.charged_ms += ms
        self.charged_kernels += kernels
        self.launch(ms, units=max(kernels, 1) if self.profile else 1)

    def active(self):
        """While this block runs, operations on `SimDeviceTensor`s are this device's work (the
        training loop holds it)."""
        import contextlib

        @contextlib.contextmanager
        def block():
            _ACTIVE.append(self)
            try:
                yield self
            finally:
                _ACTIVE.remove(self)
        return block()

    def copy_in(self, batch, *, pinned: bool = True) -> None:
        """Charge the host-to-device copy a GPU would need for `batch`; nothing for a fixed-time device.

        `pinned=True` (what the training loop charges): a non-blocking copy from pinned memory, its
        tensors' bytes at the profile's pinned bandwidth plus one launch, queued; the host goes on.
        `pinned=False`: a copy from pageable memory, as `.to(device)` makes it (a copy and a stream
        synchronisation): the host waits for the work already queued and for the copy, at the
        profile's pageable bandwidth. Either way the copy takes the device's one timeline: this
        model has no copy engine, so no copy overlaps compute."""
        if self.copy_gbs is None:
            return
        nbytes = _nbytes(batch)
        if nbytes:
            self.copied_bytes += nbytes
            self._burn(self.launch_us / 1e6)
            gbs = self.copy_gbs if pinned else self.pageable_copy_gbs
            self.launch(self.kernel_us / 1e3 + nbytes / (gbs * 1e9) * 1e3, units=1)
            if not pinned:
                self.synchronize()

    def launch(self, ms: float, *, units: int = 1) -> None:
        """Queue `ms` of device work (`units` entries of the launch queue); blocks only while the
        queue is full."""
        while True:
            with self._lock:
                now = time.perf_counter()
                self._retire(now)
                if self._queued_units + units <= self.max_queued or not self._pending or self._closed:
                    start = max(now, self._tail)
                    end = start + max(ms, 0.0) / 1e3
                    self._pending.append((start, end, units))
                    self._queued_units += units
                    self._tail = end
                    self._launched_s += end - start
                    return
                wait_until = self._room_at(units)
            _sleep_until(wait_until)

    def record_event(self) -> SimEvent:
        """An event that completes when the device has finished all work launched before it."""
        with self._lock:
            return SimEvent(max(time.perf_counter(), self._tail))

    def synchronize(self) -> None:
        """Wait until every launched step has finished (like `torch.cuda.synchronize()`)."""
        with self._lock:
            tail = self._tail
        _sleep_until(tail)

    def busy_seconds(self) -> float:
        """Device time spent working so far (the running piece counted up to now), copies included:
        exact, where NVML's utilisation on a GPU samples kernels only (see the module's docstring)."""
        with self._lock:
            now = time.perf_counter()
            self._retire(now)
            ahead = sum(end - max(start, now) for start, end, _ in self._pending)
            return self._launched_s - ahead

    def close(self) -> None:
        """Nothing runs in the background; kept so that code written for a device thread works."""
        self._closed = True

    def __repr__(self) -> str:
        if self.profile is not None:
            return f"SimulatedAccelerator(profile={self.profile.name}, scale={self.scale:.3g})"
        return (f"SimulatedAccelerator(step_ms={self.step_ms:g}, per_sample_ms={self.per_sample_ms:g}, "
                f"host_ms={self.host_ms:g}, kernel_us={self.kernel_us:g}, bandwidth_gbs={self.bandwidth_gbs:g})")

    # -- internals -------------------------------------------------------------------------
    def _burn(self, seconds: float) -> None:
        if seconds > 0:
            t0 = time.perf_counter()
            burn_host(seconds)
            self.launched_host_s += time.perf_counter() - t0

    def _retire(self, now: float) -> None:
        while self._pending and self._pending[0][1] <= now:
            self._queued_units -= self._pending.popleft()[2]

    def _room_at(self, units: int) -> float:
        """When enough queued work will have finished for `units` more to fit."""
        queued = self._queued_units
        for start, end, u in self._pending:
            queued -= u
            if queued + units <= self.max_queued:
                return end
        return self._tail


def default_sim(**overrides) -> SimulatedAccelerator:
    """The course's simulated accelerator: the H100 profile scaled to this host (`host_speed()`).
    Keyword arguments override (`scale=1.0` runs the box's own times; `step_ms=...` gives a plain
    fixed-time device instead)."""
    if "step_ms" in overrides or "per_sample_ms" in overrides:
        overrides.setdefault("step_ms", DEFAULT_STEP_MS)
        return SimulatedAccelerator(**overrides)
    if "scale" not in overrides:
        speed = host_speed()
        overrides["scale"] = H100.host_loader_samples_per_s / speed.samples_per_s
        overrides.setdefault("host_note", f"one core loads {speed.samples_per_s:,.0f} samples/s here, "
                                          f"{H100.host_loader_samples_per_s:,.0f} on the H100 box's")
    overrides.setdefault("profile", H100)
    return SimulatedAccelerator(**overrides)


def _sleep_until(deadline: float) -> None:
    """Sleep (GIL released) until `time.perf_counter()` reaches `deadline`, to within ~0.1 ms."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left - 0.001 if left > 0.002 else min(left, 0.0002))


def _signature(obj):
    """Shapes and dtypes of the tensors in `obj` (nested tuples and lists), for `run_timed`."""
    if isinstance(obj, torch.Tensor):
        return (tuple(obj.shape), obj.dtype, obj.device.type)
    if isinstance(obj, (list, tuple)):
        return tuple(_signature(o) for o in obj)
    return type(obj).__name__


def _batch_size(batch) -> int:
    if batch is None:
        return 0
    if isinstance(batch, int):
        return batch
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return _batch_size(next(iter(batch.values())))
    return 0


def _host() -> str:
    from .env import usable_cores
    return f"{usable_cores()} cores"
