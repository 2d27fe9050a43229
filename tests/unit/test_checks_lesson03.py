"""Lesson 03's checks: correct code passes, typical mistakes fail on the right property, stubs are
reported as not implemented."""
import pytest
import torch
import torch.nn.functional as F

from course_utils.checks import run_check
from course_utils.data import CIFAR10_MEAN, CIFAR10_STD
from course_utils.device_data import random_crop_flip as library_crop_flip


def _failed(result, prop):
    assert result.status == "fail", result.message
    assert prop in result.message, result.message


# -- 3.1 ------------------------------------------------------------------------------------------

class GoodPrefetcher:
    def __init__(self, loader, device):
        self.loader, self.device = loader, torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def __iter__(self):
        if self.stream is None:
            for images, labels in self.loader:
                yield images.to(self.device), labels.to(self.device)
            return
        batches = iter(self.loader)

        def preload():
            try:
                images, labels = next(batches)
            except StopIteration:
                return None
            with torch.cuda.stream(self.stream):
                return images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)

        upcoming = preload()
        while upcoming is not None:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(self.stream)
            for t in upcoming:
                t.record_stream(consumer)
            batch, upcoming = upcoming, preload()
            yield batch


class EndsWithNone(GoodPrefetcher):          # the apex idiom: next() returns None at the end
    def __iter__(self):
        yield from super().__iter__()
        yield None


class DropsTheLast(GoodPrefetcher):          # forgets the batch still pending when the loader runs out
    def __iter__(self):
        batches = iter(self.loader)
        pending = next(batches, None)
        for batch in batches:
            yield tuple(t.to(self.device) for t in pending)
            pending = batch


class ListsTheLoader(GoodPrefetcher):
    def __init__(self, loader, device):
        super().__init__(loader, device)
        self.batches = [(x.to(device), y.to(device)) for x, y in loader]

    def __iter__(self):
        return iter(self.batches)


class OneShot:                                 # an iterator, not an iterable: empty on the second pass
    def __init__(self, loader, device):
        self.it, self.device = iter(loader), device

    def __iter__(self):
        return self

    def __next__(self):
        images, labels = next(self.it)
        return images.to(self.device), labels.to(self.device)


class YieldsImagesOnly(GoodPrefetcher):
    def __iter__(self):
        for images, _ in super().__iter__():
            yield images


class PrefetchStub:
    def __init__(self, loader, device):
        raise NotImplementedError("Exercise 3.1")

    def __iter__(self):
        raise NotImplementedError("Exercise 3.1")


def test_3_1_correct_passes():
    result = run_check("3.1", GoodPrefetcher)
    assert result.status == "pass", result.message


def test_3_1_library_prefetcher_passes():
    from course_utils.prefetch import CudaPrefetcher
    assert run_check("3.1", CudaPrefetcher).status == "pass"


@pytest.mark.parametrize("cls, prop", [
    (EndsWithNone, "ends cleanly"),
    (DropsTheLast, "yields every batch"),
    (ListsTheLoader, "reads the loader as it goes"),
    (OneShot, "yields every batch"),
    (YieldsImagesOnly, "yields (images, labels) pairs"),
])
def test_3_1_mistakes_fail(cls, prop):
    _failed(run_check("3.1", cls), prop)


def test_3_1_stub_and_wrong_type():
    assert run_check("3.1", PrefetchStub).status == "not_implemented"
    result = run_check("3.1", GoodPrefetcher(range(3), "cpu"))
    assert result.status == "fail" and "a class" in result.message


# -- 3.2 ------------------------------------------------------------------------------------------

def _draws(n, padding, device, generator, high=None):
    high = 2 * padding + 1 if high is None else high
    dy = torch.randint(0, high, (n,), device=device, generator=generator)
    dx = torch.randint(0, high, (n,), device=device, generator=generator)
    flip = torch.rand(n, device=device, generator=generator) < 0.5
    return dy, dx, flip


def _crop_with(images, padding, dy, dx, flip, *, mode="constant", flip_dim=-1):
    padded = F.pad(images, (padding,) * 4, mode=mode) if mode == "constant" else \
        F.pad(images.float(), (padding,) * 4, mode=mode).to(images.dtype)
    h, w = images.shape[-2:]
    out = torch.stack([padded[i, :, int(y):int(y) + h, int(x):int(x) + w] for i, (y, x) in enumerate(zip(dy, dx))])
    return torch.where(flip.view(-1, 1, 1, 1), out.flip(flip_dim), out)


def loop_crop_flip(images, padding=4, generator=None):
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    return _crop_with(images, padding, dy, dx, flip)


def one_offset_for_the_batch(images, padding=4, generator=None):
    dy, dx, flip = _draws(1, padding, images.device, generator)
    n = len(images)
    return _crop_with(images, padding, dy.expand(n), dx.expand(n), flip.expand(n))


def exclusive_upper_bound(images, padding=4, generator=None):
    dy, dx, flip = _draws(len(images), padding, images.device, generator, high=2 * padding)
    return _crop_with(images, padding, dy, dx, flip)


def flips_height(images, padding=4, generator=None):
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    return _crop_with(images, padding, dy, dx, flip, flip_dim=-2)


def reflect_padding(images, padding=4, generator=None):
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    return _crop_with(images, padding, dy, dx, flip, mode="reflect")


def ignores_generator(images, padding=4, generator=None):
    return library_crop_flip(images, padding, None)


def flips_everything(images, padding=4, generator=None):
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    return _crop_with(images, padding, dy, dx, torch.ones_like(flip))


def same_offset_both_axes(images, padding=4, generator=None):
    dy, _, flip = _draws(len(images), padding, images.device, generator)
    return _crop_with(images, padding, dy, dy, flip)


def returns_float(images, padding=4, generator=None):
    return library_crop_flip(images, padding, generator).float()


def crop_stub(images, padding=4, generator=None):
    raise NotImplementedError("Exercise 3.2")


def test_3_2_correct_pass():
    for fn in (library_crop_flip, loop_crop_flip):
        result = run_check("3.2", fn)
        assert result.status == "pass", result.message


@pytest.mark.parametrize("fn, prop", [
    (one_offset_for_the_batch, "offsets vary across samples"),
    (exclusive_upper_bound, "offsets cover the whole range"),
    (flips_height, "every output is a crop of the padded input"),
    (reflect_padding, "every output is a crop of the padded input"),
    (ignores_generator, "reproducible under a seed"),
    (flips_everything, "flips about half"),
    (same_offset_both_axes, "independently"),
    (returns_float, "keeps dtype and device"),
])
def test_3_2_mistakes_fail(fn, prop):
    _failed(run_check("3.2", fn), prop)


def test_3_2_stub_and_wrong_type():
    assert run_check("3.2", crop_stub).status == "not_implemented"
    assert run_check("3.2", torch.zeros(3)).status == "fail"


# -- 3.3 ------------------------------------------------------------------------------------------

def _consts(device):
    return (torch.tensor(CIFAR10_MEAN, device=device).view(1, 3, 1, 1),
            torch.tensor(CIFAR10_STD, device=device).view(1, 3, 1, 1))


def good_normalize(images, labels):
    mean, std = _consts(images.device)
    return (images.float() / 255 - mean) / std, labels


def forgets_255(images, labels):
    mean, std = _consts(images.device)
    return (images.float() - mean) / std, labels


def no_normalize(images, labels):
    return images.float() / 255, labels


def swapped_constants(images, labels):
    mean, std = _consts(images.device)
    return (images.float() / 255 - std) / mean, labels


def returns_images_only(images, labels):
    return good_normalize(images, labels)[0]


def float64(images, labels):
    out, labels = good_normalize(images, labels)
    return out.double(), labels


def normalize_stub(images, labels):
    raise NotImplementedError("Exercise 3.3")


def test_3_3_correct_pass():
    from course_utils.device_data import normalize_batch
    for fn in (good_normalize, normalize_batch):
        result = run_check("3.3", fn)
        assert result.status == "pass", result.message


@pytest.mark.parametrize("fn, prop, hint", [
    (forgets_255, "equals ToTensor + Normalize", "divide by 255"),
    (no_normalize, "equals ToTensor + Normalize", "Normalize is missing"),
    (swapped_constants, "equals ToTensor + Normalize", ""),
    (returns_images_only, "returns (images, labels)", ""),
    (float64, "returns float32", ""),
])
def test_3_3_mistakes_fail(fn, prop, hint):
    result = run_check("3.3", fn)
    _failed(result, prop)
    assert hint in result.message


def test_3_3_stub():
    assert run_check("3.3", normalize_stub).status == "not_implemented"
