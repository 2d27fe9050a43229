import time

import pytest
import torch

from course_utils.timing import StepTimer, benchmark, stall_fraction, synchronize


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


def test_synchronize_is_a_no_op_on_cpu():
    synchronize("cpu")
    synchronize(None)


def slow_batches(n, wait_s):
    for i in range(n):
        time.sleep(wait_s)
        yield torch.zeros(4, 3), torch.zeros(4)


def test_step_timer_splits_data_wait_from_compute(sim):
    timer = StepTimer(sim, skip_first=1)
    for batch in timer.wrap(slow_batches(6, 0.02)):
        with timer.compute():
            sim.step()
    stats = timer.stats()
    assert stats.steps == 5 and stats.samples == 20
    assert 18 <= stats.data_wait_median_ms <= 30
    assert 9.5 <= stats.compute_median_ms <= 16
    assert 0.5 <= stats.stall_fraction <= 0.75
    assert len(timer.log) == 6
    first = timer.log[1]
    assert first["fetch_start"] <= first["fetch_end"] <= first["step_end"]
    assert stats.samples_per_s > 0 and "simulated" in str(stats)


def test_stall_fraction():
    assert stall_fraction([1, 1], [3, 3]) == pytest.approx(0.25)
    assert stall_fraction([], []) == 0.0
