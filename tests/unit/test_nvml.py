"""Every NVML query of the course survives an NVML binding that reports almost nothing.

On the first GPU box, lesson 00 died on `module 'pynvml' has no attribute
'nvmlDeviceGetEnforcedPowerManagementLimit'`: the attribute was looked up outside the guard.
Here the binding has only nvmlInit/nvmlShutdown, the device count and the handles (or, worse,
every query raises NVMLError), PyTorch sees two GPUs, and the hardware report, the monitor,
the live view, the report card and print_env must run, saying "not reported" where NVML said
nothing.
"""
import sys
import time
import types

import numpy as np
import pytest
import torch

from course_utils import env, hardware, monitor, report
from course_utils.live import LiveMonitor

UUIDS = ["GPU-aaaa", "GPU-bbbb"]


class NVMLError(Exception):
    pass


def minimal_nvml(*, raising: bool = False):
    """A pynvml with nvmlInit, nvmlShutdown, the device count and the three ways to a handle,
    nothing else; with `raising`, also every query the course makes, each raising NVMLError."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(UUIDS)
    m.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)

    def by_uuid(uuid):
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        if uuid not in UUIDS:
            raise NVMLError("Not Found")
        return ("h", UUIDS.index(uuid))
    m.nvmlDeviceGetHandleByUUID = by_uuid

    def by_pci(bus):
        raise NVMLError("Not Found")
    m.nvmlDeviceGetHandleByPciBusId = by_pci
    if raising:
        def fail(*args):
            raise NVMLError("Not Supported")
        for name in ("nvmlDeviceGetName", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetEnforcedPowerManagementLimit",
                     "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
                     "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
                     "nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetP2PStatus", "nvmlDeviceGetUtilizationRates",
                     "nvmlDeviceGetMemoryInfo", "nvmlSystemGetDriverVersion"):
            setattr(m, name, fail)
    return m


def fake_torch_gpus(monkeypatch, n=2):
    """PyTorch sees `n` GPUs (names, memory, capability 9.0, the UUIDs above); nothing runs on them."""
    def props(i):
        return types.SimpleNamespace(name=f"Fake GPU {i}", total_memory=80 * 2**30, multi_processor_count=132,
                                     major=9, minor=0, uuid=UUIDS[i][4:])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: props(i).name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (props(i).major, props(i).minor))


@pytest.fixture(params=["minimal", "raising"])
def poor_nvml(request, monkeypatch):
    fake_torch_gpus(monkeypatch)
    monkeypatch.setitem(sys.modules, "pynvml", minimal_nvml(raising=request.param == "raising"))


def test_nvml_call_never_raises(poor_nvml):
    assert monitor.nvml_call("nvmlDeviceGetEnforcedPowerManagementLimit", ("h", 0)) is None
    assert monitor.nvml_call("nvmlNoSuchFunction") is None
    assert monitor.nvml_call("nvmlDeviceGetCount") == 2
    assert monitor.nvml_reading(("h", 0)) == (None, None)


def test_the_hardware_report_says_not_reported(poor_nvml, capsys):
    gpus, pairs = hardware.gpu_links()
    assert [g["index"] for g in gpus] == [0, 1] and [g["name"] for g in gpus] == ["Fake GPU 0", "Fake GPU 1"]
    assert all(g["pcie_gen"] is None and g["nvlinks"] is None and g["power_limit_w"] is None for g in gpus)
    assert pairs == [{"gpus": (0, 1), "level": None, "path": "not reported", "nvlink": None}]
    facts = hardware.print_hardware(measure_disk=False)
    out = capsys.readouterr().out
    assert facts.gpu_count == 2 and "PCIe link not reported" in out and "NVLink not reported" in out
    assert "power limit not reported" in out and "NVLink between them not reported" in out
    assert "NVML did not report NVLink" in out


def test_the_monitor_and_the_live_view_run_without_readings(poor_nvml, capsys):
    with monitor.UtilizationMonitor(0.02, device="cuda:1") as mon:
        time.sleep(0.1)
    tl = mon.timeline
    assert "found in NVML by UUID" in tl.device and "did not report its name" in tl.device
    assert tl.gpu_util is None or np.isnan(tl.gpu_util).all()
    tl.summary()
    with LiveMonitor(device="cuda:0", interval_s=0.02, title="poor NVML", final_plot=False) as live:
        time.sleep(0.1)
    assert "poor NVML" in capsys.readouterr().out and live.timeline.t_s.size


def test_the_report_card_and_print_env(poor_nvml, capsys):
    facts = report.machine_facts()
    assert facts["driver"] is None and len(facts["gpus"]) == 2
    assert facts["gpus"][0]["capability"] == "9.0" and facts["gpus"][0]["bf16_native"] is True
    assert env.has_nvml()
    env.print_env()
    assert "Fake GPU 1" in capsys.readouterr().out


def test_a_binding_with_only_handles_by_index(monkeypatch, capsys):
    """No UUID look-up at all: the GPUs are still listed (from PyTorch), found in NVML or not."""
    fake_torch_gpus(monkeypatch)
    m = minimal_nvml()
    del m.nvmlDeviceGetHandleByUUID, m.nvmlDeviceGetHandleByPciBusId
    monkeypatch.setitem(sys.modules, "pynvml", m)
    gpus, pairs = hardware.gpu_links()
    assert [g["name"] for g in gpus] == ["Fake GPU 0", "Fake GPU 1"] and "not found in NVML" in gpus[0]["nvml"]
    assert pairs[0]["nvlink"] is None
    handle, why = monitor.nvml_handle_for(torch.device("cuda", 0))
    assert handle is None and "UUID or PCI bus id" in why
    with monitor.UtilizationMonitor(0.02, device="cuda:0") as mon:
        time.sleep(0.05)
    assert mon.timeline.gpu_util is None and "no NVML readings" in mon.timeline.device


def test_without_nvml_at_all(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)       # `import pynvml` raises ImportError
    assert monitor.nvml_open().startswith("NVML not available")
    assert hardware.gpu_links() == ([], []) and report._driver_version() is None and not env.has_nvml()


@pytest.mark.xfail(strict=True, reason="data_parallel.PerDeviceMonitor and gpu_memory call NVML outside a guard "
                   "(data_parallel.py is l0406's: the change is to use monitor.nvml_open/nvml_find/nvml_reading/"
                   "nvml_close; remove this marker with it)")
def test_lesson_06_monitors_survive_a_poor_nvml(poor_nvml, monkeypatch):
    from course_utils import data_parallel
    for name in ("max_memory_allocated", "memory_allocated", "memory_reserved"):
        monkeypatch.setattr(torch.cuda, name, lambda i=None: 0)
    rows = data_parallel.gpu_memory([0, 1])
    assert [r["nvml_used_mib"] for r in rows] == [None, None]
    with data_parallel.PerDeviceMonitor([0, 1], interval_s=0.02) as mon:
        time.sleep(0.06)
    assert mon.t_s and len(mon.util[0]) == 2
