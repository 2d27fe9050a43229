"""How much memory a training step needs, on a GPU and on a CPU (lesson 05).

On a GPU the caching allocator counts every byte: `torch.cuda.max_memory_allocated()` after a
step is its peak. A CPU has no such counter, but the part of a step's memory that grows with the
batch is the same on every device: the activations autograd *saves* for the backward pass. A
`torch.autograd.graph.saved_tensors_hooks` pair sees each of them as it is saved and as it is
released, so their live total (and its peak) can be measured exactly.

- `SavedTensorMeter`: bytes of tensors autograd holds for backward, live now and at the peak
  (each storage once, parameters left out).
- `GraphWatch`: how many autograd graphs are still alive (a kept loss keeps its graph).
- `state_bytes(model, optimizer)`: parameters + gradients + optimizer state, the fixed part.
- `measure_step_memory(...)`: one step of `course_utils.train.train` and its peak memory
  (measured on CUDA; fixed part + saved activations on a CPU, an estimate that says so).
- `fit_linear(batch_sizes, peak_bytes)`: the fit "memory = fixed + per-sample x batch".
- `usable_device_memory(device)`, `sweep_batch_sizes(fit, budget)`: batch sizes fitted to the
  card, not a fixed list; `is_out_of_memory(exc)`: every form a GPU's out-of-memory takes.
- `StepReadings`: wraps a loader and takes a reading before every step (memory over steps).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

__all__ = ["SavedTensorMeter", "GraphWatch", "state_bytes", "measure_step_memory", "StepMemory",
           "fit_linear", "LinearFit", "StepReadings", "mib", "is_out_of_memory", "usable_device_memory", "limit_device_memory",
           "sweep_batch_sizes", "release_device_memory"]

# How an allocation failure can surface: torch's own OutOfMemoryError, or a plain RuntimeError
# from a library that allocates its own workspace (cuDNN, cuBLAS) or from the driver.
OOM_MARKERS = ("out of memory", "CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED",
               "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE", "CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation")


def is_out_of_memory(exc: BaseException) -> bool:
    """True when `exc` says a device allocation failed, in any of the forms it takes (lesson 05):
    `torch.OutOfMemoryError`, or a `RuntimeError` from cuDNN/cuBLAS/the driver naming it."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in OOM_MARKERS)


def release_device_memory(device) -> None:
    """After a failed or finished probe: collect garbage and return the caching allocator's free
    blocks to the driver, so the next probe starts from the same state (lesson 05)."""
    import gc
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def usable_device_memory(device) -> int:
    """Bytes this process can still use on a CUDA device: what the driver reports free plus what
    PyTorch's caching allocator already holds (reserved, allocated or not: it hands that out
    first). Lesson 05."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError("usable_device_memory() is for CUDA devices; a CPU's limit is the machine's RAM")
    free, _total = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device))


def limit_device_memory(device, cap_bytes: int) -> int:
    """Let this process's caching allocator hold at most `cap_bytes` on a CUDA device
    (`torch.cuda.set_per_process_memory_fraction`: past it an allocation raises
    `torch.OutOfMemoryError`, as a card of that size would), and return the bytes it can use:
    `cap_bytes`, or `usable_device_memory(device)` when that is less (nothing is capped then).
    Lesson 05 caps a big card so that its sweep and search of real training steps take seconds."""
    device = torch.device(device)
    usable = usable_device_memory(device)
    if cap_bytes >= usable:
        return usable
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(cap_bytes / total, device)
    return int(cap_bytes)


def sweep_batch_sizes(fit: "LinearFit", budget_bytes: float, *, start: int = 16, fraction: float = 0.7,
                      max_points: int = 7) -> list[int]:
    """Powers of two from `start` whose predicted step memory stays under `fraction` of
    `budget_bytes` (at most `max_points`, the largest kept): a memory sweep sized for this card
    from a first rough fit, instead of a fixed list that runs out of memory on a small card."""
    if not 0 < fraction <= 1:
        raise ValueError("fraction must be in (0, 1]")
    sizes, b = [], start
    while fit.predict(b) <= fraction * budget_bytes and b <= 2**16:
        sizes.append(b)
        b *= 2
    if len(sizes) < 2:
        raise ValueError(f"even batch {start * 2} is predicted to need more than {fraction:.0%} of "
                         f"{budget_bytes / 2**20:,.0f} MiB")
    return sizes[-max_points:]


def mib(n_bytes: float) -> float:
    """Bytes to MiB (lesson 05)."""
    return float(n_bytes) / 2**20


def _storage_key(t: torch.Tensor):
    storage = t.untyped_storage()
    return (t.device.type, t.device.index, storage.data_ptr()), storage.nbytes()


class _Saved:
    """What the pack hook stores instead of the tensor: a detached alias that reports when it
    dies. (Detached, because holding the tensor itself would point back at its own graph node
    and keep the graph alive in a reference cycle.)"""

    __slots__ = ("tensor", "key", "meter", "__weakref__")

    def __init__(self, tensor, key, meter):
        self.tensor, self.key, self.meter = tensor, key, meter

    def __del__(self):
        self.meter._release(self.key)


class SavedTensorMeter:
    """Count the bytes autograd saves for the backward pass (lesson 05).

        with SavedTensorMeter(exclude=model.parameters()) as meter:
            loss = loss_fn(model(x), y)      # meter.live_bytes grows with every saved activation
            loss.backward()                  # ... and falls back to 0 as backward frees them
        print(meter.peak_bytes)

    Every saved tensor is counted by its storage, once, however many views of it are saved;
    storages of the `exclude` tensors (the parameters, which exist anyway) are left out.
    `live_bytes` is what graphs hold right now; `peak_bytes` the most they held at once.
    Only operations inside the `with` block (in this thread) are seen.
    """

    def __init__(self, exclude=()):
        self._exclude = {_storage_key(t)[0] for t in exclude}
        self._refs: dict = {}
        self._sizes: dict = {}
        self._lock = threading.Lock()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.saved_count = 0
        self._hooks = None

    def reset_peak(self) -> None:
        """Start a new peak from what is live now."""
        with self._lock:
            self.peak_bytes = self.live_bytes

    def _pack(self, t: torch.Tensor):
        key, nbytes = _storage_key(t)
        if key in self._exclude or nbytes == 0:
            return t
        with self._lock:
            self.saved_count += 1
            count = self._refs.get(key, 0)
            self._refs[key] = count + 1
            if count == 0:
                self._sizes[key] = nbytes
                self.live_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return _Saved(t.detach(), key, self)

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Saved) else packed

    def _release(self, key) -> None:
        with self._lock:
            count = self._refs.get(key, 0) - 1
            if count > 0:
                self._refs[key] = count
            elif count == 0:
                del self._refs[key]
                self.live_bytes -= self._sizes.pop(key)

    def __enter__(self) -> "SavedTensorMeter":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None


class _Token:
    __slots__ = ("watch",)

    def __init__(self, watch):
        self.watch = watch
        with watch._lock:
            watch.alive += 1
            watch.marked += 1

    def __del__(self):
        with self.watch._lock:
            self.watch.alive -= 1


class GraphWatch:
    """Count how many autograd graphs are still alive (lesson 05).

    `mark(loss)` tags the graph behind `loss` (its `grad_fn` node); `alive` is how many tagged
    graphs something still references. A graph lives as long as any tensor that has it as
    history: keep `loss` in a list and its graph stays; keep `loss.item()` or `loss.detach()`
    and it goes. `wrap(loss_fn)` returns a loss function that marks every loss it returns.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._key = f"graph-watch-{id(self)}"
        self.alive = 0
        self.marked = 0

    def mark(self, tensor: torch.Tensor) -> torch.Tensor:
        if isinstance(tensor, torch.Tensor) and tensor.grad_fn is not None:
            tensor.grad_fn.metadata[self._key] = _Token(self)
        return tensor

    def wrap(self, loss_fn):
        def marked_loss_fn(*args, **kwargs):
            return self.mark(loss_fn(*args, **kwargs))
        return marked_loss_fn


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """(Lesson 05.) Bytes of the parameters, their gradients (one per trainable parameter, whether or not
    allocated yet) and the optimizer's state tensors: the part of memory the batch size does not
    change."""
    params = list(model.parameters())
    total = sum(p.numel() * p.element_size() for p in params)
    total += sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    if optimizer is not None:
        seen = set()
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.data_ptr() not in seen:
                    seen.add(value.data_ptr())
                    total += value.numel() * value.element_size()
    return total


@dataclass
class StepMemory:
    """Peak memory of one training step (lesson 05). `method` says how it was obtained."""
    batch_size: int
    peak_bytes: int
    state_bytes: int
    activation_bytes: int
    method: str
    device: str = ""

    @property
    def peak_mib(self) -> float:
        return mib(self.peak_bytes)


def measure_step_memory(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, *, device,
                        amp: str | None = None, channels_last: bool = False,
                        optimizer: torch.optim.Optimizer | None = None, warmup: int = 1) -> StepMemory:
    """Run one step of the course's training loop on this batch and return its peak memory (lesson 05).

    CUDA: `warmup` untimed steps first (cuDNN's autotuning tries algorithms with their own
    workspaces on a shape's first step, which would inflate the peak), then
    `torch.cuda.max_memory_allocated` over one step (everything the allocator handed out:
    parameters, gradients, optimizer state, the batch, activations, workspaces), measured.
    CPU: `state_bytes` + the peak of the activations saved for backward (`SavedTensorMeter`),
    an estimate that leaves out short-lived temporaries and the allocator's own overhead.
    """
    from .env import device_label
    from .train import default_optimizer, train

    device = torch.device(device)
    model.to(device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    optimizer = optimizer or default_optimizer(model)
    batch = [(images, labels)]
    n = int(images.shape[0])
    if device.type == "cuda":
        if warmup:
            train(model, batch, device=device, steps=warmup, optimizer=optimizer, amp=amp,
                  channels_last=channels_last, progress=False)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        train(model, batch, device=device, steps=1, optimizer=optimizer, amp=amp,
              channels_last=channels_last, progress=False)
        torch.cuda.synchronize(device)
        peak = int(torch.cuda.max_memory_allocated(device))
        fixed = state_bytes(model, optimizer)
        return StepMemory(n, peak, fixed, max(peak - fixed, 0), "torch.cuda.max_memory_allocated",
                          device_label(device))
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        train(model, batch, device=device, steps=1, optimizer=optimizer, amp=amp,
              channels_last=channels_last, progress=False)
    fixed = state_bytes(model, optimizer)
    return StepMemory(n, fixed + meter.peak_bytes, fixed, meter.peak_bytes,
                      "estimate: parameters + gradients + optimizer state + saved activations",
                      device_label(device))


@dataclass
class LinearFit:
    """memory ≈ fixed_bytes + per_sample_bytes × batch_size, fitted by least squares (lesson 05)."""
    fixed_bytes: float
    per_sample_bytes: float
    batch_sizes: list = field(repr=False, default_factory=list)
    residuals: list = field(repr=False, default_factory=list)

    def predict(self, batch_size) -> float:
        return self.fixed_bytes + self.per_sample_bytes * batch_size

    def largest_within(self, budget_bytes: float) -> int:
        """The largest batch size the fit says stays within `budget_bytes` (0 if none)."""
        if self.per_sample_bytes <= 0:
            raise ValueError("the fit has no per-sample cost")
        return max(int((budget_bytes - self.fixed_bytes) / self.per_sample_bytes + 1e-9), 0)  # 1e-9: float round-off

    @property
    def max_relative_error(self) -> float:
        """Largest |residual| relative to the measured value."""
        values = [self.predict(b) - r for b, r in zip(self.batch_sizes, self.residuals)]
        return max((abs(r) / v for r, v in zip(self.residuals, values) if v), default=0.0)

    def __str__(self) -> str:
        return (f"memory ≈ {mib(self.fixed_bytes):,.1f} MiB + {mib(self.per_sample_bytes):,.3f} MiB "
                f"× batch (largest misfit {self.max_relative_error:.1%})")


def fit_linear(batch_sizes, peak_bytes) -> LinearFit:
    """Least-squares fit of peak memory against batch size (lesson 05; two or more distinct sizes)."""
    x = np.asarray(batch_sizes, dtype=float)
    y = np.asarray(peak_bytes, dtype=float)
    if x.shape != y.shape or len(np.unique(x)) < 2:
        raise ValueError("fit_linear needs two or more distinct batch sizes, one value each")
    slope, intercept = np.polyfit(x, y, 1)
    residuals = y - (intercept + slope * x)
    return LinearFit(float(intercept), float(slope), x.tolist(), residuals.tolist())


class StepReadings:
    """Wrap a loader and call `read()` before each batch is handed out (lesson 05).

        readings = StepReadings(batches, lambda: meter.live_bytes)
        train_somehow(model, readings, ...)
        readings.values      # one reading per step, taken when the loop asks for the next batch

    At that moment the previous step is over, so a reading that grows step after step is memory
    the loop keeps from one step to the next.
    """

    def __init__(self, batches, read):
        self.batches, self.read = batches, read
        self.values: list = []

    def __iter__(self):
        for batch in self.batches:
            self.values.append(self.read())
            yield batch

    def __len__(self):
        return len(self.batches)

