"""What this machine has: versions, devices, cores, memory, DALI and NVML (lesson 00).

`print_env()` is the first cell of every lesson; `pick_device()` chooses where the lesson
runs; `require()` says in one sentence what a section needs and whether it can run here;
`device_label()` is the string every figure carries so a number never loses its hardware.
`usable_cores()` and `workers_for()` size loaders from the cores (env COURSE_CORES fakes a
count, so that a test proves the sizes of a 16- or 64-core machine on 2 cores); `bf16_native()`
and `fast_amp()` pick the autocast dtype a GPU runs natively; `dali_advice()` keeps DALI's real
import error and names the wheel that matches torch's CUDA.
"""
from __future__ import annotations

import importlib
import os
import platform
import sys
from dataclasses import dataclass, field

import psutil
import torch

__all__ = [
    "EnvReport", "env_report", "print_env", "pick_device", "require", "device_label",
    "has_dali", "has_nvml", "cpu_name", "smoke_mode", "usable_cores", "local_cuda_index",
    "course_device_choice", "CORES_ENV", "cpu_quota_cores", "workers_for", "batches_needed", "bf16_native", "fast_amp",
    "dali_import_error", "dali_wheel", "dali_advice", "dali_gpu_check", "DALI_VERSION",
]

CORES_ENV = "COURSE_CORES"
DALI_VERSION = "2.4.0"       # the version requirements.txt pins (read from it when it is there)


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


def dali_import_error() -> str | None:
    """None when NVIDIA DALI imports; otherwise the error it raised, as one line
    ("ModuleNotFoundError: No module named 'nvidia.dali'", or a missing CUDA library of a
    broken install), so that a learner sees why, not only that (lesson 00)."""
    try:
        importlib.import_module("nvidia.dali")
    except Exception as err:  # ImportError, an OSError from a missing .so, anything a broken install raises
        text = " ".join(str(err).split())
        return f"{type(err).__name__}: {text}" if text else type(err).__name__
    return None


def has_dali() -> bool:
    """True when NVIDIA DALI imports (lesson 04 needs it). `dali_import_error()` says why not."""
    return dali_import_error() is None


def _pinned_dali_version() -> str:
    """The DALI version requirements.txt pins, when the course's checkout is here."""
    import re
    from pathlib import Path
    try:
        text = (Path(__file__).resolve().parents[1] / "requirements.txt").read_text()
    except OSError:
        return DALI_VERSION
    found = re.search(r"^nvidia-dali-cuda\d+==([0-9][0-9.]*)", text, re.MULTILINE)
    return found.group(1) if found else DALI_VERSION


def _installed_dali_wheels() -> list[str]:
    """Names of the DALI distributions pip installed here (nvidia-dali-cuda120, -cuda130...)."""
    from importlib import metadata
    names = set()
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("nvidia-dali-cuda"):
            names.add(name)
    return sorted(names)


def dali_wheel(cuda_version: str | None = "torch") -> str:
    """The DALI wheel for this machine's torch, as pip names it: DALI's CUDA major must match
    torch's (torch 2.14.1+cu130 and the GPU box's 2.11+cu130: `nvidia-dali-cuda130`; a torch
    built for CUDA 12: `nvidia-dali-cuda120`). A CPU-only torch gets the CUDA 13 wheel, whose
    CPU pipelines run anywhere. `cuda_version` defaults to `torch.version.cuda`."""
    if cuda_version == "torch":
        cuda_version = torch.version.cuda
    major = 13
    if cuda_version:
        try:
            major = int(str(cuda_version).split(".")[0])
        except ValueError:
            pass
    major = 12 if major <= 12 else major
    return f"nvidia-dali-cuda{major}0=={_pinned_dali_version()}"


def dali_advice(error: str | None = "check") -> str | None:
    """None when DALI imports and matches torch's CUDA; otherwise one or two sentences: the real
    import error and the wheel to install (or the mismatch to fix), for print_env, require()
    and lesson 04's skips."""
    if error == "check":
        error = dali_import_error()
    wheel = dali_wheel()
    name = wheel.split("==")[0]
    if error is None:
        wrong = [w for w in _installed_dali_wheels() if w != name]
        if wrong and torch.version.cuda and name not in _installed_dali_wheels():
            return (f"DALI is installed as {', '.join(wrong)}, but torch is built for CUDA {torch.version.cuda}: "
                    f"its GPU pipelines need the matching wheel (pip uninstall {' '.join(wrong)}; "
                    f"pip install {wheel})")
        return None
    if not sys.platform.startswith("linux"):
        return (f"NVIDIA DALI cannot be imported here ({error}); DALI publishes Linux wheels only "
                "(x86_64, aarch64), so lesson 04 explains and skips its DALI cells")
    return (f"NVIDIA DALI cannot be imported here ({error}). For this torch "
            f"(CUDA {torch.version.cuda or 'none: a CPU build'}) run `pip install {wheel}`; without it "
            "lesson 04 explains and skips its DALI cells")


def has_nvml() -> bool:
    """True when nvidia-ml-py can talk to an NVIDIA driver (GPU utilisation timelines)."""
    from .monitor import nvml_close, nvml_open
    if nvml_open() is not None:
        return False
    nvml_close()
    return True


def _dali_one_batch(device_id: int | None, batch_size: int = 8) -> float:
    """Run one batch of random uint8 images through DALI: crop_mirror_normalize on the GPU
    `device_id` (the CPU when None), and return the largest difference from the same arithmetic
    done in NumPy."""
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(batch_size)]
    mean, std = [125.3, 123.0, 113.9], [63.0, 62.1, 66.7]

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=device_id, seed=0, prefetch_queue_depth=1)
    def one_batch():
        x = fn.external_source(source=lambda: images, batch=True, layout="HWC")
        x = x.gpu() if device_id is not None else x
        return fn.crop_mirror_normalize(x, dtype=types.FLOAT, output_layout="CHW", mean=mean, std=std, mirror=1)

    pipe = one_batch()
    pipe.build()
    (out,) = pipe.run()
    got = (out.as_cpu() if device_id is not None else out).as_array()
    flipped = np.stack(images)[:, :, ::-1, :].astype(np.float32)
    expected = ((flipped - np.float32(mean)) / np.float32(std)).transpose(0, 3, 1, 2)
    return float(np.abs(got - expected).max())


def dali_gpu_check(device=None) -> tuple[bool | None, str]:
    """One batch through DALI's GPU stages (uint8 images handed from the host, cropped, mirrored
    and normalised on the GPU), compared with NumPy: lesson 00's setup check and `make
    gpu-check`'s. Returns (True, sentence) when it ran and matched, (False, sentence with DALI's
    error) when DALI failed on the GPU, (None, sentence) when it cannot run here (no GPU, no DALI)."""
    index = _cuda_index(device) if torch.cuda.is_available() else None
    if index is None:
        return None, ("DALI on the GPU: not tried, no CUDA GPU here (lesson 04 runs DALI's CPU pipelines; "
                      "on a GPU this line runs one batch through its GPU stages)")
    error = dali_import_error()
    if error is not None:
        return None, f"DALI on the GPU: not tried. {dali_advice(error)}"
    try:
        diff = _dali_one_batch(index)
    except Exception as err:
        advice = dali_advice() or ""
        return False, (f"DALI on the GPU (cuda:{index}) FAILED: {type(err).__name__}: {' '.join(str(err).split())[:400]}"
                       + (f" ({advice})" if advice else ""))
    if diff > 1e-3:
        return False, f"DALI on the GPU (cuda:{index}) ran, but its batch differs from NumPy's by {diff:.3g}"
    return True, (f"DALI on the GPU (cuda:{index}): one batch cropped, mirrored and normalised there, equal to "
                  f"NumPy's to {diff:.1e}")


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
    cpu_quota: float | None = None      # cores' worth of CPU time a cgroup quota allows (None: no quota)
    ram_gib: float = 0.0
    dali: str | None = None
    dali_advice: str | None = None
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
                cc = g.get("capability")
                bf16 = ("" if cc is None else f", compute capability {cc}, bf16 "
                        + ("native" if g.get("bf16_native") else "emulated (slow): env.fast_amp() picks fp16 here"))
                out.append(f"GPU {g['index']}        {g['name']}, {g['memory_gib']:.1f} GiB, "
                           f"{g['multiprocessors']} SMs{bf16}")
        else:
            out.append("CUDA         no GPU visible: GPU-only parts use the simulated accelerator "
                       "(labelled 'simulated') or are skipped with a sentence")
        out += [
            f"CPU          {self.cpu}: {self.usable_cores} usable cores "
            f"({self.cpu_cores_logical} logical, {self.cpu_cores_physical or '?'} physical"
            + (f"; a CPU quota of {self.cpu_quota:g} cores" if self.cpu_quota is not None else "") + ")",
            f"RAM          {self.ram_gib:.1f} GiB",
            f"DALI         {self.dali or 'not installed (lesson 04 explains and skips)'}",
            *([f"             {self.dali_advice}"] if self.dali_advice else []),
            f"NVML         {'available' if self.nvml else 'not available (no GPU utilisation readings)'}",
            f"Mode         {'SMOKE (quick, small sizes)' if self.smoke else 'full size'}",
        ]
        return out


def usable_cores() -> int:
    """Cores this process may run on, which is what DataLoader workers share: the affinity mask,
    and no more than a CPU-time quota allows (cgroup v2 `cpu.max`, as Kubernetes, `docker run
    --cpus` and systemd's CPUQuota set it; cgroup v1's CFS quota), rounded up: a quota of 1.5
    cores lets two processes run three quarters of the time each (`cpu_quota_cores`).

    Env COURSE_CORES=N (1-1024) replaces the count: the tests run smoke sizes as a 16- or
    64-core machine would choose them, on any host; a learner may also leave cores to other
    programs with it. The machine's real core count still shows in print_env's CPU line."""
    value = os.environ.get(CORES_ENV, "").strip()
    if value:
        if not value.isdigit() or not 1 <= int(value) <= 1024:
            raise ValueError(f"{CORES_ENV}={value!r}: give the number of cores to use, 1 to 1024, or unset it")
        return int(value)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1
    quota = cpu_quota_cores()
    if quota is not None:
        import math
        cores = min(cores, max(1, math.ceil(quota - 1e-6)))
    return cores


def _cgroup_dirs(proc_self: str, want_v1: str) -> list[tuple[str, str]]:
    """(version, folder) of this process's own cgroup in each hierarchy that can hold a CPU quota:
    the cgroup2 one, and the cgroup v1 one that carries the `want_v1` controller. The path in
    /proc/self/cgroup is taken relative to the root the hierarchy is mounted from (a container
    sees its own cgroup mounted as the root)."""
    try:
        with open(f"{proc_self}/cgroup") as f:
            memberships = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
        with open(f"{proc_self}/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return []
    found = []
    for fields in mounts:
        if "-" not in fields:
            continue
        dash = fields.index("-")
        root, point, fstype = fields[3], fields[4], fields[dash + 1]
        options = set(fields[dash + 3].split(",")) if len(fields) > dash + 3 else set()
        for hid, controllers, path in memberships:
            if fstype == "cgroup2" and hid == "0" and controllers == "":
                version = "v2"
            elif fstype == "cgroup" and want_v1 in controllers.split(",") and want_v1 in options:
                version = "v1"
            else:
                continue
            if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
                path = path[len(root.rstrip("/")):] or "/"
            folder = point.rstrip("/") + ("" if path == "/" else path)
            if os.path.isdir(folder):
                found.append((version, folder))
    return found


def _quota_here(version: str, folder: str) -> float | None:
    try:
        if version == "v2":
            with open(os.path.join(folder, "cpu.max")) as f:
                quota, period = (f.read().split() + ["100000"])[:2]
            if quota == "max":
                return None
            return int(quota) / int(period)
        with open(os.path.join(folder, "cpu.cfs_quota_us")) as f:
            quota = int(f.read())
        with open(os.path.join(folder, "cpu.cfs_period_us")) as f:
            period = int(f.read())
        return None if quota < 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def cpu_quota_cores(proc_self: str = "/proc/self") -> float | None:
    """The CPU time this process's cgroups allow, in cores (2.5 for `cpu.max` = "250000 100000"),
    or None when no quota applies (or none can be read: not Linux, no cgroups mounted). The
    smallest quota on the way from this process's cgroup up to the hierarchy's root counts, as
    the kernel enforces every level. Read by `usable_cores()` (lesson 02 sizes its worker sweep
    with it) and shown by `print_env()`."""
    quotas = []
    for version, folder in _cgroup_dirs(proc_self, "cpu"):
        while True:
            quota = _quota_here(version, folder)
            if quota is not None:
                quotas.append(quota)
            parent = os.path.dirname(folder)
            if parent == folder or not os.path.exists(os.path.join(parent, "cgroup.procs")):
                break
            folder = parent
    return min(quotas) if quotas else None


def batches_needed(workers: int, timed: int, *, prefetch_factor: int = 2) -> int:
    """Batches a DataLoader must hold so that `timed` batches are left after the untimed
    warm-up that drains what its workers prepared ahead: 1 + workers x prefetch_factor + timed
    (lesson 02's `in_flight_batches`). Size a smoke-mode dataset with it."""
    if workers < 0 or timed < 0 or prefetch_factor < 1:
        raise ValueError(f"workers and timed must be >= 0 and prefetch_factor >= 1 "
                         f"(got {workers}, {timed}, {prefetch_factor})")
    return 1 + workers * (prefetch_factor if workers else 0) + timed


def workers_for(batches: int | None = None, timed: int = 0, *, prefetch_factor: int = 2,
                cores: int | None = None) -> int:
    """DataLoader workers for this machine: one per usable core (lesson 02), but no more than a
    loader of `batches` batches can feed while `timed` batches still follow the warm-up (each
    worker prepares `prefetch_factor` batches ahead, which the warm-up drains). 16 workers with 2
    batches each ask for 33 batches before the first timed one: more than a smoke-size dataset
    holds. `batches=None`: no limit. Never below 0 (0: load in the main process)."""
    cores = usable_cores() if cores is None else int(cores)
    if batches is None:
        return max(0, cores)
    room = (int(batches) - 1 - int(timed)) // max(1, int(prefetch_factor))
    return max(0, min(cores, room))


def env_report() -> EnvReport:
    """Collect the facts `print_env()` prints."""
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": p.name, "memory_gib": p.total_memory / 2**30,
                         "multiprocessors": p.multi_processor_count, "capability": f"{p.major}.{p.minor}",
                         "bf16_native": bf16_native(i)})
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
        cpu_quota=cpu_quota_cores(),
        ram_gib=psutil.virtual_memory().total / 2**30,
        dali=_module_version("nvidia.dali"),
        dali_advice=dali_advice(),
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


def _cuda_index(device) -> int | None:
    """The CUDA index behind `device` (None, an int, a string or a torch.device), or None when
    it is not a CUDA device (the CPU, the simulated accelerator)."""
    if device is None:
        return torch.cuda.current_device() if torch.cuda.is_available() else None
    if isinstance(device, int):
        return device
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        return None
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def bf16_native(device=None) -> bool:
    """True when `device` (default: the current CUDA GPU) computes bfloat16 natively: a GPU of
    compute capability 8.0 or newer (Ampere, Hopper, Blackwell...). `torch.cuda.is_bf16_supported()`
    also says True on older GPUs (V100, T4) that only emulate it, slowly; this asks the capability
    (`including_emulation=False`). False for the CPU and the simulated accelerator: on a CPU
    lesson 05 measures bfloat16 rather than assume it (lessons 05 and 08, the ladder)."""
    if not torch.cuda.is_available():
        return False
    index = _cuda_index(device)
    if index is None:
        return False
    try:
        major, _ = torch.cuda.get_device_capability(index)
    except Exception:       # no properties for this index (the checks' virtual CUDA device): ask torch
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:    # a torch without the argument
            return False
    return major >= 8


def fast_amp(device=None) -> str | None:
    """The autocast mode that makes a training step cheaper on `device` (lessons 05 and 08, the
    ladder): "bf16" where the GPU computes it natively (compute capability >= 8.0), "fp16" with a
    GradScaler on older CUDA GPUs (tensor cores from 7.0), None on the CPU and the simulated
    accelerator (nothing to gain that the course can promise; lesson 05 measures it there)."""
    if _cuda_index(device) is None or not torch.cuda.is_available():
        return None
    return "bf16" if bf16_native(device) else "fp16"


def require(*, gpu: bool = False, gpus: int = 1, dali: bool = False, what: str = "This section") -> bool:
    """Say whether a section can run here. Returns True when it can; otherwise prints one
    sentence naming what is missing and what the section would show, and returns False so the
    lesson can skip it (`if require(gpu=True, what="Pinned-copy bandwidth"): ...`)."""
    missing = []
    if gpu:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < gpus:
            missing.append(f"{gpus} CUDA GPU{'s' if gpus > 1 else ''} (found {n})")
    error = dali_import_error() if dali else None
    if error is not None:
        missing.append(f"NVIDIA DALI, which does not import here ({error}; pip install {dali_wheel()})")
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
