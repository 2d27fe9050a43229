"""Check 5.5 (lesson 05): a training step captured as a CUDA graph, graded without a GPU too.

On a machine without a GPU, torch.cuda's graph API is emulated on the CPU
(`course_utils.graph_capture`): a capture records the step's operations and undoes their effects,
a host read while capturing raises CUDA's error, a replay re-runs the recorded operations on the
same tensors and nothing else. So the learner's code, written for a GPU, is held to a GPU's rules.
On a GPU it runs for real as well.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..graph_capture import CAPTURE_ERROR, EmulatedGraphs
from ._core import CheckFailed, exercise, expect_callable
from ._util import forbids, fresh_rng

_COURSE_CODE = ["course_utils.train:_GraphedStep.__init__", "course_utils.train:_GraphedStep.__call__",
                "course_utils.train:train"]


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


def _optimizer(model, lr):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)


def _eager(model, optimizer, images, labels):
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _state(model):
    return [t.detach().clone() for t in list(model.parameters()) + list(model.buffers())]


def _same(a, b, tol):
    return all(x.shape == y.shape and torch.allclose(x.double(), y.double(), atol=tol, rtol=tol) for x, y in zip(a, b))


def _scenario(make_graphed_step, rng, device, *, use_default_warmup: bool):
    dtype = torch.float64
    batch = int(rng.integers(9, 30))
    width = int(rng.integers(4, 9))
    warmup = 3 if use_default_warmup else int(rng.choice([2, 4, 5]))
    steps = int(rng.integers(4, 7))
    lr = float(rng.uniform(0.02, 0.1))
    torch.manual_seed(int(rng.integers(1 << 30)))
    reference = _Net(width).to(device, dtype)
    yours = copy.deepcopy(reference)

    def draw(n):
        return (torch.from_numpy(rng.standard_normal((n, 3, 16, 16))).to(device, dtype),
                torch.from_numpy(rng.integers(0, 10, n)).to(device))
    example = draw(batch)
    batches = [draw(batch) for _ in range(steps)]
    what = (f"a small CNN with batch norm, batch {batch}, SGD (momentum, weight decay), "
            f"warmup={'its default' if use_default_warmup else warmup}, then {steps} batches, on {device.type}")

    ref_opt = _optimizer(reference, lr)
    for _ in range(warmup):
        _eager(reference, ref_opt, *example)
    ref_losses = [float(_eager(reference, ref_opt, *b)) for b in batches]
    ref_state = _state(reference)

    emulate = device.type != "cuda"
    graphs = EmulatedGraphs() if emulate else None
    opt = _optimizer(yours, lr)
    kwargs = {} if use_default_warmup else {"warmup": warmup}
    with (graphs or _nothing()):
        try:
            step = make_graphed_step(yours, opt, example[0].clone(), example[1].clone(), **kwargs)
        except RuntimeError as exc:
            if CAPTURE_ERROR in str(exc) or "capturing" in str(exc):
                raise CheckFailed("reads nothing on the host while capturing",
                                  f"{what}: capturing raised: {str(exc)[:200]}",
                                  "a value read on the host (.item(), float(loss), print(loss), an `if` on a "
                                  "tensor) cannot be part of a graph: keep the loss a tensor, read it after replay")
            raise
        if not callable(step):
            raise CheckFailed("returns step(images, labels)", f"{what}: make_graphed_step returned "
                              f"{type(step).__name__}")
        made = yours.calls
        if made != warmup + 1:
            raise CheckFailed("warms up `warmup` ordinary steps, then captures one",
                              f"{what}: the model ran {made} times inside make_graphed_step, expected "
                              f"{warmup} warm-up steps and 1 capture",
                              "before the capture, run `warmup` ordinary steps on the example batch (the "
                              "optimizer's momentum buffers and cuDNN's choices must exist), then capture once")
        losses = []
        for images, labels in batches:
            losses.append(step(images.clone(), labels.clone()))
        replays = sum(g.replays for g in graphs.graphs) if emulate else None
        if yours.calls != made:
            raise CheckFailed("replays the graph: no Python model call per step",
                              f"{what}: step() ran the model {yours.calls - made} times in Python for "
                              f"{steps} batches",
                              "copy the batch into the captured input tensors and call graph.replay(): the "
                              "graph holds the whole step")
        if emulate and replays != steps:
            raise CheckFailed("one replay per step", f"{what}: {replays} replays for {steps} calls of step()",
                              "each call of step() trains on its batch exactly once: one graph.replay()")
        values = []
        for i, loss in enumerate(losses):
            if isinstance(loss, torch.Tensor):
                if loss.numel() != 1:
                    raise CheckFailed("returns each step's loss", f"{what}: step {i + 1} returned a tensor of shape "
                                      f"{tuple(loss.shape)}")
                values.append(float(loss.detach().double().cpu()))
            elif isinstance(loss, (float, int)) and not isinstance(loss, bool):
                values.append(float(loss))
            else:
                raise CheckFailed("returns each step's loss", f"{what}: step {i + 1} returned {type(loss).__name__}")
        if steps > 1 and len(set(values)) == 1 and len(set(round(v, 9) for v in ref_losses)) > 1:
            raise CheckFailed("returns each step's own loss",
                              f"{what}: every step's returned loss reads {values[0]:.5f} once the steps are done",
                              "the captured loss tensor is overwritten by the next replay: return a copy (clone())")
        tol = 1e-9 if emulate else 1e-6
        if not np.allclose(values, ref_losses, rtol=tol, atol=tol):
            diff = ", ".join(f"{a:.5f} vs {b:.5f}" for a, b in list(zip(values, ref_losses))[:3])
            raise CheckFailed("trains exactly as ordinary steps would", f"{what}: the losses of the graphed steps "
                              f"differ from ordinary steps' ({diff}, ...)", _why_different(values, ref_losses))
        if not _same(_state(yours), ref_state, tol):
            raise CheckFailed("trains exactly as ordinary steps would",
                              f"{what}: the same losses, but the weights or batch-norm statistics after the "
                              "graphed steps differ from ordinary steps'",
                              "everything the step writes (weights, optimizer state, running statistics) must be "
                              "what the captured step writes: do not change it between replays")
        shorter = int(rng.integers(1, batch))
        before = _state(yours)
        try:
            step(*draw(shorter))
        except ValueError:
            pass
        except Exception as exc:       # noqa: BLE001 (an error, but not the one the contract names)
            raise CheckFailed("a batch of another shape raises ValueError",
                              f"{what}: a last batch of {shorter} samples raised {type(exc).__name__}: "
                              f"{str(exc)[:120]}",
                              "check the shapes first and raise ValueError saying a graph replays the shapes it "
                              "captured (drop_last=True)")
        else:
            raise CheckFailed("a batch of another shape raises ValueError",
                              f"{what}: a last batch of {shorter} samples was accepted",
                              "a replay reads the captured buffers whole: a short batch would train on stale "
                              "samples; raise ValueError (drop_last=True avoids it)")
        if not _same(_state(yours), before, 0.0):
            raise CheckFailed("a batch of another shape raises ValueError",
                              f"{what}: the refused batch still changed the model", "check before you copy or replay")
    return steps, warmup


def _why_different(values, reference) -> str:
    return ("the usual causes: the batch rebound to a new tensor instead of copied into the captured one "
            "(static.copy_(images)): the replay reads the captured tensors only; gradients left from the warm-up "
            "when capturing (optimizer.zero_grad(set_to_none=True) just before it); a capture before the warm-up "
            "steps (the optimizer's state must exist); an extra replay, or none, per step")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


@exercise("5.5", "A training step captured as a CUDA graph", points=3, time_limit_s=120)
@forbids(*_COURSE_CODE)
def check_graphed_step(make_graphed_step):
    expect_callable(make_graphed_step, "a function make_graphed_step(model, optimizer, example_images, "
                                       "example_labels, warmup=3) -> step(images, labels)")
    rng, seed = fresh_rng()
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    told, warmups = [], []
    for device in devices:
        for default in (False, True):
            steps, warmup = _scenario(make_graphed_step, rng, device, use_default_warmup=default)
            if not default:
                warmups.append(warmup)
        told.append(device.type if device.type == "cuda" else
                    "the CPU, with torch.cuda's capture emulated (course_utils.graph_capture)")
    return (f"captures after the warm-up steps (warmup={', '.join(map(str, warmups))} and the default), replays once per step with no "
            f"model call in Python, the same losses, weights and batch-norm statistics as ordinary steps, a fresh "
            f"loss per step, and ValueError for a batch of another shape; on {' and '.join(told)} (seed {seed}).")
