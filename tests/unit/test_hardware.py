"""course_utils.hardware: the disk behind a path, GPU links through NVML, the facts (lesson 00)."""
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from course_utils import hardware
from course_utils.disks import _disk_kind
from course_utils.hardware import DiskInfo, disk_of, hardware_facts, pcie_gb_per_s


def test_disk_of_names_the_storage_of_a_path(tmp_path):
    info = disk_of(tmp_path)
    assert isinstance(info, DiskInfo) and info.path == str(tmp_path)
    if sys.platform.startswith("linux"):
        assert info.fstype != "?" and info.mount.startswith("/") and str(tmp_path).startswith(info.mount)
    assert info.kind in info.label


@pytest.mark.parametrize("fstype, disk, rotational, words", [
    ("tmpfs", None, None, "RAM"), ("nfs4", None, None, "network"), ("overlay", None, None, "overlay"),
    ("ext4", "nvme0n1", False, "NVMe"), ("ext4", "vda", True, "virtual"), ("xfs", "sda", True, "HDD"),
    ("xfs", "sdb", False, "SSD"), ("ext4", "loop3", False, "loop"), ("ext4", "md0", None, "RAID"),
    ("fuse.s3fs", None, None, "network"), ("ext4", None, None, "unknown"),
])
def test_disk_kinds(fstype, disk, rotational, words):
    assert words in _disk_kind(fstype, disk, rotational)


def test_pcie_bandwidth():
    assert pcie_gb_per_s(4, 16) == pytest.approx(31.5, rel=0.01)
    assert pcie_gb_per_s(3, 8) == pytest.approx(7.88, rel=0.01)
    assert pcie_gb_per_s(None, 16) is None and pcie_gb_per_s(9, 16) is None


# NVML's GPUs in PCI order: (uuid, name, current PCIe generation); NVLink joins NVML GPUs 0 and 2 only
NVML_GPUS = [("GPU-aaaa", b"Fake H100 A", 5), ("GPU-bbbb", b"Fake H100 B", 4), ("GPU-cccc", b"Fake H100 C", 1)]
NVLINKED = {frozenset({0, 2})}


def _fake_nvml(nvlinks=4):
    """A full pynvml over NVML_GPUS: handles are NVML indices."""
    m = types.ModuleType("pynvml")
    m.NVML_NVLINK_MAX_LINKS = 6
    m.NVML_P2P_CAPS_INDEX_NVLINK, m.NVML_P2P_STATUS_OK, m.NVML_P2P_STATUS_NOT_SUPPORTED = 2, 0, 5
    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(NVML_GPUS)
    m.nvmlDeviceGetHandleByIndex = lambda i: i

    def by_uuid(uuid):
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, g in enumerate(NVML_GPUS):
            if g[0] == uuid:
                return i
        raise RuntimeError("NVML_ERROR_NOT_FOUND")
    m.nvmlDeviceGetHandleByUUID = by_uuid
    m.nvmlDeviceGetName = lambda h: NVML_GPUS[h][1]
    m.nvmlDeviceGetNvLinkState = lambda h, link: 1 if link < nvlinks and h != 1 else 0
    m.nvmlDeviceGetEnforcedPowerManagementLimit = lambda h: 700_000
    m.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: NVML_GPUS[h][2]
    m.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 50
    m.nvmlDeviceGetP2PStatus = lambda a, b, what: 0 if what == 2 and frozenset({a, b}) in NVLINKED else 5
    return m


def _visible(monkeypatch, nvml_indices):
    """PyTorch sees these NVML GPUs, in this order (CUDA_VISIBLE_DEVICES=2,0 gives [2, 0])."""
    def props(i):
        uuid, name, _ = NVML_GPUS[nvml_indices[i]]
        return types.SimpleNamespace(uuid=uuid[4:], name=name.decode())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(nvml_indices))
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: props(i).name)


def test_gpu_links_match_the_visible_gpus_by_uuid(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    _visible(monkeypatch, [2, 0])               # CUDA_VISIBLE_DEVICES=2,0: cuda:0 is NVML's GPU 2
    gpus, pairs = hardware.gpu_links()
    assert [(g["index"], g["name"], g["pcie_gen"]) for g in gpus] == [(0, "Fake H100 C", 1), (1, "Fake H100 A", 5)]
    assert gpus[1]["pcie_gb_per_s"] == pytest.approx(63.0, rel=0.01) and gpus[0]["nvml"] == "UUID"
    assert gpus[1]["nvlinks"] == 4 and gpus[1]["power_limit_w"] == 700
    assert pairs == [{"gpus": (0, 1), "level": 50, "path": hardware._TOPOLOGY[50], "nvlink": True}]


def test_nvlink_is_decided_per_pair(monkeypatch):
    """GPUs 0 and 1 both have active NVLink links, but not to each other: no NVLink for that pair."""
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    _visible(monkeypatch, [0, 1, 2])
    nvml = sys.modules["pynvml"]
    nvml.nvmlDeviceGetNvLinkState = lambda h, link: 1 if link < 4 else 0      # every GPU has links up
    gpus, pairs = hardware.gpu_links()
    assert all(g["nvlinks"] == 4 for g in gpus)
    assert {p["gpus"]: p["nvlink"] for p in pairs} == {(0, 1): False, (0, 2): True, (1, 2): False}
    facts = hardware_facts()
    facts.gpu_count, facts.gpus, facts.gpu_pairs = 3, gpus, pairs
    text = "\n".join(facts.lines() + facts.meaning())
    assert "GPU 0 <-> GPU 2" in text and "NVLink joins them" in text and "no NVLink between them" in text
    assert "NVLink joins only some pairs" in text


def test_gpu_links_without_torch_cuda_list_nvml_gpus(monkeypatch):
    """A CPU-only torch on a GPU machine: NVML's GPUs, marked as not PyTorch's cuda:N."""
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    gpus, pairs = hardware.gpu_links()
    assert [g["index"] for g in gpus] == [None] * 3 and gpus[0]["nvml"] == "NVML index 0"
    assert len(pairs) == 3


def test_io_probe_and_hardware_do_not_import_each_other():
    code = ("import sys, course_utils.io_probe; assert 'course_utils.hardware' not in sys.modules; "
            "import course_utils.hardware as h, course_utils.disks as d; assert h.disk_of is d.disk_of")
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, env={"PYTHONPATH": str(root), "PATH": ""})


def test_gpu_links_without_a_driver(monkeypatch):
    broken = types.ModuleType("pynvml")

    def fail():
        raise RuntimeError("NVML Shared Library Not Found")
    broken.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert hardware.gpu_links() == ([], [])


def test_facts_and_what_they_mean(monkeypatch):
    facts = hardware_facts(measure_disk=True)
    assert facts.usable_cores >= 1 and facts.ram_gib > 0 and facts.dataset_bytes == 6 * 30_730_000
    text = "\n".join(facts.lines() + facts.meaning())
    for word in ("cores", "RAM", "data disk", "- Disk:", "- RAM:"):
        assert word in text
    if facts.cold_read_mb_s is not None:
        assert "cold read" in text and facts.cold_read_mb_s > 0
    # the same facts on a made-up 2-GPU machine, one GPU idling at a low PCIe generation
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    _visible(monkeypatch, [0, 2])
    gpus, pairs = hardware.gpu_links()
    facts.gpu_count, facts.gpus, facts.gpu_pairs, facts.usable_cores = 2, gpus, pairs, 16
    text = "\n".join(facts.lines() + facts.meaning())
    assert "8.0 per GPU" in text and "GPU 1 runs below its maximum link" in text
    assert "NVLink joins every pair" in text
    facts.dataset_bytes = int(facts.ram_gib * 2**30)
    assert "every epoch reads it from the disk" in "\n".join(facts.meaning())
