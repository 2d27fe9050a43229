"""Lesson 02 checks: right answers pass, typical wrong ones fail on the right property, stubs are
'not implemented'."""
import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from course_utils.checks import run_check
from course_utils.checks.lesson02 import SHORT_BATCH
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


# The walk w2-02: wrong answers that passed, or were refused with words pointing elsewhere
def rounds_both_sides(sweep, tolerance=0.05):         # w21_15: whole samples/s on both sides
    if not sweep:
        raise ValueError("empty")
    best = max(sweep.values())
    return min(k for k, v in sweep.items() if round(v) >= round((1 - tolerance) * best))


def neighbour_gain(sweep, tolerance=0.05):            # w21_17: keeps no state, stops at a small gain
    if not sweep:
        raise ValueError("empty")
    ws = sorted(sweep)
    for a, b in zip(ws, ws[1:]):
        if sweep[b] < (1 + tolerance) * sweep[a]:
            return a
    return ws[-1]


_running_best = [0.0]


def global_running_best(sweep, tolerance=0.05):       # w21_21: real state between calls, in a global
    if not sweep:
        raise ValueError("empty")
    _running_best[0] = max(_running_best[0], max(sweep.values()))
    return min(k for k, v in sweep.items() if v >= (1 - tolerance) * _running_best[0])


_first_best = None


def best_of_the_first_sweep_in_a_global(sweep, tolerance=0.05):   # w6-02: told "compare ... with no slack"
    global _first_best
    if not sweep:
        raise ValueError("empty")
    if _first_best is None:                  # set by the first call, of this check or of an earlier run
        _first_best = max(sweep.values())
    return min(w for w, s in sweep.items() if s >= (1 - tolerance) * _first_best)


def tolerance_rounded_to_1dp(sweep, tolerance=0.05):  # w21_23
    if not sweep:
        raise ValueError("empty")
    best = max(sweep.values())
    return min(k for k, v in sweep.items() if v >= round(1 - tolerance, 1) * best)


def index_not_key(sweep, tolerance=0.05):             # w21_14: a position in sorted order
    if not sweep:
        raise ValueError("empty")
    vals = [sweep[k] for k in sorted(sweep)]
    best = max(vals)
    return min(i for i, v in enumerate(vals) if v >= (1 - tolerance) * best)


def max_of_empty_raises_value_error(sweep, tolerance=0.05):   # max() of an empty sequence is a ValueError
    best = max(sweep.values())
    return min(w for w, s in sweep.items() if s >= (1 - tolerance) * best)


def empty_raises_index_error(sweep, tolerance=0.05):
    best = max(sweep.values()) if sweep else [][0]
    return min(w for w, s in sweep.items() if s >= (1 - tolerance) * best)


def first_max_on_a_tie(sweep, tolerance=0.05):        # w3-02 w21_18: tolerance 0 -> max(key=sweep.get), dict order
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    if tolerance == 0:
        return int(max(sweep, key=sweep.get))
    return int(min(w for w, s in sweep.items() if s >= (1 - tolerance) * best))


def quarter_sample_slack(sweep, tolerance=0.05):       # w3-02 w21_19: 0.25 samples/s under the threshold
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return int(min(w for w, s in sweep.items() if s >= (1 - tolerance) * best - 0.25))


def knee(sweep, tolerance=0.05):                       # w3-02 w21_03: stops where the next count gains < tolerance
    if not sweep:
        raise ValueError("empty sweep")
    ws = sorted(sweep)
    for a, b in zip(ws, ws[1:]):
        if sweep[b] < (1 + tolerance) * sweep[a]:
            return int(a)
    return int(ws[-1])


def epsilon_slack(sweep, tolerance=0.05):              # RIGHT (w3-02 w21_12): a float epsilon, 1e-4 of the threshold
    if not sweep:                                      # (under 0.1 samples/s at these sizes): kept passing
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return int(min(w for w, s in sweep.items() if s >= (1 - tolerance) * best * (1 - 1e-4)))


def percent_cut_to_int(sweep, tolerance=0.05):         # w4-02 w21_23: int(100 * tolerance) drops 0.5 of 2.5%
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return int(min(w for w, speed in sweep.items() if 100 * speed / best >= 100 - int(100 * tolerance)))


def tolerance_times_100_samples(sweep, tolerance=0.05):   # w4-02 w21_06: "5 percent" read as 5 samples/s
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return int(min(w for w, speed in sweep.items() if best - speed <= tolerance * 100))


def skips_zero_falls_back_to_zero(sweep, tolerance=0.05):   # w4-02 w21_16: 0 workers is "no loader"
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    ok = [w for w, speed in sweep.items() if speed >= (1 - tolerance) * best and w > 0]
    return int(min(ok)) if ok else 0


def upper_half_best(sweep, tolerance=0.05):           # q02 w21_14: the best over the upper half of the counts
    if not sweep:
        raise ValueError("empty sweep")
    counts = sorted(sweep)
    best = max(sweep[w] for w in counts[len(counts) // 2:])
    return min(w for w, v in sweep.items() if v >= (1 - tolerance) * best)


def later_half_best(sweep, tolerance=0.05):           # the same slip, over the later half of the dict's items
    if not sweep:
        raise ValueError("empty sweep")
    values = list(sweep.values())
    best = max(values[len(values) // 2:])
    return min(w for w, v in sweep.items() if v >= (1 - tolerance) * best)


def returns_a_float_count(sweep, tolerance=0.05):      # q02 w21_18: was told "not its throughput"
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    return float(min(w for w, v in sweep.items() if v >= (1 - tolerance) * best))


def forgets_to_return(sweep, tolerance=0.05):          # a return missing on one branch
    if not sweep:
        raise ValueError("empty sweep")
    best = max(sweep.values())
    ok = [w for w, v in sweep.items() if v >= (1 - tolerance) * best]
    if len(ok) > 1:
        return min(ok)


def copies_then_scans(sweep, tolerance=0.05):          # RIGHT: a sorted copy, an early return
    items = sorted(dict(sweep).items())
    if not items:
        raise ValueError("empty sweep")
    best = max(v for _, v in items)
    for w, v in items:
        if v >= best * (1 - tolerance):
            return int(w)


def numpy_masked(sweep, tolerance=0.05):               # RIGHT: NumPy, the result wrapped in int()
    if len(sweep) == 0:
        raise ValueError("empty sweep")
    keys, values = np.array(list(sweep.keys())), np.array(list(sweep.values()), dtype=float)
    return int(keys[values >= (1 - tolerance) * values.max()].min())


PICKS = "picks the smallest count within the tolerance of the best"
MUTANTS_21 = [
    Mutant("the best of the upper half of the counts (q02 w21_14)", upper_half_best, PICKS,
           words="yours took it over only part of the sweep (the upper half)"),
    Mutant("the best of the later half of the dict (q02 w21_14)", later_half_best, PICKS,
           words="yours took it over only part of the sweep"),
    Mutant("a float count (q02 w21_18)", returns_a_float_count, "returns a worker count (an int)",
           words="return a Python int, int(...)"),
    Mutant("None on one branch", forgets_to_return, "returns a worker count (an int)",
           words="without a return statement"),
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
    Mutant("remembers its first answer", remembers_its_first_answer, PICKS,
           words="keeps state between calls in the default argument _cache"),
    Mutant("returns the throughput", returns_throughput, "returns a worker count (an int)"),
    Mutant("returns an np.int64 (w21_22)", with_numpy, "returns a worker count (an int)", words="int(...)"),
    Mutant("both sides rounded (w21_15)", rounds_both_sides, PICKS, words="not rounded to whole samples/s"),
    Mutant("tolerance rounded to 1 place (w21_23)", tolerance_rounded_to_1dp, PICKS, words="rounded to one decimal"),
    Mutant("a global running best (w21_21)", global_running_best, PICKS,
           words="keep nothing between calls"),
    # w6-02: the first sweep's best kept in a global (set by the first run, so a rerun finds it set: the
    # global statement names it); the same mistake in a default argument was named, this one was not
    Mutant("the first sweep's best kept in a global (w6-02)", best_of_the_first_sweep_in_a_global, PICKS,
           words="keeps state between calls in the global _first_best (now 1000.0)"),
    Mutant("first in dict order, shown in that order (w21_04)", first_in_dict_order, PICKS, words="order given"),
    Mutant("an index, not a key (w21_14)", index_not_key, PICKS, words="order given"),
    Mutant("tolerance 0: a tie goes to dict order (w3-02 w21_18)", first_max_on_a_tie, PICKS,
           words="the counts tied for the best (1, 2) all qualify"),
    Mutant("0.25 samples/s of slack (w3-02 w21_19)", quarter_sample_slack, PICKS,
           words="0.10 samples/s below the threshold (950): compare with (1 - tolerance) x best exactly, with no slack"),
    Mutant("a knee rule (w3-02 w21_03)", knee, PICKS, words="(a knee rule)"),
    Mutant("tolerance cut to whole percent (w4-02 w21_23)", percent_cut_to_int, PICKS,
           words="0.025 is 2.5%, not 2% (int(100 * tolerance) drops the fraction"),
    Mutant("tolerance x 100 as samples/s (w4-02 w21_06)", tolerance_times_100_samples, PICKS,
           words="samples/s below the best (tolerance x 100)"),
    Mutant("skips 0 workers, 0 as the fallback (w4-02 w21_16)", skips_zero_falls_back_to_zero, PICKS,
           words="0 workers is a count like the others"),
    Mutant("no empty guard", no_empty_guard, "raises ValueError on an empty sweep"),
    Mutant("IndexError when empty", empty_raises_index_error, "raises ValueError on an empty sweep"),
    Mutant("sorts the sweep in place", sorts_in_place, "leaves the sweep unchanged"),
]


@pytest.mark.parametrize("answer", [choose, gap_over_the_best, ratio_to_the_best, best_minus_a_share, sorted_scan,
                                    max_of_empty_raises_value_error, epsilon_slack, copies_then_scans,
                                    numpy_masked], ids=lambda f: f.__name__)
def test_choose_workers_passes(answer):
    passes("2.1", answer, range(30))


@pytest.mark.parametrize("mutant", MUTANTS_21, ids=repr)
def test_choose_workers_mutants_rejected(mutant):
    rejected("2.1", mutant, range(30))


def test_choose_workers_a_stateless_answer_is_not_told_it_keeps_state():
    """The walk w2-02 (w21_17): its answer happened to equal the previous case's, and the hint blamed
    state kept between calls, which it does not keep."""
    for seed in range(5):
        os.environ["COURSE_CHECK_SEED"] = str(seed)
        try:
            result = run_check("2.1", neighbour_gain)
        finally:
            os.environ.pop("COURSE_CHECK_SEED", None)
        assert result.status == "fail" and "between calls" not in result.message, result.message


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


def _fresh_entropy(worker_id):
    torch.seed()                                   # reseeds torch from the OS: another stream every run


def entropy_seeded_workers(dataset, batch_size):    # q02 w22_06: differ by worker, but no run repeats
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores(), persistent_workers=True,
                      worker_init_fn=_fresh_entropy)


def _base_seed_in_every_worker(worker_id):
    torch.manual_seed(torch.initial_seed() - worker_id)     # the loader's base seed: the same in every worker


def base_seeded_workers(dataset, batch_size):       # q02 w22_06: workers seeded alike from torch.initial_seed()
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=2, persistent_workers=True,
                      worker_init_fn=_base_seed_in_every_worker)


def _classic_seeding(worker_id):
    import random
    np.random.seed(torch.initial_seed() % 2**32)
    random.seed(torch.initial_seed())


def classic_worker_init(dataset, batch_size):       # RIGHT: the usual recipe, harmless here
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores(), persistent_workers=True,
                      worker_init_fn=_classic_seeding, pin_memory=torch.cuda.is_available())


def _standardise_each_batch(samples):
    from torch.utils.data import default_collate
    images, labels = default_collate(samples)
    mean, std = images.mean((0, 2, 3), keepdim=True), images.std((0, 2, 3), keepdim=True)
    return (images - mean) / std, labels


def batch_standardised(dataset, batch_size):        # q02 w22_16: the batch's own mean and std
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores(), persistent_workers=True,
                      collate_fn=_standardise_each_batch)


class _DiesInWorkers(Dataset):
    """Wraps the check's dataset; a worker that loads an item (of a dataset bigger than `above`) dies."""

    def __init__(self, dataset, above=0):
        self.dataset, self.above = dataset, above

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        if get_worker_info() is not None and len(self.dataset) > self.above:
            os._exit(3)
        return self.dataset[i]


def workers_die(dataset, batch_size):               # q02: dead workers were said to be a busy machine
    return DataLoader(_DiesInWorkers(dataset), batch_size=batch_size, shuffle=True, num_workers=usable_cores(),
                      persistent_workers=True)


def workers_die_when_big(dataset, batch_size):      # the same, only in the timed rounds
    return DataLoader(_DiesInWorkers(dataset, above=10_000), batch_size=batch_size, shuffle=True,
                      num_workers=usable_cores(), persistent_workers=True)


# The walk of issue 37 (w1-02): answers that passed, or were refused with the wrong words
def out_of_order(dataset, batch_size):                 # RIGHT (the lesson recommends it): was refused on batch sizes
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores(), persistent_workers=True,
                      in_order=False)


def own_generator(dataset, batch_size):                # WRONG (w2-02, w22_09): ignores a new torch.manual_seed
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores(), persistent_workers=True,
                      generator=torch.Generator().manual_seed(0))


def generator_from_the_torch_seed(dataset, batch_size):   # WRONG (w6-02): a generator of its own, seeded from
    workers = usable_cores()                                # torch's seed: passed 3/3, and every loader of a run
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,   # replays the same order
                      persistent_workers=workers > 0, pin_memory=torch.cuda.is_available(),
                      generator=torch.Generator().manual_seed(torch.initial_seed()))


def no_prefetch_setting(dataset, batch_size):         # RIGHT: the walker's first answer
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores(), persistent_workers=True)


def two_workers_per_core(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=2 * usable_cores(),
                      persistent_workers=True)


_CORES_AT_IMPORT = usable_cores()


def count_fixed_at_import(dataset, batch_size):        # "num_workers=2": right on this machine only
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=_CORES_AT_IMPORT,
                      persistent_workers=True)


def machine_cpu_count(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=os.cpu_count(), persistent_workers=True)


def pins_without_a_gpu(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores(), persistent_workers=True,
                      pin_memory=True)


def _seed_by_worker_id(worker_id):
    import random
    torch.manual_seed(worker_id)
    random.seed(worker_id)
    np.random.seed(worker_id)


def workers_seeded_by_id(dataset, batch_size):          # differ by worker, but the same in every run
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores(), persistent_workers=True,
                      worker_init_fn=_seed_by_worker_id)


class ReplaysTheFirstEpoch:
    """State kept between epochs: epoch 1 cached, then replayed batch by batch in a new order (its
    short batch then comes early: it was refused on batch sizes)."""

    def __init__(self, dataset, batch_size):
        self.loader, self.cache = no_prefetch_setting(dataset, batch_size), None

    def __iter__(self):
        if self.cache is None:
            self.cache = []
            for batch in self.loader:
                self.cache.append(batch)
                yield batch
        else:
            for i in torch.randperm(len(self.cache)).tolist():
                yield self.cache[i]


class _Indices(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


class MainProcessLoads:
    """Worker processes that only hand out indices: the main process loads every sample itself,
    the baseline's work with the workers' overhead on top."""

    def __init__(self, dataset, batch_size):
        self.dataset = dataset
        self.indices = DataLoader(_Indices(len(dataset)), batch_size=batch_size, shuffle=True,
                                  num_workers=usable_cores(), persistent_workers=True)

    def __iter__(self):
        for chunk in self.indices:
            items = [self.dataset[i] for i in chunk.tolist()]
            yield torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


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
    Mutant("replays the first epoch", ReplaysTheFirstEpoch, "augments afresh every epoch"),
    Mutant("ignores batch_size", ignores_batch_size, SHORT_BATCH, words="larger than batch_size: the batch size passed in"),
    Mutant("the same order every epoch", SameOrderEveryEpoch, "reshuffles every epoch"),
    Mutant("float64 images", collate_float64, "yields the dataset's float32 images"),
    Mutant("int32 labels", labels_int32, "yields labels as an int64 tensor"),
    Mutant("the course's loader (its own dataset)", the_ladders_loader, "yields the dataset's samples"),
    Mutant("the num_workers=0 baseline", baseline_loader, "loads in worker processes", words="num_workers > 0"),
    Mutant("workers restarted every epoch", workers_not_persistent, "keeps its worker processes alive between epochs"),
    Mutant("a new DataLoader every epoch", NewLoaderEachEpoch, "keeps its worker processes alive between epochs"),
    Mutant("worker_init_fn seeds every worker with 0", workers_seeded_alike,
           "different augmentations in different workers", words="worker_init_fn"),
    Mutant("4 workers per usable core", oversubscribed, "at most one worker per usable core"),
    Mutant("2 workers per usable core", two_workers_per_core, "at most one worker per usable core",
           words="can rank a larger count first by noise"),
    Mutant("worker_init_fn seeds by worker id", workers_seeded_by_id, "augmentations follow the torch seed",
           words="worker_init_fn"),
    Mutant("a generator of its own, fixed seed (w2-02)", own_generator, "augmentations follow the torch seed",
           words="generator=torch.Generator().manual_seed(0)"),
]
# found passing at 2.07x under load when graded by speed alone (the machine's load judged quiet):
# the main process loads while worker processes only hand out indices
MUTANTS_22_CORRECTNESS.append(Mutant("the main process loads, workers hand out indices", MainProcessLoads,
                                     "loads in worker processes", words="did not load them"))
def cores_minus_one(dataset, batch_size):              # w3-02 w22_11: "leave a core": 0 workers on one core
    workers = usable_cores() - 1
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                      persistent_workers=workers > 0, pin_memory=torch.cuda.is_available())


_kept_loaders = {}


def cached_loader(dataset, batch_size):                # w4-02 w22_12: the count inside, the loader kept
    key = (id(dataset), batch_size)
    if key not in _kept_loaders:
        _kept_loaders[key] = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=usable_cores(),
                                        persistent_workers=True, pin_memory=torch.cuda.is_available())
    return _kept_loaders[key]


if usable_cores() >= 2:
    MUTANTS_22_CORRECTNESS.append(Mutant("a loader kept between calls (w4-02 w22_12)", cached_loader,
                                         "num_workers follows the cores this process may use",
                                         words="the same DataLoader as on its first call, kept between calls"))
    MUTANTS_22_CORRECTNESS.append(Mutant("usable_cores() - 1: none on one core (w3-02 w22_11)", cores_minus_one,
                                         "loads in worker processes", words="limited to 1 core"))
    MUTANTS_22_CORRECTNESS.append(Mutant("a count fixed when the notebook started", count_fixed_at_import,
                                         "num_workers follows the cores this process may use",
                                         words="a number typed in, or computed once"))
    MUTANTS_22_CORRECTNESS.append(
        Mutant("os.cpu_count()", machine_cpu_count, "num_workers follows the cores this process may use",
               words="os.cpu_count() counts every core") if (os.cpu_count() or 1) <= usable_cores() else
        Mutant("os.cpu_count()", machine_cpu_count, "at most one worker per usable core"))
if not (torch.cuda.is_available() or getattr(getattr(torch, "accelerator", None), "is_available", lambda: False)()):
    MUTANTS_22_CORRECTNESS.append(Mutant("pin_memory=True without a GPU", pins_without_a_gpu,
                                         "pins memory only when batches go to a GPU", words="pin_memory=torch.cuda"))
MUTANTS_22_CORRECTNESS += [
    Mutant("workers reseeded from fresh entropy (q02 w22_06)", entropy_seeded_workers,
           "reproducible under torch.manual_seed", words="the workers' random numbers do not follow torch's seed"),
    Mutant("workers seeded with the base seed (q02 w22_06)", base_seeded_workers,
           "different augmentations in different workers"),
    Mutant("each batch standardised by its own statistics (q02 w22_16)", batch_standardised,
           "each sample as the dataset makes it, whatever else is in its batch",
           words="each batch was standardised by its own statistics"),
    Mutant("workers that die (q02)", workers_die, "its worker processes stay alive",
           words="a worker process of your loader died while it loaded"),
    # w6-02: replays after the same torch seed and differs after another, so only a second loader made in
    # the same run shows it; what it does does not depend on the check's draws (one seed, as the others)
    Mutant("a generator of its own seeded from torch.initial_seed() (w6-02)", generator_from_the_torch_seed,
           "a second loader in the same run draws another order and other augmentations",
           words="the second replayed the first's order"),
]
# These fail in the timed rounds. What they do there does not depend on the seed (a batch size,
# a cache, the baseline's speed), so one seed each proves them.
MUTANTS_22_TIMED = [
    Mutant("caches when the dataset is big", CacheWhenBig, "augments afresh every epoch"),
    Mutant("bigger batches when the dataset is big", bigger_batches_when_big, SHORT_BATCH),
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


def _loads_without_timing(loader, device, steps, *, model=None, warmup=None, **kwargs):
    """Stands in for measure_loader in the correctness tests: consumes the batches the timed rounds
    would (so that the check verifies every one of them) and reports a made-up steady step."""
    from course_utils.timing import StepStats
    n, samples = (warmup or 0) + steps, 0
    while n > 0:
        for images, _ in loader:
            samples += len(images)
            n -= 1
            if n == 0:
                break
    return StepStats(steps, samples, steps * 0.01, [1.0] * steps, [9.0] * steps, "not timed")


@pytest.fixture
def speed_not_graded(monkeypatch):
    """Check 2.2 with its timed rounds consuming batches but timing nothing and asking for no
    speed-up: the right answers' correctness properties, judged deterministically on a shared
    machine (the speed is proven by test_busy_machine.py and the notebook runs)."""
    monkeypatch.setattr("course_utils.checks.lesson02.OthersCpu", QuietMachine)
    monkeypatch.setattr("course_utils.checks.lesson02.required_speedup", lambda baseline, others: 1.0)
    monkeypatch.setattr("course_utils.loaders.measure_loader", _loads_without_timing)


@pytest.mark.parametrize("answer", [fast_loader, no_prefetch_setting, out_of_order],
                         ids=lambda f: f.__name__)
def test_fast_loader_right_answers_hold_every_property(answer, speed_not_graded):
    passes("2.2", answer, range(2))       # in_order=False: its short batch came early on the walk's seeds 2 and 3


def test_fast_loader_harmless_worker_init_passes(speed_not_graded):
    """q02: NumPy's and Python's generators seeded from torch.initial_seed() in each worker (the usual
    recipe) and pin_memory=torch.cuda.is_available() change nothing the contract asks about."""
    passes("2.2", classic_worker_init, range(1))


def test_fast_loader_the_same_seed_twice_is_a_property_on_every_seed(speed_not_graded):
    """q02 w22_16 and w22_06 fail on their property whatever the check draws (a second seed)."""
    for mutant in MUTANTS_22_CORRECTNESS:
        if "q02 w22" in mutant.name:
            rejected("2.2", mutant, range(1, 2))


def test_fast_loader_workers_that_die_in_the_timed_rounds_are_named(speed_not_graded):
    result = run_check("2.2", workers_die_when_big)
    assert result.status == "fail", result.message
    assert "property 'its worker processes stay alive'" in result.message and "busy" not in result.message


def test_dead_workers_are_found_after_a_time_out():
    """A time-out with workers that died says so, not 'busy' (the check's _workers_that_die)."""
    import multiprocessing

    import psutil
    from course_utils.checks.lesson02 import _dead_workers
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    worker = multiprocessing.get_context("fork").Process(target=os._exit, args=(3,))
    worker.start()
    import time
    deadline = time.monotonic() + 10           # dead, not yet collected (join() would forget it, as a hang leaves it)
    while psutil.Process(worker.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("exit code 3" in d for d in _dead_workers(before))
    worker.join(10)


class BusyMachine(QuietMachine):
    """Other programs on 1.5 cores whenever the check looks (the walk w2-02: a loaded 2-core host)."""
    others_cores = 1.5


class _Thin:
    """A wrapper that only hands the DataLoader's batches on: right, but only timing can judge it."""

    def __init__(self, loader):
        self.loader = loader

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        yield from self.loader


def thin_wrapper(dataset, batch_size):
    return _Thin(fast_loader(dataset, batch_size))


def test_busy_says_what_held_and_why_a_cleared_bar_is_not_graded(monkeypatch):
    """The walk w2-02: '1.81x the baseline measured, 1.20x asked on a quiet machine' and 'not graded'
    read as a contradiction, and nothing said the loader was already right. The message says that
    every property but speed held and that a baseline slowed by the load cannot pass yours; since
    w3-02 only where the settings alone cannot judge the loader (here: a wrapper)."""
    monkeypatch.setattr("course_utils.checks.lesson02.OthersCpu", BusyMachine)
    monkeypatch.setattr("course_utils.checks.lesson02.required_speedup", lambda baseline, others: 1.0)
    monkeypatch.setattr("course_utils.loaders.measure_loader", _loads_without_timing)
    result = run_check("2.2", thin_wrapper)
    assert result.status == "busy", result.message
    assert "Every property but speed held" in result.message
    assert "yours cleared that bar, but the baseline itself ran with other programs on 1.5 cores" in result.message
    assert "makes any loader look faster than it is" in result.message
    assert "_Thin.__iter__, in the main process, which only timing can judge" in result.message


def test_busy_grades_the_settings(monkeypatch):
    """The walk w3-02: on a machine other programs kept busy all day, 2.2 never graded the right
    loader. Busy, it now grades what holds without timing: the right settings pass, and say that the
    speed was not judged."""
    monkeypatch.setattr("course_utils.checks.lesson02.OthersCpu", BusyMachine)
    monkeypatch.setattr("course_utils.checks.lesson02.required_speedup", lambda baseline, others: 9.0)
    monkeypatch.setattr("course_utils.loaders.measure_loader", _loads_without_timing)
    result = run_check("2.2", fast_loader)
    assert result.status == "pass", result.message
    assert "so the speed was not judged" in result.message
    assert "these points do NOT grade speed" in result.message     # w6-02: a slow loader passed so, 3/3
    assert f"num_workers={usable_cores()} for {usable_cores()} usable cores, persistent_workers=True" in result.message


class _SlowInTheMain(_Thin):
    """w3-02 w22_15: slow per-batch work in the wrapper's __iter__ (the main process), on the timed dataset."""

    def __iter__(self):
        import time
        for batch in self.loader:
            if len(self.loader.dataset) > 10_000:
                time.sleep(0.8)
            yield batch


def slow_wrapper(dataset, batch_size):
    return _SlowInTheMain(fast_loader(dataset, batch_size))


def test_a_slow_loader_is_told_it_is_slow_not_stuck(monkeypatch):
    """The walk w3-02 (w22_15): a wrapper slow in the main process ran into the 240 s limit and was
    asked whether it loops forever. The check now stops after the warm-up, with the times."""
    monkeypatch.setattr("course_utils.checks.lesson02.OthersCpu", QuietMachine)
    monkeypatch.setattr("course_utils.checks.lesson02._ROUNDS_BUDGET_S", 10)
    result = run_check("2.2", slow_wrapper)
    assert result.status == "fail", result.message
    assert "property 'is faster than the baseline loader on this machine'" in result.message
    assert "slower, not stuck" in result.message and "_SlowInTheMain.__iter__" in result.message


def test_one_short_batch_may_come_anywhere_in_an_epoch():
    from course_utils.checks.lesson02 import _batch_sizes_wrong
    assert not _batch_sizes_wrong([89, 10, 89, 89], 89)          # in_order=False hands out the remainder early
    assert not _batch_sizes_wrong([89, 89, 89, 10], 89)
    assert _batch_sizes_wrong([89, 10, 89, 10], 89)              # two short batches: not one epoch of batch_size
    assert _batch_sizes_wrong([89, 90], 89)


class _Stuck(Dataset):
    """Wraps the check's dataset; every item takes forever in a worker (an answer that hangs)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        import time
        if get_worker_info() is not None:
            time.sleep(3600)
        return self.dataset[i]


def hangs_in_its_workers(dataset, batch_size):
    return DataLoader(_Stuck(dataset), batch_size=batch_size, shuffle=True, num_workers=2, persistent_workers=True)


def test_a_check_that_stops_ends_the_worker_processes_it_started(monkeypatch):
    """The walk: a check that reached its time limit left a (spawned) worker running, orphaned,
    printing results after the ERROR. Now a check that ends on an exception ends every process it
    started."""
    import psutil
    from course_utils.checks import _core
    from course_utils.checks._core import _lookup
    monkeypatch.setattr(_lookup("2.2"), "time_limit_s", 4)
    # a quiet machine: on a busy one a time-out is BUSY, not an error (w4-02), and CI may be busy
    monkeypatch.setattr(_core._LoadWatch, "busy_sentence", lambda self: "")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = run_check("2.2", hangs_in_its_workers)
    assert result.status == "error" and "time limit" in result.message, result.message
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())]
    assert not left, f"still running after the check: {[(p.pid, p.cmdline()) for p in left]}"


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


class BaseSeedShared(WorkerSafe):
    """The walk w2-02 (w23_19): a generator made in each worker, from the base seed (the same in every worker)."""

    def rng(self):
        info = get_worker_info()
        seed = info.seed - info.id if info is not None else torch.initial_seed()
        if self._rng is None or seed != self._seed:
            self._rng, self._seed = np.random.default_rng(seed), seed
        return self._rng


class TorchGlobal(CropFlipBase):
    """WRONG (q02 w23_12): torch's global generator, which DataLoader seeds in each worker, so the
    workers are right; but in the main process every draw moves the training's own stream (the
    model's initialisation, dropout, a num_workers=0 loader's order). It passed every check."""

    def __getitem__(self, i):
        p = self.padding
        h, w = self.images.shape[1:3]
        padded = np.pad(self.images[i], ((p, p), (p, p), (0, 0)))
        dy, dx = (int(v) for v in torch.randint(0, 2 * p + 1, (2,)))
        crop = padded[dy:dy + h, dx:dx + w]
        if torch.rand(()) < 0.5:
            crop = crop[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1), self.labels[i]


class ReseedsTorch(WorkerSafe):
    """WRONG (q02 w23_15): torch.manual_seed(seed) "to be safe" whenever the seed changes: in the main
    process it restarts the training's generator. It passed every check."""

    def rng(self):
        info = get_worker_info()
        seed = info.seed if info is not None else torch.initial_seed()
        if self._rng is None or seed != self._seed:
            torch.manual_seed(seed)
            self._rng, self._seed = np.random.default_rng(seed), seed
        return self._rng


class SeedDrawnFromTorch(WorkerSafe):
    """WRONG: the NumPy generator's seed drawn from torch's global stream whenever torch's seed changes."""

    def rng(self):
        info = get_worker_info()
        key = info.seed if info is not None else torch.initial_seed()
        if self._rng is None or key != self._seed:
            self._rng, self._seed = np.random.default_rng(int(torch.randint(0, 2**62, ()))), key
        return self._rng


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


def _crop_flip_variant(image, padding, rng, *, same_offset=False, flip_p=0.5, vertical=False, mode="constant"):
    """crop_flip with one thing changed (the walk's wrong answers)."""
    h, w = image.shape[:2]
    padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)), mode=mode)
    if same_offset:
        dy = dx = rng.integers(0, 2 * padding + 1)
    else:
        dy, dx = rng.integers(0, 2 * padding + 1, size=2)
    crop = padded[dy:dy + h, dx:dx + w]
    if rng.random() < flip_p:
        crop = crop[::-1] if vertical else crop[:, ::-1]
    return torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1)


def _variant(**changed):
    class Variant(WorkerSafe):
        def __getitem__(self, i):
            return _crop_flip_variant(self.images[i], self.padding, self.rng(), **changed), self.labels[i]
    return Variant


SameOffsetBothAxes = _variant(same_offset=True)        # passed 6 of 6 seeds: only each axis was counted
FlipsFiftyFive = _variant(flip_p=0.55)                  # passed 6 of 6 seeds
FlipsFortyFive = _variant(flip_p=0.45)
MirrorsTopBottom = _variant(vertical=True)
ReflectPadding = _variant(mode="reflect")
FlipsAlways = _variant(flip_p=1.1)


class MainSeedAtInit(CropFlipBase):
    """Passed 20 of 20 seeds: the main process's seed read once, in __init__."""
    _rng = _seed = None

    def __init__(self, images, labels, padding=4):
        super().__init__(images, labels, padding)
        self.main_seed = torch.initial_seed()

    def rng(self):
        info = get_worker_info()
        seed = info.seed if info is not None else self.main_seed
        if self._rng is None or seed != self._seed:
            self._rng, self._seed = np.random.default_rng(seed), seed
        return self._rng


class GeneratorPerWorkerId(CropFlipBase):
    """Passed 20 of 20 seeds: a dict of generators by worker id, the main process's made once."""

    def rng(self):
        info = get_worker_info()
        key = None if info is None else info.id
        if not hasattr(self, "rngs"):
            self.rngs = {}
        if key not in self.rngs:
            self.rngs[key] = np.random.default_rng(info.seed if info else torch.initial_seed())
        return self.rngs[key]


class GeneratorPerItemFromTorch(CropFlipBase):
    """Passed 20 of 20 seeds: right draws, but a new generator for every item (from torch's stream)."""

    def rng(self):
        return np.random.default_rng(int(torch.randint(0, 2**62, (1,)).item()))


class ComparesSeedsWithIsNot(CropFlipBase):
    """`seed is not self.seed`: two equal large ints are different objects, so it remade the generator
    for every item; it was told about seed + index."""
    _rng = _seed = None

    def rng(self):
        info = get_worker_info()
        seed = info.seed if info is not None else torch.initial_seed()
        if self._rng is None or seed is not self._seed:
            self._rng, self._seed = np.random.default_rng(seed), seed
        return self._rng


class InitialSeedEverywhere(CropFlipBase):
    """Right: torch.initial_seed() is the worker's seed inside a worker."""
    _rng = _seed = None

    def rng(self):
        seed = torch.initial_seed()
        if self._rng is None or seed != self._seed:
            self._rng, self._seed = np.random.default_rng(seed), seed
        return self._rng


class SeedCutTo32Bits(WorkerSafe):
    """The walk w4-02 (w23_08): the seed % 2**32 (a habit from np.random.seed); it differs by worker, by
    epoch and with torch's seed, but torch seeds s and s + 2**32 draw alike: not the whole seed."""

    def rng(self):
        info = get_worker_info()
        seed = (info.seed if info is not None else torch.initial_seed()) % 2**32
        if self._rng is None or seed != self._seed:
            self._rng, self._seed = np.random.default_rng(seed), seed
        return self._rng


class SeedFoldedTo8Bits(WorkerSafe):
    """The walk w3-02 (w23_11): the seed % 256, so torch seeds s and s + 256 draw alike (passed 7 of 7 seeds)."""

    def rng(self):
        info = get_worker_info()
        seed = (info.seed if info is not None else torch.initial_seed()) % 256
        if self._rng is None or seed != self._seed:
            self._rng, self._seed = np.random.default_rng(seed), seed
        return self._rng


class GeneratorOnTheClass(CropFlipBase):
    """The walk w3-02 (w23_19): the generator kept on the class, shared by every dataset of it; it was
    told to seed from torch.initial_seed(), which it does."""
    _rng, _rng_seed = None, None

    def rng(self):
        info = get_worker_info()
        seed = info.seed if info is not None else torch.initial_seed()
        cls = type(self)
        if cls._rng is None or seed != cls._rng_seed:
            cls._rng, cls._rng_seed = np.random.default_rng(seed), seed
        return cls._rng


class _FoldedSeed(WorkerSafe):
    """The solution with the seed passed through `fold` before NumPy gets it (the walk w6-02)."""

    @staticmethod
    def fold(seed):
        raise NotImplementedError

    def rng(self):
        info = get_worker_info()
        seed = info.seed if info is not None else torch.initial_seed()
        if self._rng is None or seed != self._seed:
            self._rng, self._seed = np.random.default_rng(self.fold(seed)), seed
        return self._rng


class SeedThroughFloat(_FoldedSeed):
    """w6-02: int(float(seed)) (a float64 holds 53 bits: a loader's two workers, base_seed and base_seed + 1,
    drew alike); passed 1 of 19 runs."""
    fold = staticmethod(lambda seed: int(float(seed)))


class SeedHalved(_FoldedSeed):
    """w6-02: seed // 2 (seeds s and s + 1 alike when s is even); passed 3 of 9 runs, and was told to seed
    from torch.initial_seed(), which it does."""
    fold = staticmethod(lambda seed: seed // 2)


class SeedHalvesXored(_FoldedSeed):
    """w6-02: the seed folded to 32 bits by XOR of its halves (seeds 1 and 2**32 alike); passed 3 of 3."""
    fold = staticmethod(lambda seed: (seed ^ (seed >> 32)) & 0xFFFFFFFF)


# w6-02: the walker's class-level generator, made by exec (its __module__ "builtins", as a harness or a
# tool may give it): it was told to seed from torch.initial_seed() "not from fresh OS entropy"
_CLASS_LEVEL_SOURCE = """
class WorkerSafeCropFlip(Dataset):
    _rng, _seed = None, None
    def __init__(self, images, labels, padding=4):
        self.images, self.labels, self.padding = images, labels, padding
    def __len__(self):
        return len(self.images)
    def __getitem__(self, index):
        info = get_worker_info()
        seed = info.seed if info is not None else torch.initial_seed()
        cls = type(self)
        if cls._rng is None or cls._seed != seed:
            cls._rng, cls._seed = np.random.default_rng(seed), seed
        return crop_flip(self.images[index], self.padding, cls._rng), self.labels[index]
"""
_namespace = {"Dataset": Dataset, "get_worker_info": get_worker_info, "torch": torch, "np": np, "crop_flip": crop_flip}
exec(_CLASS_LEVEL_SOURCE, _namespace)
ClassLevelMadeByExec = _namespace["WorkerSafeCropFlip"]


class SeedPlusIdTwice(WorkerSafe):
    """Right (w3-02, w23_17): torch.initial_seed() + id counts the id twice; seeds still differ by worker,
    epoch and torch seed."""

    def rng(self):
        info = get_worker_info()
        seed = torch.initial_seed() + (info.id if info is not None else 0)
        if self._rng is None or seed != self._seed:
            self._rng, self._seed = np.random.default_rng(seed), seed
        return self._rng


class _TorchGeneratorAsNumpy:
    """crop_flip's interface (integers, random) over a torch.Generator."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def integers(self, low, high=None, size=None):
        if high is None:
            low, high = 0, low
        if size is None:
            return int(torch.randint(low, high, (), generator=self.g))
        return torch.randint(low, high, (size,) if isinstance(size, int) else tuple(size), generator=self.g).numpy()

    def random(self, size=None):
        if size is None:
            return float(torch.rand((), generator=self.g))
        return torch.rand((size,) if isinstance(size, int) else tuple(size), generator=self.g).numpy()


class TorchGeneratorBehindTheInterface(WorkerSafe):
    """Right (w3-02, w23_15): a torch.Generator where the spec says a NumPy Generator; it behaves the same."""

    def rng(self):
        info = get_worker_info()
        seed = info.seed if info is not None else torch.initial_seed()
        if self._rng is None or seed != self._seed:
            self._rng, self._seed = _TorchGeneratorAsNumpy(seed), seed
        return self._rng


# These fail once DataLoader workers run (a second or more per run, worker start-up): what they
# do wrong is how they seed, whatever the check draws (its torch seeds and pictures only change
# which values come out alike, never whether they do), so one seed each, as 2.2's mutants.
MUTANTS_23_WORKERS = [
    Mutant("seeded in __init__", SeededInInit, "different augmentations in different workers"),
    Mutant("unseeded in __init__", UnseededInInit, "different augmentations in different workers"),
    Mutant("made lazily once", LazyOnce, "different augmentations in different workers"),
    Mutant("seeded per worker from the base seed (w23_19)", BaseSeedShared, "different augmentations in different workers",
           words="get_worker_info().seed - id"),
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
    Mutant("ignores padding", IgnoresPadding, "returns a crop of the zero-padded image, flipped or not",
           words="not 4"),
    Mutant("mirrors top-bottom", MirrorsTopBottom, "returns a crop of the zero-padded image, flipped or not",
           words="not top-bottom"),
    Mutant("pads by reflection", ReflectPadding, "returns a crop of the zero-padded image, flipped or not",
           words="padded by reflection"),
    Mutant("HWC out", HWCOut, "returns a uint8 (C, H, W) crop the size of the image"),
    Mutant("float image", FloatImage, "returns a uint8 (C, H, W) crop the size of the image"),
    Mutant("never flips", NeverFlips, "flips half the items", words="none of"),
    Mutant("flips always", FlipsAlways, "flips half the items", words="every one of"),
    Mutant("exclusive upper bound", ExclusiveOffsets, "offsets cover 0..2*padding"),
    Mutant("triangular offsets", TriangularOffsets, "offsets are uniform over 0..2*padding"),
    Mutant("one offset for both axes", SameOffsetBothAxes, "offsets drawn independently on the two axes"),
    Mutant("flips a third", FlipsAThird, "flips half the items"),
    Mutant("a generator per item, seed + index", SeedPlusIndex, "draws anew on every call", words="seed + index"),
    Mutant("seeds compared with `is not`", ComparesSeedsWithIsNot, "draws anew on every call", words="`is not`"),
    Mutant("default padding 2", DefaultPaddingTwo, "pads by 4 by default"),
]
# issue 35's rule, on the flip probability: 0.55, 0.52, 0.49, 0.48 and 0.45 rejected on every seed (the
# check reads the share from 51,000 to 275,625 draws, until it can tell 1/2 from 0.49 and 0.51); these
# fail in the main process, after every seeding property
MUTANTS_23_FLIPS = [
    Mutant("flips with probability 0.55", FlipsFiftyFive, "flips half the items"),
    Mutant("flips with probability 0.45", FlipsFortyFive, "flips half the items"),
    Mutant("flips with probability 0.52 (w23_17)", _variant(flip_p=0.52), "flips half the items",
           words="draws were mirrored, outside 50% +- 1.1"),
    Mutant("flips with probability 0.48", _variant(flip_p=0.48), "flips half the items"),
    Mutant("flips with probability 0.49 (w6-02)", _variant(flip_p=0.49), "flips half the items",
           words="to tell 1/2 from a rate 0.01 away, 0.49 or 0.51, on every run"),
    Mutant("flips with probability 0.51 (w6-02)", _variant(flip_p=0.51), "flips half the items"),
]
MUTANTS_23_LATE = [
    Mutant("torch's global generator (q02 w23_12)", TorchGlobal, "leaves torch's global generator alone",
           words="yours drew from torch's global generator"),
    Mutant("torch.manual_seed inside (q02 w23_15)", ReseedsTorch, "leaves torch's global generator alone",
           words="yours called torch.manual_seed(torch.initial_seed())"),
    Mutant("the seed drawn from torch's stream", SeedDrawnFromTorch, "leaves torch's global generator alone",
           words="yours drew from torch's global generator"),
    Mutant("the main process's seed read in __init__", MainSeedAtInit,
           "follows a torch.manual_seed set after the dataset was made", words="read the seed whenever you draw"),
    Mutant("generators by worker id, made once", GeneratorPerWorkerId,
           "follows a torch.manual_seed set after the dataset was made"),
    Mutant("a new generator per item, seeded from torch", GeneratorPerItemFromTorch, "keeps one generator per process"),
    Mutant("the seed folded to 8 bits (w3-02 w23_11)", SeedFoldedTo8Bits, "follows the torch seed in the main process",
           words="a seed % 256"),
    Mutant("the seed cut to 32 bits (w4-02 w23_08)", SeedCutTo32Bits, "follows the torch seed in the main process",
           words="seeds 2**32 apart drew alike"),
    Mutant("a generator kept on the class (w3-02 w23_19)", GeneratorOnTheClass,
           "reproducible under torch.manual_seed in the main process", words="on the class (GeneratorOnTheClass._rng)"),
    # w6-02: folds of the seed, on pairs of seeds that each fold maps onto one, whatever the check draws (one seed each)
    Mutant("int(float(seed)) (w6-02)", SeedThroughFloat, "follows the torch seed in the main process",
           words="passed through float()"),
    Mutant("seed // 2 (w6-02)", SeedHalved, "follows the torch seed in the main process",
           words="a seed halved (seed // 2)"),
    Mutant("the seed's halves XORed into 32 bits (w6-02)", SeedHalvesXored, "follows the torch seed in the main process",
           words="its halves XORed or added"),
    Mutant("a generator kept on a class made by exec (w6-02)", ClassLevelMadeByExec,
           "reproducible under torch.manual_seed in the main process", words="on the class (WorkerSafeCropFlip._rng)"),
]


@pytest.mark.parametrize("cls", [WorkerSafe], ids=lambda c: c.__name__)
def test_worker_seeding_right_ones_pass(cls):
    passes("2.3", cls, range(2))


# Right variants of WorkerSafe that differ from it only in the seed they use, which does not depend
# on the check's draws (those are proven on two seeds above): one seed each. SeedPlusIdTwice and
# TorchGeneratorBehindTheInterface: harmless variants the walk w3-02 tried (w23_17, w23_15).
@pytest.mark.parametrize("cls", [InitialSeedEverywhere, SeedPlusIdTwice,
                                 TorchGeneratorBehindTheInterface], ids=lambda c: c.__name__)
def test_worker_seeding_right_variants_pass(cls):
    passes("2.3", cls, range(1))


# One seed each: the check reads the share in looks until it can tell 1/2 from a rate 0.01 away, and a
# rate of 0.49 or 0.51 passes a look with probability about 1e-7 (course_utils.checks.lesson02._flip_share),
# 0.48 and 0.52 even less, so no seed of a test run passes one; a seed costs 51,000 draws (0.48, 0.52) to
# about 85,000 (0.49, 0.51), seconds each.
@pytest.mark.parametrize("mutant", MUTANTS_23_FLIPS, ids=repr)
def test_worker_seeding_flip_near_misses_rejected_on_every_seed(mutant):
    rejected("2.3", mutant, range(1))


# Where a seeding mistake shows does not depend on the check's draws (see MUTANTS_23_WORKERS): one
# seed each (a run costs seconds: the workers start).
@pytest.mark.parametrize("mutant", MUTANTS_23_LATE, ids=repr)
def test_worker_seeding_mutants_rejected_after_the_workers(mutant):
    rejected("2.3", mutant, range(1))


# A mistake of shape, padding, mirroring, dtype, a flip rate of 0, 1 or 1/3 (75 standard errors
# from 0.5 in the check's first 51,000 draws, _FLIP_LOOKS) or a generator's seed is the same on every
# draw: one seed.
# Offsets are judged by statistics of the draws (coverage, uniformity, independence), where a
# mutant's fate could depend on them: those run on four seeds.
STATISTICAL_23 = {"exclusive upper bound", "triangular offsets", "one offset for both axes"}


@pytest.mark.parametrize("mutant", MUTANTS_23, ids=repr)
def test_worker_seeding_mutants_rejected(mutant):
    rejected("2.3", mutant, range(4) if mutant.name in STATISTICAL_23 else range(1))


@pytest.mark.parametrize("mutant", MUTANTS_23_WORKERS, ids=repr)
def test_worker_seeding_mutants_rejected_in_the_workers(mutant):
    rejected("2.3", mutant, range(1))


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


def _times_out_at_once(monkeypatch, others_cores):
    """run_check's time limit fires at once, and OthersCpu reports `others_cores` of 2 cores taken."""
    import contextlib

    from course_utils.checks import _busy, _core

    @contextlib.contextmanager
    def limit(seconds, sentence=None):
        raise TimeoutError(sentence)
        yield

    def exit_(self, *exc):
        self.others_cores, self.usable, self.wall_s = others_cores, 2, 120.0
    monkeypatch.setattr(_core, "_time_limit", limit)
    monkeypatch.setattr(_busy.OthersCpu, "__exit__", exit_)


def test_a_time_out_on_a_busy_machine_is_busy_not_blamed_on_the_code(monkeypatch):
    """The walk w4-02: 2.3's time-out at a load of 20 asked "does your code loop forever ...?" of code
    with no loop; on a busy machine it is BUSY (not graded), on a quiet one an ERROR as before."""
    _times_out_at_once(monkeypatch, 1.9)
    result = run_check("2.3", WorkerSafe)
    assert result.status == "busy", result.message
    assert result.message.startswith("not graded: the check did not finish within its time limit of 150 s")
    assert "while the machine was busy (1.9 of its 2 usable cores taken by other programs" in result.message
    assert "loop forever" not in result.message
    _times_out_at_once(monkeypatch, 0.3)
    result = run_check("2.3", WorkerSafe)
    assert result.status == "error" and "loop forever" in result.message, result.message
