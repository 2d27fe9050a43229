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

`disk_of(path)` (from `course_utils.disks`, kept importable from here) names the block device
and file system behind any path. GPUs are the ones PyTorch sees, matched in NVML by UUID (NVML
numbers every GPU of the machine in PCI order and ignores `CUDA_VISIBLE_DEVICES`); NVLink is
decided per pair of GPUs (NVML's peer-to-peer status over NVLink). Every NVML query goes through
`monitor.nvml_call`: what NVML does not report is "not reported", never an error. Nothing here
needs root.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .disks import NETWORK_FILESYSTEMS, DiskInfo, _disk_kind, disk_of
from .io_probe import cold_and_warm_read
from .monitor import nvml_call, nvml_close, nvml_constant, nvml_find, nvml_open, nvml_text

__all__ = ["DiskInfo", "disk_of", "gpu_links", "pcie_gb_per_s", "HardwareFacts", "hardware_facts",
           "print_hardware", "PCIE_GB_PER_S_PER_LANE", "NETWORK_FILESYSTEMS"]

# Usable bandwidth per lane and direction, after line encoding (PCIe 1-2: 8b/10b; 3-5: 128b/130b;
# 6: PAM4 with FLIT, about 7.56). A x16 link carries 16 times this each way; real copies reach
# about 80% of it.
PCIE_GB_PER_S_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.56}


def pcie_gb_per_s(generation: int | None, width: int | None) -> float | None:
    """Theoretical one-way bandwidth of a PCIe link in GB/s (None when either is unknown)."""
    if not generation or not width or generation not in PCIE_GB_PER_S_PER_LANE:
        return None
    return PCIE_GB_PER_S_PER_LANE[generation] * width


# -- GPU links, through NVML ------------------------------------------------------------------

_TOPOLOGY = {0: "the same board", 10: "one PCIe switch", 20: "several PCIe switches",
             30: "the same PCIe host bridge (CPU)", 40: "the same NUMA node, different host bridges",
             50: "different CPU sockets (across the CPUs' interconnect)"}


def _visible_gpus() -> list[tuple[int, object | None, str, str | None]]:
    """(index, NVML handle or None, how it was found, PyTorch's name) for each GPU PyTorch sees,
    NVML already started. Without a CUDA torch (or with every GPU hidden), NVML's own list, in
    its PCI order, index None: those GPUs are not the lessons' `cuda:N`."""
    import torch

    found = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            handle, how = nvml_find(torch.device("cuda", i))
            try:
                name = torch.cuda.get_device_name(i)
            except Exception:
                name = None
            found.append((i, handle, how, name))
        return found
    count = nvml_call("nvmlDeviceGetCount") or 0
    for n in range(int(count)):
        handle = nvml_call("nvmlDeviceGetHandleByIndex", n)
        if handle is not None:
            found.append((None, handle, f"NVML index {n}", None))
    return found


def _nvlink_between(a, b) -> bool | None:
    """Whether NVLink connects GPUs `a` and `b` (NVML handles): their peer-to-peer status over
    NVLink, asked for this pair (a GPU with NVLink to a third GPU, or to an NVSwitch port left
    down, says nothing about this pair). None when NVML does not report it."""
    status = nvml_call("nvmlDeviceGetP2PStatus", a, b, nvml_constant("NVML_P2P_CAPS_INDEX_NVLINK", 2))
    if status is None:
        return None
    return status == nvml_constant("NVML_P2P_STATUS_OK", 0)


def gpu_links() -> tuple[list[dict], list[dict]]:
    """Per GPU PyTorch sees (`cuda:N`, matched in NVML by UUID): name, PCIe generation and width
    (current and maximum), their bandwidth, active NVLink links and power limit; per pair of
    GPUs, the PCIe path between them and whether NVLink joins that pair. Read through NVML
    (nvidia-ml-py); ([], []) without an NVIDIA driver. A value NVML does not report (an older
    binding, a vGPU, a MIG slice) is None, shown as "not reported" (lesson 00)."""
    if nvml_open() is not None:
        return [], []
    gpus, pairs, handles = [], [], []
    try:
        for index, h, how, torch_name in _visible_gpus():
            handles.append(h)
            name = nvml_text(nvml_call("nvmlDeviceGetName", h)) if h is not None else None
            links = None
            if h is not None:
                for link in range(int(nvml_constant("NVML_NVLINK_MAX_LINKS", 18))):
                    state = nvml_call("nvmlDeviceGetNvLinkState", h, link)
                    if state is None:
                        break
                    links = (links or 0) + int(bool(state))
            ask = (lambda fn: nvml_call(fn, h) if h is not None else None)
            power_mw = ask("nvmlDeviceGetEnforcedPowerManagementLimit")
            gen, width = ask("nvmlDeviceGetCurrPcieLinkGeneration"), ask("nvmlDeviceGetCurrPcieLinkWidth")
            max_gen, max_width = ask("nvmlDeviceGetMaxPcieLinkGeneration"), ask("nvmlDeviceGetMaxPcieLinkWidth")
            gpus.append({"index": index, "name": name or torch_name or "an NVIDIA GPU", "nvml": how if h is not None
                         else f"not found in NVML ({how})", "pcie_gen": gen, "pcie_width": width,
                         "pcie_max_gen": max_gen, "pcie_max_width": max_width, "pcie_gb_per_s": pcie_gb_per_s(gen, width),
                         "pcie_max_gb_per_s": pcie_gb_per_s(max_gen, max_width), "nvlinks": links,
                         "power_limit_w": power_mw / 1000 if power_mw else None})
        for i in range(len(gpus)):
            for j in range(i + 1, len(gpus)):
                a, b = handles[i], handles[j]
                both = a is not None and b is not None
                level = nvml_call("nvmlDeviceGetTopologyCommonAncestor", a, b) if both else None
                pairs.append({"gpus": (gpus[i]["index"], gpus[j]["index"]), "level": level,
                              "path": _TOPOLOGY.get(level, "not reported"),
                              "nvlink": _nvlink_between(a, b) if both else None})
    finally:
        nvml_close()
    return gpus, pairs


def _gpu_name(index) -> str:
    return f"GPU {index}" if index is not None else "GPU (not visible to PyTorch)"


def _link_text(g: dict) -> str:
    """A GPU's PCIe link now and at most, with "not reported" for what NVML did not say."""
    now = (f"PCIe gen {g['pcie_gen']} x{g['pcie_width']} now" if g.get("pcie_gen") and g.get("pcie_width")
           else "PCIe link not reported")
    if g.get("pcie_max_gen") and g.get("pcie_max_width"):
        top = f"max gen {g['pcie_max_gen']} x{g['pcie_max_width']}"
        if g.get("pcie_max_gb_per_s"):
            top += f", {g['pcie_max_gb_per_s']:.0f} GB/s each way"
        return f"{now} ({top})"
    return now


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
            out.append(f"{_gpu_name(g['index']):13s}{g['name']}: {_link_text(g)}, " + (
                "NVLink not reported" if g.get("nvlinks") is None else f"{g['nvlinks']} NVLink links active")
                + (f", power limit {g['power_limit_w']:.0f} W" if g.get("power_limit_w") else ", power limit not reported"))
        for p in self.gpu_pairs:
            i, j = p["gpus"]
            nvlink = {True: "; NVLink joins them", False: "; no NVLink between them",
                      None: "; NVLink between them not reported"}[p["nvlink"]]
            out.append(f"{_gpu_name(i)} <-> {_gpu_name(j)}   through {p['path']}{nvlink}")
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
                linked = [p["nvlink"] for p in self.gpu_pairs]
                if linked and all(v is True for v in linked):
                    text = "NVLink joins every pair: it carries the all-reduce of DDP (lesson 07)."
                elif any(v is True for v in linked):
                    text = ("NVLink joins only some pairs (listed above): DDP's ring all-reduce (lesson 07) runs at "
                            "the speed of its slowest hop, which crosses PCIe.")
                elif any(v is False for v in linked):
                    text = ("no NVLink: the all-reduce of DDP (lesson 07) crosses PCIe, and through the CPUs where "
                            "the path above says so.")
                else:
                    text = ("NVML did not report NVLink between these GPUs: `nvidia-smi topo -m` shows the links "
                            "the all-reduce of DDP (lesson 07) uses.")
                out.append("- GPU to GPU: " + text)
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
