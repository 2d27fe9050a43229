import time

import numpy as np
import pytest

from course_utils.monitor import TIMELINE_KINDS, Timeline, UtilizationMonitor, synthetic_timeline


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
    assert len(fig.axes) == 2


def test_monitor_without_a_device_still_records_the_cpu():
    with UtilizationMonitor(interval_s=0.05, gpu_index=None) as mon:
        time.sleep(0.2)
    tl = mon.timeline
    assert tl.gpu_util is None and len(tl.t_s) >= 3
    assert "samples" in tl.summary()


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
