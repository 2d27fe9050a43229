"""What the hardware means for feeding a GPU: cores per GPU, RAM against the dataset, the disk
the data lives on, and each GPU's links (lesson 00).

`print_env()` (course_utils.env) says *what* the machine has; this module turns it into the
four facts the later lessons depend on, each with what it means here:

- **cores per GPU**: DataLoader workers, DALI's CPU threads and the training process share
  them (lessons 02 and 04);
- **RAM against the dataset**: a dataset that fits in RAM is read from the disk once, then
  from the page cache; one that does not is read from the disk every epoch (lesson 01);
- **the disk holding the data** and its measured cold read throughput (lessons 01 and 04);
- **PCIe and NVLink** per GPU, through NVML where there is one: host-to-GPU copies (lesson 03)
  and GPU-to-GPU all-reduce (lesson 07).

    facts = hardware_facts(measure_disk=True)
    print("\\n".join(facts.lines() + facts.meaning()))

`disk_of(path)` names the block device and file system behind any path (Linux reads /sys and
/proc/mounts; elsewhere it says 'unknown'). Nothing here needs root.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import psutil

__all__ = ["DiskInfo", "disk_of", "gpu_links", "pcie_gb_per_s", "HardwareFacts", "hardware_facts",
           "print_hardware", "PCIE_GB_PER_S_PER_LANE", "NETWORK_FILESYSTEMS"]

# Usable bandwidth per lane and direction, after line encoding (PCIe 1-2: 8b/10b; 3-5: 128b/130b;
# 6: PAM4 with FLIT, about 7.56). A x16 link carries 16 times this each way; real copies reach
# about 80% of it.
PCIE_GB_PER_S_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.56}
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "ceph", "beegfs",
                       "glusterfs", "9p", "virtiofs", "fuse.s3fs", "fuse.gcsfuse", "fuse.sshfs")


def pcie_gb_per_s(generation: int | None, width: int | None) -> float | None:
    """Theoretical one-way bandwidth of a PCIe link in GB/s (None when either is unknown)."""
    if not generation or not width or generation not in PCIE_GB_PER_S_PER_LANE:
        return None
    return PCIE_GB_PER_S_PER_LANE[generation] * width


# -- the disk behind a path -------------------------------------------------------------------

@dataclass(frozen=True)
class DiskInfo:
    """The storage behind a path: mount point, file system, block device, and what kind it is."""
    path: str
    mount: str = "?"
    fstype: str = "?"
    device: str | None = None        # the block device of the mount, e.g. vda, nvme0n1p2, sda1
    disk: str | None = None          # the whole disk it belongs to, e.g. vda, nvme0n1, sda
    rotational: bool | None = None   # what the kernel reports (virtual disks often say True)
    model: str | None = None
    size_gib: float | None = None
    kind: str = "unknown"

    @property
    def label(self) -> str:
        """One line for figures and tables: device, kind and file system."""
        where = self.device or self.fstype
        model = f", {self.model}" if self.model else ""
        return f"{where}: {self.kind}{model}, {self.fstype} at {self.mount}"


def _mounts() -> list[tuple[str, str, str]]:
    """(device, mount point, fstype) of every mount, from /proc/mounts (Linux) or psutil."""
    try:
        with open("/proc/mounts") as f:
            rows = [line.split()[:3] for line in f if len(line.split()) >= 3]
        return [(dev, mnt.replace("\\040", " "), fs) for dev, mnt, fs in rows]
    except OSError:
        return [(p.device, p.mountpoint, p.fstype) for p in psutil.disk_partitions(all=True)]


def _read_sys(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _disk_kind(fstype: str, disk: str | None, rotational: bool | None) -> str:
    fs = fstype.lower()
    if fs in ("tmpfs", "ramfs"):
        return "RAM (tmpfs): a RAM disk"
    if fs in NETWORK_FILESYSTEMS or fs.startswith("fuse."):
        return "network or distributed file system"
    if fs == "overlay":
        return "container overlay file system (the disk underneath is not visible)"
    if disk is None:
        return "unknown"
    if disk.startswith("nvme"):
        return "NVMe SSD"
    if disk.startswith(("vd", "xvd")):
        return "virtual disk (the host's storage underneath is not visible)"
    if disk.startswith(("zram", "ram")):
        return "RAM block device"
    if disk.startswith("loop"):
        return "loop device (a file on another disk)"
    if disk.startswith(("md", "dm-")):
        return "RAID or device-mapper volume"
    if rotational is True:
        return "rotational disk (HDD)"
    if rotational is False:
        return "SSD"
    return "unknown"


def disk_of(path) -> DiskInfo:
    """The mount, file system and block device holding `path`, and what kind of storage it is
    (NVMe SSD, SSD, HDD, virtual disk, RAM disk, network file system...). Linux only reads
    /proc/mounts and /sys; elsewhere the kind is 'unknown' (lesson 00)."""
    real = os.path.realpath(path)
    mount, fstype = "?", "?"
    for _, mnt, fs in _mounts():           # the longest mount point above the path (the last one wins)
        top = mnt.rstrip("/") or "/"
        if (top == "/" or real == top or real.startswith(top + "/")) and (mount == "?" or len(top) >= len(mount)):
            mount, fstype = top, fs
    device = disk = model = None
    rotational = size_gib = None
    try:
        st = os.stat(real)
        major, minor = os.major(st.st_dev), os.minor(st.st_dev)
        sys_dev = Path(f"/sys/dev/block/{major}:{minor}")
        if major != 0 and sys_dev.exists():
            resolved = sys_dev.resolve()
            device = resolved.name
            disk = resolved.parent.name if (resolved / "partition").exists() else device
    except OSError:
        pass
    if disk is not None:
        block = Path("/sys/block") / disk
        flag = _read_sys(block / "queue" / "rotational")
        rotational = None if flag is None else flag == "1"
        model = _read_sys(block / "device" / "model")
        sectors = _read_sys(block / "size")
        size_gib = int(sectors) * 512 / 2**30 if sectors and sectors.isdigit() else None
    return DiskInfo(path=str(path), mount=mount, fstype=fstype, device=device, disk=disk, rotational=rotational,
                    model=model, size_gib=size_gib, kind=_disk_kind(fstype, disk, rotational))


# -- GPU links, through NVML ------------------------------------------------------------------

_TOPOLOGY = {0: "the same board", 10: "one PCIe switch", 20: "several PCIe switches",
             30: "the same PCIe host bridge (CPU)", 40: "the same NUMA node, different host bridges",
             50: "different CPU sockets (across the CPUs' interconnect)"}


def gpu_links() -> tuple[list[dict], list[dict]]:
    """Per GPU: name, PCIe generation and width (current and maximum), their bandwidth, active
    NVLink links and power limit; and per pair of GPUs, how they are connected. Read through
    NVML (nvidia-ml-py); ([], []) without an NVIDIA driver (lesson 00)."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:
        return [], []

    def ask(fn, *args):
        try:
            return fn(*args)
        except Exception:
            return None

    gpus, pairs = [], []
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        for i, h in enumerate(handles):
            name = ask(pynvml.nvmlDeviceGetName, h)
            name = name.decode() if isinstance(name, bytes) else name
            links = 0
            for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
                state = ask(pynvml.nvmlDeviceGetNvLinkState, h, link)
                if state is None:
                    break
                links += int(bool(state))
            power_mw = ask(pynvml.nvmlDeviceGetEnforcedPowerManagementLimit, h)
            gen, width = ask(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h), ask(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)
            max_gen, max_width = ask(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h), ask(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h)
            gpus.append({"index": i, "name": name, "pcie_gen": gen, "pcie_width": width, "pcie_max_gen": max_gen,
                         "pcie_max_width": max_width, "pcie_gb_per_s": pcie_gb_per_s(gen, width),
                         "pcie_max_gb_per_s": pcie_gb_per_s(max_gen, max_width), "nvlinks": links,
                         "power_limit_w": power_mw / 1000 if power_mw else None})
        for i in range(count):
            for j in range(i + 1, count):
                level = ask(pynvml.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j])
                pairs.append({"gpus": (i, j), "level": level, "path": _TOPOLOGY.get(level, "unknown"),
                              "nvlink": gpus[i]["nvlinks"] > 0 and gpus[j]["nvlinks"] > 0})
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return gpus, pairs


# -- the facts, and what they mean -------------------------------------------------------------

@dataclass
class HardwareFacts:
    """The hardware facts the lessons depend on (see the module docstring)."""
    usable_cores: int
    gpu_count: int
    ram_gib: float
    ram_available_gib: float
    dataset_name: str
    dataset_bytes: int
    data_disk: DiskInfo
    cold_read_mb_s: float | None = None
    cold_read_note: str = ""
    gpus: list[dict] = field(default_factory=list)
    gpu_pairs: list[dict] = field(default_factory=list)

    @property
    def cores_per_gpu(self) -> float | None:
        return self.usable_cores / self.gpu_count if self.gpu_count else None

    @property
    def dataset_share_of_ram(self) -> float:
        return self.dataset_bytes / (self.ram_gib * 2**30) if self.ram_gib else float("inf")

    def lines(self) -> list[str]:
        """The facts, one per line."""
        per_gpu = (f"{self.cores_per_gpu:.1f} per GPU ({self.gpu_count} GPU{'s' if self.gpu_count > 1 else ''})"
                   if self.gpu_count else "no GPU: the loader shares them with the training process")
        out = [
            f"cores        {self.usable_cores} usable, {per_gpu}",
            f"RAM          {self.ram_gib:.1f} GiB ({self.ram_available_gib:.1f} available); the dataset "
            f"({self.dataset_name}) is {self.dataset_bytes / 2**20:,.0f} MiB on disk = "
            f"{self.dataset_share_of_ram:.1%} of RAM",
            f"data disk    {self.data_disk.label}"
            + (f", reports itself rotational={self.data_disk.rotational}" if self.data_disk.rotational is not None else ""),
        ]
        if self.cold_read_mb_s is not None:
            out.append(f"cold read    {self.cold_read_mb_s:,.0f} MB/s reading a data file not in the page cache "
                       f"({self.cold_read_note})")
        for g in self.gpus:
            link = (f"PCIe gen {g['pcie_gen']} x{g['pcie_width']} now "
                    f"(max gen {g['pcie_max_gen']} x{g['pcie_max_width']}, {g['pcie_max_gb_per_s'] or 0:.0f} GB/s each way)")
            power = f", power limit {g['power_limit_w']:.0f} W" if g.get("power_limit_w") else ""
            out.append(f"GPU {g['index']}        {g['name']}: {link}, {g['nvlinks']} NVLink links active{power}")
        for p in self.gpu_pairs:
            i, j = p["gpus"]
            out.append(f"GPU {i} <-> {j}   through {p['path']}" + (" and NVLink" if p["nvlink"] else ""))
        if not self.gpus:
            out.append("GPU links    no NVIDIA GPU visible through NVML: PCIe and NVLink are not shown")
        return out

    def meaning(self) -> list[str]:
        """What each fact means for the later lessons, on this machine."""
        out = []
        cpg = self.cores_per_gpu
        if cpg is None:
            out.append(f"- Cores: {self.usable_cores} cores feed the (simulated) device and run the training loop; "
                       "lesson 02 measures how many samples/s each worker adds here.")
        elif cpg < 4:
            out.append(f"- Cores: {cpg:.1f} per GPU is few for CPU-side decoding and augmentation: expect the "
                       "DataLoader to be the bottleneck; lessons 03-04 move that work onto the GPU.")
        else:
            out.append(f"- Cores: {cpg:.1f} per GPU: workers can keep up with light pipelines; JPEG decoding at "
                       "ImageNet sizes may still need DALI's GPU decoder (lesson 04 measures one core's rate).")
        share = self.dataset_share_of_ram
        if share <= 0.5:
            out.append(f"- RAM: the dataset is {share:.1%} of RAM: after the first epoch it is read from the page "
                       "cache, not from the disk, so a RAM disk would add nothing (lesson 01 measures both).")
        else:
            out.append(f"- RAM: the dataset is {share:.0%} of RAM: the page cache cannot keep it, every epoch reads "
                       "it from the disk, and the disk's throughput bounds samples/s (lessons 01 and 04).")
        kind = self.data_disk.kind
        if "virtual" in kind or "overlay" in kind or kind == "unknown":
            disk = (f"- Disk: {kind}. Its 'rotational' flag says nothing about the storage underneath: trust the "
                    "measured read throughput (lesson 01), not the name.")
        elif "network" in kind:
            disk = (f"- Disk: the data is on a {kind}: every read crosses the network; copy it to a local disk "
                    "or use a packed format (lesson 04).")
        elif "HDD" in kind:
            disk = ("- Disk: a rotational disk reads ~100-250 MB/s in sequence but only ~100-200 small random reads "
                    "a second: many small files are its worst case; pack them (lesson 04).")
        else:
            disk = f"- Disk: {kind}: small random reads are cheap; decoding, not reading, is usually the cost."
        out.append(disk)
        if self.gpus:
            slow = [g for g in self.gpus if g["pcie_gen"] and g["pcie_max_gen"] and
                    (g["pcie_gen"] < g["pcie_max_gen"] or (g["pcie_width"] or 0) < (g["pcie_max_width"] or 0))]
            text = ("- PCIe: host-to-GPU copies go through each GPU's link (lesson 03 measures pinned copies against "
                    "its bandwidth; send uint8, not float32).")
            if slow:
                text += (f" GPU {', '.join(str(g['index']) for g in slow)} runs below its maximum link now: GPUs "
                         "lower the link speed when idle, so read it again under load.")
            out.append(text)
            if len(self.gpus) > 1:
                nv = any(p["nvlink"] for p in self.gpu_pairs)
                out.append("- GPU to GPU: " + ("NVLink carries the all-reduce of DDP (lesson 07)." if nv else
                                              "no NVLink: the all-reduce of DDP (lesson 07) crosses PCIe, and "
                                              "through the CPUs where the path above says so."))
        else:
            out.append("- PCIe and NVLink: no GPU here; on a GPU machine this lists each GPU's link and how the "
                       "GPUs connect (what lessons 03 and 07 depend on).")
        return out


def _dataset_files(data_root=None) -> tuple[str, list[Path]]:
    from . import data

    info = data.prepare_cifar10(data_root)
    name = ("synthetic CIFAR-10" if info.synthetic else "CIFAR-10") + " binary files"
    return name, [info.root / f for f in data.TRAIN_FILES + data.TEST_FILES]


def hardware_facts(data_root=None, *, measure_disk: bool = False) -> HardwareFacts:
    """Collect the facts for the course's dataset (prepared if needed). With `measure_disk`, one
    training file is read cold (dropped from the page cache first, see course_utils.io_probe)
    to measure the disk's read throughput (about 30 MB; lesson 00)."""
    import torch

    from .env import usable_cores

    name, files = _dataset_files(data_root)
    vm = psutil.virtual_memory()
    cold, note = None, ""
    if measure_disk:
        from .io_probe import cold_and_warm_read

        result = cold_and_warm_read(files[:1])
        if result.cold is not None:
            cold, note = result.cold.mb_per_s, result.method
        else:
            note = result.method
    gpus, pairs = gpu_links()
    return HardwareFacts(
        usable_cores=usable_cores(),
        gpu_count=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        ram_gib=vm.total / 2**30, ram_available_gib=vm.available / 2**30,
        dataset_name=name, dataset_bytes=sum(f.stat().st_size for f in files),
        data_disk=disk_of(files[0]), cold_read_mb_s=cold, cold_read_note=note, gpus=gpus, gpu_pairs=pairs)


def print_hardware(data_root=None, *, measure_disk: bool = True) -> HardwareFacts:
    """Print the facts and what they mean here, and return them (lesson 00)."""
    facts = hardware_facts(data_root, measure_disk=measure_disk)
    print("\n".join(facts.lines()))
    print()
    print("\n".join(facts.meaning()))
    return facts
