import os
import subprocess
import sys
import time
import types

import numpy as np
import psutil
import pytest
import torch

from course_utils import monitor as monitor_module
from course_utils.monitor import TIMELINE_KINDS, Timeline, UtilizationMonitor, nvml_handle_for, synthetic_timeline

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_monitor_samples_the_simulated_device_and_every_core(sim):
    with UtilizationMonitor(interval_s=0.05, sim=sim) as mon:
        for _ in range(30):
            sim.step()
        sim.synchronize()
        mon.mark("idle from here")
        time.sleep(0.3)
    tl = mon.timeline
    assert len(tl.t_s) >= 5 and tl.cpu_percent.shape == (len(tl.t_s), tl.cores)
    assert tl.simulated and "simulated" in tl.device
    busy, idle = tl.gpu_util[tl.t_s < 0.25], tl.gpu_util[tl.t_s > 0.35]
    assert busy.mean() > 70 and idle.mean() < 20
    assert tl.marks and tl.marks[0][1] == "idle from here"
    fig = tl.plot()
    assert len(fig.axes) == 3   # device, per-core CPU, the course's processes against the others


def test_monitor_without_a_device_still_records_the_cpu():
    with UtilizationMonitor(interval_s=0.05, device="cpu") as mon:
        time.sleep(0.2)
    tl = mon.timeline
    assert tl.gpu_util is None and len(tl.t_s) >= 3 and "the CPU itself" in tl.device
    assert {"samples", "ours_cores_mean", "others_cores_mean"} <= set(tl.summary())


def test_sim_is_the_older_name_of_device(sim):
    assert UtilizationMonitor(sim=sim).sim is sim and UtilizationMonitor(device=sim).sim is sim
    with pytest.raises(ValueError, match="pass the device once"):
        UtilizationMonitor(device="cpu", sim=sim)


def _integrated(tl, values):
    dt = np.diff(np.concatenate([[0.0], tl.t_s]))
    return float(np.sum(np.asarray(values) * dt))


def _cpu_s(proc):
    t = proc.cpu_times()
    return t.user + t.system


def _psutil_children(pid):
    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def test_descendants_walks_the_tree(monkeypatch):
    tree = {1: [2, 3], 2: [4], 3: [], 4: [5], 5: []}
    monkeypatch.setattr(monitor_module, "_children_of", lambda pid: tree.get(pid))
    assert sorted(monitor_module._descendants(1)) == [2, 3, 4, 5]


@pytest.mark.parametrize("scan", ["psutil", "proc-children"])
def test_the_course_processes_are_told_apart_from_the_others(monkeypatch, scan):
    """A busy child (like a DataLoader worker) counts as ours; a busy process that is not our
    descendant counts as other. Integrated over the run, each matches the CPU seconds the
    processes themselves report, whatever else the machine is doing. Both ways of finding
    children: psutil's scan of every process, and /proc/PID/task/*/children (stood in for by
    psutil where this kernel lacks the file)."""
    if scan == "proc-children" and monitor_module._children_of(os.getpid()) is None:
        monkeypatch.setattr(monitor_module, "_children_of", _psutil_children)
    elif scan == "psutil":
        monkeypatch.setattr(monitor_module, "_children_of", lambda pid: None)
    me = psutil.Process()
    # not ours: a shell starts the busy loop in the background and exits, so init adopts it
    outsider = subprocess.run(["sh", "-c", f"{sys.executable} -c '{BUSY.format(s=1.2)}' >/dev/null 2>&1 & echo $!"],
                              capture_output=True, text=True, check=True)
    stranger = psutil.Process(int(outsider.stdout.strip()))
    assert stranger.pid not in {c.pid for c in me.children(recursive=True)}
    me0, stranger0 = _cpu_s(me), _cpu_s(stranger)
    with UtilizationMonitor(interval_s=0.05, device="cpu") as mon:
        assert mon._course.fast == (scan == "proc-children")
        worker = subprocess.Popen([sys.executable, "-c", BUSY.format(s=0.8)])
        worker_proc = psutil.Process(worker.pid)
        worker_s = 0.0
        while worker.poll() is None:
            try:
                worker_s = _cpu_s(worker_proc)
            except psutil.Error:
                pass
            time.sleep(0.05)
        deadline = time.time() + 30
        stranger_s = _cpu_s(stranger)
        while stranger.is_running() and stranger.status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
            stranger_s = _cpu_s(stranger)
            time.sleep(0.05)
    tl = mon.timeline
    ours = _integrated(tl, tl.ours_cores)
    others = _integrated(tl, tl.others_cores)
    my_own = _cpu_s(me) - me0
    # the worker was reaped by Popen.poll: its time reaches us through os.times() too
    assert ours == pytest.approx(my_own + worker_s, rel=0.25, abs=0.15), (ours, my_own, worker_s)
    assert others >= 0.7 * (stranger_s - stranger0), (others, stranger_s - stranger0)
    assert ours < my_own + worker_s + 0.3 * (stranger_s - stranger0)
    s = tl.summary()
    assert s["ours_cores_mean"] > 0 and s["others_cores_mean"] > 0


class _FakeNVML:
    """pynvml with three GPUs in PCI order; records which look-up found the handle."""

    def __init__(self, gpus):
        self.gpus = gpus            # list of (uuid, pci_bus_id)
        self.calls = []
        self.nvmlInit = lambda: None
        self.nvmlShutdown = lambda: None

    def nvmlDeviceGetHandleByIndex(self, i):
        self.calls.append(("index", i))
        return ("handle", i)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.calls.append(("uuid", uuid))
        for i, (u, _) in enumerate(self.gpus):
            if u == uuid:
                return ("handle", i)
        raise RuntimeError("NVML_ERROR_NOT_FOUND")

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        self.calls.append(("pci", bus))
        for i, (_, b) in enumerate(self.gpus):
            if b.lower() == bus.lower():
                return ("handle", i)
        raise RuntimeError("NVML_ERROR_NOT_FOUND")


GPUS = [("GPU-aaaa", "00000000:17:00.0"), ("GPU-bbbb", "00000000:65:00.0"), ("GPU-cccc", "00000000:b3:00.0")]


def _props(uuid=None, bus=None):
    p = types.SimpleNamespace()
    if uuid is not None:
        p.uuid = uuid
    if bus is not None:
        p.pci_domain_id, p.pci_bus_id, p.pci_device_id = 0, bus, 0
    return p


@pytest.mark.parametrize("cuda_index, props, expected, how", [
    # CUDA_VISIBLE_DEVICES=2 (or a local rank's device): cuda:0 is NVML's third GPU, not its first
    (0, _props(uuid="cccc", bus=0xB3), 2, "UUID"),
    (1, _props(uuid="GPU-bbbb"), 1, "UUID"),
    # an older torch without a UUID: the PCI bus id finds it
    (0, _props(bus=0x65), 1, "PCI bus id"),
])
def test_nvml_finds_the_torch_device_by_uuid_or_pci_bus_id(monkeypatch, cuda_index, props, expected, how):
    fake = _FakeNVML(GPUS)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    handle, note = nvml_handle_for(torch.device("cuda", cuda_index))
    assert handle == ("handle", expected) and note == how
    assert not any(kind == "index" for kind, _ in fake.calls), "never by NVML index"


def test_nvml_without_a_match_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNVML(GPUS))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: _props(uuid="dddd", bus=0x01))
    handle, note = nvml_handle_for(torch.device("cuda", 0))
    assert handle is None and "UUID or PCI bus id" in note


def test_the_monitor_reads_the_current_cuda_device_by_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)    # torch.cuda.set_device(local_rank)
    assert UtilizationMonitor().cuda_device == torch.device("cuda", 1)
    assert UtilizationMonitor(device="cuda").cuda_device == torch.device("cuda", 1)
    assert UtilizationMonitor(device="cuda:0").cuda_device == torch.device("cuda", 0)
    assert UtilizationMonitor(device="cpu").cuda_device is None


@pytest.mark.parametrize("kind", TIMELINE_KINDS)
def test_synthetic_timelines_have_their_signature(kind):
    tl = synthetic_timeline(kind, cores=8, rng=np.random.default_rng(1))
    s = tl.summary()
    if kind == "compute-bound":
        assert s["device_util_mean_percent"] > 90
    else:
        assert s["device_util_mean_percent"] < 70
    assert (s["cpu_mean_percent"] > 85) == (kind == "input-bound")
    assert tl.simulated


def test_synthetic_timeline_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="kind must be one of"):
        synthetic_timeline("memory-bound")


def test_timeline_summary_by_hand():
    tl = Timeline(t_s=np.arange(3.0), cpu_percent=np.array([[100, 0], [100, 0], [100, 0]]), gpu_util=np.array([10, 20, 30]))
    s = tl.summary()
    assert s["cpu_mean_percent"] == 50 and s["cpu_busiest_core_percent"] == 100
    assert s["device_util_mean_percent"] == 20


def test_a_child_found_late_is_counted_from_its_birth():
    """A child found by a later scan (a DataLoader worker started between two scans) hands back
    the CPU time it used before it was found: spread from its birth, not from the scan before (a
    sweep of workers showed their first tenths of a second as other processes' time)."""
    if monitor_module._age_s(os.getpid()) is None:
        pytest.skip("needs /proc/PID/stat and /proc/uptime (Linux)")
    course = monitor_module._CourseProcesses(rescan_s=0.6)
    course.start()
    course.read()
    time.sleep(0.3)
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n"
                              "time.sleep(5)"])
    born = time.perf_counter() - course._start_perf
    try:
        # on a loaded machine (CI) the child may not have run at all 0.5 s after its start: wait until
        # it has used CPU time to hand back (a fixed sleep read 0.0 s of it once)
        deadline = time.monotonic() + 20
        while psutil.Process(child.pid).cpu_times().user + psutil.Process(child.pid).cpu_times().system < 0.1:
            assert time.monotonic() < deadline, "the child never ran"
            time.sleep(0.05)
        course.rescan_now()
        _, late = course.read()
    finally:
        child.kill()
        child.wait()
    since = [s for s, seconds in late if seconds > 0]
    assert since and since[0] == pytest.approx(born, abs=0.05), (late, born)


def test_the_age_of_a_process():
    if monitor_module._age_s(os.getpid()) is None:
        pytest.skip("needs /proc/PID/stat and /proc/uptime (Linux)")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    try:
        time.sleep(0.5)
        assert monitor_module._age_s(child.pid) == pytest.approx(0.5, abs=0.1)
    finally:
        child.kill()
        child.wait()
    assert monitor_module._age_s(2**22 + 12345) is None          # no such process


def test_the_busy_share_comes_from_two_readings_not_from_psutils_per_thread_state():
    """psutil 7 keeps cpu_percent's last reading per thread: a monitor primed in one thread and
    sampled in another read 0% in its first sample (issue 35). The busy share is computed from two
    cpu_times readings; a core whose counters did not tick keeps its previous value."""
    from collections import namedtuple
    from course_utils.monitor import _busy_percent
    T = namedtuple("T", "user nice system idle iowait irq softirq steal guest guest_nice")
    a = [T(10, 0, 5, 100, 0, 0, 0, 0, 0, 0), T(10, 0, 0, 100, 0, 0, 0, 0, 0, 0)]
    b = [T(13, 0, 6, 101, 0, 0, 0, 0, 1, 0), T(10, 0, 0, 100, 0, 0, 0, 0, 0, 0)]
    assert _busy_percent(a, b, previous=[0.0, 42.0]) == pytest.approx([80.0, 42.0])


def test_the_first_sample_of_a_busy_loop_is_not_zero():
    import time as _time
    with UtilizationMonitor(interval_s=0.05) as mon:
        end = _time.perf_counter() + 0.3
        while _time.perf_counter() < end:
            pass
    tl = mon.timeline
    assert tl.cpu_percent[0].max() > 20, tl.cpu_percent[:3]


def test_synthetic_timelines_carry_the_course_s_own_cores():
    for kind, low, high in (("input-bound", 0.85, 1.0), ("sync-bound", 0.0, 0.6), ("compute-bound", 0.0, 0.7)):
        for cores in (2, 8, 32):
            tl = synthetic_timeline(kind, cores=cores, rng=np.random.default_rng(cores))
            share = tl.ours_cores.mean() / cores
            assert low <= share <= high, (kind, cores, share)
            assert (tl.ours_cores <= tl.cpu_percent.sum(axis=1) / 100 + 1e-9).all()
    busy = synthetic_timeline("sync-bound", cores=2, rng=np.random.default_rng(0), others=1.0)
    assert busy.cpu_percent.mean() > 90 and busy.ours_cores.mean() < 1.2           # a shared machine


def test_a_big_nodes_cores_are_a_band_and_nvml_readings_say_what_they_are():
    """x-03 D3/D5: a line per core is unreadable on a 200-core node; NVML's utilisation is 'any kernel
    running' and its memory is MiB used by every process, contexts included."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.arange(20) * 0.1
    timeline = monitor_module.Timeline(t_s=t, cpu_percent=np.random.default_rng(0).uniform(0, 100, (20, 224)),
                                       gpu_util=np.full(20, 50.0), gpu_mem_mb=np.full(20, 900.0), device="cuda:0")
    fig = timeline.plot()
    dev_ax, cpu_ax = fig.axes[0], fig.axes[1]
    assert len(cpu_ax.lines) == 1 and "224 cores" in " ".join(h.get_label() for h in cpu_ax.collections)
    assert "any kernel running" in dev_ax.get_ylabel()
    assert any("MiB" in a.get_ylabel() and "CUDA contexts" in a.get_ylabel() for a in fig.axes)
    plt.close(fig)
    small = monitor_module.Timeline(t_s=t, cpu_percent=np.zeros((20, 4)))
    fig = small.plot()
    assert len(fig.axes[1].lines) == 4
    plt.close(fig)


def test_cores_on_top_of_each_other_are_said_to_be():
    """w3-01: both cores at 100% the whole run, one line hidden under the other; the panel says so."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from course_utils.monitor import synthetic_timeline

    t = synthetic_timeline("input-bound", cores=2, seconds=3, rng=np.random.default_rng(0))
    t.cpu_percent = np.full_like(np.asarray(t.cpu_percent, dtype=float), 100.0)
    fig = t.plot()
    assert any("lie on top of each other" in x.get_text() for x in fig.axes[1].texts)
    plt.close(fig)
    t.cpu_percent[:, 1] = 50.0
    fig = t.plot()
    assert not any("lie on top" in x.get_text() for x in fig.axes[1].texts)
    plt.close(fig)
