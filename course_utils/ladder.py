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
is the course's simulated accelerator (`course_utils.sim`; `--step-ms` sets its step time) and
the table says "simulated". Work a rung does *on the device* (normalising, augmenting) then runs
as tensor operations on the host and is charged to the simulated device's time at the speed
factor its label states (`SimulatedAccelerator.run`), as a GPU stream would run those kernels
before the step: it is done and paid for, never skipped or overlapped for free.

The rungs are small named functions in `RUNGS`, in order. A later lesson adds its rung by
writing one more function with `@rung(...)` and appending it to `RUNGS`. A rung that cannot
run here (DALI missing; mixed precision beside the simulator, whose step time is fixed) raises
`RungSkipped` with the reason, and the table says so instead of inventing a number.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import itertools
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader

from . import data
from .device_data import AugmentBatch, DeviceLoader, cifar10_on_device, normalize_batch
from .env import device_label, has_dali, usable_cores
from .loaders import in_flight_batches
from .prefetch import BackgroundLoader, CudaPrefetcher
from .sim import SimulatedAccelerator
from .target import CPU_MODEL_WIDTH, Target, pick_target
from .timing import StepTimer
from .train import TrainResult, train

__all__ = ["LadderConfig", "LadderContext", "LadderResult", "RungSkipped", "rung", "RUNGS", "measure_ceiling",
           "climb", "rung_baseline", "rung_best_workers", "rung_prefetcher", "rung_device_resident", "rung_dali",
           "rung_mixed_precision", "main"]


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


@dataclass
class LadderContext:
    """Everything a rung needs: where to train, on what model, with which dataset."""
    config: LadderConfig
    device: torch.device                     # where tensors live: cuda, or cpu beside the simulator
    run_on: object                           # what train() gets: the CUDA device or the simulator
    model: torch.nn.Module | None
    progress: bool = True
    _raw: data.CIFAR10Binary | None = field(default=None, repr=False)

    @property
    def simulated(self) -> bool:
        return isinstance(self.run_on, SimulatedAccelerator)

    @property
    def label(self) -> str:
        return device_label(self.run_on)

    @property
    def cuda(self) -> bool:
        return not self.simulated and self.device.type == "cuda"

    def dataset(self, transform) -> data.CIFAR10Binary:
        """The CIFAR-10 training set with `transform` (the arrays are read once and shared)."""
        if self._raw is None:
            self._raw = data.CIFAR10Binary(train=True, limit=self.config.limit)
        ds = copy.copy(self._raw)
        ds.transform = transform
        return ds

    def loader(self, transform, num_workers: int) -> DataLoader:
        """A shuffling DataLoader; pinned memory and prefetch_factor 4 when it helps."""
        extra = {"prefetch_factor": 4, "persistent_workers": False} if num_workers else {}
        return DataLoader(self.dataset(transform), batch_size=self.config.batch_size, shuffle=True,
                          num_workers=num_workers, pin_memory=self.cuda, drop_last=True, **extra)

    def train(self, batches, *, batch_transform=None, prefetch: bool = False, desc: str = "rung",
              **train_kwargs) -> TrainResult:
        """Train on `batches` for the configured steps through `course_utils.train.train`.

        `batch_transform(images, labels)` is work for the device (beside the simulator: charged
        to it). `prefetch=True` gets the next batch ready ahead: copied on a CUDA side stream on
        a GPU; beside the simulator, where there is no copy to make, taken from the loader by a
        background thread. Other keyword arguments (`amp`, `channels_last`) go to `train()` on a
        real device.
        """
        if prefetch:
            batches = BackgroundLoader(batches) if self.simulated else CudaPrefetcher(batches, self.device)
        # untimed warm-up: one step, plus the batches the loader prepared ahead while it started
        # (served without waiting, they would flatter the rung), as measure_loader does
        warmup = 1 + in_flight_batches(batches)
        timer = StepTimer(self.run_on, skip_first=warmup)
        steps = self.config.resolved_steps() + warmup - 1
        if self.simulated:
            return train(None, batches, device=self.run_on, steps=steps, batch_transform=batch_transform,
                         timer=timer, progress=self.progress, desc=desc)
        return train(self.model, batches, device=self.device, steps=steps, batch_transform=batch_transform,
                     timer=timer, progress=self.progress, desc=desc, **train_kwargs)


def rung(name: str, short: str):
    """Name a rung function: `name` for tables and JSON, `short` for the bar chart's axis."""
    def mark(fn):
        fn.rung_name, fn.rung_short = name, short
        return fn
    return mark


def _float_transform():
    return data.baseline_transform()                      # crop, flip, ToTensor, Normalize on the CPU


def _uint8_transform():
    return T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.PILToTensor()])


@rung("baseline", "baseline\n0 workers")
def rung_baseline(ctx: LadderContext) -> TrainResult:
    """DataLoader with num_workers=0: the main process decodes and augments every image (float32)."""
    return ctx.train(ctx.loader(_float_transform(), 0), desc="baseline")


@rung("best workers", "workers")
def rung_best_workers(ctx: LadderContext) -> TrainResult:
    """DataLoader with one worker per usable core (pinned memory on a GPU), float32 batches."""
    return ctx.train(ctx.loader(_float_transform(), ctx.config.resolved_workers()), desc="workers")


@rung("prefetcher", "workers + uint8\n+ prefetcher")
def rung_prefetcher(ctx: LadderContext) -> TrainResult:
    """Workers send uint8 (a quarter of the bytes), the next batch is copied ahead (a side stream
    on a GPU, a background thread beside the simulator) and normalised on the device."""
    loader = ctx.loader(_uint8_transform(), ctx.config.resolved_workers())
    return ctx.train(loader, batch_transform=normalize_batch, prefetch=True, desc="prefetcher")


@rung("device-resident", "data on device\n+ batched aug")
def rung_device_resident(ctx: LadderContext) -> TrainResult:
    """The whole dataset in device memory as uint8; crop, flip and normalise whole batches there."""
    images, labels = cifar10_on_device(ctx.device, limit=ctx.config.limit)
    batches = DeviceLoader(images, labels, ctx.config.batch_size)
    return ctx.train(batches, batch_transform=AugmentBatch(), desc="device-resident")


@rung("DALI", "DALI\n(records)")
def rung_dali(ctx: LadderContext) -> TrainResult:
    """NVIDIA DALI reads the binary records and crops, flips and normalises whole batches in its
    own C++ threads: on the GPU when there is one, on the CPU beside the simulator (lesson 04)."""
    if not has_dali():
        raise RungSkipped("NVIDIA DALI cannot be imported here")
    from .dali_pipelines import cifar_loader
    loader = cifar_loader(batch_size=ctx.config.batch_size, device=ctx.device if ctx.cuda else "cpu",
                          limit=ctx.config.limit, drop_last=True, num_threads=ctx.config.resolved_workers())
    return ctx.train(loader, desc="DALI")


@rung("device-resident + bf16", "data on device\n+ bf16, chan. last")
def rung_mixed_precision(ctx: LadderContext) -> TrainResult:
    """Device-resident data, and the model step itself made cheaper: bf16 autocast and
    channels_last (lesson 05). Measured against the fp32 ceiling, so it may exceed 100%."""
    if ctx.simulated:
        raise RungSkipped("mixed precision changes the model's own step; the simulated device's step "
                          "time is fixed, so there is nothing honest to measure without a GPU")
    images, labels = cifar10_on_device(ctx.device, limit=ctx.config.limit)
    batches = DeviceLoader(images, labels, ctx.config.batch_size)
    model = copy.deepcopy(ctx.model)
    try:
        return train(model, batches, device=ctx.device, steps=ctx.config.resolved_steps(),
                     batch_transform=AugmentBatch(), amp="bf16", channels_last=True,
                     progress=ctx.progress, desc="bf16")
    finally:
        del model


# The ladder, bottom to top. Later lessons append their rungs.
RUNGS = [rung_baseline, rung_best_workers, rung_prefetcher, rung_device_resident, rung_dali, rung_mixed_precision]


def measure_ceiling(ctx: LadderContext) -> TrainResult:
    """The model alone: one batch already on the device, fed again and again (lesson 01)."""
    bs = ctx.config.batch_size
    images = torch.randn(bs, 3, 32, 32)
    labels = torch.randint(0, 10, (bs,))
    if ctx.simulated:
        return train(None, itertools.repeat((images, labels)), device=ctx.run_on,
                     steps=ctx.config.resolved_steps(), progress=ctx.progress, desc="ceiling")
    images, labels = images.to(ctx.device), labels.to(ctx.device)
    return ctx.train(itertools.repeat((images, labels)), desc="ceiling")


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

    @property
    def best(self) -> dict:
        return max((r for r in self.rungs if not r.get("skipped")), key=lambda r: r["samples_per_s"])

    def as_dict(self) -> dict:
        out = asdict(self)
        out["best"] = {"name": self.best["name"], "samples_per_s": self.best["samples_per_s"],
                       "fraction_of_ceiling": self.best["fraction_of_ceiling"]}
        return out

    def table(self) -> str:
        """The climb as a text table: samples/s, fraction of the ceiling, stall, speed-up."""
        c = self.config
        lines = [f"Ladder on {self.device}",
                 f"batch {c['batch_size']}, {c['steps']} steps per rung, {c['num_workers']} workers where used"
                 + (", SIMULATED device" if self.simulated else ""),
                 f"{'rung':24s} {'samples/s':>11s} {'of ceiling':>11s} {'stalled':>8s} {'vs baseline':>12s}",
                 f"{'ceiling (model)':24s} {self.ceiling['samples_per_s']:11,.0f} {1:11.0%} {'':>8s} {'':>12s}"]
        for r in self.rungs:
            if r.get("skipped"):
                lines.append(f"{r['name']:24s} {'skipped':>11s}  {r['skipped']}")
                continue
            speedup = f"{r['speedup_over_baseline']:.1f}x" if r.get("speedup_over_baseline") else ""
            lines.append(f"{r['name']:24s} {r['samples_per_s']:11,.0f} {r['fraction_of_ceiling']:11.0%} "
                         f"{r['stall_fraction']:8.0%} {speedup:>12s}")
        lines.append(f"best: {self.best['name']} at {self.best['fraction_of_ceiling']:.0%} of the ceiling")
        return "\n".join(lines)

    def plot(self, path=None):
        """Bar chart of every rung against the ceiling, stamped with the device; saved to `path`."""
        from .plotting import bar_chart
        kind = "simulated device" if self.simulated else "measured"
        measured = [r for r in self.rungs if not r.get("skipped")]
        fig = bar_chart([r["short"] for r in measured], [r["samples_per_s"] for r in measured],
                        ylabel="samples/s", title=f"The ladder: each rung against the model-only ceiling ({kind})",
                        device=self.device, ceiling=self.ceiling["samples_per_s"], ceiling_label="ceiling")
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=120)
        return fig


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


def climb(config: LadderConfig | None = None, rungs=None, *, progress: bool = True, sim=None) -> LadderResult:
    """Measure the ceiling, then every rung, in one run; return the `LadderResult`.

    Where is `course_utils.target.pick_target(config.device)`: on a GPU, or on the CPU with
    COURSE_DEVICE=cpu, the model `config.resolved_model()` trains for real; beside the simulator
    the device is `sim`, or a simulated accelerator with `config.step_ms` per step, or the
    course's default one.
    """
    config = config or LadderConfig()
    rungs = _select(rungs if rungs is not None else RUNGS, config.rungs)
    target = pick_target(config.device, sim=sim)
    own_sim = target.simulated and sim is None
    if own_sim and config.step_ms is not None:
        target.close()
        target = Target("sim", torch.device("cpu"), SimulatedAccelerator(config.step_ms))
    device, run_on, model = target.device, target.run_on, None
    if not target.simulated:
        from .models import build_model
        torch.backends.cudnn.benchmark = True
        model = build_model(config.resolved_model(target)).to(device)
    ctx = LadderContext(config, device, run_on, model, progress=progress)
    try:
        with _intra_op_threads(1 if ctx.simulated else None):
            if ctx.cuda:   # cuDNN autotuning and the allocator warm up outside every measurement
                warm = torch.randn(config.batch_size, 3, 32, 32, device=device)
                train(model, itertools.repeat((warm, torch.zeros(config.batch_size, dtype=torch.long, device=device))),
                      device=device, steps=5, progress=False)
            ceiling = measure_ceiling(ctx).stats
            rows = []
            for fn in rungs:
                try:
                    stats = fn(ctx).stats
                except RungSkipped as why:
                    rows.append({"name": fn.rung_name, "short": fn.rung_short, "skipped": str(why),
                                 "description": " ".join((fn.__doc__ or "").split())})
                    continue
                row = {"name": fn.rung_name, "short": fn.rung_short,
                       "description": " ".join((fn.__doc__ or "").split()), **stats.as_row()}
                row["fraction_of_ceiling"] = round(stats.samples_per_s / ceiling.samples_per_s, 4)
                rows.append(row)
    finally:
        if own_sim:
            target.close()
    base = next((r for r in rows if r["name"] == "baseline"), None)
    for row in rows:
        if not row.get("skipped"):
            row["speedup_over_baseline"] = round(row["samples_per_s"] / base["samples_per_s"], 3) if base else None
    cfg = asdict(config)
    cfg.update(steps=config.resolved_steps(), num_workers=config.resolved_workers(),
               model=config.resolved_model(target),
               step_ms=ctx.run_on.step_time_ms(config.batch_size) if ctx.simulated else None)
    return LadderResult(ctx.label, ctx.simulated, cfg, ceiling.as_row(), rows,
                        host=device_label(torch.device("cpu")),
                        date=datetime.datetime.now().isoformat(timespec="seconds"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.ladder",
                                     description="Climb the input-pipeline ladder on this machine and print each "
                                                 "rung's samples/s and fraction of the model-only ceiling.")
    parser.add_argument("--smoke", action="store_true", help="quick: 30 steps per rung")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", metavar="FILE", nargs="?", const="build/ladder.png",
                        help="save a bar chart (default file: build/ladder.png)")
    parser.add_argument("--step-ms", type=float, help="no GPU: the simulated device's time per step, in ms "
                        "(default: the course's device, 7.4 ms for a batch of 128)")
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
