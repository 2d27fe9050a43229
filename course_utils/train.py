"""The one training loop every lesson calls (lesson 01 introduces it).

    result = train(model, loader, device=device, steps=200, amp="bf16", channels_last=True)
    print(result.stats)          # samples/s, data-wait vs compute, stall fraction

- `loader` is any iterable of `(images, labels)` batches: a DataLoader, a prefetcher (lesson
  03), a DALI iterator (lesson 04) or device-resident batches. Batches not yet on the device
  are copied with `non_blocking=True` (it only overlaps when the host memory is pinned).
- `batch_transform(images, labels)` runs on the device before the forward pass: normalising
  uint8, or augmenting whole batches (lesson 03).
- `amp`: None (fp32), "fp16" (with a GradScaler) or "bf16" (lesson 05); `channels_last`.
- `device` may be a `SimulatedAccelerator`: then each step is the simulated device's step
  and no model runs (the figures are labelled simulated); a `batch_transform` is computed and
  charged to the simulated device (`SimulatedAccelerator.run`), as a GPU would run it.
- Every step is timed by a `StepTimer` (data-wait vs the step), which does not synchronise
  per step: the host runs ahead as far as the device's queue allows, and the loop synchronises
  once at the end. Losses are kept as device tensors and read once at the end, so logging
  never forces a synchronisation per step either.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

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
          scheduler=None) -> TrainResult:
    """Train `model` on batches from `loader` for `steps` steps (or `epochs` passes).
    `scheduler` (a learning-rate scheduler) is stepped after every optimizer step."""
    if amp not in AMP_DTYPES:
        raise ValueError(f"amp must be one of None, 'fp16', 'bf16'; got {amp!r}")
    sim = _is_sim(device)
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
    timer = timer or StepTimer(device)
    total = steps if steps is not None else _safe_len(loader, epochs)
    bar = _progress(total, desc) if progress else None
    losses, done = [], 0
    try:
        for _ in range(epochs if steps is None else 10**9):
            done_before = done
            for images, labels in timer.wrap(loader):
                with timer.compute():
                    if sim:
                        if batch_transform is not None:   # device-side work: charged to the simulated device
                            images, labels = device.run(batch_transform, images, labels)
                        device.step(images)
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
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, leave=False, mininterval=0.5)
