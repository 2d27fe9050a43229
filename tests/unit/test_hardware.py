"""course_utils.hardware: the disk behind a path, GPU links through NVML, the facts (lesson 00)."""
import sys
import types

import pytest

from course_utils import hardware
from course_utils.hardware import DiskInfo, _disk_kind, disk_of, hardware_facts, pcie_gb_per_s


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


def _fake_nvml(gpus=2, nvlinks=4):
    m = types.ModuleType("pynvml")
    m.NVML_NVLINK_MAX_LINKS = 6
    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: gpus
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: b"Fake H100"
    m.nvmlDeviceGetNvLinkState = lambda h, link: 1 if link < nvlinks else 0
    m.nvmlDeviceGetEnforcedPowerManagementLimit = lambda h: 700_000
    m.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 1 if h == 1 else 5     # GPU 1 idles at gen 1
    m.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 50
    return m


def test_gpu_links_through_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    gpus, pairs = hardware.gpu_links()
    assert [g["name"] for g in gpus] == ["Fake H100", "Fake H100"]
    assert gpus[0]["pcie_gen"] == 5 and gpus[0]["pcie_gb_per_s"] == pytest.approx(63.0, rel=0.01)
    assert gpus[0]["nvlinks"] == 4 and gpus[0]["power_limit_w"] == 700
    assert pairs == [{"gpus": (0, 1), "level": 50, "path": hardware._TOPOLOGY[50], "nvlink": True}]


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
    gpus, pairs = hardware.gpu_links()
    facts.gpu_count, facts.gpus, facts.gpu_pairs, facts.usable_cores = 2, gpus, pairs, 16
    text = "\n".join(facts.lines() + facts.meaning())
    assert "8.0 per GPU" in text and "GPU 1 runs below its maximum link" in text and "NVLink" in text
    facts.dataset_bytes = int(facts.ram_gib * 2**30)
    assert "every epoch reads it from the disk" in "\n".join(facts.meaning())
