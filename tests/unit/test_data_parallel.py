import itertools
import time

import pytest
import torch

from course_utils.data_parallel import (HOST, HostWork, PerDeviceMonitor, SimulatedDataParallel, StageClock,
                                        measure_dp_costs, plot_schedule, replica_launch_ms)
from course_utils.models import resnet18_cifar
from course_utils.scaling import StageCosts, predict_dp
from course_utils.sim import H100
from course_utils.train import train


def costs(**kw):
    base = dict(compute_fixed_ms=2.0, compute_per_sample_ms=0.05, scatter_ms_per_sample=0.002,
                gather_ms_per_sample=0.001, replicate_ms=1.0, reduce_ms=1.5, device0_ms=0.5)
    base.update(kw)
    return StageCosts(**base)


def batch(n):
    return torch.zeros(n, 3, 4, 4), torch.zeros(n, dtype=torch.long)


def test_steps_are_asynchronous_and_follow_the_schedule():
    c = costs()
    dp = SimulatedDataParallel(4, c)
    t0 = time.perf_counter()
    for _ in range(3):
        dp.step(batch(128))
    launched = time.perf_counter() - t0
    dp.synchronize()
    total = time.perf_counter() - t0
    step_ms = predict_dp(c, 4, 128).device_ms
    assert launched < 0.005, "launching must not wait for the devices"
    devices = [i for i in dp.trace if i.device >= 0]
    span_ms = (max(i.end_s for i in devices) - min(i.start_s for i in devices)) * 1e3
    assert span_ms == pytest.approx(3 * step_ms, rel=1e-6), "three steps back to back, as predicted"
    assert 3 * step_ms * 0.98 <= total * 1e3 <= 3 * step_ms + 25, "synchronize waits for them (no longer)"
    stages = {(i.device, i.stage) for i in dp.trace}
    assert (0, "scatter") in stages and (3, "forward") in stages and (3, "reduce") in stages
    assert (0, "gather + loss") in stages and (1, "optimizer (device 0)") not in stages
    busy = dp.busy_seconds_per_device()
    assert busy[0] > busy[1] > 0


def test_uneven_batches_leave_devices_idle_and_one_device_is_a_pass_through():
    dp = SimulatedDataParallel(4, costs())
    dp.step(batch(5))                    # pieces 2, 2, 1
    dp.synchronize()
    assert dp.busy_seconds_per_device()[3] == 0.0
    one = SimulatedDataParallel(1, costs())
    one.step(batch(64))
    one.synchronize()
    assert {i.stage for i in one.trace if i.device >= 0} == {"forward", "backward", "optimizer (device 0)"}
    assert [i.stage for i in one.trace if i.device == HOST] == ["host: launches and Python"]
    assert one.busy_seconds() * 1e3 == pytest.approx(costs().compute_ms(64) + 0.5, rel=0.01)
    with pytest.raises(ValueError):
        one.step(None)


def test_trains_through_the_course_loop_with_device_events():
    c = costs()
    dp = SimulatedDataParallel(2, c)
    result = train(None, itertools.repeat(batch(64)), device=dp, steps=12, progress=False)
    expected = predict_dp(c, 2, 64).samples_per_s
    assert result.stats.samples_per_s == pytest.approx(expected, rel=0.2)
    assert result.stats.device_ms and "simulated" in result.stats.device


def test_run_charges_device0_per_kernel_and_byte_and_back_pressure():
    dp = SimulatedDataParallel(2, costs(), kernel_us=1000.0, bandwidth_gbs=1.0, max_queued_steps=1)
    x = torch.ones(250_000)                        # 1 MB
    out = dp.run(lambda t: t + 1, x)               # one kernel: 1 ms + 2 MB at 1 GB/s = 3 ms
    assert torch.equal(out, x + 1)
    dp.synchronize()
    busy = dp.busy_seconds_per_device()
    assert busy[1] == 0.0 and busy[0] * 1e3 == pytest.approx(3.0, rel=1e-6)
    t0 = time.perf_counter()
    dp.step(batch(64))
    dp.step(batch(64))                   # the queue holds one step: this one waits for the first
    assert time.perf_counter() - t0 >= predict_dp(costs(), 2, 64).device_ms / 1e3 * 0.8


def test_host_work_is_real_and_costs_are_measured():
    model = resnet18_cifar(width=4)
    host = HostWork(model)
    assert host.per_replica_ms(replicas=2, repeats=2) > 0
    c = measure_dp_costs(model, torch.randn(3, 32, 32), host_work=host, link_gb_s=10.0)
    params = sum(p.numel() * 4 for p in model.parameters())
    assert c.replicate_ms > params / 10e6            # parameters and buffers at 10 GB/s (bytes per ms)
    assert c.scatter_ms_per_sample == pytest.approx(3 * 32 * 32 * 4 / 10e6)
    assert c.gather_ms_per_sample == pytest.approx(2 * 10 * 4 / 10e6)
    assert "measured" in c.notes["replicate_ms"] and "H100" in c.notes["compute_fixed_ms"]
    assert c.host_step_ms == pytest.approx(H100.eager_host_ms["fp32"]) and "launch time" in c.notes["host_step_ms"]
    assert c.host_ms_per_replica > replica_launch_ms(c) > 0          # replicate's Python + the lock-holding launch


def test_host_work_runs_torchs_replicate_without_device_copies_and_leaves_it_alone():
    """x-06 finding 2: the host's work per replica is torch's own replicate (its broadcast left
    out), not a stand-in; torch's module is as it was afterwards."""
    import importlib
    rep = importlib.import_module("torch.nn.parallel.replicate")
    before = rep._broadcast_coalesced_reshape
    calls = []
    model = resnet18_cifar(width=2)
    original = torch.nn.Module._replicate_for_data_parallel

    def counting(self):
        calls.append(self)
        return original(self)
    torch.nn.Module._replicate_for_data_parallel = counting
    try:
        HostWork(model)(3)
    finally:
        torch.nn.Module._replicate_for_data_parallel = original
    assert len(calls) == 3 * len(list(model.modules()))
    assert rep._broadcast_coalesced_reshape is before


def test_one_simulated_device_is_the_course_simulated_accelerator():
    """x-06 finding 1: SimulatedDataParallel(1) and default_sim() (lessons 01-05) train the same
    ResNet-18 at batch 128 at the same pace: the same launch time on the host, the same work on
    the device (the model says so exactly; the host's CPU time per step of two short runs agrees)."""
    from course_utils.sim import default_sim
    from course_utils.data_parallel import costs_from_sizes, dp_sizes
    scale = 0.5
    costs = costs_from_sizes(dp_sizes(resnet18_cifar(width=2), torch.zeros(3, 32, 32)), scale=scale)
    sim = default_sim(scale=scale)
    assert predict_dp(costs, 1, 128).step_ms == pytest.approx(sim.ceiling_step_ms(128), rel=1e-9)
    assert predict_dp(costs, 1, 512).step_ms == pytest.approx(sim.ceiling_step_ms(512), rel=1e-9)
    assert predict_dp(costs, 1, 128).bound == "host"          # launch-bound at 128, as the H100 measured
    batch = (torch.zeros(128, 3, 4, 4), torch.zeros(128, dtype=torch.long))
    cpu_ms = {}
    for name, device in (("sim", default_sim(scale=scale)), ("dp", SimulatedDataParallel(1, costs, scale=scale))):
        t0 = time.thread_time()       # the host's launches are CPU time on this thread, whatever else runs
        train(None, itertools.repeat(batch), device=device, steps=16, progress=False, batches_on_device=True)
        cpu_ms[name] = (time.thread_time() - t0) * 1e3 / 16
    assert cpu_ms["dp"] == pytest.approx(cpu_ms["sim"], rel=0.25), cpu_ms
    assert cpu_ms["dp"] >= 0.95 * predict_dp(costs, 1, 128).host_ms, cpu_ms


def test_the_host_works_per_replica_with_two_or_more_devices():
    """One step's launches, plus host_ms_per_replica per replica (one per piece) with two or more
    devices; one device is a pass-through; a host-bound run takes the host's time."""
    c = costs(host_step_ms=2.0, host_ms_per_replica=3.0)
    assert SimulatedDataParallel(1, c).host_ms(64) == pytest.approx(2.0)
    assert SimulatedDataParallel(4, c).host_ms(64) == pytest.approx(2.0 + 4 * 3.0)
    assert SimulatedDataParallel(4, c).host_ms(1) == pytest.approx(2.0 + 3.0)      # a replica on device 0
    dp = SimulatedDataParallel(4, c)
    t0 = time.thread_time()
    result = train(None, itertools.repeat(batch(64)), device=dp, steps=10, progress=False)
    spent_ms = (time.thread_time() - t0) * 1e3
    assert spent_ms >= 10 * 14.0 * 0.95, "the host's time is spent, as CPU time, on the calling thread"
    expected = predict_dp(c, 4, 64)
    assert expected.bound == "host" and result.stats.samples_per_s <= expected.samples_per_s * 1.1


def test_work_on_tensors_in_device_memory_is_device_0s():
    """Tensors in simulated device memory (what cifar10_on_device(sim) gives): inside the training
    loop's block, an operation on them is computed, charged to device 0, and stays on the device."""
    from course_utils.sim import SimDeviceTensor, on_device
    dp = SimulatedDataParallel(2, costs(), kernel_us=1000.0, launch_us=0.0)
    images = on_device(torch.arange(24.0).reshape(6, 4))
    with dp.active():
        picked = images.index_select(0, torch.tensor([4, 1]))
    dp.synchronize()
    assert isinstance(picked, SimDeviceTensor) and torch.equal(picked.as_subclass(torch.Tensor),
                                                               torch.tensor([[16.0, 17, 18, 19], [4, 5, 6, 7]]))
    busy = dp.busy_seconds_per_device()
    assert busy[0] * 1e3 >= 1.0 and busy[1] == 0.0
    assert {i.stage for i in dp.trace} == {"on-device work"}      # no step: no host interval either


def test_stage_clock_and_per_device_monitor():
    clock = StageClock(["cpu"])
    for _ in range(3):
        with clock("work"):
            time.sleep(0.002)
    assert clock.medians_ms()["work"] >= 2.0
    dp = SimulatedDataParallel(2, costs(compute_per_sample_ms=0.2))
    with PerDeviceMonitor(dp, interval_s=0.02) as mon:
        for _ in range(8):
            dp.step(batch(64))
        dp.synchronize()
    means = mon.mean_util()
    assert len(means) == 2 and means[0] > 20 and mon.simulated
    fig = plot_schedule(dp.trace, steps=2)
    assert fig.axes


class _SparseNvml:
    """An NVML binding with only nvmlInit, nvmlShutdown, the device count and handles (a vGPU or
    cloud SKU's, or an old nvidia-ml-py): every other query is missing."""

    def __init__(self, util=None):
        if util is not None:
            self.nvmlDeviceGetUtilizationRates = lambda handle: type("U", (), {"gpu": util})()

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)


@pytest.mark.parametrize("util", [None, 40.0])
def test_per_device_monitor_survives_an_nvml_without_utilisation(monkeypatch, util):
    """Issue 19.5 / 26.2: NVML queries are looked up inside their guard; a binding that lacks the
    utilisation query gives no readings (None), never an exception that kills the lesson's cell."""
    import sys

    from course_utils import data_parallel
    monkeypatch.setitem(sys.modules, "pynvml", _SparseNvml(util))
    monkeypatch.setattr(data_parallel, "nvml_find", lambda device: (("gpu", device.index), "UUID"))
    with PerDeviceMonitor([0, 1], interval_s=0.01) as monitor:
        time.sleep(0.05)
    assert monitor.mean_util() == [util, util]
    monkeypatch.setattr(data_parallel, "nvml_find", lambda device: (None, "no NVML GPU has its UUID"))
    with PerDeviceMonitor([0], interval_s=0.01) as monitor:
        time.sleep(0.03)
    assert monitor.mean_util() == [None] and "NVML" in monitor.note


def test_per_device_monitor_without_nvml_at_all(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "pynvml", None)        # import pynvml raises ImportError
    with PerDeviceMonitor([0], interval_s=0.01) as monitor:
        time.sleep(0.03)
    assert monitor.mean_util() == [None] and "not available" in monitor.note


def test_the_course_loop_charges_a_host_batch_its_copy_and_runs_batch_transforms():
    """The training loop asks the device for copy_in (a host batch) and run_timed (a
    batch_transform), and passes amp/channels_last/graph to step: all accepted."""
    costs = StageCosts(compute_fixed_ms=0.5, compute_per_sample_ms=0.0)
    dp = SimulatedDataParallel(2, costs, copy_gbs=0.001)          # 1 MB/s: a 12 kB batch costs 12 ms on device 0
    batch = (torch.zeros(8, 3, 16, 16), torch.zeros(8, dtype=torch.long))
    result = train(None, itertools.repeat(batch, 4), device=dp, steps=4, progress=False,
                   batch_transform=lambda x, y: (x * 2, y))
    stages = {i.stage for i in dp.trace}
    assert {"copy to device 0", "on-device work"} <= stages
    copies = [i for i in dp.trace if i.stage == "copy to device 0"]
    assert all(i.device == 0 and (i.end_s - i.start_s) * 1e3 == pytest.approx(
        dp.kernel_us / 1e3 + (8 * 3 * 16 * 16 * 4 + 8 * 8) / 1e3, rel=1e-6) for i in copies)
    assert result.stats.samples_per_s > 0


def test_plot_schedule_names_a_thin_stage_by_its_width_in_pixels():
    """w6-06: a 0.451 ms replicate in a 113 ms span was 'too short to see' while drawn about 3 px wide."""
    import types

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    bar = lambda stage, device, a, b: types.SimpleNamespace(stage=stage, device=device, step=0, start_s=a, end_s=b)
    trace = [bar("forward", 0, 0.0, 0.113), bar("replicate", 1, 0.0, 0.000451), bar("reduce", 1, 0.05, 0.05000005)]
    fig = plot_schedule(trace, steps=1)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert any(t.startswith("replicate: 0.451 ms, a sliver (about ") for t in labels), labels
    assert "reduce: 0.000 ms, too short to see" in labels, labels
    plt.close(fig)
