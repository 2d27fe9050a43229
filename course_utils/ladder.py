"""Climb the optimisation ladder on this machine: each rung's speed against the ceiling (lesson 03).

    python -m course_utils.ladder                      # full size (ResNet-18 on a GPU)
    python -m course_utils.ladder --smoke              # a quick climb
    python -m course_utils.ladder --json build/ladder.json --plot build/ladder.png
    python -m course_utils.ladder --step-ms 10         # no GPU: a simulated device of 10 ms/step

Every rung trains through the one loop, `course_utils.train.train`, for the same number of
steps, in one run, and is reported as samples/s and as a fraction of the **model-only
ceiling** (the same model fed one batch already on the device, again and again) measured in
the same run. Ratios measured together are what to compare; absolute numbers belong to the
hardware named in the table's title.

On a CUDA GPU the model is the CIFAR ResNet-18 at full width, in fp32. Without a GPU the device
is the course's simulated accelerator (`course_utils.sim`: the H100 the course measured, scaled
to this CPU; `--step-ms` replaces it by a plain device of that fixed step time) and the table
says "simulated". Work a rung does *on the device* (normalising, augmenting) then runs
as tensor operations on the host and is charged to the simulated device's time at the speed
factor its label states (`SimulatedAccelerator.run`), as a GPU stream would run those kernels
before the step: it is done and paid for, never skipped or overlapped for free.

The rungs are small named functions in `RUNGS`, in order. A later lesson adds its rung by
writing one more function with `@rung(...)` and appending it to `RUNGS`. A rung that cannot
run here (DALI missing; CUDA graphs with COURSE_DEVICE=cpu) raises
`RungSkipped` with the reason, and the table says so instead of inventing a number.

Each rung is built from one `Pipeline` (what the training loop is fed: a loader, the work done on
the device, prefetching, mixed precision), made by a small function of the context
(`baseline_pipeline(ctx)`, ..., `device_resident_pipeline(ctx)`) from the context's building
blocks (`ctx.loader`, `ctx.on_device`, `ctx.records`). Lesson 08 composes its own pipeline
from the same blocks, and `ctx.run(pipeline)` measures it exactly as a rung is measured: the
capstone and `make ladder` share one implementation of every rung.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import itertools
import math
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader

from . import data
from .bottleneck import COMPUTE_UTIL, diagnose
from .device_data import AugmentBatch, DeviceLoader, normalize_batch
from .env import device_label, has_dali, usable_cores
from .loaders import in_flight_batches
from .prefetch import BackgroundLoader, CudaPrefetcher
from .sim import SimulatedAccelerator
from .target import CPU_MODEL_WIDTH, Target, pick_target
from .timing import StepTimer
from .train import TrainResult, train

__all__ = ["LadderConfig", "LadderContext", "LadderResult", "RungSkipped", "rung", "RUNGS", "measure_ceiling",
           "climb", "rung_baseline", "rung_best_workers", "rung_prefetcher", "rung_device_resident", "rung_dali",
           "rung_mixed_precision", "main", "Pipeline", "TrainingSet", "ImageArrays", "ladder_context", "measure_rung",
           "baseline_pipeline", "workers_pipeline", "prefetcher_pipeline", "device_resident_pipeline",
           "dali_pipeline", "mixed_precision_pipeline", "cuda_graph_pipeline", "rung_cuda_graph", "rung_row",
           "SAME_RUN_FLOOR", "RATIO_NOISE", "precision_words", "noise_bars_words", "one_run_words", "ceiling_share_words",
           "data_on_device_words"]


class RungSkipped(Exception):
    """Raised by a rung that cannot be measured on this machine; its message says why."""


@dataclass
class LadderConfig:
    """What to climb with. `steps` defaults to 30 (smoke) or 200 per rung; `num_workers` to the
    usable cores; `step_ms` (simulated device only) to the course's default device; `limit`
    keeps the first records of the dataset (quick tests)."""
    smoke: bool = False
    steps: int | None = None
    batch_size: int = 128
    num_workers: int | None = None
    step_ms: float | None = None
    model: str | None = None
    limit: int | None = None
    device: str | None = None
    rungs: list[str] | None = None

    def resolved_steps(self) -> int:
        return self.steps if self.steps is not None else (30 if self.smoke else 200)

    def resolved_workers(self) -> int:
        return self.num_workers if self.num_workers is not None else usable_cores()

    def resolved_model(self, target) -> str | None:
        """The model trained on a real device: `model`, else the full ResNet-18 on a GPU and a
        narrow one on the CPU (COURSE_DEVICE=cpu); None beside the simulator."""
        if target.simulated:
            return None
        return self.model or ("resnet18" if target.cuda else f"resnet18-w{CPU_MODEL_WIDTH}")


class ImageArrays(data.CIFAR10Binary):
    """CIFAR-style images held in arrays, as a Dataset: item i is `(transform(PIL image), label)`,
    exactly what `data.CIFAR10Binary` gives, whose items these are (lesson 08: a check hands a
    pipeline its own images this way). A module-level class, so that spawned DataLoader workers
    can unpickle it."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform=None):   # no file is read
        self.images, self.labels, self.transform = images, labels, transform


class TrainingSet:
    """The images a climb trains on, in host memory: `images` (N, 32, 32, 3) uint8 HWC and
    `labels` (N,) int64, as `data.load_cifar10_arrays` returns them (lesson 08).

    `TrainingSet.cifar10(limit)` is the course's CIFAR-10 training split (real or the embedded
    default); a check builds one from images of its own. The same images, three ways:
    `dataset(transform)` (a Dataset for a DataLoader), `records()` (CIFAR's binary records, for
    DALI's external source) and `on_device(device)` (uint8 NCHW tensors in device memory).
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, description: str = "", records=None):
        images, labels = np.asarray(images), np.asarray(labels)
        if images.ndim != 4 or images.shape[1:] != (32, 32, 3) or images.dtype != np.uint8:
            raise ValueError(f"images must be (N, 32, 32, 3) uint8; got {images.shape} {images.dtype}")
        if labels.shape != (len(images),):
            raise ValueError(f"labels must be ({len(images)},); got {labels.shape}")
        self.images, self.labels = images, labels.astype(np.int64, copy=False)
        self.description = description or f"{len(labels):,} images in memory"
        self._records = records
        self._on_device: dict = {}

    @classmethod
    def cifar10(cls, limit: int | None = None) -> "TrainingSet":
        """The course's CIFAR-10 training split (at most `limit` records); DALI reads its
        binary files memory-mapped."""
        from .dali_pipelines import RecordStore
        info = data.prepare_cifar10()
        images, labels = data.load_cifar10_arrays(info.root, train=True, limit=limit)
        held = f"; {len(labels):,} training records held here (limit={limit:,})" if len(labels) < info.n_train else ""
        return cls(images, labels, info.describe() + held,
                   records=lambda: RecordStore.from_cifar(info.root, train=True, limit=limit))

    def __len__(self) -> int:
        return len(self.labels)

    def dataset(self, transform) -> ImageArrays:
        """A Dataset of these images with `transform` (the arrays are shared, not copied)."""
        return ImageArrays(self.images, self.labels, transform)

    def records(self):
        """The images as CIFAR-10 binary records (N, 3073): the label byte, then the red, green
        and blue planes; what `dali_pipelines.cifar_loader(records)` reads."""
        if callable(self._records):
            self._records = self._records()
        if self._records is None:
            out = np.empty((len(self), data.RECORD_BYTES), np.uint8)
            out[:, 0] = self.labels
            out[:, 1:] = self.images.transpose(0, 3, 1, 2).reshape(len(self), -1)
            self._records = out
        return self._records

    def on_device(self, device):
        """(images (N, 3, 32, 32) uint8, labels (N,) int64) in `device`'s memory, copied once.
        Beside the simulated accelerator (`device` is one): in its simulated device memory
        (`sim.SimDeviceTensor`), so that work on them in its training loop is device work."""
        simulated = getattr(device, "type", None) == "sim"
        key = "sim" if simulated else str(torch.device(device))
        if key not in self._on_device:
            images = torch.from_numpy(self.images).permute(0, 3, 1, 2).contiguous()
            labels = torch.from_numpy(self.labels)
            if simulated:
                from .sim import on_device
                self._on_device[key] = (on_device(images), on_device(labels))
            else:
                device = torch.device(device)
                self._on_device[key] = (images.to(device), labels.to(device))
        return self._on_device[key]

    def __repr__(self) -> str:
        return f"TrainingSet({self.description})"


@dataclass
class Pipeline:
    """An input pipeline, as the training loop runs it (lesson 08; every rung is one).

    loader: an iterable of `(images, labels)` batches; each pass over it (each `for`) is one
        epoch. A DataLoader, a `DeviceLoader`, a DALI loader...
    batch_transform: `f(images, labels) -> (images, labels)`, run on the device before each step
        (normalising uint8, augmenting whole batches); beside the simulator, computed and charged
        to the simulated device.
    prefetch: get the next batch ready ahead: copied on a CUDA side stream on a GPU
        (`CudaPrefetcher`), taken from the loader by a background thread beside the simulator
        (`BackgroundLoader`).
    amp, channels_last: how the model step runs (lesson 05); beside the simulator, which of the
        measured steps it costs.
    cuda_graph: the whole step captured once as a CUDA graph and replayed (lesson 05): one launch
        per step instead of hundreds; needs a GPU (or the simulator, which charges the measured
        graph step).
    """
    loader: object
    batch_transform: object = None
    prefetch: bool = False
    amp: str | None = None
    channels_last: bool = False
    name: str = ""
    cuda_graph: bool = False

    def describe(self) -> str:
        parts = [type(self.loader).__name__]
        if self.batch_transform is not None:
            parts.append(f"on the device: {getattr(self.batch_transform, '__name__', None) or self.batch_transform!r}")
        if self.prefetch:
            parts.append("prefetched")
        if self.amp:
            parts.append(f"{self.amp} autocast")
        if self.channels_last:
            parts.append("channels_last")
        if self.cuda_graph:
            parts.append("CUDA graph")
        return (f"{self.name}: " if self.name else "") + ", ".join(parts)


@dataclass
class LadderContext:
    """Everything a rung needs: where to train, on what model, with which dataset, and the
    building blocks of its pipeline (`loader`, `on_device`, `records`)."""
    config: LadderConfig
    device: torch.device                     # where tensors live: cuda, or cpu beside the simulator
    run_on: object                           # what train() gets: the CUDA device or the simulator
    model: torch.nn.Module | None
    progress: bool = True
    training_set: TrainingSet | None = field(default=None, repr=False)

    @classmethod
    def for_target(cls, target: Target, config: LadderConfig | None = None, *, model: torch.nn.Module | None = None,
                   training_set: TrainingSet | None = None, progress: bool = True) -> "LadderContext":
        """The context for `target` (`course_utils.target.pick_target()`): its model is `model`,
        else `config.resolved_model()` (the ResNet-18 on a GPU, narrow on the CPU, none beside
        the simulator); its images `training_set`, else the course's CIFAR-10."""
        config = config or LadderConfig()
        if target.simulated:
            model = None
        elif model is None:
            from .models import build_model
            torch.backends.cudnn.benchmark = True
            model = build_model(config.resolved_model(target)).to(target.device)
        return cls(config, target.device, target.run_on, model, progress=progress, training_set=training_set)

    @property
    def simulated(self) -> bool:
        return isinstance(self.run_on, SimulatedAccelerator)

    @property
    def label(self) -> str:
        return device_label(self.run_on)

    @property
    def cuda(self) -> bool:
        return not self.simulated and self.device.type == "cuda"

    @property
    def kind(self) -> str:
        """"cuda", "cpu" (a real model on the CPU) or "sim", as `Target.kind`."""
        return "sim" if self.simulated else ("cuda" if self.cuda else "cpu")

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def num_workers(self) -> int:
        """DataLoader workers where a rung uses them: one per usable core (or the configured number)."""
        return self.config.resolved_workers()

    @property
    def data(self) -> TrainingSet:
        """The training images (the course's CIFAR-10 unless the context was given others)."""
        if self.training_set is None:
            self.training_set = TrainingSet.cifar10(self.config.limit)
        return self.training_set

    def dataset(self, transform) -> ImageArrays:
        """The training set as a Dataset with `transform` (the arrays are read once and shared)."""
        return self.data.dataset(transform)

    def loader(self, transform, num_workers: int, *, drop_last: bool = True) -> DataLoader:
        """A shuffling DataLoader; pinned memory and prefetch_factor 4 when it helps. The rungs drop
        the last short batch (`drop_last=True`: a timed step is a full one); a pipeline that must
        give every sample of an epoch (exercise 8.1) keeps it with `drop_last=False`."""
        extra = {"prefetch_factor": 4, "persistent_workers": False} if num_workers else {}
        return DataLoader(self.dataset(transform), batch_size=self.config.batch_size, shuffle=True,
                          num_workers=num_workers, pin_memory=self.cuda, drop_last=drop_last, **extra)

    def on_device(self):
        """The whole training set in device memory: (images (N, 3, 32, 32) uint8, labels int64)
        (beside the simulator, in its simulated device memory)."""
        return self.data.on_device(self.run_on if self.simulated else self.device)

    def records(self):
        """The training set as CIFAR-10 binary records, for DALI's external source."""
        return self.data.records()

    def batches(self, pipeline: Pipeline):
        """The iterable `train()` is given for `pipeline`: its loader, prefetched if it asks."""
        batches = pipeline.loader
        if pipeline.prefetch:
            batches = BackgroundLoader(batches) if self.simulated else CudaPrefetcher(batches, self.device)
        return batches

    def model_batches(self, pipeline: Pipeline):
        """What the model is fed, batch by batch, for `pipeline`: its batches on the device, after
        its `batch_transform` (lesson 08's check reads them). The same steps as `train()` takes
        before the forward pass; beside the simulator the work is done here, not charged."""
        for images, labels in self.batches(pipeline):
            if not self.simulated:
                images = images.to(self.device, non_blocking=True)
                labels = labels.to(self.device, non_blocking=True)
            if pipeline.batch_transform is not None:
                images, labels = pipeline.batch_transform(images, labels)
            yield images, labels

    def train(self, batches, *, batch_transform=None, prefetch: bool = False, desc: str = "rung",
              batches_on_device: bool | None = None, **train_kwargs) -> TrainResult:
        """Train on `batches` for the configured steps (after an untimed warm-up) through
        `course_utils.train.train`.

        `batch_transform(images, labels)` is work for the device (beside the simulator: charged
        to it). `prefetch=True` gets the next batch ready ahead: copied on a CUDA side stream on
        a GPU; beside the simulator, taken from the loader by a background thread and charged no copy
        (the simulator has no copy engine: this is the best a side stream's copy could do).
        `amp` and `channels_last` set how the step runs (beside the simulator: which of its
        measured steps it costs); `model` replaces the context's model on a real device.
        """
        if prefetch:
            batches = BackgroundLoader(batches) if self.simulated else CudaPrefetcher(batches, self.device)
            batches_on_device = True
        # untimed warm-up: one step, plus the batches the loader prepared ahead while it started
        # (served without waiting, they would flatter the rung), as measure_loader does
        warmup = 1 + in_flight_batches(batches)
        if warmup > 1:          # w9-03: why the rungs' warm-ups differ, on the progress bar that shows them
            own = in_flight_batches(batches) - in_flight_batches(getattr(batches, "loader", None))
            # w12-03: exercise 3.1's prefetcher holds one; the rest are the workers' and thread's queues
            who = ("a background thread's queue, the prefetcher beside the simulator" if self.simulated else
                   "the prefetcher's one, as in exercise 3.1")
            desc = (f"{desc} (1 step + {warmup - 1} loaded ahead: {own} in {who}, the rest queued by the loader's "
                    "workers)" if prefetch else f"{desc} (1 step + {warmup - 1} loaded ahead)")
        timer = StepTimer(self.run_on, skip_first=warmup)
        steps = self.config.resolved_steps() + warmup
        if self.simulated:
            train_kwargs.pop("model", None)
            return train(None, batches, device=self.run_on, steps=steps, batch_transform=batch_transform,
                         timer=timer, progress=self.progress, desc=desc, batches_on_device=batches_on_device,
                         **train_kwargs)
        model = train_kwargs.pop("model", self.model)
        with _nvml_utilisation(self.device, timer) as util:
            result = train(model, batches, device=self.device, steps=steps, batch_transform=batch_transform,
                           timer=timer, progress=self.progress, desc=desc, **train_kwargs)
        if util.value is not None:
            result.stats.device_util = util.value
        return result

    def run(self, pipeline: Pipeline, *, desc: str | None = None) -> TrainResult:
        """Measure `pipeline` as a rung is measured: the configured steps through `train()`, after
        the untimed warm-up. With `channels_last` a copy of the model trains (the memory format
        would otherwise stay changed for whatever runs next)."""
        kwargs = {"amp": pipeline.amp, "channels_last": pipeline.channels_last}
        if pipeline.cuda_graph:
            kwargs["cuda_graph"] = True
        if pipeline.channels_last and not self.simulated:
            kwargs["model"] = copy.deepcopy(self.model)
        return self.train(pipeline.loader, batch_transform=pipeline.batch_transform, prefetch=pipeline.prefetch,
                          desc=desc or pipeline.name or "pipeline", **kwargs)

    def warm_up(self) -> None:
        """On a GPU: cuDNN autotuning and the allocator warm up outside every measurement."""
        if self.cuda and self.model is not None:
            bs = self.config.batch_size
            warm = torch.randn(bs, 3, 32, 32, device=self.device)
            train(self.model, itertools.repeat((warm, torch.zeros(bs, dtype=torch.long, device=self.device))),
                  device=self.device, steps=5, progress=False)


class _Reading:
    value: float | None = None


@contextlib.contextmanager
def _nvml_utilisation(device, timer: StepTimer):
    """On a CUDA device with NVML: the GPU's mean utilisation (0-1) over the counted steps of
    `timer`, sampled every 50 ms, in `.value` after the block; None elsewhere."""
    reading = _Reading()
    if torch.device(device).type != "cuda":
        yield reading
        return
    from .monitor import UtilizationMonitor
    monitor = UtilizationMonitor(0.05, device=device)
    with monitor:
        yield reading
    line = monitor.timeline
    if line.gpu_util is None or len(timer.log) <= timer.skip_first:
        return
    start = timer.log[timer.skip_first]["fetch_start"] - monitor._t0
    util = line.gpu_util[(line.t_s >= start) & ~np.isnan(line.gpu_util)]
    if len(util):
        reading.value = float(np.mean(util)) / 100.0


def rung(name: str, short: str):
    """Name a rung function: `name` for tables and JSON, `short` for the bar chart's axis."""
    def mark(fn):
        fn.rung_name, fn.rung_short = name, short
        return fn
    return mark


def _share(fraction) -> str:
    return "" if fraction is None else f"{fraction:.0%}"


def _float_transform():
    return data.baseline_transform()                      # crop, flip, ToTensor, Normalize on the CPU


def _uint8_transform():
    return T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.PILToTensor()])


# -- each rung's pipeline, made from the context's building blocks (lesson 08 composes its own) --

def baseline_pipeline(ctx: LadderContext) -> Pipeline:
    """num_workers=0: the main process decodes and augments every image (float32), between steps."""
    return Pipeline(ctx.loader(_float_transform(), 0), name="baseline")


def workers_pipeline(ctx: LadderContext) -> Pipeline:
    """One DataLoader worker per usable core (pinned memory on a GPU), float32 batches (lesson 02)."""
    return Pipeline(ctx.loader(_float_transform(), ctx.num_workers), name="best workers")


def prefetcher_pipeline(ctx: LadderContext) -> Pipeline:
    """Workers send uint8 (a quarter of the bytes), the next batch is got ready ahead and
    normalised on the device (lesson 03)."""
    return Pipeline(ctx.loader(_uint8_transform(), ctx.num_workers), batch_transform=normalize_batch,
                    prefetch=True, name="prefetcher")


def device_resident_pipeline(ctx: LadderContext) -> Pipeline:
    """The whole training set in device memory as uint8; crop, flip and normalise whole batches
    there (lesson 03)."""
    images, labels = ctx.on_device()
    return Pipeline(DeviceLoader(images, labels, ctx.batch_size), batch_transform=AugmentBatch(),
                    name="device-resident")


def dali_pipeline(ctx: LadderContext) -> Pipeline:
    """NVIDIA DALI reads the binary records and crops, flips and normalises whole batches in its
    own C++ threads: on the GPU when there is one, on the CPU otherwise (lesson 04)."""
    if not has_dali():
        raise RungSkipped("NVIDIA DALI cannot be imported here")
    from .dali_pipelines import cifar_loader
    loader = cifar_loader(ctx.records(), batch_size=ctx.batch_size, device=ctx.device if ctx.cuda else "cpu",
                          drop_last=True, num_threads=ctx.num_workers, seed=int(torch.randint(1 << 30, ())))
    return Pipeline(loader, name="DALI")


def mixed_precision_pipeline(ctx: LadderContext) -> Pipeline:
    """Device-resident data, and the model step itself made cheaper: bf16 autocast and
    channels_last (lesson 05). Beside the simulator, the measured H100 step in bf16 +
    channels_last (more host launch time, less GPU work: at batch 128 it does not pay). On a GPU
    that only emulates bfloat16 (compute capability below 8.0: a V100, a T4) it is skipped: fp16
    with a GradScaler is the mode there (lesson 05)."""
    if ctx.cuda:
        from .env import bf16_native
        if not bf16_native(ctx.device):
            raise RungSkipped("this GPU emulates bfloat16 (compute capability below 8.0): fp16 with a GradScaler "
                              "is its mixed precision (lesson 05)")
    pipeline = device_resident_pipeline(ctx)
    pipeline.amp, pipeline.channels_last, pipeline.name = "bf16", True, "device-resident + bf16"
    return pipeline


def cuda_graph_pipeline(ctx: LadderContext) -> Pipeline:
    """Device-resident data, bf16 + channels_last, and the whole step captured once as a CUDA graph
    and replayed: the host launches one graph instead of ~390 kernels per step (lesson 05). Needs a
    GPU; beside the simulator, the measured H100 graph step."""
    if not ctx.simulated and not ctx.cuda:
        raise RungSkipped("CUDA graphs need a GPU (with COURSE_DEVICE=cpu there is nothing to capture)")
    pipeline = mixed_precision_pipeline(ctx)
    pipeline.cuda_graph, pipeline.name = True, "device-resident + bf16 + CUDA graph"
    return pipeline


# -- the rungs: each measures its pipeline --------------------------------------------------------

@rung("baseline", "baseline\n0 workers")
def rung_baseline(ctx: LadderContext) -> TrainResult:
    """DataLoader with num_workers=0: the main process decodes and augments every image (float32)."""
    return ctx.run(baseline_pipeline(ctx), desc="baseline")


@rung("best workers", "best workers")
def rung_best_workers(ctx: LadderContext) -> TrainResult:
    """DataLoader with one worker per usable core (pinned memory on a GPU), float32 batches."""
    return ctx.run(workers_pipeline(ctx), desc="best workers")   # the table's name (w9-03)


@rung("prefetcher", "workers + uint8\n+ prefetcher")
def rung_prefetcher(ctx: LadderContext) -> TrainResult:
    """Workers send uint8 (a quarter of the bytes), the next batch is copied ahead (a side stream
    on a GPU, a background thread beside the simulator) and normalised on the device."""
    return ctx.run(prefetcher_pipeline(ctx), desc="prefetcher")


@rung("device-resident", "data on device\n+ batched aug")
def rung_device_resident(ctx: LadderContext) -> TrainResult:
    """The whole dataset in device memory as uint8; crop, flip and normalise whole batches there."""
    return ctx.run(device_resident_pipeline(ctx), desc="device-resident")


@rung("DALI", "DALI\n(records)")
def rung_dali(ctx: LadderContext) -> TrainResult:
    """NVIDIA DALI reads the binary records and crops, flips and normalises whole batches in its
    own C++ threads: on the GPU when there is one, on the CPU beside the simulator (lesson 04)."""
    return ctx.run(dali_pipeline(ctx), desc="DALI")


@rung("device-resident + bf16", "device-resident\n+ bf16")     # the table's name (w3-08: the bar read "chan. last")
def rung_mixed_precision(ctx: LadderContext) -> TrainResult:
    """Device-resident data, and the model step itself made cheaper: bf16 autocast and
    channels_last (lesson 05). Measured against the fp32 ceiling, so it may exceed 100%."""
    return ctx.run(mixed_precision_pipeline(ctx), desc="bf16")


@rung("device-resident + bf16 + CUDA graph", "+ CUDA graph\n(1 launch/step)")
def rung_cuda_graph(ctx: LadderContext) -> TrainResult:
    """Device-resident data, bf16 + channels_last, the whole step replayed as one CUDA graph: the
    host's launches leave the step (lesson 05). Against the fp32 ceiling, so it may exceed 100%."""
    return ctx.run(cuda_graph_pipeline(ctx), desc="CUDA graph")


# how these two rungs change the model's step (their rows' "step": the line on the rungs above the ceiling reads it)
rung_mixed_precision.rung_step = {"amp": "bf16", "channels_last": True}
rung_cuda_graph.rung_step = {"amp": "bf16", "channels_last": True, "graph": True}

# The ladder, bottom to top. Later lessons append their rungs.
RUNGS = [rung_baseline, rung_best_workers, rung_prefetcher, rung_device_resident, rung_dali, rung_mixed_precision,
         rung_cuda_graph]


def measure_ceiling(ctx: LadderContext) -> TrainResult:
    """The model alone: one batch already on the device, fed again and again (lesson 01), measured
    as every rung is (the same warm-up and number of counted steps)."""
    bs = ctx.config.batch_size
    images = torch.randn(bs, 3, 32, 32)
    labels = torch.randint(0, 10, (bs,))
    if not ctx.simulated:
        images, labels = images.to(ctx.device), labels.to(ctx.device)
    return ctx.train(itertools.repeat((images, labels)), desc="ceiling", batches_on_device=True)


@dataclass
class LadderResult:
    """One climb: the ceiling and every rung, measured in one run on one device."""
    device: str
    simulated: bool
    config: dict
    ceiling: dict
    rungs: list[dict]
    host: str = ""
    torch_version: str = torch.__version__
    date: str = ""
    arithmetic: str = ""          # the best rung's TFLOP/s against the device's peak, where known

    @classmethod
    def from_rows(cls, ctx: LadderContext, ceiling, rows: list[dict]) -> "LadderResult":
        """The result of a climb in `ctx`: `ceiling` (its `StepStats`) and the rows of
        `measure_rung`, each given its speed-up over the row named "baseline" (if there is one)."""
        base = next((r for r in rows if r["name"] == "baseline" and not r.get("skipped")), None)
        for row in rows:
            if not row.get("skipped"):
                row["speedup_over_baseline"] = round(row["samples_per_s"] / base["samples_per_s"], 3) if base else None
        config = ctx.config
        cfg = asdict(config)
        cfg.update(steps=config.resolved_steps(), num_workers=config.resolved_workers(),
                   model=None if ctx.simulated else (config.model or _model_name(ctx.model)),
                   step_ms=ctx.run_on.step_time_ms(config.batch_size) if ctx.simulated else None)
        measured = [r for r in rows if not r.get("skipped")]
        arithmetic = ""
        if measured:
            from .bottleneck import rate_against_peak
            best = max(measured, key=lambda r: r["samples_per_s"])
            precision = "bf16" if "bf16" in best["name"] else "fp32"
            arithmetic = f"{best['name']}: " + rate_against_peak(best["samples_per_s"], ctx.run_on,
                                                                  None if ctx.simulated else ctx.model, precision)
        return cls(ctx.label, ctx.simulated, cfg, ceiling.as_row(), rows, host=device_label(torch.device("cpu")),
                   date=datetime.datetime.now().isoformat(timespec="seconds"), arithmetic=arithmetic)

    @property
    def best(self) -> dict:
        return max((r for r in self.rungs if not r.get("skipped")), key=lambda r: r["samples_per_s"])

    def as_dict(self) -> dict:
        out = asdict(self)
        out["best"] = {"name": self.best["name"], "samples_per_s": self.best["samples_per_s"],
                       "fraction_of_ceiling": self.best["fraction_of_ceiling"]}
        return out

    def table(self, best_in: str = "") -> str:
        """The climb as a text table: samples/s, fraction of the ceiling, the device's busy share,
        the share with a step in flight, the loop's wait for data, speed-up, and what limits it.
        `best_in`: which measurement the "best" line is of ("round 1"), where the caller ran several."""
        c = self.config
        lines = [f"Ladder on {self.device}",
                 f"batch {c['batch_size']}, {c['steps']} steps per rung, {c['num_workers']} workers where used"
                 + (", SIMULATED device" if self.simulated else ""),
                 f"{'rung':36s} {'samples/s':>10s} {'of ceiling':>10s} {'dev. busy':>9s} {'in flight':>9s} "
                 f"{'waits':>6s} {'vs base':>7s}  limited by"]
        twice = self.ceiling.get("measurements_samples_per_s")
        if twice:
            lines.append("ceiling: the faster of two measurements, before and after the rungs ("
                         + " and ".join(f"{v:,.0f}" for v in twice) + " samples/s)")
        rows = [dict(self.ceiling, name="ceiling (model)", fraction_of_ceiling=1.0)] + list(self.rungs)
        for r in rows:
            if r.get("skipped"):
                lines.append(f"{r['name']:36s} {'skipped':>10s}  {r['skipped']}")
                continue
            speedup = f"{r['speedup_over_baseline']:.1f}x" if r.get("speedup_over_baseline") else ""
            lines.append(f"{r['name']:36s} {r['samples_per_s']:10,.0f} {r['fraction_of_ceiling']:10.0%} "
                         f"{_share(r.get('device_util')):>9s} {_share(_in_flight(r)):>9s} "
                         f"{r['stall_fraction']:6.0%} {speedup:>7s}  {limited_by(r)}")
        ties = [r["name"] for r in self.rungs if not r.get("skipped") and r["name"] != self.best["name"]
                and r["samples_per_s"] >= 0.95 * self.best["samples_per_s"]]
        best = f"best in {best_in}" if best_in else "best"
        lines.append(f"{best}: {self.best['name']} at {self.best['fraction_of_ceiling']:.0%} of the ceiling"
                     + (f" ({', '.join(ties)} within 5% of it: a tie one run of each cannot order)" if ties else ""))
        if self.arithmetic:
            lines.append(f"arithmetic, the best rung: {self.arithmetic}")
        lines.append("dev. busy: share of the wall time the device ran work (" +
                     ("the simulated device's own busy time" if self.simulated else "NVML's utilisation, where read")
                     + "); in flight: share with a step started and not finished (the device may idle inside it, "
                       "waiting for the host to launch kernels); waits: share the loop spent blocked on the next "
                       "batch; the last two overlap (the loop may wait for data while queued steps still run). "
                       "Limited by: course_utils.bottleneck.diagnose, except that a device busy "
                       f"{COMPUTE_UTIL:.0%} of the time or more is the limit whatever the waits (compute-bound).")
        if any(limited_by(r) == SHARED_LABEL for r in self.rungs if not r.get("skipped")):
            lines.append(f"{SHARED_LABEL}: the ceiling's own step, hardly a wait for data, yet under "
                         f"{1 / (1 + RATIO_NOISE):.0%} of the ceiling (beyond one measurement's noise): the host "
                         "launched the same kernels slower than when the ceiling was measured, its cores shared with "
                         "the rung's own loading work (workers, a prefetching thread) or with other programs")
        return "\n".join(lines)

    def plot(self, path=None):
        """Bar chart of every rung against the ceiling, stamped with the device; saved to `path`."""
        from .plotting import bar_chart
        kind = "simulated device" if self.simulated else "measured"
        measured = [r for r in self.rungs if not r.get("skipped")]
        fig = bar_chart([r["short"] for r in measured], [r["samples_per_s"] for r in measured],
                        ylabel="samples/s", title=f"The ladder: each rung against the model-only ceiling ({kind})",
                        device=self.device, ceiling=self.ceiling["samples_per_s"], ceiling_label="ceiling",
                        scale="log", fractions=[r["fraction_of_ceiling"] for r in measured])
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=120)
        return fig


def _in_flight(row: dict):
    return row.get("steps_in_flight_fraction", row.get("device_busy_fraction"))


def _model_name(model) -> str | None:
    """'resnet18', 'resnet18-wN' or 'tiny', as `models.build_model` names them."""
    from .models import ResNet18CIFAR, TinyCNN
    if isinstance(model, ResNet18CIFAR):
        width = model.stem[0].out_channels if hasattr(model, "stem") else None
        return "resnet18" if width in (None, 64) else f"resnet18-w{width}"
    if isinstance(model, TinyCNN):
        return "tiny"
    return type(model).__name__ if model is not None else None


@contextlib.contextmanager
def _intra_op_threads(n: int | None):
    """Beside the simulator, tensor ops on the host use one thread: the cores belong to the
    DataLoader workers and the background thread (more threads only fight over them)."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _select(rungs, names):
    if not names:
        return list(rungs)
    by_name = {r.rung_name: r for r in rungs}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown rung(s) {unknown}; the ladder has {list(by_name)}")
    return [r for r in rungs if r.rung_name in names]


@contextlib.contextmanager
def ladder_context(config: LadderConfig | None = None, *, sim=None, progress: bool = True,
                   training_set: TrainingSet | None = None, model: torch.nn.Module | None = None):
    """The context every rung runs in (`climb()` and lesson 08), as a `with` block.

    Where is `course_utils.target.pick_target(config.device)`: on a GPU, or on the CPU with
    COURSE_DEVICE=cpu, `model` (default: `config.resolved_model()`) trains for real; beside the
    simulator the device is `sim`, or a simulated accelerator with `config.step_ms` per step, or
    the course's default one (closed when the block ends). `training_set` replaces the course's
    CIFAR-10. Beside the simulator, torch uses one intra-op thread inside the block: the cores
    belong to the loaders and the host's launches.
    """
    config = config or LadderConfig()
    target = pick_target(config.device, sim=sim)
    own_sim = target.simulated and sim is None
    if own_sim and config.step_ms is not None:
        target.close()
        target = Target("sim", torch.device("cpu"), SimulatedAccelerator(config.step_ms))
    ctx = LadderContext.for_target(target, config, model=model, training_set=training_set, progress=progress)
    try:
        with _intra_op_threads(1 if ctx.simulated else None):
            yield ctx
    finally:
        if own_sim:
            target.close()


def measure_rung(ctx: LadderContext, fn, ceiling, *, name: str | None = None, short: str | None = None) -> dict:
    """One row of the ladder's table: `fn(ctx)` is a rung (returns a `TrainResult`) or makes a
    `Pipeline`, which is then measured with `ctx.run`; `ceiling` is the `StepStats` of
    `measure_ceiling(ctx)` from the same run. A rung that raises `RungSkipped` gives a row that
    says why."""
    name = name or getattr(fn, "rung_name", None) or getattr(fn, "__name__", "pipeline")
    short = short or getattr(fn, "rung_short", None) or name
    description = " ".join((fn.__doc__ or "").split())
    try:
        out = fn(ctx)
        step = dict(getattr(fn, "rung_step", {}))      # how a rung that measures itself changes the step
        if isinstance(out, Pipeline):
            description = description or out.describe()
            step = step_of(out)
            out = ctx.run(out, desc=name)
    except RungSkipped as why:
        return {"name": name, "short": short, "description": description, "skipped": str(why)}
    return rung_row(name, out.stats, ceiling, short=short, description=description, step=step)


def step_of(pipeline: Pipeline) -> dict:
    """How `pipeline` changes the model's step from the ceiling's (fp32, eager): {} when it does not."""
    return {k: v for k, v in (("amp", pipeline.amp), ("channels_last", pipeline.channels_last),
                              ("graph", pipeline.cuda_graph)) if v}


def limited_by(row) -> str:
    """What limits a rung, for the ladder's table and the report card: `bottleneck.diagnose`, except that a device
    busy COMPUTE_UTIL of the time or more is the limit whatever the loop's waits for data (w2-08: "input-bound" for
    the CUDA-graph rung with the device busy 93%: its loop waited for data while queued steps kept the device
    working; waits and steps in flight overlap)."""
    util = row.get("device_util") if isinstance(row, dict) else getattr(row, "device_util", None)
    if util is not None and util >= COMPUTE_UTIL:
        return "compute-bound"
    kind = diagnose(row).kind
    if kind == "launch-bound" and host_shared(row):
        return SHARED_LABEL
    return kind


SHARED_LABEL = "launch-bound, host shared"


def host_shared(row) -> bool:
    """Walk w9-08: the prefetcher "launch-bound" at 28-31% of a ceiling that is launch-bound itself. A rung that runs
    the ceiling's own step (fp32, eager), did not wait for data, and yet ran under 1 / (1 + RATIO_NOISE) of the
    ceiling, beyond what one measurement of each moves, launched the same kernels slower than the ceiling did: the
    host's CPU was shared, with the rung's own loading work (workers, a prefetching thread) or other programs."""
    if not isinstance(row, dict) or row.get("step") or row.get("fraction_of_ceiling") is None:
        return False
    return row["fraction_of_ceiling"] < 1 / (1 + RATIO_NOISE)


def above_ceiling_words(rows, ceiling: dict, sim=None, batch_size: int = 128) -> str:
    """One sentence on the rungs above the fp32 ceiling, from the numbers: a rung that runs the ceiling's own step
    (fp32, eager) cannot beat it, so one that measured above it says the ceiling's single measurement was slow; a
    rung that changes the step (bf16, a CUDA graph) can, and beside the simulator the measured H100 figures say by
    how much for the step alone (w2-08: DALI at 174% and a CUDA graph at 950% of the ceiling, against the 3x the
    H100's figures give). `sim`: the simulated accelerator, or None on a real device."""
    above = [r for r in rows if not r.get("skipped") and (r.get("fraction_of_ceiling") or 0) > 1.0]
    if not above:
        return "rungs above the fp32 ceiling here: none"
    modelled = sim is not None and getattr(sim, "profile", None) is not None
    eager_ms = sim.ceiling_step_ms(batch_size) if modelled else None
    ceiling_ms = 1e3 * batch_size / ceiling["samples_per_s"]
    parts, wider = [], False
    changed = [r for r in above if r.get("step")]
    same = [r for r in above if not r.get("step")]
    if changed:
        said, slower = [], []
        for r in changed:
            text = f"{r['name']} ({r['fraction_of_ceiling']:.0%})"
            if modelled:
                step = r["step"]
                alone = eager_ms / sim.ceiling_step_ms(batch_size, amp=step.get("amp"),
                                                       channels_last=bool(step.get("channels_last")),
                                                       graph=bool(step.get("graph")))
                text += f", where the H100's figures give its step alone {alone:.0%} of the ceiling's speed"
                wider = wider or r["fraction_of_ceiling"] > 1.25 * alone
                if alone <= 1.0:
                    # walk w10-08: bf16 at 153% listed among "the rungs that change the step itself", its step alone
                    # 81% of the ceiling's speed: a step no faster than the ceiling's is above it for the ceiling's slow
                    # measurement, not for its step
                    slower.append(text)
                    continue
            said.append(text)
        if said:
            parts.append("above the fp32 ceiling, as rungs that change the step itself can: " + "; ".join(said))
        if slower:
            parts.append("above it with a step no faster than the ceiling's by the H100's figures, so not for their "
                         "step: " + "; ".join(slower) + ": the ceiling's own measurement was slow")
    # walk w7-08: "DALI (288%) ... so the ceiling's measurement was slow" beside device-resident, the same step, at 89%:
    # where another rung ran that step under the ceiling, the ceiling was not simply slow; the sentence says what the
    # step times show (the fastest rung bounds the step's own cost; the others were late by more than that)
    # the other rungs of that step whose pace the step set, not their input (an input-bound rung says nothing of it)
    top = max(same, key=lambda r: r.get("samples_per_s") or 0) if same else None
    under = [r for r in rows if not r.get("skipped") and not r.get("step") and r.get("samples_per_s")
             and r is not top and limited_by(r) != "input-bound"]
    if same and under and top.get("samples_per_s"):
        step_ms = lambda r: 1e3 * batch_size / r["samples_per_s"]  # noqa: E731
        near = max(under, key=lambda r: r["samples_per_s"])
        charged = f" (the simulated device charges {eager_ms:.1f} ms)" if modelled else ""
        parts.append("above it although they run its own fp32 eager step: "
                     + ", ".join(f"{r['name']} ({r['fraction_of_ceiling']:.0%}, {step_ms(r):.1f} ms a step)" for r in same)
                     + f"; no rung beats the step it runs, so that step costs at most {step_ms(top):.1f} ms here"
                     + charged + f", and the ceiling's {ceiling_ms:.1f} ms a step were mostly "
                     + ("the host launching it late" if modelled else
                        "something other than the step (a busy host launching it late, or the device's drift)")
                     + f". Yet {near['name']} ran the same step at {near['fraction_of_ceiling']:.0%} of the ceiling "
                     f"({step_ms(near):.1f} ms a step): the ceiling was not one slow measurement, the host was late for "
                     f"it and {near['name']} alike and less so for {top['name']}, each measured once at another "
                     f"moment. This run cannot say how much of {top['name']}'s lead is its own and how much the load's: "
                     f"not a speed-up to read from one measurement (run the cell again to see it move)")
    elif same:
        charged = f", where the simulated device charges {eager_ms:.1f} ms" if modelled else ""
        parts.append("above it although they run its own fp32 eager step: "
                     + ", ".join(f"{r['name']} ({r['fraction_of_ceiling']:.0%})" for r in same)
                     + f"; no rung beats the step it runs, so the ceiling's measurement was slow (its steps took "
                       f"{ceiling_ms:.1f} ms on average, the batch over its samples/s{charged}: a busy host launches the kernels late)")
    elif wider:
        parts.append(f"the ceiling's steps took {ceiling_ms:.1f} ms on average (the batch over its samples/s; the "
                     f"median step printed with the ceiling is another figure) against the {eager_ms:.1f} ms the "
                     "simulated device "
                     "charges: a busy host launched its kernels late, which a CUDA graph's one launch hardly feels, "
                     "so the measured gap is wider than the steps' own")
    return "; ".join(parts)


# the least spread of one measurement on a machine others share: the H100 the course measured moved the ladder's rungs
# by up to 23 points between two runs (README, "GPU: one NVIDIA H100"), and walk w2-08's smoke runs moved the same code
# by 11-35% within one run. The ratio of two such measurements moves by up to (1 + floor)^2 - 1, 44%.
SAME_RUN_FLOOR = 0.20
RATIO_NOISE = (1 + SAME_RUN_FLOOR) ** 2 - 1


def _within(ratio: float, reference: float, noise: float = RATIO_NOISE) -> bool:
    return reference / (1 + noise) <= ratio <= reference * (1 + noise)


def precision_words(rows, ceiling: dict | None = None, sim=None, batch_size: int = 128) -> str:
    """One sentence on bf16 against fp32 in this climb, from its numbers: the bf16 rung over the device-resident one
    (the same pipeline in fp32), against the noise of a ratio of two single measurements (RATIO_NOISE) and, beside
    the simulator, against what the H100's figures charge each step. Walk w3-08: the lesson said the simulator charges
    bf16 the H100's slower step under a table with bf16 3% faster (one run) and 17% slower (the next)."""
    measured = {r["name"]: r for r in rows if not r.get("skipped") and r.get("samples_per_s")}
    bf16, fp32 = measured.get("device-resident + bf16"), measured.get("device-resident")
    if not bf16 or not fp32:
        return "bf16 against fp32: not both measured here"
    ratio = bf16["samples_per_s"] / fp32["samples_per_s"]
    said = (f"bf16 against fp32 here: {bf16['samples_per_s']:,.0f} against {fp32['samples_per_s']:,.0f} samples/s "
            f"({ratio:.0%}), one measurement each; two single measurements on a busy machine can differ by "
            f"{RATIO_NOISE:.0%} (up to {SAME_RUN_FLOOR:.0%} each)")
    tie = _within(ratio, 1.0)
    modelled = sim is not None and getattr(sim, "profile", None) is not None
    said += _edge_words(ratio, [1.0] + ([sim.ceiling_step_ms(batch_size)
                                         / sim.ceiling_step_ms(batch_size, amp="bf16", channels_last=True)]
                                        if modelled else []))
    if not modelled:
        if tie:
            return said + ": the same within that noise; this run cannot order them"
        return said + (": bf16 slower beyond it" if ratio < 1 else ": bf16 faster beyond it")
    charged = sim.ceiling_step_ms(batch_size) / sim.ceiling_step_ms(batch_size, amp="bf16", channels_last=True)
    said += (f"; the simulated device charges the H100's figures, which give bf16's step alone {charged:.0%} of "
             "fp32's speed (autocast adds launches for the host)")
    if tie and _within(ratio, charged):
        return said + ": both that and a tie lie within the noise, so this run cannot tell them apart"
    if _within(ratio, charged):
        return said + ": slower, as that charge"
    if tie:
        slow = ""
        if ceiling and ceiling.get("samples_per_s"):
            took, charge = 1e3 * batch_size / ceiling["samples_per_s"], sim.ceiling_step_ms(batch_size)
            if took > (1 + SAME_RUN_FLOOR) * charge:
                slow = (f" (the ceiling's steps took {took:.1f} ms on average against the {charge:.1f} ms charged: a busy host set "
                        "the pace)")
        return said + ": the same within the noise, not as far apart as that charge" + slow
    return said + (": slower than even that charge, beyond the noise" if ratio < charged
                   else ": faster, beyond the noise, than both that charge and a tie")


def _edge_words(ratio: float, references: list[float], noise: float = RATIO_NOISE, share: float = 0.05) -> str:
    """Words for a ratio within `share` of the noise's edge around any of `references` (in log terms): walk w4-08,
    bf16 at 69% of fp32 against a bar at 69.4% called "slower" in one run and a tie in the next."""
    width = math.log1p(noise)
    for ref in references:
        for edge in (ref / (1 + noise), ref * (1 + noise)):
            if abs(math.log(ratio / edge)) < share * width:
                return (f"; {ratio:.0%} lies at the edge of that noise ({edge:.0%}), so the verdict that follows "
                        "could go the other way in the next run")
    return ""


def noise_bars_words(card_noise: float, rows, final: str | None = None) -> str:
    """Why the report card's noise and the climb's differ, and the bf16 line judged again by the wider (walk w4-08: the
    climb called bf16 slower than fp32 against 44%, the card, from the same numbers, the same within 88%). The climb's
    lines judge two single measurements against RATIO_NOISE; the card widens its own to twice the widest spread of the
    pipelines measured more than once in the run (at least SAME_RUN_FLOOR)."""
    bar = max(card_noise, RATIO_NOISE)
    # walk w10-08: "two noise bars" (44% and 113%) under a third, the line on yours against the device-resident
    # pipeline, which reads the widest spread of the repeated runs itself (56%; the card's is twice it)
    said = (f"three noise bars in this notebook: the climb's lines order two single measurements only beyond "
            f"{RATIO_NOISE:.0%} (up to {SAME_RUN_FLOOR:.0%} each), set before anything was measured twice; the line on "
            f"yours against the device-resident pipeline reads the widest spread of those pipelines' own repeated "
            f"runs (at least {SAME_RUN_FLOOR:.0%}), comparing medians; the card uses {card_noise:.0%}, "
            + ("twice that spread (at least the same floor), for a single measurement against another. "
               if card_noise >= SAME_RUN_FLOOR else "no pipeline having been measured twice. "))
    if card_noise > RATIO_NOISE:
        said += (f"The repeats spread more than the climb assumed, so read both by the card's {bar:.0%}")
    else:
        said += (f"The card's is the narrower because it compares medians of repeated measurements; a rung measured "
                 f"once still needs {bar:.0%} to be ordered")
    measured = {r["name"]: r for r in rows if not r.get("skipped") and r.get("samples_per_s")}
    bf16, fp32 = measured.get("device-resident + bf16"), measured.get("device-resident")
    if bf16 and fp32:
        ratio = bf16["samples_per_s"] / fp32["samples_per_s"]
        verdict = ("not ordered by this run" if _within(ratio, 1.0, bar)
                   else "slower beyond it" if ratio < 1 else "faster beyond it")
        said += f": bf16 against fp32 ({ratio:.0%}) is {verdict}" + _edge_words(ratio, [1.0], bar)
    mine = measured.get(final) if final else None
    if mine and card_noise < RATIO_NOISE:
        # the card sorted these against yours by its narrower bar, each from one measurement (walk w4-08: bf16 at 76%
        # "slower in the same run" under the card in one run, "the same" in the next)
        ratios = {r["name"]: r["samples_per_s"] / mine["samples_per_s"] for r in measured.values()
                  if r is not mine and r["name"] != "device-resident"}       # device-resident: measured three times
        unsure = [f"{name} ({ratio:.0%} of yours)" for name, ratio in ratios.items()
                  if _within(ratio, 1.0) and not _within(ratio, 1.0, card_noise)]
        if unsure:
            said += ("; the card's faster or slower for " + ", ".join(unsure) + " is within the climb's "
                     f"{RATIO_NOISE:.0%}, so not an ordering one measurement of each can make")
    return said


def one_run_words(rows) -> str:
    """What the climb's table rests on (walk w3-08: "best workers" 1.3x the baseline in one run, 0.9x in the next;
    DALI "launch-bound", then "input-bound"): one measurement per rung, and the rungs this run cannot tell from the
    baseline."""
    near = [r for r in rows if not r.get("skipped") and r["name"] != "baseline" and r.get("speedup_over_baseline")
            and _within(r["speedup_over_baseline"], 1.0)]
    said = (f"one measurement each: on a machine others share, one measurement moves by {SAME_RUN_FLOOR:.0%} or more, "
            f"so two rungs within {RATIO_NOISE:.0%} of each other are not ordered by this run")
    if near:
        said += (": " + ", ".join(f"{r['name']} ({r['speedup_over_baseline']:.1f}x the baseline)" for r in near)
                 + " cannot be told from the baseline here")
    return (said + "; a rung's 'limited by' is that measurement's too (its waits move with the load); run this cell "
            "again to see how far the rungs move on this machine")


def data_on_device_words(rows) -> str:
    """What limited each rung that keeps the data on the device, as measured here (walk w7-08: the summary said the
    data on the device "removes the CPU from the loop" while the CUDA-graph rung, data on the device and one launch a
    step, was input-bound with the loop waiting 37%). With the step's launches gone, the augmentation's, which the
    host still makes for every batch, are what the loop waits for."""
    rungs = [r for r in rows if not r.get("skipped") and r.get("samples_per_s")
             and r["name"].startswith("device-resident")]           # DALI reads records: not the data on the device
    if not rungs:
        return ""
    said = ", ".join(f"{r['name']} {limited_by(r)} (waits {r.get('stall_fraction', 0):.0%})" for r in rungs)
    waited = [r for r in rungs if limited_by(r) == "input-bound"]
    tail = ("; the data on the device takes the per-image work off the CPU, not the host's launches: "
            + ", ".join(r["name"] for r in waited) + " still waited for the next batch (the host launching the "
            "augmentation's kernels)"
            + ("; a CUDA graph removes the step's launches, not the augmentation's"
               if any((r.get("step") or {}).get("graph") for r in waited) else "")
            if waited else "; none of them was input-bound" + _pace_words(rungs))
    return "with the data on the device here: " + said + tail


def _pace_words(rungs) -> str:
    """What set the pace of each rung that was not input-bound, from its own label (walk w10-08: "none of them
    waited for data: the host's launches of the step set their pace" beside a CUDA-graph rung compute-bound, device
    98% busy, that waited 21%)."""
    launch = [r["name"] for r in rungs if limited_by(r).startswith("launch-bound")]
    compute = [r["name"] for r in rungs if limited_by(r) == "compute-bound"]
    parts = []
    if launch:
        parts.append("the host's launches set the pace of " + ", ".join(launch))
    if compute:
        parts.append("the device's own work set the pace of " + ", ".join(compute)
                     + " (the device kept busy, whatever the loop waited)")
    return (": " + "; ".join(parts)) if parts else ""



def slow_ceiling_words(row: dict, rows) -> str:
    """Where another rung of `rows` ran the ceiling's own step (fp32, eager) above the ceiling, the ceiling's single
    measurement was slow, and `row`'s share of it is too high: the words that say so, with the share against that
    rung's speed, the least the ceiling can be (walk w6-08: "yours runs at 50% of the model-only ceiling" where the
    climb had said the ceiling measured slow, DALI at 114% of it). "" where no such rung."""
    same = [r for r in rows or () if r is not row and r.get("name") != row.get("name") and not r.get("skipped")
            and not r.get("step") and (r.get("fraction_of_ceiling") or 0) > 1.0 and r.get("samples_per_s")]
    if not same or not row.get("samples_per_s"):
        return ""
    top = max(same, key=lambda r: r["samples_per_s"])
    return (f" (a ceiling the climb measured slow: {top['name']} ran its fp32 eager step at "
            f"{top['fraction_of_ceiling']:.0%} of it, so the ceiling is at least {top['samples_per_s']:,.0f} "
            f"samples/s, and this share at most {row['samples_per_s'] / top['samples_per_s']:.0%})")


def against_resident_words(name: str, mine, resident, bar: float = 0.85) -> str:
    """Yours against the course's device-resident pipeline measured in the same minutes (in turns), from the runs'
    medians: what the check of 8.1 grades, in paired rounds of its own (walk w6-08: the check's "109% of the
    ceiling" against the card's "50%", a ceiling measured apart; and a markdown sentence whose two branches the
    run did not choose between). `bar`: the check's share of the device-resident pipeline asked."""
    mine, resident = [v for v in mine if v], [v for v in resident if v]
    if not mine or not resident:
        return ""
    if not name.startswith("yours"):
        return (f"{name}: the course's pipeline stands in for yours (8.1 not done), so there is no ratio to read "
                "here")
    ratio = statistics.median(mine) / statistics.median(resident)
    spreads = [max(v) / min(v) - 1 for v in (mine, resident) if len(v) > 1]
    spread = max(spreads) if spreads else 0.0
    told = (f"{ratio:.0%} (medians of {len(mine)} and {len(resident)} runs; one pipeline's runs spread by up to "
            f"{spread:.0%} here)" if spreads else f"{ratio:.0%} (one run each)")
    head = f"{name} against the course's device-resident pipeline in the same minutes: {told}"
    noise = max(spread, SAME_RUN_FLOOR)
    if 1 / (1 + noise) <= ratio <= 1 + noise:
        # walk w7-08: "137%" for the device-resident pipeline with drop_last=False read as a speed-up: above 100% and
        # within the runs' own spread, the verdict comes first and the ratio is said to be noise. Walk w10-08: the
        # same answer got that verdict at 105% and a bare "99%" in the next run: within the noise on either side of
        # 100%, the same verdict
        what = "not a speed-up" if ratio > 1.0 else "not a slowdown" if ratio < 1.0 else "level"
        told = (f"{name} against the course's device-resident pipeline in the same minutes: not told apart, the same "
                f"within this run's noise (one pipeline's runs spread by up to {spread:.0%} here, so a ratio between "
                f"{1 / (1 + noise):.0%} and {1 + noise:.0%} is what two equal pipelines can give; the medians of "
                f"{len(mine)} and {len(resident)} runs gave {ratio:.0%}, {what})")
        if ratio < bar:
            return (told + f": whether yours reaches the {bar:.0%} the check of 8.1 asks is for the check's paired "
                    "rounds to say, which tell more than these runs")
        return (told + ": yours keeps up with the same parts measured beside it, so the gap to the ceiling is not "
                f"your pipeline's; the check of 8.1 graded this ratio ({bar:.0%} asked), in paired rounds of its own")
    if ratio >= bar or ratio * (1 + spread) >= 1.0:
        return (head + ": yours keeps up with the same parts measured beside it, so the gap to the ceiling is not "
                f"your pipeline's; the check of 8.1 graded this ratio ({bar:.0%} asked), in paired rounds of its own")
    return (head + f": below the {bar:.0%} the check of 8.1 asks, and beyond that spread: the gap is your "
            "pipeline's (what it adds to the device-resident parts: a wait, a copy, work on the host)")


def ceiling_share_words(row: dict, ceiling: str = "the ceiling", rows=None) -> str:
    """A row's share of the ceiling as printed with it (walk w3-08: "yours: 133% of the ceiling" for an fp32 eager
    pipeline, a caveat only under the climb's table): above 100%, why. `rows`: the climb's, where another rung may
    have shown the ceiling measured slow (`slow_ceiling_words`)."""
    share = row["fraction_of_ceiling"]
    said = f"{share:.0%} of {ceiling}"
    if share <= 1.0:
        return said + slow_ceiling_words(row, rows)
    if row.get("step"):
        return said + " (above the fp32 ceiling: its pipeline changes the step itself)"
    return said + (" (above 100% with the ceiling's own step, fp32 and eager, which no pipeline beats: the "
                   "ceiling's measurement was slow here (a busy host, or a device's drift); read it as the ceiling, "
                   "within the noise)")


def rung_row(name: str, stats, ceiling, *, short: str | None = None, description: str = "",
             step: dict | None = None) -> dict:
    """A row of the ladder's table from a run's `StepStats` and the ceiling's, measured in the same run; `step`:
    how its pipeline changes the model's step (`step_of`), {} for the ceiling's own (fp32, eager)."""
    row = {"name": name, "short": short or name, "description": description, "step": dict(step or {}),
           **stats.as_row()}
    row["fraction_of_ceiling"] = round(stats.samples_per_s / ceiling.samples_per_s, 4)
    return row


def climb(config: LadderConfig | None = None, rungs=None, *, progress: bool = True, sim=None) -> LadderResult:
    """Measure the ceiling, then every rung, then the ceiling again (the faster of the two is the ceiling), in one
    run; return the `LadderResult`.

    Where is `course_utils.target.pick_target(config.device)`: on a GPU, or on the CPU with
    COURSE_DEVICE=cpu, the model `config.resolved_model()` trains for real; beside the simulator
    the device is `sim`, or a simulated accelerator with `config.step_ms` per step, or the
    course's default one.
    """
    config = config or LadderConfig()
    rungs = _select(rungs if rungs is not None else RUNGS, config.rungs)
    with ladder_context(config, sim=sim, progress=progress) as ctx:
        ctx.warm_up()
        first = measure_ceiling(ctx).stats
        rows = [measure_rung(ctx, fn, first) for fn in rungs]
        # measured again after the rungs, the faster kept: on an H200 (2026-11-27) the first measurement ran its
        # launch-bound step slow enough that three fp32 eager rungs measured 101-131% "of the ceiling"
        last = measure_ceiling(ctx).stats
    ceiling = max((first, last), key=lambda stats: stats.samples_per_s)
    for row in rows:
        if not row.get("skipped"):
            row["fraction_of_ceiling"] = round(row["samples_per_s"] / ceiling.samples_per_s, 4)
    result = LadderResult.from_rows(ctx, ceiling, rows)
    result.ceiling["measurements_samples_per_s"] = [round(first.samples_per_s, 1), round(last.samples_per_s, 1)]
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.ladder",
                                     description="Climb the input-pipeline ladder on this machine and print each "
                                                 "rung's samples/s and fraction of the model-only ceiling.")
    parser.add_argument("--smoke", action="store_true", help="quick: 30 steps per rung")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", metavar="FILE", nargs="?", const="build/ladder.png",
                        help="save a bar chart (default file: build/ladder.png)")
    parser.add_argument("--step-ms", type=float, help="no GPU: the simulated device's time per step, in ms "
                        "(default: the simulated H100, scaled to this CPU; a fixed --step-ms has no launch cost)")
    parser.add_argument("--steps", type=int, help="training steps per rung (default 200, or 30 with --smoke)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--num-workers", type=int, help="DataLoader workers (default: the usable cores)")
    parser.add_argument("--model", help="real devices only: resnet18 (default on a GPU), resnet18-wN (width N; "
                        f"resnet18-w{CPU_MODEL_WIDTH} is the default with COURSE_DEVICE=cpu) or tiny")
    parser.add_argument("--limit", type=int, help="use only the first LIMIT training records")
    parser.add_argument("--device", help="cuda, cuda:1, cpu (the real model on the CPU) or sim (default: env "
                        "COURSE_DEVICE, else a GPU if there is one, else the simulated device)")
    parser.add_argument("--rungs", help="comma-separated rung names to climb (default: all)")
    args = parser.parse_args(argv)
    config = LadderConfig(smoke=args.smoke, steps=args.steps, batch_size=args.batch_size, num_workers=args.num_workers,
                          step_ms=args.step_ms, model=args.model, limit=args.limit, device=args.device,
                          rungs=[r.strip() for r in args.rungs.split(",")] if args.rungs else None)
    if args.step_ms is not None and torch.cuda.is_available() and (args.device or "cuda").startswith("cuda"):
        print("note: --step-ms only applies to the simulated device; this run uses the GPU", file=sys.stderr)
    result = climb(config, progress=sys.stderr.isatty())
    print(result.table())
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result.as_dict(), indent=2) + "\n")
        print(f"results written to {args.json}")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        result.plot(args.plot)
        print(f"bar chart written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
