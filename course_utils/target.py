"""Where a lesson trains: a GPU, the CPU, or the simulated accelerator (lesson 01).

    target = pick_target()
    print(target.describe())
    model = target.model()                       # None beside the simulator
    result = train(model, loader, device=target.run_on, steps=200)

Three kinds, chosen by env COURSE_DEVICE (see `course_utils.env.pick_device`):

- "cuda": a GPU. The model is the CIFAR ResNet-18 at full width; everything is measured for real.
- "sim" (the default on a machine without a GPU): the simulated accelerator
  (`course_utils.sim`): the H100 box the course measured, scaled to this CPU. No model runs: each
  step spends the measured launch time on the host and queues the measured GPU work on a
  simulated device, asynchronous like CUDA, so the input pipeline is measured for real beside a
  device that behaves like a real one. Every figure says "simulated".
- "cpu" (`COURSE_DEVICE=cpu`): the real model, narrow (`CPU_MODEL_WIDTH`), trains on the CPU
  through exactly the code a GPU runs: the same transfers, dtypes, shapes, labels and
  `batch_transform`s, with only the CUDA-only calls (streams, events, pinned memory, NVML)
  answered by `course_utils.accel`. It is slow and shares the cores with the loader, so its
  timings say nothing about feeding a GPU; it exists so that CI, on a machine without a GPU,
  executes every line of the GPU branches and catches their dtype, shape and label bugs.

Lessons branch on `target.simulated` (is there a model to train?), never on
`device.type == "cuda"` for that: CUDA-only calls go through `course_utils.accel`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .env import course_device_choice, device_label, pick_device
from .sim import SimulatedAccelerator, default_sim

__all__ = ["Target", "pick_target", "CPU_MODEL_WIDTH", "GPU_MODEL_WIDTH"]

GPU_MODEL_WIDTH = 64    # the standard CIFAR ResNet-18 (11.2 M parameters)
CPU_MODEL_WIDTH = 8     # an eighth of the width: about 0.2 M parameters, a step of 128 in ~0.1 s on 2 cores

_KINDS = ("cuda", "cpu", "sim")


@dataclass
class Target:
    """Where a lesson trains (see the module docstring).

    kind: "cuda", "cpu" or "sim"; device: where tensors live (cuda:N, or cpu: the simulator
    keeps its "device memory" in host memory); run_on: what `train()`, `StepTimer`,
    `benchmark()`, `synchronize()` and `UtilizationMonitor(sim=...)` get, the torch device or the
    `SimulatedAccelerator`.
    """
    kind: str
    device: torch.device
    run_on: object

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {self.kind!r}")

    @property
    def simulated(self) -> bool:
        """True beside the simulated accelerator: no model runs, steps are simulated."""
        return self.kind == "sim"

    @property
    def cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def label(self) -> str:
        """The device every figure of the lesson is stamped with."""
        label = device_label(self.run_on)
        if self.kind == "cpu":
            label += f"; real model at width {CPU_MODEL_WIDTH} (COURSE_DEVICE=cpu)"
        return label

    @property
    def model_width(self) -> int | None:
        return {"cuda": GPU_MODEL_WIDTH, "cpu": CPU_MODEL_WIDTH, "sim": None}[self.kind]

    def model(self, width: int | None = None, num_classes: int = 10) -> torch.nn.Module | None:
        """The lesson's model on `device`: the CIFAR ResNet-18, full width on a GPU, narrow on the
        CPU (or `width`), None beside the simulator (its step stands in for the model)."""
        if self.simulated:
            return None
        from .models import resnet18_cifar
        return resnet18_cifar(num_classes, width=width or self.model_width).to(self.device)

    def describe(self) -> str:
        """One paragraph for a lesson's device cell: what trains here and what its numbers mean."""
        if self.kind == "cuda":
            return (f"training steps run on {self.label}: the CIFAR ResNet-18 (width {GPU_MODEL_WIDTH}) "
                    "trains on the GPU; every number is measured.")
        if self.kind == "sim":
            describe = getattr(self.run_on, "describe", None)
            what = describe() if callable(describe) else self.label
            return (f"training steps run on the {what} No GPU here: each step spends the measured launch time "
                    "on this host and queues the measured GPU work on a simulated device, asynchronous like "
                    "CUDA. The input pipeline is real; the device is simulated, and every figure says so.")
        return (f"training steps run on {self.label}. COURSE_DEVICE=cpu: the real model trains on the CPU "
                "through the code a GPU runs (CUDA-only calls answered by course_utils.accel). It shares the "
                "cores with the loader, so its timings say nothing about feeding a GPU: this mode checks "
                "that the GPU code paths are correct.")

    def gpu_section(self, what: str) -> bool:
        """Whether a section that measures something only a GPU has (copy bandwidth, streams)
        runs here. On a GPU: yes. With COURSE_DEVICE=cpu: yes, its code runs on the CPU through
        `course_utils.accel` so that CI checks it, and a sentence says its numbers mean nothing
        here. Beside the simulator: no; a sentence says what the section needs (see `env.require`)."""
        if self.kind == "cuda":
            return True
        if self.kind == "cpu":
            print(f"{what}: COURSE_DEVICE=cpu runs this GPU code on the CPU to check that it works; "
                  "its numbers say nothing about a GPU.")
            return True
        from .env import require
        return require(gpu=True, what=what)

    def close(self) -> None:
        """Release the simulated device (nothing to do for a real device)."""
        if isinstance(self.run_on, SimulatedAccelerator):
            self.run_on.close()


def pick_target(prefer: str | None = None, *, sim: SimulatedAccelerator | None = None) -> Target:
    """Where this lesson trains: `prefer`, else env COURSE_DEVICE (unset: a GPU if there is one,
    else the simulated accelerator; 'sim', 'cpu', 'cuda', 'cuda:N'). `sim` replaces the course's
    default simulated accelerator (`course_utils.sim.default_sim()`) when the target is simulated."""
    choice = course_device_choice(prefer)
    device = pick_device(prefer)
    if device.type == "cuda":
        return Target("cuda", device, device)
    if choice == "cpu":
        return Target("cpu", device, device)
    return Target("sim", torch.device("cpu"), sim if sim is not None else default_sim())
