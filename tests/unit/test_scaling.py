import math

import numpy as np
import pytest
import torch

from course_utils.scaling import StageCosts, dp_chunk_sizes, dp_memory, fit_scaling, predict_dp


def test_chunk_sizes_follow_torch_chunk():
    for batch in range(1, 40):
        for n in range(1, 10):
            assert dp_chunk_sizes(batch, n) == [len(c) for c in torch.arange(batch).chunk(n)]
    assert dp_chunk_sizes(5, 4) == [2, 2, 1]          # three devices get work
    with pytest.raises(ValueError):
        dp_chunk_sizes(0, 2)


def costs(**kw):
    base = dict(compute_fixed_ms=1.0, compute_per_sample_ms=0.05, scatter_ms_per_sample=0.001,
                gather_ms_per_sample=0.0005, replicate_ms=2.0, reduce_ms=2.5, device0_ms=0.3,
                host_ms_per_replica=0.5)
    base.update(kw)
    return StageCosts(**base)


def test_one_device_is_compute_plus_device0():
    p = predict_dp(costs(), 1, 128)
    assert p.device_ms == pytest.approx(1.0 + 0.05 * 128 + 0.3)
    assert p.samples_per_s == pytest.approx(128e3 / p.device_ms)
    assert p.efficiency == 1.0 and p.bound == "devices" and p.utilisation == [pytest.approx(1.0)]


def test_serial_stages_and_uneven_split():
    c = costs()
    p = predict_dp(c, 4, 10)                          # pieces 3, 3, 3, 1
    expected = c.compute_ms(3) + 0.3 + 2.0 + 2.5 + 7 * (0.001 + 0.0005)
    assert p.chunks == [3, 3, 3, 1] and p.device_ms == pytest.approx(expected)
    assert sum(p.breakdown.values()) == pytest.approx(p.device_ms)
    p = predict_dp(c, 4, 5)                           # pieces 2, 2, 1: the fourth device idles
    assert p.devices_used == 3 and p.utilisation[3] == 0.0 and p.host_ms == pytest.approx(1.5)
    assert p.utilisation[0] >= max(p.utilisation[1:])


def test_bounds_and_efficiency():
    c = costs(host_ms_per_replica=10.0)
    assert predict_dp(c, 4, 64).bound == "host"
    p = predict_dp(costs(), 4, 512, loader_samples_per_s=2000.0)
    assert p.bound == "loader" and p.samples_per_s == pytest.approx(2000.0)
    assert p.efficiency == pytest.approx(2000.0 / (4 * 2000.0))
    fast = predict_dp(costs(replicate_ms=0, reduce_ms=0, scatter_ms_per_sample=0, gather_ms_per_sample=0,
                            device0_ms=0, host_ms_per_replica=0), 4, 512)
    assert fast.efficiency == pytest.approx(1.0)


def test_stage_costs_validate():
    with pytest.raises(ValueError):
        costs(replicate_ms=-1)
    with pytest.raises(ValueError):
        costs(forward_share=1.5)
    assert "replicate_ms" in costs().describe()


def test_memory_device0_holds_more():
    sizes = dict(param_bytes=1000, optimizer_bytes=1000, input_bytes=10, activation_bytes=1000, output_bytes=4)
    mem = dp_memory(4, 10, **sizes)                   # pieces 3, 3, 3, 1; activations outweigh the gradients
    assert mem[0] == 1000 + 1000 + 10 * 10 + max(3 * 1000 + 2 * 10 * 4, 1000)
    assert mem[1] == 1000 + 3 * 10 + 3 * 1000 and mem[3] == 1000 + 1 * 10 + max(1000, 1000)
    assert dp_memory(4, 5, **sizes)[3] == 0
    assert dp_memory(1, 10, **sizes) == [1000 + 1000 + 10 * 10 + 10 * 1000 + 80]


def test_memory_gradients_replace_activations_and_a_host_side_batch():
    """The peak holds the larger of the activations and the gradients (backward frees the one as
    it makes the other); a batch left on the host puts only device 0's piece there."""
    sizes = dict(param_bytes=10_000, optimizer_bytes=0, input_bytes=10, activation_bytes=100, output_bytes=0)
    mem = dp_memory(2, 8, **sizes)                    # 4 x 100 of activations < 10,000 of gradients
    assert mem == [10_000 + 8 * 10 + 10_000, 10_000 + 4 * 10 + 10_000]
    host = dp_memory(2, 8, batch_on_device0=False, **sizes)
    assert host[0] == mem[0] - 4 * 10 and host[1] == mem[1]


def test_verdicts_say_what_their_table_says():
    """Every sentence the lesson prints under a table, fed tables where it must say the opposite."""
    from course_utils.scaling import agreement, copy_verdict, measured_bound, speedup_verdict, trend
    assert "slower than one" in speedup_verdict(0.70, 4)
    assert "no faster" in speedup_verdict(1.02, 4)
    assert "not even 2x" in speedup_verdict(1.46, 4)
    assert "close to 4x" in speedup_verdict(3.6, 4) and "close" not in speedup_verdict(2.5, 4)
    assert measured_bound(0.50, 0.1) == "host" and measured_bound(0.95, 0.0) == "devices"
    assert measured_bound(0.30, 0.8) == "loader"
    assert agreement(100, 104) == "as predicted" and "below" in agreement(50, 100) and "above" in agreement(150, 100)
    assert trend([1.0, 0.93, 0.73, 0.36]) == "falls from the start"
    assert trend([1.0, 1.9, 3.6, 6.8]) == "rises"
    assert trend([1.0, 1.8, 1.85, 1.83]) == "rises, then flattens"
    assert trend([1.0, 1.6, 1.1]) == "rises, then falls"
    assert "per tensor" in copy_verdict(186, 2_130_000, 2.1, 0.2)
    assert "speed of copying" in copy_verdict(1, 2_130_000, 0.21, 0.2)


def test_fit_verdict_reads_the_measurements_first():
    from course_utils.scaling import fit_verdict
    # what the smoke run showed: a fit with a per-device cost, 6 devices slower than 4
    counts, ms = [1, 2, 3, 4, 6], [27.0, 17.0, 15.0, 14.45, 21.21]
    fit = fit_scaling(counts[:4], ms[:4], batch_size=512)
    text = " ".join(fit_verdict(fit, counts, ms, held_out=[6]))
    assert "fastest step came with 4 devices" in text and "6 devices 21.21 ms" in text
    # full size: no per-device cost in the fit, 6 and 8 devices slower than 4
    counts, ms = [1, 2, 3, 4, 6, 8], [40.0, 20.0, 14.0, 11.71, 17.13, 21.36]
    fit = fit_scaling([1, 2, 3, 4], [40.0, 20.0, 13.4, 10.0], batch_size=512)
    assert fit.per_device_ms == 0
    text = " ".join(fit_verdict(fit, counts, ms, held_out=[6, 8]))
    assert "every device helped" not in text and "trust them" in text and "does not extrapolate" in text
    # the opposite table: every count faster, held-out counts as predicted
    counts = [1, 2, 3, 4, 6, 8]
    ms = [float(fit.step_ms(n)) for n in counts]
    text = " ".join(fit_verdict(fit, counts, ms, held_out=[6, 8]))
    assert "every device helped" in text and "slower" not in text and "does not extrapolate" not in text


def test_fit_recovers_a_known_model_and_predicts():
    n = np.array([1, 2, 3, 4])
    true = 3.0 + 24.0 / n + 0.8 * (n - 1)
    fit = fit_scaling(n, true, batch_size=512)
    assert fit.serial_ms == pytest.approx(3.0, abs=1e-6) and fit.parallel_ms == pytest.approx(24.0, abs=1e-6)
    assert fit.per_device_ms == pytest.approx(0.8, abs=1e-6)
    assert fit.step_ms(8) == pytest.approx(3.0 + 3.0 + 5.6)
    assert fit.speedup(4) == pytest.approx(true[0] / true[3])
    assert fit.best_n_devices() == pytest.approx(math.sqrt(24.0 / 0.8))
    assert float(fit.samples_per_s(4, loader_samples_per_s=1000.0)) == 1000.0
    assert "step ≈" in str(fit) and max(map(abs, fit.residuals_ms)) < 1e-9


def test_fit_keeps_coefficients_non_negative_and_needs_three_counts():
    fit = fit_scaling([1, 2, 4], [10.0, 5.0, 2.4], batch_size=64)   # faster than perfect: no negative overhead
    assert min(fit.serial_ms, fit.parallel_ms, fit.per_device_ms) >= 0
    with pytest.raises(ValueError):
        fit_scaling([1, 2], [1.0, 0.6], batch_size=64)


def test_pipeline_schedule_bubbles():
    from course_utils.scaling import pipeline_schedule
    naive = pipeline_schedule(4, 1, forward_ms=1.0, backward_ms=2.0)
    assert naive.total_ms == pytest.approx(12.0)                 # the devices take turns
    assert naive.utilisation == [pytest.approx(0.25)] * 4
    piped = pipeline_schedule(4, 8, forward_ms=1.0, backward_ms=2.0)
    assert piped.bubble == pytest.approx(3 / (8 + 3), abs=0.02)   # (S - 1) / (M + S - 1)
    for s in range(4):                                         # no device does two things at once
        spans = sorted((a, b) for d, _, _, a, b in piped.intervals if d == s)
        assert all(b0 <= a1 + 1e-9 for (_, b0), (a1, _) in zip(spans, spans[1:]))
