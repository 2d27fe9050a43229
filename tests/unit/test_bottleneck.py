"""course_utils.bottleneck: each verdict follows from the numbers, and flips when they do."""
import pytest

from course_utils.bottleneck import (achieved_tflops, diagnose, peak_tflops, training_flops_per_sample)


@pytest.mark.parametrize("row, kind", [
    ({"stall_fraction": 0.75, "device_util": 0.14, "steps_in_flight_fraction": 0.25}, "input-bound"),
    ({"stall_fraction": 0.02, "device_util": 0.64, "steps_in_flight_fraction": 0.99}, "launch-bound"),
    ({"stall_fraction": 0.02, "device_util": 0.97, "steps_in_flight_fraction": 0.99}, "compute-bound"),
    ({"stall_fraction": 0.02, "device_util": None, "steps_in_flight_fraction": 0.99}, "device-side"),
    ({"stall_fraction": 0.05, "device_util": None, "steps_in_flight_fraction": 0.30}, "unclear"),
    ({"stall_fraction": 0.0, "device_util": 0.5, "synced_every_step": True}, "sync-bound"),
    ({"stall_fraction": 0.02, "device_util": 0.6, "device_busy_fraction": 0.98}, "launch-bound"),   # older rows
])
def test_each_verdict_follows_from_its_numbers(row, kind):
    verdict = diagnose(row)
    assert verdict.kind == kind
    assert "%" in verdict.reason


def test_an_input_bound_loop_that_waits_less_than_half_the_time_says_so():   # w7-03: 22-30% waits read "input-bound"
    verdict = diagnose({"stall_fraction": 0.3, "device_util": 0.06, "steps_in_flight_fraction": 0.6})
    assert verdict.kind == "input-bound" and "in part" in verdict.reason and "other 70%" in verdict.reason
    # w10-03: the in-flight share is of the whole time, not of the 70% (it overlaps the waits)
    assert "(of the whole time: a step in flight 60%, the device busy 6%)" in verdict.reason, verdict.reason
    assert "in part" not in diagnose({"stall_fraction": 0.8, "device_util": 0.03}).reason
    # near the line, on either side, the verdict says another run may land on the other side (w7-03: 14-30%)
    assert "another run" in diagnose({"stall_fraction": 0.22, "device_util": 0.09, "steps_in_flight_fraction": 0.79}).reason
    assert "another run" in diagnose({"stall_fraction": 0.14, "device_util": 0.09, "steps_in_flight_fraction": 0.79}).reason
    assert "another run" not in diagnose({"stall_fraction": 0.02, "device_util": 0.09}).reason


def test_the_threshold_is_where_the_verdict_flips():
    assert diagnose({"stall_fraction": 0.199, "device_util": 0.9}).kind == "compute-bound"
    assert diagnose({"stall_fraction": 0.2, "device_util": 0.9}).kind == "input-bound"
    assert diagnose({"stall_fraction": 0.0, "device_util": 0.849}).kind == "launch-bound"
    assert diagnose({"stall_fraction": 0.0, "device_util": 0.85}).kind == "compute-bound"


def test_flops_of_the_course_model_and_the_rate_against_a_peak():
    flops = training_flops_per_sample()
    assert 3.0e9 < flops < 3.7e9, "forward + backward of the CIFAR ResNet-18: about 3 x 1.1 GFLOP per image"
    assert achieved_tflops(10_000, flops) == pytest.approx(10_000 * flops / 1e12)
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4)
    assert peak_tflops("NVIDIA H100 PCIe", "fp32") == pytest.approx(378.0)
    assert peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None
    assert peak_tflops("a laptop", "fp32") is None


def test_the_simulated_peak_named_does_not_move_with_the_scale():
    """w2-03: the scale is measured at every start (x0.45 in one run, x0.42 in the next); the
    peak the sentence names is the card's own, and the rate is brought back to its clock."""
    import re

    from course_utils.bottleneck import rate_against_peak
    from course_utils.sim import H100, SimulatedAccelerator

    said = []
    for scale in (0.42, 0.45):
        sim = SimulatedAccelerator(profile=H100, scale=scale)
        try:
            said.append(rate_against_peak(4_000 / scale, sim))    # the same run on the card's own clock
        finally:
            sim.close()
    peaks = [re.search(r"peak, ([\d,]+) TFLOP/s", s).group(1) for s in said]
    shares = [re.search(r"([\d.]+)% of its dense", s).group(1) for s in said]
    assert peaks[0] == peaks[1] == f"{peak_tflops(H100.name, 'fp32'):.0f}", said
    assert shares[0] == shares[1], said
    assert "x0.42" in said[0] and "x0.45" in said[1] and "own clock" in said[0]
