"""Checks for lesson 05 (mixed precision, memory, and the habits that stall the GPU)."""
from __future__ import annotations

import collections
import contextlib
import inspect
import io
import gc
import math
import operator
import re
import sys

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils._pytree
from torch import nn

from ..memory import GraphWatch, SavedTensorMeter, StepReadings
from ..syncs import SyncCounter, _CountingMode, _to_host
from ._core import CheckFailed, exercise, expect_callable, trusted
from ._util import forbids, fresh_rng, single_threaded
from .virtual_cuda import DeviceTensor, VirtualCuda


def _devices():
    return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


def _as_float(value, what):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise CheckFailed("returns the loss", f"{what} returned a tensor of shape {tuple(value.shape)}, "
                              "expected a single number")
        value = value.detach().float().cpu().item()
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise CheckFailed("returns the loss", f"{what} returned {type(value).__name__}: {value!r:.60}")
    return float(value)


def _blobs(rng, n, d_in, n_classes, device, centers=None):
    """A learnable classification problem: Gaussian blobs around random class centres."""
    if centers is None:
        centers = rng.normal(0.0, 2.0, size=(n_classes, d_in))
    y = rng.integers(0, n_classes, size=n)
    x = centers[y] + rng.normal(0.0, 1.0, size=(n, d_in))
    return (torch.tensor(x, dtype=torch.float32, device=device),
            torch.tensor(y, dtype=torch.long, device=device), centers)


# -- 5.1 an AMP training step with a GradScaler ---------------------------------------------------

class _BackwardProbe(torch.autograd.Function):
    """Passes its input through; during backward records whether autocast was on (for the
    device type `kind`) into `log`."""

    @staticmethod
    def forward(ctx, x, kind, log):
        ctx.kind, ctx.log = kind, log
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append(torch.is_autocast_enabled(ctx.kind))
        return grad, None, None


class _AutocastProbeNet(nn.Module):
    """A small MLP that records, at every forward, whether autocast was on and to which dtype,
    and at every backward whether autocast was (still) on."""

    def __init__(self, d_in, n_classes, hidden=32):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, n_classes)
        self.seen = []
        self.backward_autocast = []
        self.graphs = GraphWatch()      # each step's graph, tagged at the model's output: alive while a loss is kept

    def forward(self, x):
        kind = x.device.type
        enabled = torch.is_autocast_enabled(kind)
        self.seen.append((enabled, torch.get_autocast_dtype(kind) if enabled else None))
        if isinstance(x, DeviceTensor):     # images that say they are on a GPU: the work stays on the host
            x = x._inner
        return self.graphs.mark(_BackwardProbe.apply(self.fc2(torch.relu(self.fc1(x))), kind, self.backward_autocast))


class _LossWatch(torch.overrides.TorchFunctionMode):
    """Records, for every loss function the learner's step calls (cross_entropy, nll_loss), whether
    autocast was on for `kind` at that moment."""

    def __init__(self, kind):
        super().__init__()
        self.kind, self.autocast, self.retained = kind, [], []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("cross_entropy", "nll_loss"):
            self.autocast.append(torch.is_autocast_enabled(self.kind))
        if name == "backward":      # Tensor.backward(gradient, retain_graph, create_graph): walk w8-05
            kw = kwargs or {}
            retain = kw.get("retain_graph", args[2] if len(args) > 2 else None)
            create = kw.get("create_graph", args[3] if len(args) > 3 else False)
            self.retained.append(bool(retain) or (retain is None and bool(create)))
        return func(*args, **(kwargs or {}))


def _kept_tensors(fn) -> tuple[int, str]:
    """How many tensors the containers that outlive a call of `fn` hold (a module-level list, a closure's
    deque, an attribute on the function), and the name of the fullest: a log of every step's loss or
    gradient norm grows by one device tensor per step (walk w8-05)."""
    fn = getattr(fn, "__wrapped__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return 0, ""
    names, stack = set(), [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if inspect.iscode(k))
    g = getattr(fn, "__globals__", {})
    places = [(n, g[n]) for n in names if n in g]
    for n, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            places.append((n, cell.cell_contents))
        except ValueError:
            pass
    places += [(f"{getattr(fn, '__name__', 'fn')}.{k}", v) for k, v in getattr(fn, "__dict__", {}).items()]

    def count(value, depth=0):
        if isinstance(value, torch.Tensor):
            return 1
        if depth > 2:
            return 0
        if isinstance(value, (list, tuple, collections.deque, set)):
            return sum(count(v, depth + 1) for v in value)
        if isinstance(value, dict):
            return sum(count(v, depth + 1) for v in value.values())
        return 0
    counted = [(count(v), n) for n, v in places if isinstance(v, (list, tuple, collections.deque, set, dict))]
    return max(counted, default=(0, ""))


def _uses_its_scaler(watched: _ScalerCalls, returned, label, *, scaled: bool) -> None:
    """The step used the scaler it was given (when something scaled the loss), in the right order, and
    read nothing else on the host."""
    calls = watched.calls
    if "scale" not in calls and scaled:
        raise CheckFailed("uses the scaler it is given", f"{label}: {_UNUSED_SCALER}", _UNUSED_SCALER_HINT)
    if "update" in calls and "step" in calls and calls.index("update") < calls.index("step"):
        raise CheckFailed("calls scaler.update() after scaler.step()",
                          f"{label}: yours called the scaler's {', '.join(watched.yours or calls)}, in that order",
                          "scaler.step(optimizer) first (it skips the step after an overflow), then scaler.update(), "
                          "which adjusts the scale from what step() found")
    reads = watched.reads
    if reads.count:
        where = ", ".join(f"{name} at {w.rpartition('/')[2]}" for name, w in zip(reads.calls, reads.where))
        got_scale = "get_scale" in calls
        if got_scale and "unscale_" not in calls[:calls.index("get_scale")]:     # (step() calls unscale_ itself)
            first = ("get_scale() reads the scale from the device every step: clip after "
                     "scaler.unscale_(optimizer) instead of scaling max_norm by it. ")
        elif got_scale:
            first = ("get_scale() reads the scale from the device every step: to log the scale, read it when you "
                     "log (once per interval, outside the step), not in every step. ")
        elif any("synchronize" in c for c in reads.calls):
            first = ("torch.cuda.synchronize() makes the host wait until the device has run all it was given, "
                     "every step, guarded by `if torch.cuda.is_available()` or not: the host can no longer queue "
                     "the next step while this one runs; leave it out (time with events, lesson 04, if you "
                     "must). ")
        elif any(c in ("__bool__", "__float__", "__int__", "__index__", "item") for c in reads.calls):
            first = ("a guard on the loss or the gradients (`if torch.isfinite(loss):`, "
                     "clip_grad_norm_(..., error_if_nonfinite=True), float(loss)) reads a value on the host, which "
                     "waits for the device every step: leave inf and NaN to the scaler, whose step() skips the "
                     "update after an overflow, and check the loss when you log it. ")
        elif any(c in ("cpu", "to") for c in reads.calls):
            first = ("loss.detach().cpu() (or .to('cpu')) copies the loss to the host, which waits for the device "
                     "to finish the step: return loss.detach() and leave it where it is. ")
        else:
            first = ""
        raise CheckFailed("reads nothing on the host besides the scaler's own check",
                          f"{label}: one call read {reads.count} value(s) from the device or waited for it, besides "
                          f"the scaler's check for inf ({where})",
                          first + "On a GPU each read makes the host wait for the device: "
                          + ("" if first.startswith("a guard") else "return the loss as a tensor and ")
                          + "let the caller read the loss when it logs")


_UNUSED_SCALER = "the scaler passed to amp_step in this call was not used (its scale() was never called)"
_UNUSED_SCALER_HINT = ("use the `scaler` argument, every call: a new GradScaler made in the step starts from its initial "
                       "scale each step and forgets what it learned (the backoff after an overflow, the growth after "
                       "clean steps), and one kept from an earlier call (a global, a default argument) is another "
                       "caller's")


def _passes_keyword(fn, keyword: str) -> bool:
    """Whether `fn`'s code (or a function nested in it) passes `keyword=` to a call."""
    code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
    stack = [code] if code is not None else []
    while stack:
        code = stack.pop()
        for const in code.co_consts:
            if isinstance(const, tuple) and keyword in const:
                return True
            if inspect.iscode(const):
                stack.append(const)
    return False


def _uses_name(fn, name: str) -> bool:
    """Whether `fn`'s code (or a function nested in it) names `name` (an attribute or a global)."""
    code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
    stack = [code] if code is not None else []
    while stack:
        code = stack.pop()
        if name in code.co_names:
            return True
        stack.extend(c for c in code.co_consts if inspect.iscode(c))
    return False


def _returned_loss(returned, label):
    """The loss a step returned: a detached tensor of one value (a float is a read of the device)."""
    if isinstance(returned, torch.Tensor):
        if returned.requires_grad or returned.grad_fn is not None:
            raise CheckFailed("returns the loss as a detached tensor",
                              f"{label}: the returned loss still holds its autograd graph (grad_fn "
                              f"{type(returned.grad_fn).__name__})",
                              "return loss.detach(): a caller that keeps the losses (to log them later) would keep "
                              "every step's graph alive, the habit exercise 5.4 fixes")
        return returned
    if isinstance(returned, (float, int, np.floating, np.integer)) and not isinstance(returned, bool):
        raise CheckFailed("returns the loss as a detached tensor",
                          f"{label}: amp_step returned a {type(returned).__name__}: reading the loss as a number is "
                          "a wait for the device on every step, besides the scaler's own",
                          "return loss.detach() and let the caller read it when it logs (once per interval)")
    return returned


def _grad_norm(params):
    grads = [p.grad.detach().float() for p in params if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


class _ScalerCalls:
    """The scaler the check hands over, watched: which of its methods each call of the step used, in
    which order, and the host reads the step made outside the scaler (the scaler's own check for inf,
    inside `scaler.step`, is the one read a step needs)."""

    def __init__(self, scaler):
        self.scaler, self.calls = scaler, []
        self.yours, self._depth = [], 0     # the calls the learner's code made (not scaler.step's own unscale_; w7-05)
        # a copy to the host (.cpu()) counts as the wait it is on a GPU, and so does torch.cuda.synchronize,
        # also behind `if torch.cuda.is_available():` (walk w3-05)
        self.reads = _SyncAndCopyCounter(host_reads=True, cuda_debug=False)
        for name in ("scale", "unscale_", "step", "update", "get_scale"):
            setattr(scaler, name, self._watched(name, getattr(scaler, name)))

    def _watched(self, name, method):
        def watched(*args, **kwargs):
            self.calls.append(name)
            if not self._depth:
                self.yours.append(name)
            self._depth += 1
            try:
                if name == "step":
                    with self.reads.paused():
                        return method(*args, **kwargs)
                if name == "get_scale" and not self.reads._paused:
                    with self.reads.paused():
                        value = method(*args, **kwargs)
                    self.reads._record("scaler.get_scale()")     # one read, at the learner's line
                    return value
                return method(*args, **kwargs)
            finally:
                self._depth -= 1
        return watched

    @contextlib.contextmanager
    def one_call(self):
        self.calls.clear()
        self.yours.clear()
        self.reads.calls.clear()
        self.reads.where.clear()
        with _pretend_a_gpu(), self.reads:
            yield


def _call_amp(amp_step, label, *args, **kwargs):
    """Call the learner's step, turning the scaler's own 'you forgot update()' errors into a failure."""
    try:
        return amp_step(*args, **kwargs)
    except (RuntimeError, AssertionError) as exc:
        text = str(exc)
        if "since the last update()" in text or "called after step()" in text:
            raise CheckFailed("calls scaler.update() after each step",
                              f"{label}: on the next call the scaler raised, as its step() had not been followed by "
                              "an update()",
                              "end every step with scaler.update(): it resets the scaler for the next step "
                              "and adjusts the scale") from None
        if "prior to update" in text and _uses_name(amp_step, "get_scale"):    # walk w8-05, 51b_manual_unscale_divide
            raise CheckFailed("unscales and steps with the scaler",
                              f"{label}: yours read scaler.get_scale() and then called scaler.update() with no "
                              "scaler.step() before it (the scaler said: " + text.strip().rstrip('.') + ")",
                              "unscale with scaler.unscale_(optimizer) and step with scaler.step(optimizer): dividing "
                              ".grad by get_scale() by hand reads the scale on the host every step, and "
                              "optimizer.step() then steps even after an overflow, which scaler.step skips") from None
        if "prior to update" in text:
            raise CheckFailed("calls scaler.update() after scaler.step()", f"{label}: the scaler said: {text.strip().rstrip('.')}",
                              "scaler.step(optimizer) first (it skips the step after an overflow), then "
                              "scaler.update(), which reads what step() found to adjust the scale") from None
        if "_scale is None" in text or "did not use scaler.scale" in text:
            raise CheckFailed("scales the loss before backward",
                              f"{label}: the scaler raised at your unscale_ or step (it said: {text.strip().split('.')[0]}): "
                              "yours called backward on the unscaled loss, so the scaler never set its scale",
                              "call `scaler.scale(loss).backward()`, not `loss.backward()`") from None
        if "No inf checks were recorded" in text:
            raise CheckFailed("clears the gradients at the start of each step",
                              f"{label}: scaler.step found no gradients to step with (the scaler said: {text.strip().rstrip('.')})",
                              "optimizer.zero_grad(set_to_none=True) first, before the forward pass: clearing "
                              "them after backward throws the step's gradients away") from None
        raise


def _amp_case(amp_step, rng, seed, device, dtype, *, use_scaler):
    kind = device.type
    d_in, n_classes, lr = 12, 4, 0.05
    x, y, centers = _blobs(rng, 64, d_in, n_classes, device)
    torch.manual_seed(int(rng.integers(0, 2**31)))
    model = _AutocastProbeNet(d_in, n_classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler(kind, init_scale=2.0 ** 12, growth_interval=10**6, enabled=use_scaler)
    label = f"{str(dtype).replace('torch.', '')} on {kind}" + ("" if use_scaler else " (scaler disabled)")
    watched = _ScalerCalls(scaler)

    # (a)+(c)+(e): one step with a huge max_norm (no clipping), twice in a row
    seen = {}
    handle = model.fc2.weight.register_hook(lambda g: seen.__setitem__("grad", g.detach().float().clone()))
    try:
        for call in (1, 2):
            model.seen.clear()
            before = [p.detach().clone() for p in model.parameters()]
            scale_before = scaler.get_scale() if use_scaler else 1.0
            with torch.no_grad(), torch.autocast(kind, dtype=dtype):
                expected_loss = float(F.cross_entropy(model(x), y).float())
            if call == 2:   # stale gradients, large enough to show even after unscaling: a step must clear them
                for p in model.parameters():
                    p.grad = torch.full_like(p, 1e4 * scale_before)
            model.seen.clear()
            model.backward_autocast.clear()
            with _LossWatch(kind) as losses_seen, watched.one_call():
                returned = _call_amp(amp_step, label, model, opt, scaler, x, y, dtype=dtype, max_norm=1e9)
            returned = _returned_loss(returned, label)
            loss = _as_float(returned, f"amp_step ({label})")
            if len(model.seen) != 1:
                raise CheckFailed("runs one forward pass per step",
                                  f"{label}: the model ran {len(model.seen)} forward passes in one call")
            enabled, seen_dtype = model.seen[0]
            if not enabled:
                switched = _passes_keyword(amp_step, "enabled")     # autocast(..., enabled=scaler.is_enabled()), w7-05
                raise CheckFailed("runs the forward pass under autocast",
                                  f"{label}: the model ran with autocast off"
                                  + (": yours passes enabled= to torch.autocast, and it was False here" if switched
                                     else ""),
                                  "leave enabled= out of torch.autocast: autocast is what runs the step in low "
                                  "precision, for float16 and bfloat16 alike; only the scaler is off for bfloat16 "
                                  "(GradScaler(enabled=False) passes everything through)" if switched else
                                  "wrap the forward pass and the loss in "
                                  "`with torch.autocast(device_type=images.device.type, dtype=dtype):`")
            if seen_dtype != dtype:
                raise CheckFailed("autocasts to the dtype asked for",
                                  f"{label}: yours autocast to {seen_dtype}, expected {dtype}")
            if losses_seen.autocast and not all(losses_seen.autocast):
                raise CheckFailed("computes the loss under autocast",
                                  f"{label}: the forward pass ran under autocast, the cross-entropy after it, "
                                  "with autocast off: on the low-precision logits, in low precision",
                                  "put the loss inside the same `with torch.autocast(...)` block as the forward "
                                  "pass: autocast runs the loss in float32 from low-precision logits")
            if any(losses_seen.retained):
                raise CheckFailed("frees the step's saved activations in backward",
                                  f"{label}: yours called backward with retain_graph=True: the activations the "
                                  "forward pass saved stay in memory through the clipping and the optimizer step",
                                  "backward() frees the activations it used unless retain_graph=True asks it to "
                                  "keep them; one backward per step needs none: drop retain_graph")
            if any(model.backward_autocast):
                raise CheckFailed("runs backward outside autocast",
                                  f"{label}: autocast was still on during the backward pass",
                                  "end the `with torch.autocast(...)` block after the loss: backward runs each "
                                  "operation in the precision its forward used, and PyTorch's AMP notes say "
                                  "backward under autocast is not recommended (leave scaler.scale(loss).backward() "
                                  "outside the block)")
            if isinstance(returned, torch.Tensor) and returned.dtype in (torch.float16, torch.bfloat16):
                raise CheckFailed("returns the step's loss",
                                  f"{label}: yours returned the loss in {str(returned.dtype).replace('torch.', '')}; "
                                  "under autocast cross_entropy computes it in float32 (seed {seed})".replace(
                                      "{seed}", str(seed)),
                                  "return loss.detach() as it is: autocast runs the loss in float32 on purpose, and "
                                  "a copy in float16 or bfloat16 keeps 3 or 4 digits of it (bfloat16 reads 2.34 "
                                  "where the loss is 2.3412), too few to see a loss curve flatten")
            if not math.isfinite(loss) or not math.isclose(loss, expected_loss, rel_tol=3e-2, abs_tol=1e-2):
                raise CheckFailed("returns the step's loss", f"{label}: yours {loss:.4f}, the batch's loss "
                                  f"before the step is {expected_loss:.4f} (seed {seed})")
            if "grad" not in seen:
                raise CheckFailed("runs the backward pass", f"{label}: no gradient reached the last layer")
            if model.fc2.weight.grad is None:
                raise CheckFailed("leaves this step's gradients in .grad",
                                  f"{label}: the backward pass ran, but after the step .grad was empty: the step "
                                  "cleared the gradients at its end",
                                  "clear them at the start of the step (optimizer.zero_grad(set_to_none=True) "
                                  "first): after a step, .grad is where clipping, logging and a debugger read its "
                                  "gradients, and the next step's clear makes the room")
            final = model.fc2.weight.grad.detach().float()
            ratio = float(torch.linalg.vector_norm(seen["grad"]) / torch.linalg.vector_norm(final).clamp_min(1e-30))
            if use_scaler:
                _uses_its_scaler(watched, returned, label, scaled=not math.isclose(ratio, 1.0, rel_tol=1e-2))
            if use_scaler and math.isclose(ratio, 1.0, rel_tol=1e-2):
                raise CheckFailed("scales the loss before backward",
                                  f"{label}: the gradients during backward were not scaled (scale {scale_before:g})",
                                  "call `scaler.scale(loss).backward()`, not `loss.backward()`")
            if call == 2 and not math.isclose(ratio, scale_before, rel_tol=2e-2):
                more = ratio < scale_before * 0.98
                raise CheckFailed("clears the gradients at the start of each step" if more else
                                  "leaves unscaled gradients in .grad",
                                  f"{label}: on a second call .grad holds {scale_before / max(ratio, 1e-30):.3g}x "
                                  "this step's gradient",
                                  "call optimizer.zero_grad(set_to_none=True) first" if more else
                                  "let the scaler unscale: scaler.unscale_(optimizer) before clipping")
            if call == 1 and ratio > scale_before * 1.02 and abs(_grad_norm(list(model.parameters())) - 1.0) < 1e-3:
                raise CheckFailed("clips the unscaled gradients to max_norm",
                                  f"{label}: with max_norm=1e9 nothing should be clipped; yours clipped the "
                                  "gradients to a norm of 1.0", "pass max_norm on to clip_grad_norm_")
            if call == 1 and not math.isclose(ratio, scale_before, rel_tol=2e-2):
                raise CheckFailed("leaves unscaled gradients in .grad",
                                  f"{label}: .grad is {ratio:.4g}x smaller than the backward's gradient, "
                                  f"expected the scale {scale_before:g}x")
            for p0, p in zip(before, model.parameters()):
                expected = p0 - lr * p.grad.detach().to(p0.dtype)
                if not torch.allclose(p.detach(), expected, rtol=1e-4, atol=1e-6):
                    raise CheckFailed("takes one optimizer step with the unscaled gradients",
                                      f"{label}: a parameter moved by {float((p.detach() - p0).abs().max()):.3g} "
                                      f"at most, SGD(lr={lr}) with the final .grad would move it by "
                                      f"{float((expected - p0).abs().max()):.3g}",
                                      "scaler.step(optimizer) then scaler.update()")
    finally:
        handle.remove()

    # (d) clipping sees unscaled gradients: a copy of the model, its gradient norm measured first
    model2 = _AutocastProbeNet(d_in, n_classes).to(device)
    model2.load_state_dict(model.state_dict())
    opt2 = torch.optim.SGD(model2.parameters(), lr=lr)
    with torch.autocast(kind, dtype=dtype):
        probe_loss = F.cross_entropy(model2(x), y)
    probe_loss.float().backward()
    full_norm = _grad_norm(list(model2.parameters()))
    model2.zero_grad(set_to_none=True)
    max_norm = 0.1 * full_norm
    weights_before = [p.detach().clone() for p in model2.parameters()]
    _call_amp(amp_step, label, model2, opt2, scaler, x, y, dtype=dtype, max_norm=max_norm)
    norm_after = _grad_norm(list(model2.parameters()))
    # the update itself (w6-05 w51_30): SGD without momentum moves the weights by lr x the gradient it
    # stepped with, so the step's size says which gradients the optimizer saw, whatever .grad holds after
    moved = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm((p.detach() - p0).float())
                                                        for p0, p in zip(weights_before, model2.parameters())])))
    stepped_norm = moved / lr
    if not math.isclose(norm_after, max_norm, rel_tol=5e-2):
        if use_scaler and norm_after < 0.05 * max_norm:
            hint = ("clip after scaler.unscale_(optimizer): clipping scaled gradients clips them to "
                    "max_norm in scaled units, which is a tiny norm once unscaled")
        elif norm_after > max_norm:
            hint = "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) before scaler.step"
        else:
            hint = "unscale_, clip_grad_norm_, then scaler.step and scaler.update"
        raise CheckFailed("clips the unscaled gradients to max_norm",
                          f"{label}: gradient norm {full_norm:.4g}, max_norm {max_norm:.4g}; after yours "
                          f".grad has norm {norm_after:.4g}", hint)
    if stepped_norm > 1.5 * max_norm:
        raise CheckFailed("steps with the clipped gradients",
                          f"{label}: gradient norm {full_norm:.4g}, max_norm {max_norm:.4g}; .grad after yours has "
                          f"norm {norm_after:.4g}, but the weights moved as SGD(lr={lr}) moves them with a gradient "
                          f"of norm {stepped_norm:.4g}: yours clips after the optimizer step, so the step used the "
                          "unclipped gradients (seed {seed})".replace("{seed}", str(seed)),
                          "clip between scaler.unscale_(optimizer) and scaler.step(optimizer): clipping afterwards "
                          "changes only .grad, not the update already made")

    # (g) an inf gradient: the step is skipped and the scale backs off
    if use_scaler:
        scale = scaler.get_scale()
        before = [p.detach().clone() for p in model.parameters()]

        def poison(g):
            g = g.clone()
            g.view(-1)[0] = float("inf")
            return g
        handle = model.fc1.weight.register_hook(poison)
        try:
            _call_amp(amp_step, label, model, opt, scaler, x, y, dtype=dtype, max_norm=1.0)
        finally:
            handle.remove()
        if not all(torch.equal(p0, p.detach()) for p0, p in zip(before, model.parameters())):
            raise CheckFailed("skips the optimizer step when a gradient is inf",
                              f"{label}: with an inf in the gradients the parameters changed",
                              "call scaler.step(optimizer), not optimizer.step(): it skips the step "
                              "when unscale_ found inf or NaN")
        if not scaler.get_scale() < scale:
            raise CheckFailed("shrinks the scale after an overflow",
                              f"{label}: the scale was {scale:g} before an inf gradient and {scaler.get_scale():g} "
                              "after", "call scaler.update() at the end of every step")

    # (h) with normal data the loss goes down
    torch.manual_seed(int(rng.integers(0, 2**31)))
    model = _AutocastProbeNet(d_in, n_classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(kind, growth_interval=5, enabled=use_scaler)
    fresh = _ScalerCalls(scaler)
    scales, losses = [], []
    kept_before = None
    for _ in range(40):
        if len(losses) == 5:
            kept_before = _kept_tensors(amp_step)[0]
        xb, yb, _ = _blobs(rng, 32, d_in, n_classes, device, centers)
        fresh.calls.clear()
        losses.append(_call_amp(amp_step, label, model, opt, scaler, xb, yb, dtype=dtype, max_norm=5.0))
        if use_scaler and "scale" not in fresh.calls:     # a scaler kept from an earlier call, say
            raise CheckFailed("uses the scaler it is given", f"{label}, a new model and a new scaler: "
                              f"{_UNUSED_SCALER}", _UNUSED_SCALER_HINT)
        with fresh.reads.paused():
            scales.append(scaler.get_scale() if use_scaler else 1.0)
        if model.graphs.alive:
            gc.collect()                   # a reference cycle that garbage collection frees is not a keep
        if model.graphs.alive:             # even one: the last step's graph, kept into the next forward (w5-05)
            alive = model.graphs.alive
            raise CheckFailed("keeps no graph past its step",
                              f"{label}: after {len(losses)} call{'s' if len(losses) != 1 else ''}, "
                              + ("1 step's autograd graph was" if alive == 1 else f"{alive} steps' autograd graphs were")
                              + " still alive, though each step had returned and its caller kept only the detached "
                              "loss (seed {seed})".replace("{seed}", str(seed)),
                              "something the step keeps (a list, a global, an attribute) holds the loss itself, and "
                              "with it the step's whole graph: keep loss.detach() (or nothing) there, as the "
                              "returned loss is, the habit exercise 5.4 fixes")
    kept, where = _kept_tensors(amp_step)
    if kept_before is not None and kept - kept_before >= 30:
        raise CheckFailed("keeps no tensor per step",
                          f"{label}: after 40 calls {where}, which outlives the call, held {kept} tensors, "
                          f"{kept - kept_before} more than after 5 calls: one more every step (seed {seed})",
                          "on a GPU each is device memory kept for the whole run, a log of every step's loss or "
                          "gradient norm (exercise 5.5 rejects the same): return loss.detach() and let the caller "
                          "keep what it logs, once per interval")
    with fresh.reads.paused():
        losses = [_as_float(v, f"amp_step ({label})") for v in losses]
    first, last = float(np.mean(losses[:5])), float(np.mean(losses[-5:]))
    if not last < 0.7 * first:
        raise CheckFailed("trains: the loss goes down", f"{label}: mean loss over the first 5 steps {first:.3f}, "
                          f"over the last 5 of 40 steps {last:.3f} (seed {seed})")
    if use_scaler and not any(b > a for a, b in zip(scales, scales[1:])):
        raise CheckFailed("lets the scale grow after good steps",
                          f"{label}: with growth_interval=5 the scale never grew in 40 steps",
                          "call scaler.update() at the end of every step")


class _LossOnTheHost(torch.overrides.TorchFunctionMode):
    """The probe model's work stays on the host: a loss function given labels on the virtual device reads
    them there (the labels live where the images do, as on a GPU)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("cross_entropy", "nll_loss"):
            unwrap = lambda t: t._inner if isinstance(t, DeviceTensor) else t     # noqa: E731
            args = tuple(unwrap(a) for a in args)
            kwargs = {k: unwrap(v) for k, v in (kwargs or {}).items()}
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _parameters_say(model, device):
    """While the block runs, the model's parameters answer `.device` with `device` (their work stays on the
    host): a step that reads the device from the model sees the one the images are on."""
    params = list(model.parameters())
    classes = {}
    for p in params:
        cls = type(p)
        if cls not in classes:
            classes[cls] = type(cls.__name__, (cls,), {"device": property(lambda self, _d=device: _d)})
        p.__class__ = classes[cls]
    try:
        yield
    finally:
        for p in params:
            p.__class__ = type(p).__mro__[1]


def _autocast_follows_the_images(amp_step, rng, seed):
    """Images that say they live on a GPU (the virtual CUDA device; the model's work stays on the
    host): the step must autocast on *their* device type, which a step written for the CPU alone
    does not."""
    d_in, n_classes = 12, 4
    x, y, _ = _blobs(rng, 32, d_in, n_classes, torch.device("cpu"))
    torch.manual_seed(int(rng.integers(0, 2**31)))
    model = _AutocastProbeNet(d_in, n_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=10**6)
    label = "float16, images on a (virtual) GPU"
    with VirtualCuda() as vc, _parameters_say(model, torch.device("cuda", 0)), _LossOnTheHost():
        # the model says it lives where the images do, as on a GPU (walk w8-05: a device type taken from
        # next(model.parameters()).device was failed here, though right on real hardware)
        images, labels = vc.to_device(x), vc.to_device(y)     # the labels live where the images do, as on a GPU
        _call_amp(amp_step, label, model, opt, scaler, images, labels, dtype=torch.float16, max_norm=1e9)
        waits = [s for s in vc.reads()]
    if waits:
        raise CheckFailed("reads nothing on the host besides the scaler's own check",
                          f"{label}: one call made the host wait for the device {len(waits)} time(s): "
                          + "; ".join(f"{s.what} at {s.where.rpartition('/')[2]}" for s in waits),
                          "torch.cuda.synchronize() (on any device), .cpu() or .item() in the step stops the host "
                          "until the device has run the step: it can no longer queue the next one meanwhile. "
                          "Return loss.detach() and let the caller read it when it logs")
    if not model.seen or model.seen[0] != (True, torch.float16):
        state = "off" if not model.seen or not model.seen[0][0] else f"on, to {model.seen[0][1]}"
        raise CheckFailed("autocasts on the images' device type",
                          f"{label}: during the forward pass CUDA autocast was {state} (seed {seed})",
                          "torch.autocast(device_type=images.device.type, dtype=dtype): take the device type "
                          "from the images (a device type written into the code is right on one machine only)")


def _defaults_case(amp_step, rng, seed):
    """amp_step(model, optimizer, scaler, images, labels): float16, and gradients clipped to 1.0."""
    d_in, n_classes = 12, 4
    x, y, _ = _blobs(rng, 32, d_in, n_classes, torch.device("cpu"))
    x = 5 * x                                   # large inputs: a gradient norm far above 1
    torch.manual_seed(int(rng.integers(0, 2**31)))
    model = _AutocastProbeNet(d_in, n_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=10**6)
    label = "amp_step(model, optimizer, scaler, images, labels), float16 scaler on cpu"
    with torch.autocast("cpu", dtype=torch.float16):
        probe = F.cross_entropy(model(x), y)
    probe.float().backward()
    raw = _grad_norm(list(model.parameters()))
    model.zero_grad(set_to_none=True)
    model.seen.clear()
    _call_amp(amp_step, label, model, opt, scaler, x, y)
    if not model.seen or model.seen[0] != (True, torch.float16):
        got = "off" if not model.seen or not model.seen[0][0] else f"on, to {model.seen[0][1]}"
        raise CheckFailed("defaults to dtype=torch.float16", f"{label}: autocast was {got} (seed {seed})",
                          "def amp_step(model, optimizer, scaler, images, labels, dtype=torch.float16, max_norm=1.0)")
    after = _grad_norm(list(model.parameters()))
    if raw > 2.0 and not math.isclose(after, 1.0, rel_tol=5e-2):
        raise CheckFailed("defaults to max_norm=1.0", f"{label}: gradient norm {raw:.3g}; after yours .grad has "
                          f"norm {after:.3g}, expected 1.0 (seed {seed})",
                          "def amp_step(model, optimizer, scaler, images, labels, dtype=torch.float16, max_norm=1.0)")


@exercise("5.1", "A mixed-precision training step with a GradScaler", points=2)
@forbids("course_utils.train:train", "course_utils.train:_step")
@single_threaded
def check_amp_step(amp_step):
    expect_callable(amp_step, "a function amp_step(model, optimizer, scaler, images, labels, dtype, max_norm)")
    rng, seed = fresh_rng()
    done = []
    for device in _devices():
        _amp_case(amp_step, rng, seed, device, torch.float16, use_scaler=True)
        done.append(f"float16 + scaler on {device.type}")
    if not torch.cuda.is_available():
        _autocast_follows_the_images(amp_step, rng, seed)
        done.append("CUDA autocast for images on a virtual GPU")
    _amp_case(amp_step, rng, seed, torch.device("cpu"), torch.bfloat16, use_scaler=False)
    done.append("bfloat16 with a disabled scaler on cpu")
    _defaults_case(amp_step, rng, seed)
    done.append("the defaults, float16 and max_norm=1.0")
    return ("forward under autocast, loss scaled with the scaler given, gradients unscaled, clipped, then stepped with, no "
            "host read besides the scaler's own, an inf gradient skips the step and halves the scale, the loss goes "
            f"down ({'; '.join(done)}).")


# -- 5.2 gradient accumulation -----------------------------------------------------------------

class _RecordingMLP(nn.Module):
    """float64, no BatchNorm: the gradient of a mean loss is exactly a weighted sum over micro-batches."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, 16), nn.Tanh(), nn.Linear(16, d_out)).double()
        self.batch_sizes = []
        self.backwards_before = []     # at each forward pass: how many backward passes had reached the model
        self.backwards = 0
        self.watch = self.meter = None  # GraphWatch and SavedTensorMeter, while the learner's function runs
        self.held_before = []          # at each forward pass: (graphs alive, saved bytes held)

    def forward(self, x):
        self.batch_sizes.append(int(x.shape[0]))
        self.backwards_before.append(self.backwards)
        if self.watch is not None:      # what the earlier micro-batches still hold as this one starts
            self.held_before.append((self.watch.alive, self.meter.live_bytes if self.meter else 0))
        out = self.net(x)
        if out.requires_grad:
            out.register_hook(self._backward_seen)
        return out

    def _backward_seen(self, grad):
        self.backwards += 1

    def clear_records(self):
        self.batch_sizes.clear()
        self.backwards_before.clear()
        self.held_before.clear()
        self.backwards = 0


def _full_batch(model, loss_fn, x, y):
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    model.clear_records()
    return float(loss.detach()), grads


def _saved_bytes(model, loss_fn, x, y) -> int:
    """What autograd saves for one forward pass of `x` (one micro-batch's activations)."""
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        out = loss_fn(model(x), y)
    held = meter.peak_bytes
    del out
    model.clear_records()
    return max(held, 1)


def _last_micro_batch_grads(model, loss_fn, x, y, k):
    """The gradient of the last micro-batch alone, weighted by its share: what .grad holds when the
    gradients are cleared inside the loop."""
    xs, ys = torch.tensor_split(x, k), torch.tensor_split(y, k)
    loss = loss_fn(model(xs[-1]), ys[-1]) * (len(xs[-1]) / len(x))
    grads = torch.autograd.grad(loss, list(model.parameters()))
    model.clear_records()
    return list(grads)


def _close_grads(a, b, rtol=1e-6, atol=1e-10):
    return all(ga is not None and torch.allclose(ga, gb, rtol=rtol, atol=atol) for ga, gb in zip(a, b))


@exercise("5.2", "Gradient accumulation gives the gradient of the big batch", points=2)
@single_threaded
def check_accumulation(accumulate_gradients):
    expect_callable(accumulate_gradients, "a function accumulate_gradients(model, loss_fn, images, labels, k)")
    rng, seed = fresh_rng()
    d_in, n_cls = 6, 3
    sizes = [(12, 1), (12, 4), (10, 3), (7, 7), (13, 5), (12, 5)]
    n = int(rng.integers(17, 41))
    sizes.append((n, int(rng.choice([k for k in range(2, n) if n % k]))))
    classify = lambda out, target: F.cross_entropy(out, target)  # noqa: E731
    regress = lambda out, target: F.mse_loss(out, target)        # noqa: E731
    for i, (n, k) in enumerate(sizes):
        torch.manual_seed(int(rng.integers(0, 2**31)))
        model = _RecordingMLP(d_in, n_cls)
        x = torch.tensor(rng.normal(size=(n, d_in)))
        if i % 2 == 0:
            loss_fn, y, kind = classify, torch.tensor(rng.integers(0, n_cls, size=n)), "cross-entropy"
        else:
            loss_fn, y, kind = regress, torch.tensor(rng.normal(size=(n, n_cls))), "mean squared error"
        what = f"batch of {n}, k={k}, {kind} (seed {seed})"
        full_loss, full_grads = _full_batch(model, loss_fn, x, y)
        one_micro_batch = _saved_bytes(model, loss_fn, torch.tensor_split(x, k)[0], torch.tensor_split(y, k)[0])
        for p in model.parameters():               # stale gradients from an earlier step
            p.grad = torch.full_like(p, 0.5)
        params_before = [p.detach().clone() for p in model.parameters()]
        watch = GraphWatch()
        with SavedTensorMeter(exclude=model.parameters()) as meter:
            model.watch, model.meter = watch, meter
            try:
                with _SyncAndCopyCounter(host_reads=True) as syncs:     # a copy to the host counts, as on a GPU
                    result = accumulate_gradients(model, watch.wrap(loss_fn), x, y, k)
            finally:
                model.watch = model.meter = None

        seen = list(model.batch_sizes)
        if len(seen) != k or sum(seen) != n or max(seen) > math.ceil(n / k):
            split = [len(part) for part in torch.tensor_split(x, k)]
            whole_too = seen.count(n) > split.count(n) and sorted(seen) == sorted(split + [n])
            raise CheckFailed("runs k micro-batches", f"{what}: yours ran forward passes on batches of {seen}; "
                              f"expected {k} micro-batch{'es' if k != 1 else ''} of at most {math.ceil(n / k)} "
                              f"sample{'s' if math.ceil(n / k) != 1 else ''} covering all {n}"
                              + (f", and no forward pass of the whole batch of {n}" if whole_too else ""),
                              "the loss to return is the sum of the weighted micro-batch losses you already "
                              "computed (each loss.detach(), added up on the device, read once): a forward pass of "
                              "the whole batch to get it costs the memory accumulation exists to save"
                              if whole_too else
                              "torch.tensor_split(images, k) and torch.tensor_split(labels, k)")
        expected_sizes = [len(part) for part in torch.tensor_split(x, k)]
        if seen != expected_sizes:
            raise CheckFailed("runs k micro-batches", f"{what}: yours ran forward passes on batches of {seen}; "
                              f"torch.tensor_split gives {expected_sizes} (the first ones get one sample more)",
                              "torch.tensor_split(images, k) and torch.tensor_split(labels, k), in their order")
        if not all(trusted.torch_equal(a, p.detach()) for a, p in zip(params_before, model.parameters())):
            raise CheckFailed("only computes gradients", f"{what}: the parameters changed; the optimizer step "
                              "is not part of this function")
        grads = [p.grad for p in model.parameters()]
        if any(g is None for g in grads):
            raise CheckFailed("leaves the gradients in .grad", f"{what}: some parameters have no .grad")
        if not _close_grads(grads, full_grads):
            stale = [p.grad.detach() - 0.5 for p in model.parameters()]
            if _close_grads(stale, full_grads):
                hint = "gradients accumulate into .grad: clear them first (model.zero_grad(set_to_none=True))"
            elif _close_grads(grads, [g * k for g in full_grads]):
                hint = "each micro-batch loss is a mean: scale it down before backward, or the sum is k times too big"
            elif _close_grads(grads, _last_micro_batch_grads(model, loss_fn, x, y, k)):
                hint = ("only the last micro-batch's gradient is left in .grad: a zero_grad inside the loop clears "
                        "the earlier ones. Clear once, before the loop; backward() adds to .grad")
            elif n % k:
                hint = ("the micro-batches are not all the same size here: weight each micro-batch's loss by "
                        "its share of the samples, len(micro_batch) / len(images), not by 1/k")
            else:
                hint = "backward() on loss_fn(model(xb), yb) * len(xb) / len(images) for each micro-batch"
            worst = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) for a, b in zip(grads, full_grads))
            raise CheckFailed("gives the gradient of the full batch",
                              f"{what}: yours differs from the full-batch gradient by up to {worst:.2%} "
                              "of its largest entry", hint)
        late = [j for j, before in enumerate(model.backwards_before) if before < j]
        if late:
            j = late[0]
            raise CheckFailed("runs backward on each micro-batch before the next forward pass",
                              f"{what}: when micro-batch {j} went forward, {model.backwards_before[j]} backward "
                              f"pass{'es' if model.backwards_before[j] != 1 else ''} had run, not {j}: the graphs "
                              "of the earlier micro-batches were all alive at once",
                              "call backward() on each micro-batch's weighted loss as soon as you have it: that "
                              "frees its graph (the saved activations) and adds its gradient to .grad. One "
                              "backward over the summed loss gives the same gradient with the memory of the "
                              "whole batch, which accumulation exists to avoid")
        graphs_kept = max((alive for alive, _ in model.held_before), default=0)
        if graphs_kept > 1:
            raise CheckFailed("keeps no micro-batch's graph after its backward",
                              f"{what}: when the last micro-batch went forward, the graphs of {graphs_kept} earlier "
                              "micro-batches were still alive (1 is the one `loss` still names)",
                              "a running total or a list of the losses themselves keeps each micro-batch's autograd "
                              "graph alive to the end: add loss.detach() (total = total + loss.detach()), and read "
                              "the total once")
        held = max((nbytes for _, nbytes in model.held_before[1:]), default=0)
        if held > 0.25 * one_micro_batch:
            raise CheckFailed("frees each micro-batch's activations in its backward",
                              f"{what}: when a micro-batch went forward, the activations saved by the one before it "
                              f"were still held ({held / one_micro_batch:.1f} micro-batches' worth)",
                              "backward() frees the activations it used unless retain_graph=True keeps them: then "
                              "they live as long as `loss` does, through the next micro-batch's forward pass, and the "
                              "memory is no longer one micro-batch's. Drop retain_graph")
        if isinstance(result, torch.Tensor):
            raise CheckFailed("returns the loss as a Python float",
                              f"{what}: yours returned a tensor{' that still holds the graph' if result.requires_grad else ''}",
                              "sum the detached weighted losses on the device, then one .item() at the end")
        loss = _as_float(result, f"accumulate_gradients ({what})")
        if (math.isclose(loss, full_loss, rel_tol=1e-5, abs_tol=1e-9)
                and not math.isclose(loss, full_loss, rel_tol=1e-11, abs_tol=1e-14)):
            # the model is float64: a float32 running total keeps 7 of its digits (walk w8-05, 52_float32_total)
            raise CheckFailed("returns the full batch's loss in the model's precision",
                              f"{what}, a float64 model: yours {loss!r}, expected {full_loss!r} (off by "
                              f"{abs(loss - full_loss) / abs(full_loss):.1e} of it: float32's rounding)",
                              "make the running total in the loss's dtype (torch.zeros((), dtype=loss.dtype, "
                              "device=...), or start from the first loss.detach()): a float32 total rounds a float64 "
                              "model's loss to 7 digits")
        if not math.isclose(loss, full_loss, rel_tol=1e-6, abs_tol=1e-9):
            raise CheckFailed("returns the full batch's loss", f"{what}: yours {loss:.6f}, expected {full_loss:.6f}",
                              "add up the weighted micro-batch losses as detached tensors on the device (total += loss.detach()) "
                              "and read the total once at the end")
        if syncs.count > 1:
            raise CheckFailed("reads the loss from the device once", f"{what}: yours made {syncs.count} synchronising "
                              f"calls ({', '.join(f'{n} x{c}' for n, c in syncs.by_name().items())}); one is enough",
                              "keep the running total as a detached tensor (total = total + loss.detach()) and "
                              "read it with one .item() at the end: on a GPU each .item(), float(), .cpu() or "
                              ".to('cpu') waits for the device")
    _accumulation_on_a_device(accumulate_gradients, rng, seed)
    return (f"equal to the full-batch gradient and loss for {len(sizes)} (batch, k) pairs, uneven splits included; "
            "each micro-batch's graph and activations freed by its backward before the next went forward; the loss "
            "read once, also on a (virtual) CUDA device.")


def _accumulation_on_a_device(accumulate_gradients, rng, seed):
    """The same work with the model and the batch on the virtual CUDA device for training steps: what
    lives on the host fails as on a GPU, and every wait of the host for the device is counted."""
    from .virtual_cuda_training import VirtualCudaTraining
    n, k, d_in, n_cls = 13, 4, 6, 3
    torch.manual_seed(int(rng.integers(0, 2**31)))
    model = _RecordingMLP(d_in, n_cls)
    x = torch.tensor(rng.normal(size=(n, d_in)))
    y = torch.tensor(rng.integers(0, n_cls, size=n))
    what = f"batch of {n}, k={k}, cross-entropy, on a (virtual) CUDA device (seed {seed})"
    loss_fn = lambda out, target: F.cross_entropy(out, target)     # noqa: E731
    full_loss, full_grads = _full_batch(model, loss_fn, x, y)
    with VirtualCudaTraining() as vc:
        vc.put_module(model)
        vc.put(x), vc.put(y)
        try:
            result = accumulate_gradients(model, loss_fn, x, y, k)
        except RuntimeError as exc:
            if "same device" not in str(exc):
                raise
            raise CheckFailed("keeps its running total on the device",
                              f"{what}: yours raised: {str(exc)[:200]}",
                              "make the total where the batch lives: torch.zeros((), dtype=torch.float64, "
                              "device=images.device); a tensor made without device= is in host memory, and a GPU's "
                              "loss cannot be added into it") from None
        syncs = list(vc.syncs)
        with vc.quiet():
            grads = [p.grad for p in model.parameters()]
            ok = not any(g is None for g in grads) and _close_grads(grads, full_grads)
            loss = None if isinstance(result, torch.Tensor) else result
    if len(syncs) > 1:
        raise CheckFailed("reads the loss from the device once",
                          f"{what}: yours waited for the device {len(syncs)} times "
                          f"({'; '.join(dict.fromkeys(f'{s.what} at line {s.where.rpartition(chr(58))[2]}' for s in syncs))})",
                          "keep the running total as a detached tensor on the device (total += loss.detach()) and "
                          "read it with one .item() at the end: a .cpu() or .item() per micro-batch waits for the "
                          "device each time")
    if not ok or loss is None or not math.isclose(_as_float(loss, f"accumulate_gradients ({what})"), full_loss,
                                                  rel_tol=1e-6, abs_tol=1e-9):
        raise CheckFailed("gives the gradient of the full batch", f"{what}: the gradient or the loss differs from "
                          "the full batch's on the device, though they matched on the CPU")


# -- 5.3 the largest batch that fits -------------------------------------------------------------

class _ProbeMisuse(Exception):
    pass


def make_probe(threshold, cap):
    """`fits(b)`, True for 1 <= b <= threshold: a monotone stand-in for 'does a step of b fit?',
    and the list of the sizes it was asked about. A plain function: nothing on it tells the
    threshold."""
    calls = []

    def fits(batch_size):
        if isinstance(batch_size, bool) or isinstance(batch_size, float):
            raise _ProbeMisuse(f"fits({batch_size!r}): batch sizes are whole numbers")
        try:
            b = operator.index(batch_size)
        except TypeError:
            raise _ProbeMisuse(f"fits({batch_size!r}): batch sizes are whole numbers") from None
        if not 1 <= b <= cap:
            raise _ProbeMisuse(f"fits({b}) with cap={cap}: probe only sizes from 1 to cap")
        calls.append(b)
        return b <= threshold

    return fits, calls


def probe_budget(answer: int) -> int:
    """Probes allowed to find `answer`: 2 * ceil(log2(answer + 1)) + 2."""
    return 2 * math.ceil(math.log2(answer + 1)) + 2


@exercise("5.3", "The largest batch that fits, in few probes", points=2)
def check_largest_batch(largest_batch):
    expect_callable(largest_batch, "a function largest_batch(fits, cap) -> int")
    rng, seed = fresh_rng()
    cases = [(0, 1, "nothing fits, cap 1"), (1, 1, "cap 1 and it fits"), (0, 1000, "nothing fits"),
             (1000, 1000, "everything up to cap=1000 fits"), (1024, 1024, "everything up to cap=1024 fits"),
             (1, 4096, "only batch 1 fits"), (255, 256, "all but the cap fit"), (256, 2**20, "a power of two"),
             # a cap just under a power of two that does not fit: a search whose upper end is cap + 1 asks cap again
             (2, 3, "all but the cap fit"), (1022, 1023, "all but the cap fit")]
    for _ in range(60):
        cap = int(2 ** rng.uniform(1, 20))
        threshold = min(int(2 ** rng.uniform(0, math.log2(cap) + 0.5)), cap)
        cases.append((threshold, cap, "a random threshold"))
    worst, first_settled = 0.0, None
    for threshold, cap, what in cases:
        probe, calls = make_probe(threshold, cap)
        label = f"{what} (fits up to {threshold}, cap {cap}; seed {seed})"
        try:
            answer = largest_batch(probe, cap)
        except _ProbeMisuse as exc:
            raise CheckFailed("probes only valid batch sizes", f"{label}: yours called {exc}") from None
        if isinstance(answer, bool) or not isinstance(answer, (int, np.integer)):
            raise CheckFailed("returns a whole number", f"{label}: yours returned {answer!r:.40}")
        if not calls:
            raise CheckFailed("finds the answer with its own probes",
                              f"{label}: yours returned {int(answer)} without calling fits once",
                              "every call searches with the fits it is handed, from fits(1) on (batch 1 may not fit "
                              "either); an answer kept from an earlier call (a cache keyed by cap, a default "
                              "argument) is another model's, or another memory's")
        unasked = [b for b in (int(answer), int(answer) + 1) if 1 <= b <= cap and b not in calls]
        if int(answer) != threshold and int(answer) in unasked:
            raise CheckFailed("finds the largest batch that fits",
                              f"{label}: yours {int(answer)}, expected {threshold}: yours returned {int(answer)} "
                              f"without asking fits({int(answer)})",
                              "return only a size fits() said yes to (and 0 when fits(1) says no): "
                              + ("batch 1 may not fit either" if int(answer) == 1 else "a size never probed is a "
                                 "guess"))
        if int(answer) != threshold:
            hint = ("yours is one more than the answer: the first size that did not fit (or cap + 1); return the "
                    "last size that fit" if int(answer) == threshold + 1 else
                    "return 0 when even batch 1 does not fit" if threshold == 0 else
                    "the answer may be cap itself: make sure the search can reach it" if threshold == cap else
                    "keep the invariant fits(good) and not fits(bad), and stop when bad == good + 1")
            raise CheckFailed("finds the largest batch that fits", f"{label}: yours {int(answer)}, expected {threshold}", hint)
        if unasked:
            raise CheckFailed("finds the answer with its own probes",
                              f"{label}: yours returned the right size, {threshold}, but never asked "
                              f"{' nor '.join(f'fits({b})' for b in unasked)}: nothing this call probed shows it",
                              "the answer is the size that fits with the next one that does not (or cap): probe "
                              "both; an answer kept from an earlier call (a cache keyed by cap) is another model's")
        budget = probe_budget(threshold)
        worst = max(worst, len(calls) / budget)
        if len(calls) > budget:
            raise CheckFailed("uses few probes", f"{label}: yours probed {len(calls)} times "
                              f"({', '.join(map(str, calls[:12]))}{', ...' if len(calls) > 12 else ''}); "
                              f"the budget is 2*ceil(log2({threshold}+1))+2 = {budget}",
                              "double the batch size from 1 until it stops fitting (or passes cap), then "
                              "binary-search between the last size that fit and the first that did not")
        too_big = [b for b in calls if b > 4 * (threshold + 1)]
        if too_big:
            raise CheckFailed("probes no size far above the answer",
                              f"{label}: yours probed {too_big[0]}, more than 4 x (answer + 1) = {4 * (threshold + 1)} "
                              f"(probes: {', '.join(map(str, calls[:12]))}{', ...' if len(calls) > 12 else ''})",
                              "start small and grow (1, 2, 4, ...): a probe that does not fit is a step that ran out "
                              "of memory, and the bigger it is the more it allocated first; probing cap first is "
                              "the most expensive failure there is")
        found = _settled_probe(calls, threshold)
        if found is not None and first_settled is None:     # reported after every other property, on every case
            first_settled = (label, calls, *found)
    if first_settled is not None:
        label, calls, i, b, lo, hi = first_settled
        known = (f"fits({lo}) had said yes" if b <= lo else f"fits({hi}) had said no")
        raise CheckFailed("asks nothing its earlier probes already answered",
                          f"{label}: probe {i + 1} asked fits({b}) after {known} (probes: "
                          f"{', '.join(map(str, calls[:12]))}{', ...' if len(calls) > 12 else ''})",
                          "each probe is a training step, and fits is monotone: a size at or below one that fit "
                          "fits, one at or above a size that did not does not. Search only between the last "
                          "size that fit and the first that did not (not from 1 again), and return the last "
                          "size that fit without asking it again")
    return (f"right on {len(cases)} monotone probes, edges included, each answer shown by its own probes, none far "
            f"above the answer, none asked twice or already answered, using at most {worst:.0%} of the probe budget.")


def _settled_probe(calls, threshold):
    """(index, size, largest yes, smallest no) of the first probe whose answer the earlier ones settled, or None."""
    lo, hi = 0, math.inf
    for i, b in enumerate(calls):
        if b <= lo or b >= hi:
            return i, b, lo, hi
        if b <= threshold:
            lo = b
        else:
            hi = b
    return None


# -- 5.4 fix a loop that keeps graphs and syncs every step ---------------------------------------

class _SmallConvNet(nn.Module):
    def __init__(self, classes: int = 5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16, classes)
        self.grads_at_forward = []

    def forward(self, x):
        self.grads_at_forward.append(sum(p.grad is not None for p in self.parameters()))
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _names_the_host(args, kwargs) -> bool:
    """A Tensor.to(...) that copies a would-be device tensor to the host: its target is written as the host
    ("cpu", torch.device("cpu")). Here the learner's tensors stand for a GPU's, so .to(images.device),
    .to(loss.device) or .to(other_tensor) names the device the tensor is already on: a no-op there, no copy
    and no wait (walk w8-05: the course's own train._step does labels.to(images.device)); SyncCounter on a
    GPU does not count it either."""
    if not _to_host(args, kwargs):
        return False
    targets = [c for c in list(args[1:]) + [kwargs.get("device")] if isinstance(c, (str, torch.device))]
    if any(isinstance(c, str) for c in targets):
        return True
    # a torch.device: the host written in the caller's line (torch.device("cpu")), not a tensor's .device
    frame = sys._getframe(2)
    while frame is not None and "/torch/" in frame.f_code.co_filename.replace("\\", "/"):
        frame = frame.f_back
    if frame is None:
        return True
    import linecache
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    devices = [c for c in targets if isinstance(c, torch.device)]
    # HOST = torch.device("cpu") at module level; not the notebook's own `device` (the GPU's, where there is one)
    named_outside = any(v is d and any(w in k.lower() for w in ("cpu", "host"))
                        for d in devices for k, v in list(frame.f_globals.items()))
    return "cpu" in line or not line or named_outside


class _MovesCountMode(_CountingMode):
    """SyncCounter's mode, plus: with host_reads, a copy of a tensor to the host (.cpu(),
    .to("cpu")) counts as the synchronisation it would be on a GPU, and what it returns is on
    the host (reading it costs nothing more)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        counter = self.counter
        if (counter.host_reads and isinstance(first, torch.Tensor) and first.device.type == "cpu"
                and (name == "cpu" or (name == "to" and _names_the_host(args, kwargs)))
                and not counter._is_on_host(first) and not counter._paused
                and "/torch/" not in sys._getframe(1).f_code.co_filename.replace("\\", "/")):
            # (torch's own moves of host tensors, a GradScaler's scale put beside a CPU loss, are not the learner's)
            counter._record(name)
            result = func(*args, **kwargs)
            if isinstance(result, torch.Tensor):
                counter._mark_on_host(result)
            return result
        if name in ("tensor", "as_tensor") and args and isinstance(args[0], (list, tuple)) and not counter._paused:
            # torch.tensor(window) of device scalars copies each one to the host, inside torch's own code
            # (walk w4-05): one wait per element on a GPU, which the value reads above never see
            on_device = [t for t in torch.utils._pytree.tree_leaves(args[0]) if isinstance(t, torch.Tensor)
                         and (t.device.type != "cpu" or (counter.host_reads and not counter._is_on_host(t)))]
            for _ in on_device:
                counter._record("torch.tensor(a list of device tensors)")
        result = super().__torch_function__(func, types, args, kwargs)
        if counter._on_host and isinstance(result, torch.Tensor) and result.device.type == "cpu":
            # what is computed from tensors already copied to the host is on the host too: reading it
            # waits for nothing (float(torch.stack(window).cpu().mean()), walk w4-05)
            inputs = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if inputs and all(counter._is_on_host(t) for t in inputs):
                counter._mark_on_host(result)
        return result


class _SyncAndCopyCounter(SyncCounter):
    """SyncCounter that also counts copies to the host of would-be device tensors (see above)."""

    def __enter__(self):
        from .. import syncs
        original, syncs._CountingMode = syncs._CountingMode, _MovesCountMode
        try:
            return super().__enter__()
        finally:
            syncs._CountingMode = original


@contextlib.contextmanager
def _pretend_a_gpu():
    """Without a GPU: torch.cuda.is_available() answers True while the learner's loop runs, so that a
    branch written for a GPU (`if torch.cuda.is_available(): torch.cuda.synchronize()`) runs and is
    counted; the waits themselves do nothing here."""
    if torch.cuda.is_available():
        yield
        return
    stack = contextlib.ExitStack()
    targets = [(torch.cuda, "is_available", lambda: True), (torch.cuda, "device_count", lambda: 1),
               (torch.cuda, "synchronize", lambda device=None: None), (torch.cuda, "empty_cache", lambda: None)]
    if hasattr(getattr(torch, "accelerator", None), "synchronize"):
        targets.append((torch.accelerator, "synchronize", lambda device=None: None))
    for module, name, value in targets:
        stack.callback(setattr, module, name, getattr(module, name))
        setattr(module, name, value)
    with stack:
        yield


def _loop_case(train_fixed, rng, seed, device):
    log_every = int(rng.integers(4, 9))   # >= 4: a running sum with graphs then holds 3 or more
    steps = log_every * int(rng.integers(3, 5)) + int(rng.integers(1, log_every))   # always a partial interval
    torch.manual_seed(int(rng.integers(0, 2**31)))
    model = _SmallConvNet().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    n_steps = [0]
    opt.register_step_post_hook(lambda *_: n_steps.__setitem__(0, n_steps[0] + 1))
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    batches = [(torch.randn(8, 3, 16, 16, generator=gen).to(device), torch.randint(0, 5, (8,), generator=gen).to(device))
               for _ in range(steps)]
    label = f"{steps} steps, log_every={log_every} on {device.type} (seed {seed})"

    # how much one step's graph holds, to tell 'one graph' from 'a graph per step'
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        out = model(batches[0][0])
    one_graph = max(meter.peak_bytes, 1)
    del out
    model.grads_at_forward.clear()

    watch = GraphWatch()
    syncs = _SyncAndCopyCounter(host_reads=device.type == "cpu")
    recorded = []

    from torch.multiprocessing.reductions import StorageWeakRef
    kept_losses, most_kept = [], [0]     # earlier steps' losses (their memory) still alive at each step (w3-05)
    alive_at = []                        # at each step's loss: which earlier steps' losses were alive (w7-05 w54_20)

    def loss_fn(logits, labels):
        loss = F.cross_entropy(logits, labels)
        with syncs.paused():
            recorded.append(loss.detach().clone())
            alive = [j for j, r in enumerate(kept_losses) if not r.expired()]
            most_kept[0] = max(most_kept[0], len(alive))
            alive_at.append(alive)
            kept_losses.append(StorageWeakRef(loss.untyped_storage()))
        return watch.mark(loss)

    printed = _StampedOut(lambda: len(recorded))
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        readings = StepReadings(batches, lambda: (watch.alive, meter.live_bytes))
        with (_pretend_a_gpu() if device.type == "cpu" else contextlib.nullcontext()), syncs, \
                contextlib.redirect_stdout(printed):
            try:
                result = train_fixed(model, opt, readings, loss_fn, log_every=log_every)
            except (RuntimeError, AssertionError) as exc:
                if device.type != "cpu" or not ("NVIDIA driver" in str(exc) or "compiled with CUDA" in str(exc)):
                    raise
                line = _line_naming_cuda(train_fixed)
                raise CheckFailed("makes its tensors on the device of the inputs given",
                                  f"{label}: yours made a tensor on 'cuda'{line}: this CPU run answers "
                                  "torch.cuda.is_available() True (so that a GPU-only branch runs and its waits are "
                                  "counted), while the model and the batches are on the CPU; torch then said: "
                                  f"{str(exc).strip().splitlines()[0][:120]}",
                                  "take the device from what you are given (loss.detach() starts a total where the "
                                  "loss is; or device=loss.device, images.device): a device chosen by "
                                  "torch.cuda.is_available() is wrong whenever the inputs are elsewhere") from None
        if watch.alive:
            gc.collect()                   # a reference cycle that garbage collection frees is not a keep
        alive_after = watch.alive
    n_logs = steps // log_every

    if not isinstance(result, (list, tuple)):
        raise CheckFailed("returns a list of interval means", f"{label}: yours returned {type(result).__name__}")
    if any(isinstance(v, torch.Tensor) for v in result):
        raise CheckFailed("returns Python floats", f"{label}: yours returned tensors",
                          "read each interval's mean once, with .item()")
    kept = _mutable_defaults(train_fixed)
    if len(result) > n_logs and kept:
        raise CheckFailed("keeps nothing between calls", f"{label}: yours returned {len(result)} values, expected "
                          f"the means of {n_logs} intervals", _kept_hint(kept))
    _no_shared_list(train_fixed, result, n_logs, label, seed)
    if len(result) != n_logs:
        first_alone = (len(result) > n_logs and len(recorded) > 0 and isinstance(result[0], (int, float))
                       and math.isclose(float(result[0]), float(recorded[0]), rel_tol=1e-4, abs_tol=1e-6))
        raise CheckFailed("logs once per complete interval", f"{label}: yours returned {len(result)} values, "
                          f"expected {n_logs}: one after step {log_every}, {2 * log_every}, ... of {steps} "
                          f"(the {steps % log_every} steps left at the end make no interval)"
                          + ("; your first value is the first step's loss alone" if first_alone else ""),
                          "count the steps from 1 (enumerate(batches, start=1)): with steps counted from 0, "
                          "step 0 % log_every == 0 logs after the very first step" if first_alone else
                          "log when step % log_every == 0, steps counted from 1, and only then")
    if len(recorded) != steps or n_steps[0] != steps:
        raise CheckFailed("trains on every batch", f"{label}: loss_fn called {len(recorded)} times and "
                          f"optimizer.step {n_steps[0]} times, expected {steps} each",
                          "one loss_fn(model(images), labels), backward and optimizer.step per batch")
    graphs = [g for g, _ in readings.values]
    if max(graphs) > 2:
        raise CheckFailed("keeps no graph past its step", f"{label}: up to {max(graphs)} steps' autograd graphs were "
                          "alive at once (1 is the step in progress)",
                          "keep loss.detach() (or a number), never the loss itself, in lists and running sums")
    if alive_after:                      # the last step's graph, kept past the return (an attribute, a global; w7-05 w54_16)
        raise CheckFailed("keeps no graph past its step",
                          f"{label}: after train_fixed had returned, "
                          + ("1 step's autograd graph was" if alive_after == 1 else
                             f"{alive_after} steps' autograd graphs were") + " still alive",
                          "something the loop keeps beyond the call (an attribute such as train_fixed.last_loss, a "
                          "global, a list made outside it) holds the loss itself, and with it the step's graph: keep "
                          "loss.detach() (or a number) there, or nothing; check 5.1 refuses the same")
    held = [b for _, b in readings.values]
    if max(held) > 1.5 * one_graph:
        raise CheckFailed("memory stays flat over the steps",
                          f"{label}: the activations saved for backward grew to {max(held) / one_graph:.1f} steps' worth",
                          "do not use retain_graph=True, and keep no tensor that still has a graph")
    if max(held[1:], default=0) > 0.5 * one_graph:
        raise CheckFailed("frees each step's saved activations in backward",
                          f"{label}: between steps, the activations of the previous step were still held "
                          f"({max(held[1:]) / one_graph:.1f} steps' worth) while the next batch was fetched",
                          "backward() frees the activations it used, unless retain_graph=True asks it to keep "
                          "them: then they live as long as `loss` does, through the next forward pass, at the "
                          "memory peak. Drop retain_graph (one backward per graph needs none)")
    if most_kept[0] > log_every:
        raise CheckFailed("keeps each loss only until its interval is logged",
                          f"{label}: at one step {most_kept[0]} earlier steps' losses were still alive; a window "
                          f"of log_every={log_every} holds at most {log_every}",
                          "clear the window once its mean is read (window.clear(), or window = []): a window that "
                          "keeps every step's loss, even detached, holds one device tensor per step for the whole "
                          "run (a block of the GPU's memory each), and window[-log_every:] reads the right ones "
                          "but frees none")
    allowed = n_logs
    if syncs.count > allowed:
        names = ", ".join(f"{k} x{v}" for k, v in syncs.by_name().items()) or f"{syncs.cuda_warnings} flagged by CUDA"
        listed = any(c.startswith("torch.tensor(") for c in syncs.calls)
        by_name = syncs.by_name()
        emptied = next((v for k, v in by_name.items() if "empty_cache" in k), 0)
        # walk w9-05 (w54_13): empty_cache once per interval is no read, and a hint about reads pointed elsewhere
        emptied_note = (f"torch.cuda.empty_cache() is {emptied} of these waits: it is no read, but it waits for "
                        "the device to hand its cached memory back, and the next steps then allocate that memory "
                        "again. Drop it: the loop's memory stays flat without it (clearing the window frees the "
                        "losses for reuse)" if emptied else "")
        if emptied and emptied == syncs.count - min(by_name.get("item", 0), n_logs) and emptied <= n_logs \
                and syncs.count - emptied <= allowed:
            hint = emptied_note + "; the one .item() per interval that reads the mean is all the loop needs"
        elif not listed and by_name and syncs.count < steps and syncs.count <= 3 * max(n_logs, 1):
            # a few reads at each logging, not one per step (w5-05: a guard on the mean tensor, a synchronize)
            extra = []
            if any(k in by_name for k in ("__bool__", "is_nonzero")):
                extra.append("a guard on a tensor (if torch.isnan(mean_tensor)) is a read of its own: guard on the "
                             "float you read (if not mean < 100: raise ...)")
            if any("synchronize" in k for k in by_name):
                extra.append("a synchronize before .item() is a wait .item() makes anyway")
            if emptied:
                extra.append(emptied_note)
            hint = (f"yours reads at the logging, not per step, but {syncs.count} times for {n_logs} intervals: read "
                    "each interval's mean once, mean = torch.stack(window).mean().item(), and do everything else "
                    "(the print, a divergence guard, the list) with that float" + "".join("; " + e for e in extra))
        else:
            hint = (("torch.tensor(window) of device tensors copies each one to the host, a wait per step's "
                     "loss: torch.stack(window) keeps them on the device, and " if listed else "")
                    + ("loss.cpu() or .to('cpu') copies the loss to the host, a wait per step: " if
                       any(k in by_name for k in ("cpu", "to")) else "")
                    + "collect loss.detach() of each step on the device and read the interval's mean with one "
                    ".item(); no print(loss), float(loss), .item(), .cpu() or torch.cuda.empty_cache() per step"
                    + (f" (yours called torch.cuda.empty_cache() {emptied} times: drop it, it waits for the device "
                       "and hands back memory the next steps allocate again)" if emptied else ""))
        raise CheckFailed("synchronises at most once per logging interval",
                          f"{label}: yours made {syncs.count} synchronising calls ({names}); at most {allowed} allowed",
                          hint)
    losses = torch.stack(recorded).float().cpu().numpy()
    expected = [float(losses[i * log_every:(i + 1) * log_every].mean()) for i in range(n_logs)]
    yours = [float(v) for v in result]
    if not np.allclose(yours, expected, rtol=1e-4, atol=1e-6):
        i = next(i for i, (a, b) in enumerate(zip(yours, expected)) if not math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6))
        lo, hi = i * log_every, (i + 1) * log_every
        seen = []
        if any(math.isclose(yours[i], m, rel_tol=1e-4, abs_tol=1e-6) for m in
               (float(np.median(losses[lo:hi])), float(np.sort(losses[lo:hi])[(log_every - 1) // 2]))):
            seen.append("yours is their median")
        elif math.isclose(yours[i], float(losses[hi - 1]), rel_tol=1e-4, abs_tol=1e-6):
            seen.append("yours is the last loss of the interval alone")
        elif math.isclose(yours[i], float(losses[:hi].mean()), rel_tol=1e-4, abs_tol=1e-6):
            seen.append("yours is the mean of every loss so far")
        elif log_every > 2 and math.isclose(yours[i], float(np.sort(losses[lo:hi])[1:-1].mean()), rel_tol=1e-4,
                                            abs_tol=1e-6):
            seen.append("yours is their mean without the smallest and the largest: a trimmed mean")
        else:
            for shift in (-1, 1):
                if 0 <= lo + shift and hi + shift <= len(losses) and math.isclose(
                        yours[i], float(losses[lo + shift:hi + shift].mean()), rel_tol=1e-4, abs_tol=1e-6):
                    seen.append(f"yours is the mean of steps {lo + shift + 1} to {hi + shift}, one step "
                                f"{'early' if shift < 0 else 'late'}")
        state = ""
        if kept:
            state = (f". Your default argument {kept[0]}=[] is made once, when `def` runs: it is a window kept "
                     "between calls, which starts a call with the losses the last one left over")
        elif _shared_lists(train_fixed) and _shared_count(train_fixed, _shared_lists(train_fixed)[0]):
            state = f". Your loop uses {_shared_lists(train_fixed)[0]}, a step count kept outside the call: " + _COUNT_HINT
        elif i == 0 and not seen and _shared_lists(train_fixed):
            name = _shared_lists(train_fixed)[0]
            state = (f". Your loop uses {name}, a step count kept outside the call: " + _COUNT_HINT
                     if _shared_count(train_fixed, name) else
                     f". Your loop uses {name}, {_shared_kind(train_fixed, name)} that outlives the call: a window kept "
                     "between calls starts a call with the losses the last one left over")
        raise CheckFailed("logs the mean loss of each interval", f"{label}: interval {i + 1} (steps {lo + 1} to "
                          f"{hi}): yours {yours[i]:.5f}, expected their mean {expected[i]:.5f}"
                          + (f" ({seen[0]})" if seen else ""),
                          f"the mean of the {log_every} losses of steps {lo + 1} to {hi} (steps counted from 1), "
                          "and only those: collect each step's loss.detach() in a window, and at step % log_every "
                          "== 0 read torch.stack(window).mean().item() and clear the window" + state)
    stale = model.grads_at_forward[1:]
    if any(stale):
        raise CheckFailed("frees the gradients between steps",
                          f"{label}: at the forward pass of a later step, {max(stale)} parameters still had a .grad",
                          "optimizer.zero_grad(set_to_none=True) at the start of each step: this loop's contract is "
                          "its memory, and zeros written in place keep every gradient allocated through the next "
                          "forward pass, beside its activations (exercises 5.1 and 5.2 ask only that no earlier "
                          "gradient leak in, and accept the zeros)")
    where = []
    missing = _unprinted(printed.getvalue(), expected, where)
    if missing is None:     # each mean printed as its interval ends (or during the next one): a diverging run shows
        for i, offset in enumerate(where):                             # while it runs (w6-05 w54_18)
            at = printed.steps_at(offset)
            if at > (i + 2) * log_every:
                raise CheckFailed("prints each interval's mean when the interval ends",
                                  f"{label}: the mean of interval {i + 1} (steps {i * log_every + 1} to "
                                  f"{(i + 1) * log_every}) was printed after step {at}: yours prints the means "
                                  "later than the interval that made them; read and printed only at the end, a run that "
                                  "diverges shows nothing until it is over",
                                  "read and print each interval's mean once, when step % log_every == 0: one read per "
                                  "interval is the cost of watching the run")
        for i, offset in enumerate(where):       # once a mean is printed, its interval's losses go (w7-05 w54_20)
            at = printed.steps_at(offset)
            first, last = i * log_every, (i + 1) * log_every - 1      # 0-based steps of interval i + 1
            if at >= len(alive_at):
                continue
            # at the next step's loss: none of them alive, but the last step's, which `loss` still names
            outlived = [j for j in alive_at[at] if first <= j <= last and j != at - 1]
            if outlived:
                raise CheckFailed("keeps each loss only until its interval is logged",
                                  f"{label}: the mean of interval {i + 1} (steps {first + 1} to {last + 1}) was "
                                  f"printed at step {at}, and at step {at + 1} {len(outlived)} of that interval's "
                                  f"losses were still alive",
                                  "clear the window once its mean is read (window.clear(), or window = []): a "
                                  "deque(maxlen=log_every), or a window cleared later, keeps each interval's "
                                  "losses into the next interval, one device tensor each")
    if missing is not None:
        i, mean = missing
        shown = printed.getvalue().strip().splitlines()
        raise CheckFailed("prints each interval's mean",
                          f"{label}: the mean of interval {i + 1} is {mean:.5f}, and no number printed "
                          f"{'after the one before it ' if i else ''}rounds to it (yours printed "
                          f"{len(shown)} line{'s' if len(shown) != 1 else ''}"
                          f"{': ' + repr(shown[0][:60]) if shown else ''}{' ...' if len(shown) > 1 else ''})",
                          "print the mean loss of each interval when you log it, e.g. "
                          "print(f\"step {step}: mean loss {mean:.4f}\"): it is what the learner watches")
    return syncs.count, allowed


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _unprinted(text: str, means: list[float], where: list | None = None):
    """(index, mean) of the first interval mean that no number printed (in order) rounds to, or None.
    A number printed with d decimals stands for any value within half a unit of its last digit.
    `where`, a list, receives the offset in `text` of the number matched to each mean."""
    numbers, offsets = [], []
    for match in _NUMBER.finditer(text):
        token = match.group()
        offsets.append(match.start())
        mantissa = token.lower().split("e")[0]
        decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
        exponent = int(token.lower().split("e")[1]) if "e" in token.lower() else 0
        numbers.append((float(token), 0.5 * 10.0 ** (exponent - decimals) * (1 + 1e-9)))
    position = 0
    for i, mean in enumerate(means):
        while position < len(numbers) and abs(numbers[position][0] - mean) > max(numbers[position][1], 1e-12):
            position += 1
        if position == len(numbers):
            return i, mean
        if where is not None:
            where.append(offsets[position])
        position += 1
    return None


class _StampedOut(io.StringIO):
    """stdout that notes, for each write, how many steps had run (the loss function's calls so far)."""

    def __init__(self, steps_so_far):
        super().__init__()
        self.steps_so_far, self.stamps = steps_so_far, []      # (offset where a write began, steps run by then)

    def write(self, text):
        self.stamps.append((self.tell(), self.steps_so_far()))
        return super().write(text)

    def steps_at(self, offset):
        return max((steps for start, steps in self.stamps if start <= offset), default=0)


def _shared_lists(fn) -> list[str]:
    """The global or enclosing names `fn` uses that hold a list, deque or dict: state that outlives a call."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    found = [name for name in code.co_names
             if isinstance(getattr(fn, "__globals__", {}).get(name), (list, dict, collections.deque))]
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            if isinstance(cell.cell_contents, (list, dict, collections.deque)):
                found.append(name)
        except ValueError:          # an empty cell
            pass
    return found


def _line_naming_cuda(fn) -> str:
    """' (at line N: `...`)': the first line of `fn` that writes the string 'cuda' (walk w8-05)."""
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return ""
    for i, text in enumerate(lines):
        if re.search(r"""["']cuda(:\d+)?["']""", text):
            return f" (at line {start + i}: `{text.strip()}`)"
    return ""


def _shared_value(fn, name: str):
    value = getattr(fn, "__globals__", {}).get(name)
    code = getattr(fn, "__code__", None)
    if code is not None and name in code.co_freevars:
        try:
            value = (fn.__closure__ or ())[code.co_freevars.index(name)].cell_contents
        except (ValueError, IndexError):
            pass
    return value


def _shared_count(fn, name: str) -> bool:
    """Whether the container `fn` uses from outside holds only whole numbers (a step count, STEP = [0]; walk
    w8-05), not losses or means."""
    value = getattr(fn, "__globals__", {}).get(name)
    code = getattr(fn, "__code__", None)
    if code is not None and name in code.co_freevars:
        try:
            value = (fn.__closure__ or ())[code.co_freevars.index(name)].cell_contents
        except (ValueError, IndexError):
            pass
    values = list(value.values()) if isinstance(value, dict) else list(value or [])
    return bool(values) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


_COUNT_HINT = ("count the steps in the body (for step, (images, labels) in enumerate(batches, 1)): a count kept "
               "outside the function goes on from the earlier calls' steps, so this call's intervals end at the "
               "wrong steps")


def _shared_kind(fn, name: str) -> str:
    """'a list', 'a dict' or 'a deque': what the name `fn` uses from outside holds (w7-05 w54_10, a dict)."""
    value = getattr(fn, "__globals__", {}).get(name)
    code = getattr(fn, "__code__", None)
    if code is not None and name in code.co_freevars:
        try:
            value = (fn.__closure__ or ())[code.co_freevars.index(name)].cell_contents
        except (ValueError, IndexError):
            pass
    return {dict: "a dict", collections.deque: "a deque"}.get(type(value), "a list")


def _mutable_defaults(fn) -> list[str]:
    """The parameters of `fn` whose default is a list, dict or set: one object shared by every call."""
    try:
        return [name for name, p in inspect.signature(fn).parameters.items()
                if isinstance(p.default, (list, dict, set))]
    except (TypeError, ValueError):
        return []


def _kept_hint(kept: list[str]) -> str:
    return (f"the default argument {kept[0]}=[] is made once, when `def` runs, and every call adds to that same "
            f"object: make it inside the function ({kept[0]} = [] in the body)")


def _no_shared_list(train_fixed, result, n_logs, label, seed):
    """More means than intervals, from a function that uses a list made outside it (a module-level MEANS = [],
    walk w6-05 w54_06): name that list, not the interval or the default argument."""
    shared = _shared_lists(train_fixed)
    if shared and len(result) > n_logs and _shared_count(train_fixed, shared[0]):
        raise CheckFailed("keeps nothing between calls", f"{label}: yours returned {len(result)} values, expected the "
                          f"means of {n_logs} intervals: your function uses {shared[0]}, a count kept between calls "
                          f"(it holds {list(_shared_value(train_fixed, shared[0]))[:3]}), which goes on from the "
                          f"earlier calls' steps (seed {seed})", _COUNT_HINT)
    if shared and len(result) > n_logs:
        raise CheckFailed("keeps nothing between calls", f"{label}: yours returned {len(result)} values, expected the "
                          f"means of {n_logs} intervals: your function uses {shared[0]}, {_shared_kind(train_fixed, shared[0])} made outside it, which "
                          f"keeps the earlier calls' means (seed {seed})",
                          f"make the list in the body ({shared[0].lower()} = [] inside train_fixed): a list made "
                          "outside, once, is shared by every call")


def _default_interval(train_fixed, rng, seed):
    """train_fixed(model, optimizer, batches, loss_fn): log_every defaults to 10."""
    steps = 20 + int(rng.integers(1, 10))
    torch.manual_seed(int(rng.integers(0, 2**31)))
    model = _SmallConvNet(classes=3)    # losses near ln 3, far from the 5-class case's ln 5: a leftover from it shows
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    batches = [(torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)) for _ in range(steps)]
    recorded = []

    def loss_fn(logits, labels):
        loss = F.cross_entropy(logits, labels)
        recorded.append(float(loss.detach()))
        return loss

    with contextlib.redirect_stdout(io.StringIO()):
        result = train_fixed(model, opt, batches, loss_fn)
    expected = [float(np.mean(recorded[i * 10:(i + 1) * 10])) for i in range(steps // 10)]
    label = f"train_fixed(model, optimizer, batches, loss_fn) over {steps} steps, log_every left at its default"
    kept = _mutable_defaults(train_fixed)
    if kept and isinstance(result, (list, tuple)) and len(result) != len(expected):
        raise CheckFailed("keeps nothing between calls", f"{label}, after an earlier call: yours returned "
                          f"{len(result)} values, expected the means of {len(expected)} intervals of 10 steps "
                          f"(seed {seed})", _kept_hint(kept))
    if isinstance(result, (list, tuple)):
        _no_shared_list(train_fixed, result, len(expected), label + ", after an earlier call", seed)
    if not isinstance(result, (list, tuple)) or len(result) != len(expected):
        got = f"{len(result)} values" if isinstance(result, (list, tuple)) else type(result).__name__
        raise CheckFailed("defaults to log_every=10", f"{label}: yours returned {got}, expected the means of "
                          f"{len(expected)} intervals of 10 steps (seed {seed})",
                          "def train_fixed(model, optimizer, batches, loss_fn, log_every=10)")
    yours = [float(v) for v in result]
    if not np.allclose(yours, expected, rtol=1e-4, atol=1e-6):
        i = next(i for i, (a, b) in enumerate(zip(yours, expected)) if not math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6))
        raise CheckFailed("logs the mean loss of each interval",
                          f"{label}, after an earlier call that ended with a partial interval: interval {i + 1} "
                          f"(steps {10 * i + 1} to {10 * i + 10}): yours {yours[i]:.5f}, expected {expected[i]:.5f} "
                          f"(seed {seed})" + (f"; your loop uses {_shared_lists(train_fixed)[0]}, "
                                              + ("a step count kept outside the call"
                                                 if _shared_count(train_fixed, _shared_lists(train_fixed)[0]) else
                                                 f"{_shared_kind(train_fixed, _shared_lists(train_fixed)[0])} that "
                                                 "outlives the call") if _shared_lists(train_fixed) else ""),
                          _COUNT_HINT if _shared_lists(train_fixed) and _shared_count(train_fixed, _shared_lists(train_fixed)[0]) else
                          "the mean of the 10 losses of that interval, and only those: a window kept between calls "
                          "(a default argument such as window=[], a global) starts this call with the losses the "
                          "last call left over")


def _loop_on_a_device(train_fixed, rng, seed):
    """A short run with the model and the batches on the virtual CUDA device for training steps (as 5.2's):
    what lives in host memory is there as on a GPU, so a host buffer written with each step's loss is the copy
    to the host it is on a GPU (walk w8-05: window = torch.zeros(log_every); window[i] = loss.detach())."""
    from .virtual_cuda_training import VirtualCudaTraining
    # log_every 10, as the default case just before, whose step count (21 to 29) is no multiple of 10: a step
    # count kept outside the function (STEP = [0]) logs at the wrong steps in one of the two, whatever it held
    log_every, n_logs = 10, 2
    torch.manual_seed(int(rng.integers(0, 2**31)))
    model = _SmallConvNet(classes=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    batches = [(torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen))
               for _ in range(log_every * n_logs)]
    label = f"{len(batches)} steps, log_every={log_every}, on a (virtual) CUDA device (seed {seed})"
    recorded = []

    def loss_fn(out, target):
        loss = F.cross_entropy(out, target)
        recorded.append(loss.detach().clone())
        return loss

    with VirtualCudaTraining() as vc:
        vc.put_module(model)
        for images, labels in batches:
            vc.put(images), vc.put(labels)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                result = train_fixed(model, opt, batches, loss_fn, log_every=log_every)
        except RuntimeError as exc:
            if "same device" not in str(exc):
                raise
            raise CheckFailed("keeps its window on the device", f"{label}: yours raised: {str(exc)[:200]}",
                              "collect loss.detach() where the loss is (a list of them, torch.stack at the logging, "
                              "or a total started from the first loss.detach()): a tensor made without device= is in "
                              "host memory, and a GPU's loss cannot be added into it") from None
        syncs = list(vc.syncs)
        with vc.quiet():
            expected = [float(torch.stack(recorded[i * log_every:(i + 1) * log_every]).mean()) for i in range(n_logs)]
            yours = [float(v) for v in result] if isinstance(result, (list, tuple)) else None
    if yours is None or len(yours) != n_logs or not np.allclose(yours, expected, rtol=1e-4, atol=1e-6):
        shared = _shared_lists(train_fixed)
        counted = bool(shared) and _shared_count(train_fixed, shared[0])
        raise CheckFailed("logs the mean loss of each interval",
                          f"{label}: yours returned {yours if yours is None else [round(v, 5) for v in yours]}, "
                          f"expected {[round(v, 5) for v in expected]}"
                          + (f"; your loop uses {shared[0]}, a step count kept outside the call" if counted else ""),
                          _COUNT_HINT if counted else
                          "every log_every steps, the mean of those steps' losses, and nothing kept from an earlier call")
    # one blocking copy of a host-made tensor to the device, once (total = total.to(loss.device) on the first
    # step, walk w8-05) is set-up, not a wait per step: count such copies from the second on
    to_device = [s for s in syncs if "copy to the device" in s.what]
    syncs = [s for s in syncs if "copy to the device" not in s.what] + to_device[1:]
    if len(syncs) > n_logs:
        where = "; ".join(dict.fromkeys(f"{s.what} at line {s.where.rpartition(chr(58))[2]}" for s in syncs))
        host_write = any("written from the device" in s.what for s in syncs)
        raise CheckFailed("synchronises at most once per logging interval",
                          f"{label}: yours waited for the device {len(syncs)} times for {n_logs} intervals ({where})",
                          ("a buffer made without device= (torch.zeros(log_every)) is in host memory: writing each "
                           "step's loss into it is a copy to the host that waits for the device, every step; keep "
                           "the window on the device (device=loss.device, or a list of loss.detach())"
                           if host_write else
                           "collect loss.detach() of each step on the device and read the interval's mean with one "
                           ".item(): any other read or copy to the host per step waits for the device"))


@exercise("5.4", "Fix a loop that keeps graphs and syncs every step", points=2)
@forbids("course_utils.train:train", "course_utils.train:_step")
@single_threaded
def check_fixed_loop(train_fixed):
    expect_callable(train_fixed, "a function train_fixed(model, optimizer, batches, loss_fn, log_every)")
    rng, seed = fresh_rng()
    notes = []
    for device in _devices():
        used, allowed = _loop_case(train_fixed, rng, seed, device)
        notes.append(f"{used} syncs (at most {allowed} allowed) on {device.type}")
    _default_interval(train_fixed, rng, seed)
    if not torch.cuda.is_available():      # last, with draws of its own: the cases above keep theirs
        _loop_on_a_device(train_fixed, np.random.default_rng([seed, 54]), seed)
        notes.append("at most one per interval on a (virtual) CUDA device")
    return ("no graph kept, activations freed by each backward, gradients freed, each interval's mean printed and "
            "returned (log_every=10 by default); " + "; ".join(notes) + ".")

from . import lesson05_graphs  # noqa: E402,F401  (exercise 5.5 lives in its own module)
