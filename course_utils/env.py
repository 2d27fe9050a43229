"""What this machine has: versions, devices, cores, memory, DALI and NVML (lesson 00).

`print_env()` is the first cell of every lesson; `pick_device()` chooses where the lesson
runs; `require()` says in one sentence what a section needs and whether it can run here;
`device_label()` is the string every figure carries so a number never loses its hardware.
"""
from __future__ import annotations

import importlib
import os
import platform
from dataclasses import dataclass, field

import psutil
import torch

__all__ = [
    "EnvReport", "env_report", "print_env", "pick_device", "require", "device_label",
    "has_dali", "has_nvml", "cpu_name", "smoke_mode", "usable_cores", "local_cuda_index",
    "course_device_choice",
]


def smoke_mode(default: bool = False) -> bool:
    """True when env COURSE_SMOKE is 1/true/yes: the quick mode CI and `make test` use."""
    value = os.environ.get("COURSE_SMOKE")
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _module_version(name: str) -> str | None:
    try:
        module = importlib.import_module(name)
    except Exception:  # ImportError, or a broken install that fails on import
        return None
    return getattr(module, "__version__", "installed")


def has_dali() -> bool:
    """True when NVIDIA DALI imports (lesson 04 needs it)."""
    return _module_version("nvidia.dali") is not None


def has_nvml() -> bool:
    """True when nvidia-ml-py can talk to an NVIDIA driver (GPU utilisation timelines)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def cpu_name() -> str:
    """The processor's model name, as /proc/cpuinfo or the platform module gives it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass
class EnvReport:
    """Everything `print_env()` shows, as data (the tests and the grader read it)."""
    python: str
    torch: str
    torchvision: str | None
    cuda_available: bool
    cuda_version: str | None
    cudnn_version: int | None
    gpus: list[dict] = field(default_factory=list)
    cpu: str = ""
    cpu_cores_logical: int = 1
    cpu_cores_physical: int | None = None
    usable_cores: int = 1
    ram_gib: float = 0.0
    dali: str | None = None
    nvml: bool = False
    smoke: bool = False

    def lines(self) -> list[str]:
        out = [
            f"Python       {self.python}",
            f"PyTorch      {self.torch}   torchvision {self.torchvision or 'not installed'}",
        ]
        if self.cuda_available:
            out.append(f"CUDA         {self.cuda_version}   cuDNN {self.cudnn_version}")
            for g in self.gpus:
                out.append(f"GPU {g['index']}        {g['name']}, {g['memory_gib']:.1f} GiB, "
                           f"{g['multiprocessors']} SMs")
        else:
            out.append("CUDA         no GPU visible: GPU-only parts use the simulated accelerator "
                       "(labelled 'simulated') or are skipped with a sentence")
        out += [
            f"CPU          {self.cpu}: {self.usable_cores} usable cores "
            f"({self.cpu_cores_logical} logical, {self.cpu_cores_physical or '?'} physical)",
            f"RAM          {self.ram_gib:.1f} GiB",
            f"DALI         {self.dali or 'not installed (lesson 04 explains and skips)'}",
            f"NVML         {'available' if self.nvml else 'not available (no GPU utilisation readings)'}",
            f"Mode         {'SMOKE (quick, small sizes)' if self.smoke else 'full size'}",
        ]
        return out


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask), which is what DataLoader workers share."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def env_report() -> EnvReport:
    """Collect the facts `print_env()` prints."""
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": p.name, "memory_gib": p.total_memory / 2**30,
                         "multiprocessors": p.multi_processor_count})
    return EnvReport(
        python=platform.python_version(),
        torch=torch.__version__,
        torchvision=_module_version("torchvision"),
        cuda_available=torch.cuda.is_available(),
        cuda_version=torch.version.cuda if torch.cuda.is_available() else None,
        cudnn_version=torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        gpus=gpus,
        cpu=cpu_name(),
        cpu_cores_logical=psutil.cpu_count(logical=True) or 1,
        cpu_cores_physical=psutil.cpu_count(logical=False),
        usable_cores=usable_cores(),
        ram_gib=psutil.virtual_memory().total / 2**30,
        dali=_module_version("nvidia.dali"),
        nvml=has_nvml(),
        smoke=smoke_mode(),
    )


def print_env() -> EnvReport:
    """Print the environment report at the top of a lesson and return it."""
    report = env_report()
    print("\n".join(report.lines()))
    return report


COURSE_DEVICE_CHOICES = "unset/'auto' (a GPU if there is one, else the simulated accelerator), 'sim', 'cpu', 'cuda' or 'cuda:N'"


def course_device_choice(prefer: str | None = None) -> str:
    """What the learner asked for: `prefer`, else env COURSE_DEVICE, else 'auto' (lesson 00)."""
    choice = (prefer or os.environ.get("COURSE_DEVICE") or "auto").strip().lower()
    return choice or "auto"


def local_cuda_index() -> int:
    """The CUDA device this process should use: env LOCAL_RANK (one process per GPU under
    torchrun, lesson 07) when set, else the current device. Indices count the GPUs that
    CUDA_VISIBLE_DEVICES leaves visible, as torch and DALI number them."""
    count = torch.cuda.device_count()
    rank = os.environ.get("LOCAL_RANK")
    if rank is not None and rank.strip().isdigit():
        index = int(rank)
        if index >= count:
            raise RuntimeError(f"LOCAL_RANK={index}, but only {count} CUDA GPU(s) are visible here "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): "
                               "start no more processes per node than GPUs")
        return index
    return torch.cuda.current_device()


def pick_device(prefer: str | None = None) -> torch.device:
    """Where a lesson's tensors live: `cuda:N` or `cpu` (lesson 01).

    `prefer`, else env COURSE_DEVICE: unset or 'auto' gives the local GPU when one is visible
    (LOCAL_RANK under torchrun, else the current device), else the CPU; 'sim' gives the CPU
    (the simulated accelerator keeps its tensors in host memory); 'cpu'; 'cuda' or 'cuda:N'.
    `course_utils.target.pick_target()` adds what trains there (a real model or the simulator).
    """
    choice = course_device_choice(prefer)
    if choice in ("auto", "sim"):
        if choice == "auto" and torch.cuda.is_available():
            return torch.device("cuda", local_cuda_index())
        return torch.device("cpu")
    try:
        device = torch.device(choice)
    except RuntimeError:
        raise ValueError(f"COURSE_DEVICE/prefer {choice!r} is not a device; use {COURSE_DEVICE_CHOICES}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"COURSE_DEVICE/prefer asks for {choice!r}, but no CUDA GPU is visible "
                               "to PyTorch here. Unset it to run on the CPU.")
        index = device.index if device.index is not None else local_cuda_index()
        if index >= torch.cuda.device_count():
            raise RuntimeError(f"{choice!r} asks for GPU {index}, but {torch.cuda.device_count()} are visible here")
        return torch.device("cuda", index)
    if device.type != "cpu":
        raise ValueError(f"the course runs on CUDA GPUs or the CPU, not {device.type!r}; use {COURSE_DEVICE_CHOICES}")
    return device


def require(*, gpu: bool = False, gpus: int = 1, dali: bool = False, what: str = "This section") -> bool:
    """Say whether a section can run here. Returns True when it can; otherwise prints one
    sentence naming what is missing and what the section would show, and returns False so the
    lesson can skip it (`if require(gpu=True, what="Pinned-copy bandwidth"): ...`)."""
    missing = []
    if gpu:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < gpus:
            missing.append(f"{gpus} CUDA GPU{'s' if gpus > 1 else ''} (found {n})")
    if dali and not has_dali():
        missing.append("NVIDIA DALI (pip install nvidia-dali-cuda120, as requirements.txt pins)")
    if missing:
        print(f"{what} needs {' and '.join(missing)}; skipped here. "
              "On a machine that has it, this cell measures for real.")
        return False
    return True


def device_label(device) -> str:
    """Name the hardware behind a device, for titles and tables: the GPU's name, the CPU's
    model and cores, or the simulated accelerator's description (which says 'simulated')."""
    label = getattr(device, "label", None)  # the simulated accelerator carries its own label
    if label is not None:
        return label
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"{torch.cuda.get_device_name(index)} (cuda:{index})"
    return f"CPU: {cpu_name()}, {usable_cores()} cores"
