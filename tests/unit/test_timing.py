import time

import pytest
import torch

from course_utils.timing import StepTimer, benchmark, synchronize


def test_benchmark_synchronises_asynchronous_work(sim):
    result = benchmark(sim.step, device=sim, warmup=1, repeats=5)
    assert 9.5 <= result.median_ms <= 15, result
    assert len(result.times_ms) == 5 and "simulated" in result.device


def test_benchmark_counts_calls_and_takes_the_median():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.05 if len(calls) == 3 else 0.002)

    result = benchmark(fn, warmup=1, repeats=5)
    assert len(calls) == 6
    assert result.median_ms < 10 and max(result.times_ms) > 40


def test_benchmark_rejects_zero_repeats():
    with pytest.raises(ValueError):
        benchmark(lambda: None, repeats=0)


def test_synchronize_is_a_no_op_on_cpu(monkeypatch):
    def no_cuda_here(*args, **kwargs):
        raise AssertionError("synchronize() called CUDA for a CPU device")
    monkeypatch.setattr(torch.cuda, "synchronize", no_cuda_here)
    assert synchronize("cpu") is None and synchronize(None) is None


def slow_batches(n, wait_s):
    for i in range(n):
        time.sleep(wait_s)
        yield torch.zeros(4, 3), torch.zeros(4)


def _log_stall_fraction(log, skip_first):
    """Exercise 1.2's definition, written out: waits / wall time of the counted entries."""
    steps = log[skip_first:]
    return sum(e["fetch_end"] - e["fetch_start"] for e in steps) / (steps[-1]["step_end"] - steps[0]["fetch_start"])


def test_step_timer_does_not_synchronise_every_step(sim):
    # loading takes 20 ms, the device step 10 ms: without a sync per step the device works
    # while the host waits for the next batch, so the loop is stalled on data nearly all the
    # time and the device is busy about half of it
    timer = StepTimer(sim, skip_first=1)
    for batch in timer.wrap(slow_batches(7, 0.02)):
        with timer.compute():
            sim.step()
    timer.finish()
    stats = timer.stats()
    assert stats.steps == 6 and stats.samples == 24 and not stats.synced_every_step
    assert 18 <= stats.data_wait_median_ms <= 30
    assert stats.compute_median_ms < 5, "launching a step must not wait for the device"
    assert 9.5 <= stats.device_median_ms <= 16, "device events measure the device's own time"
    assert 0.85 <= stats.stall_fraction <= 1.0
    assert 0.3 <= stats.device_busy_fraction <= 0.65
    assert stats.stall_fraction == pytest.approx(_log_stall_fraction(timer.log, 1), rel=1e-9)
    assert stats.total_s == pytest.approx(timer.log[-1]["step_end"] - timer.log[1]["fetch_start"])
    first = timer.log[1]
    assert first["fetch_start"] <= first["fetch_end"] <= first["step_end"]
    assert stats.samples_per_s > 0 and "simulated" in str(stats)


def test_sync_every_step_makes_the_host_wait(sim):
    timer = StepTimer(sim, skip_first=1, sync=True)
    for batch in timer.wrap(slow_batches(6, 0.02)):
        with timer.compute():
            sim.step()
    stats = timer.stats()
    assert stats.synced_every_step and 9.5 <= stats.compute_median_ms <= 16
    assert 0.5 <= stats.stall_fraction <= 0.75
    assert stats.stall_fraction == pytest.approx(_log_stall_fraction(timer.log, 1), rel=1e-9)


def test_a_device_bound_loop_is_timed_by_the_device(sim):
    # batches are free, the device takes 10 ms a step: the host runs ahead, the queue fills,
    # and the final synchronisation makes the wall time the device's time
    timer = StepTimer(sim, skip_first=2)
    batches = [(torch.zeros(4, 3), torch.zeros(4))] * 12
    for batch in timer.wrap(batches):
        with timer.compute():
            sim.step(batch)
    stats = timer.stats()
    assert stats.steps == 10
    assert 95 <= stats.total_s * 1e3 <= 140, "the warm-up's queued work must not be counted, the last step's must"
    assert stats.stall_fraction < 0.05 and stats.device_busy_fraction > 0.75


def test_stats_without_finish_finishes_once(sim):
    timer = StepTimer(sim, skip_first=0)
    for batch in timer.wrap([(torch.zeros(2), torch.zeros(2))] * 3):
        with timer.compute():
            sim.step()
    a = timer.stats()
    b = timer.stats()
    assert a.total_s == b.total_s >= 0.029


def test_a_timer_on_the_cpu_measures_the_body():
    timer = StepTimer("cpu", skip_first=0)
    for batch in timer.wrap([(torch.zeros(2), torch.zeros(2))] * 3):
        with timer.compute():
            time.sleep(0.01)
    stats = timer.stats()
    assert all(9 <= d <= 40 for d in stats.device_ms)
    assert 0.5 <= stats.device_busy_fraction <= 1.0 and stats.stall_fraction < 0.1


def test_step_stats_line_names_the_span_in_flight_and_the_busy_time_that_agrees_with_the_busy_share():
    """w3-01: "(device 25.43 ms)" was printed beside "device busy 2%" for a 125 ms step: the
    25 ms was the step's span in flight, not the device's work. The line says which is which,
    and the busy time per step it quotes is the busy share times the step."""
    import re

    from course_utils.timing import StepStats

    stats = StepStats(steps=4, samples=512, total_s=0.5, data_wait_ms=[95.0] * 4, compute_ms=[25.5] * 4,
                      device="simulated", device_ms=[25.43] * 4, device_util=0.02)
    line = str(stats)
    assert "in flight on the device 25.43 ms" in line and "(device 25.43" not in line
    busy_ms = float(re.search(r"the device ran work ([\d.]+) ms", line).group(1))
    assert busy_ms == pytest.approx(0.02 * stats.step_time_ms, abs=0.01)      # 2% of a 125 ms step
    assert "busy 2% of the wall time" in line
    no_util = str(StepStats(steps=4, samples=512, total_s=0.5, data_wait_ms=[95.0] * 4, compute_ms=[25.5] * 4,
                            device="x", device_ms=[25.43] * 4))
    assert "in flight on the device 25.43 ms)" in no_util and "ran work" not in no_util



def test_a_rows_shares_print_as_the_stats_line_prints_them():
    """w5-08: a stall of 0.76549 printed "77%" in the StepStats line and, stored as 0.765, "76%" in the rung table."""
    from course_utils.timing import row_share
    for x in (0.76549, 0.1249, 0.125, 0.5, 0.0, 1.0, 0.33333):
        assert f"{row_share(x):.0%}" == f"{x:.0%}", x
    assert row_share(0.33333) == 0.333
