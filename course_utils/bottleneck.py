"""Name what limits a training run, from numbers the course already measures (lessons 01, 05, 08).

Three situations, read from a run's `StepStats` (or a ladder row):

- **input-bound**: the loop waits for its next batch a large share of the time (`stall_fraction`):
  a faster model would not help; feed it faster (lessons 02-04).
- **launch-bound**: the loop hardly waits for data and some step is in flight nearly all the time,
  yet the device is busy for only part of it (`device_util`, what NVML reports on a GPU): it idles
  between kernels, waiting for the host to launch the next ones. Eager PyTorch launches every
  kernel of a step from one host thread (about 390 for the course's ResNet-18, ~28 us each on the
  H100 box the course measured), so a fast GPU fed small batches runs at the host's launch rate.
  Cheaper arithmetic does not help; fewer launches do: a bigger batch, CUDA graphs,
  `torch.compile` (lesson 05).
- **compute-bound**: the device is busy nearly all the time: only a cheaper step helps (mixed
  precision, channels_last: lesson 05).

Where the device's own busy time is unknown (the CPU, a GPU without NVML readings), a run that
does not wait for data is "device-side" without telling launches from compute apart, and the
verdict says so. A loop that synchronises every step (`synced_every_step`) makes the host and the
device take turns: that is named too.

`achieved_tflops(samples_per_s, flops_per_sample)` and `training_flops_per_sample(model)` put a
rate beside the card's peak (`peak_tflops(device)`).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Verdict", "diagnose", "INPUT_STALL", "COMPUTE_UTIL", "training_flops_per_sample", "achieved_tflops",
           "peak_tflops", "PEAK_TFLOPS", "rate_against_peak"]

INPUT_STALL = 0.2      # waiting for data at least this share of the wall time: input-bound
COMPUTE_UTIL = 0.85    # the device busy at least this share: compute-bound; below it, with steps in flight: launch-bound
IN_FLIGHT = 0.85       # a step in flight at least this share of the wall time


@dataclass(frozen=True)
class Verdict:
    kind: str        # "input-bound", "launch-bound", "compute-bound", "sync-bound", "device-side" or "unclear"
    reason: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


def _get(run, name):
    if isinstance(run, dict):
        if name == "steps_in_flight_fraction" and name not in run:
            return run.get("device_busy_fraction")
        return run.get(name)
    return getattr(run, name, None)


def diagnose(run) -> Verdict:
    """What limits `run` (a `StepStats` or a ladder row), with the numbers that say so."""
    stall = _get(run, "stall_fraction") or 0.0
    util = _get(run, "device_util")
    in_flight = _get(run, "steps_in_flight_fraction")
    synced = bool(_get(run, "synced_every_step"))
    if stall >= INPUT_STALL:
        if stall < 0.5:         # the waits are the part a faster model would not remove, not most of the time
            rest = (f" (of the whole time: a step in flight {in_flight:.0%}" + (f", the device busy {util:.0%}"
                                                                                 if util is not None else "")
                    + ")") if in_flight is not None else ""       # w10-03: not a share of the other part
            near = (f" ({INPUT_STALL:.0%} is the line: another run may land below it)" if stall < 1.5 * INPUT_STALL
                    else "")
            return Verdict("input-bound", f"the loop waited for data {stall:.0%} of the time, and the other "
                                          f"{1 - stall:.0%} it did not{rest}: input-bound in part, faster loading "
                                          f"removes the waits, not the rest{near}")
        return Verdict("input-bound", f"the loop waited for data {stall:.0%} of the time")
    if synced and util is not None and util < COMPUTE_UTIL:
        return Verdict("sync-bound", f"the loop synchronised every step; the device was busy {util:.0%} of the time")
    if util is None:
        if in_flight is not None and in_flight >= IN_FLIGHT:
            return Verdict("device-side", f"waiting for data {stall:.0%}, a step in flight {in_flight:.0%} of the time; "
                                          "no reading of the device's busy time tells launches from compute")
        return Verdict("unclear", f"waiting for data {stall:.0%} and no reading of the device's busy time")
    if util >= COMPUTE_UTIL:
        return Verdict("compute-bound", f"the device was busy {util:.0%} of the time")
    flight = f", a step in flight {in_flight:.0%} of the time" if in_flight is not None else ""
    near = (f" (waiting for data {stall:.0%} is near the {INPUT_STALL:.0%} at which this reads input-bound: another "
            "run may land on that side)" if stall >= INPUT_STALL / 2 else "")
    return Verdict("launch-bound", f"waiting for data only {stall:.0%}{flight}, yet the device was busy "
                                   f"{util:.0%}: it waited for the host to launch kernels{near}")


# -- arithmetic rates ---------------------------------------------------------------------------

# Dense peak TFLOP/s of some data-centre GPUs by the precision their tensor cores run ("fp32" is
# TF32 where the card has it: PyTorch's default for convolutions), from NVIDIA's data sheets.
PEAK_TFLOPS = {
    "H200": {"fp32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H100 80GB HBM3": {"fp32": 494.7, "bf16": 989.4, "fp16": 989.4},     # SXM5
    "H100 PCIe": {"fp32": 378.0, "bf16": 756.0, "fp16": 756.0},
    "H100": {"fp32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "A100": {"fp32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"fp32": 183.0, "bf16": 362.0, "fp16": 362.0},
    "V100": {"fp32": 15.7, "fp16": 125.0},
    "T4": {"fp32": 8.1, "fp16": 65.0},
}


def peak_tflops(name: str, precision: str = "fp32") -> float | None:
    """The dense peak of the card whose name contains a key of `PEAK_TFLOPS` (the longest match),
    for `precision`; None when the card or the precision is not listed."""
    matches = [key for key in PEAK_TFLOPS if key.lower() in (name or "").lower()]
    if not matches:
        return None
    return PEAK_TFLOPS[max(matches, key=len)].get(precision)


def training_flops_per_sample(model=None, image_size: int = 32) -> float:
    """Floating-point operations of one training step per sample (forward + backward) of `model`
    (default: the course's CIFAR ResNet-18), counted by `torch.utils.flop_counter` on the meta
    device: shapes only, nothing runs."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    key = (type(model).__name__, sum(p.numel() for p in model.parameters()), image_size) if model is not None else \
        ("course ResNet-18", None, image_size)
    if key in _FLOPS:
        return _FLOPS[key]
    if model is None:
        from .models import resnet18_cifar
        with torch.device("meta"):
            model = resnet18_cifar()
    else:                                     # a copy, on the meta device: the model itself is not touched
        import copy
        model = copy.deepcopy(model).to("meta")
    x = torch.zeros(2, 3, image_size, image_size, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        model(x).sum().backward()
    _FLOPS[key] = counter.get_total_flops() / 2
    return _FLOPS[key]


_FLOPS: dict = {}


def achieved_tflops(samples_per_s: float, flops_per_sample: float) -> float:
    """TFLOP/s a run achieved: samples/s times the FLOPs per sample."""
    return samples_per_s * flops_per_sample / 1e12


def rate_against_peak(samples_per_s: float, run_on, model=None, precision: str = "fp32") -> str:
    """One sentence: the TFLOP/s a run of `samples_per_s` achieved with `model` (default: the
    course's ResNet-18), against the peak of the device it ran on where that is known: a listed
    GPU, or the simulated box (its profile's card, scaled as its times are)."""
    flops = training_flops_per_sample(model)
    rate = achieved_tflops(samples_per_s, flops)
    profile = getattr(run_on, "profile", None)
    kind = "TF32" if precision == "fp32" else precision
    text = f"{rate:.2f} TFLOP/s ({flops / 1e9:.2f} GFLOP per sample, forward and backward)"
    if profile is not None:
        # The simulated box runs the real card's times multiplied by its scale, and the scale is
        # measured on this host at every start (it moves by a few percent between two runs). So
        # the peak named is the card's own, fixed, and the run's rate is brought back to the
        # card's clock (times the scale) before it is compared: the share is the same as against
        # a scaled peak, but the named peak no longer moves between runs (w2-03).
        peak = peak_tflops(profile.name, precision)
        if not peak:
            return f"{text}; no peak listed for the simulated {profile.name} (course_utils.bottleneck.PEAK_TFLOPS)"
        on_card = rate * run_on.scale
        return (f"{text} on the simulated device, whose times are the {profile.name}'s x{run_on.scale:.2f}: "
                f"{on_card:.2f} TFLOP/s on the {profile.name}'s own clock, {on_card / peak:.1%} of its dense "
                f"{kind} peak, {peak:.0f} TFLOP/s")
    else:
        import torch
        device = torch.device(run_on) if not hasattr(run_on, "type") or run_on.type != "sim" else None
        name = torch.cuda.get_device_name(device) if device is not None and device.type == "cuda" else ""
        peak = peak_tflops(name, precision) if name else None
        where = f"{name}'s dense {kind} peak" if name else ""
    if peak:
        return f"{text}: {rate / peak:.1%} of {where}, {peak:.0f} TFLOP/s"
    return f"{text}; no peak listed for this device (course_utils.bottleneck.PEAK_TFLOPS)"
