"""Resources per learner: cores by affinity mask, a memory cap where the machine allows, a GPU each.

- Cores: the hub's usable cores (its affinity mask, within a CPU quota) split into equal blocks,
  one per learner; with fewer cores than learners, learners share cores round-robin (and are
  told). The course reads the mask (`env.usable_cores()`), so lesson 02 sweeps a learner's own
  cores, not the machine's.
- Memory: a cgroup per learner with a memory limit: cgroup v2 (`memory.max`, a folder of the
  hub's own under the hierarchy's root) or cgroup v1's memory controller (`memory.limit_in_bytes`,
  below the hub's own cgroup). A machine that allows neither (a container without cgroup rights)
  gets no cap, and `make hub` says so.
- GPUs: `CUDA_VISIBLE_DEVICES`' list (indices, `GPU-...` or `MIG-...` UUIDs), else every GPU (or
  MIG instance) `nvidia-smi -L` lists, one per learner round-robin; none: an empty
  `CUDA_VISIBLE_DEVICES`, so the course uses its simulated device.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

__all__ = ["split_cores", "gpu_list", "parse_nvidia_smi", "assign_gpus", "MemoryCap", "default_memory"]


def split_cores(cores: list[int], learners: list[str]) -> dict[str, list[int]]:
    """Each learner's cores: equal blocks of `cores` in order (the rest left to the hub and the
    admin); with fewer cores than learners, one core each, round-robin (shared)."""
    cores = sorted(cores)
    if not learners:
        return {}
    if not cores:
        raise ValueError("no cores to share out")
    per = len(cores) // len(learners)
    if per == 0:
        return {name: [cores[i % len(cores)]] for i, name in enumerate(learners)}
    return {name: cores[i * per:(i + 1) * per] for i, name in enumerate(learners)}


def parse_nvidia_smi(text: str) -> list[str]:
    """The devices `nvidia-smi -L` lists, by UUID: a GPU's MIG instances instead of the GPU itself
    when it is split (a process can use one MIG instance)."""
    devices: list[list[str]] = []
    for line in text.splitlines():
        uuid = re.search(r"UUID:\s*((?:GPU|MIG)-[0-9A-Za-z/\-]+)", line)
        if not uuid:
            continue
        if uuid.group(1).startswith("GPU-") and not line.startswith((" ", "\t")):
            devices.append([uuid.group(1)])
        elif uuid.group(1).startswith("MIG-") and devices:
            if devices[-1][0].startswith("GPU-"):
                devices[-1] = []
            devices[-1].append(uuid.group(1))
    return [d for group in devices for d in group]


def gpu_list(environ=None, nvidia_smi: str | None = "nvidia-smi") -> list[str]:
    """The devices to share out: CUDA_VISIBLE_DEVICES' entries when it is set (empty, `-1` or
    `none`: no GPU), else what `nvidia-smi -L` lists (none without a driver)."""
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in env:
        value = env["CUDA_VISIBLE_DEVICES"].strip()
        if value in ("", "-1", "none", "NoDevFiles"):
            return []
        return [v.strip() for v in value.split(",") if v.strip()]
    if not nvidia_smi or shutil.which(nvidia_smi) is None:
        return []
    try:
        out = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(out)


def assign_gpus(gpus: list[str], learners: list[str]) -> dict[str, str]:
    """Each learner's CUDA_VISIBLE_DEVICES: one device each, round-robin; '' without devices."""
    return {name: (gpus[i % len(gpus)] if gpus else "") for i, name in enumerate(learners)}


def default_memory(learners: int, total: int | None = None) -> int:
    """Each learner's memory cap when HUB_MEMORY is unset: 90% of the machine's RAM, shared out."""
    if total is None:
        import psutil
        total = psutil.virtual_memory().total
    return int(0.9 * total / max(1, learners))


def _mounts():
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                dash = fields.index("-")
                yield fields[3], fields[4], fields[dash + 1], set(fields[dash + 3].split(","))
    except (OSError, ValueError):
        return


def _own_cgroup(controller: str | None) -> str | None:
    """This process's cgroup path in the v2 hierarchy (controller None) or the v1 one of `controller`."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                hid, controllers, path = line.rstrip("\n").split(":", 2)
                if controller is None and hid == "0" and controllers == "":
                    return path
                if controller is not None and controller in controllers.split(","):
                    return path
    except (OSError, ValueError):
        pass
    return None


class MemoryCap:
    """A memory limit per learner, in a cgroup of the hub's own (`feed-the-gpu-hub-<id>`).

        cap = MemoryCap.create(hub_id)          # None where the machine allows no cgroup of ours
        folder = cap.add("alice", 8 * 2**30)    # the learner's cgroup, its limit set
        MemoryCap.join(folder)                  # in the learner's server process, before exec
        cap.pids("alice"); cap.remove()         # what runs in it; the folders, once empty
    """

    def __init__(self, base: Path, version: str):
        self.base, self.version = Path(base), version

    @property
    def limit_file(self) -> str:
        return "memory.max" if self.version == "v2" else "memory.limit_in_bytes"

    @classmethod
    def create(cls, hub_id: str) -> "MemoryCap | None":
        name = f"feed-the-gpu-hub-{hub_id}"
        for root, point, fstype, options in list(_mounts()):
            if fstype == "cgroup2":
                try:
                    controllers = Path(point, "cgroup.controllers").read_text().split()
                except OSError:
                    continue
                if "memory" not in controllers:
                    continue
                base = Path(point, name)
                try:
                    base.mkdir(exist_ok=True)
                    (base / "cgroup.subtree_control").write_text("+memory")
                    return cls(base, "v2")
                except OSError:
                    _rmdir(base)
        for root, point, fstype, options in list(_mounts()):
            if fstype == "cgroup" and "memory" in options:
                own = _own_cgroup("memory") or "/"
                if root != "/" and own.startswith(root):
                    own = own[len(root.rstrip("/")):] or "/"
                base = Path(point + ("" if own == "/" else own), name)
                try:
                    base.mkdir(exist_ok=True)
                    return cls(base, "v1")
                except OSError:
                    _rmdir(base)
        return None

    def add(self, learner: str, limit_bytes: int) -> Path:
        folder = self.base / learner
        folder.mkdir(exist_ok=True)
        (folder / self.limit_file).write_text(str(int(limit_bytes)))
        if self.version == "v2":
            try:
                (folder / "memory.swap.max").write_text("0")
            except OSError:
                pass
        return folder

    @staticmethod
    def join(folder: str | Path) -> None:
        """Move the calling process into `folder` (a learner's cgroup): its children follow."""
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def pids(self, learner: str | None = None) -> list[int]:
        folders = [self.base / learner] if learner else [p for p in self.base.iterdir() if p.is_dir()]
        out = []
        for folder in folders:
            try:
                out += [int(x) for x in (folder / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                continue
        return out

    def remove(self) -> list[str]:
        """Remove the learners' folders and the hub's; returns those that still hold processes."""
        busy = []
        if not self.base.exists():
            return busy
        for folder in [p for p in self.base.iterdir() if p.is_dir()]:
            if not _rmdir(folder):
                busy.append(folder.name)
        _rmdir(self.base)
        return busy


def _rmdir(path: Path) -> bool:
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False
