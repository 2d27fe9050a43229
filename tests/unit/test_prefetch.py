"""course_utils.prefetch: the stream prefetcher and the background-thread loader (lesson 03)."""
import threading
import time
from collections import namedtuple

import pytest
import torch

from course_utils.prefetch import BackgroundLoader, CudaPrefetcher, to_device
from course_utils.sim import SimulatedAccelerator


class Batches:
    """A re-iterable loader: a new list of (images, labels) batches on every pass, counting requests."""

    def __init__(self, n, seed=0, fail_at=None, delay_s=0.0):
        self.n, self.seed, self.fail_at, self.delay_s = n, seed, fail_at, delay_s
        self.passes = 0
        self.produced = 0

    def batches(self, pass_index):
        g = torch.Generator().manual_seed(self.seed * 1000 + pass_index)
        return [(torch.randn(4, 3, 2, 2, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(self.n)]

    def __len__(self):
        return self.n

    def __iter__(self):
        expected = self.batches(self.passes)
        self.passes += 1
        for i, batch in enumerate(expected):
            if self.fail_at == i:
                raise RuntimeError("loader broke")
            if self.delay_s:
                time.sleep(self.delay_s)
            self.produced += 1
            yield batch


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_to_device_keeps_structure():
    Pair = namedtuple("Pair", "x y")
    t = torch.arange(3)
    out = to_device({"a": [t, (t, 1)], "b": Pair(t, "s")}, "cpu")
    assert torch.equal(out["a"][0], t) and out["a"][1][1] == 1
    assert isinstance(out["b"], Pair) and out["b"].y == "s"


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_prefetcher_passes_batches_through_off_cuda(device):
    dev = SimulatedAccelerator(step_ms=0) if device == "sim" else torch.device("cpu")
    loader = Batches(5)
    pf = CudaPrefetcher(loader, dev)
    assert len(pf) == 5
    for p in range(2):                       # iterable again, a new pass each time
        got = list(pf)
        want = loader.batches(p)
        assert len(got) == 5
        assert all(_same(g, w) for g, w in zip(got, want))
    assert list(CudaPrefetcher(Batches(0), "cpu")) == []


def test_background_loader_same_batches_in_order_and_again():
    loader = Batches(7)
    bg = BackgroundLoader(loader, max_prefetch=2)
    assert len(bg) == 7
    for p in range(2):
        got = list(bg)
        assert len(got) == 7 and all(_same(g, w) for g, w in zip(got, loader.batches(p)))
    assert list(BackgroundLoader(Batches(0))) == []


def test_background_loader_applies_transform_in_its_thread():
    seen = []

    def transform(images, labels):
        seen.append(threading.current_thread().name)
        return images * 2, labels

    loader = Batches(3)
    got = list(BackgroundLoader(loader, transform=transform))
    assert all(torch.equal(g[0], w[0] * 2) for g, w in zip(got, loader.batches(0)))
    assert seen == ["background-loader"] * 3


def test_background_loader_raises_the_loaders_error():
    with pytest.raises(RuntimeError, match="loader broke"):
        list(BackgroundLoader(Batches(5, fail_at=2)))


def test_background_loader_stops_its_thread_on_break():
    before = threading.active_count()
    loader = Batches(1000)
    for i, _ in enumerate(BackgroundLoader(loader, max_prefetch=2)):
        if i == 2:
            break
    deadline = time.time() + 5
    while threading.active_count() > before and time.time() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before
    assert loader.produced < 10           # it stopped reading instead of draining the loader


def test_background_loader_overlaps_loading_with_the_consumer():
    # 8 batches of 60 ms to load, 60 ms to consume: about 0.96 s in turn, about 0.5 s overlapped
    loader = Batches(8, delay_s=0.06)
    t0 = time.perf_counter()
    for _ in BackgroundLoader(loader, max_prefetch=2):
        time.sleep(0.06)
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.8, f"no overlap: {elapsed:.2f} s"


def test_background_loader_validates():
    with pytest.raises(ValueError):
        BackgroundLoader([], max_prefetch=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_prefetcher_copies_on_a_side_stream():
    device = torch.device("cuda")
    loader = Batches(4)
    pf = CudaPrefetcher(loader, device)
    got = list(pf)
    assert pf.stream is not None and pf.stream != torch.cuda.current_stream(device)
    assert all(g[0].is_cuda and g[1].is_cuda for g in got)
    assert all(torch.equal(g[0].cpu(), w[0]) for g, w in zip(got, loader.batches(0)))
    assert len(list(pf)) == 4


def test_the_background_thread_uses_the_consumers_cuda_device(monkeypatch):
    """x-03 C2: a new thread starts on CUDA device 0; pinning there (or a DataLoader's pin thread
    started there) put a CUDA context of every rank on GPU 0. The thread takes the consumer's device
    before it touches the loader."""
    local = threading.local()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: getattr(local, "device", 0))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: setattr(local, "device", d))
    seen = []

    class Loader:
        def __iter__(self):
            seen.append(torch.cuda.current_device())   # where iter(loader) runs: the loader's thread
            yield torch.zeros(2), torch.zeros(2)

    torch.cuda.set_device(3)                           # this rank's GPU, in the consumer's thread
    assert len(list(BackgroundLoader(Loader()))) == 1
    assert seen == [3], seen
