"""Checks for lesson 03 (prefetch to the GPU).

Each check runs the learner's code on the CPU, on a *virtual CUDA device* (`virtual_cuda`,
on every machine: it logs copies, host waits and stream order, so that code that is right on
a CPU but wrong on a GPU fails here too), and on a real GPU when there is one.

The virtual pass is the authority on stream order: it sees every read made before the stream
that reads waited for the copy, whatever the timing. A real GPU can only show a missing wait
when the copy is still running at the read; on an H100 a pinned batch copies in well under a
millisecond, long before the host reads it, so the real pass of check 3.1 holds the learner's
side stream busy (a spinning kernel queued on it before each copy) to make a missing
`wait_stream` read a batch that has not arrived.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import re
import threading
import time
import traceback
import weakref

import numpy as np
import torch
import torch.nn.functional as F

from ..data import CIFAR10_MEAN, CIFAR10_STD
from ._core import CheckFailed, _learner_line, calling, exercise, expect_callable, expect_class, trusted
from ._util import forbids, fresh_rng, single_threaded
from .virtual_cuda import MIXED_DEVICES, OTHER_DEVICE, DeviceTensor, VirtualCuda, passes_through

VIRTUAL = "the virtual CUDA device"


def _devices() -> list[torch.device]:
    return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


def _values(t: torch.Tensor) -> torch.Tensor:
    """A tensor's values on the host, without logging a copy on the virtual device."""
    return t._inner if isinstance(t, DeviceTensor) else t.detach().cpu()


def _kind(obj) -> str:
    if obj is None:
        return "None (an end-of-data marker yielded as a batch?)"
    if isinstance(obj, (tuple, list)):
        return f"a {type(obj).__name__} of {len(obj)}: {', '.join(type(o).__name__ for o in obj)}"
    return f"a {type(obj).__name__}"


def _learner_error(exc: RuntimeError, what: str, *, mixed_hint: str | None = None, host_hint: str | None = None):
    """CUDA's own errors, as raised on the virtual device, turned into the property they break."""
    text = str(exc)
    if OTHER_DEVICE in text:
        return CheckFailed("uses the device it is given",
                           f"{what}: {text.split(': ', 1)[1] if ': ' in text else text}. On a machine with several "
                           "GPUs, \"cuda\", \"cuda:0\", .cuda() and torch.cuda.Stream() without a device all mean "
                           "the current device, which is not always the one the code was given",
                           "use the device passed in everywhere: .to(self.device, non_blocking=True), "
                           "torch.cuda.Stream(self.device), torch.cuda.current_stream(self.device)")
    if "Expected all tensors to be on the same device" in text and "cuda:0 and cuda:1" in text:
        return CheckFailed("keeps its constants per device",
                           f"{what}: your code mixed tensors of two CUDA devices, which CUDA refuses ({text}): "
                           "tensors made for the first device were used for a batch on the second",
                           mixed_hint or "key anything you keep by the device itself (str(images.device): "
                           "'cuda:0' and 'cuda:1' are both of type 'cuda')")
    if MIXED_DEVICES in text or ("Expected all tensors to be on the same device" in text and "cpu" in text):
        return CheckFailed("keeps all its work on the device",
                           f"{what}: your code mixed a tensor on the device with one on the host, which CUDA "
                           f"refuses ({text})",
                           host_hint or mixed_hint or "make every tensor you create on images.device "
                           "(torch.arange(n, device=images.device))")
    if "device type for generator" in text:
        return CheckFailed("draws its random numbers on the images' device",
                           f"{what}: CUDA says: {text}",
                           "torch.randint(..., device=images.device, generator=generator): numbers drawn on the "
                           "host must be copied to the device for every batch")
    if "record_stream is only valid for CUDA tensors" in text:       # w12-03 w31_images_only_moved
        which = text[text.find("(a host tensor"):] if "(a host tensor" in text else ""
        labels = which.endswith("int64)") and bool(re.search(r"shape \(\d+,\)", which))    # 1-D int64
        return CheckFailed("copies every batch to the device",
                           f"{what}: your code called record_stream{_learner_line(exc)} on a tensor still on the "
                           f"host {which}: "
                           + ("the labels were never copied to the device" if labels else
                              "a tensor of the batch was never copied to the device")
                           + " (record_stream marks device memory; a host tensor has none)",
                           "copy the images and the labels, each with .to(self.device, non_blocking=True) inside "
                           "the side stream; the training step needs both on the device")
    frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
    if "_index_parts" in frames:
        return CheckFailed("never waits for the device",
                           f"{what}: your code sliced a tensor with a device tensor as a bound{_learner_line(exc)}. A "
                           "Python slice needs plain numbers, so on a GPU every such slice reads the value back "
                           "to the host and waits for the device (one wait per sample in a loop)",
                           "build index tensors for the whole batch on the device and index once (advanced "
                           "indexing, or torch.gather): no Python loop over the samples, no slice per sample")
    if "CUDA driver version is insufficient" in text or "no CUDA GPUs are available" in text:
        return CheckFailed("never waits for the device",
                           f"{what}: a call of yours{_learner_line(exc)} asked for a real GPU, which the virtual "
                           "device does not have. That happens where a device tensor is used as a plain Python "
                           "number (a slice bound, range(), an int in a Python loop): on a GPU each such use reads "
                           "the value back and waits for the device",
                           "keep whole-batch tensor operations on the device; read no value back")
    return None


# -- 3.1 the prefetcher ---------------------------------------------------------------------------

class _ScriptedLoader:
    """A re-iterable loader like a shuffling DataLoader: every pass yields new batches, made
    from the pass number and a seed, so the check knows what each pass must give. Counts how
    many batches it has handed out in the current pass. The images are uint8, as the lesson's
    loaders give them (a float conversion on the host shows). `pin` pins every batch (as
    `DataLoader(pin_memory=True)` does)."""

    def __init__(self, seed: int, n_batches: int, *, pinned_big: bool = False, pin=None):
        self._seed, self._n, self._pinned_big, self._pin = seed, n_batches, pinned_big, pin
        self.passes = 0
        self.handed_out = 0

    def _batches(self, pass_index: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(self._seed + 7919 * pass_index)
        out = []
        for i in range(self._n):
            if self._pinned_big:   # 64 MiB batches, one constant each: a copy read too early shows
                images = torch.full((16 * 2**20,), float(pass_index * 100 + i + 1))
            else:
                b = int(torch.randint(1, 9, (1,), generator=g))
                if i == 1:        # batches 0 and 1 of one shape: a staging buffer kept per shape is refilled in flight
                    b = len(out[0][0])
                images = torch.randint(0, 256, (b, 3, 5, 6), generator=g, dtype=torch.uint8)
            labels = torch.randint(0, 10, (len(images) if not self._pinned_big else 4,), generator=g)
            out.append((images, labels))
        return out

    def __len__(self) -> int:
        return self._n

    def __iter__(self):
        batches = self._batches(self.passes)
        self.passes += 1
        self.handed_out = 0
        for images, labels in batches:
            if self._pinned_big:
                images, labels = images.pin_memory(), labels.pin_memory()
            elif self._pin is not None:
                images, labels = self._pin(images), self._pin(labels)
            self.handed_out += 1
            yield images, labels


def _as_pair(batch, where):
    if not isinstance(batch, (tuple, list)) or len(batch) != 2 or not all(isinstance(t, torch.Tensor) for t in batch):
        raise CheckFailed("yields (images, labels) pairs", f"{where}: yours yielded {_kind(batch)}",
                          "yield the two tensors of each batch, e.g. `yield images, labels`")
    return batch


_STOP = object()


def _next(it, what):
    """next(it), with a generator's StopIteration (PEP 479) said for what it is."""
    try:
        return next(it, _STOP)
    except RuntimeError as exc:
        if "generator raised StopIteration" not in str(exc):
            raise
        raise CheckFailed("ends cleanly", f"{what}: a next() inside your generator raised StopIteration when the "
                          f"loader ran out{_learner_line(exc)}: inside a generator that is an error (PEP 479), "
                          "not the end of the pass", "next(batches, None) and stop at None, or catch StopIteration "
                          "and return") from None


def _one_pass(pf, loader, pass_index, device, what, *, on_batch=None, stop_after=None, previous=None):
    """Iterate `pf` once; check the batches against the loader's. `on_batch(i, images, labels)`
    runs as each batch arrives (the virtual device's checks, the consumer's reads). The check
    keeps the values of each batch, not the batch itself: a batch the training loop is done with
    is freed, as in a training loop. `stop_after`: end the pass early, as `train(steps=...)` does
    with a `break`. `previous`: the batches of the pass before (to name state carried over)."""
    expected = loader._batches(pass_index)
    got = []
    it = iter(pf)
    for i in range(len(expected) + 3):
        if stop_after is not None and i >= stop_after:
            break
        batch = _next(it, what)
        if batch is _STOP:
            break
        if i >= len(expected):
            raise CheckFailed("ends cleanly", f"{what}: the loader has {len(expected)} batches, yours yielded more "
                              f"(batch {i} was {_kind(batch)})",
                              "stop (return) when the loader is exhausted instead of yielding an end marker")
        images, labels = _as_pair(batch, f"{what}, batch {i}")
        if i == 0 and previous and loader.passes <= pass_index:
            raise CheckFailed("starts a new pass over the loader each time it is iterated",
                              f"{what}: after {previous[0]}, yours went on with the pass that was stopped: it did "
                              "not call iter(loader) for the new pass",
                              "keep the loader's iterator and the batch in flight in local variables of __iter__ (a "
                              "generator), not on self: a `break` (train(steps=...) makes one) leaves them behind, and "
                              "the next `for` must start afresh")
        if loader.handed_out > i + 2:
            hint = "a DataLoader can be endless or huge: take the next batch only, do not list() it"
            if loader.handed_out < len(expected):     # w8-03 w31_09: a queue two deep, not a list
                hint = (f"yours keeps {loader.handed_out - i - 1} batches in flight: at most one ahead, the next batch "
                        "only; each batch more is one more batch of device memory and buys no overlap (one copy "
                        "at a time already runs behind the step)")
            raise CheckFailed("reads the loader as it goes", f"{what}: when batch {i} reached the consumer, yours had "
                              f"already taken {loader.handed_out} batches from the loader", hint)
        for name, t in (("images", images), ("labels", labels)):
            if t.device.type != device.type:
                raise CheckFailed("puts the tensors on the device", f"{what}, batch {i}: {name} on {t.device}, "
                                  f"expected {device.type}", "move both tensors with .to(device, non_blocking=True)")
        want_x, want_y = expected[i]
        for name, t, want in (("images", images, want_x), ("labels", labels, want_y)):
            if t.dtype != want.dtype:
                raise CheckFailed("yields the loader's batches unchanged",
                                  f"{what}, batch {i}: the {name} are {t.dtype}, the loader's {want.dtype}: yours "
                                  "converted them (on the host, before the copy, that is a pass over every batch "
                                  "in the training loop and more bytes to copy)",
                                  "copy the tensors as the loader gives them; a conversion belongs on the device, "
                                  "in the step (as exercise 3.3's normalize does)")
        if on_batch is not None:
            on_batch(i, images, labels)
        got.append((_values(images), _values(labels)))
        del batch, images, labels
    del it
    if stop_after is not None:
        return got
    if len(got) < len(expected) and loader.passes <= pass_index:
        raise CheckFailed("starts a new pass over the loader each time it is iterated",
                          f"{what}: the loader has {len(expected)} batches, yours yielded {len(got)}, and over "
                          f"{pass_index + 1} passes it called iter(loader) {loader.passes} time"
                          f"{'s' if loader.passes != 1 else ''}",
                          "an iterator made once (in __init__) is used up by the first pass, and the next "
                          "`for batch in prefetcher` finds it empty: call iter(self.loader) inside __iter__, so "
                          "that every pass starts afresh")

    def same(pair, want):
        (x, y), (wx, wy) = pair, want
        return (x.dtype == wx.dtype and x.shape == wx.shape and trusted.torch_equal(x, wx) and y.shape == wy.shape
                and trusted.torch_equal(y, wy))

    if previous and got and any(same(got[0], p) for p in previous[1]):
        j = next(k for k, p in enumerate(previous[1]) if same(got[0], p))
        raise CheckFailed("starts a new pass over the loader each time it is iterated",
                          f"{what}: after {previous[0]}, yours began the next pass with batch {j} of the pass that "
                          "was stopped, not with a fresh pass over the loader",
                          "keep the loader's iterator and the batch in flight in local variables of __iter__ (a "
                          "generator), not on self: a `break` (train(steps=...) makes one) leaves them behind, and "
                          "the next `for` must start afresh")
    if len(got) < len(expected):
        if got and all(same(g, w) for g, w in zip(got, expected[1:])):
            raise CheckFailed("yields every batch", f"{what}: the loader has {len(expected)} batches, yours yielded "
                              f"{len(got)}, from the loader's batch 1 on: the first was skipped",
                              "the batch you take before the loop is the first one to hand out: copy it, then hand "
                              "it out before you take the next")
        raise CheckFailed("yields every batch", f"{what}: the loader has {len(expected)} batches, yours yielded {len(got)}",
                          "the first batch is fetched before the loop and the last one is still pending when "
                          "the loader runs out: yield it before stopping")
    for i, (pair, want) in enumerate(zip(got, expected)):
        if not same(pair, want):
            order = ""
            for j, w in enumerate(expected):
                if j != i and same(pair, w):
                    order = f" (it is the loader's batch {j})"
            raise CheckFailed("same batches in the same order as the loader",
                              f"{what}: yours yielded a different batch {i}{order}",
                              "each pass must take fresh batches from `iter(loader)`, in order, unchanged")
    return got


def _streams_in(*objects) -> list:
    found = []

    def visit(value):
        if isinstance(value, torch.cuda.Stream):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v)
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)

    for obj in objects:
        frame = getattr(obj, "gi_frame", None)
        if frame is not None:
            visit(dict(frame.f_locals))
        elif hasattr(obj, "__dict__"):
            visit(vars(obj))
    return found


def _passes(Prefetcher, loader, device, what, *, on_pass=None, first=0, made=None):
    """The passes every device gets: a full pass, a second one, one stopped after two batches (as
    `train(steps=...)` stops), and a full one after it. `on_pass(pass_index)` gives the
    `on_batch` of each pass and the context it runs in. `made`: a list the prefetcher is put in."""
    pf = Prefetcher(loader, device)
    if made is not None:
        made.append(pf)
    previous = None
    for k, stop_after in enumerate((None, None, 2, None)):
        pass_index = first + k
        label = what + ("" if k == 0 else ", second pass" if k == 1 else ", a pass stopped after 2 batches" if k == 2
                        else ", the pass after the stopped one")
        on_batch, context = on_pass(k, label) if on_pass else (None, contextlib.nullcontext())
        with context:
            got = _one_pass(pf, loader, pass_index, device, label, on_batch=on_batch, stop_after=stop_after,
                            previous=previous)
        previous = (f"a pass stopped after {len(got)} batches (a `break`)", loader._batches(pass_index)) \
            if stop_after is not None and loader._n > 2 else None
        yield k, label, got
    if loader.passes != 4:
        raise CheckFailed("starts a new pass over the loader each time it is iterated",
                          f"{what}: four passes over yours called iter(loader) {loader.passes} times",
                          "call iter(self.loader) inside __iter__, not in __init__")


@exercise("3.1", "A prefetcher: the next batch copied to the device on a side stream", points=2)
@forbids("course_utils.prefetch:CudaPrefetcher.__iter__")
@single_threaded
def check_prefetcher(Prefetcher):
    expect_class(Prefetcher, "a class Prefetcher(loader, device) whose instances are iterables of batches")
    rng, seed = fresh_rng()
    sizes = (int(rng.integers(3, 8)), 1, 0)
    for n in sizes:                      # on the CPU: the batches pass through
        loader = _ScriptedLoader(int(rng.integers(1 << 30)), n)
        what = f"a loader of {n} batch{'es' if n != 1 else ''} on the CPU (seed {seed})"
        for _ in _passes(Prefetcher, loader, torch.device("cpu"), what):
            pass
    meta_seed = int(rng.integers(1 << 30))
    _cpu_with_cuda_present(Prefetcher, int(rng.integers(1 << 30)), sizes[0], seed)
    for n in sizes:
        _virtual_prefetch(Prefetcher, int(rng.integers(1 << 30)), n, seed)
    _unpinned_pass(Prefetcher, int(rng.integers(1 << 30)), sizes[0], seed)
    _two_passes_at_once(Prefetcher, int(rng.integers(1 << 30)), max(sizes[0], 3), seed)
    _meta_pass(Prefetcher, meta_seed, seed)
    if torch.cuda.is_available():
        _check_cuda_streams(Prefetcher)
        return ("same batches, same order; on the CPU and the meta device passed through, moved; the CPU also "
                "while CUDA is present; on a virtual CUDA device (the second of two) copied ahead from the loader's "
                "pinned memory on a side stream the consumer's stream waits for on the device (for that batch's copy only, the stream current at each hand-out, also when the loop changed streams mid-pass), memory kept for "
                "the consumer's stream, the host never blocked (nor polled with query()), no pinned source rewritten in flight; unpinned batches copied the same way (non_blocking, on the side stream, no host wait) and nothing pinned (no pin_memory(), no pinned buffer of its own); no batch kept "
                "once the loop is done with it (nor after the pass, nor after a `break`), nothing launched on the "
                "loop's stream; ends and restarts cleanly, also after a pass stopped early, and two passes at once "
                "are each a pass of their own (each batch waited for on the stream that copied it). (On this GPU the side stream was held busy, so a missing "
                "wait_stream would have read unfinished copies; the rest is graded on the virtual device only.)")
    return ("same batches, same order; on the CPU and the meta device passed through, moved; the CPU also "
            "while CUDA is present; on a virtual CUDA device (the second of two) copied ahead from the loader's "
            "pinned memory on a side stream the consumer's stream waits for on the device (for that batch's copy only, the stream current at each hand-out, also when the loop changed streams mid-pass), memory kept for "
            "the consumer's stream, the host never blocked (nor polled with query()), no pinned source rewritten in flight; unpinned batches copied the same way (non_blocking, on the side stream, no host wait) and nothing pinned (no pin_memory(), no pinned buffer of its own); no batch kept "
            "once the loop is done with it (nor after the pass, nor after a `break`), nothing launched on the "
            "loop's stream; ends and restarts cleanly, also after a pass stopped early, and two passes at once "
            "are each a pass of their own (each batch waited for on the stream that copied it). (No GPU here: on one, the check also runs it on the real "
            "device.)")


def _cpu_with_cuda_present(Prefetcher, loader_seed, n, seed):
    """Prefetcher(loader, "cpu") on a machine that has CUDA (the virtual device answers
    torch.cuda.is_available() with True): the device it is given decides, not the machine."""
    loader = _ScriptedLoader(loader_seed, n)
    what = (f"Prefetcher(loader, 'cpu'), a loader of {n} batches, on a machine where CUDA is available "
            f"({VIRTUAL}; seed {seed})")
    hint = ("decide by the device you were given, `self.device.type == \"cuda\"`, not by the machine "
            "(torch.cuda.is_available() is True on every GPU machine, also when the device asked for is the CPU)")
    with VirtualCuda(second=True) as vc:
        before = len(vc.streams)
        try:
            for _ in _passes(Prefetcher, loader, torch.device("cpu"), what):
                pass
        except CheckFailed:
            raise
        except Exception as exc:
            raise CheckFailed("decides by the device it is given", f"{what}: yours raised {type(exc).__name__}: "
                              f"{exc}{_learner_line(exc)}", hint) from None
        if len(vc.streams) > before or vc.h2d():
            raise CheckFailed("decides by the device it is given",
                              f"{what}: yours made a CUDA stream (or copied to CUDA) for batches that stay on the CPU",
                              hint)


def _unpinned_pass(Prefetcher, loader_seed, n, seed):
    """One pass over a loader whose batches are not pinned (`DataLoader(pin_memory=False)`): a
    prefetcher pins nothing. With the pinned batches of the other passes, `pin_memory()` of a
    pinned tensor is that tensor, so a prefetcher that pins every batch itself only shows here."""
    with VirtualCuda(second=True) as vc:
        loader = _ScriptedLoader(loader_seed, n)
        what = (f"a loader of {n} batches that are not pinned (DataLoader(pin_memory=False)) on {VIRTUAL} "
                f"{vc.device} (seed {seed})")
        try:
            _one_pass(Prefetcher(loader, vc.device), loader, 0, vc.device, what)
        except RuntimeError as exc:
            raise _learner_error(exc, what) or exc
        _judge_pageable(vc, what)
        host = [r for r in vc.races if r.kind == "host_write"]
        if host:                          # w11-03 w31_pinned_staging_buffer: one pinned buffer per shape, refilled
            raise CheckFailed("leaves pinned memory alone while a copy from it is queued",
                              f"{what}: {host[0].what} (at {host[0].where}): yours stages unpinned batches through "
                              "a pinned buffer kept between batches (a staging buffer) and refilled it for the next "
                              "batch while the non-blocking copy of the one before was still queued: on a GPU the "
                              "copy reads the buffer when the side stream gets to it, not when .to() returns, so a "
                              "batch can arrive with the next one's pixels"
                              + (f"; and it pinned memory in the loop ({vc.pinned_made[0]})" if vc.pinned_made
                                 else ""),
                              "leave pinning to the loader (DataLoader(pin_memory=True)): copy an unpinned batch "
                              "as it is, .to(device, non_blocking=True) (the driver stages pageable memory itself, "
                              "safely); a staging buffer may be refilled only after an event recorded after its "
                              "copy has completed")
        if vc.pinned_made:
            raise CheckFailed("pins nothing in the training loop",
                              f"{what}: yours allocated pinned memory {len(vc.pinned_made)} times in the loop "
                              f"({vc.pinned_made[0]}): a prefetcher pins nothing; page-locked memory is slow to "
                              "allocate and scarce, and it belongs to the loader",
                              "leave pinning to the loader (DataLoader(pin_memory=True) pins in its own thread): copy "
                              "each batch as you get it, .to(device, non_blocking=True); from pageable memory that "
                              "copy is staged by the host, but it is still right")
        if vc.pins:
            raise CheckFailed("pins nothing in the training loop",
                              f"{what}: yours called pin_memory() {len(vc.pins)} times for {n} batches (first at "
                              f"{vc.pins[0]}): a prefetcher pins nothing; pin_memory() copies each batch into new "
                              "page-locked memory, on the host, in the training loop. (with the loader's pinned "
                              "batches it costs nothing, which is why only this pass shows it)",
                              "leave pinning to the loader (DataLoader(pin_memory=True) pins in its own thread): copy "
                              "each batch as you get it, .to(device, non_blocking=True); from pageable memory that "
                              "copy is staged by the host, but it is still right")


def _judge_pageable(vc, what):
    """The pageable pass gets the same three properties as the pinned ones (w9-03: w31_27, w31_36,
    w31_37 passed when only the pinned passes tested them): every copy `non_blocking=True`, on the
    side stream, and no host wait but the staging the driver does for a copy from pageable memory."""
    h2d = vc.h2d()
    loop = vc.default_stream.id                  # _one_pass consumes on the device's default stream
    pageable_note = (" (from pageable memory the driver stages each batch on the host whatever the flag says, "
                     "which is why pinned batches are faster; it is not a reason to treat these batches apart)")
    blocking = [c for c in h2d if not c.non_blocking]
    if blocking:
        where_stream = ", on the training loop's stream" if any(c.stream == loop for c in blocking) else ""
        raise CheckFailed("copies asynchronously",
                          f"{what}: {len(blocking)} of {len(h2d)} copies of unpinned batches were blocking (at "
                          f"{blocking[0].where}{where_stream}): "
                          ".to(device) without non_blocking=True makes the host wait for every kernel already "
                          "queued on that stream, so the loop gives up its run-ahead once per batch" + pageable_note,
                          "copy every batch the same way, pinned or not: .to(device, non_blocking=True) inside "
                          "`with torch.cuda.stream(self.stream):`; do not branch on is_pinned()")
    on_loop = [c for c in h2d if c.stream == loop]
    if on_loop:
        raise CheckFailed("copies on a side stream",
                          f"{what}: {len(on_loop)} of {len(h2d)} copies of unpinned batches were queued on the "
                          f"training loop's own stream (at {on_loop[0].where}), where the next step's kernels wait "
                          "for them" + pageable_note,
                          "copy every batch the same way, pinned or not: .to(device, non_blocking=True) inside "
                          "`with torch.cuda.stream(self.stream):`; do not branch on is_pinned()")
    waits = vc.reads()
    if waits:
        raise CheckFailed("never makes the host wait",
                          f"{what}: the host waited for the device {len(waits)} times for unpinned batches "
                          f"({waits[0].what} at {waits[0].where}): a wait per batch gives up the loop's run-ahead"
                          + pageable_note,
                          "wait on the device (current_stream(device).wait_stream(self.stream)), not on the host "
                          "(no synchronize(), .item() or blocking copy), for pinned and unpinned batches alike")


def _two_passes_at_once(Prefetcher, loader_seed, n, seed):
    """Two passes over one prefetcher, alive at once (as zip(p, p) or a loop nested in another
    makes them): the first takes a batch, the second runs to its end, the first goes on. Each
    must be a pass of its own over the loader."""
    with VirtualCuda(second=True) as vc:
        loader = _ScriptedLoader(loader_seed, n, pin=lambda t: vc._pin(t, log=False))
        what = (f"two passes at once over one prefetcher on {VIRTUAL} {vc.device}, a loader of {n} pinned batches: "
                "a = iter(p); next(a); then a whole pass `for batch in p`; then the rest of a (as zip(p, p) or a "
                f"loop nested in another does; seed {seed})")
        counts = {"a": 0, "b": 0}

        def take(it, name):
            # the loop reads each batch as it is handed out, on its own stream (w10-03: a side stream
            # replaced on self by the other pass made the loop wait for the wrong stream)
            batch = _next(it, what)
            if batch is not _STOP and isinstance(batch, (tuple, list)) and len(batch) == 2:
                i = counts[name]
                counts[name] += 1
                for t, kind in zip(batch, ("images", "labels")):
                    if isinstance(t, DeviceTensor):
                        vc.mark(t, f"pass {name}'s batch {i}'s {kind}")
                        (t.float().mean() if kind == "images" else t.sum())
            return batch

        def side_streams():
            return [s for s in _streams_in(pf) if s is not vc.default_stream]

        try:
            pf = Prefetcher(loader, vc.device)
            first = iter(pf)
            got_a = [b for b in (take(first, "a"),) if b is not _STOP]
            streams_a = side_streams()
            second = iter(pf)
            got_b = list(itertools.islice(iter(lambda: take(second, "b"), _STOP), n + 1))
            replaced = bool(streams_a) and not any(s in side_streams() for s in streams_a)
            got_a += list(itertools.islice(iter(lambda: take(first, "a"), _STOP), n + 1))
        except RuntimeError as exc:
            raise _learner_error(exc, what) or exc

        def values(batches):
            return [tuple(_values(t) for t in _as_pair(b, what)) for b in batches]

        want_a, want_b = loader._batches(0), loader._batches(1)

        def same(got, want):
            return len(got) == len(want) and all(
                x.shape == wx.shape and trusted.torch_equal(x, wx) and y.shape == wy.shape and trusted.torch_equal(y, wy)
                for (x, y), (wx, wy) in zip(got, want))

        va, vb = values(got_a), values(got_b)
        if not (same(va, want_a) and same(vb, want_b)):
            attrs = [k for k in vars(pf) if k not in ("loader", "device", "stream")] if hasattr(pf, "__dict__") else []
            shared = "your __iter__ returns self, so both passes are one iterator" if second is first else (
                "both passes share what yours keeps on self")
            raise CheckFailed("each pass is a pass of its own, also two at once",
                              f"{what}: the first pass yielded {len(va)} batches, the second {len(vb)}, of {n} "
                              f"each{'' if same(vb, want_b) else ', not the batches of a fresh pass'}: {shared}"
                              + (f" (self.{', self.'.join(attrs)})" if attrs else ""),
                              "make __iter__ a generator that keeps the loader's iterator and the batch in flight in "
                              "local variables: each `for batch in prefetcher` (each iter()) then gets a pass of its "
                              "own; no __next__, no pass state on self")
        races = [r for r in vc.races if r.kind == "device"]
        if races:
            race = races[0]
            why = (": yours keeps its side stream on self, and the second pass replaced it (self.stream = "
                   "torch.cuda.Stream(...) in __iter__ or for each batch): when the first pass went on, it made the "
                   "loop's stream wait for the second pass's stream, not for the one that had copied its batch"
                   if replaced else
                   ": the loop's stream waited for another stream than the one that copied this batch")
            raise CheckFailed("the consumer waits for the copy",
                              f"{what}: {race.label or 'a batch'} was read on the training loop's stream before that "
                              f"stream waited for the side stream that copied it ({len(races)} such reads){why}",
                              "wait for the stream that copied the batch: make the side stream once, in __init__, "
                              "and never replace it; or keep a stream of the pass's own in a local variable of "
                              "__iter__ (or the stream with each batch copied ahead), not on self")


def _meta_pass(Prefetcher, loader_seed, seed):
    """A device that is neither the CPU nor CUDA (the meta device, which keeps shapes only, stands
    for mps or xpu): the batches must arrive there."""
    loader = _ScriptedLoader(loader_seed, 3)
    device = torch.device("meta")
    what = f"a loader of 3 batches, device {device} (a device that is not CUDA, like mps or xpu; seed {seed})"
    try:
        pf = Prefetcher(loader, device)
        batches = []
        for i, batch in enumerate(itertools.islice(iter(pf), 5)):
            images, labels = _as_pair(batch, f"{what}, batch {i}")
            batches.append((images.device, labels.device))
    except CheckFailed:
        raise
    except Exception as exc:
        raise CheckFailed("moves the batches to any device that is not CUDA",
                          f"{what}: yours raised {type(exc).__name__}: {exc}{_learner_line(exc)}",
                          "only CUDA gets a side stream: `torch.cuda.Stream(device) if device.type == \"cuda\" "
                          "else None`; every other device gets `.to(device)`") from None
    wrong = [i for i, (a, b) in enumerate(batches) if a.type != "meta" or b.type != "meta"]
    if len(batches) != 3 or wrong:
        raise CheckFailed("moves the batches to any device that is not CUDA",
                          f"{what}: " + (f"batch {wrong[0]} stayed on {batches[wrong[0]][0]}" if wrong
                                         else f"yours yielded {len(batches)} batches of 3"),
                          "off CUDA, `yield images.to(self.device), labels.to(self.device)` for each batch: "
                          "passing the loader's batches through unmoved is right on the CPU only")


def _virtual_prefetch(Prefetcher, loader_seed, n, seed):
    """Four passes on the virtual CUDA device (the second of two: code for device 0 only shows):
    the second consumed on a stream of the consumer's own, the third stopped after 2 batches."""
    with VirtualCuda(second=True) as vc:
        loader = _ScriptedLoader(loader_seed, n, pin=lambda t: vc._pin(t, log=False))
        device = vc.device
        home = torch.cuda.current_device()
        threads = threading.active_count()
        allocs = {}                       # every device allocation, by id (a copy's destination names its id)
        new_alloc = vc._new_alloc

        @passes_through
        def tracked(*args, **kwargs):
            alloc, token = new_alloc(*args, **kwargs)
            allocs[alloc.id] = alloc
            return alloc, token

        vc._new_alloc = tracked

        def on_pass(k, what):
            # the second pass runs on streams of the loop's own, and changes stream after its first
            # batch (as a loop may between steps): the stream to wait on is the one current at each
            # hand-out, not the one current when the pass began
            consumers = [vc.default_stream] if k != 1 else [torch.cuda.Stream(device), torch.cuda.Stream(device)]
            log = {"what": what, "consumer": consumers[0], "consumers": consumers, "copies_at": [], "horizons": [],
                   "allocs": []}
            logs.append(log)
            stack = vc._tls.stacks.setdefault(device.index, [])
            slot = len(stack)

            @contextlib.contextmanager
            def on_loop_streams():        # what vc.stream(consumer, select_device=False) does, switchable
                stack.append(consumers[0])
                try:
                    yield
                finally:
                    del stack[slot:]

            def consume(i, images, labels):
                consumer = consumers[min(i, len(consumers) - 1)]
                spent = sum(s.kernels for s in consumers) - log["loop_kernels"]
                if spent > 0:
                    name, where = next(s.first_kernel for s in consumers if s.first_kernel)
                    raise CheckFailed("launches nothing on the device but the copies",
                                      f"{what}: before batch {i} reached the training loop, yours ran {spent} "
                                      f"operation{'s' if spent != 1 else ''} on the loop's own stream ({name} at "
                                      f"{where}): work on every batch that the copy does not need, queued in the "
                                      "training step's way (a .clone() is one more copy of the batch on the device, "
                                      "and one more batch of memory)",
                                      "hand out the tensors the copy made, as they are: the copy itself gives new "
                                      "tensors on the device (no .clone(), no conversion: a conversion belongs in "
                                      "the step, as exercise 3.3's normalize does)")
                need = 2 * min(i + 2, loader._n)
                if len(vc.h2d()) < need and threading.active_count() > threads:
                    deadline = time.perf_counter() + 0.5      # a copy issued by a thread of yours: its moment to run
                    while len(vc.h2d()) < need and time.perf_counter() < deadline:
                        time.sleep(0.002)
                log["copies_at"].append(len(vc.h2d()))
                if vc.current_stream(device) is not consumer or torch.cuda.current_device() != home:
                    if vc.set_streams:
                        raise CheckFailed("hands each batch to the training loop on the loop's own stream",
                                          f"{what}: when batch {i} reached the training loop, the current stream "
                                          f"was {vc.current_stream(device)!r}, not the loop's {consumer!r}: yours "
                                          f"called torch.cuda.set_stream (at {vc.set_streams[0]}), which makes your "
                                          "side stream the thread's current stream until something sets another, so "
                                          "the loop's whole step runs on your side stream (nothing overlaps, and "
                                          "the next copy queues behind the step)",
                                          "do not call torch.cuda.set_stream: copy inside `with "
                                          "torch.cuda.stream(self.stream):`, which puts the loop's stream back when "
                                          "the block ends")
                    raise CheckFailed("hands each batch to the training loop on the loop's own stream",
                                      f"{what}: when batch {i} reached the training loop, the current stream was "
                                      f"{vc.current_stream(device)!r}, not the loop's {consumer!r}: yours yields "
                                      "inside `with torch.cuda.stream(...)`, so the loop's whole step runs on your "
                                      "side stream (nothing overlaps, and the next copy queues behind the step)",
                                      "leave the `with torch.cuda.stream(self.stream):` block before you yield: "
                                      "only the copy goes inside it")
                log["horizons"].append(consumer._horizon())
                log["allocs"].append({images._alloc.id: images._alloc, labels._alloc.id: labels._alloc}
                                     if isinstance(images, DeviceTensor) and isinstance(labels, DeviceTensor) else {})
                held = [j for j in range(i - 1) if any(not a.freed for a in log["allocs"][j].values())]
                if held:
                    raise CheckFailed("keeps no batch the training loop is done with",
                                      f"{what}: when batch {i} was handed out, batch {held[0]} (the loop was done "
                                      f"with it {i - held[0] - 1} step{'s' if i - held[0] > 2 else ''} before) was "
                                      "still referenced by yours: device memory grows by a batch every step",
                                      "keep only the batch in flight (and the one handed out): no list of the "
                                      "batches, no attribute that outlives the step")
                vc.mark(images, f"batch {i}'s images")
                vc.mark(labels, f"batch {i}'s labels")
                images.float().mean()           # the model reads the batch at once, on its stream
                labels.sum()
                if i + 1 < len(consumers) and len(stack) > slot:
                    stack[slot] = consumers[i + 1]    # the loop's next step runs on its other stream
                log["loop_kernels"] = sum(s.kernels for s in consumers)      # the model's own reads, above
                for s in consumers:
                    s.first_kernel = None
            vc.reset_log()
            log["loop_kernels"] = 0
            for s in consumers:
                s.first_kernel = None
            return consume, on_loop_streams()     # the loop's device stays the current one

        logs = []
        made = []
        stopped = None            # what a pass stopped by a `break` left referenced, named after the next pass
        what = f"a loader of {n} pinned batch{'es' if n != 1 else ''} on {VIRTUAL} {device} (seed {seed})"
        try:
            for k, label, got in _passes(Prefetcher, loader, device, what, on_pass=on_pass, made=made):
                vc.settle()
                _judge_prefetch(vc, got, logs[-1], label, full=k != 2, pf=made[0] if made else None)
                if k == 2:
                    stopped = _kept_after_break(vc, allocs, made[0], label)
                if k == 3 and stopped:
                    label2, attrs = stopped
                    raise CheckFailed("keeps no batch the training loop is done with",
                                      f"{label2}: once the `break` had ended the pass (train(steps=...) makes one), "
                                      "the batch yours had already copied ahead was still referenced by yours"
                                      + (f" (self.{', self.'.join(attrs)})" if attrs else "")
                                      + " until the next pass replaced it: its device memory stays taken. State "
                                      "kept on self is also shared by two passes at once (zip(p, p), a loop "
                                      "nested in another), which then hand out each other's batches",
                                      "keep the loader's iterator and the batch in flight in local variables of "
                                      "__iter__, a generator (each `for` gets a new one, and a `break` frees it): "
                                      "nothing on self but the loader, the device and the stream")
                if k != 2:        # a pass run to its end: the loop is done with every batch, yours keeps none
                    left = [j for j, allocs in enumerate(logs[-1]["allocs"])
                            if any(not a.freed for a in allocs.values())]
                    if left:
                        raise CheckFailed("keeps no batch the training loop is done with",
                                          f"{label}: after the pass had ended and the loop had let every batch go, "
                                          f"batch {left[0]} was still referenced by yours (an attribute on self, "
                                          "say `self.last = batch`): its device memory stays taken until the next "
                                          "pass replaces it",
                                          "keep the batches in local variables of __iter__ only: nothing on self "
                                          "but the loader, the device and the stream")
        except RuntimeError as exc:
            raise _learner_error(exc, what) or exc


def _holds_device_tensor(value, depth=0) -> bool:
    if isinstance(value, DeviceTensor):
        return True
    if isinstance(value, (tuple, list)) and depth < 2:
        return any(_holds_device_tensor(v, depth + 1) for v in value)
    return False


def _kept_after_break(vc, allocs, pf, what):
    """After a pass stopped by a `break` (its generator let go): the batches copied in that pass
    that something still references, and the attributes of the prefetcher that hold one."""
    copied = {c.dst for c in vc.h2d() if c.dst is not None}

    def kept():
        return [allocs[d] for d in copied if d in allocs and not allocs[d].freed]

    if kept():
        import gc
        gc.collect()              # a reference cycle is not a reference kept
        if kept():
            attrs = [k for k, v in vars(pf).items() if _holds_device_tensor(v)] if hasattr(pf, "__dict__") else []
            return what, attrs
    return None


def _judge_prefetch(vc, got, log, what, *, full=True, pf=None):
    h2d, consumer, copies_at = vc.h2d(), log["consumer"], log["copies_at"]
    kept_default = [k for k, v in vars(pf).items() if v is vc.default_stream] \
        if pf is not None and hasattr(pf, "__dict__") else []      # a loop's stream kept on self
    loop_ids = {s.id for s in log.get("consumers", [consumer])}
    if full:
        batch_bytes = sum(x.numel() * x.element_size() + y.numel() * y.element_size() for x, y in got)
        copied = sum(c.nbytes for c in h2d)
        if copied != batch_bytes:
            raise CheckFailed("copies each batch to the device once", f"{what}: {copied:,} bytes copied from the "
                              f"host for {batch_bytes:,} bytes of batches ({len(h2d)} copies)",
                              "one .to(device, non_blocking=True) per tensor of each batch")
    pageable = [c for c in h2d if not c.pinned]
    if pageable:
        raise CheckFailed("copies from the loader's pinned memory",
                          f"{what}: {len(pageable)} of {len(h2d)} copies came from pageable memory (at "
                          f"{pageable[0].where}): the loader's batch is pinned, but a new host tensor made from it "
                          "(.clone(), .float(), .contiguous(), a cast) is not, and a copy from pageable memory makes "
                          "the host stage it, whatever non_blocking says",
                          "copy the loader's tensors themselves with .to(device, non_blocking=True); convert on the "
                          "device")
    blocking = [c for c in h2d if not c.non_blocking]
    if blocking:
        if len(blocking) == len(h2d) and all(c.stream in loop_ids for c in h2d):   # the CUDA path never ran
            raise CheckFailed("copies asynchronously",
                              f"{what}: {len(blocking)} of {len(h2d)} copies were blocking (at {blocking[0].where}), "
                              f"all on the training loop's stream: on {vc.device} yours took the path meant for other "
                              "devices. Does your test for CUDA hold for every CUDA device? str(device) == \"cuda\" "
                              f"is False for '{vc.device}' (and for 'cuda:0')",
                              "decide with the device's type, `self.device.type == \"cuda\"` (self.device = "
                              "torch.device(device)), then copy with .to(device, non_blocking=True) on your stream")
        raise CheckFailed("copies asynchronously", f"{what}: {len(blocking)} of {len(h2d)} copies were blocking "
                          f"(at {blocking[0].where})",
                          "from pinned memory, .to(device, non_blocking=True) queues the copy and returns at once")
    on_consumer = [c for c in h2d if c.stream in loop_ids]
    if on_consumer:
        side_elsewhere = [s for s in vc.streams if s.index != vc.device.index and s is not vc._defaults.get(s.index)]
        raise CheckFailed("copies on a side stream", f"{what}: {len(on_consumer)} of {len(h2d)} copies were queued on "
                          "the training loop's own stream, where the next step's kernels wait for them"
                          + (f" (your side stream is on cuda:{side_elsewhere[0].index}, and a copy to "
                             f"{vc.device} is queued on {vc.device}'s current stream)" if side_elsewhere else ""),
                          "create `self.stream = torch.cuda.Stream(device)` once (with the device) and copy inside "
                          "`with torch.cuda.stream(self.stream):`")
    extra = [s for s in vc.streams if s.id not in loop_ids and s.kernels]
    if extra:
        name, where = extra[0].first_kernel
        raise CheckFailed("launches nothing on the device but the copies",
                          f"{what}: yours ran {sum(s.kernels for s in extra)} operations besides the copies on its "
                          f"side stream ({name} at {where}): work on every batch that the copy does not need",
                          "the copy itself gives a new tensor on the device: .to(device, non_blocking=True), nothing "
                          "more (no .clone(), no conversion)")
    late = [i for i, count in enumerate(copies_at[:-1]) if count < 2 * (i + 2)]
    if late:
        i = late[0]
        raise CheckFailed("copies the next batch before handing out this one",
                          f"{what}: when batch {i} was handed out, only {copies_at[i]} copies had been started "
                          f"(batch {i + 1}'s copy was not among them)",
                          "start the copy of the following batch before you yield the current one, so that "
                          "it runs while the model computes")
    host = [r for r in vc.races if r.kind == "host_write"]
    if host:
        raise CheckFailed("leaves pinned memory alone while a copy from it is queued",
                          f"{what}: {host[0].what} (at {host[0].where}): on a GPU the copy reads the memory when "
                          "the side stream gets to it, not when .to() returns, so the batch can arrive with the next "
                          "one's pixels",
                          "copy from the loader's own pinned batch (each batch has its own memory), or give every "
                          "batch a buffer of its own; refill a buffer only after an event recorded after its copy "
                          "has completed")
    if vc.pins:
        raise CheckFailed("pins nothing in the training loop",
                          f"{what}: yours pinned host memory {len(vc.pins)} times in {len(got)} batches (first at "
                          f"{vc.pins[0]}): pinning copies the data into new page-locked memory, in the training loop",
                          "the loader's batches are pinned already (DataLoader(pin_memory=True) pins them, in its own "
                          "thread when it has workers): copy them as they are")
    races = [r for r in vc.races if r.kind == "device"]
    if races:
        race = races[0]
        reader = vc._by_id.get(race.stream)
        others = [s for s in log.get("consumers", []) if s.id != race.stream and race.writer in s.waited]
        if all(r.label.startswith("batch 0's") for r in races) and len(got) > 1:
            how = (": the loop's stream waited for your side stream before every later batch, but not before the "
                   "first batch of the pass: batch 0 was read with no wait at all (however long the start-up, on a "
                   "GPU nothing orders the read after the copy but the wait)")
        elif elsewhere := [s for s in vc._by_id.values() if s.index != vc.device.index and race.writer in s.waited]:
            how = (f": yours made a stream of {elsewhere[0].device} wait, not the loop's stream on {vc.device}: "   # w11-03
                   "torch.cuda.current_stream() without a device is the current device's stream (cuda:0 here), "
                   "not the stream of the device the batches are on, so the stream that read them never waited; "
                   "pass the device: torch.cuda.current_stream(self.device)")
        elif (reader is not None and race.writer in reader.waited and not any(w[1] is None for w in vc.wait_calls)
              and (n_waits := sum(w == (reader.id, race.writer) for w in vc.wait_calls)) < len(got)):
            how = (f": yours made the loop's stream wait for your side stream {n_waits} time(s) in all, for "   # w12-03
                   f"{len(got)} batches in this pass: a wait covers only the copies queued before it, so a wait "
                   "made once (before the first batch, say) leaves every later batch's copy unwaited for; wait at "
                   "every hand-out, for the batch handed out")
        elif reader is not None and race.writer in reader.waited:
            how = (": the loop's stream did wait for your side stream, but for a point before this batch's copy "
                   "was queued (an event recorded on the side stream before the copy, or a wait made before it): "
                   "the event was misplaced")
        elif others:
            how = (": the loop changed streams after its first step (a loop may, between any two steps), and "
                   "yours made the stream that was current at an earlier hand-out wait, not the one current when "
                   "this batch was handed out: ask torch.cuda.current_stream(device) at each hand-out, not once "
                   "per pass")
        elif (reader is not None and reader is not vc.default_stream
              and race.writer in vc.default_stream.waited and kept_default):    # w10-03 w31_consumer_once
            how = (f": yours made self.{kept_default[0]} wait, a stream asked once, when yours was made, and kept "
                   "(there, the device's default stream), but the loop ran this step on another stream, the one "
                   "current at this hand-out, which never waited: ask torch.cuda.current_stream(device) at each "
                   "hand-out, not once in __init__")
        elif (reader is not None and reader is not vc.default_stream
              and race.writer in vc.default_stream.waited):      # w9-03 w31_31: default_stream(device) waited
            how = (": yours made the device's default stream wait (torch.cuda.default_stream), but the loop ran "
                   "this step on a stream of its own, the current stream, which never waited: the default stream "
                   "is the loop's stream only while nothing else is current")
        else:
            how = (": the loop's stream never waited for your side stream (an event recorded on the loop's own "
                   "stream, or a wait for any other stream, does not cover the side stream's copies)")
        raise CheckFailed("the consumer waits for the copy",
                          f"{what}: {race.label or 'a batch'} was read on the training loop's stream before that "
                          f"stream waited for the side stream that copies it ({len(races)} such reads){how}",
                          "before handing out a batch: torch.cuda.current_stream(device).wait_stream(self.stream) "
                          "(the stream current when the batch is handed out, not the default one, and with the "
                          "device: without it, it is the current device's); with an event: record it on the side "
                          "stream after the copy is queued (event.record(self.stream) inside the stream block, "
                          "after .to()), then current_stream(device).wait_event(event)")
    for i in range(len(log["horizons"]) - 1):
        mine, following = log["allocs"][i], log["allocs"][i + 1]
        if not following or set(mine) & set(following):
            continue
        early = [c for c in h2d if c.dst in following and log["horizons"][i].get(c.stream, -1) >= c.seq]
        if early:
            raise CheckFailed("waits for this batch's copy only",
                              f"{what}: before reading batch {i}, the training loop's stream waited for batch "
                              f"{i + 1}'s copy too (queued at {early[0].where}): each step waits for the next "
                              "batch's copy, which is what the prefetcher was to hide",
                              "make the consumer wait (wait_stream) before you queue the next copy, or record an "
                              "event after each batch's copy and wait for that event")
    hazards = [a for a in vc.reuse_hazards() if a.label.startswith("batch ")]
    if hazards:
        recorded_elsewhere = [a for a in hazards if a.recorded]
        side = vc._by_id.get(hazards[0].stream)
        readers = sorted(hazards[0].used_on - {hazards[0].stream})
        waited_for = sorted(side.waited) if side is not None else []
        if recorded_elsewhere:
            detail = (f"record_stream was called for stream {sorted(recorded_elsewhere[0].recorded)} (your side "
                      "stream), not for the training loop's, which reads them")
        elif waited_for:
            detail = (f"no record_stream; your side stream waited for stream {waited_for} before its copies, but "
                      f"the batch was read on stream {readers} (the stream current when it was handed out): the "
                      "wait must cover the stream that read the batch, not the one current at the next copy, and "
                      "the loop may change streams between passes")
        else:
            detail = "no record_stream for the training loop's stream, and no wait of the side stream for it"
        raise CheckFailed("keeps a batch's memory for the consumer's stream (record_stream)",
                          f"{what}: {', '.join(a.label for a in hazards[:3])} were allocated on the side stream, "
                          f"read on the training loop's stream, freed, and their memory handed to the next copy on "
                          f"the side stream while the loop's reads could still be queued ({detail}): on a GPU the "
                          "next batch can overwrite a batch the model still reads",
                          "tensor.record_stream(torch.cuda.current_stream(device)) for both tensors of each batch, "
                          "the consumer's stream at hand-out (or make the side stream wait, before each copy, for "
                          "the stream that read the batch being freed: keep the stream current at hand-out, and "
                          "self.stream.wait_stream(that stream))")
    if vc.syncs:
        polls = [s for s in vc.syncs if "query()" in s.what]
        if polls:
            raise CheckFailed("never makes the host wait",
                              f"{what}: the host waited for the device {len(vc.syncs)} times ({polls[0].what} at "
                              f"{polls[0].where}): a loop on query() is the host waiting, with a core spinning all "
                              "the while, on every batch; and the training loop's stream itself never waited for "
                              "the copy: only the host did",
                              "make the training loop's stream wait, on the device, and let the host go on: "
                              "torch.cuda.current_stream(device).wait_stream(self.stream) (or wait_event(event) with "
                              "an event recorded after the copy); no query() loop")
        raise CheckFailed("never makes the host wait", f"{what}: the host waited for the device {len(vc.syncs)} times "
                          f"({vc.syncs[0].what} at {vc.syncs[0].where})",
                          "wait on the device (wait_stream), not on the host (synchronize, .item(), a blocking copy)")


HOLD_MS = 25.0       # how long the side stream is kept busy before each copy, on a real GPU


def _sleep_cycles_per_ms(device) -> float | None:
    """GPU clock cycles per millisecond, measured with a spinning kernel (torch.cuda._sleep) and
    CUDA events; None where this torch has no such kernel."""
    if not hasattr(torch.cuda, "_sleep"):
        return None
    with torch.cuda.device(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(5_000_000)
        end.record()
        end.synchronize()
        return 5_000_000 / max(start.elapsed_time(end), 1e-3)


def _hold(streams, cycles: int) -> None:
    """Queue a spinning kernel on each stream: work queued there next (the prefetcher's next copy)
    starts only after it, so a consumer that does not wait for the stream reads too early."""
    for stream in streams:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(cycles)


def _check_cuda_streams(Prefetcher):
    device = torch.device("cuda", torch.cuda.current_device())
    per_ms = _sleep_cycles_per_ms(device)
    loader = _ScriptedLoader(0, 6, pinned_big=True)
    pf = Prefetcher(loader, device)
    it = iter(pf)
    bad = []
    for i in range(6):
        images, labels = _as_pair(next(it), f"big pinned batches, batch {i}")
        if i == 0:
            consumer = torch.cuda.current_stream(device)
            side = [s for s in _streams_in(pf, it) if s.cuda_stream != consumer.cuda_stream]
            if not side:
                raise CheckFailed("copies on a side stream", "no torch.cuda.Stream other than the current one was "
                                  "found on your prefetcher (or in its __iter__)",
                                  "create `self.stream = torch.cuda.Stream(device)` and copy inside "
                                  "`with torch.cuda.stream(self.stream):`")
        if per_ms is not None:       # the copy queued on the side stream during the next call waits behind this
            _hold(side, int(HOLD_MS * per_ms))
        value = float(i + 1)
        # read at once, on the consumer's stream: without wait_stream this races the copy
        if not bool((images == value).all()):
            bad.append(i)
    for _ in it:
        pass
    torch.cuda.synchronize(device)
    if bad:
        raise CheckFailed("the consumer waits for the copy", f"batches {bad} were read before their copy had "
                          f"finished (the values were not yet there; the side stream was held busy "
                          f"{HOLD_MS:.0f} ms before each copy, as a slow copy would keep it)",
                          "before handing out a batch: torch.cuda.current_stream().wait_stream(self.stream)")


# -- 3.2 batched random crop + flip ----------------------------------------------------------------

def _windows(images, padding):
    padded = F.pad(images, (padding,) * 4)
    n, c, h, w = images.shape
    k = 2 * padding + 1
    s = padded.stride()
    return padded.as_strided((n, k, k, c, h, w), (s[0], s[2], s[3], s[1], s[2], s[3]))


def _one_crop_for_all(fn, what, also):
    """A function that drew on the host and so failed with the device's generator: run it on the
    CPU with a CPU generator, on 64 distinct images, and name one crop shared by the whole batch
    (transforms.v2 on a batch) before the host draws, its smaller mistake."""
    size, p, n = 12, 4, 64
    grid = (torch.arange(size * size, dtype=torch.float32) + 1).view(1, 1, size, size).expand(n, 1, size, size)
    try:
        out = fn(grid.contiguous(), padding=p, generator=torch.Generator().manual_seed(1))
        dy, dx, flipped = _offsets_of(_values(out), size, p)
    except Exception:
        return
    if dy is None or len(torch.unique(dy)) > 1 or len(torch.unique(dx)) > 1 or len(torch.unique(flipped)) > 1:
        return
    raise CheckFailed("offsets vary across samples, uniformly",
                      f"{what}: yours gives every image of the batch the same crop and the same flip (run on the "
                      f"CPU with a CPU generator, all {n} images got offsets ({int(dy[0])}, {int(dx[0])}), "
                      f"{'all' if bool(flipped[0]) else 'none'} flipped): one draw for the whole batch, as "
                      f"transforms.v2 applied to a batch tensor does. And {also}",
                      "draw one offset per sample and one flip per sample (tensors of N), on the images' device: "
                      "torch.randint(0, 2 * padding + 1, (n,), device=images.device, generator=generator)") from None


def _call_crop(fn, images, padding, generator, what, vc=None, *, defaults=False):
    """Call the learner's function (with `defaults`, as fn(images)); on the virtual device, also
    judge what it did there."""
    before = _values(images).clone()
    wider, indices = [], []
    if vc is not None:
        vc.reset_log()
        wide = [d for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
                if d.itemsize > images.element_size()]
        wider = _watch_dtypes(vc, tuple(wide), min_numel=images.numel())
        indices = _watch_dtypes(vc, (torch.int64,), min_numel=images.numel())   # w9-03 w32_21
    n, c, h, w = images.shape
    shape = f"images of shape {tuple(images.shape)}{' (not square)' if h != w else ''}, {images.dtype}"
    try:
        with calling(f"random_crop_flip(images) on {shape}" if defaults else
                     f"random_crop_flip(images, padding={padding}, generator=...) on {shape}"):
            out = fn(images) if defaults else fn(images, padding=padding, generator=generator)
    except RuntimeError as exc:
        if "device type for generator" in str(exc):
            _one_crop_for_all(fn, what, f"on the device yours drew on the CPU: CUDA says: {exc}")   # w9-03 w32_01
        raise _learner_error(exc, what) or exc
    finally:
        if vc is not None:
            del vc._dispatch                          # the device's own method again
    if not isinstance(out, torch.Tensor):
        raise CheckFailed("returns a tensor", f"{what}: yours returned {type(out).__name__}")
    if not trusted.torch_equal(_values(images), before):
        raise CheckFailed("leaves its input unchanged", f"{what}: the images passed in were modified",
                          "work on a padded copy (F.pad returns a new tensor)")
    if out.shape != images.shape:
        _one_crop_for_all(fn, what, f"yours returned {tuple(out.shape)} for an input of {tuple(images.shape)}: "
                          "each crop must be H x W, the input's own size (RandomCrop(H) crops H x H)")
        raise CheckFailed("keeps the shape", f"{what}: input {tuple(images.shape)}, yours {tuple(out.shape)}",
                          "each crop is H x W, the size of the input image, taken from the padded image")
    if out.dtype != images.dtype or out.device != images.device or isinstance(images, DeviceTensor) != isinstance(
            out, DeviceTensor):
        raise CheckFailed("keeps dtype and device", f"{what}: input {images.dtype} on {images.device}, yours "
                          f"{out.dtype} on {out.device}", "use tensor ops on the images' device; no .cpu(), no .float()")
    if vc is not None:
        _no_host_traffic(vc, what, "crops")
        batch = images.numel() * images.element_size()
        if vc.peak_bytes > 16 * batch:
            hint = ("index the padded batch directly (or a strided view of its windows); do not materialise every "
                    "window of every image")
            if indices and not wider:
                hint = (f"yours built int64 index tensors as large as the batch ({len(indices)}, {indices[0]} "
                        f"first): 8 bytes of index for every {images.element_size()}-byte pixel; index with small "
                        "per-sample tensors that broadcast (rows of shape (N, 1, H, 1), columns (N, 1, 1, W), or "
                        "(N, H, 1) and (N, 1, W) with advanced indexing), not index tensors expanded to (N, C, H, W)")
            if wider:
                hint = (f"yours converted the batch to a wider dtype ({wider[0]}): {images.dtype} pixels become "
                        "4 or 8 bytes each, in every intermediate; crop and flip in the images' own dtype "
                        "(indexing, F.pad and flip work on uint8), no .float() and back")
            raise CheckFailed("uses memory in proportion to the batch",
                              f"{what}: yours had {vc.peak_bytes / 2**20:.1f} MiB of device memory allocated at once "
                              f"for a {batch / 2**20:.1f} MiB batch ({vc.peak_bytes / batch:.0f}x)", hint)
    return out


MAX_CROP_OPS = 80     # operations on the device per call (the course's answer runs 14; a loop over the 81 offsets, 300+)


def _launch_count(ops, on, seed):
    """`ops`: {batch size: operations the call ran on the device}. A Python loop over the samples
    runs more for more samples; any call that runs many is launch-bound on a GPU."""
    (n_big, k_big), (n_small, k_small) = sorted(ops.items(), reverse=True)
    what = f"random uint8 images 3x32x32, padding=4, on {on}: {n_small} of them, and {n_big} (seed {seed})"
    if k_big - k_small >= (n_big - n_small) // 2:
        per = (k_big - k_small) / (n_big - n_small)
        raise CheckFailed("runs the same operations for any batch size (no Python loop over the samples)",
                          f"{what}: yours ran {k_small} operations on the device for {n_small} images and {k_big} "
                          f"for {n_big}, {per:.1f} more per sample: a Python loop over the samples. On a GPU each "
                          f"operation is a kernel launch from the host (about 30 us): at batch 128 that is "
                          f"{128 * per * 0.03:.0f} ms per batch, longer than the training step",
                          "draw the offsets and flips for the whole batch at once and pick every window with one "
                          "indexing (or torch.gather): the number of operations must not depend on N")
    if k_big > MAX_CROP_OPS:
        raise CheckFailed("runs a few operations per batch",
                          f"{what}: yours ran {k_big} operations on the device for one batch (the course's answer "
                          f"runs 14): a Python loop (over the offsets? the channels?) launches them one by one, each "
                          f"a kernel launch of about 30 us of host time on a GPU, {k_big * 0.03:.0f} ms per batch",
                          "index all the windows at once: padded[n_idx, :, rows, cols] with (N, H) rows and (N, W) "
                          "columns, or torch.gather; no loop")


def _no_host_traffic(vc, what, result):
    h2d = vc.h2d()
    if h2d:
        back = vc.reads() or vc.d2h()
        if back:        # the first mistake is the read back: the copy down again only follows from it
            raise CheckFailed("makes no copy from the host",
                              f"{what}: values came back to the host first ({back[0].what} at {back[0].where}), "
                              f"then went down again: {len(h2d)} copies from the host to the device during the "
                              f"call ({h2d[0].what} at {h2d[0].where})",
                              f"do not read the values back ({back[0].what}): use the device tensors themselves "
                              "(dy[:, None] + torch.arange(h, device=images.device)); both the read back and the "
                              "copy down make the host wait, every batch")
        raise CheckFailed("makes no copy from the host", f"{what}: {len(h2d)} copies from the host to the device "
                          f"during the call ({h2d[0].what} at {h2d[0].where})",
                          "create every tensor on images.device (torch.randint(..., device=images.device)); a "
                          "copy every batch waits for the host, which is what running on the device avoids")
    if vc.d2h() or vc.reads():
        first = (vc.reads() or vc.d2h())[0]
        raise CheckFailed("never waits for the device", f"{what}: the {result} (or values they need) came back to "
                          f"the host {max(len(vc.reads()), len(vc.d2h()))} times ({first.what} at {first.where})",
                          "no .item(), .tolist(), .cpu(), float(t) or Python loop over the values: keep whole-batch "
                          "tensor operations on the device")


def _is_window_of(out_i, padded, h, w, flips):
    """Is `out_i` (c, h, w) an h x w window of `padded` (c, H, W), as it is or flipped on one of `flips`?"""
    c, big_h, big_w = padded.shape
    s = padded.stride()
    win = padded.as_strided((big_h - h + 1, big_w - w + 1, c, h, w), (s[1], s[2], s[0], s[1], s[2]))
    o = out_i.to(torch.float64)
    for dims in flips:
        cand = win.flip([d + 5 for d in dims]) if dims else win
        if bool((cand == o).flatten(2).all(-1).any()):
            return True
    return False


def _crop_mistake(out_i, host_i, p):
    """A sample that is no crop of the zero-padded image: which neighbouring crop is it? (w8-03: five
    mistakes shared one hint.) None when it is none of them. float64 holds every value the check uses."""
    if out_i.shape != host_i.shape:
        return None
    img = host_i.to(torch.float64)[None]
    c, h, w = host_i.shape
    both = [(), (-1,)]
    zero = F.pad(img, (p,) * 4)[0]
    if _is_window_of(out_i, zero, h, w, [(-2,), (-2, -1)]):
        return ("yours turned the sample upside down: a horizontal flip mirrors the width (last) axis, not the "
                "height (rows); flip only the columns")
    if _is_window_of(out_i, F.pad(img, (0, 2 * p, 0, 2 * p))[0], h, w, both):
        return (f"yours padded only the right and bottom (2*padding there, none on the left and top): pad all four "
                f"sides, F.pad(images, (p, p, p, p)), so that offset p (= {p}) is the image itself")
    if p < min(h, w):
        for mode, said in (("circular", "yours wraps around: the pixels shifted out on one side come back on the "
                                        "other (torch.roll, or indices % H); the shift must bring in zeros"),
                           ("reflect", "yours pads by reflection (mode='reflect'): the border must be zeros"),
                           ("replicate", "yours repeats the edge pixels (indices clamped to the image, or "
                                         "mode='replicate'): the border must be zeros")):
            if _is_window_of(out_i, F.pad(img, (p,) * 4, mode=mode)[0], h, w, both):
                return (f"{said}: pad with zeros, F.pad(images, (p, p, p, p)) (its default mode='constant'), and "
                        f"take the window of the padded image")
    for q in range(1, 9):
        if q != p and _is_window_of(out_i, F.pad(img, (q,) * 4)[0], h, w, both):
            return (f"yours crops as if padding were {q}, not the {p} the call asked for: use the padding argument "
                    f"everywhere (the pad and the offsets' range, 0..2*padding)")
    return None


def _exact_crops(out, host, p, what):
    win = _windows(host, p)                                          # (n, k, k, c, h, w)
    plain = (win == out[:, None, None]).flatten(3).all(-1)
    mirrored = (win.flip(-1) == out[:, None, None]).flatten(3).all(-1)
    ok = (plain | mirrored).flatten(1).any(1)
    if not bool(ok.all()):
        i = int((~ok).nonzero()[0])
        hint = ("pad all four sides with zeros (F.pad(images, (p, p, p, p))), draw each offset in "
                "0..2*padding inclusive, take the H x W window there, and flip the last (width) axis")
        named = _crop_mistake(out[i], host[i], p)
        if named:
            hint = named
        elif bool(trusted.torch_equal(out[i], host[i].flip(-2))):
            hint = "a horizontal flip mirrors the width (last) axis, not the height"
        elif host.dtype == torch.int64 and not bool(torch.isin(out[i], torch.cat([host[i].flatten(),
                                                                                 host.new_zeros(1)])).all()):
            hint = ("yours changed pixel values that are not in the image: int64 values above 2**24 do not survive "
                    "a trip through float32 (a flip blended with a float mask, a .float() and back); crop and flip "
                    "by indexing, in the images' own dtype (torch.where or indexing, not arithmetic)")
        raise CheckFailed("every output is a crop of the padded input, mirrored or not",
                          f"{what}: sample {i} is not the H x W window of its zero-padded image at any "
                          f"offset in 0..{2 * p}, plain or mirrored", hint)


@exercise("3.2", "Random crop with padding and flip, for a whole batch on the device", points=2)
@forbids("course_utils.device_data:random_crop_flip")
@single_threaded
def check_crop_flip(random_crop_flip):
    """Exercise 3.2: exact crops and flips, their statistics, reproducibility, and on a virtual GPU
    no copy, no read-back, memory in proportion. Statistical resolution (w12-03): the flip rate is
    read from 200,000 samples, and 0.5 +- 0.006 passes (a right answer fails with probability
    about 8e-8); a rate 0.5 +- 0.0113 or further (0.488, 0.485, 0.48) fails with probability over
    1 - 1e-6, while rates between about 0.489 and 0.511 cannot be told from 1/2 at this size. The
    samples' independence: the agreement of sample i and i + k at every lag k up to n/2 (20,000
    samples, z 7.5) and of every pair of positions over 48 calls of 16 (tail 1e-10 each)."""
    expect_callable(random_crop_flip, "a function random_crop_flip(images, padding=4, generator=None) -> tensor")
    rng, seed = fresh_rng()
    places = ["virtual", "cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for place in places:
        with (VirtualCuda() if place == "virtual" else _nothing()) as vc:
            on = VIRTUAL if place == "virtual" else place
            device = torch.device("cuda" if place != "cpu" else "cpu")

            def to_device(host):
                return vc.to_device(host) if vc is not None else host.to(device)

            def generator(s):
                if vc is not None:
                    return vc.generator(s)
                return torch.Generator(device=device).manual_seed(int(s))

            # (a) every output is an exact crop of the zero-padded input, mirrored or not; on the
            # virtual device, as many operations for 40 images as for 96 (no loop over the samples)
            ops = {}
            # "any dtype": int64 values far beyond float32's 2**24, which a trip through float changes
            # (w8-03: a flip blended with a float mask, exact on uint8)
            for n, c, h, w, p, dtype in [(96, 3, 32, 32, 4, torch.uint8), (40, 3, 32, 32, 4, torch.uint8),
                                         (40, 3, 11, 14, 2, torch.float32), (24, 2, 9, 10, 3, torch.int64)]:
                what = f"{n} random {dtype} images {c}x{h}x{w}, padding={p}, on {on} (seed {seed})"
                if dtype == torch.int64:
                    what = (f"{n} random int64 images {c}x{h}x{w} with values up to 2**40, padding={p}, on {on} "
                            f"(seed {seed})")
                    host = torch.from_numpy(rng.integers(-2 ** 40, 2 ** 40, (n, c, h, w), dtype=np.int64))
                else:
                    host = torch.from_numpy(rng.integers(0, 256, (n, c, h, w), dtype=np.uint8)).to(dtype)
                out = _call_crop(random_crop_flip, to_device(host), p, generator(rng.integers(1 << 31)), what, vc)
                if vc is not None and h == 32:
                    ops[n] = vc.ops
                _exact_crops(_values(out), host, p, what)
                del out
            if vc is not None:
                _launch_count(ops, on, seed)
            # (b) offsets and flips vary across samples, uniformly, in one call (where it runs on a device)
            if place != "cpu":
                # torch's own generator (generator=None) seeded from the check's seed, so that the
                # 20,000 draws vary with COURSE_CHECK_SEED (w10-03: a fresh process drew the same
                # numbers under every seed); from the seed, not from rng, so later inputs stay put
                torch.manual_seed((seed * 2654435761 + 12345) % (1 << 31))
                _crop_statistics(random_crop_flip, to_device, generator, rng, on, seed, vc)
            # (c) every call draws anew, from a generator passed in or from torch's own; reproducible
            # under a seed; another seed gives other crops
            s = int(rng.integers(1 << 31))
            images = to_device(torch.from_numpy(rng.integers(0, 256, (64, 3, 32, 32), dtype=np.uint8)))
            what = f"64 images on {on}, generator seeded {s}"
            g = generator(s)
            calls = _two_calls(random_crop_flip, images, g, what + ", called twice with it", vc)
            torch.manual_seed(s)
            if place == "cuda":
                torch.cuda.manual_seed(s)
            calls += _two_calls(random_crop_flip, images, None, f"64 images on {on}, generator=None, called twice", vc)
            for (x, y), how in (((calls[0], calls[1]), "with the same generator"),
                                ((calls[2], calls[3]), "with generator=None")):
                if trusted.torch_equal(x, y):
                    raise CheckFailed("draws new crops on every call",
                                      f"{what}: two calls in a row {how} gave the same crops and flips: every "
                                      "batch of an epoch would be augmented alike",
                                      "a generator re-seeded (or made anew from a fixed seed) on every call restarts "
                                      "from the same state: draw from the `generator` passed in, or from torch's "
                                      "global one when it is None, and never call manual_seed inside the function")
            a = _values(_call_crop(random_crop_flip, images, 4, generator(s), what, vc))
            b = _values(_call_crop(random_crop_flip, images, 4, generator(s), what, vc))
            if not trusted.torch_equal(a, b):
                raise CheckFailed("reproducible under a seed", f"{what}: two calls with generators seeded alike differ",
                                  "draw every random number from `generator` (torch.randint(..., generator=generator))")
            other = _values(_call_crop(random_crop_flip, images, 4, generator(s + 1), what, vc))
            if trusted.torch_equal(a, other):
                raise CheckFailed("uses the generator it is given", f"{what}: seeds {s} and {s + 1} gave identical crops",
                                  "pass `generator` to every torch.randint / torch.rand call")
            runs = []
            for _ in range(2):
                torch.manual_seed(s)
                if place == "cuda":
                    torch.cuda.manual_seed(s)
                runs.append(_values(_call_crop(random_crop_flip, images, 4, None, what + " (generator=None)", vc)))
            if not trusted.torch_equal(*runs):
                raise CheckFailed("with generator=None, reproducible under torch.manual_seed",
                                  f"{what}: two calls after torch.manual_seed({s}) differ",
                                  "with generator=None, draw from torch's global generator: pass generator=None "
                                  "on to torch.randint and torch.rand (that is their default), and torch.manual_seed "
                                  "resets it. A generator of your own kept between calls (made once with a fixed "
                                  "seed), Python's random or NumPy ignore torch.manual_seed")
    return ("exact crops of the zero-padded batch, mirrored or not (uint8, float32, and int64 up to 2**40), offsets "
            "uniform over 0..2*padding (at padding 4 and 2) and flips uniform per sample, "
            "reproducible; on a (virtual) GPU no copy from the host, nothing read back, memory in proportion.")


def _two_calls(fn, images, generator, what, vc):
    """Two calls in a row; the first call's result must not change when the second runs."""
    first = _call_crop(fn, images, 4, generator, what, vc)
    kept = _values(first).clone()
    second = _call_crop(fn, images, 4, generator, what, vc)
    a, b = _values(first), _values(second)
    if a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() or not trusted.torch_equal(a, kept):
        raise CheckFailed("returns a new tensor on every call",
                          f"{what}: the second call changed the first call's result: yours writes every batch into "
                          "one buffer kept between calls, so a batch still in use (the training step's, or one a "
                          "loader prepared ahead) changes under it",
                          "return a new tensor from every call (indexing, torch.where and F.pad each make one); "
                          "keep nothing between calls")
    return [kept, b.clone()]


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def _chi2_limit(df: int, z: float = 5.2) -> float:
    """The chi-square value that independent, uniform draws exceed with probability about 1e-7
    (z standard deviations; Wilson and Hilferty's approximation)."""
    k = 2 / (9 * df)
    return df * (1 - k + z * k ** 0.5) ** 3


def _chi2_uniform(a, b, ka, kb):
    """Chi-square of the pairs (a, b) (values 0..ka-1, 0..kb-1) against all ka * kb pairs alike;
    and the cell counts."""
    counts = torch.bincount(a.long() * kb + b.long(), minlength=ka * kb).double()
    expected = len(a) / (ka * kb)
    return float(((counts - expected) ** 2 / expected).sum()), counts.view(ka, kb)


def _crop_statistics(fn, to_device, generator, rng, on, seed, vc):
    n, size, p = 20_000, 12, 4
    k = 2 * p + 1
    grid = (torch.arange(size * size, dtype=torch.float32) + 1).view(1, 1, size, size).expand(n, 1, size, size)
    what = (f"one call random_crop_flip(images) with its defaults (padding 4, generator None) on {n:,} one-channel "
            f"images {size}x{size}, on {on} (seed {seed})")
    images = to_device(grid.contiguous())
    out = _values(_call_crop(fn, images, p, None, what, vc, defaults=True))
    dy, dx, flipped = _offsets_of(out, size, p)
    if (dy is not None and int(dy.min()) > 0 and int(dx.min()) > 0 and int(dy.min()) + int(dy.max()) == 2 * p
            and len(torch.unique(dy)) >= 3):          # a narrower range, centred: a smaller padding
        raise CheckFailed("pads by 4 by default", f"{what}: offsets only in {int(dy.min())}..{int(dy.max())} of the "
                          f"image padded by 4: yours padded by less", "def random_crop_flip(images, padding=4, "
                          "generator=None)")
    if dy is None:
        raise CheckFailed("every output is a crop of the padded input, mirrored or not",
                          f"{what}: some outputs are not crops at an offset within 0..{2 * p}")
    _untouched_tail(dy, dx, flipped, p, what)
    # a draw reused by another sample first (w12-03: a repeated half doubles every count's variance,
    # which the uniformity and pair tests below would otherwise name as something else)
    for values, name in ((dy, "vertical offset"), (dx, "horizontal offset")):
        _lag_agreement(values, k, name, what)
    _uniform(dy, k, "vertical offsets", what)
    _uniform(dx, k, "horizontal offsets", what)
    _judge_flip_parts(flipped, what)       # a pattern by position (w32c: the first half only), named as one
    share = float(flipped.float().mean())
    if not 0.4 <= share <= 0.6:      # 28 standard deviations of a fair coin over 20,000 samples
        raise CheckFailed("flips half the samples", f"{what}: yours flipped {share:.1%}",
                          "draw one flip per sample with probability 1/2, e.g. torch.rand(n) < 0.5")
    _lag_agreement(flipped.long(), 2, "flip", what)
    # the padding passed in sets the range: uniform over 0..2*padding at another padding too
    p2, n2 = 2, 8_000       # 1,600 expected per offset: the 15% band is over 6 standard deviations wide
    what2 = (f"one call random_crop_flip(images, padding={p2}, generator=...) on {n2:,} one-channel images "
             f"{size}x{size}, on {on} (seed {seed})")
    out2 = _values(_call_crop(fn, images[:n2], p2, generator(rng.integers(1 << 31)), what2, vc))
    dy2, dx2, _ = _offsets_of(out2, size, p2)
    if dy2 is None:
        raise CheckFailed("every output is a crop of the padded input, mirrored or not",
                          f"{what2}: some outputs are not crops at an offset within 0..{2 * p2}")
    _uniform(dy2, 2 * p2 + 1, "vertical offsets", what2)
    _uniform(dx2, 2 * p2 + 1, "horizontal offsets", what2)
    del out2
    _flip_rate(fn, to_device, generator, rng, on, seed, vc)
    same = float((dy == dx).float().mean())
    if not 0.09 <= same <= 0.135:        # independent offsets agree 1/9 of the time
        raise CheckFailed("draws the two offsets independently", f"{what}: dy == dx for {same:.1%} of samples "
                          "(independent offsets: about 11%)", "draw dy and dx separately")
    # independent draws: every pair of (dy, dx), and of an offset and the flip, as often as any other
    chi, counts = _chi2_uniform(dy, dx, k, k)
    if chi > _chi2_limit(k * k - 1):
        a, b = divmod(int(counts.argmax()), k)
        raise CheckFailed("draws the two offsets independently",
                          f"{what}: the pairs (dy, dx) are not spread over the {k * k} combinations as independent "
                          f"draws spread them (chi-square {chi:,.0f}; independent draws stay below "
                          f"{_chi2_limit(k * k - 1):.0f}): dy = {a} came with dx = {b} in {int(counts[a, b])} of "
                          f"{int(counts[a].sum())} samples (about {int(counts[a].sum()) // k} expected)",
                          "two draws of their own, torch.randint(0, 2 * padding + 1, (n,), ...) for dy and another "
                          "for dx: not one computed from the other")
    for offsets, axis in ((dx, "horizontal"), (dy, "vertical")):
        chi, counts = _chi2_uniform(offsets, flipped, k, 2)
        if chi > _chi2_limit(2 * k - 1):
            rates = counts[:, 1] / counts.sum(1).clamp(min=1)
            lo, hi = int(rates.argmin()), int(rates.argmax())
            raise CheckFailed("draws the flips independently of the offsets",
                              f"{what}: yours flipped {float(rates[hi]):.0%} of the samples with {axis} offset {hi} "
                              f"and {float(rates[lo]):.0%} of those with offset {lo} (independent draws: about 50% "
                              "of each)",
                              "a draw of its own for the flips (torch.rand(n, ...) < 0.5), not one shared with an "
                              "offset")
    for values, kk, name in ((dy, k, "vertical offset"), (dx, k, "horizontal offset"), (flipped, 2, "flip")):
        chi, _ = _chi2_uniform(values[:-1], values[1:], kk, kk)
        if chi > _chi2_limit(kk * kk - 1):
            raise CheckFailed("draws each sample independently of the others",
                              f"{what}: the {name} of each sample follows from the one before it (chi-square "
                              f"{chi:,.0f} for the pairs of neighbours; independent draws stay below "
                              f"{_chi2_limit(kk * kk - 1):.0f}): a pattern by position, not a draw",
                              "draw all N values at once at random (torch.randint(..., (n,)), torch.rand(n) < 0.5)")
    # a second call draws anew, sample by sample (a pattern by position is the same in every call)
    made = getattr(vc, "generators_made", 0)
    again = _values(_call_crop(fn, images, p, None, what + ", called again", vc, defaults=True))
    fresh = getattr(vc, "generators_made", 0) > made        # w11-03 w32_fresh_generator_default
    dy2, dx2, flipped2 = _offsets_of(again, size, p)
    if dy2 is not None:
        for first, second, name, rate in ((dy, dy2, "vertical offset", 1 / k), (dx, dx2, "horizontal offset", 1 / k),
                                          (flipped, flipped2, "flip", 0.5)):
            agree = float((first == second).float().mean())
            if agree > rate + 7 * (rate * (1 - rate) / n) ** 0.5:
                if _reseeds(fn, images, p, generator, rng, vc, what):      # w10-03 w32_fixed_seed_when_none
                    raise CheckFailed("draws new crops on every call",
                                      f"{what}: two calls in a row gave {agree:.0%} of the samples the same {name}, "
                                      "yet two generators seeded differently and passed in give different crops: "
                                      + ("with generator=None yours makes a new torch.Generator in every call: "
                                         "a new generator is not random, it starts from the same seed each time "
                                         "it is made (its default seed, or the one manual_seed gives it), "
                                         "so yours draws from a generator seeded alike on every call and every "
                                         "batch is augmented alike" if fresh else
                                         "with generator=None yours draws from a generator seeded alike on every "
                                         "call (torch.Generator().manual_seed(...), or torch.manual_seed, inside "
                                         "the function), so every batch is augmented alike"),
                                      "when generator is None, pass None on to torch.randint and torch.rand (they "
                                      "then draw from torch's global generator, which advances); never make or seed "
                                      "a generator inside the function")
                raise CheckFailed("draws new crops on every call",
                                  f"{what}: two calls in a row gave {agree:.0%} of the samples the same {name} "
                                  f"(independent calls agree for about {rate:.0%}): a pattern fixed by the sample's "
                                  "position, the same in every batch",
                                  "draw the offsets and flips at random on every call")
    _per_position(fn, images, generator, rng, on, seed, vc, size, p)


LAG_Z = 7.5     # z of one lag's agreement count; 3 draws x 10,000 lags: a false alarm about 1e-9 in all


def _lag_agreement(values, kk, name, what):
    """Samples drawn independently of each other: for every lag k (1..n/2), sample i and sample
    i + k agree (equal values) as often as two independent draws do, sum of p_v**2 over the values
    (neither more, a copy, nor less, a negation). One FFT of the values' indicators gives the
    agreements at every lag at once. A batch whose second half reuses the first half's draws
    (.repeat(2)) agrees at lag n/2 for every pair (w12-03 w32c/w32d), a neighbour's copy at lag 1."""
    n = len(values)
    onehot = torch.nn.functional.one_hot(values.long().cpu(), kk).double().T        # (kk, n)
    share = onehot.mean(1)
    q = float((share ** 2).sum())
    if q > 0.99:               # (nearly) one value for all: the uniformity checks name that
        return
    size = 1 << (2 * n - 1).bit_length()
    f = torch.fft.rfft(onehot, n=size)
    agree = torch.fft.irfft(f * f.conj(), n=size)[:, :n].sum(0).round()            # agreements at lag 0..n-1
    lags = torch.arange(1, n // 2 + 1)
    pairs = (n - lags).double()
    z = (agree[lags] - pairs * q) / (pairs * q * (1 - q)).sqrt()
    worst = int(z.abs().argmax())
    if float(z[worst].abs()) > LAG_Z:
        lag, m, a = int(lags[worst]), int(pairs[worst]), int(agree[lags[worst]])
        how = ("reuses the draw of sample i" if a > m * q else
               "is made from the draw of sample i (it almost never equals it)")
        raise CheckFailed("draws each sample independently of the others",
                          f"{what}: the samples' crops/flips are not independent: the {name} of sample i + {lag:,} "
                          f"equals that of sample i in {a:,} of the {m:,} pairs ({a / m:.0%}; independent draws agree "
                          f"in about {q:.0%}, {m * q:,.0f} pairs): the {name} of sample i + {lag:,} {how}"
                          + (" (the second half of the batch repeats the first half's draws)"
                             if abs(lag - n // 2) <= 1 else ""),
                          "draw all N values at once, one per sample (torch.randint(..., (n,)), torch.rand(n) < 0.5), "
                          "and use each for its own sample: no draw for half the batch repeated, no sample's draw "
                          "copied to another")


FLIP_N, FLIP_BAND = 200_000, 0.006     # the flip rate's sample and band around 1/2 (see _flip_rate)


def _flip_rate(fn, to_device, generator, rng, on, seed, vc):
    """The flip rate is 1/2, read from {FLIP_N} tiny images (5x5, padding 1: the offsets and the
    flip can be read from the centre pixel and its right neighbour).

    Statistical resolution: one standard deviation of a fair coin's share over 200,000 samples is
    0.11 points; the band 0.5 +- 0.006 is 5.4 of them, so a right answer fails with probability
    about 8e-8. A rate of 0.5 +- 0.0113 or further (0.488, 0.485, 0.48, 0.52) is outside the band by
    4.75 standard deviations or more and fails with probability over 1 - 1e-6; rates between about
    0.489 and 0.511 cannot be told from 1/2 at this size (0.49 fails on nearly every seed, not all).
    Then, each part of the batch (even and odd positions, first and second half) flips as often as
    the rest of it (a pattern by position), compared with each other, so that a biased but random
    rate is named as a rate, never as a pattern by position (_judge_flip_parts)."""
    n, size, p = FLIP_N, 5, 1
    what = (f"one call random_crop_flip(images, padding={p}, generator=...) on {n:,} one-channel images "
            f"{size}x{size}, on {on} (seed {seed})")
    grid = (torch.arange(size * size, dtype=torch.float32) + 1).view(1, 1, size, size).expand(n, 1, size, size)
    out = _values(_call_crop(fn, to_device(grid.contiguous()), p, generator(rng.integers(1 << 31)), what, vc))
    dy, dx, flipped = _offsets_of(out, size, p)
    del out
    if dy is None:
        raise CheckFailed("every output is a crop of the padded input, mirrored or not",
                          f"{what}: some outputs are not crops at an offset within 0..{2 * p}")
    _judge_flip_rate(flipped, what)


def _judge_flip_rate(flipped, what):
    """_flip_rate's verdict on the flips read (a bool tensor, one per sample, in batch order)."""
    n = len(flipped)
    share = float(flipped.double().mean())
    if abs(share - 0.5) > FLIP_BAND:
        raise CheckFailed("flips half the samples",
                          f"{what}: yours flipped {share:.2%} of the samples: a biased flip rate (a fair coin "
                          f"stays within 50% +- {FLIP_BAND:.1%} at this size; this check tells 1/2 apart from rates "
                          "about 1.1 points away or more)",
                          "one draw per sample, torch.rand(n, ...) < 0.5 (exactly 0.5: not 0.49, not "
                          "randint(0, 100) < 49, no second draw that sometimes skips the flip)")
    _judge_flip_parts(flipped, what)


def _judge_flip_parts(flipped, what):
    """Each part of the batch (even and odd positions, first and second half) flips as often as the
    rest of it, compared with each other (about 1e-7 each for independent flips, at any rate), so
    that a biased but random rate is named as a rate, and a pattern by position as one."""
    n = len(flipped)
    share = float(flipped.double().mean())
    half = n // 2
    for part, rest, name in ((flipped[0::2], flipped[1::2], "the even positions"),
                             (flipped[:half], flipped[half:], "the first half")):
        a, b = float(part.double().mean()), float(rest.double().mean())
        if abs(a - b) > 5.3 * (0.25 * (1 / len(part) + 1 / len(rest))) ** 0.5:
            raise CheckFailed("flips each sample independently, with probability 1/2",
                              f"{what}: yours flipped {share:.1%} of the batch, but {a:.1%} of {name} against "
                              f"{b:.1%} of the rest",
                              "a flip drawn at random for each sample (torch.rand(n) < 0.5), not chosen by its "
                              "position in the batch")


def _reseeds(fn, images, p, generator, rng, vc, what):
    """Two generators seeded differently, passed in, give different crops: the function honours a
    generator passed in (so its sameness with generator=None comes from a seed of its own)."""
    s = int(rng.integers(1 << 30))
    a = _values(_call_crop(fn, images[:256], p, generator(s), what, vc))
    b = _values(_call_crop(fn, images[:256], p, generator(s + 1), what, vc))
    return not trusted.torch_equal(a, b)


ROUNDS, BATCH = 48, 16     # the per-position statistics: 48 calls on batches of 16


def _per_position(fn, images, generator, rng, on, seed, vc, size, p):
    """Every sample, every batch: {ROUNDS} calls on batches of {BATCH}, each position of the batch
    seen in every call. Each position must get varied offsets and flips (a position left as is, the
    first sample say, is a subset the whole-batch shares cannot see), and the number of flips in a
    batch must vary as a binomial count does (exactly half by a permutation is not a flip per
    sample)."""
    what = (f"{ROUNDS} calls random_crop_flip(images, padding={p}, generator=...) on batches of {BATCH} one-channel "
            f"images {size}x{size}, on {on} (seed {seed})")
    g = generator(rng.integers(1 << 31))
    dys, dxs, flips = [], [], []
    for r in range(ROUNDS):
        out = _values(_call_crop(fn, images[:BATCH], p, g, what, vc))
        dy, dx, flipped = _offsets_of(out, size, p)
        if dy is None:
            raise CheckFailed("every output is a crop of the padded input, mirrored or not",
                              f"{what}, call {r + 1}: some outputs are not crops at an offset within 0..{2 * p}")
        dys.append(dy), dxs.append(dx), flips.append(flipped)
    dy, dx, fl = torch.stack(dys), torch.stack(dxs), torch.stack(flips).long()     # (ROUNDS, BATCH)
    k = 2 * p + 1
    repeats = sum(bool((dy[r] == dy[r - 1]).all() and (dx[r] == dx[r - 1]).all() and (fl[r] == fl[r - 1]).all())
                  for r in range(1, ROUNDS))       # 16 samples drawn alike by chance: about 162**-16
    untouched = bool(((dy == p) & (dx == p) & (fl == 0)).all())     # nothing augmented: named per position below
    if repeats and not untouched:
        raise CheckFailed("draws new crops on every call",
                          f"{what}: {repeats} of the {ROUNDS - 1} calls gave every sample the same crop and flip as "
                          "the call before, with the same generator passed in: that generator did not advance "
                          "between calls, so every batch of an epoch is augmented alike",
                          "draw from the generator passed in itself (torch.randint(..., generator=generator)): a "
                          "copy of its state (get_state/set_state into a new Generator) or a re-seed leaves the "
                          "caller's generator where it was, and the next call draws the same numbers")
    # a position: flipped in 6..42 of the 48 calls (a fair coin stays inside by 5.2 standard
    # deviations), and no single offset in more than half of them (expected 1/9: 8 standard deviations)
    for i in range(BATCH):
        flipped_share = float(fl[:, i].float().mean())
        top = max(int(torch.bincount(dy[:, i], minlength=k).max()), int(torch.bincount(dx[:, i], minlength=k).max()))
        if not 6 <= int(fl[:, i].sum()) <= ROUNDS - 6 or top > ROUNDS // 2:
            common = (int(torch.mode(dy[:, i]).values), int(torch.mode(dx[:, i]).values))
            raise CheckFailed("augments every sample, at every position of the batch",
                              f"{what}: sample {i} of the batch was flipped in {flipped_share:.0%} of the calls, and "
                              f"its most common offset (dy, dx) = {common} came {top} times in {ROUNDS} (random "
                              f"draws: about 50% flipped, each offset about {ROUNDS // k} times): that position is "
                              "not augmented as the others are",
                              "draw the offsets and flips for every sample, index 0 included, and use them all: "
                              "no sample left as is")
    # any fixed pairing within a batch: position j copies (or negates) position i's draw in every
    # call (w12-03: the second half reusing the first half's flips or offsets, .repeat(2)); over
    # 48 calls two independent positions agree as Binomial(48, q) does, q = sum of p_v**2
    for values, kk, name in ((dy, k, "vertical offset"), (dx, k, "horizontal offset"), (fl, 2, "flip")):
        q = float((torch.bincount(values.flatten(), minlength=kk).double() / values.numel()).pow(2).sum())
        if q > 0.99:
            continue
        high, low = _binomial_limits(ROUNDS, q)
        agree = (values[:, :, None] == values[:, None, :]).sum(0)        # (BATCH, BATCH)
        for i in range(BATCH):
            for j in range(i + 1, BATCH):
                a = int(agree[i, j])
                if a >= high or a <= low:
                    raise CheckFailed("draws each sample independently of the others",
                                      f"{what}: the samples' crops/flips are not independent: the {name} of sample "
                                      f"{j} of the batch equalled that of sample {i} in {a} of the {ROUNDS} calls "
                                      f"(independent draws agree in about {ROUNDS * q:.0f}): sample {j} "
                                      + ("reuses the draw of sample " if a >= high else "is made from the draw of "
                                         "sample ") + f"{i} (lag {j - i})",
                                      "draw all N values at once, one per sample (torch.randint(..., (n,)), "
                                      "torch.rand(n) < 0.5), and use each for its own sample: no draw for half the "
                                      "batch repeated, no sample's draw copied to another")
    counts = fl.sum(1).double()                       # flips per batch
    var = float(counts.var())
    binomial = BATCH / 4
    low = _chi2_limit_low(ROUNDS - 1) / (ROUNDS - 1) * binomial
    if var < low:
        raise CheckFailed("flips each sample independently, with probability 1/2",
                          f"{what}: yours flipped {int(counts.min())}..{int(counts.max())} samples per batch of "
                          f"{BATCH} (variance of the count {var:.2f}; independent flips with probability 1/2 make "
                          f"a binomial count, variance {binomial:.0f}, at least {low:.1f} over {ROUNDS} calls): "
                          "exactly half flipped (a permutation, say) is not a flip per sample",
                          "one draw per sample, torch.rand(n, generator=generator, device=...) < 0.5: the number "
                          "flipped varies from batch to batch")


def _binomial_limits(m: int, q: float, tail: float = 1e-10) -> tuple[int, int]:
    """(high, low): Binomial(m, q) reaches high or more, or low or less, each with probability
    under `tail` (360 pairs and draws in _per_position: a false alarm about 1e-7 in all)."""
    pmf = [math.comb(m, a) * q ** a * (1 - q) ** (m - a) for a in range(m + 1)]
    high, up = m + 1, 0.0
    while high > 0 and up + pmf[high - 1] < tail:
        high -= 1
        up += pmf[high]
    low, down = -1, 0.0
    while low < m and down + pmf[low + 1] < tail:
        low += 1
        down += pmf[low]
    return high, low


def _chi2_limit_low(df: int, z: float = 5.2) -> float:
    """The chi-square value that independent draws fall below with probability about 1e-7."""
    k = 2 / (9 * df)
    return df * max(0.0, 1 - k - z * k ** 0.5) ** 3


def _offsets_of(out, size, p):
    """Offsets and flips read from the outputs of the position-coded grid (None when not crops)."""
    c = size // 2
    centre = out[:, 0, c, c]
    right = out[:, 0, c, c + 1]
    flipped = (right - centre) == -1
    plain = (right - centre) == 1
    if not bool((flipped | plain).all()) or not bool((centre >= 1).all()):
        return None, None, None
    src = centre.long() - 1
    dy = src // size - c + p
    dx = torch.where(flipped, src % size - (size - 1 - c) + p, src % size - c + p)
    if int(dy.min()) < 0 or int(dy.max()) > 2 * p or int(dx.min()) < 0 or int(dx.max()) > 2 * p:
        return None, None, None
    return dy, dx, flipped


def _untouched_tail(dy, dx, flipped, p, what):
    """w9-03 w32_22: a loop over chunks that leaves the last partial chunk as it was: a run of
    samples at the end at offset (p, p), unflipped (one chance in 162 per sample)."""
    same = (dy == p) & (dx == p) & ~flipped
    moved = (~same).nonzero()
    tail = len(dy) - 1 - int(moved[-1]) if len(moved) else len(dy)
    if tail >= 16:
        raise CheckFailed("augments every sample, at every position of the batch",
                          f"{what}: the last {tail:,} of {len(dy):,} samples came back as they went in (offsets "
                          f"({p}, {p}), not flipped), while the samples before them were cropped and flipped: yours "
                          "left the end of the batch unaugmented (a loop over chunks whose last, partial chunk is "
                          "skipped?)",
                          "augment the whole batch at once (one draw of N offsets, one index): no chunks; or, if "
                          "you chunk, range(0, n, chunk) and slice [s:s + chunk], which includes the last partial one")


def _uniform(values, k, name, what):
    counts = torch.bincount(values, minlength=k).tolist()
    expected = len(values) / k
    if sum(n > 0 for n in counts) <= 2:
        raise CheckFailed("offsets vary across samples, uniformly",
                          f"{what}: {name} counted {counts}: nearly every sample got the same offset",
                          "draw one offset per sample (a tensor of N offsets), not one for the whole batch")
    missing = [i for i, n in enumerate(counts) if n == 0]
    edge = max(counts[0], counts[-1]) > 2 * expected
    if missing:
        if missing == [k - 1] and not edge:
            hint = "torch.randint's upper bound is exclusive: offsets in 0..2*padding need high=2*padding+1"
        elif edge:
            hint = ("offsets drawn outside 0..2*padding and clamped pile up at the edge: draw in 0..2*padding "
                    "directly, torch.randint(0, 2 * padding + 1, (n,), ...)")
        else:
            hint = "draw each offset in 0..2*padding, inclusive: torch.randint(0, 2 * padding + 1, (n,), ...)"
        raise CheckFailed("offsets cover the whole range", f"{what}: {name} {missing} never occur (counts {counts})",
                          hint)
    if min(counts) < 0.85 * expected or max(counts) > 1.15 * expected:    # over 5 standard deviations
        raise CheckFailed("offsets vary across samples, uniformly",
                          f"{what}: {name} counted {counts} (about {expected:.0f} each expected)",
                          "every offset in 0..2*padding must be as likely as any other: one "
                          "torch.randint(0, 2 * padding + 1, (n,), ...) per axis (a sum of two draws makes the middle "
                          "likelier, rounding a float makes the two ends half as likely, and clamping piles offsets "
                          "up at an edge)")


# -- 3.3 normalise uint8 on the device ----------------------------------------------------------------

def _reference_normalize(images_hwc: np.ndarray) -> torch.Tensor:
    import torchvision.transforms as T
    from PIL import Image
    tf = T.Compose([T.ToTensor(), T.Normalize(CIFAR10_MEAN, CIFAR10_STD)])
    return torch.stack([tf(Image.fromarray(im)) for im in images_hwc])


@exercise("3.3", "uint8 on the device, normalised there")
@forbids("course_utils.device_data:normalize_uint8", "course_utils.device_data:normalize_batch")
@single_threaded
def check_normalize(normalize_on_device):
    expect_callable(normalize_on_device, "a function normalize_on_device(images, labels) -> (images, labels)")
    rng, seed = fresh_rng()
    # the virtual device twice: as cuda:0, then as the second of two devices (cuda:1): constants kept
    # for one device must not be handed to the other
    places = ["cpu", "virtual", "virtual2"] + (["cuda"] if torch.cuda.is_available() else [])
    for place in places:
        with (VirtualCuda(second=place == "virtual2") if place.startswith("virtual") else _nothing()) as vc:
            on = f"{VIRTUAL} {vc.device}" if vc is not None else place
            # no width of 3 (w9-03 w33_24: (3,) constants broadcast over it), and a first batch under 1 KiB as float32
            sizes = [(int(rng.integers(2, 6)), 2, 5), (int(rng.integers(2, 24)), 32, 32), (1, 7, 5),
                     (int(rng.integers(2, 9)), 12, 20)]
            sizes.append(sizes[1])             # the same shape again: a buffer kept between calls shows
            earlier = {}                       # shape -> (the last result of that shape, its values then)
            returned = []                      # (the call, a weak reference to what it returned)
            inputs = []                        # (the call, the device memory of the batch it was given)
            for call, (n, h, w) in enumerate(sizes):
                hwc = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
                hwc[0, 0, 0] = (0, 0, 0)
                hwc[0, 0, 1] = (255, 255, 255)
                host = torch.from_numpy(hwc).permute(0, 3, 1, 2).contiguous()
                host_labels = torch.from_numpy(rng.integers(0, 10, n))
                if vc is not None:
                    images, labels = vc.to_device(host), vc.to_device(host_labels)
                    vc.reset_log()
                else:
                    images, labels = host.to(place), host_labels.to(place)
                what = f"batch {call + 1}: {n} uint8 images 3x{h}x{w} on {on} (seed {seed})"
                made = _count_made(vc)
                wide = _watch_dtypes(vc, (torch.float64,)) if vc is not None else []
                ran = _watch_dtypes(vc, (torch.uint8, torch.int64, torch.float16, torch.bfloat16, torch.float32,
                                         torch.float64), min_numel=1) if vc is not None else []
                copies = _watch_copies(vc, n * 3 * h * w) if vc is not None else []
                try:
                    result = normalize_on_device(images, labels)
                    ops = vc.ops if vc is not None else 0
                except RuntimeError as exc:
                    if "must match the size of tensor" in str(exc):     # w9-03 w33_24: (3,) constants meet W
                        raise CheckFailed("equals ToTensor + Normalize",
                                          f"{what}: yours raised RuntimeError: {exc}{_learner_line(exc)}: constants "
                                          "of shape (3,) broadcast against the last axis of an (N, 3, H, W) batch, "
                                          "the width, not the channels",
                                          "shape mean and std (1, 3, 1, 1): torch.tensor(..., device=images.device)"
                                          ".view(1, 3, 1, 1), so that they meet the channel axis") from None
                    raise _learner_error(exc, what, mixed_hint=(
                        "keep the constants per device, keyed by the device itself (str(images.device): 'cuda:0' "
                        "and 'cuda:1' are both of type 'cuda'), and make them there: torch.tensor(..., "
                        "device=images.device)"), host_hint=(
                        "your constants are on the CPU (made without device=, or made for an earlier batch on the "
                        "CPU and kept for every device): make them on the images' device, torch.tensor(..., "
                        "device=images.device), and keep the constants per device (a dict keyed by "
                        "str(images.device))")) or exc
                if not isinstance(result, (tuple, list)) or len(result) != 2:
                    raise CheckFailed("returns (images, labels)", f"{what}: yours returned {_kind(result)}",
                                      "a batch_transform returns both: `return images, labels`")
                out, out_labels = result
                if not isinstance(out, torch.Tensor):
                    raise CheckFailed("returns a tensor of images", f"{what}: yours returned {type(out).__name__}")
                if not trusted.torch_equal(_values(images), host):
                    raise CheckFailed("leaves its input unchanged", f"{what}: the uint8 images were modified")
                if (not isinstance(out_labels, torch.Tensor) or out_labels.device != labels.device
                        or not trusted.torch_equal(_values(out_labels), host_labels) or out_labels.dtype != labels.dtype):
                    changed = ("the labels came back changed" if not isinstance(out_labels, torch.Tensor)
                               or out_labels.dtype == labels.dtype else
                               f"the labels came back as {out_labels.dtype}, not {labels.dtype} as they went in "
                               "(cross_entropy takes int64 class indices)")
                    raise CheckFailed("passes the labels through", f"{what}: {changed}",
                                      "return the labels as they came: `return out, labels`")
                if out.device != images.device or isinstance(out, DeviceTensor) != isinstance(images, DeviceTensor):
                    raise CheckFailed("normalises on the device", f"{what}: yours returned images on {out.device}",
                                      "stay on images.device: make mean and std tensors there")
                if out.dtype != torch.float32:
                    raise CheckFailed("returns float32", f"{what}: yours is {out.dtype}", "images.float()")
                if out.shape != images.shape:
                    raise CheckFailed("keeps the (N, 3, H, W) shape", f"{what}: yours {tuple(out.shape)}")
                _compare_normalized(_values(out), hwc, host, what)
                if vc is not None:
                    del vc._dispatch                      # the device's own method again
                    _judge_normalize_traffic(vc, call, what, again=lambda: normalize_on_device(images, labels))
                    if wide:
                        raise CheckFailed("computes in float32",
                                          f"{what}: yours computed in float64 on the device ({len(wide)} operations, "
                                          f"{wide[0]} first) and returned float32: 8 bytes a pixel, twice float32's, "
                                          "for the conversion that already quadruples the uint8 batch, and a GPU "
                                          "runs float64 at 1/2 to 1/64 of its float32 rate; the cast back is one "
                                          "more pass over the batch",
                                          "images.float() / 255 and constants in float32 (torch.tensor's default "
                                          "for Python floats): no .double(), no dtype=torch.float64")
                    if call > 0 and made:
                        raise CheckFailed("makes the constants once per device, not every batch",
                                          f"{what}: yours created {len(made)} tensors on the device during this "
                                          f"call ({made[0]} first): the constants are made again for every batch, "
                                          "each a kernel launched from the host (about 30 us of host time on a GPU) "
                                          "for values that never change",
                                          "make mean and std once per device and keep them (a dict keyed by "
                                          "str(images.device)); a call then runs only the arithmetic on the images")
                    if call > 0 and ops > MAX_NORMALIZE_OPS:
                        names = [r.split(" to ")[0] for r in ran]
                        looped = any(names.count(x) >= 3 for x in set(names))
                        listed = f" ({'; '.join(ran[:8])}{'; ...' if len(ran) > 8 else ''})" if ran else ""
                        raise CheckFailed("runs a few operations per batch",
                                          f"{what}: yours ran {ops} operations on the device for one batch (the "
                                          f"course's answer runs 4, at most {MAX_NORMALIZE_OPS} pass){listed}: each "
                                          "a kernel launch of about 30 us of host time on a GPU, and each a pass "
                                          "over the batch, for every batch" + (
                                              ". The same operation several times: a Python loop over the "
                                              "channels launches the arithmetic once per channel" if looped else ""),
                                          ("constants shaped (1, 3, 1, 1) broadcast over the whole batch: "
                                           "(images.float() / 255 - mean) / std is four operations for all channels "
                                           "at once; no loop, no torch.stack or torch.cat of the channels") if looped
                                          else ("(images.float() / 255 - mean) / std is four operations: no .clone() "
                                                "or copy the arithmetic does not need, and what depends only on the "
                                                "constants (a scale 1 / (255 * std), a shift) computed once with "
                                                "them, per device, not every batch"))
                    if call > 0 and copies:
                        raise CheckFailed("makes no needless copy of the batch",
                                          f"{what}: yours copied the batch on the device without changing it "
                                          f"({copies[0]}{'; ' + str(len(copies) - 1) + ' more' if len(copies) > 1 else ''}): "
                                          "one more pass over the batch and one more batch of device memory, every "
                                          "batch, for values the arithmetic already gives in a new tensor",
                                          "(images.float() / 255 - mean) / std already returns a new tensor: no "
                                          ".clone(), .copy_() or .to(copy=True) of the images or the result")
                    del vc._create, vc._wrap_new          # the device's own methods again
                before = earlier.get((n, h, w))
                held = out._inner if isinstance(out, DeviceTensor) else out.detach()   # its memory, not the object
                if before is not None:
                    old, old_values = before
                    if (old.untyped_storage().data_ptr() == held.untyped_storage().data_ptr()
                            or not trusted.torch_equal(_values(old), old_values)):
                        raise CheckFailed("returns a new tensor for every batch",
                                          f"{what}: this call overwrote the result of an earlier batch of the same "
                                          "shape: yours writes every batch into one buffer kept between calls, so a "
                                          "batch still in use (a loader running ahead, BackgroundLoader(transform=...)) "
                                          "changes under the model",
                                          "return a new tensor from every call (x.float() / 255 makes one); keep only "
                                          "the constants between calls")
                earlier[(n, h, w)] = (held, _values(out).clone())
                returned.append((what, weakref.ref(out)))
                if isinstance(images, DeviceTensor):     # the batch passed in: its memory, views included
                    inputs.append((what, images._alloc))
                del result, out, out_labels, held, images, labels
            kept = [w for w, ref in returned if ref() is not None]
            if kept:
                raise CheckFailed("keeps nothing of a batch after returning it",
                                  f"on {on} (seed {seed}): the images yours returned for {len(kept)} of "
                                  f"{len(returned)} batches were still referenced after the calls were over and the "
                                  f"caller had let them go ({kept[0]} first): memory grows by a batch every step",
                                  "keep only the constants (mean and std) between calls, not the results")
            kept_in = [w for w, alloc in inputs if not alloc.freed]
            if kept_in:
                raise CheckFailed("keeps nothing of a batch after returning it",
                                  f"on {on} (seed {seed}): the uint8 images passed in for {len(kept_in)} of "
                                  f"{len(inputs)} batches were still referenced after the calls were over and the "
                                  f"caller had let them go ({kept_in[0]} first): each input batch stays in device "
                                  "memory until a later call replaces it (or for good, in a list)",
                                  "keep only the constants (mean and std) between calls: no reference to the images "
                                  "(nor a view of them) in a global, a dict or a closure")
    return ("float32 on the device, equal to ToTensor + Normalize within 4e-6 (float32 rounding, no epsilon), "
            "labels passed through, a new tensor "
            "every batch and nothing kept; on a (virtual) GPU, two devices in turn, no copy from the host after the "
            "first batch, nothing read back, no host wait, the constants made once per device, no needless copy of the "
            "batch, and at most "
            f"{MAX_NORMALIZE_OPS} operations a batch.")


MAX_NORMALIZE_OPS = 5     # operations on the device per batch (the course's answer runs 4, + a labels clone 5; two
#                           needless clones of the batch, 6 (w8-03); a loop over the channels, 9). One needless
#                           clone of the batch (5) fails on its own property (w9-03 w33_20)


def _learner_where() -> str:
    """The learner's line: not this module's, the virtual device's or torch's."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = frame.filename.replace("\\", "/")
        if not (path.endswith(("checks/virtual_cuda.py", "checks/lesson03.py", "contextlib.py"))
                or "/torch/" in path):
            return f"{frame.filename}:{frame.lineno}"
    return "?"


def _watch_dtypes(vc, dtypes, *, min_numel: int = 2) -> list[str]:
    """Device operations whose result has one of `dtypes`, until the caller puts `vc._dispatch`
    back (`del vc._dispatch`): the operation and the learner's line of each."""
    seen: list[str] = []
    dispatch = vc._dispatch

    @passes_through
    def watched(func, args, kwargs):
        out = dispatch(func, args, kwargs)
        if isinstance(out, torch.Tensor) and out.dtype in dtypes and out.numel() >= min_numel:
            seen.append(f"aten.{func.overloadpacket.__name__} to {out.dtype} at {_learner_where()}")
        return out

    vc._dispatch = watched
    return seen


def _watch_copies(vc, numel: int) -> list[str]:
    """Copies of a batch-sized tensor into one of the same dtype (aten.clone, aten.copy_, a
    .to(copy=True)) until the caller puts `vc._dispatch` back: a needless copy of the batch (w9-03
    w33_20: one .clone() stayed within the operations limit). A conversion (.float()) is not one,
    nor a copy of the labels (n elements, never 3*H*W*n)."""
    seen: list[str] = []
    dispatch = vc._dispatch

    @passes_through
    def watched(func, args, kwargs):
        out = dispatch(func, args, kwargs)
        name = func.overloadpacket.__name__
        if name in ("clone", "copy_", "_to_copy", "copy") and isinstance(out, torch.Tensor) and out.numel() == numel:
            src = args[1] if name == "copy_" and len(args) > 1 else args[0] if args else None
            if isinstance(src, torch.Tensor) and src.dtype == out.dtype:
                seen.append(f"aten.{name} at {_learner_where()}")
        return out

    vc._dispatch = watched
    return seen


def _count_made(vc) -> list[str]:
    """Tensors created on the virtual device from nothing (torch.full/zeros/tensor(..., device=...),
    Tensor.new_*) until the caller puts the methods back: where each was made."""
    made: list[str] = []
    if vc is None:
        return made
    create, wrap_new = vc._create, vc._wrap_new

    @passes_through           # a copy torch.tensor(..., device=) makes is located at the learner's line
    def counted_create(func, name, args, kwargs):
        made.append(f"torch.{name} at {_learner_where()}")
        return create(func, name, args, kwargs)

    @passes_through
    def counted_wrap_new(t, label=""):
        if label.startswith("Tensor.new_"):
            made.append(f"{label} at {_learner_where()}")
        return wrap_new(t, label)

    vc._create, vc._wrap_new = counted_create, counted_wrap_new
    return made


# 3.3's tolerance: a right answer differs from ToTensor + Normalize by float32 rounding only, at most
# 4.8e-7 (2 ulps at |value| 2) in every form measured (the solution's, scale and shift folded into
# constants in float32 or float64, addcmul, multiply by 1/255); 4e-6 leaves a margin of 8x. An epsilon
# of 1e-5 added to the std changes a value v by |v| * 3.8e-5 or more, over 4e-6 for every |v| > 0.11, which
# every batch of random pixels has in every channel (1e-6: 8.8e-6 at the ends, caught too).
NORMALIZE_TOL = 4e-6


def _epsilon_added(out, expected):
    """The epsilon yours added to the std, where `out` is the right values times std / (std + eps)
    in every channel with one positive eps (1e-8..1e-2) alike in all three; else None."""
    eps = []
    for c in range(3):
        x, y = expected[:, c].flatten().double(), out[:, c].flatten().double()
        if float(x.abs().max()) < 0.1:
            return None
        a = float((x * y).sum() / (x * x).sum())
        if float((a * x - y).abs().max()) > 2e-6 or not 0 < a < 1:
            return None
        eps.append(CIFAR10_STD[c] * (1 / a - 1))
    if min(eps) < 1e-8 or max(eps) > 1e-2 or max(eps) > 1.03 * min(eps):     # std * 1.001: eps ~ std, 7% apart
        return None
    return sum(eps) / 3


def _compare_normalized(out, hwc, host, what):
    expected = _reference_normalize(hwc)
    finite = torch.isfinite(out)
    if not bool(finite.all()):
        i = tuple(int(j) for j in (~finite).nonzero()[0])
        raise CheckFailed("equals ToTensor + Normalize",
                          f"{what}: {int((~finite).sum())} of {out.numel()} values of yours are not finite numbers "
                          f"(element {i}: yours {float(out[i])}, expected {float(expected[i]):.5f}): a division by "
                          "zero, by a std that is 0",
                          "make mean and std float32 tensors (torch.tensor's default for Python floats): in an "
                          "integer dtype (dtype=images.dtype, uint8) CIFAR10_STD's 0.247, 0.243 and 0.261 all "
                          "become 0, and the means 0 too")
    err = (out - expected).abs()
    if not bool(torch.isfinite(out).all()) or float(err.max()) > NORMALIZE_TOL:
        i = np.unravel_index(int(torch.nan_to_num(err, nan=1e9).argmax()), tuple(err.shape))
        yours, want = float(out[i]), float(expected[i])
        hint = ("x / 255, then subtract the mean and divide by the std, per channel: constants shaped (1, 3, 1, 1) "
                "(.view(1, 3, 1, 1)) meet the channel axis of an (N, 3, H, W) batch")
        raw = float(host[i])
        if abs(yours - (raw - CIFAR10_MEAN[i[1]]) / CIFAR10_STD[i[1]]) < 1e-3:
            hint = "ToTensor scales 0..255 to 0..1: divide by 255 first"
        elif abs(yours - raw / 255) < 1e-4:
            hint = "Normalize is missing: subtract the mean and divide by the std of each channel"
        elif (mistake := _formula_mistake(out, host)) is not None:     # w10-03: an operator, not a constant
            hint = mistake
        elif (eps := _epsilon_added(out, expected)) is not None:       # w12-03 w33b_eps_1e-5
            hint = (f"yours divides by std + {eps:.0e} (or folds that into its constants): no epsilon: the contract "
                    "has none (the dataset's std is never 0); divide by data.CIFAR10_STD exactly as given")
        elif (dtype := _rounded_constants(out, host)) is not None:     # w11-03 w33_scale_float16_consts
            hint = (f"the formula is right but its constants were stored as {dtype}: yours matches the right "
                    f"formula with mean and std (or the folded scale and shift) rounded to {dtype}, a 16-bit float "
                    "that keeps only 2-3 significant digits, so every value is off by a fixed factor and offset "
                    "per channel; keep the constants in float32 (torch.tensor's default for Python floats), no "
                    ".half() or .bfloat16()")
        elif (affine := _affine_fit(out, expected)) is not None:
            c, a, b = affine
            batch_stats = all(abs(float(out[:, k].mean())) < 1e-3 and abs(float(out[:, k].std()) - 1) < 1e-2
                              for k in range(3))
            hint = (f"yours is exactly the right values times {a:.4f} plus {b:.4f} (channel {c}): the formula's "
                    "shape is right and a constant is off: "
                    + ("yours has mean 0 and std 1 over the batch, so it used the batch's own statistics: use the "
                       "dataset's constants, data.CIFAR10_MEAN and data.CIFAR10_STD, the same for every batch"
                       if batch_stats else
                       "divide by 255 (not 256), then subtract data.CIFAR10_MEAN and divide by data.CIFAR10_STD "
                       "exactly as given (no epsilon added, no rounding, RGB order, not ImageNet's), per channel"))
        elif float(err.max()) < 0.02:     # the right formula, rounded: float16 keeps ~3 digits, bfloat16 ~2
            hint = (f"the formula is right but the values are rounded (off by up to {float(err.max()):.1e}): a "
                    "16-bit float (half, bfloat16) somewhere in the arithmetic keeps only 2-3 significant digits; "
                    "compute in float32: images.float() / 255")
        raise CheckFailed("equals ToTensor + Normalize", f"{what}: element {tuple(int(j) for j in i)}: yours "
                          f"{yours:.5f}, expected {want:.5f}", hint)


_FORMULA_MISTAKES = (          # (what yours computed, per channel, from x = images / 255; what to say)
    (lambda x, m, s: (x - m) * s, "yours multiplies by the std: (x / 255 - mean) * std; Normalize divides by it: "
                                  "(x / 255 - mean) / std"),
    (lambda x, m, s: (x - s) / m, "yours has mean and std swapped: (x / 255 - std) / mean; subtract the mean and "
                                  "divide by the std: (x / 255 - mean) / std"),
    (lambda x, m, s: (x + m) / s, "yours adds the mean: (x / 255 + mean) / std; subtract it: (x / 255 - mean) / std"),
    (lambda x, m, s: x / s - m, "yours divides by the std before it subtracts the mean: x / 255 / std - mean; "
                                "subtract first: (x / 255 - mean) / std"),
)


def _formula_mistake(out, host):
    """The hint for an operator mistake (a multiply for a divide, mean and std swapped, ...): each
    is affine per channel, so the affine fit alone would call it 'a constant off'."""
    if tuple(host.shape) != tuple(out.shape):
        return None
    x = host.double() / 255
    m = torch.tensor(CIFAR10_MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    sd = torch.tensor(CIFAR10_STD, dtype=torch.float64).view(1, 3, 1, 1)
    for formula, say in _FORMULA_MISTAKES:
        if float((out.double() - formula(x, m, sd)).abs().max()) < 1e-3:
            return say
    return None


def _rounded_constants(out, host):
    """The 16-bit dtype whose rounding of the constants (mean and std, or the folded scale and
    shift) explains `out` with float32 arithmetic, else None."""
    if tuple(host.shape) != tuple(out.shape):
        return None
    x = host.float()
    m = torch.tensor(CIFAR10_MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    sd = torch.tensor(CIFAR10_STD, dtype=torch.float64).view(1, 3, 1, 1)
    for dtype in (torch.float16, torch.bfloat16):
        def r(t):
            return t.to(dtype).float()
        for candidate in ((x / 255 - r(m)) / r(sd), x * r(1 / (255 * sd)) + r(-m / sd)):
            if float((out.float() - candidate).abs().max()) < 1e-4:
                return str(dtype).replace("torch.", "")
    return None


def _affine_fit(out, expected):
    """(channel, scale, shift) where `out` is, channel by channel, an exact affine function of the
    expected values (a constant off: /256, std + eps, other constants, the batch's statistics) with
    one channel off; None where it is not (rounding noise of a 16-bit float, say)."""
    worst = None
    for c in range(3):
        x, y = expected[:, c].flatten().double(), out[:, c].flatten().double()
        if float(x.max() - x.min()) < 1e-6:
            return None
        design = torch.stack([x, torch.ones_like(x)], 1)
        a, b = torch.linalg.lstsq(design, y[:, None]).solution.flatten().tolist()
        if float((a * x + b - y).abs().max()) > 2e-5:
            return None
        if worst is None and (abs(a - 1) > 1e-4 or abs(b) > 1e-4):
            worst = (c, a, b)
    return worst


def _judge_normalize_traffic(vc, call, what, again=None):
    h2d = vc.h2d()
    if h2d and (call > 0 or sum(c.nbytes for c in h2d) > 1024):
        if call > 0 and again is not None:       # w11-03 w33_expanded_per_shape: the same batch again copies nothing?
            vc.reset_log()
            try:
                again()
                per_shape = not vc.h2d()
            except Exception:
                per_shape = False
            if per_shape:
                raise CheckFailed("makes no copy from the host after the first batch",
                                  f"{what}: {len(h2d)} copies from the host during this call ({h2d[0].what} at "
                                  f"{h2d[0].where}), the first batch of this shape, and none when the same batch "
                                  "came again: yours keeps its constants per (device, shape), so every new batch "
                                  "shape makes them again, with a copy from the host (a loader's last batch is "
                                  "smaller; variable image sizes make every batch a new shape)",
                                  "key the constants by the device alone (str(images.device)) and shape them "
                                  "(1, 3, 1, 1): broadcasting fits them to every batch, with nothing expanded to "
                                  "the batch's shape")
        raise CheckFailed("makes no copy from the host after the first batch",
                          f"{what}: {len(h2d)} copies from the host during this call ({h2d[0].what} at {h2d[0].where})",
                          "create mean and std on the device once (per device) and keep them: "
                          + ("torch.tensor(..., device=...) or .to(device) in every call is a blocking copy from the "
                             "host: the host waits for every kernel already queued on the stream, and the GPU's "
                             "run-ahead is lost, every batch" if h2d[0].blocks_host else
                             "even a pinned, non_blocking copy is one more copy launched every batch, for values "
                             "that never change"))
    if vc.d2h() or vc.reads():
        first = (vc.reads() or vc.d2h())[0]
        if "torchvision" in first.where:
            raise CheckFailed("never waits for the device",
                              f"{what}: the host waited for the device inside torchvision ({first.what} at "
                              f"{first.where}): torchvision's Normalize builds its mean and std from host values on "
                              "every call, copies them to the device and checks them on the host "
                              "((std == 0).any()), which reads a value back every batch; your images were not read "
                              "back",
                              "do what Normalize does with constants of your own, made once per device: "
                              "(images.float() / 255 - mean) / std with mean and std shaped (1, 3, 1, 1)")
        if all(s.cause == "wait" for s in vc.reads()) and not vc.d2h():
            raise CheckFailed("never waits for the device",
                              f"{what}: the host waited for the device ({first.what} at {first.where}): nothing came "
                              "back, but the host stopped until every kernel queued on the device had run, and the "
                              "GPU's run-ahead of the host is lost" + (" every batch" if call > 0 else ""),
                              "return the result as it is: the training step, queued on the same stream, runs after "
                              "the normalisation without any wait (no torch.cuda.synchronize, no stream or event "
                              ".synchronize())")
        raise CheckFailed("never waits for the device", f"{what}: the images (or values computed from them) came back "
                          f"to the host ({first.what} at {first.where})",
                          "normalise with tensor operations on images.device; no .cpu(), .numpy(), .item()")
