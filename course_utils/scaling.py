"""How data parallelism scales: a step on N devices, predicted stage by stage and fitted (lesson 06).

`nn.DataParallel` runs one process. Every step it
(1) splits the batch and copies each piece to its device (*scatter*; from device 0 when the
loader put the batch there, straight from host memory when it did not), (2) copies the
parameters to every device that gets a piece (*replicate*: a broadcast, coalesced into 10 MiB
buckets), (3) runs the replicas side by side, one new Python thread per replica (*parallel
apply*), (4) copies the outputs to `output_device` (device 0 by default: *gather*), computes
the loss there, runs backward on every device (one autograd thread per device) and (5) sums
the gradients into device 0's parameters (*reduce*), where (6) the optimizer steps. Only (3)
and the backward shrink with more devices; everything else is paid once per step, most of it
by device 0. The host launches every kernel of every replica (the course's H100 measured one
device's step launch-bound at batch 128) and adds Python work for every replica.

- `dp_chunk_sizes(batch_size, n_devices)`: how DataParallel splits a batch (`torch.chunk`:
  pieces of ceil(B/n), the last one smaller, so fewer than n devices may get work).
- `StageCosts`: what each stage of one step costs, in ms, with a note saying where each
  figure came from (measured on this machine, or taken from the H100 box, and named).
- `predict_dp(costs, n_devices, batch_size, loader_samples_per_s)`: samples/s, scaling
  efficiency, what bounds the run (loader, host or devices) and each device's utilisation.
- `dp_memory(...)`: the peak bytes each device holds during a step (device 0 holds more), an
  upper bound (activations and gradients counted together).
- `speedup_verdict`, `measured_bound`, `agreement`, `trend`, `fit_verdict`, `copy_verdict`,
  `why_off`: the sentences the lesson prints under its tables, computed from the numbers in them.
- `fit_scaling(n_devices, step_ms)`: the model "step = serial + parallel / n + per_device x (n-1)"
  fitted by least squares to measured step times, to predict devices you have not measured.
- `pipeline_schedule(n_stages, micro_batches, ...)`: model parallelism instead: when each device
  of a model split into stages works, and how idle they are.

Lesson 07 reuses `StageCosts` and `fit_scaling` to reason about DDP against DP.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

__all__ = ["dp_chunk_sizes", "StageCosts", "DPPrediction", "host_ms", "predict_dp", "dp_memory", "speedup_verdict",
           "speedup_range_verdict", "agreement_range",
           "measured_bound", "agreement", "trend", "fit_verdict", "copy_verdict", "why_off",
           "ScalingFit", "fit_scaling", "PipelineSchedule", "pipeline_schedule"]


def dp_chunk_sizes(batch_size: int, n_devices: int) -> list[int]:
    """The sizes DataParallel splits `batch_size` samples into for `n_devices` (lesson 06).

    DataParallel's scatter calls `tensor.chunk(n_devices)`: every piece has ceil(B / n)
    samples except the last, which has what is left, and pieces that would be empty are not
    made. So 10 samples on 4 devices are 3, 3, 3, 1, and 5 samples on 4 devices are 2, 2, 1:
    only three devices get work.
    """
    if batch_size < 1 or n_devices < 1:
        raise ValueError(f"batch_size and n_devices must be >= 1, got {batch_size} and {n_devices}")
    size = math.ceil(batch_size / n_devices)
    sizes = []
    left = batch_size
    while left > 0:
        sizes.append(min(size, left))
        left -= sizes[-1]
    return sizes


@dataclass
class StageCosts:
    """What one DataParallel step costs, stage by stage, in milliseconds (lesson 06).

    compute_fixed_ms, compute_per_sample_ms: the device work of one replica on a piece of c
        samples (forward + backward) takes compute_fixed_ms + compute_per_sample_ms * c (each
        device, in parallel);
    scatter_ms_per_sample: copying one sample of the input from device 0 to another device;
    gather_ms_per_sample: copying one sample's output to device 0 (and its gradient back);
    replicate_ms: copying the parameters and buffers from device 0 to the others, once per
        step when two or more devices work (DataParallel broadcasts with NCCL, which pipelines
        the copy: the bytes cross each link once whatever the number of devices, and every
        device takes part);
    reduce_ms: summing the replicas' gradients into device 0's (an NCCL reduce: likewise);
    device0_ms: what only device 0 does: the loss on the gathered outputs, the optimizer step;
    host_step_ms: the host's time to launch one training step on one device (its ~390 kernels,
        eager): with one device DataParallel calls the model directly and this is all the host
        does; with two or more it is paid once too (the backward's kernels are launched by one
        autograd thread per device, side by side);
    host_ms_per_replica: what each replica adds to the host's step when DataParallel has two or
        more devices: replicate's Python work (a copy of every module), its thread, and the part
        of its forward launches that holds Python's lock, which the other replicas' threads
        wait for;
    forward_share: the forward pass's share of compute (the rest is backward).

    `notes` maps a field name to where its figure came from; `describe()` prints them.
    """
    compute_fixed_ms: float
    compute_per_sample_ms: float
    scatter_ms_per_sample: float = 0.0
    gather_ms_per_sample: float = 0.0
    replicate_ms: float = 0.0
    reduce_ms: float = 0.0
    device0_ms: float = 0.0
    host_step_ms: float = 0.0
    host_ms_per_replica: float = 0.0
    forward_share: float = 1.0 / 3.0
    notes: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        for f in fields(self):
            if f.name == "notes":
                continue
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"StageCosts.{f.name} must be a finite number >= 0, got {value!r}")
        if not 0 < self.forward_share < 1:
            raise ValueError(f"forward_share must be between 0 and 1, got {self.forward_share}")

    def compute_ms(self, samples: int) -> float:
        """Forward + backward of one replica on `samples` samples."""
        return self.compute_fixed_ms + self.compute_per_sample_ms * samples

    def describe(self) -> str:
        """One line per stage: its cost and where the figure came from."""
        lines = []
        for f in fields(self):
            if f.name == "notes":
                continue
            note = self.notes.get(f.name, "")
            value = getattr(self, f.name)
            # 4 decimals, or 3 significant digits for a cost under 0.01 (a per-sample copy of a few bytes)
            digits = 4 if value == 0 or abs(value) >= 0.01 else 2 - math.floor(math.log10(abs(value)))
            lines.append(f"{f.name:24s} {value:10.{digits}f}" + (f"   {note}" if note else ""))
        return "\n".join(lines)


@dataclass
class DPPrediction:
    """What `predict_dp` expects of one configuration (lesson 06). Times in ms per step."""
    n_devices: int
    batch_size: int
    chunks: list
    device_ms: float              # the devices' share of a step (serial stages + the slowest piece)
    host_ms: float                # the host's work per step (launches, and Python per replica)
    loader_ms: float              # the loader's time to produce one batch (0 for an unlimited loader)
    samples_per_s: float
    efficiency: float             # samples_per_s / (n_devices x one device at the per-device batch)
    bound: str                    # "loader", "host" or "devices": the slowest of the three
    breakdown: dict               # device time by stage: compute, scatter + gather, replicate + reduce, device 0
    utilisation: list             # each device's busy share of a step

    @property
    def step_ms(self) -> float:
        return max(self.device_ms, self.host_ms, self.loader_ms)

    @property
    def devices_used(self) -> int:
        return len(self.chunks)


def _device_ms(costs: StageCosts, chunks: list[int], batch_size: int) -> tuple[float, dict]:
    biggest, used = chunks[0], len(chunks)
    moved = batch_size - biggest                         # samples that leave (and return to) device 0
    parts = {
        "compute (slowest piece)": costs.compute_ms(biggest),
        "scatter + gather": moved * (costs.scatter_ms_per_sample + costs.gather_ms_per_sample),
        "replicate + reduce": (costs.replicate_ms + costs.reduce_ms) if used > 1 else 0.0,
        "device 0 only (loss, optimizer)": costs.device0_ms,
    }
    return sum(parts.values()), parts


def host_ms(costs: StageCosts, n_devices: int, pieces: int) -> float:
    """The host's time per step: one step's launches, plus, when DataParallel has two or more
    devices, `host_ms_per_replica` for every replica it makes (one per piece: a batch of one
    sample on four devices still gets a replica, on device 0; one device is a pass-through)."""
    return costs.host_step_ms + (costs.host_ms_per_replica * pieces if n_devices > 1 else 0.0)


def predict_dp(costs: StageCosts, n_devices: int, batch_size: int,
               loader_samples_per_s: float = math.inf) -> DPPrediction:
    """Predict a DataParallel step on `n_devices` at global batch `batch_size` (lesson 06).

    The devices' time per step is the serial stages plus the slowest piece's compute; the
    host's is one step's launches plus, with two or more devices, `host_ms_per_replica` for
    each replica (`host_ms`); the loader needs batch / its samples/s. The three work at the
    same time (the host runs ahead of the devices, the loader's workers run ahead of the
    host), so the slowest sets the pace. Efficiency compares with `n_devices` independent
    devices, each training alone on the per-device batch (the first piece) from the same loader.
    """
    if not loader_samples_per_s > 0:
        raise ValueError(f"loader_samples_per_s must be > 0, got {loader_samples_per_s}")
    chunks = dp_chunk_sizes(batch_size, n_devices)
    device_ms, parts = _device_ms(costs, chunks, batch_size)
    host = host_ms(costs, n_devices, len(chunks))
    loader_ms = 1e3 * batch_size / loader_samples_per_s if math.isfinite(loader_samples_per_s) else 0.0
    step_ms = max(device_ms, host, loader_ms)
    samples_per_s = 1e3 * batch_size / step_ms if step_ms > 0 else math.inf
    bound = max([("loader", loader_ms), ("host", host), ("devices", device_ms)], key=lambda kv: kv[1])[0]
    collective = parts["replicate + reduce"]          # NCCL's broadcast and reduce run on every device used
    busy = [device_ms] + [collective + costs.compute_ms(c) for c in chunks[1:]]
    busy += [0.0] * (n_devices - len(chunks))
    utilisation = [b / step_ms if step_ms > 0 else 0.0 for b in busy]
    if n_devices == 1:
        efficiency = 1.0
    else:
        alone = predict_dp(costs, 1, chunks[0], loader_samples_per_s).samples_per_s
        efficiency = samples_per_s / (n_devices * alone)
    return DPPrediction(n_devices, batch_size, chunks, device_ms, host, loader_ms, samples_per_s,
                        efficiency, bound, parts, utilisation)


def dp_memory(n_devices: int, batch_size: int, *, param_bytes: int, optimizer_bytes: int,
              input_bytes: int, activation_bytes: int, output_bytes: int, batch_on_device0: bool = True) -> list[int]:
    """The peak bytes each device holds during a DataParallel step (lesson 06), an upper bound,
    with `input_bytes`, `activation_bytes` and `output_bytes` per sample, `param_bytes` one copy
    of the parameters (their gradients are as large) and the batch split as DataParallel splits it.

    Backward makes a layer's gradients while the activations of the layers before it are still
    held, and a CNN has most of its parameters in its last layers, whose gradients come first:
    the course's ResNet-18 measured close to activations + gradients, not the larger of the two
    (lesson 06 measures it). So a device's working memory is counted as both together:

    one device (DataParallel calls the model directly): the parameters, the optimizer state,
        the batch's input, its activations, its outputs and their gradient, and the gradients;
    device 0 with two or more devices: the parameters and the optimizer state; the input: the
        whole batch when the loader put it on device 0 (`batch_on_device0`), else its own piece
        (scatter copies each piece from host memory); its replica's gradients; and the larger
        of (its piece's activations + the gathered outputs and their gradient), during backward,
        and (the reduce's result: another copy of the gradients), at the end of backward, when
        the reduce holds every replica's gradients, device 0's included, and allocates their sum;
    device k with a piece of c samples: the replica's parameters, c samples of input and of
        activations, and the replica's gradients;
    a device that gets no piece: nothing (DataParallel does not replicate onto it).
    """
    chunks = dp_chunk_sizes(batch_size, n_devices)
    first = chunks[0]
    p, gathered = param_bytes, 2 * batch_size * output_bytes
    if n_devices == 1:
        return [int(p + optimizer_bytes + batch_size * input_bytes + batch_size * activation_bytes + gathered + p)]
    on0 = batch_size if batch_on_device0 else first
    out = [p + optimizer_bytes + on0 * input_bytes + p + max(first * activation_bytes + gathered, p)]
    out += [p + c * input_bytes + c * activation_bytes + p for c in chunks[1:]]
    out += [0] * (n_devices - len(chunks))
    return [int(v) for v in out]


# -- what a measured table says (the lesson prints these under its tables) ----------------------

def speedup_verdict(speedup: float, n_devices: int, what: str = "") -> str:
    """One sentence on a measured speed-up of `n_devices` over one device (lesson 06); it says
    only what the number says: slower, no faster, faster but under 2x, or the share of N x."""
    who = f"{what}: " if what else ""
    efficiency = speedup / n_devices
    if speedup < 0.9:
        return f"{who}{n_devices} devices ran at {speedup:.2f}x one device: slower than one device"
    if speedup <= 1.1:
        return f"{who}{n_devices} devices ran at {speedup:.2f}x one device: no faster than one"
    if speedup < 2.0:
        return f"{who}{n_devices} devices ran at {speedup:.2f}x one device: faster, but not even 2x"
    if efficiency >= 0.85:
        return f"{who}{n_devices} devices ran at {speedup:.2f}x one device: close to {n_devices}x ({efficiency:.0%} of it)"
    return f"{who}{n_devices} devices ran at {speedup:.2f}x one device ({efficiency:.0%} of {n_devices}x)"


def _speedup_class(speedup: float) -> str:
    return ("slower than one device" if speedup < 0.9 else "no faster than one" if speedup <= 1.1 else
            "under 2x" if speedup < 2.0 else "2x or more")


def speedup_range_verdict(speedup: float, low: float, high: float, n_devices: int, what: str = "") -> str:
    """`speedup_verdict`, or, where the speed-ups of the runs' halves (`low` to `high`) fall on
    both sides of one of its lines (0.9x, 1.1x, 2x), a sentence that says so instead of a verdict
    that the next run may flip (lesson 06, w2-06)."""
    low, high = min(low, high, speedup), max(low, high, speedup)
    if _speedup_class(low) == _speedup_class(high):
        return speedup_verdict(speedup, n_devices, what)
    who = f"{what}: " if what else ""
    # every line the halves cross, and every class between them (w6-06: 0.84x to 1.11x crosses 0.9x and 1.1x,
    # 'slower than one device / no faster than one / under 2x', not one line and two classes)
    edges = [e for e in (0.9, 1.1, 2.0) if _speedup_class(low) != _speedup_class(high)
             and (low < e <= high if e != 1.1 else low <= e < high)]
    classes = []
    for value in [low] + [e + (1e-9 if e == 1.1 else 0.0) for e in edges] + [high]:
        if _speedup_class(value) not in classes:
            classes.append(_speedup_class(value))
    lines = " and ".join(f"{e:g}x" for e in edges)
    return (f"{who}{n_devices} devices ran at {speedup:.2f}x one device; the runs' halves give {low:.2f}x to "
            f"{high:.2f}x, on both sides of {lines} ({' / '.join(classes)}): the halves "
            "disagree, so this run cannot say which")


def agreement_range(measured: float, low: float, high: float, predicted: float, tolerance: float = 0.2) -> str:
    """`agreement`, or, where the run's halves (`low`, `high` samples/s) fall one within
    `tolerance` of the prediction and one outside, a phrase that says the halves disagree."""
    low, high = min(low, high, measured), max(low, high, measured)

    def side(m):
        if not predicted > 0:
            return "none"
        return ("within" if abs(m / predicted - 1) <= tolerance else "below" if m < predicted else "above")
    if side(low) == side(high):
        return agreement(measured, predicted, tolerance)
    words = {"within": f"within {tolerance:.0%} of it", "below": f"more than {tolerance:.0%} below",
             "above": f"more than {tolerance:.0%} above"}
    ratio = measured / predicted
    whole = f"{abs(ratio - 1):.0%} {'below' if ratio < 1 else 'above'}"
    # no verdict of its own: "as predicted" beside halves that left the tolerance would say two things
    def num(v):   # samples/s as whole numbers; a ratio (a speed-up, lesson 06's last run) keeps its decimals
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"
    return (f"the halves disagree (they ran {num(low)} to {num(high)}: one {words[side(low)]}, one "
            f"{words[side(high)]}; the whole run {whole} the prediction)")


def measured_bound(device0_busy: float, loop_waiting: float) -> str:
    """What held a measured run back, read from the run itself (lesson 06): "devices" when device
    0 (the busiest) worked at least 85% of the time, "loader" when the training loop waited for
    data at least half of the time, else "host" (the one Python process launching the replicas).
    Both arguments are fractions of the run (0..1)."""
    if device0_busy >= 0.85:
        return "devices"
    if loop_waiting >= 0.5:
        return "loader"
    return "host"


def agreement(measured: float, predicted: float, tolerance: float = 0.2) -> str:
    """How a measured samples/s compares with the model's prediction (lesson 06): "as predicted"
    within `tolerance`, else how far above or below."""
    if not predicted > 0:
        return "no prediction"
    ratio = measured / predicted
    if abs(ratio - 1) <= tolerance:
        return "as predicted"
    return f"{abs(ratio - 1):.0%} {'below' if ratio < 1 else 'above'} the prediction"


def why_off(others_cores: float, usable_cores: int, *, steps: int, smoke: bool, ours_cores: float | None = None) -> str:
    """Why a measured run may miss the model, read from the run (lesson 06): other programs'
    CPU while it ran (the simulated host's launches and Python are real CPU work here, which
    they slow), else a short run, else no reason the run can show."""
    if others_cores >= max(0.25 * usable_cores, 0.3):
        return (f"other programs used {others_cores:.1f} of this machine's {usable_cores} cores during the runs, and the "
                "host's work here is real CPU work that they slow (the model counts this CPU as if it were free)"
                + (f"; ours got {ours_cores:.1f} cores: a run can be host-bound while using little CPU when it waits "
                   "for a core, starved by the others" if ours_cores is not None and ours_cores < 0.5 else ""))
    if smoke:
        return f"smoke size: {steps} steps per run, few for a steady state; run at full size"
    return "the machine was quiet and the runs full size: the model's stages do not explain this run"


def trend(values) -> str:
    """The shape of a sequence of speed-ups (lesson 06): "falls from the start", "rises, then
    falls", "rises, then flattens", "rises" (a change within 5% counts as flat)."""
    values = [float(v) for v in values]
    if len(values) < 2:
        return "one point"
    steps = [b / a - 1 for a, b in zip(values, values[1:])]
    if steps[0] < -0.05:
        return "falls from the start"
    peak = int(np.argmax(values))
    if peak < len(values) - 1 and values[-1] < values[peak] * 0.95:
        return "rises, then falls"
    if any(abs(step) <= 0.05 for step in steps[1:]) or steps[0] <= 0.05:
        return "rises, then flattens"
    return "rises"


def fit_verdict(fit: "ScalingFit", counts, measured_ms, held_out=(), tolerance: float = 0.2,
                spread: float = 0.0) -> list[str]:
    """Lines that say what a scaling fit and the step times under it show (lesson 06), from the
    measurements first: which count was fastest, whether more devices made steps slower, whether
    the held-out counts agree with the fit, and only then what the fit claims. `spread` is how far
    repeated measurements of one count disagreed (0.1: 10%): differences within it are not
    called differences, and a held-out count agrees with the fit within max(tolerance, spread)."""
    counts = [int(n) for n in counts]
    ms = dict(zip(counts, [float(m) for m in measured_ms]))
    best = min(ms, key=ms.get)

    def devices(n):
        return f"{n} device{'s' if n > 1 else ''}"
    between = max(ms.values()) / ms[best] - 1          # how far the counts' steps differ from each other
    if spread > 0.5 or spread >= between:
        return [f"measured: two rounds of one device count disagreed by up to {spread:.0%}"
                + (", more than half a step" if spread > 0.5 else "")
                + f", and the counts' steps differ by up to {between:.0%}: this run can neither rank the counts nor "
                "test the fit (a busy machine; run it again on a quieter one)"]
    near = [n for n in counts if n != best and ms[n] <= ms[best] * (1 + spread)]
    lines = [(f"measured, with rounds that disagree by up to {spread:.0%} (only differences beyond that count): "
              if spread > tolerance else "measured: ")
             + f"the fastest step came with {devices(best)} ({ms[best]:.2f} ms)"
             + (f"; within the rounds' spread ({spread:.0%}) of it: " + ", ".join(f"{devices(n)} {ms[n]:.2f} ms"
                                                                             for n in near) if near else "")]
    slower = [n for n in counts if n > best and n not in near]
    if slower:        # named against the fastest count, with the margin: a count inside the spread is not 'slower'
        lines.append(f"more devices than {best}, slower than its step"
                     + (f" by more than the rounds' spread ({spread:.0%})" if spread > 0 else "") + ": "
                     + ", ".join(f"{n} devices {ms[n]:.2f} ms ({ms[n] / ms[best] - 1:+.0%})" for n in slower))
    misses = []
    allowed = max(tolerance, spread)
    for n in held_out:
        predicted = float(fit.step_ms(n))
        if abs(ms[n] / predicted - 1) > allowed:
            misses.append(f"{n} devices: measured {ms[n]:.2f} ms, the fit {predicted:.2f} ms")
        else:
            off = abs(ms[n] / predicted - 1)
            lines.append(f"held out of the fit, {n} devices took {ms[n]:.2f} ms: the fit predicted {predicted:.2f} ms"
                         + (f" ({off:.0%} off: within the rounds' spread of {spread:.0%}, not within "
                            f"{tolerance:.0%})" if off > tolerance else ""))
    if misses:
        lines.append("the fit does not extrapolate to the held-out counts (" + "; ".join(misses) + ")")
    if fit.per_device_ms > 0 and fit.best_n_devices() < 1:
        lines.append(f"the fit is degenerate: its best count, sqrt(parallel / per-device) = "
                     f"{fit.best_n_devices():.1f}, is below one device, not a count: it finds "
                     + ("nothing" if fit.parallel_ms == 0 else "little")
                     + f" that splits across devices ({fit.parallel_ms:.2f} ms / n) and {fit.per_device_ms:.2f} ms "
                     f"for every extra one, so it names no optimum; the measured best was {best}"
                     + (f"; with rounds {spread:.0%} apart another run can fit other parts" if spread > tolerance
                        else ""))
    elif fit.per_device_ms > 0 and spread > tolerance:
        # the parts move with the noise (w7-06: 0.00 ms / n in one run, 29.86 in the next): no optimum from them
        lines.append(f"the fit names no best device count: with rounds {spread:.0%} apart (more than "
                     f"{tolerance:.0%}) its three parts are as uncertain as the rounds, and the count they imply "
                     f"(here {fit.best_n_devices():.1f}) moves from run to run; the measured best was {best}")
    elif fit.per_device_ms > 0:
        where = fit.best_n_devices()
        lines.append(f"the fit puts the best device count near {where:.1f} (where parallel / n^2 = per-device)"
                     + ("" if not misses and abs(where - best) <= 1.5 else f"; the measured best was {best}"))
    elif slower or misses:
        lines.append("the fit finds no per-device cost, yet the measurements above show one: trust them, not "
                     "the fit, beyond the counts it was fitted on")
    elif fit.serial_ms > 0:
        lines.append(f"the fit finds no per-device cost: within these counts every device helped, and its serial "
                     f"part caps the speed-up at {fit.step_ms(1) / fit.serial_ms:.1f}x however many devices")
    else:
        lines.append("the fit finds neither a serial nor a per-device cost: perfect scaling, within these counts")
    return lines


def copy_verdict(tensors: int, nbytes: int, copy_ms: float, one_copy_ms: float) -> str:
    """What a stage that copies `tensors` tensors of `nbytes` in all in `copy_ms` spent its time
    on, given `one_copy_ms` for the same bytes as one tensor (lesson 06: replicate)."""
    rate = nbytes / (copy_ms / 1e3) / 1e9
    one_rate = nbytes / (one_copy_ms / 1e3) / 1e9
    per_tensor_us = max(copy_ms - one_copy_ms, 0.0) * 1e3 / max(tensors, 1)
    if one_copy_ms * 3 < copy_ms:
        return (f"{tensors} tensors, {nbytes / 1e6:.2f} MB, in {copy_ms:.2f} ms ({rate:.2f} GB/s); the same bytes as "
                f"one tensor copy in {one_copy_ms:.3f} ms ({one_rate:.1f} GB/s): the stage's time is mostly a cost "
                f"per tensor (about {per_tensor_us:.0f} us each), not memory bandwidth")
    return (f"{tensors} tensors, {nbytes / 1e6:.2f} MB, in {copy_ms:.2f} ms ({rate:.2f} GB/s); the same bytes as one "
            f"tensor copy in {one_copy_ms:.3f} ms ({one_rate:.1f} GB/s): the stage runs at about the speed of "
            "copying its bytes")


@dataclass
class ScalingFit:
    """step_ms(n) = serial_ms + parallel_ms / n + per_device_ms x (n - 1), fitted (lesson 06).

    serial_ms: what no number of devices shortens; parallel_ms: what splits across devices;
    per_device_ms: what every extra device adds (its copies, its thread). Fitted at one
    global batch size, so it predicts that batch size.
    """
    serial_ms: float
    parallel_ms: float
    per_device_ms: float
    batch_size: int
    n_devices: list = field(default_factory=list, repr=False)
    measured_ms: list = field(default_factory=list, repr=False)

    def step_ms(self, n_devices) -> float:
        n = np.asarray(n_devices, dtype=float)
        value = self.serial_ms + self.parallel_ms / n + self.per_device_ms * (n - 1)
        return float(value) if value.ndim == 0 else value

    def samples_per_s(self, n_devices, loader_samples_per_s: float = math.inf):
        """Predicted samples/s on `n_devices`, capped by the loader's samples/s."""
        return np.minimum(1e3 * self.batch_size / np.asarray(self.step_ms(n_devices)), loader_samples_per_s)

    def speedup(self, n_devices) -> float:
        """Samples/s on `n_devices` over samples/s on one (same global batch)."""
        return self.step_ms(1) / self.step_ms(n_devices)

    def best_n_devices(self) -> float:
        """Where adding a device stops paying: sqrt(parallel / per_device) (inf if no per-device cost)."""
        return math.sqrt(self.parallel_ms / self.per_device_ms) if self.per_device_ms > 0 else math.inf

    @property
    def residuals_ms(self) -> list:
        return [m - self.step_ms(n) for n, m in zip(self.n_devices, self.measured_ms)]

    def __str__(self) -> str:
        return (f"step ≈ {self.serial_ms:.2f} ms + {self.parallel_ms:.2f} ms / n + {self.per_device_ms:.2f} ms × (n − 1)"
                f"  (batch {self.batch_size}; largest misfit {max(map(abs, self.residuals_ms), default=0):.2f} ms)")


def fit_scaling(n_devices, step_ms, batch_size: int) -> ScalingFit:
    """Fit `ScalingFit` by least squares to step times measured on `n_devices` (three or more
    distinct counts) at one global `batch_size`; the three coefficients are kept >= 0."""
    n = np.asarray(n_devices, dtype=float)
    y = np.asarray(step_ms, dtype=float)
    if n.shape != y.shape or len(np.unique(n)) < 3:
        raise ValueError("fit_scaling needs step times measured on three or more different device counts")
    if np.any(n < 1) or np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("device counts must be >= 1 and step times positive and finite")
    design = np.stack([np.ones_like(n), 1.0 / n, n - 1.0], axis=1)
    coef = _nonnegative_lstsq(design, y)
    return ScalingFit(float(coef[0]), float(coef[1]), float(coef[2]), int(batch_size), n.tolist(), y.tolist())


def _nonnegative_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: the best over all subsets of active columns
    (three columns: eight subsets, exact and simple)."""
    best, best_err = np.zeros(a.shape[1]), float(np.sum(y ** 2))
    cols = range(a.shape[1])
    for mask in range(1, 2 ** a.shape[1]):
        active = [c for c in cols if mask >> c & 1]
        coef, *_ = np.linalg.lstsq(a[:, active], y, rcond=None)
        if np.any(coef < 0):
            continue
        full = np.zeros(a.shape[1])
        full[active] = coef
        err = float(np.sum((a @ full - y) ** 2))
        if err < best_err - 1e-12:
            best, best_err = full, err
    return best


@dataclass
class PipelineSchedule:
    """When each stage of a model split across devices works (lesson 06: model parallelism).

    intervals: (device, micro_batch, "forward" | "backward", start_ms, end_ms); total_ms: one
    step; utilisation: each device's busy share of the step; bubble: the idle share overall.
    """
    n_stages: int
    micro_batches: int
    intervals: list
    total_ms: float
    utilisation: list

    @property
    def bubble(self) -> float:
        return 1.0 - sum(self.utilisation) / len(self.utilisation)


def pipeline_schedule(n_stages: int, micro_batches: int, forward_ms: float, backward_ms: float) -> PipelineSchedule:
    """A model cut into `n_stages` equal parts, one per device, the batch cut into
    `micro_batches` (lesson 06). All forwards run first, then all backwards in reverse order
    (the GPipe schedule): a device starts a micro-batch as soon as it has the previous stage's
    output and is free. `forward_ms` / `backward_ms` are one stage's time for one micro-batch.
    With one micro-batch (plain model parallelism) the devices work strictly in turn."""
    if n_stages < 1 or micro_batches < 1:
        raise ValueError("n_stages and micro_batches must be >= 1")
    free = [0.0] * n_stages
    done = {}
    intervals = []
    for m in range(micro_batches):
        for s in range(n_stages):
            start = max(free[s], done.get((s - 1, m), 0.0))
            done[(s, m)] = free[s] = start + forward_ms
            intervals.append((s, m, "forward", start, start + forward_ms))
    back = {}
    for m in range(micro_batches):
        for s in reversed(range(n_stages)):
            ready = back.get((s + 1, m), done[(n_stages - 1, micro_batches - 1)] if s == n_stages - 1 else 0.0)
            start = max(free[s], ready)
            back[(s, m)] = free[s] = start + backward_ms
            intervals.append((s, m, "backward", start, start + backward_ms))
    total = max(end for *_, end in intervals)
    busy = [micro_batches * (forward_ms + backward_ms)] * n_stages
    return PipelineSchedule(n_stages, micro_batches, intervals, total, [b / total for b in busy])
