"""The one training loop every lesson calls (lesson 01 introduces it).

    result = train(model, loader, device=device, steps=200, amp="bf16", channels_last=True)
    print(result.stats)          # samples/s, data-wait vs compute, stall fraction

- `loader` is any iterable of `(images, labels)` batches: a DataLoader, a prefetcher (lesson
  03), a DALI iterator (lesson 04) or device-resident batches. Batches not yet on the device
  are copied with `non_blocking=True` (it only overlaps when the host memory is pinned).
- `batch_transform(images, labels)` runs on the device before the forward pass: normalising
  uint8, or augmenting whole batches (lesson 03).
- `amp`: None (fp32), "fp16" (with a GradScaler) or "bf16" (lesson 05); `channels_last`.
- `device` may be a `SimulatedAccelerator`: then each step is the simulated device's step (its
  launch time spent on the host, its work queued on the device, for the step's batch, `amp` and
  `channels_last`) and no model runs (the figures are labelled simulated); a `batch_transform` is
  computed and charged to the simulated device (`SimulatedAccelerator.run`), as a GPU would run
  it, and a batch that a GPU would have to copy from host memory is charged that copy
  (`batches_on_device=False`; by default a loader that says `device_resident = True`, such as
  `DeviceLoader`, is not charged).
- `cuda_graph=True` (lesson 05): the whole step (forward, backward, optimizer) is captured once
  as a CUDA graph and replayed: one launch per step instead of ~390, which is what a fast GPU fed
  small batches needs (the eager step is launch-bound). The first `GRAPH_WARMUP` steps run
  eagerly on a side stream (autotuning, the optimizer's state), then the step is captured on that
  stream (`capture_error_mode="thread_local"`, so that a loader's pinning thread may allocate while
  this thread captures) and each batch is copied into static buffers and the graph replayed. A graph
  replays the shapes it captured: a batch of another shape (an epoch's short last batch, with
  `drop_last=False`) runs as an eager step instead, on the same stream, updating the same
  parameters and optimizer state. The learning rate must not change (no `scheduler`). fp16's GradScaler is
  captured with a fused optimizer only (`fused=True`: it takes the scale and the inf flag as
  device tensors); with any other, `scaler.step` reads on the host whether a gradient overflowed,
  every step, and the capture is refused: use a fused optimizer, or bf16. Beside the simulator, the
  measured graph step is charged instead; on the CPU there is no graph: a clear error.
- Every step is timed by a `StepTimer` (data-wait vs the step), which does not synchronise
  per step: the host runs ahead as far as the device's queue allows, and the loop synchronises
  once at the end. Losses are kept as device tensors and read once at the end, so logging
  never forces a synchronisation per step either.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn

from .sim import is_on_device
from .timing import StepTimer, StepStats

__all__ = ["train", "evaluate", "TrainResult", "default_optimizer", "AMP_DTYPES"]

AMP_DTYPES = {None: None, "fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class TrainResult:
    stats: StepStats
    losses: list[float] = field(default_factory=list)
    steps: int = 0

    def __str__(self) -> str:
        last = f"; last loss {self.losses[-1]:.3f}" if self.losses else ""
        return f"{self.steps} steps: {self.stats}{last}"


def default_optimizer(model: nn.Module, lr: float = 0.05) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum and weight decay, the usual CIFAR recipe."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)


def _is_sim(device) -> bool:
    return getattr(device, "type", None) == "sim"


def train(model: nn.Module | None, loader, *, device, steps: int | None = None, epochs: int = 1,
          optimizer: torch.optim.Optimizer | None = None, loss_fn=None, amp: str | None = None,
          scaler=None, channels_last: bool = False, batch_transform=None, non_blocking: bool = True,
          timer: StepTimer | None = None, progress: bool = True, desc: str = "train",
          scheduler=None, batches_on_device: bool | None = None, cuda_graph: bool = False) -> TrainResult:
    """Train `model` on batches from `loader` for `steps` steps (or `epochs` passes).
    `scheduler` (a learning-rate scheduler) is stepped after every optimizer step.
    `batches_on_device` (simulated device only): whether the batches are already in device
    memory, so that no host-to-device copy is charged (default: the loader's `device_resident`)."""
    if amp not in AMP_DTYPES:
        raise ValueError(f"amp must be one of None, 'fp16', 'bf16'; got {amp!r}")
    sim = _is_sim(device)
    if cuda_graph:
        if scheduler is not None:
            raise ValueError("cuda_graph=True replays the captured learning rate: a scheduler's changes would be "
                             "ignored (make the learning rate a device tensor updated in place to schedule it)")
        if amp == "fp16" and not (optimizer is not None and all(g.get("fused") for g in optimizer.param_groups)):
            raise ValueError("cuda_graph=True captures fp16's GradScaler with a fused optimizer only: with another, "
                             "scaler.step reads on the host whether a gradient overflowed, every step. Pass a fused "
                             "optimizer (torch.optim.SGD(..., fused=True)), or use amp='bf16'")
        if not sim and torch.device(device).type != "cuda":
            raise ValueError(f"cuda_graph=True needs a CUDA device; this run trains on {device}")
    if sim and batches_on_device is None:
        batches_on_device = bool(getattr(loader, "device_resident", False))
    if not sim:
        device = torch.device(device)
        if model is None:
            raise ValueError("train() needs a model unless device is a SimulatedAccelerator")
        model.to(device)
        if channels_last:
            model.to(memory_format=torch.channels_last)
        model.train()
        optimizer = optimizer or default_optimizer(model)
        loss_fn = loss_fn or nn.CrossEntropyLoss()
        amp_dtype = AMP_DTYPES[amp]
        if amp == "fp16" and scaler is None:
            scaler = torch.amp.GradScaler(device.type)
        graphed = _GraphedStep(model, optimizer, loss_fn, amp_dtype, channels_last, device, scaler) if cuda_graph \
            else None
    timer = timer or StepTimer(device)
    total = steps if steps is not None else _safe_len(loader, epochs)
    skip = getattr(timer, "skip_first", 0)
    if progress and total and 0 < skip < total:   # the line counts every step; say which are timed (w2-03: "0/21"
        desc = f"{desc}, {skip} warm-up + {total - skip} timed"     # beside "20 steps per rung")
    bar = _progress(total, desc) if progress else None
    losses, done = [], 0
    held = device.active() if sim and hasattr(device, "active") else contextlib.nullcontext()  # the sim's device memory
    batches = None
    try:
        with held:
            for _ in range(epochs if steps is None else 10**9):
                done_before = done
                # kept until the last step is timed: leaving the loop early (a `break`) would otherwise
                # close the loader's iterator at once, and a DataLoader's workers shut down inside the last
                # timed step (seconds under spawn: x-03 C1)
                batches = timer.wrap(loader)
                for images, labels in batches:
                    with timer.compute():
                        if sim:
                            if not batches_on_device and not is_on_device((images, labels)):
                                device.copy_in((images, labels))   # the copy a GPU would make from host memory
                            n = len(images)
                            if batch_transform is not None:   # device-side work: charged to the simulated device
                                n = device.run_timed(batch_transform, images, labels)
                            device.step(n, amp=amp, channels_last=channels_last, graph=cuda_graph)
                        elif graphed is not None:
                            losses.append(graphed(images, labels, batch_transform, non_blocking))
                        else:
                            loss = _step(model, images, labels, device, optimizer, loss_fn, amp_dtype,
                                         scaler, channels_last, batch_transform, non_blocking)
                            losses.append(loss)
                            if scheduler is not None:
                                scheduler.step()
                    done += 1
                    if bar is not None:
                        bar.update(1)
                    if steps is not None and done >= steps:
                        break
                if steps is not None and done >= steps:
                    break
                if done == 0:
                    raise RuntimeError("the loader yielded no batches")
                if done == done_before:
                    break  # a one-shot iterator ran out before `steps`: stop with what it gave
        timer.finish()       # the loop's one synchronisation: the device finishes the queued steps
    finally:
        if batches is not None:
            batches.close()  # the loader's iterator (and its workers) after the last step's end was stamped
        if bar is not None:
            bar.close()
    values = torch.stack(losses).float().cpu().tolist() if losses else []
    return TrainResult(timer.stats(), values, done)


def _step(model, images, labels, device, optimizer, loss_fn, amp_dtype, scaler, channels_last,
          batch_transform, non_blocking):
    images = images.to(device, non_blocking=non_blocking)
    labels = labels.to(device, non_blocking=non_blocking)
    if batch_transform is not None:
        images, labels = batch_transform(images, labels)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = loss_fn(model(images), labels)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return loss.detach()


GRAPH_WARMUP = 3     # eager steps on a side stream before the capture (cuDNN autotuning, optimizer state)


class _GraphedStep:
    """One training step captured as a CUDA graph (see `train(cuda_graph=True)`)."""

    def __init__(self, model, optimizer, loss_fn, amp_dtype, channels_last, device, scaler=None):
        self.model, self.optimizer, self.loss_fn, self.scaler = model, optimizer, loss_fn, scaler
        self.amp_dtype, self.channels_last, self.device = amp_dtype, channels_last, device
        self.side = torch.cuda.Stream(device)
        self.warmup_left = GRAPH_WARMUP
        self.graph = None
        self.shapes = None              # the (images, labels) shapes the graph is for: the first batch's
        self.static_images = self.static_labels = self.static_loss = None
        self.eager_steps = 0            # batches of another shape, run eagerly (an epoch's short last batch)

    def _forward_backward(self, images, labels):
        with torch.autocast(device_type="cuda", dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            loss = self.loss_fn(self.model(images), labels)
        if self.scaler is not None:       # a fused optimizer: the scale and the inf flag stay on the device
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        return loss

    def __call__(self, images, labels, batch_transform, non_blocking):
        images = images.to(self.device, non_blocking=non_blocking)
        labels = labels.to(self.device, non_blocking=non_blocking)
        if batch_transform is not None:
            images, labels = batch_transform(images, labels)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        current = torch.cuda.current_stream(self.device)
        shapes = (tuple(images.shape), tuple(labels.shape))
        if self.shapes is None:
            self.shapes = shapes
        other_shape = shapes != self.shapes
        if self.warmup_left or other_shape:       # eager steps on a side stream, as capture requires
            if not other_shape:
                self.warmup_left -= 1
            else:
                self.eager_steps += 1
            self.side.wait_stream(current)
            with torch.cuda.stream(self.side):
                # once captured, the gradients live in the graph's memory: zero them there (set to None, the eager
                # backward would allocate new ones and the replays would keep reading the old)
                self.optimizer.zero_grad(set_to_none=self.graph is None)
                loss = self._forward_backward(images, labels).detach()
            current.wait_stream(self.side)
            return loss
        if self.graph is None:
            self.static_images = torch.empty_like(images)
            self.static_labels = torch.empty_like(labels)
            self.static_images.copy_(images)
            self.static_labels.copy_(labels)
            self.optimizer.zero_grad(set_to_none=True)
            self.graph = torch.cuda.CUDAGraph()
            # on the warm-up's stream (its per-stream library state is ready), and "thread_local": the loader's
            # pinning thread may allocate pinned memory while this thread captures (in "global" mode that fails
            # the capture)
            with torch.cuda.graph(self.graph, stream=self.side, capture_error_mode="thread_local"):
                self.static_loss = self._forward_backward(self.static_images, self.static_labels).detach()
        else:
            self.static_images.copy_(images)
            self.static_labels.copy_(labels)
        self.graph.replay()
        return self.static_loss.clone()


@torch.no_grad()
def evaluate(model: nn.Module, loader, *, device, batch_transform=None, max_batches: int | None = None) -> float:
    """Top-1 accuracy of `model` over `loader` (at most `max_batches` batches)."""
    device = torch.device(device)
    model.eval()
    correct, seen = torch.zeros((), dtype=torch.long, device=device), 0
    for i, (images, labels) in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if batch_transform is not None:
            images, labels = batch_transform(images, labels)
        correct += (model(images).argmax(1) == labels).sum()     # counted on the device: no sync per batch
        seen += len(labels)
    model.train()
    return int(correct) / max(seen, 1)


def _safe_len(loader, epochs: int):
    try:
        return len(loader) * epochs
    except TypeError:
        return None


def _progress(total, desc):
    # a line that ends on its final count, also in a notebook saved after a headless run (not a
    # tqdm widget, whose saved text stays at 0/N: course_utils.progress)
    from .progress import progress
    return progress(total=total, desc=desc)
