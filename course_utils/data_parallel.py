"""DataParallel measured and simulated: N devices driven by one process (lesson 06).

- `SimulatedDataParallel(n_devices, costs)`: N simulated accelerators stepping together as
  `nn.DataParallel` drives N GPUs. Each step follows DataParallel's schedule (scatter from
  device 0, replicate, forward on every device, gather on device 0, backward, reduce, then the
  optimizer on device 0) with the stage costs of a `course_utils.scaling.StageCosts`. The
  host's share of each step is spent *for real* on this CPU: the launch of one step's kernels
  (`costs.host_step_ms`, the H100 box's measured launch time scaled to this CPU, spent as the
  course's simulated accelerator spends it) and, with two or more devices, for every replica
  torch's own `replicate` (`HostWork`, its device copies left out) plus the part of the
  replica's forward launch that holds Python's lock. With one device it is therefore the
  course's simulated accelerator (`sim.default_sim()`, lessons 01-05) at the same batch. Only
  the devices are simulated, and every label says "simulated". It presents the simulated
  accelerator's interface (`type == "sim"`, `step`, `run`, `run_timed`, `copy_in`, `active`,
  `record_event`, `synchronize`, `busy_seconds`, `label`), so the course's one training loop
  (`course_utils.train.train`) drives it unchanged, and tensors in simulated device memory
  (`device_data.cifar10_on_device(sim)`) are device 0's: work on them is charged to device 0.
- `measure_dp_costs(model, sample)`: the `StageCosts` of this model: bytes measured on the real
  model and batch (`dp_sizes`), moved at a stated link bandwidth (`costs_from_sizes`); host work
  timed on this CPU.
- `StageClock`: time the stages of a step by name, waiting for every device before reading the
  clock (a by-hand DataParallel step in the lesson uses it).
- `PerDeviceMonitor`: utilisation of every device over time (NVML on GPUs, busy time of the
  simulated ones), for the device-0 imbalance; `gpu_memory(indices)`: per-GPU memory.
- `plot_schedule(...)`: the simulated devices' stages on a time line (who waits for whom).

Why the devices are simulated on one virtual clock rather than by N device threads: a stage on
device k waits for a stage on device 0, and a thread woken for that must take Python's
interpreter lock, which the host holds for up to 5 ms at a time while it runs Python. The
schedule is therefore computed exactly when a step is launched, from the devices' free times,
and the host waits only where it would wait for a GPU (`synchronize`, events, a full queue).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from .monitor import nvml_close, nvml_find, nvml_open, nvml_reading
from .scaling import StageCosts, dp_chunk_sizes, host_ms
from .sim import (_ACTIVE, DEFAULT_BANDWIDTH_GBS, DEFAULT_KERNEL_US, DEFAULT_PER_SAMPLE_MS, DEFAULT_STEP_MS, GIL_SHARE,
                  H100, SimEvent, _batch_size, _counted, _KernelCost, _on_device, _signature, _sleep_until, burn_host)
from .sim import _nbytes as _batch_nbytes

__all__ = ["SimulatedDataParallel", "StageInterval", "HOST", "HostWork", "DPSizes", "dp_sizes", "replica_launch_ms",
           "costs_from_sizes", "measure_dp_costs", "StageClock",
           "PerDeviceMonitor", "gpu_memory", "plot_schedule", "LINK_GB_S", "NVLINK_GB_S", "MEMORY_GB_S"]

# The simulated machine's links and memory, named after the H100 box the course measured (its
# GPU work per replica and its launch time are that box's too, `sim.H100`):
LINK_GB_S = H100.pinned_copy_gbs   # copies between devices: the pinned host-to-device copy measured there,
#                                  standing in for PCIe 5.0 between GPUs (the course has not measured a
#                                  link between two GPUs)
NVLINK_GB_S = 450.0                # NVLink 4 (H100 SXM): 450 GB/s each way, from NVIDIA's specification
MEMORY_GB_S = H100.bandwidth_gbs   # on-device memory traffic (summing gradients, the optimizer): the
#                                  simulated accelerator's estimate for H100-class memory


def replica_launch_ms(costs: StageCosts) -> float:
    """The part of one replica's forward launches that holds Python's lock (`sim.GIL_SHARE` of
    the forward's share of one step's launch time): what each replica's thread makes the others
    wait for. The rest of a launch is C++ dispatch, which releases the lock and overlaps."""
    return GIL_SHARE * costs.forward_share * costs.host_step_ms


HOST = -1          # the `device` of the host's intervals in a trace


@dataclass
class StageInterval:
    """One stage of one step on one simulated device (`device` is `HOST` for the host's share of
    the step: its launches and Python), in `time.perf_counter()` seconds."""
    step: int
    device: int
    stage: str
    start_s: float
    end_s: float


class _DeviceView:
    """One device of a `SimulatedDataParallel`, for `UtilizationMonitor(sim=...)`."""
    type = "sim"

    def __init__(self, parent: "SimulatedDataParallel", index: int):
        self.parent, self.index = parent, index

    def busy_seconds(self) -> float:
        return self.parent.busy_seconds_per_device()[self.index]

    @property
    def label(self) -> str:
        return f"simulated device {self.index} of {self.parent.label}"


class SimulatedDataParallel:
    """`n_devices` simulated accelerators trained like `nn.DataParallel` (lesson 06).

        dp = SimulatedDataParallel(4, costs, host_work=HostWork(model))
        result = train(None, loader, device=dp, steps=100)   # the course's one loop, unchanged

    `step(batch)` splits the batch as DataParallel does (`dp_chunk_sizes`), spends the host's
    share of the step on this CPU (see the module docstring) and queues the step's stages on
    the devices' clock; it returns at once, as a CUDA launch does, unless `max_queued_steps`
    steps are already waiting. Device-side tensor work (`run`, `run_timed`, and operations on
    tensors in simulated device memory while `active()`) is device 0's, charged as the course's
    simulated accelerator charges it: `kernel_us` per tensor operation plus its bytes at
    `bandwidth_gbs` on the device, `launch_us` per operation on the host (what computing it here
    takes beyond that is taken off the next step's launch time). `trace` keeps the last
    `keep_trace` stage intervals.
    """

    type = "sim"

    def __init__(self, n_devices: int, costs: StageCosts, *, host_work=None, max_queued_steps: int = 4,
                 kernel_us: float | None = None, bandwidth_gbs: float | None = None, copy_gbs: float = None,
                 launch_us: float | None = None, scale: float = 1.0, keep_trace: int = 400):
        if n_devices < 1:
            raise ValueError(f"n_devices must be >= 1, got {n_devices}")
        if max_queued_steps < 1:
            raise ValueError("max_queued_steps must be >= 1")
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        kernel_us = DEFAULT_KERNEL_US * scale if kernel_us is None else kernel_us
        bandwidth_gbs = DEFAULT_BANDWIDTH_GBS / scale if bandwidth_gbs is None else bandwidth_gbs
        copy_gbs = LINK_GB_S / scale if copy_gbs is None else copy_gbs
        launch_us = H100.kernel_launch_us * scale if launch_us is None else launch_us
        if kernel_us < 0 or launch_us < 0 or not bandwidth_gbs > 0 or not copy_gbs > 0:
            raise ValueError("kernel_us and launch_us must be >= 0, bandwidth_gbs and copy_gbs > 0")
        self.n_devices = int(n_devices)
        self.costs = costs
        self.host_work = host_work
        self.max_queued_steps = int(max_queued_steps)
        self.kernel_us, self.bandwidth_gbs, self.copy_gbs = float(kernel_us), float(bandwidth_gbs), float(copy_gbs)
        self.launch_us = float(launch_us)
        self.scale = float(scale)
        self.trace: deque = deque(maxlen=keep_trace)
        self.steps_run = 0
        self.launched_host_s = 0.0                        # host time spent launching (wall)
        self._credit_s = 0.0                              # host time computing device work beyond its launches
        self._lock = threading.Lock()
        now = time.perf_counter()
        self._free = [now] * self.n_devices               # when each device finishes its queued work
        self._pending = [deque() for _ in range(self.n_devices)]   # busy intervals not yet counted
        self._done_s = [0.0] * self.n_devices             # busy seconds of intervals already over
        self._step_ends: deque = deque()
        self._timed: dict = {}                            # run_timed: (fn, shapes) -> (fn, kernels, ms, batch size)

    # -- the simulated accelerator's interface ---------------------------------------------
    @property
    def label(self) -> str:
        return self.label_for(f"{self.n_devices} simulated device{'s' if self.n_devices > 1 else ''}")

    def label_for(self, devices: str) -> str:
        """The label with `devices` ("1 to 6 simulated devices") for a figure of several runs."""
        from .env import usable_cores
        scaled = f", x{self.scale:.2f} for this CPU" if self.scale != 1.0 else ""
        return (f"{devices} in DataParallel (the {H100.name} box's measured GPU work and launch time{scaled}; links "
                f"at its host-to-device copy rate, not measured between GPUs; host work real, {usable_cores()} cores)")

    def devices(self) -> list:
        """One view per device (each has `busy_seconds()` and `label`)."""
        return [_DeviceView(self, k) for k in range(self.n_devices)]

    def host_ms(self, batch_size: int) -> float:
        """The host's time for one step of `batch_size` samples (`scaling.host_ms`)."""
        return host_ms(self.costs, self.n_devices, len(dp_chunk_sizes(batch_size, self.n_devices)))

    def step(self, batch=None, *, amp: str | None = None, channels_last: bool = False, graph: bool = False) -> None:
        """Launch one DataParallel training step of `batch` and return (asynchronously). The stage
        costs are those of `costs` whatever `amp`, `channels_last` or `graph` ask (accepted so that
        the course's training loop drives this device as it drives the simulated accelerator)."""
        size = _batch_size(batch)
        if size < 1:
            raise ValueError("SimulatedDataParallel.step needs a batch (a tensor or an (images, labels) pair)")
        chunks = dp_chunk_sizes(size, self.n_devices)
        replicas = len(chunks) if self.n_devices > 1 else 0      # one device: DataParallel calls the model
        self._wait_for_room()
        started = time.perf_counter()
        if replicas and self.host_work is not None:
            t0 = time.perf_counter()
            self.host_work(replicas)        # torch's replicate and a thread per replica, for real
            self.launched_host_s += time.perf_counter() - t0
            per_replica = replica_launch_ms(self.costs)
        else:
            per_replica = self.costs.host_ms_per_replica
        host_s = (self.costs.host_step_ms + replicas * per_replica) / 1e3
        credit, self._credit_s = min(self._credit_s, host_s), 0.0
        self._burn(host_s - credit)
        with self._lock:
            now = time.perf_counter()
            self.trace.append(StageInterval(self.steps_run, HOST, "host: launches and Python", started, now))
            self._schedule(chunks, size, now)
            self.steps_run += 1

    def cost_of(self, fn, *args, **kwargs) -> tuple[float, float]:
        """(device ms, host launch ms) that `fn(*args, **kwargs)` would cost as device-side work
        here (each tensor operation: `kernel_us` and its bytes on device 0, `launch_us` on the
        host), counted from the operations it runs now, uncharged: for a model that adds the
        device's own work on the batch (lesson 06's fixed pipeline) to its stages."""
        _, kernels, nbytes, _ = _counted(fn, *args, **kwargs)
        return self._device_ms(kernels, nbytes), kernels * self.launch_us / 1e3

    def run(self, fn, *args, **kwargs):
        """Device-side tensor work on device 0: compute `fn(*args, **kwargs)` now (its result is
        real), charge it as the simulated accelerator does (see the class docstring) and return it."""
        out, kernels, nbytes, host_s = _counted(fn, *args, **kwargs)
        self._charge(kernels, nbytes, host_s)
        return out

    def run_timed(self, fn, *args) -> int:
        """Device-side work whose result only needs to be timed (the training loop's
        `batch_transform`, where no model reads it), as the simulated accelerator does it: the
        first call for each `fn` and shapes of the arguments is computed for real by `run()`;
        later calls with the same shapes are charged its operations, launches and all, without
        computing it again (a CPU computing a GPU's work would make this host look busier than a
        GPU's host is). Returns the result's batch size."""
        key = (id(fn), _signature(args))
        known = self._timed.get(key)
        if known is None:
            out, kernels, nbytes, host_s = _counted(fn, *args)
            self._charge(kernels, nbytes, host_s)
            self._timed[key] = (fn, kernels, self._device_ms(kernels, nbytes), _batch_size(out))
            return self._timed[key][3]
        _, kernels, ms, size = known
        self._burn(kernels * self.launch_us / 1e6)
        self.launch(ms, device=0, stage="on-device work")
        return size

    def _device_op(self, func, args, kwargs):
        """One operation on tensors in simulated device memory while this device's training loop
        runs (`active()`): computed here, charged to device 0, its result left in device memory."""
        cost = _KernelCost()
        t0 = time.thread_time()
        with cost, torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if cost.kernels:
            self._charge(cost.kernels, cost.bytes, time.thread_time() - t0)
        return _on_device(out)

    def active(self):
        """While this block runs (the training loop holds it), operations on tensors in simulated
        device memory are device 0's work, and torch computes on one thread: the simulated host is
        DataParallel's one main thread, and the device work it computes here stands in for kernels
        a GPU runs (on a busy machine, an operation split over cores waits for the slowest, and
        would make the simulated host stall where a GPU's host does not)."""
        @contextlib.contextmanager
        def block():
            threads = torch.get_num_threads()
            _ACTIVE.append(self)
            torch.set_num_threads(1)
            try:
                yield self
            finally:
                torch.set_num_threads(threads)
                _ACTIVE.remove(self)
        return block()

    def copy_in(self, batch) -> None:
        """Charge device 0 the copy of `batch` from host memory (its bytes at `copy_gbs`, one
        launch): what the training loop's `.to(device 0)` of a host batch costs. (DataParallel can
        also take the batch in host memory and scatter each piece straight to its device.)"""
        nbytes = _batch_nbytes(batch)
        if nbytes:
            self._burn(self.launch_us / 1e6)
            self.launch(self.kernel_us / 1e3 + nbytes / (self.copy_gbs * 1e6), device=0, stage="copy to device 0")

    def launch(self, ms: float, *, device: int = 0, stage: str = "work") -> None:
        """Queue `ms` of work on one device."""
        if ms < 0:
            raise ValueError("ms must be >= 0")
        with self._lock:
            start = max(time.perf_counter(), self._free[device])
            self._add(device, stage, start, start + ms / 1e3, self.steps_run)

    def record_event(self) -> SimEvent:
        """An event reached when every device has finished the work launched before it."""
        with self._lock:
            return SimEvent(max(max(self._free), time.perf_counter()))

    def synchronize(self) -> None:
        """Wait until every device has finished (like `torch.cuda.synchronize()` on each GPU)."""
        self.record_event().synchronize()

    def busy_seconds_per_device(self) -> list[float]:
        """Device time spent so far by each device (the part of running stages already done included)."""
        now = time.perf_counter()
        with self._lock:
            out = []
            for k in range(self.n_devices):
                pending = self._pending[k]
                while pending and pending[0][1] <= now:
                    start, end = pending.popleft()
                    self._done_s[k] += end - start
                running = sum(max(0.0, min(end, now) - start) for start, end in pending)
                out.append(self._done_s[k] + running)
            return out

    def busy_seconds(self) -> float:
        """Mean busy time over the devices (what one `UtilizationMonitor(sim=...)` line shows)."""
        busy = self.busy_seconds_per_device()
        return sum(busy) / len(busy)

    def close(self) -> None:
        """Nothing runs in the background; kept for the simulated accelerator's interface."""

    def __repr__(self) -> str:
        return f"SimulatedDataParallel(n_devices={self.n_devices}, costs={self.costs!r})"

    # -- the host and the schedule -----------------------------------------------------------
    def _device_ms(self, kernels: int, nbytes: int) -> float:
        return kernels * self.kernel_us / 1e3 + nbytes / (self.bandwidth_gbs * 1e6)

    def _charge(self, kernels: int, nbytes: int, computed_s: float) -> None:
        """Charge `kernels` operations moving `nbytes`, whose results took the host `computed_s` to
        compute here: the host pays their launches (what computing them took counts as paid, the
        rest of it is taken off the next step's launch), device 0 their kernels and bytes."""
        launch_s = kernels * self.launch_us / 1e6
        self._burn(launch_s - computed_s)
        self._credit_s += max(0.0, computed_s - launch_s)
        self.launch(self._device_ms(kernels, nbytes), device=0, stage="on-device work")

    def _burn(self, seconds: float) -> None:
        if seconds > 0:
            t0 = time.perf_counter()
            burn_host(seconds)
            self.launched_host_s += time.perf_counter() - t0

    def _wait_for_room(self) -> None:
        while True:
            with self._lock:
                now = time.perf_counter()
                while self._step_ends and self._step_ends[0] <= now:
                    self._step_ends.popleft()
                if len(self._step_ends) < self.max_queued_steps:
                    return
                wait = self._step_ends[0] - now
            _sleep_until(time.perf_counter() + wait)

    def _add(self, device: int, stage: str, start: float, end: float, step: int) -> None:
        if end <= start:
            return
        self._pending[device].append((start, end))
        self._free[device] = max(self._free[device], end)
        self.trace.append(StageInterval(step, device, stage, start, end))

    def _schedule(self, chunks: list[int], batch_size: int, now: float) -> None:
        """Queue one step's stages (DataParallel's order; see the module docstring)."""
        c, step = self.costs, self.steps_run
        ms = 1e-3
        used = range(len(chunks))
        if len(chunks) == 1:      # one piece: no bytes cross a link (one device: DataParallel calls the model)
            t = max(now, self._free[0])
            self._add(0, "forward", t, t + c.forward_share * c.compute_ms(batch_size) * ms, step)
            t += c.forward_share * c.compute_ms(batch_size) * ms
            self._add(0, "backward", t, t + (1 - c.forward_share) * c.compute_ms(batch_size) * ms, step)
            t += (1 - c.forward_share) * c.compute_ms(batch_size) * ms
            self._add(0, "optimizer (device 0)", t, t + c.device0_ms * ms, step)
            self._step_ends.append(t + c.device0_ms * ms)
            return
        moved = batch_size - chunks[0]
        t = max(now, self._free[0])
        scatter = moved * c.scatter_ms_per_sample * ms
        self._add(0, "scatter", t, t + scatter, step)
        t = max([t + scatter] + [self._free[k] for k in used])
        for k in used:                                              # NCCL broadcast: every device takes part
            self._add(k, "replicate", t, t + c.replicate_ms * ms, step)
        t += c.replicate_ms * ms
        for k in used:
            self._add(k, "forward", t, t + c.forward_share * c.compute_ms(chunks[k]) * ms, step)
        t += c.forward_share * c.compute_ms(chunks[0]) * ms           # the first piece is the largest
        gather = moved * c.gather_ms_per_sample * ms
        self._add(0, "gather + loss", t, t + gather, step)        # the loss on logits: next to nothing
        t += gather
        for k in used:
            self._add(k, "backward", t, t + (1 - c.forward_share) * c.compute_ms(chunks[k]) * ms, step)
        t += (1 - c.forward_share) * c.compute_ms(chunks[0]) * ms
        for k in used:
            self._add(k, "reduce", t, t + c.reduce_ms * ms, step)
        t += c.reduce_ms * ms
        self._add(0, "optimizer (device 0)", t, t + c.device0_ms * ms, step)
        self._step_ends.append(t + c.device0_ms * ms)


# -- the host's share, done for real --------------------------------------------------------------

_NO_COPIES = "the device copies of replicate left out: the host's Python work only"


class HostWork:
    """The host's Python work for each replica of a DataParallel step, done for real (lesson 06).

    For every replica, every step, DataParallel (1) replicates the model: torch's own
    `torch.nn.parallel.replicate` copies every module (`_replicate_for_data_parallel`) and sets
    every parameter and buffer on the copy, and (2) starts a thread for the replica's forward.
    `HostWork(model)` does both for real, on this thread: torch's `replicate` with its broadcast
    (the device copies, which need GPUs and are the devices' work, `StageCosts.replicate_ms`)
    replaced by detached views of the same tensors, and one thread started and joined per
    replica. The replica's kernel launches are not here: the simulator spends them from the
    measured launch time (`StageCosts.host_step_ms`, `replica_launch_ms`).
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._replicate = importlib.import_module("torch.nn.parallel.replicate")

    @contextlib.contextmanager
    def _without_copies(self):
        module = self._replicate
        saved = module._broadcast_coalesced_reshape
        module._broadcast_coalesced_reshape = lambda tensors, devices, detach=False: (
            [[t.detach() for t in tensors] for _ in devices] if len(tensors) else [])
        try:
            yield module.replicate
        finally:
            module._broadcast_coalesced_reshape = saved

    def __call__(self, replicas: int) -> None:
        if replicas < 1:
            return
        with self._without_copies() as replicate:
            replicate(self.model, list(range(replicas)))
        if replicas > 1:                  # parallel_apply: a new thread per replica, every step
            threads = [threading.Thread(target=int) for _ in range(replicas)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

    def per_replica_ms(self, replicas: int = 4, repeats: int = 9) -> float:
        """Median host time of one step's work for `replicas` replicas, divided by `replicas`: CPU
        time of this thread (the work runs on it), so that other programs busy on a shared
        machine do not inflate the model's figure; they slow the runs themselves, as they would
        slow a real DataParallel host (lesson 06 prints the CPU they used)."""
        self(replicas)
        times = []
        for _ in range(repeats):
            t0 = time.thread_time()
            self(replicas)
            times.append((time.thread_time() - t0) * 1e3 / replicas)
        return statistics.median(times)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class DPSizes:
    """The bytes a DataParallel step moves, measured on the real model (lesson 06): its
    parameters and buffers, one input sample as it is scattered, one sample's output."""
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    output_bytes: int


def dp_sizes(model: torch.nn.Module, sample: torch.Tensor) -> DPSizes:
    """Measure `DPSizes` of `model` for inputs shaped like `sample` (one item of the batch):
    the output size comes from one forward of two samples (eval mode, no gradients)."""
    params = list(model.parameters())
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(sample.unsqueeze(0).expand(2, *sample.shape).to(params[0].device).float())
    model.train(was_training)
    return DPSizes(_nbytes(params), _nbytes(model.buffers()), sample.numel() * sample.element_size(),
                   out[0].numel() * out.element_size())


def costs_from_sizes(sizes: DPSizes, *, replicate_host_ms: float = 0.0, host_note: str = "not measured",
                     link_gb_s: float = LINK_GB_S, memory_gb_s: float = MEMORY_GB_S,
                     compute_fixed_ms: float | None = None, compute_per_sample_ms: float | None = None,
                     host_step_ms: float | None = None, scale: float = 1.0) -> StageCosts:
    """The `StageCosts` of a simulated machine moving `sizes` over `link_gb_s` links (lesson 06);
    see `measure_dp_costs` for what is measured and what is taken from the H100 box. Every
    device time (compute, copies, memory traffic) and the launch time of a step are multiplied
    by `scale`, as the course's simulated accelerator scales the H100 box to this CPU
    (`sim.default_sim().scale`); `replicate_host_ms` (replicate's Python per replica) is this
    CPU's own. `host_ms_per_replica` is that plus `replica_launch_ms`."""
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    link = link_gb_s * 1e9 / 1e3 / scale          # bytes per ms, scaled
    memory = memory_gb_s * 1e9 / 1e3 / scale
    p, b = sizes.param_bytes, sizes.buffer_bytes
    scaled = f", x{scale:.2f} for this CPU" if scale != 1.0 else ""
    device0 = 5 * p / memory
    measured = compute_fixed_ms is None and compute_per_sample_ms is None
    fixed = max(DEFAULT_STEP_MS * scale - device0, 0.0) if compute_fixed_ms is None else compute_fixed_ms
    per_sample = DEFAULT_PER_SAMPLE_MS * scale if compute_per_sample_ms is None else compute_per_sample_ms
    launch = H100.eager_host_ms["fp32"] * scale if host_step_ms is None else host_step_ms
    compute_note = (f"the {H100.name} box's own GPU work per step (measured {H100.measured}, its optimizer "
                    f"taken out: only device 0 runs it){scaled}" if measured else "given")
    link_note = f"{link_gb_s:g} GB/s link" + (" (the H100 box's pinned host-to-device copy, standing in for a link "
                                               "between GPUs, not measured between GPUs)" if link_gb_s == LINK_GB_S
                                               else "")
    notes = {
        "compute_fixed_ms": f"{compute_note} (per replica, forward + backward)",
        "compute_per_sample_ms": compute_note,
        "scatter_ms_per_sample": f"measured {sizes.input_bytes:,} bytes per input sample / {link_note}{scaled}",
        "gather_ms_per_sample": f"measured {sizes.output_bytes:,} bytes per output, there and its gradient back, "
                                f"/ {link_gb_s:g} GB/s{scaled}",
        "replicate_ms": f"measured {(p + b) / 1e6:,.1f} MB of parameters and buffers / {link_gb_s:g} GB/s{scaled}",
        "reduce_ms": f"{p / 1e6:,.1f} MB of gradients / {link_gb_s:g} GB/s, summed at {memory_gb_s:g} GB/s{scaled}",
        "device0_ms": f"optimizer (SGD + momentum: 5 passes over {p / 1e6:,.1f} MB) at {memory_gb_s:g} GB/s{scaled}; "
                      "the loss on the outputs is negligible",
        "host_step_ms": (f"the {H100.name} box's measured launch time of one eager step (TF32, batch 128: "
                         f"~{H100.kernels_per_step} kernels){scaled}" if host_step_ms is None else "given"),
        "host_ms_per_replica": f"{host_note}, + {GIL_SHARE:.0%} of its forward launch (the part holding Python's "
                               "lock; an estimate, as in the simulated accelerator)",
        "forward_share": "the usual 1:2 ratio of a conv net's forward to its backward on a GPU (not measured here)",
    }
    costs = StageCosts(
        compute_fixed_ms=fixed, compute_per_sample_ms=per_sample,
        scatter_ms_per_sample=sizes.input_bytes / link, gather_ms_per_sample=2 * sizes.output_bytes / link,
        replicate_ms=(p + b) / link, reduce_ms=p / link + 3 * p / memory, device0_ms=device0,
        host_step_ms=launch, notes=notes)
    return dataclasses.replace(costs, host_ms_per_replica=replicate_host_ms + replica_launch_ms(costs))


def measure_dp_costs(model: torch.nn.Module, sample: torch.Tensor, *, host_work: HostWork | None = None,
                     link_gb_s: float = LINK_GB_S, memory_gb_s: float = MEMORY_GB_S, scale: float = 1.0,
                     compute_fixed_ms: float | None = None, compute_per_sample_ms: float | None = None) -> StageCosts:
    """The `StageCosts` of training `model` with DataParallel on a simulated machine (lesson 06).

    Measured here: the bytes of the model's parameters and buffers, of one input sample
    (`sample`, shaped like one item of the batch as it is scattered) and of one sample's output
    (`dp_sizes`), and replicate's Python work per replica (`host_work`, timed on this CPU).
    Taken from the H100 box the course measured (`sim.H100`), times `scale`: the replica's
    compute (that GPU's own work per step, unless `compute_fixed_ms` / `compute_per_sample_ms`
    are given), the launch time of one step, the speed of the links between devices
    (`link_gb_s`) and of the devices' memory (`memory_gb_s`).
    """
    from .env import cpu_name
    replicate_ms = host_work.per_replica_ms() if host_work is not None else 0.0
    note = (f"measured on this CPU ({cpu_name()}): torch's replicate, {_NO_COPIES}, and a thread" if host_work is not None
            else "not measured (no host work)")
    return costs_from_sizes(dp_sizes(model, sample), replicate_host_ms=replicate_ms, host_note=note,
                            link_gb_s=link_gb_s, memory_gb_s=memory_gb_s, compute_fixed_ms=compute_fixed_ms,
                            compute_per_sample_ms=compute_per_sample_ms, scale=scale)


# -- timing stages of a real step ------------------------------------------------------------------

class StageClock:
    """Time the named stages of a step, waiting for the devices around each (lesson 06).

        clock = StageClock(devices)
        with clock("scatter"):
            ...
        clock.medians_ms()      # {"scatter": ..., ...}, median over the steps timed

    On CUDA devices every device in `devices` is synchronised before and after the stage, so
    each stage's time is its own (this serialises stages that DataParallel would overlap: it
    is for seeing the stages, not for the fastest step). On a CPU there is nothing to wait for.
    `enabled=False` records nothing (warm-up steps).
    """

    def __init__(self, devices):
        self.devices = [torch.device(d) for d in devices]
        self.times_ms: dict[str, list[float]] = {}
        self.enabled = True

    def _sync(self) -> None:
        for d in self.devices:
            if d.type == "cuda":
                torch.cuda.synchronize(d)

    @contextlib.contextmanager
    def __call__(self, stage: str):
        self._sync()
        t0 = time.perf_counter()
        yield
        self._sync()
        if self.enabled:
            self.times_ms.setdefault(stage, []).append((time.perf_counter() - t0) * 1e3)

    def medians_ms(self) -> dict[str, float]:
        return {stage: statistics.median(ts) for stage, ts in self.times_ms.items()}


# -- utilisation and memory of every device ----------------------------------------------------------

def gpu_memory(indices) -> list[dict]:
    """Per CUDA device: the allocator's peak and current bytes and NVML's "used" (which adds the
    CUDA context and the allocator's cache), in MiB; "used" is None where NVML does not say (no
    NVML, a binding without the query, a vGPU or MIG slice that refuses it). NVML goes through
    `course_utils.monitor`'s guarded helpers, like every NVML query of the course."""
    handles = _nvml_handles(indices)
    rows = []
    for i in indices:
        used = nvml_reading(handles[i])[1] if handles.get(i) is not None else None
        rows.append({"device": i, "peak_allocated_mib": torch.cuda.max_memory_allocated(i) / 2**20,
                     "allocated_mib": torch.cuda.memory_allocated(i) / 2**20,
                     "reserved_mib": torch.cuda.memory_reserved(i) / 2**20, "nvml_used_mib": used})
    if handles:
        nvml_close()
    return rows


def _nvml_handles(indices) -> dict:
    """{CUDA index: its NVML handle, or None where NVML does not know it}; {} when NVML cannot
    start. GPUs are matched by UUID or PCI bus id (`monitor.nvml_find`), never by index."""
    if nvml_open() is not None:
        return {}
    return {i: nvml_find(torch.device("cuda", i))[0] for i in indices}


def _nvml_util(handle) -> float | None:
    """NVML's utilisation of one GPU in %, or None where NVML does not report it."""
    return None if handle is None else nvml_reading(handle)[0]


class PerDeviceMonitor:
    """Sample every device's utilisation in a background thread (lesson 06).

    `source` is a `SimulatedDataParallel` (busy share of each simulated device per interval)
    or a list of CUDA device indices (NVML's utilisation, as `nvidia-smi` shows it; None for a
    GPU whose utilisation NVML does not report, and no readings at all without NVML).
    After the `with` block: `t_s` (T,), `util` (T, devices) in %, `mean_util()` per device
    (None where there was no reading), `simulated`, `label`, `note` (why readings are missing).
    """

    def __init__(self, source, interval_s: float = 0.1):
        self.source = source
        self.interval_s = interval_s
        self.simulated = isinstance(source, SimulatedDataParallel)
        self.t_s: list[float] = []
        self.util: list[list] = []
        self.note = ""
        self._handles: list = []
        self._stop = threading.Event()
        self._thread = None

    @property
    def label(self) -> str:
        if self.simulated:
            return self.source.label
        return ", ".join(f"{torch.cuda.get_device_name(i)} (cuda:{i})" for i in self.source)

    def __enter__(self) -> "PerDeviceMonitor":
        if self.simulated:
            self._last = self.source.busy_seconds_per_device()
        else:
            handles = _nvml_handles(list(self.source))
            self._handles = [handles.get(i) for i in self.source]
            if not handles:
                self.note = "NVML is not available: no utilisation readings"
            elif any(h is None for h in self._handles):
                self.note = "NVML does not know some of these GPUs: no readings for them"
        self._t0 = self._last_t = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="per-device-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        if not self.simulated and any(h is not None for h in self._handles):
            nvml_close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        now = time.perf_counter()
        if self.simulated:
            busy = self.source.busy_seconds_per_device()
            dt = max(now - self._last_t, 1e-9)
            self.util.append([min(100.0, 100.0 * (b - a) / dt) for a, b in zip(self._last, busy)])
            self._last = busy
        else:
            self.util.append([_nvml_util(h) for h in self._handles])
        self.t_s.append(now - self._t0)
        self._last_t = now

    def mean_util(self) -> list:
        """Each device's mean utilisation over the samples, in % (None for a device without readings)."""
        if not self.util:
            return []
        out = []
        for k in range(len(self.util[0])):
            values = [row[k] for row in self.util if row[k] is not None]
            out.append(sum(values) / len(values) if values else None)
        return out


def plot_schedule(intervals, *, steps: int = 3, ax=None, title: str | None = None, label: str | None = None):
    """Draw the last `steps` steps of a `SimulatedDataParallel.trace`: the host's share of each
    step on the top row, then one row per device, one coloured bar per stage; a stage too short
    to see at this scale says so, with its time, in the legend. Returns the figure."""
    import matplotlib.pyplot as plt

    from .plotting import stamp

    intervals = list(intervals)
    if not intervals:
        raise ValueError("no intervals to plot: run some steps first")
    last = max(i.step for i in intervals)
    shown = [i for i in intervals if i.step > last - steps]
    t0 = min(i.start_s for i in shown)
    span_ms = (max(i.end_s for i in shown) - t0) * 1e3
    rows = sorted({i.device for i in shown})
    colours = {"host: launches and Python": "dimgrey", "scatter": "tab:orange", "replicate": "tab:purple",
               "forward": "tab:blue", "gather + loss": "tab:red", "backward": "tab:cyan", "reduce": "tab:pink",
               "optimizer (device 0)": "tab:brown", "on-device work": "tab:olive", "copy to device 0": "tab:grey"}
    longest: dict = {}
    for i in shown:
        longest[i.stage] = max(longest.get(i.stage, 0.0), (i.end_s - i.start_s) * 1e3)
    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 1.1 + 0.45 * len(rows)))
    fig = ax.figure
    seen = set()
    axis_px = ax.get_position().width * fig.get_figwidth() * fig.dpi     # the bars' scale: pixels per span
    for i in shown:
        thin = longest[i.stage] < 0.004 * span_ms
        # w6-06: a 0.45 ms replicate was 'too short to see' and drawn 3 pixels wide: say so from its width
        px = longest[i.stage] / span_ms * axis_px if span_ms > 0 else 0.0
        name = (f"{i.stage}: {longest[i.stage]:.3f} ms, " + ("too short to see" if px < 1 else
                f"a sliver (about {px:.0f} px) at this scale")) if thin else i.stage
        ax.barh(rows.index(i.device), (i.end_s - i.start_s) * 1e3, left=(i.start_s - t0) * 1e3,
                color=colours.get(i.stage, "tab:grey"), label=None if i.stage in seen else name, edgecolor="white",
                linewidth=0.3)
        seen.add(i.stage)
    ax.set_yticks(range(len(rows)), ["host" if d == HOST else f"device {d}" for d in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first stage shown")
    ax.set_title(title or f"{len(rows) - (HOST in rows)} simulated devices in DataParallel: the last {steps} steps")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)   # beside, not over, the axis
    fig.tight_layout()
    stamp(fig, label or "simulated devices (stage costs stated in the lesson; host work real)")
    return fig
