"""Lesson 02 checks: right answers pass, typical wrong ones fail on the right property, stubs are
'not implemented'."""
import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from course_utils.checks import run_check
from course_utils.env import usable_cores
from mutants import Mutant, passes, rejected


# -- 2.1 ------------------------------------------------------------------------------------

def choose(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if s >= (1 - tolerance) * best)


def argmax(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty sweep")
    return max(sweep, key=sweep.get)


def first_in_dict_order(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return next(w for w, s in sweep.items() if s >= (1 - tolerance) * best)


def stop_at_first_drop(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty sweep")
    counts = sorted(sweep)
    for a, b in zip(counts, counts[1:]):
        if sweep[b] < sweep[a]:
            return a
    return counts[-1]


def absolute_tolerance(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if s >= best - tolerance)


def returns_throughput(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty sweep")
    return sweep[choose(sweep, tolerance)]


def no_empty_guard(sweep, tolerance=0.05):
    if not sweep:
        return 0
    return choose(sweep, tolerance)


def sorts_in_place(sweep, tolerance=0.05):
    items = sorted(sweep.items())
    sweep.clear()
    sweep.update(items)
    return choose(sweep, tolerance)


def stub_21(sweep, tolerance=0.05):
    raise NotImplementedError("Exercise 2.1")


def strict_inequality(sweep, tolerance=0.05):           # "at least" read as "more than"
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if s > (1 - tolerance) * best)


def zero_tolerance_is_default(sweep, tolerance=0.05):    # `tolerance or 0.05`: 0 is falsy
    return choose(sweep, tolerance or 0.05)


def divides_by_one_plus(sweep, tolerance=0.05):           # best / (1 + t): slightly off
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if s * (1 + tolerance) >= best)


def scans_down_from_the_best(sweep, tolerance=0.05):      # stops at the first count below the threshold
    if not sweep:
        raise ValueError("empty sweep")
    counts = sorted(sweep)
    best = max(sweep.values())
    i = counts.index(max(sweep, key=sweep.get))
    while i > 0 and sweep[counts[i - 1]] >= (1 - tolerance) * best:
        i -= 1
    return counts[i]


def rounds_the_ratio(sweep, tolerance=0.05):             # issue 35's rule: 0.948 x best rounds to 0.95
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return min(w for w, v in sweep.items() if round(v / best, 2) >= 1 - tolerance)


def ignores_tolerance(sweep, tolerance=0.05):
    return choose(sweep)


def default_of_a_tenth(sweep, tolerance=0.1):
    return choose(sweep, tolerance)


def largest_count(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty sweep")
    return max(sweep)


# The walk of issue 37 (w1-02): the learner's own wrong answers, as written there.
def truncated_threshold(sweep, tolerance=0.05):     # passed 40 of 40 seeds: the knife edges were integers
    if not sweep:
        raise ValueError("empty")
    best = max(sweep.values())
    t = int((1 - tolerance) * best)
    return min(w for w, s in sweep.items() if s >= t)


def rounded_threshold(sweep, tolerance=0.05):       # passed 22 of 40 seeds
    if not sweep:
        raise ValueError("empty")
    best = max(sweep.values())
    t = round((1 - tolerance) * best)
    return min(w for w, s in sweep.items() if s >= t)


def gap_over_the_point(sweep, tolerance=0.05):      # (best - s) / s: was told "compare with >=, not >"
    if not sweep:
        raise ValueError("empty")
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if (best - s) / s <= tolerance)


def tolerance_in_percent(sweep, tolerance=0.05):    # was told "that is the single best point"
    if not sweep:
        raise ValueError("empty")
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if s >= (1 - tolerance / 100) * best)


def skips_zero(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty")
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if w > 0 and s >= (1 - tolerance) * best)


def first_peak(sweep, tolerance=0.05):               # walks up until the curve drops
    if not sweep:
        raise ValueError("empty")
    ws = sorted(sweep)
    best_w = ws[0]
    for w in ws[1:]:
        if sweep[w] < sweep[best_w]:
            break
        best_w = w
    return min(w for w in ws if w <= best_w and sweep[w] >= (1 - tolerance) * sweep[best_w])


def median_reference(sweep, tolerance=0.05):
    import statistics
    if not sweep:
        raise ValueError("empty")
    ref = statistics.median(sweep.values())
    return min(w for w, s in sweep.items() if s >= (1 - tolerance) * ref)


def mean_reference(sweep, tolerance=0.05):
    import statistics
    if not sweep:
        raise ValueError("empty")
    ref = statistics.mean(sweep.values())
    return min(w for w, s in sweep.items() if s >= (1 - tolerance) * ref)


def second_best_reference(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty")
    vals = sorted(sweep.values())
    ref = vals[-2] if len(vals) > 1 else vals[-1]
    return min(w for w, s in sweep.items() if s >= (1 - tolerance) * ref)


def largest_within(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty")
    best = max(sweep.values())
    return max(w for w, s in sweep.items() if s >= (1 - tolerance) * best)


def last_key_is_best(sweep, tolerance=0.05):         # the largest count's throughput taken as the best
    if not sweep:
        raise ValueError("empty")
    best = sweep[max(sweep)]
    return min(w for w, s in sweep.items() if s >= (1 - tolerance) * best)


def remembers_its_first_answer(sweep, tolerance=0.05, _cache={}):   # state kept between calls
    if not sweep:
        raise ValueError("empty")
    if "w" not in _cache:
        _cache["w"] = choose(sweep, tolerance)
    return _cache["w"]


# Right answers written other ways (each passed the walk, each must pass here)
def gap_over_the_best(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty")
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if (best - s) / best <= tolerance)


def ratio_to_the_best(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty")
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if s / best >= 1 - tolerance)


def best_minus_a_share(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty")
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if s >= best - tolerance * best)


def sorted_scan(sweep, tolerance=0.05):
    if not sweep:
        raise ValueError("empty")
    best = max(sweep.values())
    for w in sorted(sweep):
        if sweep[w] >= (1 - tolerance) * best:
            return w


def with_numpy(sweep, tolerance=0.05):                # returns an np.int64 key
    if not sweep:
        raise ValueError("empty")
    ws, ss = np.array(list(sweep)), np.array(list(sweep.values()), dtype=float)
    return ws[ss >= (1 - tolerance) * ss.max()].min()


def max_of_empty_raises_value_error(sweep, tolerance=0.05):   # max() of an empty sequence is a ValueError
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if s >= (1 - tolerance) * best)


def empty_raises_index_error(sweep, tolerance=0.05):
    best = max(sweep.values()) if sweep else [][0]
    return min(w for w, s in sweep.items() if s >= (1 - tolerance) * best)


PICKS = "picks the smallest count within the tolerance of the best"
MUTANTS_21 = [
    Mutant("argmax", argmax, PICKS, words="single best point"),
    Mutant("first in dict order", first_in_dict_order, PICKS, words="any order"),
    Mutant("stops at the first drop", stop_at_first_drop, PICKS, words="a drop does not end the search"),
    Mutant("stops at the first peak", first_peak, PICKS, words="a drop does not end the search"),
    Mutant("absolute tolerance", absolute_tolerance, PICKS, words="not a number of samples/s"),
    Mutant("tolerance in percent", tolerance_in_percent, PICKS, words="not a percentage"),
    Mutant("> instead of >=", strict_inequality, PICKS, words="not >"),
    Mutant("tolerance 0 read as the default", zero_tolerance_is_default, PICKS, words="`tolerance or 0.05`"),
    Mutant("best / (1 + tolerance)", divides_by_one_plus, PICKS, words="best / (1 + tolerance)"),
    Mutant("(best - s) / s", gap_over_the_point, PICKS, words="share of the best"),
    Mutant("threshold truncated to an int", truncated_threshold, PICKS, words="not cut to a whole number"),
    Mutant("threshold rounded", rounded_threshold, PICKS, words="not rounded"),
    Mutant("scans down from the best", scans_down_from_the_best, PICKS, words="dip"),
    Mutant("ignores the tolerance", ignores_tolerance, PICKS, words="use the tolerance argument"),
    Mutant("the ratio rounded to 2 places", rounds_the_ratio, PICKS),
    Mutant("default tolerance 0.1", default_of_a_tenth, PICKS, words="the default tolerance is 0.05"),
    Mutant("the largest count", largest_count, PICKS),
    Mutant("the largest count within", largest_within, PICKS, words="not the largest"),
    Mutant("skips 0 workers", skips_zero, PICKS, words="0 workers is a count"),
    Mutant("the median as the best", median_reference, PICKS, words="not the median"),
    Mutant("the mean as the best", mean_reference, PICKS, words="not the mean"),
    Mutant("the second best as the best", second_best_reference, PICKS, words="not the second best"),
    Mutant("the largest count's throughput as the best", last_key_is_best, PICKS, words="wherever it is"),
    Mutant("remembers its first answer", remembers_its_first_answer, PICKS, words="keep nothing between calls"),
    Mutant("returns the throughput", returns_throughput, "returns a worker count (an int)"),
    Mutant("no empty guard", no_empty_guard, "raises ValueError on an empty sweep"),
    Mutant("IndexError when empty", empty_raises_index_error, "raises ValueError on an empty sweep"),
    Mutant("sorts the sweep in place", sorts_in_place, "leaves the sweep unchanged"),
]


@pytest.mark.parametrize("answer", [choose, gap_over_the_best, ratio_to_the_best, best_minus_a_share, sorted_scan,
                                    with_numpy, max_of_empty_raises_value_error], ids=lambda f: f.__name__)
def test_choose_workers_passes(answer):
    passes("2.1", answer, range(30))


@pytest.mark.parametrize("mutant", MUTANTS_21, ids=repr)
def test_choose_workers_mutants_rejected(mutant):
    rejected("2.1", mutant, range(30))


def test_choose_workers_stub_and_wrong_type():
    assert run_check("2.1", stub_21).status == "not_implemented"
    assert run_check("2.1", 3).status == "fail"


def test_choose_workers_seed_is_reproducible(monkeypatch):
    monkeypatch.setenv("COURSE_CHECK_SEED", "1234")
    a = run_check("2.1", argmax).message
    b = run_check("2.1", argmax).message
    assert a == b and "seed 1234" in a


# -- 2.2 ------------------------------------------------------------------------------------

def fast_loader(dataset, batch_size):
    workers = usable_cores()
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                      persistent_workers=workers > 0, pin_memory=torch.cuda.is_available())


def baseline_loader(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=0)


def oversubscribed(dataset, batch_size):          # 4 workers per usable core: passes, no faster
    workers = 4 * usable_cores()
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                      persistent_workers=True, pin_memory=torch.cuda.is_available())


def drops_last(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores(),
                      persistent_workers=True, drop_last=True)


def not_shuffled(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=usable_cores(),
                      persistent_workers=True)


def with_replacement(dataset, batch_size):
    sampler = torch.utils.data.RandomSampler(dataset, replacement=True)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=usable_cores(),
                      persistent_workers=True)


def one_shot(dataset, batch_size):
    return iter(fast_loader(dataset, batch_size))


def invented_labels(dataset, batch_size):
    n = len(dataset)
    order = torch.randperm(n)
    return [(torch.zeros(len(chunk), 3, 32, 32), chunk) for chunk in order.split(batch_size)]


class CachedOnce:
    """Augments every sample once, then serves the same tensors, reshuffled, every epoch."""

    def __init__(self, dataset, batch_size):
        images, labels = zip(*(dataset[i] for i in range(len(dataset))))
        self.images, self.labels = torch.stack(images), torch.tensor(labels)
        self.batch_size = batch_size

    def __iter__(self):
        for chunk in torch.randperm(len(self.labels)).split(self.batch_size):
            yield self.images[chunk], self.labels[chunk]


class CachesAThird:
    """Issue 35's rule ("all", "each"): augments a third of the samples once and serves them from
    a cache ever after, the other two thirds afresh: 2 in 3 fresh passed a bar of 1 in 2."""

    def __init__(self, dataset, batch_size):
        self.dataset, self.batch_size, self.cache = dataset, batch_size, {}

    def __iter__(self):
        for chunk in torch.randperm(len(self.dataset)).split(self.batch_size):
            items = []
            for i in chunk.tolist():
                if i % 3 == 0:
                    if i not in self.cache:
                        self.cache[i] = self.dataset[i]
                    items.append(self.cache[i])
                else:
                    items.append(self.dataset[i])
            yield torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def stub_22(dataset, batch_size):
    raise NotImplementedError("Exercise 2.2")


class CacheWhenBig:
    """Right on small datasets; on big ones augments every sample once and serves the cache."""

    def __init__(self, dataset, batch_size):
        self.dataset, self.batch_size = dataset, batch_size
        self.loader = fast_loader(dataset, batch_size)
        self.cache = {}

    def __iter__(self):
        if len(self.dataset) < 1000:
            yield from self.loader
            return
        for chunk in torch.randperm(len(self.dataset)).split(self.batch_size):
            items = []
            for i in chunk.tolist():
                if i not in self.cache:
                    self.cache[i] = self.dataset[i]
                items.append(self.cache[i])
            yield torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def bigger_batches_when_big(dataset, batch_size):     # more samples per device step on the timed dataset
    return fast_loader(dataset, batch_size * 2 if len(dataset) > 1000 else batch_size)


def ignores_batch_size(dataset, batch_size):
    return fast_loader(dataset, 128)


class SameOrderEveryEpoch:
    """A fresh DataLoader per epoch, shuffled by a generator seeded alike every time."""

    def __init__(self, dataset, batch_size):
        self.dataset, self.batch_size = dataset, batch_size

    def __iter__(self):
        return iter(DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True, num_workers=usable_cores(),
                               generator=torch.Generator().manual_seed(0)))


def collate_float64(dataset, batch_size):
    def collate(items):
        return torch.stack([x for x, _ in items]).double(), torch.tensor([y for _, y in items])
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores(),
                      persistent_workers=True, collate_fn=collate)


def labels_int32(dataset, batch_size):
    def collate(items):
        return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items], dtype=torch.int32)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores(),
                      persistent_workers=True, collate_fn=collate)


def workers_not_persistent(dataset, batch_size):        # the lesson's persistent_workers section, ignored
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores())


class NewLoaderEachEpoch:
    """persistent_workers=True, but a new DataLoader (and so new workers) for every epoch."""

    def __init__(self, dataset, batch_size):
        self.dataset, self.batch_size = dataset, batch_size

    def __iter__(self):
        return iter(DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True,
                               num_workers=usable_cores(), persistent_workers=True))


def _seed_every_worker_with_zero(worker_id):
    torch.manual_seed(0)
    np.random.seed(0)


def workers_seeded_alike(dataset, batch_size):       # "reproducible": every worker seeded with 0
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=2, persistent_workers=True,
                      worker_init_fn=_seed_every_worker_with_zero)


def the_ladders_loader(dataset, batch_size):           # the course's own loader: its own dataset, not this one
    from course_utils.data import CIFAR10Binary, baseline_transform
    ds = CIFAR10Binary(train=True, transform=baseline_transform(), limit=len(dataset))
    return DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=usable_cores(), persistent_workers=True)


MUTANTS_22_CORRECTNESS = [
    Mutant("drop_last", drops_last, "every sample exactly once per epoch"),
    Mutant("not shuffled", not_shuffled, "shuffles"),
    Mutant("sampled with replacement", with_replacement, "every sample exactly once per epoch"),
    Mutant("a one-shot iterator", one_shot, "every sample exactly once per epoch"),
    Mutant("invented labels", invented_labels, "yields the dataset's samples"),
    Mutant("augments once, caches", CachedOnce, "augments afresh every epoch"),
    Mutant("caches a third of the samples", CachesAThird, "augments afresh every epoch"),
    Mutant("ignores batch_size", ignores_batch_size, "batches of batch_size samples (the last may be smaller)"),
    Mutant("the same order every epoch", SameOrderEveryEpoch, "reshuffles every epoch"),
    Mutant("float64 images", collate_float64, "yields the dataset's float32 images"),
    Mutant("int32 labels", labels_int32, "yields labels as an int64 tensor"),
    Mutant("the course's loader (its own dataset)", the_ladders_loader, "yields the dataset's samples"),
    Mutant("workers restarted every epoch", workers_not_persistent, "keeps its worker processes alive between epochs"),
    Mutant("a new DataLoader every epoch", NewLoaderEachEpoch, "keeps its worker processes alive between epochs"),
    Mutant("worker_init_fn seeds every worker with 0", workers_seeded_alike,
           "different augmentations in different workers", words="worker_init_fn"),
]
# These fail in the timed rounds. What they do there does not depend on the seed (a batch size,
# a cache, the baseline's speed), so one seed each proves them.
MUTANTS_22_TIMED = [
    Mutant("the num_workers=0 baseline", baseline_loader, "is faster than the baseline loader on this machine"),
    Mutant("caches when the dataset is big", CacheWhenBig, "augments afresh every epoch"),
    Mutant("bigger batches when the dataset is big", bigger_batches_when_big,
           "batches of batch_size samples (the last may be smaller)"),
]


class QuietMachine:
    """Stands in for the check's OthersCpu: reports that no other program used the CPU, so the check
    judges as on a quiet machine even while other jobs share this one (the verdict stays deterministic;
    tests/unit/test_busy_machine.py loads the machine for real)."""
    others_cores = 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


# What these do wrong does not depend on the check's draws (the small dataset always ends on a
# partial batch, its batch size is never 64 or 128, ...), and a run costs seconds (worker
# start-up): one seed each.
@pytest.mark.parametrize("mutant", MUTANTS_22_CORRECTNESS, ids=repr)
def test_fast_loader_mutants_rejected(mutant):
    rejected("2.2", mutant, range(1))


@pytest.mark.parametrize("mutant", MUTANTS_22_TIMED, ids=repr)
def test_fast_loader_mutants_rejected_in_the_timed_rounds(mutant, monkeypatch):
    monkeypatch.setattr("course_utils.checks.lesson02.OthersCpu", QuietMachine)
    rejected("2.2", mutant, range(1))


def test_fast_loader_stub_and_wrong_type():
    assert run_check("2.2", stub_22).status == "not_implemented"
    assert run_check("2.2", "fast").status == "fail"


def test_fast_loader_passes_and_under_course_device_cpu_trains_the_real_model(monkeypatch):
    """The solution passes. Under COURSE_DEVICE=cpu (run here: it covers the simulated device's
    timed rounds too) the real narrow model also trains on the learner's batches, with the
    samples' class labels, not the secret codes the check decodes (those would be an IndexError
    on the CPU and a device-side assert on a GPU)."""
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    trained = []
    import course_utils.train as train_module
    real_train = train_module.train

    def spy(model, loader, **kwargs):
        if model is not None:
            trained.append(kwargs["device"])
        return real_train(model, loader, **kwargs)
    monkeypatch.setattr(train_module, "train", spy)
    for _ in range(3):            # the check grades speed only when other programs leave the cores
        result = run_check("2.2", fast_loader)
        if result.status != "busy":
            break
    else:
        pytest.skip(f"other processes kept this machine too busy for a fair grade of speed, three times: {result.message}")
    assert result.status == "pass", result.message
    assert "COURSE_DEVICE=cpu" in result.message and "simulated" in result.message
    assert trained and all(torch.device(d).type == "cpu" for d in trained)


# -- 2.3 ------------------------------------------------------------------------------------

from course_utils.worker_demos import crop_flip  # noqa: E402  (the lesson's own per-image crop + flip)


class CropFlipBase(Dataset):
    def __init__(self, images, labels, padding=4):
        self.images, self.labels, self.padding = images, labels, padding

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return crop_flip(self.images[i], self.padding, self.rng()), self.labels[i]


class WorkerSafe(CropFlipBase):
    """The solution: a generator per worker, seeded from the seed torch gives that worker."""
    _rng = _seed = None

    def rng(self):
        info = get_worker_info()
        seed = info.seed if info is not None else torch.initial_seed()
        if self._rng is None or seed != self._seed:
            self._rng, self._seed = np.random.default_rng(seed), seed
        return self._rng


class TorchGlobal(CropFlipBase):
    """Also right: torch's own generator, which DataLoader seeds in each worker."""

    def __getitem__(self, i):
        p = self.padding
        h, w = self.images.shape[1:3]
        padded = np.pad(self.images[i], ((p, p), (p, p), (0, 0)))
        dy, dx = (int(v) for v in torch.randint(0, 2 * p + 1, (2,)))
        crop = padded[dy:dy + h, dx:dx + w]
        if torch.rand(()) < 0.5:
            crop = crop[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1), self.labels[i]


class SeededInInit(CropFlipBase):
    """The bug: one generator, made in __init__, copied into every worker."""

    def __init__(self, images, labels, padding=4):
        super().__init__(images, labels, padding)
        self._g = np.random.default_rng(0)

    def rng(self):
        return self._g


class UnseededInInit(SeededInInit):
    def __init__(self, images, labels, padding=4):
        super().__init__(images, labels, padding)
        self._g = np.random.default_rng()


class LazyOnce(CropFlipBase):
    """Created at first use: fine in fresh workers, wrong once the main process used it."""
    _g = None

    def rng(self):
        if self._g is None:
            info = get_worker_info()
            self._g = np.random.default_rng(info.seed if info else None)
        return self._g


class ByWorkerId(CropFlipBase):
    _g = None

    def rng(self):
        info = get_worker_info()
        wid = info.id if info else -1
        if self._g is None or self._g[0] != (os.getpid(), wid):
            self._g = ((os.getpid(), wid), np.random.default_rng(wid + 1))
        return self._g[1]


class FreshEntropy(CropFlipBase):
    _g = None

    def rng(self):
        if self._g is None or self._g[0] != os.getpid():
            self._g = (os.getpid(), np.random.default_rng())
        return self._g[1]


class NumpyGlobalThrowaway(CropFlipBase):
    """A throwaway generator per item, seeded from NumPy's global state: workers are fine (the
    DataLoader seeds NumPy in each), but torch.manual_seed does not reach the main process's draws."""

    def rng(self):
        return np.random.default_rng(np.random.randint(2**31))


class EntropyInTheMainProcess(WorkerSafe):
    def rng(self):
        if get_worker_info() is None:
            if self._rng is None or self._seed != "entropy":
                self._rng, self._seed = np.random.default_rng(), "entropy"
            return self._rng
        return super().rng()


class GeneratorPerItemInWorkers(WorkerSafe):
    """Right in the main process; in a worker a new generator for every item, from the worker's seed."""

    def rng(self):
        info = get_worker_info()
        return np.random.default_rng(info.seed) if info is not None else super().rng()


class SeedPlusIndex(CropFlipBase):
    """A generator per item, seeded with seed + index: different items differ, repeats do not."""

    def __getitem__(self, i):
        info = get_worker_info()
        seed = info.seed if info is not None else torch.initial_seed()
        return crop_flip(self.images[i], self.padding, np.random.default_rng(seed + i)), self.labels[i]


class SeedPlusIndexInWorkers(WorkerSafe):
    def __getitem__(self, i):
        info = get_worker_info()
        if info is None:
            return super().__getitem__(i)
        return crop_flip(self.images[i], self.padding, np.random.default_rng(info.seed + i)), self.labels[i]


class DefaultPaddingTwo(WorkerSafe):
    def __init__(self, images, labels, padding=2):
        super().__init__(images, labels, padding)


class NoPadding(WorkerSafe):
    def __getitem__(self, i):
        image = self.images[i]
        h, w = image.shape[:2]
        big = np.pad(image, ((1, 1), (1, 1), (0, 0)), mode="edge")
        dy, dx = self.rng().integers(0, 3, size=2)
        return torch.from_numpy(np.ascontiguousarray(big[dy:dy + h, dx:dx + w])).permute(2, 0, 1), self.labels[i]


class HWCOut(WorkerSafe):
    def __getitem__(self, i):
        image, label = super().__getitem__(i)
        return image.permute(1, 2, 0), label


class NeverFlips(WorkerSafe):
    def __getitem__(self, i):
        p = self.padding
        h, w = self.images.shape[1:3]
        padded = np.pad(self.images[i], ((p, p), (p, p), (0, 0)))
        dy, dx = self.rng().integers(0, 2 * p + 1, size=2)
        return torch.from_numpy(np.ascontiguousarray(padded[dy:dy + h, dx:dx + w])).permute(2, 0, 1), self.labels[i]


class Stub23(Dataset):
    def __init__(self, images, labels, padding=4):
        raise NotImplementedError("Exercise 2.3")


class ExclusiveOffsets(WorkerSafe):
    def __getitem__(self, i):
        p = self.padding
        h, w = self.images.shape[1:3]
        padded = np.pad(self.images[i], ((p, p), (p, p), (0, 0)))
        rng = self.rng()
        dy, dx = rng.integers(0, 2 * p, size=2)
        crop = padded[dy:dy + h, dx:dx + w]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1), self.labels[i]


class FlipsAThird(WorkerSafe):
    def __getitem__(self, i):
        p = self.padding
        h, w = self.images.shape[1:3]
        padded = np.pad(self.images[i], ((p, p), (p, p), (0, 0)))
        rng = self.rng()
        dy, dx = rng.integers(0, 2 * p + 1, size=2)
        crop = padded[dy:dy + h, dx:dx + w]
        if rng.integers(3) == 0:
            crop = crop[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1), self.labels[i]


class TriangularOffsets(WorkerSafe):
    def __getitem__(self, i):
        p = self.padding
        h, w = self.images.shape[1:3]
        padded = np.pad(self.images[i], ((p, p), (p, p), (0, 0)))
        rng = self.rng()
        dy, dx = rng.integers(0, p + 1, size=2) + rng.integers(0, p + 1, size=2)
        crop = padded[dy:dy + h, dx:dx + w]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1), self.labels[i]


class IgnoresPadding(WorkerSafe):
    def __getitem__(self, i):
        return crop_flip(self.images[i], 4, self.rng()), self.labels[i]


class FloatImage(WorkerSafe):
    def __getitem__(self, i):
        image, label = super().__getitem__(i)
        return image.float() / 255, label


# These fail once DataLoader workers run (a second or more per run, worker start-up): what they
# do wrong is how they seed, whatever the check draws, so two seeds each.
MUTANTS_23_WORKERS = [
    Mutant("seeded in __init__", SeededInInit, "different augmentations in different workers"),
    Mutant("unseeded in __init__", UnseededInInit, "different augmentations in different workers"),
    Mutant("made lazily once", LazyOnce, "different augmentations in different workers"),
    Mutant("seeded by worker id", ByWorkerId, "follows the torch seed"),
    Mutant("fresh OS entropy", FreshEntropy, "reproducible under torch.manual_seed"),
    Mutant("NumPy's global state seeds a throwaway generator", NumpyGlobalThrowaway,
           "reproducible under torch.manual_seed in the main process", words="NumPy's global generator"),
    Mutant("OS entropy in the main process", EntropyInTheMainProcess,
           "reproducible under torch.manual_seed in the main process", words="OS entropy"),
    Mutant("a new generator per item in a worker", GeneratorPerItemInWorkers, "draws anew for every item in a worker"),
    Mutant("seed + index in a worker", SeedPlusIndexInWorkers, "draws anew for every item in a worker"),
]
MUTANTS_23 = [
    Mutant("edge padding", NoPadding, "returns a crop of the zero-padded image, flipped or not"),
    Mutant("ignores padding", IgnoresPadding, "returns a crop of the zero-padded image, flipped or not"),
    Mutant("HWC out", HWCOut, "returns a uint8 (C, H, W) crop the size of the image"),
    Mutant("float image", FloatImage, "returns a uint8 (C, H, W) crop the size of the image"),
    Mutant("never flips", NeverFlips, "draws random crops and flips"),
    Mutant("exclusive upper bound", ExclusiveOffsets, "offsets cover 0..2*padding"),
    Mutant("triangular offsets", TriangularOffsets, "offsets are uniform over 0..2*padding"),
    Mutant("flips a third", FlipsAThird, "flips half the items"),
    Mutant("a generator per item, seed + index", SeedPlusIndex, "draws anew on every call", words="seed + index"),
    Mutant("default padding 2", DefaultPaddingTwo, "pads by 4 by default"),
]


def test_worker_seeding_right_ones_pass():
    for cls in (WorkerSafe, TorchGlobal):
        passes("2.3", cls, range(2))


@pytest.mark.parametrize("mutant", MUTANTS_23, ids=repr)
def test_worker_seeding_mutants_rejected(mutant):
    rejected("2.3", mutant, range(4))


@pytest.mark.parametrize("mutant", MUTANTS_23_WORKERS, ids=repr)
def test_worker_seeding_mutants_rejected_in_the_workers(mutant):
    rejected("2.3", mutant, range(2))


def test_worker_seeding_stub_and_wrong_type():
    assert run_check("2.3", Stub23).status == "not_implemented"
    assert run_check("2.3", WorkerSafe(np.zeros((2, 4, 4, 3), np.uint8), [0, 1])).status == "fail"


def test_required_speedup_fits_the_device_and_the_load(monkeypatch):
    from course_utils.checks.lesson02 import GAIN_ASKED, required_speedup
    from course_utils.timing import StepStats

    def baseline(load_ms, host_ms, device_util=None, device_ms=None):
        """10 steps of loading then the host's part of the step; the device's busy share and span when known."""
        wall = load_ms + host_ms
        return StepStats(10, 1280, 10 * wall / 1e3, [load_ms] * 10, [host_ms] * 10, "test",
                         device_ms=[device_ms] * 10 if device_ms else None, device_util=device_util)

    monkeypatch.setattr("course_utils.checks.lesson02.usable_cores", lambda: 2)
    # the simulated H100 on a quiet 2-core host: loading 40 ms, launching 11 ms, the device busy 7.5 of
    # the 51 ms: all CPU work, spread over 2 cores -> ideal 2x, 20% of the gain asked
    assert GAIN_ASKED == 0.2
    assert required_speedup(baseline(40, 11, device_util=7.5 / 51), 0.0) == pytest.approx(1.2)
    # launches longer than half the CPU work: the main thread's launches bound the step
    assert required_speedup(baseline(4, 8), 0.0) == pytest.approx(1 + GAIN_ASKED * (12 / 8 - 1))
    # the device is the bottleneck already (busy 90% of the baseline's step): little to gain, the floor
    assert required_speedup(baseline(2, 2, device_util=0.9), 0.0) == pytest.approx(1.05)
    # no busy share known: the step's span on the device stands in for the device's work
    assert required_speedup(baseline(40, 11, device_ms=30.0), 0.0) == pytest.approx(1 + GAIN_ASKED * (51 / 30 - 1))
    # other processes took 1.2 cores: the one core they left cannot beat the baseline: the floor
    assert required_speedup(baseline(40, 11), 1.2) == pytest.approx(1.05)
    assert required_speedup(baseline(40, 11), 0.5) == pytest.approx(1 + GAIN_ASKED * (51 / (51 / 1.5) - 1))
    monkeypatch.setattr("course_utils.checks.lesson02.usable_cores", lambda: 16)
    assert required_speedup(baseline(40, 11), 0.0) == pytest.approx(1 + GAIN_ASKED * (51 / 11 - 1))
    monkeypatch.setattr("course_utils.checks.lesson02.usable_cores", lambda: 1)
    assert required_speedup(baseline(40, 11), 0.0) == pytest.approx(1.05)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fast_loader_on_a_gpu_trains_the_model_on_class_labels(monkeypatch):
    """On CUDA the timed rounds train the real ResNet-18: with the secret codes as labels that was
    a device-side assert for every learner; the rounds now train on the samples' classes."""
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    monkeypatch.setattr("course_utils.checks.lesson02.OthersCpu", QuietMachine)
    result = run_check("2.2", fast_loader)
    assert result.status == "pass", result.message
    assert "CUDA" in result.message or "cuda" in result.message
