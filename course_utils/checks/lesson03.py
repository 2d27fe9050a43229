"""Checks for lesson 03 (prefetch to the GPU)."""
from __future__ import annotations

import itertools

import numpy as np
import torch
import torch.nn.functional as F

from ..data import CIFAR10_MEAN, CIFAR10_STD
from ._core import CheckFailed, exercise, expect_callable, expect_class
from ._util import fresh_rng


def _devices() -> list[torch.device]:
    return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


# -- 3.1 the prefetcher ---------------------------------------------------------------------------

class _ScriptedLoader:
    """A re-iterable loader like a shuffling DataLoader: every pass yields new batches, made
    from the pass number and a seed, so the check knows what each pass must give. Counts how
    many batches it has handed out in the current pass."""

    def __init__(self, seed: int, n_batches: int, *, pinned_big: bool = False):
        self.seed, self.n_batches, self.pinned_big = seed, n_batches, pinned_big
        self.passes = 0
        self.handed_out = 0

    def expected(self, pass_index: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(self.seed + 7919 * pass_index)
        out = []
        for i in range(self.n_batches):
            if self.pinned_big:   # 64 MiB batches, one constant each: a copy read too early shows
                images = torch.full((16 * 2**20,), float(pass_index * 100 + i + 1))
            else:
                b = int(torch.randint(1, 9, (1,), generator=g))
                images = torch.randn(b, 3, 5, 6, generator=g)
            labels = torch.randint(0, 10, (len(images) if not self.pinned_big else 4,), generator=g)
            out.append((images, labels))
        return out

    def __len__(self) -> int:
        return self.n_batches

    def __iter__(self):
        batches = self.expected(self.passes)
        self.passes += 1
        self.handed_out = 0
        for images, labels in batches:
            if self.pinned_big:
                images, labels = images.pin_memory(), labels.pin_memory()
            self.handed_out += 1
            yield images, labels


def _as_pair(batch, where):
    if not isinstance(batch, (tuple, list)) or len(batch) != 2 or not all(isinstance(t, torch.Tensor) for t in batch):
        raise CheckFailed("yields (images, labels) pairs", f"{where}: yours yielded {_kind(batch)}",
                          "yield the two tensors of each batch, e.g. `yield images, labels`")
    return batch


def _kind(obj) -> str:
    if obj is None:
        return "None (an end-of-data marker yielded as a batch?)"
    if isinstance(obj, (tuple, list)):
        return f"a {type(obj).__name__} of {len(obj)}: {', '.join(type(o).__name__ for o in obj)}"
    return f"a {type(obj).__name__}"


def _one_pass(pf, loader, pass_index, device, what, *, lazy=True):
    expected = loader.expected(pass_index)
    got = []
    for i, batch in enumerate(itertools.islice(iter(pf), len(expected) + 3)):
        if i >= len(expected):
            raise CheckFailed("ends cleanly", f"{what}: the loader has {len(expected)} batches, yours yielded more "
                              f"(batch {i} was {_kind(batch)})",
                              "stop (return) when the loader is exhausted instead of yielding an end marker")
        images, labels = _as_pair(batch, f"{what}, batch {i}")
        if lazy and i < len(expected) and loader.handed_out > i + 2:
            raise CheckFailed("reads the loader as it goes", f"{what}: when batch {i} reached the consumer, yours had "
                              f"already taken {loader.handed_out} batches from the loader",
                              "a DataLoader can be endless or huge: take the next batch only, do not list() it")
        got.append((images, labels))
    if len(got) < len(expected):
        raise CheckFailed("yields every batch", f"{what}: the loader has {len(expected)} batches, yours yielded {len(got)}",
                          "the first batch is fetched before the loop and the last one is still pending when "
                          "the loader runs out: yield it before stopping")
    for i, ((images, labels), (want_x, want_y)) in enumerate(zip(got, expected)):
        for name, t in (("images", images), ("labels", labels)):
            if t.device.type != device.type:
                raise CheckFailed("puts the tensors on the device", f"{what}, batch {i}: {name} on {t.device}, expected {device}",
                                  "move both tensors with .to(device, non_blocking=True)")
        if not (images.shape == want_x.shape and torch.equal(images.cpu(), want_x)
                and labels.shape == want_y.shape and torch.equal(labels.cpu(), want_y)):
            order = ""
            for j, (wx, _) in enumerate(expected):
                if j != i and wx.shape == images.shape and torch.equal(images.cpu(), wx):
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
def check_prefetcher(Prefetcher):
    expect_class(Prefetcher, "a class Prefetcher(loader, device) whose instances are iterables of batches")
    rng, seed = fresh_rng()
    for device in _devices():
        for n in (int(rng.integers(3, 8)), 1, 0):
            loader = _ScriptedLoader(int(rng.integers(1 << 30)), n)
            pf = Prefetcher(loader, device)
            what = f"a loader of {n} batch{'es' if n != 1 else ''} on {device.type} (seed {seed})"
            _one_pass(pf, loader, 0, device, what)
            _one_pass(pf, loader, 1, device, what + ", second pass")   # iterable again: a new pass
            if loader.passes != 2:
                raise CheckFailed("starts a new pass over the loader each time it is iterated",
                                  f"{what}: two passes over yours called iter(loader) {loader.passes} times",
                                  "call iter(self.loader) inside __iter__, not in __init__")
    if torch.cuda.is_available():
        _check_cuda_streams(Prefetcher)
        return "same batches, same order, on the device, copied on a side stream the consumer waits for; ends and restarts cleanly."
    return ("same batches, same order, passed through on the CPU; ends and restarts cleanly. "
            "(No GPU here: the side-stream part is checked on a CUDA machine.)")


def _check_cuda_streams(Prefetcher):
    device = torch.device("cuda")
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
        value = float(i + 1)
        # read at once, on the consumer's stream: without wait_stream this races the copy
        if not bool((images == value).all()):
            bad.append(i)
    for _ in it:
        pass
    if bad:
        raise CheckFailed("the consumer waits for the copy", f"batches {bad} were read before their copy had "
                          "finished (the values were not yet there)",
                          "before handing out a batch: torch.cuda.current_stream().wait_stream(self.stream)")


# -- 3.2 batched random crop + flip ----------------------------------------------------------------

def _windows(images, padding):
    padded = F.pad(images, (padding,) * 4)
    n, c, h, w = images.shape
    k = 2 * padding + 1
    s = padded.stride()
    return padded.as_strided((n, k, k, c, h, w), (s[0], s[2], s[3], s[1], s[2], s[3]))


def _call_crop(fn, images, padding, generator, what):
    before = images.clone()
    out = fn(images, padding=padding, generator=generator)
    if not isinstance(out, torch.Tensor):
        raise CheckFailed("returns a tensor", f"{what}: yours returned {type(out).__name__}")
    if not torch.equal(images, before):
        raise CheckFailed("leaves its input unchanged", f"{what}: the images passed in were modified",
                          "work on a padded copy (F.pad returns a new tensor)")
    if out.shape != images.shape:
        raise CheckFailed("keeps the shape", f"{what}: input {tuple(images.shape)}, yours {tuple(out.shape)}",
                          "each crop is H x W, the size of the input image, taken from the padded image")
    if out.dtype != images.dtype or out.device != images.device:
        raise CheckFailed("keeps dtype and device", f"{what}: input {images.dtype} on {images.device}, yours "
                          f"{out.dtype} on {out.device}", "use tensor ops on the images' device; no .cpu(), no .float()")
    return out


def _generator(device, seed):
    return torch.Generator(device=device).manual_seed(int(seed))


@exercise("3.2", "Random crop with padding and flip, for a whole batch on the device", points=2)
def check_crop_flip(random_crop_flip):
    expect_callable(random_crop_flip, "a function random_crop_flip(images, padding=4, generator=None) -> tensor")
    rng, seed = fresh_rng()
    for device in _devices():
        # (a) every output is an exact crop of the zero-padded input, mirrored or not
        for n, c, h, w, p, dtype in [(96, 3, 32, 32, 4, torch.uint8), (40, 3, 11, 14, 2, torch.float32)]:
            what = f"{n} random {dtype} images {c}x{h}x{w}, padding={p}, on {device.type} (seed {seed})"
            host = torch.from_numpy(rng.integers(0, 256, (n, c, h, w), dtype=np.uint8)).to(dtype)
            images = host.to(device)
            out = _call_crop(random_crop_flip, images, p, _generator(device, rng.integers(1 << 31)), what).cpu()
            win = _windows(host, p)                                          # (n, k, k, c, h, w)
            plain = (win == out[:, None, None]).flatten(3).all(-1)
            mirrored = (win.flip(-1) == out[:, None, None]).flatten(3).all(-1)
            ok = (plain | mirrored).flatten(1).any(1)
            if not bool(ok.all()):
                i = int((~ok).nonzero()[0])
                hint = ("pad all four sides with zeros (F.pad(images, (p, p, p, p))), draw each offset in "
                        "0..2*padding inclusive, take the H x W window there, and flip the last (width) axis")
                if bool(torch.equal(out[i], host[i].flip(-2))):
                    hint = "a horizontal flip mirrors the width (last) axis, not the height"
                raise CheckFailed("every output is a crop of the padded input, mirrored or not",
                                  f"{what}: sample {i} is not the H x W window of its zero-padded image at any "
                                  f"offset in 0..{2 * p}, plain or mirrored", hint)
        # (b) offsets and flips vary across samples, roughly uniformly, in one call
        n, size, p = 4000, 16, 4
        grid = (torch.arange(size * size, dtype=torch.float32) + 1).view(1, 1, size, size).expand(n, 3, size, size)
        grid = grid.contiguous().to(device)
        what = f"one call on {n} images {size}x{size}, padding={p}, on {device.type} (seed {seed})"
        out = _call_crop(random_crop_flip, grid, p, _generator(device, rng.integers(1 << 31)), what).cpu()
        dy, dx, flipped = _offsets_of(out, size, p)
        if dy is None:
            raise CheckFailed("every output is a crop of the padded input, mirrored or not",
                              f"{what}: some outputs are not crops at an offset within 0..{2 * p}")
        _uniform(dy, 2 * p + 1, "vertical offsets", what)
        _uniform(dx, 2 * p + 1, "horizontal offsets", what)
        share = float(flipped.float().mean())
        if not 0.44 <= share <= 0.56:
            raise CheckFailed("flips about half the samples", f"{what}: yours flipped {share:.1%}",
                              "draw one flip per sample with probability 1/2, e.g. torch.rand(n) < 0.5")
        if float((dy == dx).float().mean()) > 0.3:
            raise CheckFailed("draws the two offsets independently", f"{what}: dy == dx for "
                              f"{float((dy == dx).float().mean()):.0%} of samples (independent offsets: about 11%)",
                              "draw dy and dx separately")
        # (c) reproducible under a seed; another seed gives other crops
        s = int(rng.integers(1 << 31))
        images = torch.from_numpy(rng.integers(0, 256, (64, 3, 32, 32), dtype=np.uint8)).to(device)
        what = f"64 images on {device.type}, generator seeded {s}"
        a = _call_crop(random_crop_flip, images, 4, _generator(device, s), what)
        b = _call_crop(random_crop_flip, images, 4, _generator(device, s), what)
        if not torch.equal(a, b):
            raise CheckFailed("reproducible under a seed", f"{what}: two calls with generators seeded alike differ",
                              "draw every random number from `generator` (torch.randint(..., generator=generator))")
        other = _call_crop(random_crop_flip, images, 4, _generator(device, s + 1), what)
        if torch.equal(a, other):
            raise CheckFailed("uses the generator it is given", f"{what}: seeds {s} and {s + 1} gave identical crops",
                              "pass `generator` to every torch.randint / torch.rand call")
        torch.manual_seed(s)
        if device.type == "cuda":
            torch.cuda.manual_seed(s)
        a = _call_crop(random_crop_flip, images, 4, None, what + " (generator=None)")
        torch.manual_seed(s)
        if device.type == "cuda":
            torch.cuda.manual_seed(s)
        b = _call_crop(random_crop_flip, images, 4, None, what + " (generator=None)")
        if not torch.equal(a, b):
            raise CheckFailed("with generator=None, reproducible under torch.manual_seed",
                              f"{what}: two calls after torch.manual_seed({s}) differ",
                              "use torch's random functions (not Python's random or NumPy)")
    return "exact crops of the zero-padded batch, mirrored or not, offsets and flips uniform per sample, reproducible."


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
        raise CheckFailed("offsets vary across samples, roughly uniformly",
                          f"{what}: {name} counted {counts}: nearly every sample got the same offset",
                          "draw one offset per sample (a tensor of N offsets), not one for the whole batch")
    missing = [i for i, n in enumerate(counts) if n == 0]
    if missing:
        raise CheckFailed("offsets cover the whole range", f"{what}: {name} {missing} never occur (counts {counts})",
                          "torch.randint's upper bound is exclusive: offsets in 0..2*padding need high=2*padding+1")
    if min(counts) < 0.6 * expected or max(counts) > 1.4 * expected:
        raise CheckFailed("offsets vary across samples, roughly uniformly",
                          f"{what}: {name} counted {counts} (about {expected:.0f} each expected)",
                          "draw one offset per sample, uniformly, not one for the whole batch")


# -- 3.3 normalise uint8 on the device ----------------------------------------------------------------

def _reference_normalize(images_hwc: np.ndarray) -> torch.Tensor:
    import torchvision.transforms as T
    from PIL import Image
    tf = T.Compose([T.ToTensor(), T.Normalize(CIFAR10_MEAN, CIFAR10_STD)])
    return torch.stack([tf(Image.fromarray(im)) for im in images_hwc])


@exercise("3.3", "uint8 on the device, normalised there")
def check_normalize(normalize_on_device):
    expect_callable(normalize_on_device, "a function normalize_on_device(images, labels) -> (images, labels)")
    rng, seed = fresh_rng()
    for device in _devices():
        for n, h, w in [(int(rng.integers(2, 24)), 32, 32), (1, 7, 5), (int(rng.integers(2, 9)), 12, 20)]:
            hwc = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
            hwc[0, 0, 0] = (0, 0, 0)
            hwc[0, 0, 1] = (255, 255, 255)
            images = torch.from_numpy(hwc).permute(0, 3, 1, 2).contiguous().to(device)
            labels = torch.from_numpy(rng.integers(0, 10, n)).to(device)
            before = images.clone()
            what = f"{n} uint8 images 3x{h}x{w} on {device.type} (seed {seed})"
            result = normalize_on_device(images, labels)
            if not isinstance(result, (tuple, list)) or len(result) != 2:
                raise CheckFailed("returns (images, labels)", f"{what}: yours returned {_kind(result)}",
                                  "a batch_transform returns both: `return images, labels`")
            out, out_labels = result
            if not isinstance(out, torch.Tensor):
                raise CheckFailed("returns a tensor of images", f"{what}: yours returned {type(out).__name__}")
            if not torch.equal(images, before):
                raise CheckFailed("leaves its input unchanged", f"{what}: the uint8 images were modified")
            if not isinstance(out_labels, torch.Tensor) or not torch.equal(out_labels, labels):
                raise CheckFailed("passes the labels through", f"{what}: the labels came back changed")
            if out.device != images.device:
                raise CheckFailed("normalises on the device", f"{what}: yours returned images on {out.device}",
                                  "stay on images.device: make mean and std tensors there")
            if out.dtype != torch.float32:
                raise CheckFailed("returns float32", f"{what}: yours is {out.dtype}", "images.float()")
            if out.shape != images.shape:
                raise CheckFailed("keeps the (N, 3, H, W) shape", f"{what}: yours {tuple(out.shape)}")
            expected = _reference_normalize(hwc)
            err = (out.cpu() - expected).abs()
            if float(err.max()) > 1e-4:
                i = np.unravel_index(int(err.argmax()), tuple(err.shape))
                yours, want = float(out.cpu()[i]), float(expected[i])
                hint = "x / 255, then subtract the mean and divide by the std, per channel"
                raw = float(images.cpu()[i])
                if abs(yours - (raw - CIFAR10_MEAN[i[1]]) / CIFAR10_STD[i[1]]) < 1e-3:
                    hint = "ToTensor scales 0..255 to 0..1: divide by 255 first"
                elif abs(yours - raw / 255) < 1e-4:
                    hint = "Normalize is missing: subtract the mean and divide by the std of each channel"
                raise CheckFailed("equals ToTensor + Normalize", f"{what}: element {tuple(int(j) for j in i)}: yours "
                                  f"{yours:.5f}, expected {want:.5f}", hint)
    return "float32 on the device, equal to ToTensor + Normalize within 1e-4, labels passed through."
