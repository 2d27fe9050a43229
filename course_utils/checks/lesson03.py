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

import itertools
import traceback

import numpy as np
import torch
import torch.nn.functional as F

from ..data import CIFAR10_MEAN, CIFAR10_STD
from ._core import CheckFailed, _learner_line, exercise, expect_callable, expect_class, trusted
from ._util import forbids, fresh_rng, single_threaded
from .virtual_cuda import MIXED_DEVICES, DeviceTensor, VirtualCuda

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


def _learner_error(exc: RuntimeError, what: str):
    """CUDA's own errors, as raised on the virtual device, turned into the property they break."""
    text = str(exc)
    if MIXED_DEVICES in text:
        return CheckFailed("keeps all its work on the device",
                           f"{what}: your code mixed a tensor on the device with one on the host, which CUDA "
                           f"refuses ({MIXED_DEVICES})",
                           "make every tensor you create on images.device (torch.arange(n, device=images.device))")
    if "device type for generator" in text:
        return CheckFailed("draws its random numbers on the images' device",
                           f"{what}: CUDA says: {text}",
                           "torch.randint(..., device=images.device, generator=generator): numbers drawn on the "
                           "host must be copied to the device for every batch")
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
    many batches it has handed out in the current pass. `pin` pins every batch (as
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
                images = torch.randn(b, 3, 5, 6, generator=g)
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


def _one_pass(pf, loader, pass_index, device, what, *, on_batch=None):
    """Iterate `pf` once; check the batches against the loader's. `on_batch(i, images, labels)`
    runs as each batch arrives (the virtual device's checks, the consumer's reads)."""
    expected = loader._batches(pass_index)
    got = []
    for i, batch in enumerate(itertools.islice(iter(pf), len(expected) + 3)):
        if i >= len(expected):
            raise CheckFailed("ends cleanly", f"{what}: the loader has {len(expected)} batches, yours yielded more "
                              f"(batch {i} was {_kind(batch)})",
                              "stop (return) when the loader is exhausted instead of yielding an end marker")
        images, labels = _as_pair(batch, f"{what}, batch {i}")
        if loader.handed_out > i + 2:
            raise CheckFailed("reads the loader as it goes", f"{what}: when batch {i} reached the consumer, yours had "
                              f"already taken {loader.handed_out} batches from the loader",
                              "a DataLoader can be endless or huge: take the next batch only, do not list() it")
        for name, t in (("images", images), ("labels", labels)):
            if t.device.type != device.type:
                raise CheckFailed("puts the tensors on the device", f"{what}, batch {i}: {name} on {t.device}, "
                                  f"expected {device.type}", "move both tensors with .to(device, non_blocking=True)")
        if on_batch is not None:
            on_batch(i, images, labels)
        got.append((images, labels))
    if len(got) < len(expected) and loader.passes <= pass_index:
        raise CheckFailed("starts a new pass over the loader each time it is iterated",
                          f"{what}: the loader has {len(expected)} batches, yours yielded {len(got)}, and over "
                          f"{pass_index + 1} passes it called iter(loader) {loader.passes} time"
                          f"{'s' if loader.passes != 1 else ''}",
                          "an iterator made once (in __init__) is used up by the first pass, and the next "
                          "`for batch in prefetcher` finds it empty: call iter(self.loader) inside __iter__, so "
                          "that every pass starts afresh")
    if len(got) < len(expected):
        raise CheckFailed("yields every batch", f"{what}: the loader has {len(expected)} batches, yours yielded {len(got)}",
                          "the first batch is fetched before the loop and the last one is still pending when "
                          "the loader runs out: yield it before stopping")
    for i, ((images, labels), (want_x, want_y)) in enumerate(zip(got, expected)):
        x, y = _values(images), _values(labels)
        if not (x.shape == want_x.shape and trusted.torch_equal(x, want_x) and y.shape == want_y.shape and trusted.torch_equal(y, want_y)):
            order = ""
            for j, (wx, _) in enumerate(expected):
                if j != i and wx.shape == x.shape and trusted.torch_equal(x, wx):
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


@exercise("3.1", "A prefetcher: the next batch copied to the device on a side stream", points=2)
@forbids("course_utils.prefetch:CudaPrefetcher.__iter__")
@single_threaded
def check_prefetcher(Prefetcher):
    expect_class(Prefetcher, "a class Prefetcher(loader, device) whose instances are iterables of batches")
    rng, seed = fresh_rng()
    sizes = (int(rng.integers(3, 8)), 1, 0)
    for n in sizes:                      # on the CPU: the batches pass through
        loader = _ScriptedLoader(int(rng.integers(1 << 30)), n)
        pf = Prefetcher(loader, torch.device("cpu"))
        what = f"a loader of {n} batch{'es' if n != 1 else ''} on the CPU (seed {seed})"
        _one_pass(pf, loader, 0, torch.device("cpu"), what)
        _one_pass(pf, loader, 1, torch.device("cpu"), what + ", second pass")   # iterable again: a new pass
        if loader.passes != 2:
            raise CheckFailed("starts a new pass over the loader each time it is iterated",
                              f"{what}: two passes over yours called iter(loader) {loader.passes} times",
                              "call iter(self.loader) inside __iter__, not in __init__")
    for n in sizes:
        _virtual_prefetch(Prefetcher, int(rng.integers(1 << 30)), n, seed)
    if torch.cuda.is_available():
        _check_cuda_streams(Prefetcher)
        return ("same batches, same order; on the CPU passed through; on CUDA (virtual and real) copied ahead "
                "from pinned memory on a side stream the consumer waits for, record_stream called, the host "
                "never blocked; ends and restarts cleanly. (Stream order graded on the virtual device; on this "
                "GPU the side stream was held busy, so a missing wait_stream would have read unfinished copies.)")
    return ("same batches, same order; on the CPU passed through; on a virtual CUDA device copied ahead from "
            "pinned memory on a side stream the consumer waits for, record_stream called, the host never "
            "blocked; ends and restarts cleanly. (No GPU here: on one, the check also runs it on the real device.)")


def _virtual_prefetch(Prefetcher, loader_seed, n, seed):
    """Two passes on the virtual CUDA device: the second consumed on a stream of the consumer's own."""
    with VirtualCuda() as vc:
        loader = _ScriptedLoader(loader_seed, n, pin=vc._pin)
        device = torch.device("cuda")
        try:
            pf = Prefetcher(loader, device)
        except RuntimeError as exc:
            raise _learner_error(exc, VIRTUAL) or exc
        for pass_index in (0, 1):
            what = (f"a loader of {n} pinned batch{'es' if n != 1 else ''} on {VIRTUAL}"
                    + (", second pass, the training loop running on a stream of its own" if pass_index else "")
                    + f" (seed {seed})")
            consumer = vc.default_stream if pass_index == 0 else torch.cuda.Stream()
            copies_at = []

            def consume(i, images, labels):
                copies_at.append(len(vc.h2d()))
                vc.mark(images, f"batch {i}'s images")
                vc.mark(labels, f"batch {i}'s labels")
                images.float().mean()           # the model reads the batch at once, on its stream
                labels.sum()

            vc.reset_log()
            with vc.stream(consumer):
                try:
                    got = _one_pass(pf, loader, pass_index, device, what, on_batch=consume)
                except RuntimeError as exc:
                    raise _learner_error(exc, what) or exc
            _judge_prefetch(vc, got, copies_at, consumer, what)
        if loader.passes != 2:
            raise CheckFailed("starts a new pass over the loader each time it is iterated",
                              f"on {VIRTUAL}: two passes over yours called iter(loader) {loader.passes} times",
                              "call iter(self.loader) inside __iter__, not in __init__")


def _judge_prefetch(vc, got, copies_at, consumer, what):
    h2d = vc.h2d()
    batch_bytes = sum(_values(x).numel() * _values(x).element_size() + _values(y).numel() * _values(y).element_size()
                      for x, y in got)
    copied = sum(c.nbytes for c in h2d)
    if copied != batch_bytes:
        raise CheckFailed("copies each batch to the device once", f"{what}: {copied:,} bytes copied from the host for "
                          f"{batch_bytes:,} bytes of batches ({len(h2d)} copies)",
                          "one .to(device, non_blocking=True) per tensor of each batch")
    blocking = [c for c in h2d if not c.non_blocking]
    if blocking:
        raise CheckFailed("copies asynchronously", f"{what}: {len(blocking)} of {len(h2d)} copies were blocking "
                          f"(at {blocking[0].where})",
                          "from pinned memory, .to(device, non_blocking=True) queues the copy and returns at once")
    on_consumer = [c for c in h2d if c.stream == consumer.id]
    if on_consumer:
        raise CheckFailed("copies on a side stream", f"{what}: {len(on_consumer)} of {len(h2d)} copies were queued on "
                          "the training loop's own stream, where the next step's kernels wait for them",
                          "create `self.stream = torch.cuda.Stream(device)` once and copy inside "
                          "`with torch.cuda.stream(self.stream):`")
    late = [i for i, count in enumerate(copies_at[:-1]) if count < 2 * (i + 2)]
    if late:
        i = late[0]
        raise CheckFailed("copies the next batch before handing out this one",
                          f"{what}: when batch {i} was handed out, only {copies_at[i]} copies had been started "
                          f"(batch {i + 1}'s copy was not among them)",
                          "start the copy of the following batch before you yield the current one, so that "
                          "it runs while the model computes")
    if vc.races:
        race = vc.races[0]
        raise CheckFailed("the consumer waits for the copy",
                          f"{what}: {race.label or 'a batch'} was read on the training loop's stream before that "
                          f"stream waited for the side stream that copies it ({len(vc.races)} such reads)",
                          "before handing out a batch: torch.cuda.current_stream(device).wait_stream(self.stream) "
                          "(the stream current when the batch is handed out, not the default one)")
    unrecorded = vc.unrecorded()
    if unrecorded:
        raise CheckFailed("calls record_stream for the consumer's stream",
                          f"{what}: {', '.join(a.label or 'a tensor' for a in unrecorded[:3])} were allocated on the "
                          "side stream and used on the training loop's stream without record_stream: the caching "
                          "allocator may hand their memory to the next copy while the model still reads it",
                          "tensor.record_stream(torch.cuda.current_stream(device)) for both tensors of each batch")
    if vc.syncs:
        raise CheckFailed("never makes the host wait", f"{what}: the host waited for the device {len(vc.syncs)} times "
                          f"({vc.syncs[0].what} at {vc.syncs[0].where})",
                          "wait on the device (wait_stream), not on the host (synchronize)")


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


def _call_crop(fn, images, padding, generator, what, vc=None, *, defaults=False):
    """Call the learner's function (with `defaults`, as fn(images)); on the virtual device, also
    judge what it did there."""
    before = _values(images).clone()
    if vc is not None:
        vc.reset_log()
    try:
        out = fn(images) if defaults else fn(images, padding=padding, generator=generator)
    except RuntimeError as exc:
        raise _learner_error(exc, what) or exc
    if not isinstance(out, torch.Tensor):
        raise CheckFailed("returns a tensor", f"{what}: yours returned {type(out).__name__}")
    if not trusted.torch_equal(_values(images), before):
        raise CheckFailed("leaves its input unchanged", f"{what}: the images passed in were modified",
                          "work on a padded copy (F.pad returns a new tensor)")
    if out.shape != images.shape:
        raise CheckFailed("keeps the shape", f"{what}: input {tuple(images.shape)}, yours {tuple(out.shape)}",
                          "each crop is H x W, the size of the input image, taken from the padded image")
    if out.dtype != images.dtype or out.device != images.device or isinstance(images, DeviceTensor) != isinstance(
            out, DeviceTensor):
        raise CheckFailed("keeps dtype and device", f"{what}: input {images.dtype} on {images.device}, yours "
                          f"{out.dtype} on {out.device}", "use tensor ops on the images' device; no .cpu(), no .float()")
    if vc is not None:
        _no_host_traffic(vc, what, "crops")
        budget = 16 * images.numel() * images.element_size()
        if vc.allocated_bytes > budget:
            raise CheckFailed("uses memory in proportion to the batch",
                              f"{what}: yours allocated {vc.allocated_bytes / 2**20:.1f} MiB on the device for a "
                              f"{images.numel() * images.element_size() / 2**20:.1f} MiB batch "
                              f"({vc.allocated_bytes / (images.numel() * images.element_size()):.0f}x)",
                              "index the padded batch directly (or a strided view of its windows); do not "
                              "materialise every window of every image")
    return out


def _no_host_traffic(vc, what, result):
    h2d = vc.h2d()
    if h2d:
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


def _exact_crops(out, host, p, what):
    win = _windows(host, p)                                          # (n, k, k, c, h, w)
    plain = (win == out[:, None, None]).flatten(3).all(-1)
    mirrored = (win.flip(-1) == out[:, None, None]).flatten(3).all(-1)
    ok = (plain | mirrored).flatten(1).any(1)
    if not bool(ok.all()):
        i = int((~ok).nonzero()[0])
        hint = ("pad all four sides with zeros (F.pad(images, (p, p, p, p))), draw each offset in "
                "0..2*padding inclusive, take the H x W window there, and flip the last (width) axis")
        if bool(trusted.torch_equal(out[i], host[i].flip(-2))):
            hint = "a horizontal flip mirrors the width (last) axis, not the height"
        raise CheckFailed("every output is a crop of the padded input, mirrored or not",
                          f"{what}: sample {i} is not the H x W window of its zero-padded image at any "
                          f"offset in 0..{2 * p}, plain or mirrored", hint)


@exercise("3.2", "Random crop with padding and flip, for a whole batch on the device", points=2)
@forbids("course_utils.device_data:random_crop_flip")
@single_threaded
def check_crop_flip(random_crop_flip):
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

            # (a) every output is an exact crop of the zero-padded input, mirrored or not
            for n, c, h, w, p, dtype in [(96, 3, 32, 32, 4, torch.uint8), (40, 3, 11, 14, 2, torch.float32)]:
                what = f"{n} random {dtype} images {c}x{h}x{w}, padding={p}, on {on} (seed {seed})"
                host = torch.from_numpy(rng.integers(0, 256, (n, c, h, w), dtype=np.uint8)).to(dtype)
                out = _call_crop(random_crop_flip, to_device(host), p, generator(rng.integers(1 << 31)), what, vc)
                _exact_crops(_values(out), host, p, what)
            # (b) offsets and flips vary across samples, uniformly, in one call (where it runs on a device)
            if place != "cpu":
                _crop_statistics(random_crop_flip, to_device, generator, rng, on, seed, vc)
            # (c) every call draws anew, from a generator passed in or from torch's own; reproducible
            # under a seed; another seed gives other crops
            s = int(rng.integers(1 << 31))
            images = to_device(torch.from_numpy(rng.integers(0, 256, (64, 3, 32, 32), dtype=np.uint8)))
            what = f"64 images on {on}, generator seeded {s}"
            g = generator(s)
            calls = [_values(_call_crop(random_crop_flip, images, 4, g, what + ", called twice with it", vc))
                     for _ in range(2)]
            torch.manual_seed(s)
            if place == "cuda":
                torch.cuda.manual_seed(s)
            calls += [_values(_call_crop(random_crop_flip, images, 4, None, f"64 images on {on}, generator=None, "
                                         "called twice", vc)) for _ in range(2)]
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
                                  "use torch's random functions (not Python's random or NumPy)")
    return ("exact crops of the zero-padded batch, mirrored or not, offsets and flips uniform per sample, "
            "reproducible; on a (virtual) GPU no copy from the host, nothing read back, memory in proportion.")


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def _crop_statistics(fn, to_device, generator, rng, on, seed, vc):
    n, size, p = 20_000, 12, 4
    grid = (torch.arange(size * size, dtype=torch.float32) + 1).view(1, 1, size, size).expand(n, 1, size, size)
    what = (f"one call random_crop_flip(images) with its defaults (padding 4, generator None) on {n:,} one-channel "
            f"images {size}x{size}, on {on} (seed {seed})")
    out = _values(_call_crop(fn, to_device(grid.contiguous()), p, None, what, vc, defaults=True))
    dy, dx, flipped = _offsets_of(out, size, p)
    if (dy is not None and int(dy.min()) > 0 and int(dx.min()) > 0 and int(dy.min()) + int(dy.max()) == 2 * p
            and len(torch.unique(dy)) >= 3):          # a narrower range, centred: a smaller padding
        raise CheckFailed("pads by 4 by default", f"{what}: offsets only in {int(dy.min())}..{int(dy.max())} of the "
                          f"image padded by 4: yours padded by less", "def random_crop_flip(images, padding=4, "
                          "generator=None)")
    if dy is None:
        raise CheckFailed("every output is a crop of the padded input, mirrored or not",
                          f"{what}: some outputs are not crops at an offset within 0..{2 * p}")
    _uniform(dy, 2 * p + 1, "vertical offsets", what)
    _uniform(dx, 2 * p + 1, "horizontal offsets", what)
    share = float(flipped.float().mean())
    if not 0.485 <= share <= 0.515:      # 4.2 standard deviations of a fair coin over 20,000 samples
        raise CheckFailed("flips half the samples", f"{what}: yours flipped {share:.1%}",
                          "draw one flip per sample with probability 1/2, e.g. torch.rand(n) < 0.5")
    # each sample independently: half of every part of the batch too, not half of the whole by
    # position (every other sample, the first half) (issue 35: a subset gives another answer)
    half = n // 2
    for part, name in ((flipped[0::2], "the even positions"), (flipped[1::2], "the odd positions"),
                       (flipped[:half], "the first half"), (flipped[half:], "the second half")):
        part_share = float(part.float().mean())
        if not 0.479 <= part_share <= 0.521:     # 4.2 standard deviations over 10,000 samples
            raise CheckFailed("flips each sample independently, with probability 1/2",
                              f"{what}: yours flipped {share:.1%} of the batch, but {part_share:.1%} of {name}",
                              "a flip drawn at random for each sample (torch.rand(n) < 0.5), not by its position")
    same = float((dy == dx).float().mean())
    if not 0.09 <= same <= 0.135:        # independent offsets agree 1/9 of the time
        raise CheckFailed("draws the two offsets independently", f"{what}: dy == dx for {same:.1%} of samples "
                          "(independent offsets: about 11%)", "draw dy and dx separately")


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


def _uniform(values, k, name, what):
    counts = torch.bincount(values, minlength=k).tolist()
    expected = len(values) / k
    if sum(n > 0 for n in counts) <= 2:
        raise CheckFailed("offsets vary across samples, uniformly",
                          f"{what}: {name} counted {counts}: nearly every sample got the same offset",
                          "draw one offset per sample (a tensor of N offsets), not one for the whole batch")
    missing = [i for i, n in enumerate(counts) if n == 0]
    if missing:
        raise CheckFailed("offsets cover the whole range", f"{what}: {name} {missing} never occur (counts {counts})",
                          "torch.randint's upper bound is exclusive: offsets in 0..2*padding need high=2*padding+1")
    if min(counts) < 0.85 * expected or max(counts) > 1.15 * expected:    # over 5 standard deviations
        raise CheckFailed("offsets vary across samples, uniformly",
                          f"{what}: {name} counted {counts} (about {expected:.0f} each expected)",
                          "draw one offset per sample, uniformly over 0..2*padding, not one for the whole batch")


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
    places = ["cpu", "virtual"] + (["cuda"] if torch.cuda.is_available() else [])
    for place in places:
        with (VirtualCuda() if place == "virtual" else _nothing()) as vc:
            on = VIRTUAL if place == "virtual" else place
            sizes = [(int(rng.integers(2, 6)), 4, 3), (int(rng.integers(2, 24)), 32, 32), (1, 7, 5),
                     (int(rng.integers(2, 9)), 12, 20)]
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
                try:
                    result = normalize_on_device(images, labels)
                except RuntimeError as exc:
                    raise _learner_error(exc, what) or exc
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
                    raise CheckFailed("passes the labels through", f"{what}: the labels came back changed")
                if out.device != images.device or isinstance(out, DeviceTensor) != isinstance(images, DeviceTensor):
                    raise CheckFailed("normalises on the device", f"{what}: yours returned images on {out.device}",
                                      "stay on images.device: make mean and std tensors there")
                if out.dtype != torch.float32:
                    raise CheckFailed("returns float32", f"{what}: yours is {out.dtype}", "images.float()")
                if out.shape != images.shape:
                    raise CheckFailed("keeps the (N, 3, H, W) shape", f"{what}: yours {tuple(out.shape)}")
                _compare_normalized(_values(out), hwc, host, what)
                if vc is not None:
                    _judge_normalize_traffic(vc, call, what)
    return ("float32 on the device, equal to ToTensor + Normalize within 1e-4, labels passed through; on a "
            "(virtual) GPU no copy from the host after the first batch, nothing read back.")


def _compare_normalized(out, hwc, host, what):
    expected = _reference_normalize(hwc)
    err = (out - expected).abs()
    if not bool(torch.isfinite(out).all()) or float(err.max()) > 1e-4:
        i = np.unravel_index(int(torch.nan_to_num(err, nan=1e9).argmax()), tuple(err.shape))
        yours, want = float(out[i]), float(expected[i])
        hint = "x / 255, then subtract the mean and divide by the std, per channel"
        raw = float(host[i])
        if abs(yours - (raw - CIFAR10_MEAN[i[1]]) / CIFAR10_STD[i[1]]) < 1e-3:
            hint = "ToTensor scales 0..255 to 0..1: divide by 255 first"
        elif abs(yours - raw / 255) < 1e-4:
            hint = "Normalize is missing: subtract the mean and divide by the std of each channel"
        raise CheckFailed("equals ToTensor + Normalize", f"{what}: element {tuple(int(j) for j in i)}: yours "
                          f"{yours:.5f}, expected {want:.5f}", hint)


def _judge_normalize_traffic(vc, call, what):
    h2d = vc.h2d()
    if h2d and (call > 0 or sum(c.nbytes for c in h2d) > 1024):
        raise CheckFailed("makes no copy from the host after the first batch",
                          f"{what}: {len(h2d)} copies from the host during this call ({h2d[0].what} at {h2d[0].where})",
                          "create mean and std on the device once (per device) and keep them: "
                          "torch.tensor(..., device=...) or .to(device) in every call copies them from the host "
                          "for every batch, and the copy waits for the host")
    if vc.d2h() or vc.reads():
        first = (vc.reads() or vc.d2h())[0]
        raise CheckFailed("never waits for the device", f"{what}: the images (or values computed from them) came back "
                          f"to the host ({first.what} at {first.where})",
                          "normalise with tensor operations on images.device; no .cpu(), .numpy(), .item()")
