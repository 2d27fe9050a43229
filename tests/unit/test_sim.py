import itertools
import threading
import time
from pathlib import Path

import pytest
import torch

from course_utils import sim as simmod
from course_utils.sim import H100, SimulatedAccelerator, burn_host, default_sim, host_speed


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
    assert start.elapsed_time(end) == pytest.approx(20.0, abs=0.5)
    assert sim.busy_seconds() == pytest.approx(0.020, abs=0.001)


def test_the_device_clock_is_exact_even_when_the_host_is_busy():
    """The device is a virtual clock: a Python thread hogging the GIL may delay when the host
    notices the work is done, never the work's own times (a real GPU does not slow down either)."""
    device = SimulatedAccelerator(step_ms=5.0)
    stop = threading.Event()

    def hog():
        while not stop.is_set():
            pass

    thread = threading.Thread(target=hog, daemon=True)
    thread.start()
    try:
        start = device.record_event()
        for _ in range(10):
            device.step()
        end = device.record_event()
        assert start.elapsed_time(end) == pytest.approx(50.0, abs=0.5)
    finally:
        stop.set()
        thread.join()


def test_the_launch_queue_applies_back_pressure():
    device = SimulatedAccelerator(step_ms=10, max_queued=2)
    t0 = time.perf_counter()
    for _ in range(5):
        device.step()
    assert time.perf_counter() - t0 >= 0.02, "a full queue must block the host"
    device.synchronize()


def test_per_sample_cost_and_label():
    device = default_sim(step_ms=2.0, per_sample_ms=0.1)
    assert device.step_time_ms(100) == pytest.approx(12.0)
    t0 = time.perf_counter()
    device.step(torch.zeros(100, 3))
    device.synchronize()
    assert time.perf_counter() - t0 >= 0.0115
    assert "simulated" in device.label and device.steps_run == 1


def test_rejects_negative_times():
    with pytest.raises(ValueError):
        SimulatedAccelerator(step_ms=-1)
    with pytest.raises(ValueError):
        SimulatedAccelerator(step_ms=1, host_ms=-1)
    with pytest.raises(ValueError):
        SimulatedAccelerator(profile=H100, scale=0)


def test_run_computes_on_the_host_and_charges_kernels_and_bytes():
    device = SimulatedAccelerator(step_ms=0, kernel_us=10, bandwidth_gbs=300)
    x = torch.ones(1_000_000)
    out = device.run(lambda t: t * 2, x)
    assert torch.equal(out, torch.full((1_000_000,), 2.0))
    assert device.charged_kernels == 1
    assert device.charged_ms == pytest.approx(0.010 + 8e6 / 300e9 * 1e3, rel=1e-6)   # 10 us + 8 MB at 300 GB/s
    before = device.charged_kernels
    device.run(lambda t: t.view(-1, 10).t(), x)                                      # views move no data
    assert device.charged_kernels == before
    assert "10 us/kernel + 300 GB/s" in device.label


def test_run_queues_the_charge_in_order():
    big = SimulatedAccelerator(step_ms=0, kernel_us=5000)     # a slow kernel: 5 ms each
    big.run(lambda t: t + 1, torch.zeros(4))
    before = big.record_event()
    big.step()                                                # queued behind the kernel
    after = big.record_event()
    after.synchronize()
    assert big.busy_seconds() == pytest.approx(0.005, abs=0.0005)
    assert after.time_s == pytest.approx(before.time_s, abs=0.0005)


# -- the profiled device: the H100 the course measured ------------------------------------------

def test_the_profile_is_the_measured_h100():
    host, device = H100.step_ms(128)
    assert host == pytest.approx(11.0) and device == pytest.approx(7.5, abs=0.05)     # TF32, eager: launch-bound
    host, device = H100.step_ms(512)
    assert device == pytest.approx(25.5, abs=0.1) and device > host                   # batch 512: the GPU's work
    host, device = H100.step_ms(128, "bf16", True)
    assert device == pytest.approx(3.3, abs=0.05) and host > H100.step_ms(128)[0]      # autocast adds host work
    host, device = H100.step_ms(512, "bf16", True)
    assert device == pytest.approx(9.6, abs=0.05)
    host, device = H100.step_ms(128, "bf16", True, graph=True)
    assert host < 0.2, "a replayed graph is one launch"
    assert "GPU: one NVIDIA H100 (2026-11-24)" in H100.source and H100.measured == "2026-11-24"
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "### GPU: one NVIDIA H100 (2026-11-24)" in readme     # the section the source cites (issue 35)
    assert "shared/measured" not in H100.source
    with pytest.raises(ValueError):
        H100.step_ms(128, "fp8")


def test_the_whole_box_is_scaled_by_one_factor():
    device = SimulatedAccelerator(profile=H100, scale=2.0)
    host, work = device.step_cost_ms(128)
    assert (host, work) == pytest.approx((22.0, 2 * H100.step_ms(128)[1]))
    assert device.launch_us == pytest.approx(2 * H100.kernel_launch_us)
    assert device.kernel_us == pytest.approx(2 * H100.kernel_us)
    assert device.bandwidth_gbs == pytest.approx(H100.bandwidth_gbs / 2)
    assert "x2.00" in device.label and "H100" in device.label and "simulated" in device.label


def test_a_step_spends_its_launch_time_on_the_host():
    """Eager PyTorch launches every kernel from the host: the simulated step's launch time is the
    calling thread's CPU time, and with a fast device the step takes as long as its launches."""
    device = SimulatedAccelerator(profile=H100, scale=0.5)           # host 5.5 ms, device 3.75 ms per step
    cpu0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(6):
        device.step(128)
    launched_cpu = time.thread_time() - cpu0
    host_done = time.perf_counter()
    last = device.record_event()
    assert launched_cpu == pytest.approx(6 * 5.5e-3, rel=0.15), "the host pays the launches in CPU time"
    assert last.time_s - host_done < 3.75e-3 / 2, "the device works while the host launches: little is left"
    device.synchronize()
    wall = time.perf_counter() - t0
    busy = device.busy_seconds()
    assert busy == pytest.approx(6 * 3.75e-3, rel=0.01)
    assert busy / wall < 0.8, "launch-bound: the device idles between kernels"


def test_a_cuda_graph_removes_the_launches_and_batch_512_amortises_them():
    device = SimulatedAccelerator(profile=H100, scale=0.5)
    per_sample = {}
    bf16 = {"amp": "bf16", "channels_last": True}
    for _ in range(3):       # the fastest of three rounds: a loaded machine (walkers beside it) once slowed one
        for label, kwargs, n in (("eager 128", {}, 128), ("eager 512", {}, 512), ("bf16 eager 128", bf16, 128),
                                 ("bf16 eager 512", bf16, 512), ("graph 128", dict(bf16, graph=True), 128)):
            device.synchronize()
            t0 = time.perf_counter()
            for _ in range(5):
                device.step(n, **kwargs)
            device.synchronize()
            took = (time.perf_counter() - t0) / (5 * n)
            per_sample[label] = min(per_sample.get(label, took), took)
    # TF32 at 512 is the GPU's work already (25.5 ms): 1.7x the samples/s of 128; bf16 + channels_last at
    # 512 still fits in the launches (9.6 ms of work): about 4x, as the H100 measured
    assert per_sample["eager 512"] < per_sample["eager 128"] * 0.65
    assert per_sample["bf16 eager 512"] < per_sample["bf16 eager 128"] / 3
    assert per_sample["graph 128"] < per_sample["eager 128"] / 2.5


def test_fp16_with_its_scaler_synchronises_every_step():
    device = SimulatedAccelerator(profile=H100, scale=0.2)
    device.step(512, amp="fp16")
    assert device.record_event().query(), "GradScaler's host read waits for the step"
    device.step(512, amp="bf16")
    assert not device.record_event().query()
    device.synchronize()


def test_computing_device_work_here_is_taken_off_the_next_launch():
    """The host computes what a GPU would: the time beyond the launches is credited to the next
    step's launch, so a step with device-side work costs the host what a GPU's host pays."""
    device = SimulatedAccelerator(profile=H100, scale=1.0)
    x = torch.zeros(64, 3, 32, 32)
    slow = lambda t: (time.sleep(0), [t.add(1) for _ in range(3)])[1][0]      # 3 kernels
    device.run(slow, x)                # warm-up: torch's first kernels and the simulator's lazy set-up
    device.step(64)
    device.synchronize()
    rounds = []
    for _ in range(3):                 # the fastest of three: one round was 22% slow in a clean-clone CI run
        cpu0 = time.thread_time()
        device.run(slow, x)
        device.step(64)
        rounds.append(time.thread_time() - cpu0)
        device.synchronize()
    expected = 3 * H100.kernel_launch_us / 1e6 + H100.eager_host_ms["fp32"] / 1e3
    assert min(rounds) == pytest.approx(expected, rel=0.15), rounds


def test_run_timed_computes_each_shape_once_and_charges_the_rest():
    device = SimulatedAccelerator(profile=H100, scale=1.0)
    calls = []

    def transform(images, labels):
        calls.append(images.shape)
        return images * 2, labels

    x, y = torch.zeros(32, 3, 8, 8), torch.zeros(32, dtype=torch.long)
    assert device.run_timed(transform, x, y) == 32
    kernels, ms = device.charged_kernels, device.charged_ms
    assert kernels == 1
    for _ in range(3):
        assert device.run_timed(transform, x, y) == 32
    assert len(calls) == 1, "later batches of the same shape are charged, not computed"
    assert device.charged_kernels == 4 * kernels and device.charged_ms == pytest.approx(4 * ms)
    device.run_timed(transform, x[:5], y[:5])
    assert len(calls) == 2, "a new shape is computed (a transform that fails on it fails)"
    with pytest.raises(RuntimeError):
        device.run_timed(lambda a, b: a.view(7, -1), x, y)

    class Keeps:
        compute_every_batch = True

        def __call__(self, images, labels):
            calls.append("kept")
            return images, labels
    keeps = Keeps()
    for _ in range(3):
        device.run_timed(keeps, x, y)
    assert calls.count("kept") == 3, "a transform that asks for every batch gets every batch"
    device.synchronize()


def test_copies_from_the_host_are_charged_at_the_pinned_bandwidth():
    device = SimulatedAccelerator(profile=H100, scale=1.0)
    batch = (torch.zeros(128, 3, 32, 32), torch.zeros(128, dtype=torch.long))
    device.copy_in(batch)
    device.synchronize()
    nbytes = 128 * 3 * 32 * 32 * 4 + 128 * 8
    assert device.copied_bytes == nbytes
    assert device.busy_seconds() * 1e3 == pytest.approx(H100.kernel_us / 1e3 + nbytes / 52.8e9 * 1e3, rel=0.01)
    fixed = SimulatedAccelerator(step_ms=1)
    fixed.copy_in(batch)
    assert fixed.copied_bytes == 0, "a plain fixed-time device charges no copies"


def test_a_copy_from_pageable_memory_blocks_the_host_at_the_pageable_bandwidth():
    """x-03 D1: `.to(device)` from pageable memory waits for the queued work and for the copy
    (6.1 GB/s on the H100 box); the pinned copy is queued and the host goes on."""
    device = SimulatedAccelerator(profile=H100, scale=1.0)
    batch = (torch.zeros(64, 3, 224, 224, dtype=torch.uint8),)        # 9.2 MiB: 1.6 ms pageable, 0.18 pinned
    nbytes = batch[0].nbytes
    device.launch(30.0)                                                 # 30 ms of work already queued
    t0 = time.perf_counter()
    device.copy_in(batch)
    assert time.perf_counter() - t0 < 0.02, "a pinned copy is queued: the host goes on"
    device.synchronize()
    busy = device.busy_seconds()
    device.launch(30.0)
    t0 = time.perf_counter()
    device.copy_in(batch, pinned=False)
    waited = time.perf_counter() - t0
    assert waited >= 0.030 + nbytes / 6.1e9 * 0.9, waited             # the queue, then the copy
    assert device.busy_seconds() - busy == pytest.approx(0.030 + H100.kernel_us / 1e6 + nbytes / 6.1e9, rel=0.01)


def test_a_view_of_overlapping_windows_is_charged_at_most_its_storage():
    """x-03 D4: a gather through an as_strided view of 81 windows read 81x the batch's bytes."""
    images = torch.zeros(16, 3, 40, 40)
    windows = images.as_strided((16, 3, 9, 9, 32, 32), (4800, 1600, 40, 1, 40, 1))
    with simmod._KernelCost() as cost:
        windows.amax(dim=(2, 3))                                        # reads every window
    out = 16 * 3 * 32 * 32 * 4
    assert cost.kernels == 1
    assert cost.bytes <= images.nbytes + out, cost.bytes


def test_burn_host_spends_cpu_time_and_lets_other_threads_run():
    cpu0 = time.thread_time()
    burn_host(0.02)
    assert time.thread_time() - cpu0 == pytest.approx(0.02, abs=0.004)
    counted = []
    stop = threading.Event()

    def waiter():
        while not stop.is_set():
            counted.append(1)
            time.sleep(0.0005)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    burn_host(0.05)
    stop.set()
    thread.join()
    assert len(counted) > 10, "the burn must release the GIL part of the time"


def test_host_speed_is_measured_in_cpu_time_or_taken_from_the_environment(monkeypatch):
    monkeypatch.setenv("COURSE_SIM_HOST_RATE", "6314")
    speed = host_speed(refresh=True)
    assert speed.samples_per_s == 6314 and speed.how == "COURSE_SIM_HOST_RATE"
    device = default_sim()
    assert device.scale == pytest.approx(0.5) and device.profile is H100
    assert "6,314 samples/s" in device.describe() and "x0.50" in device.label
    monkeypatch.setenv("COURSE_SIM_HOST_RATE", "-3")
    with pytest.raises(ValueError, match="COURSE_SIM_HOST_RATE"):
        host_speed(refresh=True)
    monkeypatch.delenv("COURSE_SIM_HOST_RATE")
    measured = host_speed(refresh=True)
    assert measured.how == "measured" and 300 < measured.samples_per_s < 100_000
    simmod._HOST_SPEED = None


def test_describe_names_the_box_and_the_step():
    device = SimulatedAccelerator(profile=H100, scale=1.0)
    text = device.describe()
    assert "H100" in text and "11.0 ms" in text and "7.5 ms" in text and "simulated" in text


def test_work_on_the_simulated_device_memory_is_device_work_wherever_it_runs():
    """A loader that augments batches of device-memory tensors itself (a side stream's work, say) is
    charged as a transform in the loop would be: its operations are the device's, not the host's."""
    from course_utils.device_data import AugmentBatch, DeviceLoader
    from course_utils.sim import SimDeviceTensor, is_on_device, on_device
    from course_utils.train import train

    images = on_device(torch.randint(0, 256, (512, 3, 32, 32), dtype=torch.uint8))
    labels = on_device(torch.randint(0, 10, (512,)))
    x, y = next(iter(DeviceLoader(images, labels, 64)))
    assert isinstance(x, SimDeviceTensor) and is_on_device((x, y)) and not is_on_device((x, torch.zeros(3)))
    host = x.cpu()
    assert type(host) is torch.Tensor and type(x.numpy()) is not SimDeviceTensor and torch.equal(host, x)
    device = SimulatedAccelerator(profile=H100, scale=1.0)
    assert device.charged_kernels == 0, "outside a training loop, device-memory work is not charged"
    augment = AugmentBatch()

    class AugmentsInTheLoader:
        def __iter__(self):
            for a, b in DeviceLoader(images, labels, 64):
                yield augment(a, b)

    train(None, AugmentsInTheLoader(), device=device, steps=4, progress=False)
    assert device.charged_kernels >= 4 * 10, "every augmentation's kernels charged"
    assert device.copied_bytes == 0, "batches in device memory need no copy"
    plain = SimulatedAccelerator(profile=H100, scale=1.0)
    train(None, itertools.repeat((torch.zeros(64, 3, 32, 32), torch.zeros(64, dtype=torch.long))), device=plain,
          steps=2, progress=False)
    assert plain.copied_bytes > 0, "host batches are charged their copy"
