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
    # a per-sample cost of a few bytes does not print as 0.0000 (w5-06: gather_ms_per_sample)
    assert "0.0000398" in costs(gather_ms_per_sample=3.98e-5).describe()


def test_memory_device0_holds_more():
    sizes = dict(param_bytes=1000, optimizer_bytes=1000, input_bytes=10, activation_bytes=1000, output_bytes=4)
    mem = dp_memory(4, 10, **sizes)                   # pieces 3, 3, 3, 1; activations outweigh the gradients
    assert mem[0] == 1000 + 1000 + 10 * 10 + 1000 + max(3 * 1000 + 2 * 10 * 4, 1000)
    assert mem[1] == 1000 + 3 * 10 + 3 * 1000 + 1000 and mem[3] == 1000 + 1 * 10 + 1000 + 1000
    assert dp_memory(4, 5, **sizes)[3] == 0
    assert dp_memory(1, 10, **sizes) == [1000 + 1000 + 10 * 10 + 10 * 1000 + 80 + 1000]


def test_memory_counts_activations_and_gradients_together_and_the_reduce_on_device0():
    """x-06 finding 3: backward makes gradients while earlier activations are held (the peak is
    counted with both), and DataParallel's reduce holds every replica's gradients, device 0's
    included, while it allocates their sum: 2 x param_bytes on device 0 when the activations are
    small. A batch left on the host puts only device 0's piece there."""
    sizes = dict(param_bytes=10_000, optimizer_bytes=0, input_bytes=10, activation_bytes=100, output_bytes=0)
    mem = dp_memory(2, 8, **sizes)                    # 4 x 100 of activations < 10,000 of gradients
    assert mem == [10_000 + 8 * 10 + 10_000 + 10_000, 10_000 + 4 * 10 + 4 * 100 + 10_000]
    host = dp_memory(2, 8, batch_on_device0=False, **sizes)
    assert host[0] == mem[0] - 4 * 10 and host[1] == mem[1]
    assert dp_memory(1, 8, **sizes) == [10_000 + 8 * 10 + 8 * 100 + 10_000]       # one device: no reduce
    assert dp_memory(4, 1, **sizes)[0] == 10_000 + 10 + 10_000 + 10_000          # one piece on 4 devices: replicated


def test_memory_bounds_the_measured_peak_of_the_course_resnet():
    """The model's working memory (activations + gradients) is an upper bound of what backward
    holds at once on the course's ResNet-18, measured with lesson 05's SavedTensorMeter and a hook
    per gradient; the larger of the two alone is below it (x-06 measured -38% at batch 8)."""
    import torch.nn.functional as F

    from course_utils.memory import SavedTensorMeter
    from course_utils.models import resnet18_cifar
    torch.manual_seed(0)
    model = resnet18_cifar(width=8)
    p = sum(t.numel() * t.element_size() for t in model.parameters())
    made, peak = [0], [0]
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        def hook(t):
            made[0] += t.numel() * t.element_size()
            peak[0] = max(peak[0], meter.live_bytes + made[0])
        hooks = [t.register_post_accumulate_grad_hook(hook) for t in model.parameters()]
        F.cross_entropy(model(x), y).backward()
        activations = meter.peak_bytes
    for h in hooks:
        h.remove()
    assert max(activations, p) < peak[0] <= activations + p


def test_predict_dp_host_launches_once_and_works_per_replica():
    c = costs(host_step_ms=5.0, host_ms_per_replica=2.0)
    assert predict_dp(c, 1, 64).host_ms == pytest.approx(5.0)                 # one device: no replica
    assert predict_dp(c, 4, 64).host_ms == pytest.approx(5.0 + 4 * 2.0)
    assert predict_dp(c, 4, 3).host_ms == pytest.approx(5.0 + 3 * 2.0)        # three pieces, three replicas
    assert predict_dp(c, 4, 1).host_ms == pytest.approx(5.0 + 2.0)            # one piece: still one replica
    assert predict_dp(c, 4, 1).device_ms == pytest.approx(c.compute_ms(1) + 0.3)    # but nothing crosses a link


def test_fit_verdict_reads_the_rounds_spread():
    """w1-06 contradiction 6: the fastest count and the held-out verdict flipped between runs on
    noise. Counts within the rounds' spread of the fastest are named as such; a held-out count
    agrees within max(tolerance, spread); rounds that disagree by more than half rank nothing."""
    from course_utils.scaling import fit_verdict
    ms = [40.0, 22.0, 21.0, 23.0, 30.0]
    fit = fit_scaling([1, 2, 3, 4], ms[:4], batch_size=512)
    quiet = fit_verdict(fit, [1, 2, 3, 4, 6], ms, held_out=[6], spread=0.0)
    assert quiet[0].startswith("measured: the fastest step came with 3 devices (21.00 ms)")
    assert any("more devices than 3, slower than its step: 4 devices 23.00 ms (+10%), 6 devices 30.00 ms (+43%)" in l
               for l in quiet)
    noisy = fit_verdict(fit, [1, 2, 3, 4, 6], ms, held_out=[6], spread=0.12)
    assert "within the rounds' spread (12%) of it: 2 devices 22.00 ms, 4 devices 23.00 ms" in noisy[0]
    assert not any("4 devices 23.00 ms" in l for l in noisy[1:] if l.startswith("more devices"))
    busy = fit_verdict(fit, [1, 2, 3, 4, 6], ms, held_out=[6], spread=0.8)
    assert len(busy) == 1 and "can neither rank the counts nor test the fit" in busy[0]
    # w3-06: rounds 41% apart ranked the counts, 61% apart did not: both runs now say the rounds disagree
    wide = fit_verdict(fit, [1, 2, 3, 4, 6], ms, held_out=[6], spread=0.41)
    assert wide[0].startswith("measured, with rounds that disagree by up to 41%")
    level = fit_verdict(fit, [1, 2, 3, 4, 6], [22.0, 21.0, 21.5, 23.0, 24.0], held_out=[6], spread=0.15)
    assert len(level) == 1 and "the counts' steps differ by up to 14%" in level[0]


def test_why_off_reads_the_cpu_line_before_the_run_length():
    """w1-06 contradiction 5: the cause of a miss was chosen by the mode (smoke), not by what the
    run showed (other processes used 1.6 of 2 cores)."""
    from course_utils.scaling import why_off
    assert "other programs used 1.6 of this machine's 2 cores" in why_off(1.6, 2, steps=12, smoke=True)
    assert why_off(0.1, 2, steps=12, smoke=True).startswith("smoke size: 12 steps per run")
    assert "do not explain this run" in why_off(0.1, 2, steps=100, smoke=False)


def test_speedup_range_verdict_says_when_the_halves_disagree():
    """w2-06: the headline flipped between runs (2.02x vs 1.83x, 'not even 2x' in one of them), and the
    naive loader's 0.67x vs 0.91x ('slower' vs 'no faster'): a verdict whose halves straddle a line says so."""
    from course_utils.scaling import speedup_range_verdict, speedup_verdict
    assert speedup_range_verdict(1.83, 1.7, 1.9, 4, "x") == speedup_verdict(1.83, 4, "x")
    both = speedup_range_verdict(1.83, 1.6, 2.2, 4, "fixed")
    assert "1.60x to 2.20x" in both and "on both sides of 2x (under 2x / 2x or more)" in both and "cannot say which" in both
    assert "not even 2x" not in both
    naive = speedup_range_verdict(0.91, 0.67, 1.0, 4)
    assert "on both sides of 0.9x (slower than one device / no faster than one)" in naive
    # w6-06: 0.84x to 1.11x crosses two lines: both named, with the class between them
    two = speedup_range_verdict(0.96, 0.84, 1.11, 4)
    assert "on both sides of 0.9x and 1.1x (slower than one device / no faster than one / under 2x)" in two


def test_agreement_range_names_halves_on_both_sides_of_the_tolerance():
    """w2-06: '4 devices, naive loader' read '35% below' in one run and 'as predicted' in the next."""
    from course_utils.scaling import agreement, agreement_range
    assert agreement_range(937, 900, 1000, 1172) == (
        "the halves disagree (they ran 900 to 1,000: one more than 20% below, one within 20% of it; the whole run "
        "20% below the prediction)")
    # w3-06: 'as predicted (... the halves disagree)' beside '0 of 6 runs within 20%': no verdict of its own
    assert not agreement_range(1600, 1448, 1754, 1987).startswith("as predicted")
    assert agreement_range(1100, 1050, 1150, 1172) == "as predicted"
    assert agreement_range(500, 450, 550, 1172) == agreement(500, 1172)


def test_fit_verdict_qualifies_what_the_spread_leaves_open():
    """w2-06: the fit's best count (1.9 / 1.6) and its held-out miss moved with rounds 31-48% apart."""
    from course_utils.scaling import fit_verdict
    ms = [40.0, 22.0, 21.0, 23.0, 30.0]
    fit = fit_scaling([1, 2, 3, 4], ms[:4], batch_size=512)
    noisy = fit_verdict(fit, [1, 2, 3, 4, 6], ms, held_out=[6], spread=0.4)
    assert any("names no best device count" in line and "as uncertain as the rounds" in line for line in noisy)
    assert not any("near" in line for line in noisy)      # w7-06: no optimum named from parts within the noise
    quiet = fit_verdict(fit, [1, 2, 3, 4, 6], ms, held_out=[6], spread=0.0)
    assert not any("uncertain" in line for line in quiet) and any("best device count near" in l for l in quiet)


def test_fit_verdict_after_w7_06():
    """w7-06: 'more devices than that made the step slower: 3 devices ...' beside 4 devices inside the spread;
    a fit with 0.00 ms / n and one near 1.1 from rounds 31% and 23% apart."""
    from course_utils.scaling import ScalingFit, fit_verdict
    counts, ms = [1, 2, 3, 4, 6], [145.20, 179.48, 192.37, 188.73, 234.92]
    fit = ScalingFit(154.92, 0.0, 14.35, 2048, counts[:4], ms[:4])
    text = fit_verdict(fit, counts, ms, held_out=[6], spread=0.31)
    slower = next(l for l in text if l.startswith("more devices than 1"))
    assert "by more than the rounds' spread (31%): 3 devices 192.37 ms (+32%), 6 devices 234.92 ms (+62%)" in slower
    assert "4 devices" not in slower
    assert any(l.startswith("the fit is degenerate") and "names no optimum" in l for l in text)
    fit2 = ScalingFit(124.51, 29.86, 24.79, 2048, counts[:4], [153.68, 168.37, 177.82, 209.10])
    text2 = " ".join(fit_verdict(fit2, counts, [153.68, 168.37, 177.82, 209.10, 262.56], held_out=[6], spread=0.23))
    assert "names no best device count" in text2 and "near 1.1" not in text2


def test_fit_verdict_and_why_off_after_w4_06():
    """w4-06: a fit with nothing parallel put 'the best device count near 0.0'; a host-bound run using 0.2 cores."""
    from course_utils.scaling import ScalingFit, fit_verdict, why_off
    fit = ScalingFit(46.27, 0.0, 4.04, 512, [1, 2, 3, 4], [46.77, 46.19, 61.10, 55.28])
    text = " ".join(fit_verdict(fit, [1, 2, 3, 4, 6], [46.77, 46.19, 61.10, 55.28, 73.10], held_out=[6], spread=0.25))
    assert "below one device, not a count" in text and "near 0.0" not in text
    assert "starved by the others" in why_off(1.8, 2, steps=12, smoke=True, ours_cores=0.2)
    assert "starved" not in why_off(1.8, 2, steps=12, smoke=True)


def test_agreement_range_keeps_a_ratios_decimals():
    """Lesson 06 hands it speed-ups too: halves of 1.45x and 5.35x read "1.45 to 5.35", not "1 to 5"."""
    from course_utils.scaling import agreement_range
    said = agreement_range(3.41, 1.45, 5.35, 3.67)
    assert "they ran 1.45 to 5.35:" in said, said
    assert "they ran 900 to 1,000:" in agreement_range(937, 900, 1000, 1172)
