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
    sizes = dict(param_bytes=1000, optimizer_bytes=1000, input_bytes=10, activation_bytes=100, output_bytes=4)
    mem = dp_memory(4, 10, **sizes)
    assert mem[0] == 2000 + 1000 + 10 * 10 + 3 * 100 + 2 * 10 * 4
    assert mem[1] == 2000 + 3 * 110 and mem[3] == 2000 + 1 * 110
    assert dp_memory(4, 5, **sizes)[3] == 0
    assert dp_memory(1, 10, **sizes) == [2000 + 1000 + 10 * 110 + 80]


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
