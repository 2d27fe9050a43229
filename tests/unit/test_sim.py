import time

import pytest
import torch

from course_utils.sim import SimulatedAccelerator, default_sim


def test_steps_are_asynchronous_and_synchronize_waits(sim):
    t0 = time.perf_counter()
    for _ in range(3):
        sim.step()
    launched = time.perf_counter() - t0
    sim.synchronize()
    total = time.perf_counter() - t0
    assert launched < 0.005, "launching must not wait for the device"
    assert total >= 0.029, "synchronize must wait for three 10 ms steps"


def test_busy_seconds_and_events_measure_device_time(sim):
    start = sim.record_event()
    sim.step()
    sim.step()
    end = sim.record_event()
    assert 19 <= start.elapsed_time(end) <= 30
    assert 0.019 <= sim.busy_seconds() <= 0.03


def test_the_launch_queue_applies_back_pressure():
    sim = SimulatedAccelerator(step_ms=10, max_queued=2)
    try:
        t0 = time.perf_counter()
        for _ in range(5):
            sim.step()
        assert time.perf_counter() - t0 >= 0.02, "a full queue must block the host"
    finally:
        sim.close()


def test_per_sample_cost_and_label():
    sim = default_sim(step_ms=2.0, per_sample_ms=0.1)
    try:
        assert sim.step_time_ms(100) == pytest.approx(12.0)
        t0 = time.perf_counter()
        sim.step(torch.zeros(100, 3))
        sim.synchronize()
        assert time.perf_counter() - t0 >= 0.0115
        assert "simulated" in sim.label and sim.steps_run == 1
    finally:
        sim.close()


def test_rejects_negative_times():
    with pytest.raises(ValueError):
        SimulatedAccelerator(step_ms=-1)


def test_run_computes_on_the_host_and_charges_kernels_and_bytes(sim):
    x = torch.ones(1_000_000)
    out = sim.run(lambda t: t * 2, x)
    assert torch.equal(out, torch.full((1_000_000,), 2.0))
    assert sim.charged_kernels == 1
    assert sim.charged_ms == pytest.approx(0.010 + 8e6 / 300e9 * 1e3, rel=1e-6)   # 10 us + 8 MB at 300 GB/s
    before = sim.charged_kernels
    sim.run(lambda t: t.view(-1, 10).t(), x)                                      # views move no data
    assert sim.charged_kernels == before
    assert "10 us/kernel + 300 GB/s" in sim.label


def test_run_queues_the_charge_in_order():
    big = SimulatedAccelerator(step_ms=0, kernel_us=5000)     # a slow kernel: 5 ms each
    try:
        s = big.record_event()
        big.run(lambda t: t + 1, torch.zeros(4))
        e = big.record_event()
        assert 4.5 <= s.elapsed_time(e) <= 9
    finally:
        big.close()
