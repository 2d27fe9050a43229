"""Checks for lesson 04 (GPU augmentation with DALI).

Every check builds the learner's DALI pipeline on fresh inputs: random CIFAR-style records
(noise images, so that a crop can only match one window) or a fresh folder of solid-colour
JPEGs of random sizes (so that a sample's colour and decoded size say which file it came from).
Where DALI cannot be imported, each check says so in one sentence.

Where the work runs, and with which arguments, the checks read from the pipeline's graph without
building it (`_graph`: DALI 2.4's Python graph, the version requirements.txt pins): a
`device="gpu"` pipeline made in a process whose LOCAL_RANK is 3 must ask for GPU 3 and run its
augmentation (4.3: its decoding, "mixed") on the GPU, which a machine without a GPU can check as
well as one with it (issue 37: three answers that never used the GPU passed on every CPU).
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import data
from ..crop_match import match_crops
from ..env import has_dali, usable_cores
from ._core import CheckFailed, WrongType, calling, exercise, expect_callable
from ._util import forbids, fresh_rng

DALI_MISSING = ("NVIDIA DALI cannot be imported on this machine (install the nvidia-dali-cuda130 wheel at the version "
                "requirements.txt pins), so this exercise cannot be graded here.")


def _require_dali() -> None:
    if not has_dali():
        raise WrongType("DALI", DALI_MISSING)


def _threads() -> int:
    """The num_threads the checks pass: never the signature's default (2), 1, nor this machine's core
    counts, so that a number written into the answer (w2-04: num_threads=2 on a 2-core machine passed)
    or os.cpu_count() shows on every machine and seed. A few threads more than the cores cost little."""
    taken = {1, 2, usable_cores(), os.cpu_count() or 1}
    return next(k for k in (3, 4, 5, 6) if k not in taken)


def _devices() -> list[str]:
    return ["cpu"] + (["gpu"] if torch.cuda.is_available() else [])


def _expect_pipeline(pipe, what: str):
    from nvidia.dali import Pipeline
    if not isinstance(pipe, Pipeline):
        got = "None (did the function forget to return the pipeline?)" if pipe is None else type(pipe).__name__
        raise WrongType("type", f"{what} should return a DALI Pipeline (what calling a @pipeline_def "
                        f"function gives), but it returned {got}.")
    return pipe


def _num_outputs(pipe, needed: int, names: str) -> int:
    n = pipe.num_outputs   # builds the pipeline
    if n < needed:
        raise CheckFailed(f"has {needed} outputs", f"your pipeline has {n} output(s); expected {needed}: {names}",
                          "return them from the @pipeline_def function as a tuple, in that order")
    return n


def _random_records(rng, n: int) -> np.ndarray:
    records = rng.integers(0, 256, (n, data.RECORD_BYTES), dtype=np.uint8)
    records[:, 0] = rng.integers(0, 10, n)
    return records


def _sources(records, indices) -> np.ndarray:
    return np.ascontiguousarray(records[indices, 1:]).reshape(-1, 3, 32, 32)


def _to_numpy(tl) -> np.ndarray:
    """A DALI TensorList (CPU or GPU) as one NumPy array."""
    if type(tl).__name__ == "TensorListGPU":
        tl = tl.as_cpu()
    try:
        return np.array(tl.as_tensor())
    except Exception:   # samples of different shapes
        raise CheckFailed("every sample has the same shape", "the samples of one batch have different shapes",
                          "crop every image to the same size")


def _as_numpy(t) -> np.ndarray:
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


# -- a pipeline's graph, read without building it ----------------------------------------------

@dataclass
class _Op:
    """One operator of a pipeline's graph."""
    kind: str           # DALI's operator: "CropMirrorNormalize", "Image", "File", "CoinFlip", ...
    module: str         # where fn keeps it: "nvidia.dali.fn", "nvidia.dali.fn.decoders", ...
    device: str         # "cpu", "mixed" or "gpu"
    args: dict          # the arguments it was given (defaults are not listed)
    node: object        # DALI's operator instance

    @property
    def source(self) -> bool:
        """Brings data in (an external source, a reader) rather than working on it."""
        return self.kind == "ExternalSource" or self.module.endswith(".readers")

    @property
    def decoder(self) -> bool:
        return self.module.endswith(".decoders")

    @property
    def metadata(self) -> bool:
        """Reads a shape, not the pixels (images.shape(), fn.peek_image_shape)."""
        return self.kind in ("_Shape", "Shapes", "PeekImageShape")


def _graph(pipe) -> list[_Op] | None:
    """The operators of `pipe`, from its Python graph: defined (the learner's graph function runs)
    but not built, so no GPU is needed. None where this DALI keeps its graph elsewhere (the checks
    then grade on the outputs alone; a unit test pins the version this works with)."""
    try:
        if not getattr(pipe, "_py_graph_built", False):
            pipe._build_graph()
        return [_Op(type(op._op).__name__, str(op._op._init_args.get("_module", "")), str(op._op.device),
                    {k: v for k, v in op._op._init_args.items() if not k.startswith("_")}, op) for op in pipe._ops]
    except AttributeError:
        return None


def _upstream(pipe, ops: list[_Op], output: int, *, data_only: bool) -> list[_Op]:
    """The operators pipeline output `output` comes from: with `data_only`, those the images travel
    through (from a source, through data inputs, to the output: not a crop window computed on the
    side), else every one it depends on (a random crop position too)."""
    by_name = {op.node.name: op for op in ops}

    def inputs_of(inst):
        inputs = list(inst.inputs)
        return inputs[:inst.spec.NumRegularInput()] if data_only else inputs

    carries = {}

    def from_source(inst) -> bool:      # does data from a source reach this operator through data inputs?
        if inst.name not in carries:
            carries[inst.name] = False
            op = by_name.get(inst.name)
            carries[inst.name] = bool(op and op.source) or any(
                x.source is not None and from_source(x.source) for x in inputs_of(inst))
        return carries[inst.name]

    seen, found, todo = set(), [], [pipe._graph_outputs[output].source]
    while todo:
        inst = todo.pop()
        if inst is None or inst.name in seen or inst.name not in by_name:
            continue
        seen.add(inst.name)
        if data_only and not from_source(inst):
            continue
        found.append(by_name[inst.name])
        todo.extend(x.source for x in inputs_of(inst))
    return found


def _names(ops) -> str:
    names = sorted({op.kind for op in ops})
    return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1] if names else ""


def _expect_placement(pipe, device: str, what: str, seed: int, *, decoder: bool = False) -> None:
    """device="cpu": no operator and no output on the GPU. device="gpu": every operator that works
    on the images (output 0) between their source and the output runs on the GPU, the decoder
    (`decoder=True`) as "mixed"; argument inputs (random numbers) and shapes may stay on the CPU."""
    ops = _graph(pipe)
    if ops is None:
        return
    if device == "cpu":
        on_gpu = [op for op in ops if op.device != "cpu"]
        if on_gpu or any(o.device != "cpu" for o in pipe._graph_outputs):
            raise CheckFailed("device='cpu' is a CPU-only pipeline",
                              f"{what}: {_names(on_gpu) or 'an output'} on the GPU (seed {seed})",
                              "with device='cpu' use no .gpu() and no device='mixed': a CPU-only pipeline runs where "
                              "there is no GPU, and device_id=None")
        return
    path = _upstream(pipe, ops, 0, data_only=True)
    work = [op for op in path if not op.source and not op.metadata]
    if decoder:
        decoders = [op for op in work if op.decoder]
        on_cpu = [op for op in decoders if op.device != "mixed"]
        if on_cpu:
            raise CheckFailed("device='gpu' decodes on this process's GPU",
                              f"{what}: your {_names(on_cpu)} decoder runs on the CPU (device={on_cpu[0].device!r}; "
                              f"read from the pipeline's graph without building it) (seed {seed})",
                              "fn.decoders.image(..., device='mixed'): the CPU parses the files, the GPU decodes; "
                              "the operators after it then run on the GPU")
        work = [op for op in work if not op.decoder]
    if not work and not decoder:
        raise CheckFailed("device='gpu' augments on this process's GPU",
                          f"{what}: no DALI operator works on the images between the source and the output: they "
                          f"come out as the source gave them (seed {seed})",
                          "the augmentation is DALI's work: images.gpu() right after the source, then crop, flip "
                          "and normalise with DALI's operators, which then run on the GPU")
    on_cpu = [op for op in work if op.device == "cpu"]
    if on_cpu:
        copied = pipe._graph_outputs[0].device == "gpu"
        verb = "runs" if len({op.kind for op in on_cpu}) == 1 else "run"
        detail = (f"{_names(on_cpu)} {verb} on the CPU and the result is copied to the GPU afterwards" if copied else
                  f"{_names(on_cpu)} {verb} on the CPU and the images never reach the GPU")
        raise CheckFailed("device='gpu' augments on this process's GPU" if not decoder else
                          "device='gpu' decodes on this process's GPU",
                          f"{what}: {detail} (read from the pipeline's graph without building it; seed {seed})",
                          "move the images to the GPU before the work (images.gpu() right after the source"
                          + (", or the mixed decoder" if decoder else "") + "): the operators after it then run "
                          "there, on the process's GPU, and the CPU is left free")


_COMPARISON = re.compile(r"^(lt|gt|leq|geq)\((\S+) (\S+)\)$")


def _choice_values(op: _Op) -> list[float] | None:
    """The values an fn.random.choice draws from (its constant input, or 0..n-1 for an integer n)."""
    inputs = list(op.node.inputs)
    src = inputs[0].source if inputs and inputs[0].source is not None else None
    const = getattr(src, "_op", None)
    args = getattr(const, "_init_args", {}) if const is not None else {}
    for key in ("fdata", "idata"):
        if key in args:
            data = args[key]
            values = [float(v) for v in (data if isinstance(data, (list, tuple)) else [data])]
            if len(values) == 1 and key == "idata" and values[0] >= 1:
                return [float(k) for k in range(int(values[0]))]
            return values
    return None


def _integer_type(dtype) -> str | None:
    """The name of an integer DALI type (INT32, UINT8, ...), None for any other (BOOL, FLOAT)."""
    name = getattr(dtype, "name", None) or (str(dtype) if dtype is not None else "")
    name = name.rsplit(".", 1)[-1]
    return name if re.fullmatch(r"U?INT(8|16|32|64)", name) else None


_AFFINE = re.compile(r"^(add|sub|mul|fdiv)\((\S+) (\S+)\)$")


def _affine_step(op: _Op):
    """(sign, constant, the map) of an arithmetic operator on one tensor and one constant that maps a
    range onto a range (x + c, x - c, c - x, x * c, c * x, x / c); None for any other."""
    m = _AFFINE.match(str(op.args.get("expression_desc", "")))
    consts = list(op.args.get("real_constants", []) or []) + list(op.args.get("integer_constants", []) or [])
    if not m or len(consts) != 1:
        return None
    c, (name, a, _) = float(consts[0]), m.groups()
    first = a.startswith("&")
    if name == "add":
        return "+", c, lambda x: x + c
    if name == "mul":
        return "*", c, lambda x: x * c
    if name == "sub":
        return ("-", c, lambda x: x - c) if first else ("subtracted from", c, lambda x: c - x)
    if name == "fdiv" and first and c != 0:
        return "/", c, lambda x: x / c
    return None


def _affine_chain(op: _Op, by_name: dict):
    """(the continuous fn.random.uniform(range=...), the affine steps from it to `op`'s one input,
    first step first) where `op`'s input is such a draw with at most 4 steps of arithmetic with one
    constant in between (u + c, c + u, u - c, c - u, u * c, c * u, u / c); None for any other input
    (w11-04 y01: `uniform(range=[0, 1]) + 0.01 > 0.5`, a coin of 0.51, was not read and passed)."""
    inputs = list(op.node.inputs)
    src = by_name.get(inputs[0].source.name) if len(inputs) == 1 and inputs[0].source is not None else None
    steps = []
    while src is not None and src.kind == "_ArithmeticGenericOp" and len(steps) < 4:
        step = _affine_step(src)
        inputs = list(src.node.inputs)
        if step is None or len(inputs) != 1 or inputs[0].source is None:
            return None
        steps.insert(0, step)
        src = by_name.get(inputs[0].source.name)
    if src is None or src.kind != "Uniform" or "values" in src.args or src.args.get("dtype") is not None:
        return None
    return src, steps


def _shown(steps) -> str:
    """The draw and its arithmetic as the learner wrote it, with {lo} and {hi} for the range."""
    shown = "fn.random.uniform(range=[{lo:g}, {hi:g}])"
    for i, (sign, c, _) in enumerate(steps):
        inner = f"({shown})" if i else shown
        shown = f"{c:g} - {inner}" if sign == "subtracted from" else f"{inner} {sign} {c:g}"
    return shown


def _rounded_uniform(op: _Op, by_name: dict) -> tuple[str, list[float]] | None:
    """An integer rounded from a continuous fn.random.uniform(range=[lo, hi)), as DALI draws it: a
    Cast to an integer type of a Uniform, or a Uniform given an integer dtype. DALI rounds to the
    nearest integer, so k comes with the share of [lo, hi) within [k - 1/2, k + 1/2) (an unsigned type
    saturates below 0 to 0; a Uniform given an integer dtype first cuts [lo, hi) to integers, towards
    zero): (how it is drawn, the chances of its integers), None for any other op
    (w10-04 w41_23: cast(uniform(range=[-0.4, 8.4])) gives 0 and 8 at 10.2% each, not 11.1%, and passed
    on 5 of 8 seeds, where only the measured rates could tell)."""
    name = _integer_type(op.args.get("dtype"))
    steps = []          # affine steps between the draw and the cast (the near miss: cast(u * 8) of a range short by 0.05)
    if op.kind == "Cast":
        chain = _affine_chain(op, by_name)
        if chain is None:
            return None
        uniform, steps = chain
        how = "fn.cast(" + _shown(steps) + ", dtype={name})"
        rounds = "which DALI's cast rounds to the nearest integer"
    elif op.kind == "Uniform" and "values" not in op.args:
        uniform, how = op, "fn.random.uniform(range=[{lo:g}, {hi:g}], dtype={name})"
        # DALI 2.4's uniform with an integer dtype cuts the range's ends to integers (towards zero) and
        # rounds a continuous draw between them to the nearest integer (measured: range=[-0.5, 8.5] and
        # [0, 8] both give 0 and 8 at 6.25%, the others at 12.5%; [0, 1] gives 0 and 1 at 50%): no range
        # gives its integers equal chances (w11-04 x07: the hint said it rounds from a continuous draw,
        # which made [-0.5, 8.5) look uniform)
        rounds = "which DALI draws as a continuous value in [{ilo:g}, {ihi:g}) (the range's ends cut to integers) rounded to the nearest integer"
    else:
        return None
    try:
        lo, hi = (float(v) for v in uniform.args.get("range", (-1.0, 1.0)))
    except (TypeError, ValueError):
        return None
    drawn = how.format(lo=lo, hi=hi, name=name)
    if op.kind == "Uniform":
        lo, hi = float(math.trunc(lo)), float(math.trunc(hi))
        if name.startswith("U"):
            lo, hi = max(lo, 0.0), max(hi, 0.0)
        rounds = rounds.format(ilo=lo, ihi=hi)
    for _, _, f in steps:
        lo, hi = sorted((f(lo), f(hi)))
    if not hi > lo:
        return None
    ks = range(math.floor(lo + 0.5), math.ceil(hi + 0.5))
    mass = {k: max(0.0, min(hi, k + 0.5) - max(lo, k - 0.5)) / (hi - lo) for k in ks}
    if name.startswith("U"):
        mass = {k: m for k, m in mass.items() if k > 0} | {0: sum(m for k, m in mass.items() if k <= 0)}
    mass = {k: m for k, m in sorted(mass.items()) if m > 0}
    first, last = min(mass), max(mass)
    chances = ", ".join(f"{m:.2%}" for m in mass.values())
    return (drawn + f", {rounds}: {first}..{last} with chances {chances}", list(mass.values()))


def _random_draws(pipe, output: int = 0) -> list[tuple[str, str, object]]:
    """The random draws output `output` depends on, read from the graph: ("flip", how, p) for a coin
    (fn.random.coin_flip, fn.random.uniform(range=...) compared with a constant, fn.random.choice of two
    values), ("choice", how, p-list) for a weighted fn.random.choice of more values. [] where the graph
    cannot be read."""
    ops = _graph(pipe)
    if ops is None:
        return []
    by_name = {op.node.name: op for op in ops}
    found = []
    for op in _upstream(pipe, ops, output, data_only=False):
        if op.kind == "CoinFlip":
            p = op.args.get("probability", 0.5)
            if isinstance(p, (int, float)):
                found.append(("flip", f"fn.random.coin_flip(probability={float(p):g})", float(p)))
        elif op.kind == "Choice":
            values = _choice_values(op)
            weights = op.args.get("p")
            if values is None:
                continue
            if weights is None:
                weights = [1 / len(values)] * len(values)
            weights = [float(w) for w in (weights if isinstance(weights, (list, tuple)) else [weights])]
            if len(weights) != len(values):
                continue
            shown = ", ".join(f"{w:g}" for w in weights)
            if len(values) == 2:
                p = sum(w for v, w in zip(values, weights) if v != 0) / sum(weights)
                found.append(("flip", f"fn.random.choice of 2 values with p=[{shown}]", p))
            elif max(weights) - min(weights) > 1e-9:
                found.append(("choice", f"fn.random.choice of {len(values)} values with p=[{shown}]", weights))
        elif op.kind in ("Cast", "Uniform") and _integer_type(op.args.get("dtype")):
            rounded = _rounded_uniform(op, by_name)
            if rounded is not None:
                how, weights = rounded
                if max(weights) - min(weights) > 1e-9 * max(weights):
                    found.append(("choice", how, weights))
        elif op.kind == "_ArithmeticGenericOp":
            # a uniform draw, through arithmetic with constants (u + c, c * u, ...), compared with a constant
            m = _COMPARISON.match(str(op.args.get("expression_desc", "")))
            consts = list(op.args.get("real_constants", []) or []) + list(op.args.get("integer_constants", []) or [])
            chain = _affine_chain(op, by_name) if m and len(consts) == 1 else None
            if chain is None:
                continue
            src, steps = chain
            try:
                lo, hi = (float(v) for v in src.args.get("range", (-1.0, 1.0)))
            except (TypeError, ValueError):
                continue
            shown = _shown(steps).format(lo=lo, hi=hi)
            for _, _, f in steps:           # an affine map of a uniform draw is uniform over the mapped range
                lo, hi = sorted((f(lo), f(hi)))
            if not hi > lo:
                continue
            c = float(consts[0])
            below = min(max((c - lo) / (hi - lo), 0.0), 1.0)
            name, a, b = m.groups()
            less = name in ("lt", "leq")
            if a.startswith("$"):           # the constant first: c < u is u > c
                less = not less
            p = below if less else 1 - below
            sign = {"lt": "<", "leq": "<=", "gt": ">", "geq": ">="}[name]
            if a.startswith("$"):
                sign = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[sign]
            found.append(("flip", f"{shown} {sign} {c:g}", p))
    return found


def _expect_fair_coin(pipe, prop: str, what: str, seed: int) -> bool:
    """Fails a flip drawn from the graph with another probability than 1/2; True where the graph showed
    how the flip is drawn (and it is 1/2), False where it did not (the rate is then only measured)."""
    flips = [(how, p) for kind, how, p in _random_draws(pipe) if kind == "flip"]
    for how, p in flips:
        if abs(p - 0.5) > 1e-9:
            raise CheckFailed(prop, f"{what}: your flip is {how}, a probability of {p:.4g} (read from the "
                              f"pipeline's graph); the contract says exactly 1/2 (seed {seed})",
                              "mirror=fn.random.coin_flip(probability=0.5): a rate a few points off shows in no single "
                              "batch, but it changes what the model learns from, every epoch")
    return bool(flips)


def _expect_uniform_choice(pipe, what: str, seed: int) -> None:
    """A weighted fn.random.choice for the crop position: not uniform, read from the graph (a weight
    a point off shows in no sample of this size)."""
    for kind, how, weights in _random_draws(pipe):
        if kind == "choice":
            raise CheckFailed("crop offsets are uniform over 0..8",
                              f"{what}: your crop position is drawn by {how} (read from the pipeline's graph): not "
                              f"every offset equally likely (seed {seed})",
                              "every offset 0..8 equally likely: fn.random.uniform(values=[k / 8 for k in range(9)]), "
                              "or fn.random.choice without p" + _rounding_words(how))


def _rounding_words(how: str) -> str:
    """Why a rounded range is uneven, for the form the learner wrote (w11-04 x07: the dtype form was told
    it rounds from a continuous draw, which made [-0.5, 8.5) look right)."""
    if "cut to integers" in how:
        return ("; fn.random.uniform(range=..., dtype=INT32) cuts the range's ends to integers before it draws, so "
                "its two end integers come half as often as the others whatever the range (range=[-0.5, 8.5] "
                "draws in [0, 8)): an integer dtype there never gives 0..8 equal chances")
    if "rounds" in how:
        return ("; fn.cast(..., dtype=INT32) rounds to the nearest integer, so a continuous range gives its end "
                "integers less than their share unless it spans exactly [-0.5, 8.5)")
    return ""


def _coin_words(read: bool) -> str:
    return ("a coin of probability 1/2, read from the pipeline's graph" if read else
            "within the measured band around 1/2; the graph did not show how the flag is drawn, so its "
            "probability was not read")


def _expect_settings(pipe, num_threads: int, what: str, seed: int) -> None:
    """The pipeline uses the threads it is given and keeps DALI's asynchronous prefetching."""
    if pipe.num_threads != num_threads:
        raise CheckFailed("uses the threads it is given", f"{what}: asked for num_threads={num_threads}, your "
                          f"pipeline runs {pipe.num_threads} (seed {seed})",
                          "pass num_threads on to @pipeline_def: the caller knows how many cores this process may "
                          "use (under DDP, its share of the node's)")
    depth = pipe.prefetch_queue_depth
    depths = list(depth.values()) if isinstance(depth, dict) else [depth]
    if not (getattr(pipe, "exec_async", True) and getattr(pipe, "exec_pipelined", True)) or min(depths) < 2:
        wrong = [f"{name}={value}" for name, value, bad in (
            ("exec_async", getattr(pipe, "exec_async", True), not getattr(pipe, "exec_async", True)),
            ("exec_pipelined", getattr(pipe, "exec_pipelined", True), not getattr(pipe, "exec_pipelined", True)),
            ("prefetch_queue_depth", depth, min(depths) < 2)) if bad]
        said = {"prefetch_queue_depth": "a queue of 1 holds the batch being used and none being prepared ahead",
                "exec_async": "a synchronous executor runs each batch only when next() asks for it",
                "exec_pipelined": "an unpipelined executor prepares no batch ahead"}
        raise CheckFailed("keeps DALI's prefetching",
                          f"{what}: your pipeline sets {' and '.join(wrong)} "
                          f"({'; '.join(said[w.split('=')[0]] for w in wrong)}) (seed {seed})",
                          "leave DALI's defaults (asynchronous, pipelined, a queue of 2): with them the next batches "
                          "are prepared while the training step runs; without, every next() waits for a whole batch")


def _other_thread_counts() -> list[int]:
    """Thread counts asked for beside `_threads()`, on pipelines constructed but never built (cheap):
    1, and more than this machine's cores (w10-04 w41_31, w43_32: num_threads=max(num_threads, 2)
    passed, the checks asking only for 3; min(num_threads, cores) would pass where cores >= 3)."""
    return [1, max(_threads(), usable_cores(), os.cpu_count() or 1) + 3]


def _no_batches(info):
    """A source for pipelines that are constructed and never run."""
    raise StopIteration


def _expect_thread_counts(build, what: str, seed: int) -> None:
    """`build(k)` constructs (never builds) a pipeline asked for k threads: it must run k, for every k
    of `_other_thread_counts()`."""
    for k in _other_thread_counts():
        with _calling_cpu(what.format(k=k), "cpu", seed):
            pipe = build(k)
        got = getattr(pipe, "num_threads", k)
        if got != k:
            raise CheckFailed("uses the threads it is given",
                              f"{what.format(k=k)}: asked for num_threads={k}, your pipeline runs {got} (seed {seed})",
                              "pass num_threads on to @pipeline_def as it is, with no floor or cap (no max(...) or "
                              "min(...)): the caller knows how many cores this process may use (under DDP, its share "
                              "of the node's), and the lesson's one-thread timings need exactly one")


_returned: list = []      # the pipelines the learner's function returned during the current check


def _expect_new_pipeline(pipe, what: str, seed: int, source=None) -> None:
    """A new pipeline on every call, reading from the source that call gave it (4.1)."""
    if any(pipe is earlier for earlier in _returned):
        raise CheckFailed("builds a new pipeline on every call",
                          f"{what}: your function returned the same Pipeline object as an earlier call (seed {seed})",
                          "build the pipeline from this call's arguments every time: a pipeline kept between calls "
                          "reads the first call's source, and its epoch is already over")
    _returned.append(pipe)
    if source is None:
        return
    ops = _graph(pipe)
    if ops is None:
        return
    callbacks = [getattr(op.node, "_callback", None) for op in ops if op.kind == "ExternalSource"]
    if any(isinstance(cb, _BatchSource) or getattr(cb, "__module__", None) == __name__ for cb in callbacks) and \
            not any(cb is source for cb in callbacks):
        raise CheckFailed("builds a new pipeline on every call",
                          f"{what}: your pipeline reads from the source of an earlier call, not this one's (seed {seed})",
                          "build the pipeline from this call's arguments every time: a pipeline kept between calls "
                          "reads the first call's source, and its epoch is already over")
    python = [op for op in ops if "PythonFunction" in op.kind]
    if python:      # w7-04 41_python_function_flip: the coin cast in a Python callback, same outputs, 2.3x slower
        raise CheckFailed("no Python inside the pipeline",
                          f"{what}: your pipeline runs {_names(python)}, a Python callback DALI calls on every batch, "
                          f"under the GIL, in its own worker (seed {seed})",
                          "everything after the source in DALI's own operators: a cast is fn.cast(x, "
                          "dtype=types.INT32), a comparison is `<` on DataNodes, and crop_mirror_normalize takes "
                          "a coin_flip as it is. Python per batch is the cost DALI removes (a cast in Python made "
                          "a pipeline 2.3x slower on a 2-core CPU)")
    if not any(cb is source for cb in callbacks):
        raise CheckFailed("hands the source to DALI as it is",
                          f"{what}: your pipeline's external source is not the `source` this call gave it (a function "
                          f"of your own around it, or one kept from an earlier call) (seed {seed})",
                          "fn.external_source(source=source, ...) with the source itself, and the augmentation in "
                          "DALI's operators: Python work per sample in the source is the cost DALI removes")


# -- 4.1 the CIFAR pipeline ------------------------------------------------------------------

class _BatchSource:
    """A batch-mode external source: `batches` batches of `batch_size` random records, then
    StopIteration. It remembers which records it gave for each iteration."""

    def __init__(self, records, batch_size, batches, rng):
        self.records, self.batch_size, self.batches = records, batch_size, batches
        self.order = rng.permutation(len(records))[:batch_size * batches]
        self.calls = 0

    def given(self, iteration):
        return self.order[iteration * self.batch_size:(iteration + 1) * self.batch_size]

    def __call__(self, info):
        self.calls += 1
        if not hasattr(info, "epoch_idx"):      # w5-04 w36: without batch_info=True DALI passes the iteration alone
            raise TypeError(f"{_NO_BATCH_INFO} (called with {type(info).__name__} {info!r})")
        iteration = int(info.iteration)
        if iteration >= self.batches:
            raise StopIteration
        idx = self.given(iteration)
        rows = self.records[idx]
        return (np.ascontiguousarray(rows[:, 1:]).reshape(-1, 3, 32, 32), rows[:, 0].astype(np.int64),
                idx.astype(np.int64))


_NO_DRIVER = ("Found no NVIDIA driver", "Torch not compiled with CUDA", "no CUDA GPUs are available",
              "CUDA driver version is insufficient")


@contextlib.contextmanager
def _calling_cpu(what: str, device: str, seed: int):
    """`calling(what)`, and where a device='cpu' call dies asking CUDA for a GPU this machine lacks
    (w5-04 w34: device_id=local_cuda_index() for a CPU pipeline gave torch's raw "Found no NVIDIA
    driver"), the property that says so."""
    try:
        with calling(what):
            yield
    except Exception as exc:
        said = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        if device == "cpu" and any(w in str(exc) for w in _NO_DRIVER):
            raise CheckFailed("a CPU pipeline needs no GPU",
                              f"{what}: building it asked CUDA for a GPU, and this machine has none (\"{said}\") "
                              f"(seed {seed})",
                              "with device='cpu' pass device_id=None to @pipeline_def: a pipeline of CPU operators "
                              "only uses no GPU and no CUDA; device_id=local_cuda_index() only for device='gpu' "
                              "(device_id=local_cuda_index() if device == 'gpu' else None)"
                              # w8-04 w43_35: "mixed" for the CPU too, a second mistake the hint did not name
                              + ("; the decoder too: fn.decoders.image(..., device='cpu') for device='cpu', "
                                 "device='mixed' (and any .gpu()) only for device='gpu'"
                                 if what.startswith("jpeg_pipeline") else "")) from None
        raise


_NO_BATCH_INFO = "the check's source wants a BatchInfo"


def _expect_whole_batches(pipe, exc: BaseException | None, what: str, seed: int) -> None:
    """The source gives a whole batch per call (w9-04 w41_33: batch=False took the source's
    (B, 3, 32, 32) array as one sample, and DALI's "The layout 'CHW' cannot describe 4-dimensional
    data" sent the learner to layout=). Read from the graph before running (`exc` None), or from
    DALI's error where the graph cannot be read."""
    said = "" if exc is None else str(exc)
    if exc is not None and not ("cannot describe" in said and "-dimensional data" in said):
        return
    modes = [getattr(op.node, "_batch", None) for op in _graph(pipe) or [] if op.kind == "ExternalSource"]
    if exc is None and not any(m is False for m in modes):
        return
    dali = f' (DALI: "{said.splitlines()[0]}")' if said else ""
    raise CheckFailed("the source gives whole batches",
                      f"{what}: your external_source is per-sample (batch=False): DALI takes each array the "
                      f"source returns as one sample, so the source's whole (B, 3, 32, 32) batch became one "
                      f"4-dimensional image{dali} (seed {seed})",
                      "fn.external_source(source=source, num_outputs=3, batch=True, batch_info=True, ...): the "
                      "source returns a batch per call, and with batch_info=True learns the epoch") from None


def _expect_batch_info(exc: BaseException, what: str, seed: int) -> None:
    """Turn the check's source refusing a plain iteration number (external_source without
    batch_info=True) into the property it breaks; any other error goes on as it was."""
    if _NO_BATCH_INFO in str(exc):
        raise CheckFailed("the source is called with a BatchInfo",
                          f"{what}: DALI called the source with the iteration number alone, not a BatchInfo: without "
                          "batch_info=True the source never learns the epoch, so a source that reshuffles every epoch "
                          "(the course's CifarRecordBatches, exercise 4.2's) gives the same order in every epoch "
                          f"(seed {seed})",
                          "fn.external_source(source=source, ..., batch=True, batch_info=True): DALI then passes "
                          "a BatchInfo (info.iteration, info.epoch_idx)") from None


def _expect_crop_anchor(exc: BaseException, what: str, seed: int) -> None:
    """DALI's "Anchor for dimension ... is out of range [0.0, 1.0]" (w7-04: crop_pos in pixels, or
    floor(uniform[0, 9)) / 8 rounded to 9/8) in the check's own words; any other error goes on."""
    said = str(exc)
    if "Anchor for dimension" in said and "out of range" in said:
        import re
        found = re.search(r"Anchor for dimension \d+ \(([-0-9.e+]+)\)", said)
        value = f" (DALI saw {float(found.group(1)):g})" if found else ""
        raise CheckFailed("crop offsets cover 0..8",
                          f"{what}: DALI refused a crop position outside [0, 1]{value}: crop_pos_x and crop_pos_y are "
                          f"a fraction of the slack, not pixels (seed {seed})",
                          "crop_pos = offset / 8 for the 8 pixels of slack of a 32x32 window in a 40x40 image: "
                          "fn.random.uniform(values=[k / 8 for k in range(9)]). DALI's cast rounds, so a cast of "
                          "uniform(range=[0, 9)) can reach 9, and 9/8 is out of range") from None


def _normalisation_read(out, src) -> str | None:
    """The mean and std the outputs were normalised with, read from each channel's lowest and highest
    value (the padding is 0 and random-noise records reach 255: (0 - M) / S and (255 - M) / S), where
    the crops are exact under them; None where they are not. w11-04 w19: the mean alone in BGR order
    was told "64 of 64 samples match no 32x32 window", which sent the learner to the crop."""
    out = np.asarray(out, np.float64)
    if out.ndim != 4 or out.shape[1] != 3:
        return None
    lo, hi = out.min(axis=(0, 2, 3)), out.max(axis=(0, 2, 3))
    if not np.all(hi > lo):
        return None
    scale = 255 / (hi - lo)                  # S, in the units of the uint8 input
    centre = -lo * scale                     # M
    if match_crops(out, src, tuple(centre / 255), tuple(scale / 255), atol=2e-2).exact_fraction <= 0.9:
        return None
    want_m = np.array([255 * m for m in data.CIFAR10_MEAN])
    want_s = np.array([255 * v for v in data.CIFAR10_STD])

    def near(a, b):
        return bool(np.allclose(a, b, rtol=5e-3, atol=0.05))

    def words(got, want, what):
        if near(got, want):
            return None
        if near(got, want[::-1]):
            return f"the {what} is in BGR order (blue first); the images are RGB"
        if near(np.sort(got), np.sort(want)):
            return f"the {what}'s channels are in another order than red, green, blue"
        return f"the {what} is not CIFAR-10's"
    said = [w for w in (words(centre, want_m, "mean"), words(scale, want_s, "std")) if w]
    if not said:
        return None
    shown = (f"mean=[{', '.join(f'{v:.1f}' for v in centre)}], std=[{', '.join(f'{v:.1f}' for v in scale)}]")
    return (f"the crop windows are right, but the values are normalised with {shown} (read from each channel's "
            f"lowest and highest output value): {' and '.join(said)}. Use mean=[255*m for m in CIFAR10_MEAN] = "
            f"[{', '.join(f'{v:.1f}' for v in want_m)}] and std=[255*s for s in CIFAR10_STD] = "
            f"[{', '.join(f'{v:.1f}' for v in want_s)}], in that order")


def _diagnose_crops(out, src) -> tuple[str, bool]:
    """A hint for outputs that are not exact crops of the padded, normalised sources, and whether
    the hint names the mistake (the outputs are exact crops under another normalisation)."""
    mean, std = data.CIFAR10_MEAN, data.CIFAR10_STD
    tries = [
        (dict(mean=tuple(m / 255 for m in mean), std=tuple(v / 255 for v in std)),
         "mean and std are in 0..1 units, but the pipeline's input is uint8 0..255: multiply both by 255 "
         "(mean=[255*m for m in CIFAR10_MEAN], std=[255*s for s in CIFAR10_STD])"),
        (dict(std=(1 / 255,) * 3), "the mean is subtracted but nothing is divided by the std: "
         "std=[255*s for s in CIFAR10_STD]"),
        (dict(mean=std, std=mean), "mean and std are swapped: mean=[255*m for m in CIFAR10_MEAN], "
         "std=[255*s for s in CIFAR10_STD]"),
        (dict(mean=(0, 0, 0), std=(1 / 255,) * 3), "the values are the raw 0..255 pixels: normalise with "
         "mean=[255*m for m in CIFAR10_MEAN], std=[255*s for s in CIFAR10_STD]"),
        (dict(mean=(0, 0, 0), std=(1, 1, 1)), "the values are scaled to 0..1 but not normalised: subtract the mean "
         "and divide by the std (both times 255, since the input is uint8)"),
        (dict(mean=data.CIFAR10_MEAN, std=data.CIFAR10_STD, fill=tuple(255 * m for m in mean)),
         "the padding is not black: pad the uint8 image with 0 *before* normalising (as torchvision's "
         "RandomCrop(32, padding=4) does), e.g. fn.crop(..., crop=(40, 40), out_of_bounds_policy='pad', fill_values=0)"),
        (dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)), "that is ImageNet's mean and std: use "
         "course_utils.data.CIFAR10_MEAN and CIFAR10_STD"),
        # walk w3-04: each of these got the generic rule, not its mistake
        (dict(std=tuple(v / 255 for v in std)), "the mean is times 255 but the std is not: the pipeline's input "
         "is uint8 0..255, so both are (std=[255*s for s in CIFAR10_STD])"),
        (dict(mean=tuple(m / 255 for m in mean)), "the std is times 255 but the mean is not: the pipeline's input "
         "is uint8 0..255, so both are (mean=[255*m for m in CIFAR10_MEAN])"),
        (dict(mean=tuple(mean[::-1]), std=tuple(std[::-1])), "mean and std are in BGR order; the images are RGB: "
         "CIFAR10_MEAN and CIFAR10_STD as they are, red first"),
        (dict(mean=data.CIFAR10_MEAN, std=data.CIFAR10_STD, fill=(128.0, 128.0, 128.0)),
         "the padding is grey (128): pad the uint8 image with 0, black, as torchvision's RandomCrop(32, padding=4) "
         "does (fill_values=0)"),
    ]
    for kwargs, hint in tries:
        m = dict(mean=mean, std=std)
        m.update(kwargs)
        fill = m.pop("fill", 0.0)
        if match_crops(out, src, m["mean"], m["std"], fill=fill, atol=2e-2).exact_fraction > 0.9:
            return hint, True
    named = _normalisation_read(out, src)
    if named:
        return named, True
    wide = match_crops(out, src, mean, std, pad=8, atol=2e-2)
    if wide.exact_fraction > 0.9:       # windows of a wider or one-sided padding (fn.pad pads after the image)
        ends = np.mean((wide.dy >= 8) & (wide.dx >= 8)) > 0.9
        starts = np.mean((wide.dy <= 8) & (wide.dx <= 8)) > 0.9
        side = ("at the end only (bottom and right: fn.pad puts its padding after the image)" if ends else
                "at the start only (top and left)" if starts else "by more than 4 pixels")
        return (f"the windows are crops of the record padded {side}: pad 4 black pixels on every side, so that the "
                "window's offset runs 0..8 in both directions around the image"), True
    plain = match_crops(out, src, mean, std, atol=1e-3).exact
    upside_down = match_crops(np.ascontiguousarray(out[:, :, ::-1, :]), src, mean, std, atol=1e-3).exact
    if np.mean(plain | upside_down) > 0.9:
        return "the flip is vertical: mirror flips horizontally (crop_mirror_normalize's mirror argument)", True
    return ("each sample must be a 32x32 window of its record padded with 4 black pixels on every side, "
            "flipped horizontally or not, normalised as (x/255 - mean) / std with CIFAR10_MEAN and CIFAR10_STD"), False


def _run_cifar(cifar_pipeline, records, batch_size, batches, device, rng, seed):
    source = _BatchSource(records, batch_size, batches, rng)
    what = f"cifar_pipeline(source, {batch_size}, device={device!r}, num_threads={_threads()}, seed=...)"
    with _calling_cpu(what, device, seed):
        pipe = _expect_pipeline(cifar_pipeline(source, batch_size, device=device, num_threads=_threads(),
                                               seed=int(rng.integers(1, 2**31 - 1))), "cifar_pipeline(...)")
    _expect_new_pipeline(pipe, what, seed, source)
    if device == "cpu":
        _expect_placement(pipe, "cpu", what, seed)
    _expect_settings(pipe, _threads(), what, seed)
    _num_outputs(pipe, 3, "images, labels, indices")
    _expect_whole_batches(pipe, None, what, seed)
    outs = []
    for k in range(batches):
        try:
            o = pipe.run()
        except Exception as exc:
            _expect_whole_batches(pipe, exc, what, seed)
            _expect_batch_info(exc, what, seed)
            _expect_crop_anchor(exc, what, seed)
            raise
        images = o[0]
        kind = type(images).__name__
        want = "TensorListGPU" if device == "gpu" else "TensorListCPU"
        if kind != want:
            raise CheckFailed("runs where it is asked to", f"device={device!r}: the images come out as {kind}, expected {want}",
                              "with device='gpu' move the images to the GPU (images.gpu()) before cropping, and "
                              "pass device_id=local_cuda_index() (this process's GPU) to the pipeline; with 'cpu' "
                              "use device_id=None")
        layout = images.layout()
        x = _to_numpy(images)
        labels = _to_numpy(o[1]).reshape(-1)
        indices = _to_numpy(o[2]).reshape(-1)
        outs.append((x, labels, indices, layout, source.given(k)))
    return outs


_CLOCK_MOVED_S = 37 * 86400 + 12345.5     # another moment: 37 days, 3 h 25 min 45.5 s on


def _salted_hash(real_hash):
    """`hash` as another process computes it: str, bytes and objects hashed by identity are salted per
    process (PYTHONHASHSEED), numbers are not. DALI's own calls keep the real one."""
    import sys

    def plain(x):
        if x is None or isinstance(x, (bool, int, float, complex)):
            return True
        return isinstance(x, tuple) and all(plain(v) for v in x)

    def salted(x):
        h = real_hash(x)
        if plain(x) or str(sys._getframe(1).f_globals.get("__name__", "")).startswith("nvidia."):
            return h
        return real_hash((h, 0x2545F491))
    return salted


@contextlib.contextmanager
def _another_process_later():
    """Builds as if in another process (another PYTHONHASHSEED, another pid), 37 days later (w8-04:
    `seed + int(time.time()) % 1000` and `hash(("cifar", seed))` passed: the check's same-seed pair came
    from one process within one second)."""
    import builtins
    import time
    moved = {name: getattr(time, name) for name in ("time", "time_ns", "perf_counter", "perf_counter_ns",
                                                    "monotonic", "monotonic_ns")}
    real_hash, real_getpid = builtins.hash, os.getpid
    for name, f in moved.items():
        ns = name.endswith("_ns")
        setattr(time, name, (lambda f=f, ns=ns: f() + (int(_CLOCK_MOVED_S * 1e9) if ns else _CLOCK_MOVED_S)))
    builtins.hash = _salted_hash(real_hash)
    os.getpid = lambda: real_getpid() + 7919
    try:
        yield
    finally:
        for name, f in moved.items():
            setattr(time, name, f)
        builtins.hash, os.getpid = real_hash, real_getpid


def _check_seed(cifar_pipeline, records, batch_size, rng, seed):
    """The same seed draws the same augmentation, seed 0 included (w6-04: `seed if seed else None`
    passed); another seed, other crops and other flips (w6-04: crop positions drawn with a fixed
    operator seed passed on the flips alone). Crops of `_coordinate_images` tell each sample's window."""
    n = max(batch_size, 64)        # a right answer repeats all n windows (or flips) under two seeds never
    images = _coordinate_images(n)
    labels = np.arange(n, dtype=np.int64) % 10
    indices = np.arange(n, dtype=np.int64)

    def source(info):
        if int(getattr(info, "iteration", info)) >= 1:
            raise StopIteration
        return images, labels, indices

    def first_batch(pipe_seed, elsewhere=False, threads=None):
        with _another_process_later() if elsewhere else contextlib.nullcontext():
            made = cifar_pipeline(source, n, device="cpu", num_threads=threads or _threads(), seed=pipe_seed)
        pipe = _expect_pipeline(made, "cifar_pipeline(...)")
        _expect_new_pipeline(pipe, f"cifar_pipeline(source, {n}, seed={pipe_seed})", seed, source)
        return _read_offsets(_to_numpy(pipe.run()[0]))

    def same(a, b):
        return all(np.array_equal(u, v) for u, v in zip(a, b))

    s = int(rng.integers(1, 2**31 - 2))
    first = {}
    for pipe_seed in (s, 0):
        a, b = first_batch(pipe_seed), first_batch(pipe_seed)
        first[pipe_seed] = a
        if not same(a, b):
            zero = (" seed=0 is a seed like any other (the notebook builds its pipelines with it): a test such as "
                    "`seed if seed else None` or `seed or None` leaves DALI to pick a random one" if pipe_seed == 0 else "")
            raise CheckFailed("reproducible under a seed", f"two pipelines built with seed={pipe_seed} augmented the "
                              f"same records differently (seed {seed})",
                              "pass `seed` on to @pipeline_def(..., seed=seed) as it is, whatever its value." + zero)
    one = first_batch(s, threads=1)     # w10-04 w41_16: seed=seed + num_threads passed (the pair had 3 threads each)
    if not same(first[s], one):
        raise CheckFailed("reproducible under a seed",
                          f"two pipelines built with seed={s}, one with num_threads={_threads()} and one with "
                          f"num_threads=1, augmented the same records differently: DALI draws each sample's values "
                          f"from the pipeline's seed, whatever the thread count, so the thread count reached your "
                          f"seed (seed + num_threads?); a run on another machine, or the lesson's one-thread timing, would augment "
                          f"otherwise (seed {seed})",
                          "pass `seed` on to @pipeline_def(..., seed=seed) as it is (or seed + a constant), "
                          "nothing from num_threads")
    a, c = first_batch(s, elsewhere=True), first_batch(s + 1)
    if not same(first[s], a):
        raise CheckFailed("reproducible under a seed",
                          f"two pipelines built with seed={s}, the second as if in another process 37 days later "
                          f"(the clock moved on, another PYTHONHASHSEED, another process id), augmented the same "
                          f"records differently: a job restarted tomorrow, or each DDP process, would not repeat "
                          f"its augmentation (seed {seed})",
                          "pass `seed` on to @pipeline_def(..., seed=seed) as it is (or seed + a constant): nothing "
                          "from the clock (time.time()), from hash() of a string (Python salts it per process) or "
                          "from the process id")
    crops_same = np.array_equal(a[0], c[0]) and np.array_equal(a[1], c[1])
    flips_same = np.array_equal(a[2], c[2])
    if crops_same and flips_same:
        raise CheckFailed("follows the seed", f"seeds {s} and {s + 1} gave the same crops and flips (seed {seed})",
                          "pass `seed` on to @pipeline_def(..., seed=seed) instead of a number of your own")
    if crops_same or flips_same:
        what, other = ("crop window", "flips") if crops_same else ("flip", "crops")
        raise CheckFailed("another seed changes the crops and the flips",
                          f"pipelines built with seeds {s} and {s + 1} gave each of {n} samples the same {what} (only "
                          f"the {other} changed): under DDP every process would augment sample j alike (seed {seed})",
                          "a random operator given a seed of its own (fn.random.uniform(..., seed=1234)) draws the "
                          "same values whatever the pipeline's seed: leave `seed` off the fn.random operators, "
                          "@pipeline_def(seed=seed) seeds them all")


_LOCAL_RANK = 3     # the GPU a probe pretends this process was given (LOCAL_RANK under torchrun)


@contextlib.contextmanager
def _pretend_local_rank(rank: int):
    """For the block: LOCAL_RANK=rank and torch.cuda reporting that rank as the current device of
    a machine with rank + 1 GPUs, whose current CUDA device is still cuda:0 (what every process of
    torchrun sees until someone runs `torch.cuda.set_device(local_rank)`; w6-04: with the current
    device pretended to be the rank, device_id=torch.cuda.current_device() passed). Only a pipeline's
    construction runs inside it (nothing is built), so no GPU is touched."""
    saved_env = os.environ.get("LOCAL_RANK")
    saved = {name: getattr(torch.cuda, name) for name in ("current_device", "device_count", "is_available")}
    os.environ["LOCAL_RANK"] = str(rank)
    torch.cuda.current_device = lambda: 0
    torch.cuda.device_count = lambda: max(rank + 1, saved["device_count"]())
    torch.cuda.is_available = lambda: True
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)
        if saved_env is None:
            os.environ.pop("LOCAL_RANK", None)
        else:
            os.environ["LOCAL_RANK"] = saved_env


@contextlib.contextmanager
def _nothing_built():
    """For the block: Pipeline.build does nothing and DALI's PyTorch iterator only records the
    pipelines it is given (it would build and run them): what a device="gpu" answer makes can be
    read on a machine without GPU 3 (an answer may build its pipeline before returning it)."""
    from nvidia.dali import Pipeline
    from nvidia.dali.plugin.pytorch import DALIGenericIterator
    given = []
    build, init = Pipeline.build, DALIGenericIterator.__init__

    def record(self, pipelines, *args, **kwargs):
        given.extend(pipelines if isinstance(pipelines, (list, tuple)) else [pipelines])

    Pipeline.build = lambda self: None
    DALIGenericIterator.__init__ = record
    try:
        yield given
    finally:
        Pipeline.build, DALIGenericIterator.__init__ = build, init


def _expect_local_gpu(build, what: str, seed: int, *, decoder: bool = False, iterator: bool = False) -> None:
    """`build()` makes a device="gpu" pipeline (or, `iterator=True`, DALI's iterator over one): its
    device_id must be this process's GPU, the local rank, and the work on the images must run there
    (`_expect_placement`). None fails (w3-04): DALI then takes whichever CUDA device is current when it
    builds, this process's GPU only if the caller ran torch.cuda.set_device, which the pipeline cannot know."""
    with _pretend_local_rank(_LOCAL_RANK), _nothing_built() as given:
        with calling(what):
            made = build()
            if iterator and not given:
                raise WrongType("type", f"{what} should return DALI's PyTorch iterator (DALIGenericIterator) over a "
                                f"pipeline, but it made none (it returned {type(made).__name__}).")
            pipe = _expect_pipeline(given[0] if iterator else made, what)
            _graph(pipe)       # the learner's graph function runs here, in the pretended process
    if pipe.device_id is not None and pipe.device_id != _LOCAL_RANK:
        current = (", GPU 0, in every process: whether written as a fixed 0 or read from "
                   "torch.cuda.current_device() (torchrun sets LOCAL_RANK, not the current device, which stays "
                   "cuda:0 until torch.cuda.set_device(local_rank) runs), every process sends its work to GPU 0"
                   if pipe.device_id == 0 else "")
        raise CheckFailed("runs on this process's GPU",
                          f"with device='gpu' in a process whose GPU is cuda:{_LOCAL_RANK} (LOCAL_RANK={_LOCAL_RANK}, "
                          f"as torchrun's fourth process on a node), your pipeline asks for device_id="
                          f"{pipe.device_id}{current} (seed {seed})",
                          "under DistributedDataParallel every process has its own GPU: take its index from "
                          "course_utils.env.local_cuda_index() (LOCAL_RANK, else the current device), never a fixed 0")
    _expect_placement(pipe, "gpu", what, seed, decoder=decoder)
    if pipe.device_id is None:
        raise CheckFailed("runs on this process's GPU",
                          f"with device='gpu' in a process whose GPU is cuda:{_LOCAL_RANK} (LOCAL_RANK={_LOCAL_RANK}, "
                          f"as torchrun's fourth process on a node), your pipeline asks for device_id=None: no GPU "
                          f"by name, so DALI takes whichever device is current when it builds, cuda:0 unless the "
                          f"caller ran torch.cuda.set_device first (seed {seed})",
                          "ask for this process's GPU by name: device_id=course_utils.env.local_cuda_index() "
                          "(LOCAL_RANK, else the current device); device_id=None is for device='cpu'")
    return pipe


def _coordinate_images(n: int) -> np.ndarray:
    """n identical (3, 32, 32) uint8 images whose red says the column (20 + 7x) and green the row
    (20 + 7y): the centre of any crop of them tells its offset and its flip."""
    image = np.empty((3, 32, 32), np.uint8)
    image[0] = (20 + 7 * np.arange(32))[None, :]
    image[1] = (20 + 7 * np.arange(32))[:, None]
    image[2] = 128
    return np.ascontiguousarray(np.broadcast_to(image, (n, 3, 32, 32)))


def _read_offsets(x: np.ndarray):
    """(dy, dx, flipped) of crops of `_coordinate_images` padded by 4, from the outputs' centre
    pixels (which never fall in the padding), normalised with CIFAR's constants."""
    mean = np.array(data.CIFAR10_MEAN, np.float32) * 255
    std = np.array(data.CIFAR10_STD, np.float32) * 255
    red = x[:, 0, 16, 15:18] * std[0] + mean[0]
    green = x[:, 1, 16, 16] * std[1] + mean[1]
    flipped = red[:, 2] < red[:, 0]
    column = np.rint((red[:, 1] - 20) / 7).astype(np.int64)      # the source column under output column 16
    dx = np.where(flipped, column - 11, column - 12)
    dy = np.rint((green - 20) / 7).astype(np.int64) - 12
    return dy, dx, flipped


def _chi2_independence(a: np.ndarray, b: np.ndarray, ka: int, kb: int) -> float:
    """Pearson's chi-square statistic of the ka x kb table of (a, b) against independence."""
    table = np.zeros((ka, kb))
    np.add.at(table, (a, b), 1)
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    keep = expected > 0
    return float((((table - expected) ** 2)[keep] / expected[keep]).sum())


# Bars for the draws of `_STAT_BATCHES` x `_STAT_BATCH` samples: Pearson's chi-square against
# uniform (8 degrees of freedom) and against independence (64 and 8); each right answer fails a
# bar with a chance of about 1e-7 or less (tested by simulation in the unit tests).
_STAT_BATCH, _STAT_BATCHES = 512, 24
_CHI2_UNIFORM_9 = 45.0       # df 8
_CHI2_INDEPENDENT_9x9 = 140.0   # df 64
_CHI2_INDEPENDENT_9x2 = 45.0    # df 8
_FLIP_TOLERANCE = 0.025      # 5.5 standard errors of a fair coin over 12,288 samples


def _run_statistics(cifar_pipeline, device, rng, seed):
    """Offsets and flips of `_STAT_BATCHES` batches of crops of `_coordinate_images`."""
    images = _coordinate_images(_STAT_BATCH)
    labels = np.arange(_STAT_BATCH, dtype=np.int64) % 10
    indices = np.arange(_STAT_BATCH, dtype=np.int64)

    def source(info):
        if int(getattr(info, "iteration", info)) >= _STAT_BATCHES:
            raise StopIteration
        return images, labels, indices

    pipe = _expect_pipeline(cifar_pipeline(source, _STAT_BATCH, device=device, num_threads=_threads(),
                                           seed=int(rng.integers(1, 2**31 - 1))), "cifar_pipeline(...)")
    _expect_new_pipeline(pipe, f"cifar_pipeline(source, {_STAT_BATCH}, device={device!r}, ...)", seed, source)
    batches = []
    for _ in range(_STAT_BATCHES):
        batches.append(_read_offsets(_to_numpy(pipe.run()[0])))
    return batches, pipe


def _check_randomness(batches, on, seed, pipe=None):
    dy = np.concatenate([b[0] for b in batches])
    dx = np.concatenate([b[1] for b in batches])
    flipped = np.concatenate([b[2] for b in batches])
    n = len(dy)
    if np.any((dy < 0) | (dy > 8) | (dx < 0) | (dx > 8)):
        raise CheckFailed("crop offsets cover 0..8", f"{on}: some crops start outside the 40x40 padded image (seed {seed})",
                          "pad 4 pixels on every side (40x40), then crop 32x32 at an offset of 0..8 on each axis")
    fixed = [axis for axis, values in (("vertical", dy), ("horizontal", dx)) if np.bincount(values, minlength=9)[4] == n]
    if len(fixed) == 2:
        raise CheckFailed("crop offsets cover 0..8", f"{on}: every sample is the unpadded image (offset 4 of "
                          f"the padded one) (seed {seed})", "pad 4 black pixels on every side, then crop 32x32 "
                          "at a random position")
    if fixed:       # w5-04 w22: crop_pos_x=0.5 with a random y was told "every sample is the unpadded image"
        other = "horizontal" if fixed[0] == "vertical" else "vertical"
        arg = "crop_pos_y" if fixed[0] == "vertical" else "crop_pos_x"
        raise CheckFailed("crop offsets cover 0..8", f"{on}: every sample has the same {fixed[0]} offset, 4 (the "
                          f"centre, {arg}=0.5); the {other} one varies (seed {seed})",
                          f"draw {arg} per sample too: {arg}=fn.random.uniform(values=[k / 8 for k in range(9)])")
    # one draw per sample: a batch whose samples all share an offset drew it once for the batch
    for axis, k in (("vertical", 0), ("horizontal", 1)):
        shared = [j for j, b in enumerate(batches) if len(np.unique(b[k])) == 1]
        if shared:
            raise CheckFailed("each sample draws its own crop and flip",
                              f"{on}: every sample of batch {shared[0]} ({len(batches[shared[0]][k])} samples) has "
                              f"the same {axis} offset, and so do {len(shared) - 1} of the other {len(batches) - 1} "
                              f"batches (seed {seed})",
                              "random operators in a DALI pipeline draw one value per sample: "
                              "fn.random.uniform(values=[k / 8 for k in range(9)]) inside the graph, not a number "
                              "drawn once per batch in Python")
    missed = [set(np.nonzero(np.bincount(v, minlength=9) == 0)[0].tolist()) for v in (dy, dx)]
    for low, side in ((True, "at the bottom and on the right"), (False, "at the top and on the left")):
        half = set(range(4)) if low else set(range(5, 9))
        if all(m == half for m in missed):
            never = "above or left of" if low else "below or right of"
            raise CheckFailed("crop offsets cover 0..8",
                              f"{on}: over {n} samples no crop reached {never} the image: the offsets on both axes "
                              f"were only {'4..8' if low else '0..4'} of the 40x40 padded image, as if it were "
                              f"padded {side} only (seed {seed})",
                              "fn.pad puts its padding after the image (at the bottom and on the right): pad 4 "
                              "pixels on every side, e.g. fn.crop(images, crop=(40, 40), out_of_bounds_policy='pad') "
                              "(the image centred in a 40x40 window), then crop 32x32 at one of the 9 offsets")
    for axis, values in (("vertical", dy), ("horizontal", dx)):
        counts = np.bincount(values, minlength=9)
        if (counts == 0).any():
            missing = [int(v) for v in np.nonzero(counts == 0)[0]]
            raise CheckFailed("crop offsets cover 0..8", f"{on}: over {n} samples the {axis} offset never took "
                              f"the values {missing} (seed {seed})",
                              "draw the crop position per sample, uniformly over the 9 possible offsets")
    if pipe is not None:
        _expect_uniform_choice(pipe, on, seed)
    ends = float(np.mean(np.isin(np.concatenate([dy, dx]), [0, 8])))
    if not 0.2 <= ends <= 0.245:
        raise CheckFailed("crop offsets are uniform over 0..8", f"{on}: offsets 0 and 8 make up {ends:.1%} of "
                          f"{2 * n} draws; uniform over nine values gives 22.2% (seed {seed})",
                          "a continuous crop_pos in [0, 1] rounds to 0 and 8 half as often as to the other offsets, "
                          "and so does an integer drawn with fn.random.uniform(range=..., dtype=INT32), which DALI "
                          "draws by cutting the range's ends to integers (range=[-0.5, 8.5] gives [0, 8)) and "
                          "rounding a continuous draw between them: draw from the nine values k/8 "
                          "(fn.random.uniform(values=[k / 8 for k in range(9)]))")
    for axis, values in (("vertical", dy), ("horizontal", dx)):
        counts = np.bincount(values, minlength=9)
        chi2 = float(((counts - n / 9) ** 2 / (n / 9)).sum())
        if chi2 > _CHI2_UNIFORM_9:
            raise CheckFailed("crop offsets are uniform over 0..8",
                              f"{on}: the {axis} offsets 0..8 came {counts.tolist()} times in {n} samples; uniform "
                              f"draws this uneven happen less than once in a million runs (seed {seed})",
                              "every offset 0..8 equally likely: fn.random.uniform(values=[k / 8 for k in range(9)])")
    chi2 = _chi2_independence(dy, dx, 9, 9)
    if chi2 > _CHI2_INDEPENDENT_9x9:
        same = float(np.mean(dy == dx))
        detail = (f"the two offsets are equal in {same:.0%} of the samples (independent draws: 11%)"
                  if same > 0.2 else "the vertical offset says something about the horizontal one")
        raise CheckFailed("draws the two offsets independently", f"{on}: {detail} (seed {seed})",
                          "draw crop_pos_x and crop_pos_y from two separate random operators: one draw used for "
                          "both axes only ever crops along the diagonal")
    # the flip: tied to the crop first (a flip decided by the offset also misses 1/2), then its rate
    for axis, values in (("vertical", dy), ("horizontal", dx)):
        if _chi2_independence(values, flipped.astype(np.int64), 9, 2) > _CHI2_INDEPENDENT_9x2:
            by = [float(flipped[values == v].mean()) for v in range(9)]
            raise CheckFailed("draws the flip independently of the crop",
                              f"{on}: whether a sample is flipped depends on its {axis} offset: flipped at offsets "
                              f"0..8: {', '.join(f'{b:.0%}' for b in by)} (seed {seed})",
                              "draw the mirror flag with its own fn.random.coin_flip, not from the crop position")
    read = pipe is not None and _expect_fair_coin(pipe, "flips half of the samples", on, seed)
    rate = float(flipped.mean())
    if abs(rate - 0.5) > _FLIP_TOLERANCE:
        raise CheckFailed("flips half of the samples", f"{on}: {rate:.1%} of {n} samples are flipped; a fair coin "
                          f"stays within 50% +/- {_FLIP_TOLERANCE:.1%} here (seed {seed})",
                          "mirror=fn.random.coin_flip(probability=0.5): probability exactly 1/2")
    for k, (bdy, bdx, bflip) in enumerate(batches):
        if len(set(zip(bdy.tolist(), bdx.tolist(), bflip.tolist()))) == 1:
            raise CheckFailed("each sample draws its own crop and flip", f"{on}: every sample of batch {k} has "
                              "the same crop and flip", "random operators in a DALI pipeline draw one value per sample")
    return rate, read


@exercise("4.1", "The CIFAR pipeline: pad, random crop, flip and normalise in DALI", points=2)
@forbids("course_utils.dali_pipelines:cifar_train_pipeline")
def check_cifar_pipeline(cifar_pipeline):
    _require_dali()
    expect_callable(cifar_pipeline, "a function cifar_pipeline(source, batch_size, device='cpu', num_threads=2, "
                    "seed=0) that returns a DALI Pipeline")
    rng, seed = fresh_rng()
    _returned.clear()
    batch_size = int(rng.integers(40, 90))
    batches = math.ceil(1100 / batch_size)
    records = _random_records(rng, batch_size * batches + int(rng.integers(0, 50)))
    for device in _devices():
        outs = _run_cifar(cifar_pipeline, records, batch_size, batches, device, rng, seed)
        on = f"on the {device.upper()}" if device == "gpu" else "on the CPU"
        x, labels, indices, layout, given = outs[0]
        if x.shape != (batch_size, 3, 32, 32):
            hint = ("that is HWC: ask crop_mirror_normalize for output_layout='CHW'" if x.shape == (batch_size, 32, 32, 3)
                    else "crop to 32x32 after padding, and keep the batch dimension")
            raise CheckFailed("images are (B, 3, 32, 32)", f"{on}, batch of {batch_size}: yours {x.shape}", hint)
        if x.dtype != np.float32:
            raise CheckFailed("images are float32", f"{on}: yours {x.dtype}", "crop_mirror_normalize(..., dtype=types.FLOAT)")
        if layout != "CHW":
            raise CheckFailed("the layout is CHW", f"{on}: the images' layout is {layout!r}", "output_layout='CHW'")
        for k, (x, labels, indices, layout, given) in enumerate(outs):
            if len(indices) != len(given) or not np.array_equal(indices, given):
                raise CheckFailed("indices pass through unchanged", f"{on}, batch {k}: the third output is not the "
                                  f"indices the source gave (seed {seed})", "return the source's third output as it is")
            if len(labels) != len(given) or not np.array_equal(labels, records[given, 0]):
                raise CheckFailed("labels pass through unchanged", f"{on}, batch {k}: the labels are not the records' "
                                  f"labels (seed {seed})", "return the source's second output as it is")
            for name, values in (("labels", labels), ("indices", indices)):
                if values.dtype != np.int64:
                    raise CheckFailed("labels and indices stay int64",
                                      f"{on}: the {name} come out as {values.dtype}, the source gave int64 (seed {seed})",
                                      "declare them types.INT64 in external_source and do not cast them: " + (
                                          "F.cross_entropy wants int64 class indices (with int32 torch raises "
                                          "\"expected target dtype to be Long\"; older versions \"expected scalar "
                                          "type Long\")" if name == "labels" else
                                          # w11-04 x11: indices cast to uint32 were told about class labels
                                          f"the indices (the third output) name the record each sample came from; "
                                          f"they come out as {values.dtype} because of a cast or a declared type "
                                          f"other than types.INT64; the contract keeps them int64, as the "
                                          f"source gave them, so that they index records and tensors as they are"))
        x_all = np.concatenate([o[0] for o in outs])
        idx_all = np.concatenate([o[4] for o in outs])
        src = _sources(records, idx_all)
        probe = match_crops(x_all[:64], src[:64], data.CIFAR10_MEAN, data.CIFAR10_STD)
        if not probe.exact.all():
            hint, named = _diagnose_crops(x_all[:64], src[:64])
            padding = hint.startswith(("the padding is", "the windows are crops of the record padded"))
            detail = (f"{on}: the samples are crops of their records, but "
                      + ("some are flipped upside down" if hint.startswith("the flip is vertical") else
                         "not of the record padded with 4 black pixels on every side (normalised as asked)"
                         if padding else "not normalised as asked") + f" (seed {seed})" if named
                      else f"{on}: {int((~probe.exact).sum())} of 64 samples match no 32x32 window (flipped or not) "
                      f"of their record padded by 4 (seed {seed})")
            raise CheckFailed("each sample is an exact crop of its padded record, normalised", detail, hint)
        found = match_crops(x_all, src, data.CIFAR10_MEAN, data.CIFAR10_STD)
        if not found.exact.all():
            raise CheckFailed("each sample is an exact crop of its padded record, normalised",
                              f"{on}: {int((~found.exact).sum())} of {len(found.exact)} samples match no window (seed {seed})",
                              _diagnose_crops(x_all[~found.exact][:64], src[~found.exact][:64])[0])
        stats, stats_pipe = _run_statistics(cifar_pipeline, device, rng, seed)
        rate, read = _check_randomness(stats, on, seed, stats_pipe)
    _expect_thread_counts(lambda k: _expect_pipeline(cifar_pipeline(_no_batches, batch_size, device="cpu",
                                                                     num_threads=k, seed=1), "cifar_pipeline(...)"),
                          "cifar_pipeline(source, " + str(batch_size) + ", device='cpu', num_threads={k}, seed=1)", seed)
    _check_seed(cifar_pipeline, records, batch_size, rng, seed)
    _expect_local_gpu(lambda: cifar_pipeline(_BatchSource(records, batch_size, 1, rng), batch_size, device="gpu",
                                             num_threads=_threads(), seed=1),
                      "cifar_pipeline(source, batch_size, device='gpu', ...)", seed)
    where = " and on the GPU" if len(_devices()) > 1 else ""
    n = _STAT_BATCH * _STAT_BATCHES
    return (f"{len(x_all)} samples on the CPU{where}: CHW float32, each an exact crop of its padded record, normalised; "
            f"labels and indices intact (int64); over {n:,} more, offsets 0..8 uniform and independent on each axis, "
            f"{rate:.1%} flipped ({_coin_words(read)}); the seed reproduces it (seed=0 too, and as if in another process 37 days later), the next seed changes the "
            f"crops and the flips, and 1 thread augments as {_threads()} do; num_threads={_threads()}, 1 and "
            f"{_other_thread_counts()[1]} as given, and DALI's prefetching; with device='gpu', read from its graph without building it: GPU {_LOCAL_RANK} in a process whose "
            f"LOCAL_RANK is {_LOCAL_RANK} (its current device still 0), and the crop and normalisation on that GPU.")


# -- 4.2 exact epochs --------------------------------------------------------------------------

_STRIDED = "Strided data not supported"


_EMPTY = "empty batch"


def _one_epoch(iterator, limit_batches, what, *, records: int | None = None, batch_size: int | None = None):
    """One epoch's batches; `records`, `batch_size`: the shard's size and the batch, to explain an
    empty batch DALI refuses."""
    batches = []
    try:
        for out in _epoch_items(iterator, limit_batches, what):
            if len(out["indices"].reshape(-1)) == 0:
                raise _empty_batch(what, records, batch_size, len(batches))
            batches.append(out)
    except RuntimeError as exc:
        if _STRIDED in str(exc):
            raise _strided(what) from None
        if _EMPTY in str(exc):
            raise _empty_batch(what, records, batch_size, len(batches), str(exc)) from None
        _expect_declared_types(exc, what, None)
        raise
    return batches


_DECLARED = re.compile(r"ExternalSource expected data of type (\w+) and got: (\w+)")


def _expect_declared_types(exc: BaseException, what: str, seed) -> None:
    """DALI's refusal of a source's array of another type than the external_source declares, as the
    learner's mistake in the source (w6-04: int32 indices read as an error inside the course's
    dali_pipelines.py, where the course's pipeline declares them INT64)."""
    m = _DECLARED.search(str(exc))
    if m:
        want, got = m.groups()
        raise CheckFailed("labels and indices are int64",
                          f"{what}: your source returned {got} where the pipeline's external_source declares {want}: "
                          f"DALI stopped at the first such batch" + (f" (seed {seed})" if seed is not None else ""),
                          "return labels and indices from your source as int64: rows[:, 0].astype(np.int64) and "
                          "idx.astype(np.int64) (F.cross_entropy wants int64 class indices)") from None


def _empty_batch(what, records, batch_size, after, said=None) -> CheckFailed:
    shard = ""
    if records is not None and batch_size:
        full, rest = divmod(records, batch_size)
        shard = (f" ({records} records in batches of {batch_size}: {full} full batches"
                 + (f" and one of {rest}" if rest else ", nothing left over") + ")")
    refused = f"; DALI refused it: \"{said.splitlines()[0][:120]}\"" if said else ""
    hint = ("when the shard's size is a multiple of the batch there is no short last batch: "
            "ceil(size / batch_size) batches, or size // batch_size with drop_last; raise StopIteration "
            "as soon as info.iteration reaches that number")
    if records is not None and batch_size and records % batch_size and after >= -(-records // batch_size):
        # w7-04 42_gt_not_ge: `if i > nb` on a shard with a short last batch was told about multiples
        hint = (f"all {-(-records // batch_size)} batches of the shard came, then one more call: the iterations "
                f"are numbered from 0, so raise StopIteration as soon as info.iteration reaches the count "
                f"(info.iteration >= {-(-records // batch_size)}, not >)")
    return CheckFailed("ends the epoch after its last record",
                       f"{what}{shard}: after {after} batches your source returned an empty batch{refused}", hint)


def _strided(what: str) -> CheckFailed:
    return CheckFailed("the source returns C-contiguous arrays",
                       f"{what}: DALI refused a batch of your source: \"{_STRIDED}\": one of the arrays it returned is "
                       "a view whose rows are not packed in memory: the labels rows[:, 0] left as they are (uint8, one "
                       "byte out of every 3,073, where the contract asks for int64), or the images rows[:, 1:] (which "
                       "skip the label byte of every record)",
                       "the images: np.ascontiguousarray(rows[:, 1:]).reshape(-1, 3, 32, 32); the labels: "
                       "rows[:, 0].astype(np.int64), the int64 the contract asks for, which is a packed copy too")


def _epoch_items(iterator, limit_batches, what):
    batches = 0
    for out in iterator:
        if not isinstance(out, (list, tuple)) or not out or not isinstance(out[0], dict):
            raise CheckFailed("yields DALI's batches", f"{what}: each item should be DALIGenericIterator's list of one "
                              f"dict per pipeline; got {type(out).__name__}")
        batch = out[0]
        missing = [k for k in ("images", "labels", "indices") if k not in batch]
        if missing:
            raise CheckFailed("names the outputs images, labels, indices",
                              f"{what}: the batch has keys {sorted(batch)}; missing {missing}",
                              'DALIGenericIterator(pipe, ["images", "labels", "indices"], ...)')
        yield {k: _as_numpy(batch[k]) for k in ("images", "labels", "indices")}
        batches += 1
        if batches > limit_batches:
            raise CheckFailed("an epoch ends", f"{what}: more than {limit_batches} batches without the epoch ending",
                              "the source must raise StopIteration once the epoch's records are used up")


def _epoch_summary(batches):
    sizes = [len(b["indices"].reshape(-1)) for b in batches]
    indices = np.concatenate([b["indices"].reshape(-1) for b in batches]) if batches else np.zeros(0, np.int64)
    return sizes, indices.astype(np.int64)


def _expect_exact_epoch(batches, records, members, batch_size, drop_last, what, seed, *, per_sample=None,
                        shuffled=True):
    """The epoch visits each of `members` once (or, with drop_last, len//B*B distinct of them).
    `per_sample`: whether the learner's external source is per-sample (from its graph; None: unknown)."""
    sizes, idx = _epoch_summary(batches)
    n = len(members)
    if not batches:
        raise CheckFailed("yields every epoch", f"{what}: no batches at all",
                          "the source must start again each epoch: compute the batch from BatchInfo "
                          "(iteration, epoch_idx) rather than from a counter of your own (every new for loop over "
                          "DALI's iterator starts the next epoch, and info.iteration starts again at 0)")
    full, rest = divmod(n, batch_size)
    if drop_last:
        expected_sizes = [batch_size] * full
    else:
        expected_sizes = [batch_size] * full + ([rest] if rest else [])
    counts = Counter(idx.tolist())
    dupes = [k for k, c in counts.items() if c > 1]
    if dupes:
        if len(batches) > 1 and all(np.array_equal(b["indices"].reshape(-1), np.arange(len(b["indices"].reshape(-1))))
                                    for b in batches):
            raise CheckFailed("the indices are the records' indices",
                              f"{what}: every batch's indices are 0, 1, 2, ..., {len(batches[0]['indices'].reshape(-1)) - 1}: "
                              f"positions within the batch (seed {seed})",
                              "return the index of each record in `records` (the entries of the epoch's order you "
                              "read), so that each sample can be traced back to its record")
        came = f"{len(dupes)} record{'s' if len(dupes) > 1 else ''} came more than once"
        last = batches[-1]["indices"].reshape(-1)
        earlier = set(np.concatenate([b["indices"].reshape(-1) for b in batches[:-1]]).tolist()) if len(batches) > 1 else set()
        if rest and not drop_last and len(last) == batch_size and set(dupes) <= set(last.tolist()) \
                and (set(dupes) & earlier or len(set(last.tolist())) < len(last)):
            raise CheckFailed("each record at most once per epoch",
                              f"{what}: {came}, all in the last batch, which holds {batch_size} samples where only "
                              f"{rest} records were left: it was filled up with records already seen (seed {seed})",
                              "with drop_last=False the last batch is short: return only the records left "
                              f"(a batch of {rest} here), DALI takes batches of any size up to batch_size")
        raise CheckFailed("each record at most once per epoch", f"{what}: {came} (seed {seed})",
                          "draw one permutation per epoch and cut it into batches")
    stray = set(counts) - set(members.tolist())
    if stray:
        raise CheckFailed("only this shard's records", f"{what}: {len(stray)} records that belong to no part of this "
                          f"shard (seed {seed})", "shard k of S gets positions floor(k*N/S) .. floor((k+1)*N/S) of the epoch's order")
    if not drop_last and len(idx) < n:
        hint = "the epoch must end with a partial batch of the remaining records"
        if len(idx) == full * batch_size and rest:
            hint = ("exactly the last partial batch is missing: a per-sample source (batch=False) drops it; return "
                    "whole batches from a batch=True source, the last one shorter, then raise StopIteration")
            if per_sample is False:
                hint = (f"exactly the last, shorter batch ({rest} records) is missing: with drop_last=False it is part of "
                        "the epoch; return it, then raise StopIteration (ceil(size / batch_size) batches)")
        raise CheckFailed("each record once per epoch", f"{what}: {n - len(idx)} of {n} records never came "
                          f"(batches of {batch_size}; seed {seed})", hint)
    if sizes != expected_sizes:
        raise CheckFailed("batch sizes follow the last-batch policy",
                          f"{what}: {n} records in batches of {batch_size} gave sizes {_sizes(sizes)}, expected "
                          f"{_sizes(expected_sizes)} (seed {seed})",
                          "full batches, then the remainder as one shorter batch" if not drop_last
                          else "with drop_last=True the partial last batch is left out")
    for b in batches:
        for name in ("labels", "indices"):
            if b[name].dtype != np.int64:
                raise CheckFailed("labels and indices are int64", f"{what}: the {name} come out as {b[name].dtype} "
                                  f"(seed {seed})", "return them from the source as int64 (rows[:, 0].astype(np.int64)) "
                                  "and declare them types.INT64: F.cross_entropy wants int64 class indices")
        labels = b["labels"].reshape(-1)
        if len(labels) != len(b["indices"].reshape(-1)) or not np.array_equal(labels, records[b["indices"].reshape(-1), 0]):
            if len(idx) > batch_size and np.array_equal(idx, np.arange(len(idx))) and shuffled:
                raise CheckFailed("the indices are the records' indices",
                                  f"{what}: the indices run 0, 1, 2, ..., {len(idx) - 1} through the shuffled epoch: "
                                  f"positions in the epoch, not the records read there, whose labels came with "
                                  f"them (seed {seed})",
                                  "return idx = order[start:stop][i * batch_size:(i + 1) * batch_size], the records' "
                                  "own indices in `records`, so that each sample can be traced back to its record")
            raise CheckFailed("labels match the records", f"{what}: a batch's labels are not the labels of the records "
                              f"its indices name (seed {seed})",
                              "the labels are byte 0 of the very rows the indices name: rows = records[idx], labels "
                              "rows[:, 0], and return idx itself as the indices")
        if tuple(b["images"].shape[1:]) != (3, 32, 32):
            raise CheckFailed("images are (b, 3, 32, 32)", f"{what}: yours {tuple(b['images'].shape)}")
    return idx


def _shard_rule_named(got: int, s: int, shards: int, n: int) -> str:
    """Which common rule gives shard `s` of `shards` over `n` records `got` records (w3-04: the count
    alone did not name the mistake)."""
    rules = [("every S-th record of the order (order[k::S])", len(range(s, n, shards))),
             ("round(k*N/S) for the bounds", round((s + 1) * n / shards) - round(s * n / shards)),
             ("N // S records each and the remainder to the last shard",
              n - s * (n // shards) if s == shards - 1 else n // shards),
             ("ceil(N/S) records each", min(n, (s + 1) * -(-n // shards)) - min(n, s * -(-n // shards))),
             ("ceil(k*N/S) for the bounds", -(-(s + 1) * n // shards) - -(-s * n // shards)),
             ("np.array_split (the first shards one more)", n // shards + (1 if s < n % shards else 0))]
    named = [name for name, count in rules if count == got]
    if not named:
        return ""
    return (f": {' or '.join(named)} gives that count; floor(k*N/S) .. floor((k+1)*N/S) gives "
            f"{n * (s + 1) // shards - n * s // shards}")


def _sizes(sizes):
    if len(sizes) <= 4:
        return str(sizes)
    return f"[{sizes[0]}, {sizes[1]}, ..., {sizes[-2]}, {sizes[-1]}] ({len(sizes)} batches)"


def _source_is_per_sample(iterator) -> bool | None:
    """Whether the external source of the iterator's pipeline is per-sample (batch=False), from its
    graph; None where that cannot be read."""
    pipes = getattr(iterator, "_pipes", None)
    ops = _graph(pipes[0]) if pipes else None
    modes = [getattr(op.node, "_batch", None) for op in ops or [] if op.kind == "ExternalSource"]
    modes = [m for m in modes if m is not None]
    return None if not modes else not all(modes)


def _expect_stateless_source(iterator, records, batch_size, n, pipe_seed, seed) -> None:
    """The source is a function of its BatchInfo alone (w5-04 w10: a counter kept in the closure and
    reset on StopIteration passed; in worker processes, parallel=True, it repeats and loses records):
    the source of a fresh iterator, called directly out of order, must return the batch each
    BatchInfo names."""
    from nvidia.dali.types import BatchInfo

    pipes = getattr(iterator, "_pipes", None)
    ops = _graph(pipes[0]) if pipes else None
    callbacks = [getattr(op.node, "_callback", None) for op in ops or [] if op.kind == "ExternalSource"]
    callbacks = list({id(cb): cb for cb in callbacks if callable(cb)}.values())    # num_outputs=3: one op each
    if len(callbacks) != 1:
        return                                  # not readable here: the epochs above are the test
    source = callbacks[0]
    batches = (n - 1) // batch_size             # full batches of the whole set; the calls ask for earlier ones
    asks = [(1, min(1, batches - 1)), (0, batches - 1), (1, 0), (0, 0)]
    for epoch, i in asks:
        want = np.random.default_rng((pipe_seed, epoch)).permutation(n)[i * batch_size:(i + 1) * batch_size]
        said = ""
        try:
            out = source(BatchInfo(i, epoch))
            found = [np.asarray(a).reshape(-1) for a in out if np.size(a) == len(want)]
            got = next((a for a in found if np.array_equal(a, want)), found[-1] if found else np.zeros(0))
        except StopIteration:
            got, said = None, ": it raised StopIteration"
        except Exception as exc:
            got, said = None, f": it raised {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
        if got is None or not np.array_equal(got, want):
            raise CheckFailed("the source depends only on its BatchInfo",
                              f"the external source of a fresh cifar_epochs(records, {batch_size}, seed=...), called "
                              f"directly with BatchInfo(iteration={i}, epoch_idx={epoch}) (after DALI had called it "
                              f"for the batches it prepares ahead), did not return batch {i} of epoch {epoch}{said} "
                              f"(seed {seed})",
                              "compute the batch from info.iteration and info.epoch_idx alone, with no counter or "
                              "state of your own: DALI calls the source ahead of the loop, and with parallel=True "
                              "in worker processes, each with its own copy of any state, in no fixed order")
    # w8-04 w42_32: every epoch's order kept in a dict never cleared (8N bytes an epoch, for as long as the
    # job runs): six epochs more asked of the source, a container of its own that grew by six holds them all
    def sizes():
        held = [c.cell_contents for c in getattr(source, "__closure__", None) or ()
                if _cell_filled(c)] + list(getattr(source, "__dict__", {}).values())
        return {id(h): len(h) for h in held if isinstance(h, (dict, list, set))}
    before = sizes()
    for epoch in range(10, 16):
        try:
            source(BatchInfo(0, epoch))
        except Exception:
            return
    grown = [k for k, size in sizes().items() if size - before.get(k, size) >= 6]
    if grown:
        raise CheckFailed("the source keeps nothing between calls",
                          f"the external source of a fresh cifar_epochs(records, {batch_size}, seed=...), asked for "
                          f"six epochs more, kept six more entries in a container of its own: every epoch's order "
                          f"stays in memory for as long as the job runs ({8 * n:,} bytes an epoch here, 400 kB an "
                          f"epoch for CIFAR's 50,000 records) (seed {seed})",
                          "compute the epoch's order from (seed, info.epoch_idx) in each call (a permutation of "
                          "50,000 takes about a millisecond), or keep the current epoch's only")


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _augmentation(batches, records) -> np.ndarray:
    """(dy, dx, flip) of each sample of `batches` (crops of their records), one row per sample."""
    x = np.concatenate([b["images"] for b in batches])
    idx = np.concatenate([b["indices"].reshape(-1) for b in batches])
    found = match_crops(x, _sources(records, idx), data.CIFAR10_MEAN, data.CIFAR10_STD)
    return np.stack([found.dy, found.dx, found.flipped.astype(np.int64)], axis=1)


def _drawn_alike(batches_a, batches_b, records) -> int:
    """How many samples two shards' first batches cropped and flipped alike, position by position, when
    all of them were (0 when any differs)."""
    a, b = _augmentation(batches_a, records), _augmentation(batches_b, records)
    m = min(len(a), len(b))
    return m if np.array_equal(a[:m], b[:m]) else 0


class _CountedRecords(np.memmap):
    """The records' memory map, counting how often the learner's code indexes it (its views and
    copies do not count)."""
    def __getitem__(self, key):
        reads = self.__dict__.get("_reads")
        if reads is not None:
            reads[0] += 1
            if isinstance(key, (list, np.ndarray)) and np.ndim(key) == 1 and \
                    np.asarray(key).dtype.kind in "iu":      # rows by index: the most in one call
                reads[1] = max(reads[1], len(key))
        return super().__getitem__(key)

    def take(self, indices, *args, **kwargs):    # np.take(records, idx, axis=0) comes here (w7-04: it escaped)
        reads = self.__dict__.get("_reads")
        if reads is not None:
            reads[0] += 1
            if np.ndim(indices) == 1:
                reads[1] = max(reads[1], len(indices))
        return super().take(indices, *args, **kwargs)

    def __array_finalize__(self, obj):
        super().__array_finalize__(obj)
        self.__dict__.pop("_reads", None)


def _expect_batch_reads(cifar_epochs, batch_size, tmp: Path, rng, seed):
    """The source reads only its batch's rows of the memory map (w1-04: np.array(records) on every batch
    copies the whole file, 150 MB for CIFAR's training set, per batch, and passed). A sparse file of
    zeros large beside a batch: what Python allocates while the iterator reads a few batches, beyond
    what it held after its creation, is measured with tracemalloc (numpy reports its buffers to it,
    from DALI's callback thread too). np.take on the memory map is counted as an index is (w7-04: it
    escaped the count). What the call itself leaves allocated is measured too (w9-04 w42_27:
    records = np.array(records) once at the top of cifar_epochs copies the whole file into every
    process, 150 MB for CIFAR, 8x on an 8-GPU node, and passed; the spec says a batch reads only its
    own rows of the memory map): that also catches a whole-shard copy through a plain view,
    np.asarray(records)[...], made for the first epoch while DALI prefetches."""
    import tracemalloc

    big = 16_384                                   # 50 MB of records; a batch is < 250 kB
    path = tmp / "big-records.bin"
    with open(path, "wb") as f:
        f.truncate(big * data.RECORD_BYTES)        # sparse: nothing written
    records = data.read_records(path).view(_CountedRecords)
    records._reads = reads = [0, 0]
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        with calling(f"cifar_epochs(records of {big:,}, {batch_size}, seed=..., shuffle=True)"):
            it = cifar_epochs(records, batch_size, seed=int(rng.integers(0, 2**31 - 1)), num_threads=_threads())
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for k, _ in enumerate(it):
            if k == 3:
                break
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del it
    if reads[0] >= 2 * batch_size:       # w6-04 w42_23: np.stack([records[j] for j in idx]) passed
        raise CheckFailed("reads each batch's rows in one call",
                          f"reading 4 batches of {batch_size} (and the ones DALI prefetched), your source indexed "
                          f"`records` {reads[0]:,} times: one Python call per row, where records[idx] reads a "
                          f"batch's rows in one (seed {seed})",
                          "rows = records[idx]: one NumPy call per batch. A Python loop over the rows "
                          "(np.stack([records[j] for j in idx])) is per-sample Python work again, the cost DALI "
                          "takes off the training loop (about 20x the single call for 256 rows)")
    if reads[1] > batch_size:           # w7-04 42_epoch_materialized: records[order[start:stop]] kept for the epoch
        raise CheckFailed("reads only the batch's records",
                          f"your source read {reads[1]:,} rows of the memory map in one call, for batches of "
                          f"{batch_size} (one shard of {big:,} records): the whole shard copied into memory once an "
                          "epoch (records[order[start:stop]] kept for the epoch?), 150 MB more per process for "
                          f"CIFAR's training set, every epoch (seed {seed})",
                          "a batch reads only its own rows of the memory map: rows = records[idx], with idx the "
                          "batch's slice of the epoch's order; keep the order (indices), not the rows")
    kept = held - before      # what the call left allocated (DALI has prefetched a few batches by now)
    if kept > big * data.RECORD_BYTES // 2:
        raise CheckFailed("reads only the batch's records",
                          f"when cifar_epochs(records of {big:,}, {batch_size}) returned, your code held "
                          f"{kept / 1e6:.0f} MB more than before the call, for a memory-mapped file of "
                          f"{big * data.RECORD_BYTES / 1e6:.0f} MB: the whole file copied into this process "
                          "(records = np.array(records) once at the start? or the epoch's rows, "
                          "np.asarray(records)[order]?), 150 MB per process for CIFAR's training set, 8x that on "
                          f"an 8-GPU node, read before the first batch (seed {seed})",
                          "keep `records` the memory map it is: the operating system pages in what a batch touches. "
                          "A batch reads only its own rows, rows = records[idx], with idx the batch's slice of the "
                          "epoch's order; keep the order (indices), not the rows")
    extra = peak - held
    if extra > big * data.RECORD_BYTES // 2:
        raise CheckFailed("reads only the batch's records",
                          f"reading an epoch and 4 batches of the next, in batches of {batch_size}, from a "
                          f"memory-mapped file of {big:,} records ({big * data.RECORD_BYTES / 1e6:.0f} MB) in one "
                          f"shard, your source allocated {extra / 1e6:.0f} MB at once: the whole shard copied into "
                          "memory, on every batch (np.array(records)?) or once an epoch (records[order[start:stop]] "
                          "kept for the epoch?): for CIFAR's training set 150 MB more per process "
                          f"(seed {seed})",
                          "a batch reads only its own rows of the memory map: rows = records[idx], with idx the "
                          "batch's slice of the epoch's order; keep the order (indices), not the rows")


@exercise("4.2", "Exact epochs through DALI's PyTorch iterator", points=2)
@forbids("course_utils.dali_pipelines:CifarRecordBatches.__init__",   # first: named as called (w7-04, not shard_range)
         "course_utils.dali_pipelines:CifarRecordBatches.__call__", "course_utils.dali_pipelines:CifarRecordBatches.epoch_order",
         "course_utils.dali_pipelines:shard_range", "course_utils.dali_pipelines:cifar_loader")
def check_epochs(cifar_epochs):
    _require_dali()
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    expect_callable(cifar_epochs, "a function cifar_epochs(records, batch_size, *, shuffle=True, seed=0, shard_id=0, "
                    "num_shards=1, drop_last=False, device='cpu', num_threads=2) that returns a DALIGenericIterator")
    rng, seed = fresh_rng()
    batch_size = int(rng.integers(32, 80))
    k = int(rng.integers(2, 4))
    # N = 3Bk - 1 on every seed: N and the shards do not divide by 3, a partial last batch for the whole
    # set; three shards of Bk - 1, Bk and Bk records: two whose size the batch divides (no short batch
    # there), and with drop_last one record more than the first, which must not give them a batch more
    n = 3 * batch_size * k - 1
    shards = 3
    bounds = [(s * n // shards, (s + 1) * n // shards) for s in range(shards)]
    with tempfile.TemporaryDirectory(prefix="check-4.2-") as tmp:
        path = Path(tmp) / "records.bin"
        _random_records(rng, n).tofile(path)
        records = data.read_records(path)      # memory-mapped, as the lesson's records are
        everyone = np.arange(n)
        pipe_seed = int(rng.integers(0, 2**31 - 1))

        def make(*, of=None, seed_=None, **kw):
            given = records if of is None else of
            call = (f"cifar_epochs({'records' if of is None else f'records[:{len(of)}]'}, {batch_size}, seed=..."
                    + "".join(f", {a}={v!r}" for a, v in kw.items()) + ")")
            try:        # DALI's iterator runs the first batches as it is created
                with _calling_cpu(call, kw.get("device", "cpu"), seed):
                    it = cifar_epochs(given, batch_size, seed=pipe_seed if seed_ is None else seed_,
                                      num_threads=_threads(), **kw)
            except RuntimeError as exc:
                if _STRIDED in str(exc):
                    raise _strided("creating the iterator") from None
                _expect_declared_types(exc, call, seed)
                raise
            if not isinstance(it, DALIGenericIterator):
                raise WrongType("type", "cifar_epochs(...) should return DALI's PyTorch iterator "
                                "(nvidia.dali.plugin.pytorch.DALIGenericIterator), but it returned "
                                f"{'None' if it is None else type(it).__name__}.")
            pipes = getattr(it, "_pipes", None) or []
            threads = [getattr(p, "num_threads", None) for p in pipes]
            if any(t is not None and t != _threads() for t in threads):     # w8-04: num_threads=2 hard-coded passed
                raise CheckFailed("uses the threads it is given", f"{call}: asked for num_threads={_threads()}, your "
                                  f"pipeline runs {next(t for t in threads if t != _threads())} (seed {seed})",
                                  "pass num_threads on to cifar_pipeline(..., num_threads=num_threads): the caller "
                                  "knows how many cores this process may use (under DDP, its share of the node's)")
            return it

        limit = 3 * (n // batch_size + 2)
        it = make()
        per_sample = _source_is_per_sample(it)
        first = _one_epoch(it, limit, "epoch 1", records=n, batch_size=batch_size)
        idx1 = _expect_exact_epoch(first, records, everyone, batch_size, False, "epoch 1", seed, per_sample=per_sample)
        second = _one_epoch(it, limit, "epoch 2 (a second for loop over the same iterator)", records=n,
                            batch_size=batch_size)
        idx2 = _expect_exact_epoch(second, records, everyone, batch_size, False, "epoch 2", seed, per_sample=per_sample)
        if np.array_equal(idx1, idx2):
            raise CheckFailed("shuffles every epoch", "epochs 1 and 2 visited the records in the same order",
                              "draw the permutation from (seed, epoch): BatchInfo.epoch_idx tells the source the epoch")
        for e, idx in enumerate((idx1, idx2)):
            order = np.random.default_rng((pipe_seed, e)).permutation(n)
            if not np.array_equal(idx, order):
                cuts = range(0, n, batch_size)
                if all(np.array_equal(np.sort(idx[k:k + batch_size]), np.sort(order[k:k + batch_size])) for k in cuts):
                    sorted_ = all(np.all(np.diff(idx[k:k + batch_size]) > 0) for k in cuts)
                    raise CheckFailed("visits the epoch's order",
                                      f"epoch {e + 1}: each batch holds the right records, those of the permutation's "
                                      f"slice, but {'sorted' if sorted_ else 'reordered'} within the batch (seed {seed})",
                                      "keep the slice of the permutation in its order: idx = order[start:stop][i * "
                                      "batch_size:(i + 1) * batch_size], without sorting it (the records sit in memory: "
                                      "a sorted read gains nothing here, and the order is part of the contract)")
                raise CheckFailed("visits the epoch's order", f"epoch {e + 1} did not visit the records in the order "
                                  f"np.random.default_rng((seed, {e})).permutation(N) gives (seed {seed})",
                                  "the order of epoch e is np.random.default_rng((seed, e)).permutation(N), with the "
                                  "seed you are given and BatchInfo.epoch_idx")
        # the same seed and another size (w3-04: an order cached by (seed, epoch), not by N, passed): two loaders
        # with one seed, a training set and a subset, must not share an order
        sub = n - batch_size - 1
        try:
            part = _one_epoch(make(of=records[:sub]), limit, f"records[:{sub}], the same seed", records=sub,
                              batch_size=batch_size)
            _, idx_sub, said = *_epoch_summary(part), ""
        except Exception as exc:       # an index past the subset's end, read from an order of all N
            idx_sub, said = None, f" (it raised {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})"
        if idx_sub is None or not np.array_equal(idx_sub, np.random.default_rng((pipe_seed, 0)).permutation(sub)):
            raise CheckFailed("the order depends on the call's own records",
                              f"called again with the same seed on records[:{sub}] (after a call on all {n}), epoch 1 "
                              f"did not visit np.random.default_rng((seed, 0)).permutation({sub}){said} (seed {seed})",
                              "something is kept between calls and not keyed on the dataset's size (an order cached "
                              "by seed and epoch only?): what a call returns must depend on its own arguments alone, "
                              "so compute the permutation of len(records) in the call, or key a cache on N too")
        # another seed than the calls before: an ignored flag shuffles with this call's seed, an order kept
        # between calls is the earlier call's (w2-04 w42_15: the two were told apart by neither)
        other_seed = int(rng.integers(0, 2**31 - 1))
        in_order = _one_epoch(make(shuffle=False, seed_=other_seed), limit, "shuffle=False", records=n,
                              batch_size=batch_size)
        _, idx = _epoch_summary(in_order)
        if not np.array_equal(idx, np.arange(n)):
            if np.array_equal(idx, np.random.default_rng((other_seed, 0)).permutation(n)):
                raise CheckFailed("shuffle=False keeps the records' order",
                                  f"with shuffle=False your iterator shuffled anyway: it visited "
                                  f"np.random.default_rng((seed, 0)).permutation(N) of its own seed (seed {seed})",
                                  "honour the flag: without shuffle the order of every epoch is np.arange(N)")
            if np.array_equal(idx, np.random.default_rng((pipe_seed, 0)).permutation(n)):
                raise CheckFailed("shuffle=False keeps the records' order",
                                  f"with shuffle=False your iterator visited the shuffled order of an earlier call "
                                  f"(shuffle=True, the same seed) (seed {seed})",
                                  "something is kept between calls (an order cached at module level, by epoch "
                                  "only?): what a call returns must depend on its own arguments alone")
            raise CheckFailed("shuffle=False keeps the records' order", f"with shuffle=False the epoch did not visit "
                              f"0, 1, 2, ... (seed {seed})", "without shuffle the order is np.arange(N)")
        # the images travel with their indices (the training augmentation of exercise 4.1)
        x = np.concatenate([b["images"] for b in first[:2]])
        idx = np.concatenate([b["indices"].reshape(-1) for b in first[:2]])
        found = match_crops(x, _sources(records, idx), data.CIFAR10_MEAN, data.CIFAR10_STD)
        if not found.exact.all():
            # w8-04 w42_25: the CHW bytes read as HWC, then transposed: the pixels scrambled, not the indices
            hwc = records[idx, 1:].reshape(-1, 32, 32, 3).transpose(0, 3, 1, 2)
            as_hwc = match_crops(x, np.ascontiguousarray(hwc), data.CIFAR10_MEAN, data.CIFAR10_STD)
            if as_hwc.exact.mean() > 0.5:
                raise CheckFailed("images belong to their indices",
                                  f"{int((~found.exact).sum())} of {len(idx)} images are not an augmented crop of the "
                                  f"record their index names, but each is a crop of it read as 32x32x3 (HWC) and "
                                  f"transposed: the pixel layout is wrong, not the indices (seed {seed})",
                                  "a record's 3,072 pixel bytes are CHW already (1,024 red, then green, then blue): "
                                  "rows[:, 1:].reshape(-1, 3, 32, 32), no transpose")
            raise CheckFailed("images belong to their indices", f"{int((~found.exact).sum())} of {len(idx)} images are "
                              f"not an augmented crop of the record their index names (seed {seed})",
                              "images, labels and indices come out of one source call: keep them together, and "
                              "augment as in exercise 4.1")
        # drop_last
        it = make(drop_last=True)
        for e in (1, 2):
            _expect_exact_epoch(_one_epoch(it, limit, f"drop_last epoch {e}", records=n, batch_size=batch_size),
                                records, everyone, batch_size, True, f"drop_last=True, epoch {e}", seed,
                                per_sample=per_sample)
        # shards: disjoint, together the whole dataset, in both epochs
        iterators = [make(shard_id=s, num_shards=shards) for s in range(shards)]
        firsts = []
        for e in (1, 2):
            seen = []
            for s, it in enumerate(iterators):
                lo, hi = bounds[s]
                batches = _one_epoch(it, limit, f"shard {s} of {shards}, epoch {e}", records=hi - lo,
                                     batch_size=batch_size)
                if e == 1:
                    firsts.append(batches)
                _, idx = _epoch_summary(batches)
                if len(idx) != hi - lo:
                    named = _shard_rule_named(len(idx), s, shards, n)
                    raise CheckFailed("shards split the records evenly", f"shard {s} of {shards}, epoch {e}: "
                                      f"{len(idx)} records, expected {hi - lo} of {n}{named} (seed {seed})",
                                      "shard k of S gets positions floor(k*N/S) .. floor((k+1)*N/S) of the epoch's order")
                _expect_exact_epoch(batches, records, np.unique(idx), batch_size, False,
                                    f"shard {s} of {shards}, epoch {e}", seed, per_sample=per_sample)
                seen.append(idx)
            allidx = np.concatenate(seen)
            if len(np.unique(allidx)) != n:
                overlap = len(allidx) - len(np.unique(allidx))
                raise CheckFailed("shards are disjoint and cover every record", f"epoch {e}: the {shards} shards "
                                  f"share {overlap} records and miss {n - len(np.unique(allidx))} (seed {seed})",
                                  "every shard must cut the same epoch order (same seed), each its own slice")
            order = np.random.default_rng((pipe_seed, e - 1)).permutation(n)
            for s, idx in enumerate(seen):
                lo, hi = bounds[s]
                if not np.array_equal(idx, order[lo:hi]):
                    same = np.isin(idx, order[lo:hi]).mean()
                    if np.array_equal(np.sort(idx), np.arange(lo, hi)):
                        detail = (f"it read records {lo}..{hi - 1}, a fixed block of the dataset, in a shuffled order: "
                                  "that rank would train on the same third of the data every epoch")
                    else:
                        detail = f"{same:.0%} of its records are those of that slice"
                    raise CheckFailed("a shard is its slice of the epoch's order",
                                      f"shard {s} of {shards}, epoch {e}: expected positions {lo}..{hi - 1} of "
                                      f"np.random.default_rng((seed, {e - 1})).permutation(N), in that order; {detail} "
                                      f"(seed {seed})",
                                      "draw the epoch's permutation of ALL records (the same in every shard), then "
                                      "cut the shard's slice out of it: every epoch each shard gets different records")
        # the same seed on every rank, but each rank its own augmentation draws
        m = _drawn_alike(firsts[0][:1], firsts[1][:1], records)
        if m:
            raise CheckFailed("each shard draws its own augmentation",
                              f"shards 0 and 1, given the same seed, cropped and flipped the j-th sample of their first "
                              f"batch alike, all {m} of them: every rank of a DDP job would draw the same crops and "
                              f"flips (seed {seed})",
                              "derive the pipeline's seed from seed and shard_id (seed + shard_id, as DALI's own ResNet "
                              "example does with the local rank); the order's seed stays the same in every process")
        # a longer shard whose size the batch does not divide (w2-04 w42_20: every shard given the smallest
        # shard's batch count lost its last record there), and another seed on the same shard_id (w42_21:
        # an augmentation seed of shard_id alone): records[:2Bk+1] in two shards of Bk and Bk+1, shard 1
        n2 = 2 * batch_size * k + 1
        lo2, hi2 = n2 // 2, n2
        # seed=0, the signature's default and what a DDP job that never sets one runs (w7-04 42_shard_seed_times:
        # seed * (shard_id + 1) gave every shard pipeline seed 0 there, and passed on a non-zero seed)
        seed2 = 0
        what2 = f"records[:{n2}] in 2 shards of {lo2} and {hi2 - lo2}, shard 1, epoch 1"
        longer = _one_epoch(make(of=records[:n2], seed_=seed2, shard_id=1, num_shards=2), limit, what2,
                            records=hi2 - lo2, batch_size=batch_size)
        got2, idx2 = _epoch_summary(longer)
        if len(idx2) < hi2 - lo2 and len(got2) == math.ceil(lo2 / batch_size):
            raise CheckFailed("each record once per epoch",
                              f"{what2}: {len(idx2)} of its {hi2 - lo2} records came, in {len(got2)} batches, the "
                              f"count of the shorter shard ({lo2} records); its last record never came, so every epoch "
                              f"loses a record of each longer shard (seed {seed})",
                              "without drop_last each shard yields ceil(its own size / batch_size) batches, "
                              "(stop - start) of its own slice: shards differ by a record, and the longer ones need "
                              "the short batch that holds it")
        _expect_exact_epoch(longer, records, np.random.default_rng((seed2, 0)).permutation(n2)[lo2:hi2], batch_size,
                            False, what2, seed, per_sample=per_sample)
        # and the shorter shard, whose size the batch divides (w5-04 w27: ceil(N / (S*B)) batches for every shard,
        # the average shard's count, asked shard 0 for a batch after its last record, and passed)
        what0 = f"records[:{n2}] in 2 shards of {lo2} and {hi2 - lo2}, shard 0, epoch 1"
        try:
            shorter = _one_epoch(make(of=records[:n2], seed_=seed2, shard_id=0, num_shards=2), limit, what0,
                                 records=lo2, batch_size=batch_size)
        except CheckFailed as exc:
            if exc.prop == "ends the epoch after its last record" and -(-n2 // (2 * batch_size)) > lo2 // batch_size:
                exc.hint = (f"ceil(N / (num_shards * batch_size)) = {-(-n2 // (2 * batch_size))} batches, the "
                            f"average shard's count, is one more than this shard of {lo2} holds: count each shard's "
                            "batches from its own size, ceil((stop - start) / batch_size)")
            raise
        _expect_exact_epoch(shorter, records, np.random.default_rng((seed2, 0)).permutation(n2)[:lo2], batch_size,
                            False, what0, seed, per_sample=per_sample)
        m = _drawn_alike(shorter[:1], longer[:1], records)
        if m:
            raise CheckFailed("each shard draws its own augmentation",
                              f"shards 0 and 1 of records[:{n2}], both given seed=0 (the default), cropped and flipped "
                              f"the j-th sample of their first batch alike, all {m} of them: every rank of a DDP job "
                              f"that never sets a seed would draw the same crops and flips (seed {seed})",
                              "seed=0 is a seed like any other: a pipeline seed such as seed * (shard_id + 1) is 0 on "
                              "every shard there; seed + shard_id differs on every shard whatever the seed")
        m = _drawn_alike(firsts[1][:1], longer[:1], records)
        if m:
            raise CheckFailed("each shard's augmentation follows the seed",
                              f"shard 1 given seed={pipe_seed} and shard 1 given seed={seed2} cropped and flipped the "
                              f"j-th sample of their first batch alike, all {m} of them: the augmentation's seed "
                              f"ignores `seed` (seed {seed})",
                              "derive the pipeline's seed from seed AND shard_id (seed + shard_id): another seed, "
                              "another augmentation")
        # drop_last with shards: the same number of full batches on every rank
        expected = (n // shards) // batch_size
        counts, sizes, gots = [], [], []
        for s in range(shards):
            lo, hi = bounds[s]
            batches = _one_epoch(make(shard_id=s, num_shards=shards, drop_last=True), limit,
                                 f"shard {s} of {shards}, drop_last=True", records=hi - lo, batch_size=batch_size)
            got, idx = _epoch_summary(batches)
            counts.append(len(got))
            gots.append(got)
            sizes.append(hi - lo)
            order = np.random.default_rng((pipe_seed, 0)).permutation(n)[lo:hi]
            if len(got) == expected and (got != [batch_size] * expected
                                         or not np.array_equal(idx, order[:expected * batch_size])):
                raise CheckFailed("with drop_last, every shard the same number of full batches",
                                  f"shard {s} of {shards}, drop_last=True: batch sizes {_sizes(got)}; expected "
                                  f"{expected} full batches, the first {expected * batch_size} records of its slice "
                                  f"(seed {seed})", "the first (N // S) // batch_size full batches of the shard's slice")
        if counts != [expected] * shards and len(set(counts)) == 1:
            short = [s for s in range(shards) if any(size < batch_size for size in gots[s])]
            where = (f"; shard {short[0]}'s batch sizes are {_sizes(gots[short[0]])}: its last batch is not full"
                     if short else "")
            raise CheckFailed("with drop_last, every shard the same number of full batches",
                              f"with drop_last=True, shards of {', '.join(map(str, sizes))} records in batches of "
                              f"{batch_size} gave {counts[0]} batches each, expected {expected}{where}: the count must "
                              f"be the smallest shard's full batches (seed {seed})",
                              "with drop_last every shard yields (N // S) // batch_size batches: N // num_shards is "
                              "the smallest shard's size (ceil(N / S), the largest's, gives the shorter shards a "
                              "batch they cannot fill)")
        if counts != [expected] * shards:
            raise CheckFailed("with drop_last, every shard the same number of full batches",
                              f"with drop_last=True, shards of {', '.join(map(str, sizes))} records in batches of "
                              f"{batch_size} gave {', '.join(map(str, counts))} batches; under DistributedDataParallel "
                              "the rank with a batch more waits for ever in an all-reduce the others never join "
                              f"(seed {seed})",
                              "shards differ by a record at most: with drop_last every shard yields (N // S) // "
                              "batch_size batches (N // num_shards, the smallest shard's size, cut into full batches)")
        if per_sample is not True:
            _expect_stateless_source(make(), records, batch_size, n, pipe_seed, seed)
        _expect_batch_reads(cifar_epochs, batch_size, Path(tmp), rng, seed)
        gpu = ""
        if torch.cuda.is_available():
            it = make(device="gpu")
            batches = []
            for out in it:
                if not out[0]["images"].is_cuda:
                    raise CheckFailed("device='gpu' gives CUDA tensors", "the images of the GPU pipeline are on the "
                                      "CPU", "move the images to the GPU (.gpu()) inside the pipeline, on this "
                                      "process's GPU")
                batches.append({k: _as_numpy(out[0][k]) for k in ("images", "labels", "indices")})
            _expect_exact_epoch(batches, records, everyone, batch_size, False, "device='gpu', epoch 1", seed)
            gpu = " and on the GPU"
    probe = np.zeros((2 * batch_size, data.RECORD_BYTES), np.uint8)
    for k in _other_thread_counts()[:1]:      # w10-04: a floor of 2 (max(num_threads, 2)) passed 4.1 and 4.3
        call = f"cifar_epochs(records, {batch_size}, seed=1, num_threads={k})"
        with calling(call):
            it = cifar_epochs(probe, batch_size, seed=1, num_threads=k)
        threads = [getattr(p, "num_threads", None) for p in getattr(it, "_pipes", None) or []]
        del it
        if any(t is not None and t != k for t in threads):
            raise CheckFailed("uses the threads it is given", f"{call}: your pipeline runs "
                              f"{next(t for t in threads if t != k)} (seed {seed})",
                              "pass num_threads on to cifar_pipeline(..., num_threads=num_threads) as it is, with no "
                              "floor or cap: the caller knows how many cores this process may use, and the lesson's "
                              "one-thread timings need exactly one")
    _expect_local_gpu(lambda: cifar_epochs(probe, batch_size, seed=1, device="gpu", num_threads=_threads()),
                      "cifar_epochs(records, batch_size, device='gpu', ...)", seed, iterator=True)
    return (f"{n} records in batches of {batch_size}: each once per epoch for two epochs, last batch "
            f"{n % batch_size} (or dropped), reshuffled; 3 shards of {', '.join(str(hi - lo) for lo, hi in bounds)} "
            f"records, each its slice of every epoch's order, its own augmentation, and with drop_last {expected} "
            f"full batch{'es' if expected != 1 else ''} each; a shard of {hi2 - lo2} beside one of {lo2}: every record, "
            f"and another seed, another augmentation; beside it the shorter shard, every record and no empty batch; the "
            f"source, called out of order, gave the batch each BatchInfo named, and read each batch's rows by indexing the memory map with the "
            f"batch's indices (not row by row), copying none of the file; num_threads={_threads()} and 1 as given{gpu}; with device='gpu', read without building it: GPU {_LOCAL_RANK} in a process "
            f"whose LOCAL_RANK is {_LOCAL_RANK} (its current device still 0), and the augmentation on that GPU.")


# -- 4.3 the JPEG pipeline -------------------------------------------------------------------

_CLASS_WORDS = ["dog", "Cat", "ant", "Zebra", "bird", "apple", "b10", "b9", "Moth", "eel", "fox", "Yak"]
_RED_LO, _RED_HI = 30.0, 225.0        # every file's red rises from left to right between these
_SHUFFLE_BAR = 0.1                    # the resultant length of two epochs' position shifts (see _shift_resultant)


@dataclass
class _Folder:
    """A fresh folder of JPEGs: one class per subfolder, a distinct (class, height, width) per file."""
    root: Path
    truth: dict          # (label, h, w) -> the file's RGB (its green and blue fill the file)
    number: dict         # (label, h, w) -> the file's number in its folder (its place in folder order)
    label_of: dict       # folder name -> label (sorted order)

    @property
    def keys(self) -> list:
        return sorted(self.truth)


def _jpeg_folder(rng, root: Path, batch_size: int) -> _Folder:
    """Between 3,000 and 3,300 small JPEGs (enough that a shuffle inside DALI's 1,024-sample buffer
    shows), `2 m batch_size + 1` of them so that two shards differ by one file and, without padding,
    by one batch. Green and blue are one colour per file size; red rises from left to right (it
    says where a crop was taken and whether it was mirrored)."""
    from PIL import Image

    names = [str(v) for v in rng.choice(_CLASS_WORDS, int(rng.integers(4, 6)), replace=False)]
    label_of = {name: i for i, name in enumerate(sorted(names))}    # DALI's rule: sorted folder names
    m = -(-int(rng.integers(3000, 3200)) // (2 * batch_size))
    n = 2 * m * batch_size + 1
    counts = rng.multinomial(n - 400 * len(names), [1 / len(names)] * len(names)) + 400
    grid = [(h, w) for h in range(32, 96) for w in range(32, 96)]
    sizes = [grid[k] for k in rng.choice(len(grid), int(max(counts)) + 100, replace=False)]   # shared by the classes
    encoded, truth, number = {}, {}, {}
    for name, count in zip(names, counts):      # written in a shuffled, unsorted order
        (root / name).mkdir()
        for j, k in enumerate(rng.choice(len(sizes), int(count), replace=False)):
            h, w = sizes[k]
            if (h, w) not in encoded:
                rgb = np.array([0, *rng.integers(20, 236, 2)])
                pixels = np.empty((h, w, 3), np.uint8)
                pixels[:] = rgb
                pixels[:, :, 0] = np.linspace(_RED_LO, _RED_HI, w).round().astype(np.uint8)[None, :]
                buf = __import__("io").BytesIO()
                Image.fromarray(pixels).save(buf, format="JPEG", quality=95)
                encoded[(h, w)] = (buf.getvalue(), rgb)
            data_bytes, rgb = encoded[(h, w)]
            (root / name / f"{j:04d}.jpg").write_bytes(data_bytes)
            truth[(label_of[name], h, w)] = rgb
            number[(label_of[name], h, w)] = j
    return _Folder(root, truth, number, label_of)


@dataclass
class _Sample:
    """What the check keeps of one output image (the images themselves would not fit in memory)."""
    label: int
    h: int
    w: int
    means: np.ndarray          # each channel's mean, normalised
    low: float                 # the smallest and largest value of the image
    high: float
    left: float                # where the crop's left and right edges fall in the file, 0..1 of its width
    right: float
    mirrored: bool
    clear: bool                # the red ramp is steep enough to tell the mirroring


def _summarise(images: np.ndarray, labels, shapes) -> list[_Sample]:
    mean = np.array(dali_mean(), np.float32) * 255
    std = np.array(dali_std(), np.float32) * 255
    red = images[:, 0].mean(axis=1) * std[0] + mean[0]        # (b, crop): the red profile, 0..255
    third = max(red.shape[1] // 3, 1)
    first, last = red[:, :third].mean(axis=1), red[:, -third:].mean(axis=1)
    ends = np.sort(np.stack([red[:, 0], red[:, -1]], axis=1), axis=1)
    position = (ends - _RED_LO) / (_RED_HI - _RED_LO)
    means = images.mean(axis=(2, 3))
    low, high = images.min(axis=(1, 2, 3)), images.max(axis=(1, 2, 3))
    return [_Sample(int(labels[i]), int(shapes[i, 0]), int(shapes[i, 1]), means[i], float(low[i]),
                    float(high[i]), float(position[i, 0]), float(position[i, 1]), bool(first[i] > last[i]),
                    bool(abs(first[i] - last[i]) > 0.1 * (_RED_HI - _RED_LO))) for i in range(len(labels))]


def dali_mean():
    from ..dali_pipelines import IMAGENET_MEAN
    return IMAGENET_MEAN


def dali_std():
    from ..dali_pipelines import IMAGENET_STD
    return IMAGENET_STD


def _expect_reader_options(exc: BaseException, what: str, seed: int) -> None:
    """DALI's C++ asserts on reader options that exclude each other (w7-04: stick_to_shard=True beside
    shuffle_after_epoch=True came back raw), in the check's own words; any other error goes on."""
    if "stick_to_shard" in str(exc) and "shuffle_after_epoch" in str(exc) and "cannot be both" in str(exc):
        raise CheckFailed("every shard reads new files each epoch",
                          f"{what}: DALI refused to build your reader: shuffle_after_epoch=True and "
                          f"stick_to_shard=True cannot be given together (seed {seed})",
                          "leave stick_to_shard False: it would keep each rank on one slice of the files for "
                          "ever, where shuffle_after_epoch=True gives every rank a new share of a new permutation "
                          "of all files each epoch") from None
    if "random_shuffle" in str(exc) and "shuffle_after_epoch" in str(exc) and "cannot be both" in str(exc):
        raise CheckFailed("shuffles all the files every epoch",
                          f"{what}: DALI refused to build your reader: shuffle_after_epoch=True and "
                          f"random_shuffle=True cannot be given together (seed {seed})",
                          "keep shuffle_after_epoch=True (a new permutation of all files each epoch) and drop "
                          "random_shuffle, a buffer that only shuffles locally") from None


def _jpeg_run(jpeg_pipeline, folder, batch_size, crop, device, shard_id, num_shards, pipe_seed, what, seed, *,
              fill=False):
    """The learner's pipeline for shard `shard_id` of `num_shards`, behind DALI's iterator (reader
    'Reader'; PARTIAL: every file once, or `fill`: FILL, the training policy, every shard the same
    number of full batches): the pipeline, and a generator that runs its epochs one at a time as they
    are asked for, yielding the samples and the number of batches of each."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    call = (f"jpeg_pipeline(file_root, {batch_size}, crop={crop}, device={device!r}, shard_id={shard_id}, "
            f"num_shards={num_shards}, num_threads={_threads()}, seed={pipe_seed})")
    with _calling_cpu(call, device, seed):
        pipe = _expect_pipeline(jpeg_pipeline(str(folder.root), batch_size, crop=crop, device=device,
                                              shard_id=shard_id, num_shards=num_shards, num_threads=_threads(),
                                              seed=pipe_seed), "jpeg_pipeline(...)")
    if device == "cpu":
        _expect_placement(pipe, "cpu", what, seed)
    _expect_settings(pipe, _threads(), what, seed)
    try:
        _num_outputs(pipe, 3, "images, labels, shapes")     # builds the pipeline
    except RuntimeError as exc:
        _expect_reader_options(exc, what, seed)
        raise
    try:
        it = DALIGenericIterator(pipe, ["images", "labels", "shapes"], reader_name="Reader", auto_reset=True,
                                 last_batch_policy=LastBatchPolicy.FILL if fill else LastBatchPolicy.PARTIAL)
    except RuntimeError as exc:
        _expect_reader_options(exc, what, seed)
        if "Reader" in str(exc):
            raise CheckFailed("the reader is named 'Reader'", f"{what}: DALI's iterator found no operator named 'Reader'",
                              "fn.readers.file(..., name='Reader'): the iterator asks it for the epoch size")
        raise

    def epochs():
        while True:
            samples, batches = [], 0
            for got in it:
                batches += 1
                b = got[0]
                if device == "gpu" and not b["images"].is_cuda:
                    raise CheckFailed("device='gpu' decodes on the GPU", f"{what}: the images come back on the CPU",
                                      "decode with fn.decoders.image(..., device='mixed')")
                images = _as_numpy(b["images"])
                labels = _as_numpy(b["labels"]).reshape(-1)
                if len(labels) == 0:
                    # DALI's PARTIAL policy gives a shard whose files end on a batch boundary an empty batch
                    # (not the learner's doing); the shards are compared under FILL, which gives none
                    continue
                shapes = _expect_jpeg_outputs(images, labels, _as_numpy(b["shapes"]), crop, what)
                samples += _summarise(images, labels, shapes)
                if batches > 2 * len(folder.truth):
                    raise CheckFailed("an epoch ends", f"{what}: more batches than files without the epoch ending",
                                      "read with fn.readers.file(..., name='Reader') and let the iterator end the epoch")
            yield samples, batches

    return pipe, epochs()


def _expect_jpeg_outputs(images, labels, shapes, crop, what) -> np.ndarray:
    """The three outputs, in their order: images (b, 3, crop, crop) float32, one label per image, the
    decoded shape (H, W, C) per image. Returns the shapes as (b, 3)."""
    per_image = shapes.size // max(len(images), 1)
    if images.ndim != 4 or labels.ndim != 1 or len(labels) != len(images) or shapes.size != per_image * len(images) \
            or per_image not in (2, 3):
        raise CheckFailed("the outputs are images, labels, shapes",
                          f"{what}: output shapes {tuple(images.shape)}, {tuple(labels.shape)}, {tuple(shapes.shape)}; "
                          f"expected (b, 3, {crop}, {crop}) images, then b labels, then b shapes (H, W, C)",
                          "return images, labels, shapes, in that order: the images first")
    if images.shape[1:] != (3, crop, crop):
        hint = ("that is HWC: output_layout='CHW'" if images.shape[1:] == (crop, crop, 3)
                else f"random_resized_crop(..., size=(crop, crop)) with crop={crop}")
        raise CheckFailed("images are (B, 3, crop, crop)", f"{what}: crop={crop}, yours {tuple(images.shape)}", hint)
    if images.dtype != np.float32:
        raise CheckFailed("images are float32", f"{what}: yours {images.dtype}", "dtype=types.FLOAT")
    return shapes.reshape(len(labels), per_image)


_ATTEMPTS = 10               # random_resized_crop's default num_attempts, and torchvision's
_RANGE_TOLERANCE = 0.005    # each end of a range, relative: 1.33 for 4/3 passes (0.25% off), 0.081 for 0.08 fails (1.25%)


def _expect_crop_ranges(pipe, what: str, seed: int, *, required: bool = True) -> None:
    """The random crop draws 8-100% of the area at an aspect ratio of 3/4 to 4/3, read from the
    graph (a range a little off shows in no single batch)."""
    ops = _graph(pipe)
    if ops is None:
        return
    wanted = {"random_area": (0.08, 1.0), "random_aspect_ratio": (0.75, 4 / 3)}
    croppers = [op for op in _upstream(pipe, ops, 0, data_only=False)
                if op.kind in ("RandomResizedCrop", "ImageRandomCrop", "RandomCropGenerator")]
    if not croppers and required:      # w6-04 w43_29: a resize and a crop at a random position passed, with no random area
        raise CheckFailed("crops a random window of each image",
                          f"{what}: your pipeline's graph has no operator that draws a random area and aspect ratio "
                          f"(it has {_names(_upstream(pipe, ops, 0, data_only=True))}): a window of one fixed size "
                          f"at a random position is not the contract's 8-100% of the area at 3/4 to 4/3 (seed {seed})",
                          "fn.random_resized_crop(images, size=(crop, crop)) draws both per image (its defaults "
                          "are the contract's ranges), or fn.decoders.image_random_crop then fn.resize")
    for op in croppers:
        attempts = op.args.get("num_attempts", _ATTEMPTS)
        if isinstance(attempts, (int, float)) and attempts < _ATTEMPTS:    # w10-04 w43_26: num_attempts=1 passed
            raise CheckFailed("crops a random window of each image",
                              f"{what}: your {op.kind} gives up after num_attempts={attempts:g} (read from the "
                              f"pipeline's graph): a drawn window that does not fit the image falls back to the whole "
                              f"image, the more often the fewer the attempts: with 1, about one crop in seven (14.9% of "
                              f"2,000 crops of a 250x250 image, against 0.1% with the default {_ATTEMPTS}) (seed {seed})",
                              f"leave num_attempts at its default ({_ATTEMPTS}, torchvision's RandomResizedCrop "
                              "too): each retry costs a few random numbers, not a decode; fewer make the whole, "
                              "uncropped image a common training sample")
        for arg, (lo, hi) in wanted.items():
            value = op.args.get(arg, (lo, hi))
            if isinstance(value, (int, float)):
                value = (value, value)
            try:
                got = tuple(float(v) for v in value)
            except TypeError:
                continue
            if arg == "random_area" and any(v > 1 for v in got):     # w6-04 w43_23: [8, 100] made DALI segfault
                shown = ", ".join(f"{v:g}" for v in got)
                raise CheckFailed("crops a random window of each image",
                                  f"{what}: your {op.kind} asks for random_area=[{shown}] (read from the pipeline's "
                                  f"graph, before running it: DALI crashes the process on an area above 1): the area "
                                  f"is a fraction of the image's, 0 to 1, "
                                  + ("not a percent" if max(got) > 2 else f"and {max(got):g} is above 1: no window "
                                     f"holds more than the whole image")   # w8-04 w43_30: [0.08, 1.005]
                                  + f" (seed {seed})",
                                  "8-100% of the area is random_area=[0.08, 1.0]")
            if len(got) != 2 or abs(got[0] / lo - 1) > _RANGE_TOLERANCE or abs(got[1] / hi - 1) > _RANGE_TOLERANCE:
                shown = ", ".join(f"{v:g}" for v in got)
                raise CheckFailed("crops a random window of each image",
                                  f"{what}: your {op.kind} draws {arg}=[{shown}] (read from the pipeline's graph); the "
                                  f"contract says {lo:g} to {hi:.4g}, each end within {_RANGE_TOLERANCE:.1%} (seed {seed})",
                                  "a random 8-100% of the area (random_area=[0.08, 1.0]) at an aspect ratio of 3/4 to "
                                  "4/3 (random_aspect_ratio=[0.75, 1.333]): fn.random_resized_crop's defaults, "
                                  "torchvision's RandomResizedCrop")


def _expect_imagenet_constants(pipe, what: str, seed: int) -> None:
    """crop_mirror_normalize's mean and std are ImageNet's, times 255, within 0.5%, read from the graph:
    constants rounded a little (std [0.23, 0.22, 0.23]) move every value by a percent or two, which the
    colours of JPEG-decoded files cannot show. Only where one crop_mirror_normalize normalises with
    constants (a normalisation written otherwise is graded on the values alone)."""
    ops = _graph(pipe)
    if ops is None:
        return
    from ..dali_pipelines import IMAGENET_MEAN, IMAGENET_STD
    found = []
    for op in _upstream(pipe, ops, 0, data_only=True):
        if op.kind != "CropMirrorNormalize":
            continue
        try:
            mean, std = (np.broadcast_to(np.asarray(op.args.get(k, d), np.float64).reshape(-1), (3,))
                         for k, d in (("mean", 0.0), ("std", 1.0)))
        except (TypeError, ValueError):
            return
        if np.any(mean != 0) or np.any(std != 1):
            found.append((mean, std))
    if len(found) != 1:
        return
    mean, std = found[0]
    want_mean, want_std = 255 * np.asarray(IMAGENET_MEAN), 255 * np.asarray(IMAGENET_STD)
    if np.abs(mean / want_mean - 1).max() > 5e-3 or np.abs(std / want_std - 1).max() > 5e-3:
        raise CheckFailed("values are normalised with ImageNet's mean and std",
                          f"{what}: your crop_mirror_normalize takes mean=[{', '.join(f'{v:.4g}' for v in mean)}], "
                          f"std=[{', '.join(f'{v:.4g}' for v in std)}] (read from the pipeline's graph); ImageNet's "
                          f"times 255 are [{', '.join(f'{v:.4g}' for v in want_mean)}] and "
                          f"[{', '.join(f'{v:.4g}' for v in want_std)}] (seed {seed})",
                          "use the constants themselves, [255 * m for m in dali_pipelines.IMAGENET_MEAN] and "
                          "[255 * s for s in dali_pipelines.IMAGENET_STD]: rounded ones shift every value by a "
                          "percent or two, on every image")


def _fast_tmp() -> str | None:
    """Memory-backed temporary storage where there is some (thousands of small files are written
    there several times faster than on a disk), else the default temporary folder."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _shift_resultant(first: list, second: list) -> float:
    """How much two epochs' orders remember each other: for every file, its move from one epoch's
    position to the next (on a circle of N positions, since a reader may start an epoch anywhere),
    and the length of the mean of those moves as unit vectors. A new permutation every epoch gives
    about 1/sqrt(N); a shuffle inside a buffer of 1,024 files keeps each file near its last place,
    so the moves bunch together: about 0.2 for 3,000 files."""
    n = len(first)
    where = {key: i for i, key in enumerate(first)}
    moves = np.array([(i - where[key]) % n for i, key in enumerate(second)], np.float64)
    return float(abs(np.exp(2j * np.pi * moves / n).mean()))


def _key(sample: _Sample):
    return (sample.label, sample.h, sample.w)


@exercise("4.3", "The JPEG pipeline: file reader, decoder, random resized crop, normalise", points=2)
@forbids("course_utils.dali_pipelines:jpeg_train_pipeline", "course_utils.dali_pipelines:jpeg_loader")
def check_jpeg_pipeline(jpeg_pipeline):
    _require_dali()
    expect_callable(jpeg_pipeline, "a function jpeg_pipeline(file_root, batch_size, *, crop=224, device='cpu', "
                    "shard_id=0, num_shards=1, num_threads=2, seed=0) that returns a DALI Pipeline")
    rng, seed = fresh_rng()
    with tempfile.TemporaryDirectory(prefix="check-4.3-", dir=_fast_tmp()) as tmp:
        probe = Path(tmp) / "probe"            # one class, one file: enough to construct a pipeline (never built)
        (probe / "only").mkdir(parents=True)
        from PIL import Image
        Image.new("RGB", (32, 32), (90, 120, 150)).save(probe / "only" / "0.jpg")
        probe_pipe = _expect_local_gpu(lambda: jpeg_pipeline(str(probe), 8, crop=32, device="gpu",
                                                             num_threads=_threads(), seed=1),
                                       "jpeg_pipeline(file_root, 8, crop=32, device='gpu', ...)", seed, decoder=True)
        # the ranges before any run (w6-04: random_area=[8, 100] crashed DALI); whether there is a random crop
        # at all, after the outputs' own messages (a resize, a centre crop) have had their say
        # (w7-04: named "with device='gpu'", the probe's device, on a machine without one, for mistakes of any device)
        _expect_crop_ranges(probe_pipe, "jpeg_pipeline(...), before any run", seed, required=False)
        batch_size = int(rng.integers(16, 33))
        (Path(tmp) / "files").mkdir()
        folder = _jpeg_folder(rng, Path(tmp) / "files", batch_size)
        crop = int(rng.choice([40, 48, 64]))
        # the shards run under seed=0, the signature's default (w7-04 43_shard_seed_times: seed * (shard_id + 1)
        # gave both shards pipeline seed 0 there, and passed on a non-zero seed); the whole run under another
        seed_whole, seed_shards = int(rng.integers(1, 2**31 - 1)), 0
        devices = _devices()
        for device in reversed(devices):
            on = "on the GPU (mixed decoder)" if device == "gpu" else "on the CPU"
            pipe, run = _jpeg_run(jpeg_pipeline, folder, batch_size, crop, device, 0, 1, seed_whole, on, seed)
            first, _ = next(run)
            _check_jpeg_epoch(first, folder, on, seed)
        _expect_crop_ranges(pipe, "on the CPU", seed, required=False)
        _expect_imagenet_constants(pipe, "on the CPU", seed)
        _check_crops(first, "on the CPU", seed)
        _expect_crop_ranges(pipe, "on the CPU", seed)
        read = _expect_fair_coin(pipe, "mirrors half of the images", "on the CPU", seed)
        flips = [x.mirrored for x in first if x.clear]
        share = float(np.mean(flips))
        if abs(share - 0.5) > 0.05:
            raise CheckFailed("mirrors half of the images", f"{share:.0%} of {len(flips)} crops came out mirrored "
                              f"(seed {seed})", "crop_mirror_normalize(..., mirror=fn.random.coin_flip(probability=0.5))")
        # the second epoch of the CPU run: every file once more, in a new order of all of them
        second, _ = next(run)
        got = sorted(_key(x) for x in second)
        if got != folder.keys:
            if set(got) <= set(folder.keys) and len(got) == len(folder.keys):
                raise CheckFailed("every epoch is whole, not only the first",
                                  f"on the CPU, epoch 2 brought {len(set(folder.keys) - set(got))} files twice and "
                                  f"missed as many (seed {seed})", "pad_last_batch=True: without it the reader fills "
                                  "an epoch's short last batch with the next epoch's first files, which the iterator "
                                  "throws away, so the next epoch misses them (and shards overlap)")
            _explain_mismatch(got, folder.keys, folder.label_of, "on the CPU, epoch 2", seed)
        n = len(folder.truth)
        shift = _shift_resultant([_key(x) for x in first], [_key(x) for x in second])
        if shift > _SHUFFLE_BAR:
            given = {k: v for op in (_graph(pipe) or []) if op.source for k, v in op.args.items()}
            also = (" stick_to_shard=True, also given here, would keep each rank on one slice for ever besides: "
                    "leave it False." if given.get("stick_to_shard") else "")
            raise CheckFailed("shuffles all the files every epoch",
                              f"from epoch 1 to epoch 2 of {n} files, each file stayed near its place (the moves' "
                              f"resultant is {shift:.2f}; a new permutation of all files gives about "
                              f"{1 / n ** 0.5:.2f}) (seed {seed})",
                              "random_shuffle=True shuffles the files once, with a fixed seed, then only inside a "
                              "buffer of initial_fill (1,024) samples: batches come from a window that moves through "
                              "the same order every epoch. Ask the reader for a new permutation of every file each "
                              "epoch" + ("." + also if also else ""))
        # two processes of a DDP job: the same seed, shards 0 and 1, DALI's FILL policy (what a training loop runs)
        shards, pipes = [], []
        for s in range(2):
            shard_pipe, shard_run = _jpeg_run(jpeg_pipeline, folder, batch_size, crop, "cpu", s, 2, seed_shards,
                                              f"shard {s} of 2", seed, fill=True)
            pipes.append(shard_pipe)
            shards.append([next(shard_run) for _ in range(2 - s)])
        _check_shards(shards, pipes, folder, batch_size, [_key(x) for x in first], seed, whole=first)
        _expect_thread_counts(lambda k: _expect_pipeline(jpeg_pipeline(str(probe), 8, crop=32, device="cpu",
                                                                       num_threads=k, seed=1), "jpeg_pipeline(...)"),
                              "jpeg_pipeline(file_root, 8, crop=32, device='cpu', num_threads={k}, seed=1)", seed)
    where = " and on the GPU" if "gpu" in devices else ""
    return (f"{n} JPEGs in {len(folder.label_of)} class folders, two epochs on the CPU{where}: decoded sizes, labels "
            f"(sorted folders), random {crop}x{crop} crops (8-100% of the area, aspect 3/4-4/3), normalised values, "
            f"{share:.0%} mirrored ({_coin_words(read)}), a new order of all files each epoch, following the "
            "seed; two shards given the same seed split an epoch into the same number of full batches (DALI's FILL "
            f"policy), draw their own augmentation, and move on; num_threads={_threads()}, 1 and "
            f"{_other_thread_counts()[1]} as given; with device='gpu', read from its graph without "
            f"building it: GPU {_LOCAL_RANK} in a process whose LOCAL_RANK is {_LOCAL_RANK} (its current device "
            f"still 0), decoding (mixed) and "
            "augmenting on that GPU.")


def _check_jpeg_epoch(samples, folder, on, seed):
    """One epoch: every file once, shuffled, normalised, each image its file's colour."""
    mean = np.array(dali_mean(), np.float32) * 255
    std = np.array(dali_std(), np.float32) * 255
    lo, hi = (0 - mean) / std, (255 - mean) / std
    got = sorted(_key(x) for x in samples)
    if got != folder.keys:
        _explain_mismatch(got, folder.keys, folder.label_of, on, seed)
    files = [(x.label, folder.number[_key(x)]) for x in samples]
    if files == sorted(files):
        raise CheckFailed("shuffles the files", f"{on}: the epoch read the {len(files)} files in folder order "
                          f"(seed {seed})", "the reader shuffles when asked to (see its shuffling arguments)")
    for x in samples:
        if x.low < lo.min() - 0.05 or x.high > hi.max() + 0.05:
            raise CheckFailed("values are normalised", f"{on}: values from {x.low:.2f} to {x.high:.2f}; "
                              f"normalised uint8 pixels lie in [{lo.min():.2f}, {hi.max():.2f}]",
                              "crop_mirror_normalize with mean and std in 0..255 units: "
                              "[255*m for m in IMAGENET_MEAN], [255*s for s in IMAGENET_STD]")
        rgb = folder.truth[_key(x)]
        expected = (rgb[1:] - mean[1:]) / std[1:]
        if np.abs(x.means[1:] - expected).max() > 0.15:       # green and blue: one colour per file
            hint = "normalise as (x - 255*mean) / (255*std) per channel, RGB order, with IMAGENET_MEAN and IMAGENET_STD"
            pixels = x.means * std + mean       # back to 0..255, as if normalised right
            cifar_mean = np.array(data.CIFAR10_MEAN, np.float32) * 255
            cifar_std = np.array(data.CIFAR10_STD, np.float32) * 255
            as_cifar = x.means * cifar_std + cifar_mean
            if abs(pixels[0] - rgb[2]) <= 8 and abs(pixels[1] - rgb[1]) <= 8:
                hint = "the channels are in BGR order: decode with output_type=types.RGB"
            elif abs(as_cifar[1] - rgb[1]) <= 4 and abs(as_cifar[2] - rgb[2]) <= 4:
                hint = ("those are CIFAR-10's mean and std: this is an ImageNet-style folder, normalise with "
                        "dali_pipelines.IMAGENET_MEAN and IMAGENET_STD (times 255)")
            shown = ", ".join(f"{v:.2f}" for v in x.means[1:])
            wanted = ", ".join(f"{v:.2f}" for v in expected)
            raise CheckFailed("each image is its file's colour, normalised",
                              f"{on}: an image of green {int(rgb[1])} and blue {int(rgb[2])} came out with green and "
                              f"blue means [{shown}], expected [{wanted}] (seed {seed})", hint)


def _check_shards(shards, pipes, folder, batch_size, whole_order, seed, *, whole=None):
    """Two shards of a DDP job under DALI's FILL policy, given the same seed: the first epoch split
    between them (each its slice of one permutation of all files), in the same number of batches;
    each its own augmentation; new files for shard 0 in its second epoch, and not by rotating
    through fixed slices; the order follows the seed (`whole_order`: the unsharded run's first epoch,
    made with another seed)."""
    keys, n = folder.keys, len(folder.truth)
    parts = [set(_key(x) for x in shards[s][0][0]) for s in range(2)]
    sizes = [n // 2, n - n // 2]
    metas = []
    for p in pipes:
        try:
            metas.append(p.reader_meta("Reader"))
        except Exception:
            metas.append({})
    told = [m.get("number_of_shards") for m in metas]
    if any(t == 1 for t in told):
        raise CheckFailed("shard_id and num_shards split the files",
                          f"shards 0 and 1 of 2: your readers were told num_shards={told[0]} and {told[1]} (DALI's "
                          f"reader_meta), and read {len(parts[0])} and {len(parts[1])} of {n} files (seed {seed})",
                          "pass shard_id and num_shards to fn.readers.file rather than splitting the file list "
                          "yourself: DALI's reader and iterator then know the shards, pad each to the same number "
                          "of batches and move them on every epoch")
    if parts[0] & parts[1] or parts[0] | parts[1] != set(keys):
        shared = len(parts[0] & parts[1])
        detail = (f"shards 0 and 1 of 2 read {len(parts[0])} and {len(parts[1])} distinct files of {n}, sharing "
                  f"{shared} (seed {seed})")
        if "pad_last_batch" in metas[0] and not metas[0]["pad_last_batch"]:
            raise CheckFailed("every epoch is whole, not only the first", detail,
                              "pad_last_batch=True: without it the reader fills a shard's short last batch with the "
                              "next epoch's first files, so the shards overlap and the next epoch misses them")
        if [len(p) for p in parts] == sizes:
            raise CheckFailed("shard_id and num_shards split the files", detail + ": each read its share, but of "
                              "different permutations", "the shards cut different permutations: the shuffle's seed "
                              "must be the same in every process (shuffle_after_epoch_seed=seed, not one derived "
                              "from shard_id)")
        raise CheckFailed("shard_id and num_shards split the files", detail,
                          "pass shard_id and num_shards to fn.readers.file")
    counts = [shards[s][0][1] for s in range(2)]
    if counts[0] != counts[1]:
        raise CheckFailed("every shard gives the same number of batches",
                          f"shard 0 of 2 ({len(parts[0])} files) gave {counts[0]} batches of {batch_size}, "
                          f"shard 1 ({len(parts[1])} files) {counts[1]}, through DALI's iterator with FILL (seed "
                          f"{seed}). Under DistributedDataParallel the rank with the extra batch waits in an "
                          "all-reduce that the other never joins: a hang",
                          "pad_last_batch=True pads every shard to the same number of batches")
    if parts[0] == set(whole_order[:sizes[0]]):
        raise CheckFailed("the order follows the seed",
                          f"two runs given different seeds read the files in the same order (shard 0 of 2 read exactly "
                          f"the first {sizes[0]} files of the other run's epoch) (seed {seed})",
                          "shuffle_after_epoch_seed=seed (DALI 2.4): without it DALI draws every run's permutations "
                          "from one fixed seed, whatever `seed` the caller gives")
    flips = [(a.mirrored, b.mirrored) for a, b in zip(shards[0][0][0], shards[1][0][0]) if a.clear and b.clear]
    if len(flips) >= 64 and all(a == b for a, b in flips):
        raise CheckFailed("each shard draws its own augmentation",
                          f"shards 0 and 1, both given seed=0 (the default), mirrored the j-th sample of their epoch "
                          f"alike, all {len(flips)} of them: every rank of a DDP job would draw the same crops and flips "
                          f"(seed {seed})",
                          "derive the pipeline's seed from seed and shard_id (seed + shard_id, which differs on every "
                          "shard whatever the seed; seed * (shard_id + 1) is 0 on all of them at seed=0); the reader's "
                          "shuffle_after_epoch_seed stays `seed`, the same in every process")
    # shard 0 of the whole run (another seed) beside shard 0 here: an augmentation seed of shard_id alone
    # draws the same flips in both (w2-04 w43_21)
    flips = [(a.mirrored, b.mirrored) for a, b in zip(whole or [], shards[0][0][0]) if a.clear and b.clear]
    if len(flips) >= 64 and all(a == b for a, b in flips):
        raise CheckFailed("each shard's augmentation follows the seed",
                          f"shard 0 given two different seeds mirrored the j-th sample of its epoch alike, all "
                          f"{len(flips)} of them: the pipeline's seed ignores `seed` (seed {seed})",
                          "derive the pipeline's seed from seed AND shard_id (seed + shard_id): another seed, "
                          "another augmentation")
    again = set(_key(x) for x in shards[0][1][0])
    if again == parts[0]:
        raise CheckFailed("every shard reads new files each epoch",
                          f"shard 0 of 2 read the same {len(parts[0])} files in epochs 1 and 2 (seed {seed})",
                          "stick_to_shard=True keeps a rank on one slice of the data for ever; a new permutation of "
                          "all files each epoch gives every rank new files")
    if again == parts[1]:
        raise CheckFailed("every epoch is a new permutation of all files",
                          f"shard 0 of 2 read in epoch 2 exactly the {len(again)} files shard 1 read in epoch 1, and "
                          f"none of its own (seed {seed})",
                          "the reader moved on to the next slice of one fixed order (what random_shuffle does, "
                          "whatever its initial_fill): the ranks take turns at the same halves, and no epoch mixes "
                          "them. shuffle_after_epoch=True draws a new permutation of all files each epoch")


def _check_crops(samples, on, seed):
    """The crops are random windows: not the whole image every time, not the centre every time."""
    span = np.array([s.right - s.left for s in samples])
    centre = np.array([(s.right + s.left) / 2 for s in samples])
    whole = float(np.mean(span > 0.9))
    if whole > 0.6:
        raise CheckFailed("crops a random window of each image",
                          f"{on}: {whole:.0%} of the {len(samples)} crops show the whole width of their file; a random "
                          f"resized crop of 8-100% of the area shows it in about one crop in eight (seed {seed})",
                          "a resize decides the crop's content before any random window: fn.resize to crop x crop "
                          "squeezes the whole image into it, and a resize of the shorter side to crop (then a crop at "
                          "a random position) keeps the whole shorter side in every crop. Pick a random window of "
                          "8-100% of the area first, then resize it (fn.random_resized_crop does both)")
    if float(np.std(centre)) < 0.05:
        raise CheckFailed("crops a random window of each image",
                          f"{on}: every crop is centred on its file (seed {seed})",
                          "a centre crop is for evaluation: for training, a random window (fn.random_resized_crop)")


def _explain_mismatch(got, keys, label_of, on, seed):
    if len(got) != len(keys):
        raise CheckFailed("one epoch reads every file once", f"{on}: {len(got)} samples for {len(keys)} files (seed {seed})",
                          "read with fn.readers.file(file_root=..., name='Reader'); the iterator stops after one epoch")
    known = set(keys)
    if all(k in known for k in got):
        twice = sum(1 for c in Counter(got).values() if c > 1)
        raise CheckFailed("one epoch reads every file once", f"{on}: {twice} files came twice and "
                          f"{len(known - set(got))} never (seed {seed})",
                          "let the reader define the epoch: fn.readers.file(..., name='Reader') and the iterator's "
                          "reader_name")
    if sorted((h, w) for _, h, w in got) != sorted((h, w) for _, h, w in keys):
        raise CheckFailed("the third output is the decoded size", f"{on}: the (height, width) values are not the files' "
                          f"sizes (seed {seed})", "images.shape() right after fn.decoders.image, before any crop; "
                          "a cropping decoder (fn.decoders.image_random_crop) crops as it decodes, so its shape() "
                          "is the crop's: take fn.peek_image_shape(jpegs) of the encoded files there; "
                          "DALI shapes are (H, W, C)")
    raise CheckFailed("labels are the class folders' indices", f"{on}: the labels do not match the folders "
                      f"{sorted(label_of)} numbered 0.. in sorted order (seed {seed})",
                      "use the labels fn.readers.file returns with the files")
