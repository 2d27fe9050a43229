"""Check 5.5 (lesson 05): a training step captured as a CUDA graph, graded as a GPU would grade it.

Without a GPU the learner's code runs on the course's virtual CUDA device for training steps
(`virtual_cuda_training`): tensors say they live on "cuda", a host tensor mixed into the step fails
as on a GPU, and every wait of the host for the device is logged. torch.cuda's graph API is emulated
(`course_utils.graph_capture`, whose `RULES` list each rule beside what a GPU does): a capture
records the step's operations on the memory they used and runs none of them, a host read while
capturing raises CUDA's error, a non-capturable optimizer refuses, a replay re-runs the recorded
operations on that memory and nothing else. So the learner's code, written for a GPU, is held to a
GPU's rules. On a GPU it also runs for real.

`grade_scenario` runs one scenario on one device and returns the verdict: the check runs it four
times, and tests/unit/graph_step_cases.py (the right and wrong answers, as data) runs it on the CPU
and, on a GPU, through the real torch.cuda.graph.
"""
from __future__ import annotations

import contextlib
import copy
import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..graph_capture import CAPTURE_ERROR, OTHER_DEVICE_STREAM, OTHER_STREAM
from ..syncs import SyncCounter
from ._core import CheckFailed, exercise, expect_callable, trusted
from ._util import forbids, fresh_rng, one_thread, single_threaded
from .virtual_cuda_training import NUMPY_ERROR, VirtualCudaTraining

__all__ = ["grade_scenario", "Verdict", "OPTIMIZERS"]

_COURSE_CODE = ["course_utils.train:_GraphedStep.__init__", "course_utils.train:_GraphedStep.__call__",
                "course_utils.train:train"]
OPTIMIZERS = ("sgd", "adam", "adam-not-capturable")


class _Net(nn.Module):
    """A small CNN with batch norm (running statistics: state a step writes besides the weights)."""

    def __init__(self, width: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width),
                                  nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.body(x)


def _optimizer(kind, model, lr):
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    return torch.optim.Adam(model.parameters(), lr=lr / 20, weight_decay=5e-4, capturable=kind == "adam")


def _eager(model, optimizer, images, labels):
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _state(model, optimizer):
    tensors = [t.detach().clone() for t in list(model.parameters()) + list(model.buffers())]
    for p in model.parameters():
        for value in optimizer.state.get(p, {}).values():
            if isinstance(value, torch.Tensor):
                tensors.append(value.detach().clone().double())
    return tensors


def _same(a, b, tol):
    return len(a) == len(b) and all(
        x.shape == y.shape and trusted.torch_allclose(x.double().cpu(), y.double().cpu(), atol=tol, rtol=tol)
        for x, y in zip(a, b))


def _chain(exc: BaseException) -> str:
    """The message of an exception and of those it happened during (a GPU's capture_end reports its own
    error over the first one)."""
    texts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(texts)


@dataclass
class Verdict:
    """What one scenario concluded: "pass", "fail" (with the property), or "error" (the learner's code raised)."""
    status: str
    prop: str
    message: str


@dataclass
class _Run:
    """One scenario's state, for the verdicts after the steps."""
    what: str
    step: object
    yours: nn.Module
    opt: torch.optim.Optimizer
    watch: "_Watch"
    warmup: int
    steps: int
    made: int
    steps_after_capture: int
    batches: list
    refused: list
    example: tuple
    example_before: list
    losses: list
    waits: list
    ref_losses: list
    ref_state: list
    ref_warm: list
    tol: float
    races: list
    spare: object = None           # a copy of the model as it was handed over (to replay a warm-up that went wrong)
    optimizer: str = "sgd"
    lr: float = 0.0
    races_in_make: int = 0         # of `races`, those logged inside make_graphed_step (its warm-up's)


class _Watch:
    """What happened around the capture: the model's calls, the optimizer's steps, gradients and state
    at the moment the capture began, make_graphed_callables used."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer
        self.optimizer_steps = 0
        self.captures: list[dict] = []
        self.graphed_callables = 0
        optimizer.register_step_post_hook(lambda *_: self._stepped())

    def _stepped(self):
        self.optimizer_steps += 1

    def capture_began(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        with torch.no_grad():
            weights = [p.detach().clone() for p in self.model.parameters()]
        self.captures.append({
            "calls": self.model.calls, "optimizer_steps": self.optimizer_steps,
            "stale_grads": sum(p.grad is not None for p in params),
            "no_state": sum(not self.optimizer.state.get(p) for p in params), "weights": weights})

    @contextlib.contextmanager
    def spying(self):
        """torch.cuda.make_graphed_callables, counted (the real one, or the emulation's)."""
        original = torch.cuda.make_graphed_callables
        watch = self

        def counted(*args, **kwargs):
            watch.graphed_callables += 1
            return original(*args, **kwargs)
        torch.cuda.make_graphed_callables = counted
        try:
            yield
        finally:
            torch.cuda.make_graphed_callables = original


@contextlib.contextmanager
def _waits_on_events(counter: SyncCounter):
    """On a GPU: event.synchronize(), event.elapsed_time() and stream.synchronize() make the host wait
    too (SyncCounter and CUDA's sync debug mode see neither)."""
    patched = []
    for cls, names in ((torch.cuda.Event, ("synchronize", "elapsed_time")),     # query() polls: no wait
                       (torch.cuda.Stream, ("synchronize",))):
        for name in names:
            original = getattr(cls, name)

            def counted(self, *args, _original=original, _name=f"{cls.__name__.lower()}.{name}", **kwargs):
                counter._record(_name)
                return _original(self, *args, **kwargs)
            setattr(cls, name, counted)
            patched.append((cls, name, original))
    try:
        yield
    finally:
        for cls, name, original in patched:
            setattr(cls, name, original)


class _RealCapture:
    """On a GPU: torch.cuda.graph's capture_begin, watched (the moment each capture begins)."""

    def __init__(self, watch: _Watch):
        self.watch = watch

    def __enter__(self):
        cls, watch = torch.cuda.CUDAGraph, self.watch
        self._original = cls.capture_begin

        def capture_begin(graph, *args, **kwargs):
            watch.capture_began()
            return self._original(graph, *args, **kwargs)
        cls.capture_begin = capture_begin
        return self

    def __exit__(self, *exc):
        torch.cuda.CUDAGraph.capture_begin = self._original


def _shape(rng) -> tuple[int, int]:
    """A batch size and an image side for the scenarios of one check (the same in each: a graph kept from
    an earlier call would fit them)."""
    return int(rng.integers(9, 30)), int(rng.choice([12, 16]))


def _scenario(make_graphed_step, rng, device, *, optimizer: str, use_default_warmup: bool, shape=None,
              call_again: bool = True):
    emulate = device.type != "cuda"
    dtype = torch.float32                         # the GPU's and the emulation's: float32 batches and weights
    batch, side = shape or _shape(rng)
    width = int(rng.integers(4, 9))
    warmup = 3 if use_default_warmup else int(rng.choice([2, 4, 5]))
    steps = int(rng.integers(4, 7))
    lr = float(rng.uniform(0.02, 0.1))
    torch.manual_seed(int(rng.integers(1 << 30)))
    reference = _Net(width).to(dtype)
    yours = copy.deepcopy(reference)
    spare = copy.deepcopy(reference)

    def draw(n, size=side):
        return (torch.from_numpy(rng.standard_normal((n, 3, size, size))).to(dtype),
                torch.from_numpy(rng.integers(0, 10, n)))
    example = draw(batch)
    batches = [draw(batch) for _ in range(steps)]
    shorter, longer = int(rng.integers(2, batch)), batch + int(rng.integers(1, 5))
    full, single = draw(batch), draw(1)
    # on every seed: other shapes copy_ refuses, and the two it broadcasts without a word (1 sample, 1 label)
    refused = [("a last batch of {} samples".format(shorter), draw(shorter)),
               (f"a batch of {longer} samples", draw(longer)),
               (f"a batch of {batch} images of {side + 4}x{side + 4} pixels (the graph's are {side}x{side})",
                draw(batch, side + 4)),
               ("a batch of 1 sample (copy_ broadcasts it into every row of the captured buffers)", single),
               (f"{batch} images with 1 label (copy_ broadcasts the label to every row)", (full[0], single[1])),
               # as many values as the graph's batch, in another shape: a numel() comparison lets it through (w3-05)
               (f"a batch of {batch} images laid out channels last, ({batch}, {side}, {side}, 3): as many values as "
                f"the graph's ({batch}, 3, {side}, {side}), another shape", (full[0].permute(0, 2, 3, 1).contiguous(),
                                                                             full[1])),
               # the labels too (walk w8-05: labels compared by numel() and reshaped with view_as passed)
               (f"{batch} labels laid out as a column, ({batch}, 1): as many values as the graph's ({batch},), "
                "another shape", (full[0], full[1].reshape(batch, 1)))]
    optimizer_name = {"sgd": "SGD (Nesterov momentum, weight decay)", "adam": "Adam(capturable=True)",
                      "adam-not-capturable": "Adam (not capturable)"}[optimizer]
    what = (f"a small CNN with batch norm, batch {batch} of {side}x{side} images, {optimizer_name}, "
            f"warmup={'its default' if use_default_warmup else warmup}, then {steps} batches, on "
            f"{'the virtual CUDA device cuda:1' if emulate else device}")
    tol = 1e-6 if emulate else 1e-4             # the CPU replays the very operations of the eager reference

    # the virtual device is cuda:1 (and the current device): a "cuda:0" written into the code is another GPU
    vc = VirtualCudaTraining(index=1) if emulate else None
    with vc or contextlib.nullcontext():
        if emulate:
            for t in [*example, *(t for b in batches for t in b), *(t for _, b in refused for t in b)]:
                vc.put(t)
            vc.put_module(reference)
            vc.put_module(yours)
            vc.put_module(spare)
        else:
            reference.to(device), yours.to(device), spare.to(device)
            example = tuple(t.to(device) for t in example)
            batches = [tuple(t.to(device) for t in b) for b in batches]
            refused = [(w, tuple(t.to(device) for t in b)) for w, b in refused]
        quiet = vc.quiet if emulate else contextlib.nullcontext

        # the reference: ordinary steps, the same optimizer (capturable Adam's arithmetic included)
        ref_opt = _optimizer("adam" if optimizer != "sgd" else "sgd", reference, lr)
        with quiet():
            for _ in range(warmup):
                _eager(reference, ref_opt, *example)
            ref_warm = [p.detach().clone() for p in reference.parameters()]
            ref_losses = [float(_eager(reference, ref_opt, *b)) for b in batches]
            ref_state = _state(reference, ref_opt)

        opt = _optimizer(optimizer, yours, lr)
        watch = _Watch(yours, opt)
        if emulate:
            def began(event, graph):
                if event == "begin":
                    with vc.graphs.unrecorded():
                        watch.capture_began()
            vc.graphs.listeners.append(began)
        kwargs = {} if use_default_warmup else {"warmup": warmup}
        if emulate:
            # The caller's stream has just written the example batch (a copy in from the host, say) and the
            # weights, and the host has not waited for it: a warm-up on a side stream that does not wait for
            # the caller's stream first reads them half-written on a GPU, and the emulation logs that race (w5-05)
            with quiet(), torch.no_grad():
                example = tuple(t.clone() for t in example)
                for p in yours.parameters():
                    p.mul_(1)
        example_before = [t.clone() for t in example]
        settings = _cudnn_settings()
        with watch.spying(), (contextlib.nullcontext() if emulate else _RealCapture(watch)):
            try:
                step = make_graphed_step(yours, opt, *example, **kwargs)
            except (RuntimeError, TypeError) as exc:
                _explain_capture_failure(exc, what)
                raise
            finally:
                changed = _restore_cudnn(settings)
        races_in_make = len(vc.graphs.races) if emulate else 0
        if changed:
            raise CheckFailed("leaves the caller's global settings alone",
                              f"{what}: make_graphed_step changed {', '.join(changed)}",
                              "a switch such as torch.backends.cudnn.benchmark is the caller's, for its whole "
                              "program; and turned on between the warm-up and the capture it makes the capture the "
                              "first pass that tunes, which is what the warm-up is for. Set it (if at all) before "
                              "the warm-up, outside make_graphed_step")
        if watch.graphed_callables:
            raise CheckFailed("captures the whole step as one graph",
                              f"{what}: make_graphed_step used torch.cuda.make_graphed_callables, which graphs the "
                              "forward and backward passes only: the optimizer step stays eager, a few launches per "
                              "parameter every step, and its own warm-up passes update batch norm's statistics",
                              "make_graphed_callables is the tool when part of a step cannot be captured; here the "
                              "whole step can: capture forward, loss, backward and optimizer.step() inside one "
                              "`with torch.cuda.graph(graph):`")
        if not callable(step):
            raise CheckFailed("returns step(images, labels)", f"{what}: make_graphed_step returned "
                              f"{type(step).__name__}")
        made = yours.calls
        captures = watch.captures
        _one_capture(what, made, captures, warmup, watch)
        steps_after_capture = watch.optimizer_steps

        losses, waits = [], []
        for number, (images, labels) in enumerate(batches):
            with quiet():
                given = (images.clone(), labels.clone())
            if emulate:
                before = len(vc.syncs)
                losses.append(step(*given))
                waits.extend(vc.syncs[before:])
            else:
                with SyncCounter() as counter, _waits_on_events(counter):
                    losses.append(step(*given))
                waits.extend(f"{name} at {where}" for name, where in zip(counter.calls, counter.where))
                # What CUDA's sync debug mode flags beyond the calls named above. The first replay after a
                # capture was flagged once for the course's own answer on an H200 (2026-11-27), with no call
                # of the step's code: a one-off of the first replay, not a wait per step, so it is not held
                # against the step; from the second call on every flagged wait counts.
                extra = max(0, counter.cuda_warnings - len(counter.calls))
                flagged = counter.cuda_warned[len(counter.cuda_warned) - extra:] if extra else []
                if number > 0 or counter.calls:
                    waits.extend(f"a synchronising operation flagged by CUDA: {w}" for w in flagged)
        races = list(vc.graphs.races) if emulate else []
        run = _Run(what, step, yours, opt, watch, warmup, steps, made, steps_after_capture, batches, refused,
                   example, example_before, losses, waits, ref_losses, ref_state, ref_warm, tol, races,
                   spare, optimizer, lr, races_in_make)
        losses = None       # the run holds them: _after_steps drops them to see what the step itself keeps
        with quiet():
            _after_steps(run, emulate, vc)
        # a second call with the very model and optimizer, a new example batch of the same shape: a step kept
        # from the first call (a cache keyed by id(model), id(optimizer) or the shape) returns without a capture
        if not call_again:
            return steps, warmup
        again = (draw(batch), draw(batch))
        if emulate:
            for t in (*again[0], *again[1]):
                vc.put(t)
        else:
            again = tuple(tuple(t.to(device) for t in b) for b in again)
        _second_call(run, make_graphed_step, reference, ref_opt, *again, emulate, quiet)
        return steps, warmup


def _second_call(s: _Run, make_graphed_step, reference, ref_opt, example, batch, emulate, quiet):
    """make_graphed_step called again with the same model and optimizer (trained by the first call's steps),
    a new example batch of the same shape, then one step: it warms up and captures anew, and trains as ordinary
    steps do (walk w9-05: a step cached by (id(model), id(optimizer)) passed every scenario)."""
    warmup = 2
    what = (f"{s.what}; then a second call of make_graphed_step with the same model and optimizer, a new example "
            f"batch of the same shape and warmup={warmup}, and one step")
    with quiet():
        for _ in range(warmup):
            _eager(reference, ref_opt, *example)
        ref_loss = float(_eager(reference, ref_opt, *batch))
        ref_state = _state(reference, ref_opt)
    yours, watch = s.yours, s.watch
    calls, captures = yours.calls, len(watch.captures)
    with watch.spying(), (contextlib.nullcontext() if emulate else _RealCapture(watch)):
        step = make_graphed_step(yours, s.opt, *(t.clone() for t in example), warmup=warmup)
    kept = ("returned the very step function the first call returned" if step is s.step else
            f"captured no graph (the model ran {yours.calls - calls} times)" if len(watch.captures) == captures
            else "")
    if kept:
        raise CheckFailed("captures a graph of the model it is given, in every call",
                          f"{what}: the second call {kept}: state kept between calls (a cache or a global keyed "
                          "by the model, the optimizer or the shape) hands back the graph of the earlier call, "
                          "which skips the warm-up steps on the new example batch and replays the first call's "
                          "inputs",
                          "keep nothing from one call to the next (no module-level dict, no attribute on the "
                          "model): each call warms up `warmup` steps on the example it is handed, captures, and "
                          "returns a new step")
    loss = step(*(t.clone() for t in batch))
    with quiet():
        value = float(loss.detach().double().cpu()) if isinstance(loss, torch.Tensor) else float("nan")
        if not (math.isclose(value, ref_loss, rel_tol=s.tol, abs_tol=s.tol) and _same(_state(yours, s.opt),
                                                                                       ref_state, s.tol)):
            raise CheckFailed("captures a graph of the model it is given, in every call",
                              f"{what}: the second call's step trained otherwise than ordinary steps (loss "
                              f"{value:.5f} vs {ref_loss:.5f}, then the weights, optimizer state or batch-norm "
                              "statistics compared), while the first call's steps trained as they do: state kept "
                              "between calls (from the earlier call) changed what the second call captured",
                              "keep nothing from one call to the next: each call warms up `warmup` steps on the "
                              "example it is handed, captures on inputs of its own, and returns a new step")


def _cudnn_settings() -> dict:
    return {name: getattr(torch.backends.cudnn, name) for name in ("benchmark", "deterministic", "enabled")}


def _restore_cudnn(settings: dict) -> list[str]:
    """Put cuDNN's switches back; the names of those the learner's code changed (walk w4-05)."""
    changed = []
    for name, value in settings.items():
        now = getattr(torch.backends.cudnn, name)
        if now != value:
            changed.append(f"torch.backends.cudnn.{name} from {value} to {now}")
            setattr(torch.backends.cudnn, name, value)
    return changed


def _one_capture(what, made, captures, warmup, watch) -> None:
    """make_graphed_step warmed up `warmup` steps on the model it was given, then captured once."""
    if not captures and made == 0 and watch.optimizer_steps == 0:
        raise CheckFailed("captures a graph of the model it is given, in every call",
                          f"{what}: make_graphed_step neither ran this model nor captured a graph, and the step it "
                          "returned replays a graph from an earlier call (a cache or a global): that graph trains "
                          "the earlier call's model, with its optimizer",
                          "keep nothing between calls: each call warms up, captures and returns a step for the "
                          "model and optimizer it is handed")
    if not captures:
        raise CheckFailed("warms up `warmup` ordinary steps, then captures one",
                          f"{what}: make_graphed_step captured no graph (the model ran {made} times, all outside "
                          "a capture)",
                          "capture the step inside `with torch.cuda.graph(graph):`")
    if len(captures) > 1:
        raise CheckFailed("warms up `warmup` ordinary steps, then captures one",
                          f"{what}: make_graphed_step captured {len(captures)} graphs; the contract is one capture "
                          "of the whole step (a throwaway first graph, for its memory pool or as a test, is one "
                          "more)",
                          "capture once, with `with torch.cuda.graph(graph):` around forward, loss, backward and "
                          "optimizer.step(); torch.cuda.graph_pool_handle() gives a pool without a capture")
    before, during = captures[0]["calls"], made - captures[0]["calls"]
    if before == 0 and during > 1:
        raise CheckFailed("captures after the warm-up",
                          f"{what}: the capture began before any warm-up step (the model ran 0 times before it and "
                          f"{during} times from it on)",
                          "the warm-up creates the optimizer's state (momentum, Adam's moments) the graph must "
                          "capture: a graph captured first records a first step, and replays it forever. Warm up "
                          "first, then capture")
    if before != warmup:
        raise CheckFailed("warms up `warmup` ordinary steps, then captures one",
                          f"{what}: the model ran {before} times before the capture; expected the {warmup} warm-up "
                          f"steps that warmup={warmup} asks for",
                          "run exactly `warmup` ordinary steps (for _ in range(warmup)) on the example batch before "
                          "the capture: they are training steps the caller counts on")
    if during != 1:
        raise CheckFailed("warms up `warmup` ordinary steps, then captures one",
                          f"{what}: the model ran {during} times from the capture on, inside make_graphed_step; "
                          "expected once, inside the capture",
                          "after the warm-up, one forward pass inside `with torch.cuda.graph(graph):`, and no "
                          "other before step() is called")


def _after_steps(s: _Run, emulate, vc):
    """The verdicts on the steps themselves (kept apart to keep the scenario readable)."""
    what, steps, yours, made, watch = s.what, s.steps, s.yours, s.made, s.watch
    losses, waits, tol = s.losses, s.waits, s.tol
    if s.races:
        first = s.races[0]
        raise CheckFailed("orders its streams: no race with the caller's stream",
                          f"{what}: {len(s.races)} use(s) of memory by one stream before it waited for another "
                          f"stream's work on it; the first: {first}"
                          + (", inside make_graphed_step, before the capture" if s.races_in_make else ""),
                          "on a GPU a stream made by torch.cuda.Stream() runs concurrently with the caller's: "
                          + ("the warm-up read the example batch and the weights while the caller's stream could "
                             "still be writing them. Make the side stream wait for the caller's before the warm-up, "
                             "side.wait_stream(torch.cuda.current_stream()), and the caller's wait for it after"
                             if s.races_in_make else
                             "the replay could read a half-copied batch, and the caller a loss the replay has not "
                             "written yet. Replay on the caller's stream (graph.replay() outside any `with "
                             "torch.cuda.stream(...)`), or make the side stream wait for the current one before the "
                             "replay and the current one wait for it after (wait_stream)"))
    if waits:
        shown = [f"{w.what} at {_short(w.where)}" if hasattr(w, "what") else str(w) for w in waits]
        raise CheckFailed("returns without waiting for the device",
                          f"{what}: {steps} calls of step() made the host wait {len(waits)} time(s): "
                          f"{'; '.join(dict.fromkeys(shown))}",
                          "a replay is one launch, and the host should go on to the next batch while the device "
                          "runs it: return the loss as a tensor (static_loss.detach().clone()) and read it when "
                          "you log, once per interval. float(loss), .item(), an `if` on a tensor (an isfinite "
                          "guard), print(loss) or torch.cuda.synchronize() after replay() each stop the host "
                          "until the device is done (check 5.4 refuses the same habits)")
    if yours.calls != made:
        raise CheckFailed("replays the graph: no Python model call per step",
                          f"{what}: step() ran the model {yours.calls - made} times in Python for {steps} batches",
                          "copy the batch into the captured input tensors and call graph.replay(): the graph holds "
                          "the whole step")
    if watch.optimizer_steps != s.steps_after_capture:
        raise CheckFailed("replays the whole step: no optimizer.step() in Python per call",
                          f"{what}: {watch.optimizer_steps - s.steps_after_capture} optimizer steps ran in "
                          f"Python during {steps} calls of step()",
                          "capture optimizer.step() inside the graph with the forward and backward passes: the "
                          "replay updates the weights")
    if emulate:
        replays = sum(g.replays for g in vc.graphs.graphs)
        if replays != steps:
            raise CheckFailed("one replay per step", f"{what}: {replays} replays for {steps} calls of step()",
                              "each call of step() trains on its batch exactly once: one graph.replay()")
    values, attached = [], None
    for i, loss in enumerate(losses):
        if not isinstance(loss, torch.Tensor):
            raise CheckFailed("returns each step's loss as a tensor",
                              f"{what}: step {i + 1} returned {type(loss).__name__}",
                              "return the loss as a tensor on the device (static_loss.detach().clone()): reading "
                              "it as a number is a wait for the device on every step")
        if loss.numel() != 1:
            raise CheckFailed("returns each step's loss as a tensor", f"{what}: step {i + 1} returned a tensor of "
                              f"shape {tuple(loss.shape)}, expected a single value")
        if (loss.requires_grad or loss.grad_fn is not None) and attached is None:
            attached = (i, type(loss.grad_fn).__name__)
        values.append(float(loss.detach().double().cpu()))
    refs = _weak(losses)
    losses = s.losses = loss = None     # the check's own references dropped: what stays alive, the step keeps
    alive = _still_alive(refs)
    if alive > 1:
        raise CheckFailed("keeps nothing per call: memory stays flat over the steps",
                          f"{what}: after {steps} calls, {alive} of the losses step() returned were still alive once "
                          "the caller had dropped them",
                          "step() keeps a reference to every loss it returns (a list in the closure, say): one "
                          "device tensor per step for as long as the step function lives, the growing window that "
                          "check 5.4 refuses. Return the loss and keep nothing; the caller logs it")
    ref_losses = s.ref_losses
    late = len(values) > 2 and all(math.isclose(a, b, rel_tol=tol, abs_tol=tol) for a, b in zip(values[1:], ref_losses[:-1]))
    if late:
        raise CheckFailed("returns each step's own loss",
                          f"{what}: each call returned the loss of the step before it (yours vs ordinary: "
                          + ", ".join(f"{a:.5f} vs {b:.5f}" for a, b in zip(values[:3], ref_losses[:3]))
                          + ", ...); the first call's value is what the captured loss tensor held before any replay "
                          "had written it" + (" (nan: the emulation fills a capture's outputs with NaN until the "
                                              "first replay; on a GPU it is whatever that memory held)"
                                              if not math.isfinite(values[0]) else ""),
                          "clone the loss after graph.replay(), not before: the replay writes this batch's loss "
                          "into the captured tensor, and a clone taken before it copies the last one")
    if steps > 1 and len(set(values)) == 1 and len(set(round(v, 9) for v in ref_losses)) > 1:
        raise CheckFailed("returns each step's own loss",
                          f"{what}: every step's returned loss reads {values[0]:.5f} once the steps are done",
                          "the captured loss tensor is overwritten by the next replay: return a copy (clone())")
    if attached is not None:
        raise CheckFailed("returns each step's loss as a detached tensor",
                          f"{what}: step {attached[0] + 1} returned a loss that still holds the captured graph's "
                          f"autograd history (grad_fn {attached[1]})",
                          "return static_loss.detach().clone(): a clone alone keeps the capture's graph "
                          "attached, and a caller that keeps the losses keeps it alive (check 5.1 asks the same "
                          "of an ordinary step)")
    if not all(math.isclose(a, b, rel_tol=tol, abs_tol=tol) for a, b in zip(values, ref_losses)):
        pairs = list(zip(values, ref_losses))
        first = next(i for i, (a, b) in enumerate(pairs) if not math.isclose(a, b, rel_tol=tol, abs_tol=tol))
        diff = ", ".join(f"{a:.5f} vs {b:.5f}" for a, b in pairs[first:first + 3])    # from the first that differs
        prop, hint = _why_different(s, emulate, vc)
        raise CheckFailed(prop, f"{what}: the losses of the graphed steps differ from ordinary steps' from step "
                          f"{first + 1} of {len(pairs)} on (yours vs ordinary: {diff}, ...)", hint)
    if not _same(_state(yours, s.opt), s.ref_state, tol):
        prop, hint = _why_different(s, emulate, vc)
        if prop == "trains exactly as ordinary steps would":
            hint = ("everything the step writes (weights, optimizer state, running statistics) must be what the "
                    "captured step writes: do not change it between replays")
        raise CheckFailed(prop, f"{what}: the same losses, but the weights, optimizer state or batch-norm "
                          "statistics after the graphed steps differ from ordinary steps'", hint)
    if not all(trusted.torch_equal(a, b) for a, b in zip(s.example, s.example_before)):
        raise CheckFailed("leaves the example batch unchanged",
                          f"{what}: after the steps, the example batch the caller passed to make_graphed_step "
                          "holds other values",
                          "capture on copies of the example (example_images.clone()); example_images.to(device) "
                          "or .to('cuda') is no copy when the batch is already there, it returns the very tensor. "
                          "A graph that reads the "
                          "caller's tensors overwrites them with every batch copied in")
    _refuses_other_shapes(s, emulate, vc)


def _graph_inputs(s: _Run, vc) -> dict:
    """The tensors the graph reads that hold the last batch's images and labels (its static inputs), by name."""
    graph = next((g for g in vc.graphs.graphs if g._ops), None)
    if graph is None:
        return {}
    leaves = {id(leaf): leaf for _, args, kwargs, _ in graph._ops
              for leaf in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)}
    images, labels = s.batches[-1]
    return {name: [leaf for leaf in leaves.values() if leaf.shape == given.shape and leaf.dtype == given.dtype
                   and trusted.torch_equal(leaf, given)]
            for name, given in (("images", images), ("labels", labels))}


def _refuses_other_shapes(s: _Run, emulate, vc):
    what, step, yours, opt = s.what, s.step, s.yours, s.opt
    inputs = _graph_inputs(s, vc) if emulate else {}
    for told, (images, labels) in s.refused:
        before = _state(yours, opt)
        held = {name: [t.clone() for t in tensors] for name, tensors in inputs.items()}
        replays = sum(g.replays for g in vc.graphs.graphs) if emulate else None
        try:
            step(images.clone(), labels.clone())
        except ValueError:
            pass
        except Exception as exc:       # noqa: BLE001 (an error, but not the one the contract names)
            raise CheckFailed("a batch of another shape raises ValueError",
                              f"{what}: {told} raised {type(exc).__name__}: {str(exc)[:120]}",
                              "compare the whole shape of the images and of the labels with the captured ones "
                              "(images.shape != static_images.shape; not only the batch size, nor the number of "
                              "values), and raise ValueError saying a graph replays the shapes it captured "
                              "(drop_last=True)") from None
        else:
            broadcast = "broadcasts" in told
            raise CheckFailed("a batch of another shape raises ValueError", f"{what}: {told} was accepted",
                              "copy_ raises for most other shapes but broadcasts a single sample or a single label "
                              "into every row without a word, and the graph then trains on copies of it: compare the "
                              "whole shape of the images and of the labels with the captured ones yourself, before "
                              "copying, and raise ValueError" if broadcast else
                              "compare the whole shapes (images.shape != static_images.shape, labels.shape != "
                              "static_labels.shape), not the number of values: view_as or reshape turns another layout "
                              "into the captured one without a word, and the graph trains on values in the wrong "
                              "places; raise ValueError" if "laid out" in told else
                              "a replay reads the captured buffers whole: a short batch would train on stale "
                              "samples; raise ValueError (drop_last=True avoids it)")
        if not _same(_state(yours, opt), before, 0.0) or (
                emulate and sum(g.replays for g in vc.graphs.graphs) != replays):
            raise CheckFailed("a batch of another shape raises ValueError",
                              f"{what}: {told} was refused, but the model or the graph still ran",
                              "check the shapes before you copy or replay")
        written = [name for name, tensors in inputs.items()
                   if not all(trusted.torch_equal(t, h) for t, h in zip(tensors, held[name]))]
        if written:                     # labels copied in before the shapes were compared (w7-05 w55_17)
            raise CheckFailed("a batch of another shape raises ValueError and changes nothing",
                              f"{what}: {told} raised ValueError, but only after your step() had copied the "
                              f"{' and the '.join(written)} into the graph's input tensors",
                              "compare both shapes first, and copy nothing until both match: a refused call "
                              "changes nothing, so the graph's inputs still hold the last batch it trained on")


def _short(where: str) -> str:
    path, _, line = where.rpartition(":")
    return f"{path.rsplit('/', 1)[-1]}:{line}"


def _explain_capture_failure(exc: BaseException, what: str) -> None:
    """make_graphed_step raised: say which rule of capture it broke, when the error tells."""
    text = _chain(exc)
    # a host tensor into a convolution on the GPU says "Input type (torch.FloatTensor) and weight type
    # (torch.cuda.FloatTensor) should be the same": a device mismatch, though it reads like a dtype one (H200, 2026-11-27)
    types_named = re.search(r"Input type \(([\w.]+)\) and weight type \(([\w.]+)\)", text)
    device_mismatch = bool(types_named) and (".cuda." in types_named.group(1)) != (".cuda." in types_named.group(2))
    if "same device" in text or "Expected all tensors to be on the same" in text or device_mismatch:
        raise CheckFailed("keeps the graph's inputs on the device",
                          f"{what}: make_graphed_step raised: {text[:260]}",
                          "make the static inputs where the example batch lives: example_images.clone(), "
                          "torch.empty_like(example_images), or device=example_images.device; torch.empty(shape) "
                          "without device= is host memory, and a device written into the code (device='cuda:0') "
                          "is another GPU when the batch lives on cuda:1") from None
    if "should be the same" in text or "Input type" in text or "expected scalar type" in text \
            or "found dtype" in text:
        raise CheckFailed("keeps the graph's inputs in the example batch's dtype",
                          f"{what}: make_graphed_step raised: {text[:260]}",
                          "make the static inputs like the example batch: example_images.clone() or "
                          "torch.empty_like(example_images) keep its dtype (and device); torch.zeros(shape, "
                          "device=...) is float32 whatever the batch is") from None
    if OTHER_DEVICE_STREAM.split("{")[0] in text:
        raise CheckFailed("captures on a stream of the batch's device",
                          f"{what}: capturing raised: {text[:200]}",
                          "make the side stream where the batch lives: torch.cuda.Stream() (the caller made the "
                          "batch's device current) or torch.cuda.Stream(device=example_images.device); a device "
                          "written into the code (device=0) is another GPU when the batch lives on cuda:1, and "
                          "a capture there records none of the step's work") from None
    if OTHER_STREAM in text:
        raise CheckFailed("captures on one stream", f"{what}: capturing raised: {text[:200]}",
                          "call capture_end() on the stream capture_begin() ran on: keep both inside the same "
                          "`with torch.cuda.stream(side):` block (or let `with torch.cuda.graph(graph):` do both)") \
            from None
    if CAPTURE_ERROR in text or "operation failed due to a previous error during capture" in text \
            or "during CUDA graph capture" in text:          # .cpu() / .tolist(): a copy to pageable host memory
        raise CheckFailed("reads nothing on the host while capturing",
                          f"{what}: capturing raised: {text[:260]}",
                          "a value read on the host (.item(), float(loss), print(loss), .cpu(), .tolist(), an `if` "
                          "on a tensor) or a wait (torch.cuda.synchronize(), event.synchronize()) cannot be part of "
                          "a graph: keep the loss a tensor, read it after replay()") from None
    if NUMPY_ERROR.split("{}")[0] in text:
        raise CheckFailed("reads nothing on the host while capturing", f"{what}: capturing raised: {text[:200]}",
                          ".numpy() needs the value on the host: keep the loss a tensor, read it after replay()") \
            from None


def _why_different(s: _Run, emulate, vc) -> tuple[str, str]:
    """Which rule of capture made the graphed steps train differently, where it can be seen."""
    watch, warmup = s.watch, s.warmup
    capture = watch.captures[0]
    before_warmup = ("captures after the warm-up",
                     "the capture began before the warm-up steps had created the optimizer's state (momentum or "
                     "Adam's moments): the graph recorded a first step, and replays it forever. Warm up first, then "
                     "capture")
    if capture["calls"] == 0:
        return before_warmup
    if capture["optimizer_steps"] != warmup:
        return ("warms up `warmup` ordinary steps, then captures one",
                f"your warm-up ran {capture['optimizer_steps']} optimizer steps before the capture, expected "
                f"{warmup}: each warm-up step is a training step (forward, loss, backward, optimizer.step()), "
                "which also creates the optimizer's state the graph must capture")
    if capture["no_state"]:
        return before_warmup
    if not _same(capture["weights"], s.ref_warm, s.tol) and _warmup_without_zero_grad(s):
        return ("clears the gradients in each warm-up step",
                "when the capture began, the weights were those of warm-up steps on the example batch that never "
                "cleared the gradients: each warm-up step's backward added to the gradients of the steps before "
                "it. The warm-up steps are ordinary training steps: optimizer.zero_grad(set_to_none=True) at the "
                "start of each")
    if not _same(capture["weights"], s.ref_warm, s.tol):
        return ("warms up on the example batch",
                "when the capture began, the weights differed from those of ordinary steps on the example batch: "
                "your warm-up trained on other data (random numbers, zeros, an uninitialised buffer). The warm-up "
                "steps are training steps the caller counts on: run them on example_images and example_labels")
    if capture["stale_grads"]:
        return ("clears the gradients before the capture",
                f"{capture['stale_grads']} parameters still had a .grad from the warm-up when the capture began: "
                "backward inside the graph then adds to them, on every replay. Call "
                "optimizer.zero_grad(set_to_none=True) just before the capture, so that backward writes them")
    missing = _never_reached_the_graph(s, vc) if emulate else []
    if missing:
        return ("copies each batch into the captured inputs",
                f"no tensor the graph read held the {' and the '.join(missing)} given to step(): a replay reads the "
                "memory it captured, so rebinding a name (`static_images = images`, `static_images.data = "
                "images`, `static_images.set_(images)`), or not copying at all, leaves the graph training on the "
                "capture's batch. Copy both into it: static_images.copy_(images), static_labels.copy_(labels)")
    return ("trains exactly as ordinary steps would",
            "the usual causes: the batch rebound instead of copied into the captured tensors "
            "(static.copy_(images)); gradients left from the warm-up when capturing; a capture before the "
            "warm-up; an extra replay, or none, per step")


def _weak(tensors) -> list:
    import weakref
    refs = []
    for t in tensors:
        try:
            refs.append(weakref.ref(t))
        except TypeError:
            pass
    return refs


def _still_alive(refs) -> int:
    """How many of the losses step() returned are still alive once the check has dropped its own references."""
    import gc
    gc.collect()
    return len({id(r()) for r in refs if r() is not None})     # distinct tensors: the captured loss itself is one


def _warmup_without_zero_grad(s: _Run) -> bool:
    """Whether the weights at the capture are those of `warmup` steps on the example batch that never cleared
    the gradients (each step's gradients added to the last's)."""
    if s.spare is None:
        return False
    model, s.spare = s.spare, None           # used once, on the way to a failure
    opt = _optimizer("adam" if s.optimizer != "sgd" else "sgd", model, s.lr)
    for _ in range(s.warmup):
        F.cross_entropy(model(s.example[0]), s.example[1]).backward()
        opt.step()
    return _same([p.detach() for p in model.parameters()], s.watch.captures[0]["weights"], s.tol)


def _never_reached_the_graph(s: _Run, vc) -> list[str]:
    """Which of the last batch's images and labels no tensor the graph reads holds."""
    graph = next((g for g in vc.graphs.graphs if g._ops), None)
    if graph is None:
        return []
    leaves = [leaf for _, args, kwargs, _ in graph._ops for leaf in torch.utils._pytree.tree_leaves((args, kwargs))
              if isinstance(leaf, torch.Tensor)]
    images, labels = s.batches[-1]
    return [name for name, given in (("images", images), ("labels", labels))
            if not any(leaf.shape == given.shape and leaf.dtype == given.dtype and trusted.torch_equal(leaf, given)
                       for leaf in leaves)]


def grade_scenario(make_graphed_step, device="cpu", *, seed: int = 0, optimizer: str = "sgd",
                   default_warmup: bool = False) -> Verdict:
    """One scenario of check 5.5 on `device` ("cpu": the emulation on the virtual CUDA device;
    "cuda": the real torch.cuda.graph), and its verdict. Used by the check, and by the cases of
    tests/unit/graph_step_cases.py (on a GPU, beside the emulation's verdict)."""
    import numpy as np
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer is one of {OPTIMIZERS}")
    rng = np.random.default_rng(seed)
    try:
        with _forbidden(), one_thread():
            _scenario(make_graphed_step, rng, torch.device(device), optimizer=optimizer,
                      use_default_warmup=default_warmup)
    except CheckFailed as failed:
        return Verdict("fail", failed.prop, failed.sentence())
    except NotImplementedError as exc:
        return Verdict("not_implemented", "", str(exc))
    except Exception as exc:       # noqa: BLE001 (the learner's code raised: what a GPU run would show)
        return Verdict("error", type(exc).__name__, _chain(exc)[:400])
    return Verdict("pass", "", "")


def _forbidden():
    from ._util import course_code_forbidden
    return course_code_forbidden(_COURSE_CODE)


@exercise("5.5", "A training step captured as a CUDA graph", points=3, time_limit_s=120)
@forbids(*_COURSE_CODE)
@single_threaded
def check_graphed_step(make_graphed_step):
    expect_callable(make_graphed_step, "a function make_graphed_step(model, optimizer, example_images, "
                                       "example_labels, warmup=3) -> step(images, labels)")
    rng, seed = fresh_rng()
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    told, warmups = [], []
    shape = _shape(rng)             # one shape for every scenario: a graph kept between calls would fit it
    for device in devices:
        for optimizer, default in (("sgd", False), ("adam", True)):
            steps, warmup = _scenario(make_graphed_step, rng, device, optimizer=optimizer,
                                      use_default_warmup=default, shape=shape,
                                      call_again=not default)     # once per device: the check's time
            if not default:
                warmups.append(warmup)
        told.append(device.type if device.type == "cuda" else
                    "the virtual CUDA device cuda:1, with torch.cuda's capture and streams emulated "
                    "(course_utils.graph_capture)")
    return (f"captures after the warm-up steps (warmup={', '.join(map(str, warmups))} and the default), replays "
            "once per step with no model call or optimizer step in Python and no wait for the device, the same "
            "losses, weights, optimizer state and batch-norm statistics as ordinary steps (SGD and capturable "
            "Adam), no race between streams, a fresh loss tensor per step, the example batch left alone, and "
            "ValueError for a batch of another shape, before anything is copied in (1 sample, 1 label, and as many values "
            "in another layout included), and a second call with the same model and optimizer that captures anew; "
            "on "
            f"{' and '.join(told)} (seed {seed}).")
