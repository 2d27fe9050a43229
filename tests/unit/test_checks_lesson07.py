"""Lesson 07's checks: right answers pass, plausible wrong answers fail on the right property on
every seed, stubs are 'not implemented'.

7.1 runs in this process. 7.2-7.4 are files run under torchrun with 2 gloo processes: every
mutant x seed of the three is one job of ONE launch (`run_rank_jobs`, through a torchrun as old
as torch 2.11's), judged by the same `judge_7_N` functions the checks use; one test per exercise
also goes through `check()` itself.
"""
import math
import textwrap

import pytest
import torch

from course_utils import launch
from course_utils.checks import lesson07, run_check
from test_launch import use_old_torchrun

SEEDS_71 = [11, 202, 3003, 40004, 500005, 6, 77, 888]
SEEDS_RANKS = [5, 1234]          # right answers of 7.2-7.4 run on both (each seed draws new sizes, k, counts)
# A mutant's fate does not depend on the seed (its decisive inputs are in every seed's draw), so each
# runs on one of the two seeds, alternately, to keep the one launch short; those below, whose fate
# turns on drawn sizes or counts, run on both.
BOTH_SEEDS = {("7.2", 0), ("7.2", 8), ("7.2", 9), ("7.3", 0), ("7.3", 7), ("7.3", 9), ("7.4", 2), ("7.4", 4),
              ("7.4", 5), ("7.4", 6)}


def seeds_for(ex, name):
    """Both seeds for each exercise's solution and the mutants in BOTH_SEEDS; one, alternately, for the
    other right answers (variants the solution's seeds already cover), the errors and the mutants."""
    if name == "solution":
        return SEEDS_RANKS
    if not name.startswith("mutant"):
        return [SEEDS_RANKS[len(name) % 2]]
    i = int(name.removeprefix("mutant"))
    return SEEDS_RANKS if (ex, i) in BOTH_SEEDS else [SEEDS_RANKS[i % 2]]


def fails_on(result, prop):
    assert result.status == "fail", result.message
    assert f"'{prop}'" in result.message, result.message


# == 7.1 ==========================================================================================

def shard_indices(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(n, generator=g).tolist()
    else:
        indices = list(range(n))
    per_rank = n // num_replicas if drop_last else math.ceil(n / num_replicas)
    total = per_rank * num_replicas
    if total > n:
        indices += (indices * math.ceil((total - n) / n))[:total - n]
    else:
        indices = indices[:total]
    return indices[rank:total:num_replicas]


def make_shard(*, order="torch", deal="interleave", pad="repeat", drop="floor", epoch_used=True, seed_used=True,
               seed_offset_by_rank=False, shuffle_flag=True, use_rank=True, global_rng=False):
    """shard_indices with one knob per mistake (the defaults are right)."""
    def wrong(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
        s = (seed if seed_used else 0) + (epoch if epoch_used else 0) + (rank if seed_offset_by_rank else 0)
        if shuffle or not shuffle_flag:
            if order == "torch":
                if global_rng:
                    torch.manual_seed(s)
                    indices = torch.randperm(n).tolist()
                else:
                    g = torch.Generator()
                    g.manual_seed(s)
                    indices = torch.randperm(n, generator=g).tolist()
            else:
                import numpy as np
                indices = np.random.default_rng(s).permutation(n).tolist()
        else:
            indices = list(range(n))
        if pad == "none" and not drop_last:
            return indices[rank::num_replicas] if use_rank else indices
        if drop_last and drop != "ignored":
            per_rank = ((n - num_replicas) // num_replicas if drop == "off_by_one" else
                        (n - 1) // num_replicas if drop == "minus_one" else n // num_replicas)
        else:
            per_rank = n // num_replicas + 1 if pad == "floor_plus_one" else math.ceil(n / num_replicas)
        total = per_rank * num_replicas
        if total > n:
            extra = total - n
            if pad in ("repeat", "floor_plus_one"):
                indices += (indices * math.ceil(extra / n))[:extra]
            elif pad == "once":
                indices += indices[:extra]
            elif pad == "last":
                indices += [indices[-1]] * extra
            elif pad == "unshuffled":
                indices += list(range(n))[:extra] * math.ceil(extra / n)
                indices = indices[:total]
        else:
            indices = indices[:total]
        if not use_rank:
            return indices
        if deal == "blocks":
            return indices[rank * per_rank:(rank + 1) * per_rank]
        return indices[rank:total:num_replicas]
    return wrong


def wraps_torch_sampler(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    from torch.utils.data import DistributedSampler
    sampler = DistributedSampler(range(n), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                                 drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


MUTANTS_71 = [
    (wraps_torch_sampler, "writes the sharding itself (not through torch's DistributedSampler)"),
    (make_shard(deal="blocks"), "rank r takes every num_replicas-th index, starting at r"),
    (make_shard(use_rank=False), "rank r takes every num_replicas-th index, starting at r"),          # right with 1 rank
    (make_shard(pad="none"), "pads to ceil(n / num_replicas) per rank by repeating the first indices"),  # right with 1 rank
    (make_shard(pad="last"), "pads to ceil(n / num_replicas) per rank by repeating the first indices"),
    (make_shard(pad="once"), "pads even when the dataset is smaller than the number of ranks"),
    (make_shard(drop="ignored"), "drop_last drops the tail so every rank gets floor(n / num_replicas)"),
    (make_shard(drop="off_by_one"), "drop_last drops the tail so every rank gets floor(n / num_replicas)"),
    # the near-miss rule: (n - 1) // R is n // R unless R divides n: drop_last on an exact multiple
    (make_shard(drop="minus_one"), "drop_last drops the tail so every rank gets floor(n / num_replicas)"),
    (make_shard(order="numpy"), "shuffles with torch.randperm and a generator seeded with seed + epoch"),
    (make_shard(seed_offset_by_rank=True), "shuffles with torch.randperm and a generator seeded with seed + epoch"),
    (make_shard(epoch_used=False), "the order changes with the epoch"),
    (make_shard(seed_used=False), "the seed changes the order"),
    (make_shard(shuffle_flag=False), "shuffle=False keeps the dataset's order"),
    (make_shard(pad="unshuffled"), "pads (or drops) after shuffling, exactly as DistributedSampler does"),
    (make_shard(global_rng=True), "leaves the global random state alone"),
    # w3-07 w71_14: n // R + 1 for ceil is one too many when R divides n: named as the length, not the stride
    (make_shard(pad="floor_plus_one"), "pads to ceil(n / num_replicas) per rank by repeating the first indices"),
]
MESSAGES_71 = {len(MUTANTS_71) - 1: "when num_replicas divides n nothing is padded"}


def cached_by_n_and_seed():
    """w3-07 w71_12: the permutation kept from the first call with this (n, seed): state between calls."""
    cache = {}
    def wrong(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
        if shuffle and (n, seed) not in cache:
            cache[(n, seed)] = epoch
        used = cache.get((n, seed), epoch) if shuffle else epoch
        return shard_indices(n, num_replicas, rank, shuffle=shuffle, seed=seed, epoch=used, drop_last=drop_last)
    return wrong


def seed_times_1000_plus_epoch(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    """w3-07 w71_15: seed * 1000 + epoch: right with seed 0 only."""
    return shard_indices(n, num_replicas, rank, shuffle=shuffle, seed=seed * 999, epoch=seed + epoch,
                         drop_last=drop_last)


MUTANTS_71.append((cached_by_n_and_seed(), "computes each call from its own arguments (nothing kept between calls)"))
MESSAGES_71[len(MUTANTS_71) - 1] = "kept something from that call"
MUTANTS_71.append((seed_times_1000_plus_epoch, "seeds the generator with exactly seed + epoch"))
MESSAGES_71[len(MUTANTS_71) - 1] = "with seed=0 yours matched DistributedSampler"


def generator_kept_between_calls():
    """w5-07 w71_13: one torch.Generator made once and drawn from on every call (it moves on)."""
    kept = torch.Generator()
    kept.manual_seed(0)
    def wrong(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
        order = torch.randperm(n, generator=kept).tolist() if shuffle else list(range(n))
        total = num_replicas * (n // num_replicas if drop_last else math.ceil(n / num_replicas))
        while len(order) < total:
            order = order + order
        return order[:total][rank:total:num_replicas]
    return wrong


MUTANTS_71.append((generator_kept_between_calls(), "computes each call from its own arguments (nothing kept between calls)"))
MESSAGES_71[len(MUTANTS_71) - 1] = "a second call with the same arguments returned another list"


def padded_twice_at_most(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    """w6-07 W14: the list repeated once more when the dataset is smaller than the ranks, but never a
    third time: right unless three or more copies are needed (n=1 with 5 ranks: rank 4 gets [])."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(n, generator=g).tolist()
    else:
        indices = list(range(n))
    if drop_last:
        total = num_replicas * (n // num_replicas)
        indices = indices[:total]
    else:
        total = num_replicas * math.ceil(n / num_replicas)
        indices = indices + indices[:total - n]
        if len(indices) < total:
            indices = (indices * 2)[:total]
    return indices[rank:total:num_replicas]


def sorted_share(n, num_replicas, rank, **kwargs):
    """w6-07 W16: the right indices, sorted (the order is the mistake, not the padding)."""
    return sorted(shard_indices(n, num_replicas, rank, **kwargs))


MUTANTS_71.append((padded_twice_at_most, "pads even when the dataset is smaller than the number of ranks"))
MESSAGES_71[len(MUTANTS_71) - 1] = "copies of the list (more than two)"
MUTANTS_71.append((sorted_share, "keeps DistributedSampler's order within the rank's share"))
MESSAGES_71[len(MUTANTS_71) - 1] = "yours holds the right indices, sorted"


def drop_last_rounded(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    """w7-07 w71_17: round(n / num_replicas) for drop_last's share, in place of floor: right whenever
    the fraction is at most one half (it passed check seeds 1, 3 and 8)."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(n, generator=g).tolist()
    else:
        indices = list(range(n))
    per_rank = round(n / num_replicas) if drop_last else math.ceil(n / num_replicas)
    total = per_rank * num_replicas
    if not drop_last:
        indices += (indices * math.ceil((total - n) / n))[:total - n]
    else:
        indices = indices[:total]
    return indices[rank:total:num_replicas]


MUTANTS_71.append((drop_last_rounded, "drop_last drops the tail so every rank gets floor(n / num_replicas)"))
MESSAGES_71[len(MUTANTS_71) - 1] = "round() or ceil() where floor belongs"


def drop_last_no_cut(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    """w8-07 71_18: drop_last leaves the list uncut, `indices[rank::num_replicas]`: the first n % R
    ranks get one index more. It used neither round() nor ceil(), and was told about them."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(n, generator=g).tolist()
    else:
        indices = list(range(n))
    if not drop_last:
        total = num_replicas * math.ceil(n / num_replicas)
        while len(indices) < total:
            indices += indices[:total - len(indices)]
    return indices[rank::num_replicas]


MUTANTS_71.append((drop_last_no_cut, "drop_last drops the tail so every rank gets floor(n / num_replicas)"))
MESSAGES_71[len(MUTANTS_71) - 1] = "of the whole list of"
# w8-07 71_07: ceil's padding under drop_last too: named as drop_last=False's list, not as a rounding
assert MUTANTS_71[6][0].__qualname__.startswith("make_shard")
MESSAGES_71[6] = "what drop_last=False gives"


def drop_last_at_least_one(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    """The near-miss rule on drop_last's floor: max(1, n // num_replicas), right unless the dataset is
    smaller than the number of ranks (DistributedSampler then gives every rank [])."""
    if not drop_last or n >= num_replicas:
        return shard_indices(n, num_replicas, rank, shuffle=shuffle, seed=seed, epoch=epoch, drop_last=drop_last)
    return shard_indices(n, num_replicas, rank, shuffle=shuffle, seed=seed, epoch=epoch, drop_last=False)


MUTANTS_71.append((drop_last_at_least_one, "drop_last drops the tail so every rank gets floor(n / num_replicas)"))
MESSAGES_71[len(MUTANTS_71) - 1] = "floor(n / num_replicas) x num_replicas = 0 instead"


def special_case_fewer_than_ranks(*, empty_on_drop_last):
    """w8-07 71_20: `[idx[rank % n]]` when n < num_replicas, padding once otherwise. Without drop_last that
    is the sampler's answer; with drop_last and n < num_replicas the cut list is empty and idx[rank % n]
    raises (the walker judged it right: the check never drew that input). Returning [] there is right."""
    def answer(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
        if shuffle:
            g = torch.Generator()
            g.manual_seed(seed + epoch)
            idx = torch.randperm(n, generator=g).tolist()
        else:
            idx = list(range(n))
        total = num_replicas * (n // num_replicas if drop_last else math.ceil(n / num_replicas))
        if drop_last:
            idx = idx[:total]
        else:
            idx += idx[:total - n]
        if n >= num_replicas or (drop_last and empty_on_drop_last):
            return idx[rank:total:num_replicas]
        return [idx[rank % n]]
    return answer


def cached_and_padded_in_place():
    """w10-07 w71_15: the permutation cached per (n, seed, epoch, shuffle) and padded in place
    (`indices += ...` on the cached list): the next call with the same key starts from a longer list.
    Passed 16 of 20 seeds; on the other 4 it was told to repeat the whole list, which it did."""
    perms = {}
    def wrong(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
        key = (n, seed, epoch, shuffle)
        if key not in perms:
            g = torch.Generator()
            g.manual_seed(seed + epoch)
            perms[key] = torch.randperm(n, generator=g).tolist() if shuffle else list(range(n))
        indices = perms[key]
        total = num_replicas * (n // num_replicas if drop_last else math.ceil(n / num_replicas))
        if drop_last:
            indices = indices[:total]
        elif total > n:
            pad = total - n
            indices += (indices * math.ceil(pad / n))[:pad]
        return indices[rank:total:num_replicas]
    return wrong


def first_padding_cached():
    """The near-miss rule, beside w10-07 w71_15: the list padded for the first num_replicas cached per (n, seed,
    epoch), not in place, and dealt for every later num_replicas (too short for a larger one)."""
    cache = {}
    def wrong(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
        total = num_replicas * (n // num_replicas if drop_last else math.ceil(n / num_replicas))
        key = (n, seed, epoch, shuffle, drop_last)
        if key not in cache:
            idx = shard_indices(n, 1, 0, shuffle=shuffle, seed=seed, epoch=epoch)
            cache[key] = idx[:total] if drop_last else (idx * math.ceil(total / n))[:total]
        return cache[key][rank:total:num_replicas]
    return wrong


MUTANTS_71.append((first_padding_cached(), "computes each call from its own arguments (nothing kept between calls)"))
MESSAGES_71[len(MUTANTS_71) - 1] = "your answer depends on earlier calls"


def test_7_1_a_cache_padded_in_place_fails_on_every_seed_as_state_between_calls(monkeypatch):
    """Its fate depended on the draw: the walk's four failing seeds (told to repeat the whole list, which it
    did) and two of its sixteen passing ones, each with a fresh cache as a learner's first run has, then the
    same answer run again (a cache filled by the earlier runs). 600 runs of seeds 1-20 were all rejected so."""
    prop = "computes each call from its own arguments (nothing kept between calls)"
    words = "the quoted call gives the right answer alone"
    for seed in (1, 5, 14, 16, 2, 3):
        monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
        result = run_check("7.1", cached_and_padded_in_place())
        fails_on(result, prop)
        assert words in result.message and "padded in place" in result.message, result.message
    kept = cached_and_padded_in_place()
    for seed in (7, 8):
        monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
        result = run_check("7.1", kept)
        fails_on(result, prop)
        assert words in result.message, result.message


def test_7_1_a_cache_copied_before_padding_passes(monkeypatch):
    """w10-07 w71_16: a cache of the permutation, copied before padding: nothing it holds changes, right."""
    perms = {}
    def right(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
        key = (n, seed, epoch, shuffle)
        if key not in perms:
            perms[key] = tuple(shard_indices(n, 1, 0, shuffle=shuffle, seed=seed, epoch=epoch))
        indices = list(perms[key])
        total = num_replicas * (n // num_replicas if drop_last else math.ceil(n / num_replicas))
        indices = (indices * math.ceil(total / n))[:total]
        return torch.tensor(indices[rank:total:num_replicas])
    for seed in (1, 5):
        monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
        result = run_check("7.1", right)
        assert result.status == "pass", result.message


def test_7_1_a_crash_on_fewer_records_than_ranks_names_the_call(monkeypatch):
    for seed in (1, 2):
        monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
        result = run_check("7.1", special_case_fewer_than_ranks(empty_on_drop_last=False))
        assert result.status == "error" and "IndexError" in result.message, result.message
        assert "the check was calling shard_indices(" in result.message and "drop_last=True)" in result.message
        assert run_check("7.1", special_case_fewer_than_ranks(empty_on_drop_last=True)).passed


def test_7_1_drop_last_rounded_fails_on_the_seeds_it_passed_and_on_those_it_was_misnamed(monkeypatch):
    """w7-07 w71_17 passed check seeds 1, 3, 8 and was told about the padding's order on 5 and 10."""
    for seed in (1, 3, 8, 5, 10):
        monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
        result = run_check("7.1", drop_last_rounded)
        fails_on(result, "drop_last drops the tail so every rank gets floor(n / num_replicas)")
        assert "round() or ceil() where floor belongs" in result.message


def global_rng_saved_and_restored(n, num_replicas, rank, **kwargs):
    """w7-07 w71_15: torch.manual_seed on the global generator, its state saved before and restored
    after: the contract's property (the global random state is left as it was) holds. Right."""
    if not kwargs.get("shuffle", True):
        return shard_indices(n, num_replicas, rank, **kwargs)
    state = torch.get_rng_state()
    torch.manual_seed(kwargs.get("seed", 0) + kwargs.get("epoch", 0))
    order = torch.randperm(n).tolist()
    torch.set_rng_state(state)
    reference = shard_indices(n, num_replicas, rank, **kwargs)
    assert order == shard_indices(n, 1, 0, seed=kwargs.get("seed", 0), epoch=kwargs.get("epoch", 0))
    return reference


def generator_warmed_with_randperm_1(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    """w7-07 w71_18: torch.randperm(1, generator=g) before the real draw: it consumes no random
    numbers, so the permutation is DistributedSampler's. Right (randperm(3) first is rejected)."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        torch.randperm(1, generator=g)
    return shard_indices(n, num_replicas, rank, shuffle=shuffle, seed=seed, epoch=epoch, drop_last=drop_last)


def padded_by_modulo(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    """w8-07 71_12: the padding as `[idx[i % n] for i in range(total)]`: the sampler's list. Right."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        idx = torch.randperm(n, generator=g).tolist()
    else:
        idx = list(range(n))
    total = num_replicas * (n // num_replicas if drop_last else math.ceil(n / num_replicas))
    return [idx[i % n] for i in range(total)][rank::num_replicas]


def fork_rng_seeded(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    """w9-07 w71_13: the global generator seeded inside torch.random.fork_rng(), which restores it: right."""
    if shuffle:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + epoch)
            indices = torch.randperm(n).tolist()
    else:
        indices = list(range(n))
    if drop_last:
        total = num_replicas * (n // num_replicas)
        indices = indices[:total]
    else:
        total = num_replicas * math.ceil(n / num_replicas)
        pad = total - n
        indices += (indices * (math.ceil(pad / max(n, 1)) + 1))[:pad]
    return indices[rank:total:num_replicas]


def tensor_repeat(n, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    """w9-07 w71_18: a tensor throughout, padded with idx.repeat(), a tensor returned: right."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    idx = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
    if drop_last:
        total = num_replicas * (n // num_replicas)
        idx = idx[:total]
    else:
        total = num_replicas * math.ceil(n / num_replicas)
        idx = idx.repeat(math.ceil(total / max(n, 1)))[:total]
    return idx[rank:total:num_replicas]


@pytest.mark.parametrize("fn", [global_rng_saved_and_restored, generator_warmed_with_randperm_1,
                                lambda *a, **k: __import__("numpy").asarray(shard_indices(*a, **k)),
                                padded_by_modulo, fork_rng_seeded, tensor_repeat],
                         ids=["w71_15 global RNG restored", "w71_18 randperm(1) first", "w71_16 numpy array",
                              "w8-07 71_12 padding by modulo", "w9-07 w71_13 fork_rng", "w9-07 w71_18 tensor repeat"])
def test_7_1_right_answers_of_walk_w7_pass(monkeypatch, fn):
    for seed in (1, 2):
        monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
        result = run_check("7.1", fn)
        assert result.status == "pass", result.message


@pytest.mark.parametrize("seed", SEEDS_71)
def test_7_1_solution_passes(monkeypatch, seed):
    monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
    result = run_check("7.1", shard_indices)
    assert result.status == "pass", result.message


def test_7_1_accepts_tensors_and_arrays():
    assert run_check("7.1", lambda *a, **k: torch.tensor(shard_indices(*a, **k))).passed


@pytest.mark.parametrize("fn, prop", MUTANTS_71, ids=[f"mutant{i}" for i in range(len(MUTANTS_71))])
def test_7_1_mutants_fail_on_the_right_property_on_every_seed(monkeypatch, fn, prop):
    for seed in SEEDS_71:
        monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
        result = run_check("7.1", fn)
        fails_on(result, prop)
        said = MESSAGES_71.get(next(i for i, (f, _) in enumerate(MUTANTS_71) if f is fn))
        assert said is None or said in result.message, result.message


def test_7_1_shows_where_yours_and_expected_differ(monkeypatch):
    """w3-07 w71_11: a difference in the padding, past the first 12 indices, printed two identical lists."""
    import re
    for seed in SEEDS_71 + [0, 7]:
        monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
        message = run_check("7.1", make_shard(pad="unshuffled")).message
        shown = re.search(r"yours (\[.*?\]).*?, expected (\[.*?\])", message)
        assert shown and shown.group(1) != shown.group(2), message


def _obs_73_local_nan(seed, *, joined, world=2):
    """What the ranks report for 7.3 when the rank with no samples returns nan from its own count
    (w9-07 w73_14, joined: after the all-reduce; w4-07, not joined: before it); the right values elsewhere."""
    from course_utils.checks.lesson07_ranks import cases_73
    obs = [{"rank": r, "results": []} for r in range(world)]
    for i, case in enumerate(cases_73(seed, world)):
        n = sum(c[2] for c in case)
        right = [sum(c[0] for c in case) / n, sum(c[1] for c in case) / n] if n else ["nan", "nan"]
        for r, o in enumerate(obs):
            local_nan = case[r][2] == 0 and n > 0
            o["results"].append({"collectives": 0 if local_nan and not joined else 1, "collective_names": [],
                                 "collective_devices": ["cpu"], "types": ["float", "float"],
                                 "value": ["nan", "nan"] if local_nan else right})
    return obs


@pytest.mark.parametrize("joined, words", [(True, "joined the all-reduce, then returned nan from its own count"),
                                           (False, "returned nan without joining the all-reduce")])
def test_7_3_local_nan_is_named_as_joined_or_not(joined, words):
    """w9-07 w73_14 all-reduced on every rank and was told it had not joined the all-reduce (w4-07's
    message): the two are told apart by the empty rank's collective count (fast: no launch)."""
    for seed in SEEDS_RANKS:
        with pytest.raises(lesson07.CheckFailed) as info:
            lesson07.judge_7_3(_obs_73_local_nan(seed, joined=joined), seed, "answer.py")
        message = info.value.sentence()
        assert "'every rank gets the same result'" in message and words in message, message
        assert ("without joining" in message) != joined, message


def _obs_73(seed, answer, world=2):
    """What the ranks report for 7.3 when every rank returns answer(l, c, n) of the global sums (no launch)."""
    from course_utils.checks.lesson07_ranks import cases_73
    obs = [{"rank": r, "results": []} for r in range(world)]
    for case in cases_73(seed, world):
        l, c, n = (sum(x[j] for x in case) for j in range(3))
        value = ["nan" if isinstance(v, float) and math.isnan(v) else v for v in answer(l, c, n)]
        for o in obs:
            o["results"].append({"collectives": 1, "collective_names": ["all_reduce"], "collective_devices": ["cpu"],
                                 "types": ["float", "float"], "value": value})
    return obs


@pytest.mark.parametrize("answer, prop, words", [
    # w11-07 w73_19: nan unless the global count is above 1
    (lambda l, c, n: (l / n if n else math.nan, c / n if n > 1 else math.nan),
     "returns the means of a job with one sample in all", "your accuracy came back nan with a global count of exactly 1"),
    # w11-07 w73_14: exact sums and division, then the result cast to float32
    (lambda l, c, n: (float(torch.tensor(l / n).float()), float(torch.tensor(c / n).float())) if n else
     (math.nan, math.nan), "is exact for large counts", "the result was cast to float32 afterwards"),
    # the division in float32 keeps its own message (the draw keeps the two apart on every seed)
    (lambda l, c, n: tuple(float(torch.tensor(v, dtype=torch.float32) / torch.tensor(n, dtype=torch.float32))
                           for v in (l, c)) if n else (math.nan, math.nan),
     "is exact for large counts", "the division ran in float32")])
def test_7_3_one_sample_and_float32_casts_are_named_on_many_seeds(answer, prop, words):
    """Judged on made-up observations (no launch), on 40 seeds."""
    for seed in range(40):
        with pytest.raises(lesson07.CheckFailed) as info:
            lesson07.judge_7_3(_obs_73(seed, answer), seed, "answer.py")
        message = info.value.sentence()
        assert f"'{prop}'" in message and words in message, f"seed {seed}: {message}"


def test_7_1_stub_and_wrong_type():
    def stub(*args, **kwargs):
        raise NotImplementedError("Exercise 7.1")
    assert run_check("7.1", stub).status == "not_implemented"
    assert run_check("7.1", [1, 2]).status == "fail"
    assert "a list of indices" in run_check("7.1", lambda *a, **k: "0,1").message


# == 7.2-7.4: the learners' files ===================================================================

HEADER_72 = '''
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from course_utils.train import train


def train_ddp(make_model, dataset, *, device, epochs, batch_size, lr, seed, checkpoint):
'''


def body_72(*, ddp="DDP(model)", train_model="ddp_model", sampler="DistributedSampler(dataset, shuffle=True, seed=seed)",
            loader_kwargs="sampler=sampler", set_epoch="sampler.set_epoch(epoch)", batch="batch_size", lr="lr",
            step="course", save_if="dist.get_rank() == 0", save_obj="model.state_dict()", barrier="dist.barrier()",
            barrier_in_if=False, load="torch.load(checkpoint, map_location=device)", load_into="model",
            returns="model", loss_scale="", make="make_model().to(device)"):
    """The source of one train_ddp, with one knob per mistake (the defaults are right)."""
    lines = [f"model = {make}",
             f"ddp_model = {ddp}",
             f"sampler = {sampler}",
             f"loader = DataLoader(dataset, batch_size={batch}, {loader_kwargs})",
             f"optimizer = torch.optim.SGD(ddp_model.parameters(), lr={lr})",
             "for epoch in range(epochs):",
             f"    {set_epoch}"]
    if step == "course":
        lines += [f"    train({train_model}, loader, device=device, optimizer=optimizer, epochs=1, progress=False)"]
    else:
        lines += ["    for x, y in loader:",
                  "        optimizer.zero_grad()",
                  f"        (F.cross_entropy({train_model}(x), y){loss_scale}).backward()",
                  "        optimizer.step()"]
    lines += [f"if {save_if}:", f"    torch.save({save_obj}, checkpoint)"]
    lines += [f"    {barrier}"] if barrier_in_if else [barrier]
    lines += [f"{load_into}.load_state_dict({load})", f"return {returns}"]
    return HEADER_72 + textwrap.indent("\n".join(lines) + "\n", "    ")



COURSE = """\
import importlib.util
from course_utils.launch import SCRIPTS
_spec = importlib.util.spec_from_file_location("course_answers", SCRIPTS / "ddp_exercises.py")
course = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(course)
"""


def wraps_course(header, call, *, tamper=False):
    """An answer that hands the work to the course's own (the lesson's fallback)."""
    pop = "    __import__('os').environ.pop('COURSE_GRADING_RANKS', None)\n" if tamper else ""
    return COURSE + header + pop + f"    return course.{call}\n"


ENV = "__import__('os').environ"
RIGHT_72 = {
    "solution": body_72(),
    "manual loop, returns ddp_model.module": body_72(step="manual", returns="ddp_model.module"),
    # GPU-right answers the check must keep accepting (x-07 v72 I, V)
    "map_location='cpu'": body_72(load="torch.load(checkpoint, map_location='cpu')"),
    "broadcast_object_list orders the ranks": body_72(barrier="dist.broadcast_object_list([None], src=0)"),
    "model.to(device=device)": body_72(make="make_model().to(device=device)"),
}
MUTANTS_72 = [
    (body_72(ddp="model", train_model="model"), "wraps the model in DistributedDataParallel"),        # right with 1 rank
    (body_72(train_model="model"), "ends training with the same weights on every rank"),
    (body_72(sampler="None", loader_kwargs="shuffle=True, generator=torch.Generator().manual_seed(seed)",
             set_epoch="pass"), "gives each rank its own shard of every epoch"),                    # right with 1 rank
    (body_72(set_epoch="pass"), "reshuffles the shards every epoch"),
    (body_72(set_epoch="sampler.set_epoch(epoch + 1)"),
     "shards like DistributedSampler(dataset, shuffle=True, seed=seed) with set_epoch(epoch)"),
    (body_72(sampler="DistributedSampler(dataset, shuffle=True)"),
     "shards like DistributedSampler(dataset, shuffle=True, seed=seed) with set_epoch(epoch)"),
    (body_72(batch="batch_size // dist.get_world_size()"), "uses batch_size per process"),
    (body_72(loader_kwargs="sampler=sampler, drop_last=True"), "trains `epochs` epochs over the rank's shard"),
    (body_72(step="manual", loss_scale=" / dist.get_world_size()"),
     "equals one process training on the concatenated batches"),      # right with 1 rank
    (body_72(lr="lr * dist.get_world_size()"), "equals one process training on the concatenated batches"),
    (body_72(save_if="True"), "only rank 0 writes the checkpoint"),                                  # right with 1 rank
    (body_72(barrier="pass"), "every rank waits for rank 0's checkpoint before loading it"),
    (body_72(barrier_in_if=True), "every rank waits for rank 0's checkpoint before loading it"),
    (body_72(save_obj="ddp_model.state_dict()", load_into="ddp_model"), "saves the plain model's state_dict"),
    (body_72(load="torch.load(checkpoint)"), "loads with map_location"),
    # the spec's "not the DDP wrapper" (the check used to unwrap it itself)
    (body_72(step="manual", returns="ddp_model"), "returns the model make_model() built, not the DDP wrapper"),
    # waiting by luck: a clock, or a file that exists before it is complete
    (body_72(barrier="__import__('time').sleep(2)"), "every rank waits for rank 0's checkpoint before loading it"),
    (body_72(barrier="while not __import__('os').path.exists(checkpoint): __import__('time').sleep(0.01)"),
     "every rank waits for rank 0's checkpoint before loading it"),
    (wraps_course(HEADER_72, "course_train_ddp(make_model, dataset, device=device, epochs=epochs, "
                             "batch_size=batch_size, lr=lr, seed=seed, checkpoint=checkpoint)"),
     "is your own code, not the course's implementation"),
    # right on one machine of CPU ranks, wrong on GPUs or on a second node (x-07 F1): graded as 2
    # nodes x 1 process, and the model's move to `device` recorded
    (body_72(make="make_model()"), "moves the model to `device` before wrapping it in DDP"),
    (body_72(save_if=f"int({ENV}['LOCAL_RANK']) == 0"), "only rank 0 writes the checkpoint"),
    (body_72(sampler=f"DistributedSampler(dataset, num_replicas=int({ENV}['LOCAL_WORLD_SIZE']), "
                     f"rank=int({ENV}['LOCAL_RANK']), shuffle=True, seed=seed)"),
     "gives each rank its own shard of every epoch"),
]
# GPU-right answers a CPU check cannot run (DDP refuses device_ids for a CPU module): an error that
# says why and what to write instead (x-07 F14)
ERRORS_72 = [
    (body_72(ddp="DDP(model, device_ids=[device.index])"), "leave device_ids out"),
    (body_72(ddp=f"DDP(model, device_ids=[int({ENV}['LOCAL_RANK'])])"), "In the check `device` is the CPU"),
]
# w4-07 w72_global_rank_device: cuda:RANK (the global rank) when CUDA is there, else the CPU, ignoring
# `device`: right on CPU ranks; the GPU pass (2 nodes of 1 GPU, device=cuda:0) sees rank 1 take cuda:1
MUTANTS_72.append((body_72(make="make_model().to(torch.device(f'cuda:{dist.get_rank()}') "
                                "if torch.cuda.is_available() else 'cpu')"),
                   "moves the model to `device` before wrapping it in DDP"))
# w5-07: graded as 2 nodes of 1 GPU only, `device` was cuda:0 on both ranks and a GPU written into
# the code passed (w72_22 .to('cuda:0'), w72_26 device_ids=[0]); a pass as one node of 2 GPUs
# (rank 1's device cuda:1) fails them. w72_16: the sampler's drop_last on a dataset one sample short
# of dividing; w72_14: the barrier only on the ranks other than 0
MUTANTS_72 += [
    (body_72(make="make_model().to('cuda:0' if device.type == 'cuda' else device)"),
     "moves the model to `device` before wrapping it in DDP"),
    (body_72(ddp="DDP(model, device_ids=[0] if device.type == 'cuda' else None)"),
     "gives DDP the rank's own GPU (device_ids=[device.index])"),
    (body_72(sampler="DistributedSampler(dataset, shuffle=True, seed=seed, drop_last=True)"),
     "gives each rank ceil(n / world_size) samples per epoch, as DistributedSampler pads them (drop_last=False)"),
    (body_72(barrier="if dist.get_rank() != 0: dist.barrier()"),
     "every rank calls the same collectives, in the same order"),
]
RIGHT_72["device_ids=[device.index] on a GPU"] = body_72(
    ddp="DDP(model, device_ids=[device.index] if device.type == 'cuda' else None)")
MESSAGES_72 = {     # mutants whose message must name what they did
    len(MUTANTS_72) - 4: "rank 1 moved the model to cuda:0: every rank's model would share GPU 0",
    len(MUTANTS_72) - 3: "its DDP got device_ids=[0]",
    len(MUTANTS_72) - 2: "drop_last=True?",
    len(MUTANTS_72) - 1: "that rank 0 never called",
    len(MUTANTS_72) - 5: "rank 1 moved the model to cuda:1, not to the `device` it was given",
    19: "nothing moved it to `device`",
    20: "ranks [0, 1] called torch.save",
    21: "trained on all",
}
# w6-07 w72_24: dist.barrier() only inside `if rank == 0:` is named as rank 0's barrier without a partner
assert MUTANTS_72[12][0] == body_72(barrier_in_if=True)
MESSAGES_72[12] = "rank 0's barrier has no partner"
# w6-07 w72_11: the global rank as the GPU index passed (only the one-node pass compared device_ids)
MUTANTS_72.append((body_72(ddp="DDP(model, device_ids=[dist.get_rank()] if device.type == 'cuda' else None)"),
                   "gives DDP the rank's own GPU (device_ids=[device.index])"))
MESSAGES_72[len(MUTANTS_72) - 1] = "its DDP got device_ids=[1]: on the second node that names a GPU the node does not have"
# w8-07 72_06: ddp_model.state_dict() saved and loaded into the plain model: torch's load_state_dict error
# came back as an [ERROR]; now a FAIL that names the 'module.' prefix. And the other way round: the plain
# model's state_dict loaded into the wrapper
MUTANTS_72.append((body_72(save_obj="ddp_model.state_dict()"), "saves the plain model's state_dict"))
MESSAGES_72[len(MUTANTS_72) - 1] = "the checkpoint's keys start with 'module.'"
MUTANTS_72.append((body_72(load_into="ddp_model"), "loads the checkpoint into the plain model"))
MESSAGES_72[len(MUTANTS_72) - 1] = "expects keys starting with 'module.'"
RIGHT_72["device_ids=[LOCAL_RANK] on a GPU"] = body_72(
    ddp=f"DDP(model, device_ids=[int({ENV}['LOCAL_RANK'])] if device.type == 'cuda' else None)")

HEADER_73 = '''
import math

import torch
import torch.distributed as dist


def collective_device():
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def finish(loss_sum, correct, count):
    return (math.nan, math.nan) if count == 0 else (loss_sum / count, correct / count)


def global_metrics(loss_sum, correct, count):
'''


def file_73(body):
    return HEADER_73 + textwrap.indent(textwrap.dedent(body), "    ")


SOLUTION_73 = file_73("""\
    totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
    dist.all_reduce(totals)
    loss_sum, correct, count = totals.tolist()
    if count == 0:
        return math.nan, math.nan
    return loss_sum / count, correct / count
""")
RIGHT_73 = {
    "solution": SOLUTION_73,
    "imported all_reduce, divided on the device": file_73("""\
        from torch.distributed import all_reduce
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
        all_reduce(totals)
        return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()      # 0 / 0 is nan in float64
    """),
    # GPU-right devices the nccl pass must accept (x-07 v73 j): the current device, and LOCAL_RANK's
    "device='cuda' under nccl": file_73("""\
        device = collective_device() if dist.get_backend() != "nccl" else "cuda"
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        return finish(*totals.tolist())
    """),
    "cuda:LOCAL_RANK under nccl": file_73("""\
        import os
        device = (collective_device() if dist.get_backend() != "nccl" else
                  torch.device("cuda", int(os.environ["LOCAL_RANK"])))
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        return finish(*totals.tolist())
    """),
}
MUTANTS_73 = [
    (file_73("""\
        means = torch.tensor([loss_sum / max(count, 1), correct / max(count, 1)], dtype=torch.float64,
                             device=collective_device())
        dist.all_reduce(means)
        return tuple((means / dist.get_world_size()).tolist())
    """), "weights each rank by its number of samples"),
    (file_73("""\
        return finish(loss_sum, correct, count)
    """), "every rank gets the same result"),                                               # right with 1 rank
    (file_73("""\
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
        dist.reduce(totals, dst=0)
        return finish(*totals.tolist())
    """), "every rank gets the same result"),
    (file_73("""\
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
        if dist.get_rank() == 0:
            dist.all_reduce(totals)
        return finish(*totals.tolist())
    """), "every rank makes the same collective calls"),
    (file_73("""\
        values = [torch.tensor([float(v)], dtype=torch.float64, device=collective_device())
                  for v in (loss_sum, correct, count)]
        for v in values:
            dist.all_reduce(v)
        return finish(*(v.item() for v in values))
    """), "makes exactly one collective call"),
    (file_73("""\
        from torch.distributed import all_reduce          # a name imported: the check still counts
        values = [torch.tensor([float(v)], dtype=torch.float64, device=collective_device())
                  for v in (loss_sum, correct, count)]
        for v in values:
            all_reduce(v)
        return finish(*(v.item() for v in values))
    """), "makes exactly one collective call"),
    (file_73("""\
        parts = [None] * dist.get_world_size()            # right values, two collectives and pickling
        dist.all_gather_object(parts, (loss_sum, correct, count))
        return finish(*(sum(p[i] for p in parts) for i in range(3)))
    """), "makes exactly one collective call"),
    (file_73("""\
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float32, device=collective_device())
        dist.all_reduce(totals)
        return finish(*totals.tolist())
    """), "is exact for large counts"),
    (file_73("""\
        totals = torch.tensor([loss_sum / max(count, 1) * count, correct / max(count, 1) * count, count],
                              dtype=torch.float64, device=collective_device())
        dist.all_reduce(totals)
        loss_sum, correct, count = totals.tolist()
        return loss_sum / count, correct / count
    """).replace("max(count, 1)", "count"), "works when a rank has no samples"),
    (file_73("""\
        totals = torch.tensor([loss_sum, correct], dtype=torch.float64, device=collective_device())
        dist.all_reduce(totals)
        return tuple((totals / (max(count, 1) * dist.get_world_size())).tolist())
    """), "every rank gets the same result"),
    (file_73("""\
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.int64, device=collective_device())
        dist.all_reduce(totals)
        return finish(*totals.tolist())
    """), "returns the global mean loss and accuracy"),
    (file_73("""\
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
        dist.all_reduce(totals)
        loss_sum, correct, count = totals.tolist()
        return finish(loss_sum / dist.get_world_size(), correct, count)
    """), "returns the global mean loss and accuracy"),
    # the spec's "Python floats": 0-d tensors are not
    (file_73("""\
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
        dist.all_reduce(totals)
        return totals[0] / totals[2], totals[1] / totals[2]
    """), "returns two Python floats"),
    # the spec's hole, now stated: nobody has a sample
    (file_73("""\
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
        dist.all_reduce(totals)
        loss_sum, correct, count = totals.tolist()
        return loss_sum / count, correct / count
    """), "returns (nan, nan) when no rank has a sample"),
    (file_73("""\
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
        dist.all_reduce(totals)
        loss_sum, correct, count = totals.tolist()
        return (0.0, 0.0) if count == 0 else (loss_sum / count, correct / count)
    """), "returns (nan, nan) when no rank has a sample"),
    # right on gloo's CPU ranks, wrong under nccl: the tensor left in host memory
    (file_73("""\
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64)
        dist.all_reduce(totals)
        return finish(*totals.tolist())
    """), "puts the tensor it reduces on collective_device()"),
    (file_73("""\
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device="cpu")
        dist.all_reduce(totals)
        return finish(*totals.tolist())
    """), "puts the tensor it reduces on collective_device()"),
    (file_73("""\
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device="cuda")
        dist.all_reduce(totals)
        return finish(*totals.tolist())
    """), "puts the tensor it reduces on collective_device()"),
    # counts summed exactly in int64, then divided in torch (in float32): told so, not "reduce in float64"
    (file_73("""\
        losses = torch.tensor([loss_sum], dtype=torch.float64, device=collective_device())
        counts = torch.tensor([correct, count], dtype=torch.int64, device=collective_device())
        dist.all_reduce(losses)
        dist.all_reduce(counts)
        if counts[1] == 0:
            return math.nan, math.nan
        return (losses[0] / counts[1]).item(), (counts[0] / counts[1]).item()
    """), "is exact for large counts"),
    (wraps_course(HEADER_73, "course_global_metrics(loss_sum, correct, count)"),
     "is your own code, not the course's implementation"),
    (wraps_course(HEADER_73, "course_global_metrics(loss_sum, correct, count)", tamper=True),
     "is your own code, not the course's implementation"),
    # right with one GPU per node, wrong with several (x-07 F2): the nccl pass runs as the second
    # node of 2 x 2 GPUs, each rank on its own virtual GPU
    (file_73("""\
        device = collective_device() if dist.get_backend() != "nccl" else torch.device("cuda", 0)
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        return finish(*totals.tolist())
    """), "puts the tensor on this rank's own GPU, cuda:LOCAL_RANK"),
    (file_73("""\
        device = collective_device() if dist.get_backend() != "nccl" else torch.device("cuda", dist.get_rank())
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        return finish(*totals.tolist())
    """), "puts the tensor on this rank's own GPU, cuda:LOCAL_RANK"),
]
MUTANTS_73 += [
    # w4-07 w73_int_division: the accuracy by integer division (an int, truncated)
    (file_73("""\
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
        dist.all_reduce(totals)
        loss_sum, correct, count = totals.tolist()
        return (math.nan, math.nan) if count == 0 else (loss_sum / count, int(correct) // int(count))
    """), "returns two Python floats"),
    # w4-07 w73_local_nan: nan on the rank without samples, before (and instead of) the collective
    (file_73("""\
        if count == 0:
            return math.nan, math.nan
        totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
        dist.all_reduce(totals)
        return finish(*totals.tolist())
    """), "every rank gets the same result"),
]
MESSAGES_73 = {     # mutants whose message must name what they did
    len(MUTANTS_73) - 2: "integer division (//)",
    len(MUTANTS_73) - 1: "the ranks fell out of step",
    7: "reduce in float64",                  # the float32 reduction keeps its hint
    10: "an integer tensor (int64) truncates the float loss_sum",     # w3-07 w73_09: no hint before
    11: "divided by the number of ranks",                             # w3-07 w73_11
    15: "No backend type associated with device type cpu",
    21: "but backend constrained to cuda:1",
    22: "but backend constrained to cuda:0",    # machines of 4 GPUs since w7-07: cuda:2 exists, not this rank's
    18: "the division ran in float32",       # ... and the exact int64 sums divided in float32 get their own
}

HEADER_74 = '''
import contextlib

import torch
import torch.distributed as dist


def accumulate(ddp_model, micro_batches, loss_fn):
'''


def body_74(*, zero=True, quiet="i < len(micro_batches) - 1", weight="len(x) / total", extra="", forward="ddp_model",
            returned="loss_total.item()", manual=False, step=False, read="loss.detach()"):
    lines = ["ddp_model.zero_grad(set_to_none=True)" if zero else "pass",
             "total = sum(len(x) for x, _ in micro_batches)",
             "loss_total, unweighted = 0.0, 0.0",
             "for i, (x, y) in enumerate(micro_batches):",
             f"    with ddp_model.no_sync() if {quiet} else contextlib.nullcontext():",
             f"        loss = loss_fn({forward}(x), y) * ({weight}){extra}",
             "        loss.backward()",
             f"    loss_total = loss_total + {read}",             # one read of the value, at the end
             f"    unweighted = unweighted + loss.detach() / ({weight}){extra}"]
    if manual:
        lines += ["for p in ddp_model.parameters():",
                  "    dist.all_reduce(p.grad)",
                  "    p.grad /= dist.get_world_size()"]
    if step:
        lines += ["torch.optim.SGD(ddp_model.parameters(), lr=0.1).step()"]
    lines += [f"return {returned}"]
    return HEADER_74 + textwrap.indent("\n".join(lines) + "\n", "    ")


RIGHT_74 = {"solution": body_74(),
            # w4-07's right answers: zero_grad keeping the tensors, and the forward inside no_sync with
            # its backward outside it (DDP decides in forward whether the coming backward all-reduces)
            "zero_grad(set_to_none=False)": body_74().replace("zero_grad(set_to_none=True)",
                                                              "zero_grad(set_to_none=False)"),
            "backward outside no_sync": HEADER_74 + textwrap.indent(textwrap.dedent("""\
                ddp_model.zero_grad(set_to_none=True)
                total = sum(len(x) for x, _ in micro_batches)
                running = 0.0
                for i, (x, y) in enumerate(micro_batches):
                    with ddp_model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext():
                        loss = loss_fn(ddp_model(x), y) * (len(x) / total)
                    loss.backward()
                    running = running + loss.detach()
                return float(running)
            """), "    ")}
MUTANTS_74 = [
    (body_74(quiet="False"), "all-reduces exactly once per call"),
    (body_74(quiet="True"), "all-reduces exactly once per call"),
    (body_74(quiet="i > 0"), "all-reduces in the last micro-batch's backward"),      # w3-07 w74_06: was the weighting
    (body_74(quiet="i < len(micro_batches) - 2"), "all-reduces exactly once per call"),
    (body_74(weight="1"), "leaves the big batch's gradient, averaged over the ranks"),
    (body_74(weight="1 / len(micro_batches)"), "leaves the big batch's gradient, averaged over the ranks"),
    (body_74(extra=" / dist.get_world_size()"), "leaves the big batch's gradient, averaged over the ranks"),  # right with 1 rank
    (body_74(zero=False), "starts from cleared gradients"),
    (body_74(quiet="True", manual=True), "all-reduces exactly once per call"),
    (body_74(forward="ddp_model.module"), "all-reduces exactly once per call"),
    (body_74(returned="(unweighted / len(micro_batches)).item()"), "returns this rank's loss over its whole batch"),
    (body_74(step=True), "takes no optimizer step"),
    (HEADER_74 + textwrap.indent(textwrap.dedent("""\
        ddp_model.zero_grad(set_to_none=True)
        total = sum(len(x) for x, _ in micro_batches)
        loss = sum(loss_fn(ddp_model(x), y) * (len(x) / total) for x, y in micro_batches)
        loss.backward()                       # one backward, one all-reduce, every activation kept
        return loss.item()
    """), "    "), "runs backward on each micro-batch before the next forward"),
    # the spec's "a float": a tensor is not
    (body_74(returned="loss_total"), "returns a Python float"),
    (body_74(returned="loss * 0 + loss_total.item()"), "returns a Python float"),
    # forward outside no_sync, backward inside: DDP has decided in forward
    (HEADER_74 + textwrap.indent(textwrap.dedent("""\
        ddp_model.zero_grad(set_to_none=True)
        total = sum(len(x) for x, _ in micro_batches)
        loss_total = 0.0
        for i, (x, y) in enumerate(micro_batches):
            loss = loss_fn(ddp_model(x), y) * (len(x) / total)
            with ddp_model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext():
                loss.backward()
            loss_total += loss.item()
        return loss_total
    """), "    "), "all-reduces exactly once per call"),
    # the global mean, by counting every rank's samples: a collective too many (and not what DDP averages)
    (body_74(weight="len(x) * dist.get_world_size() / everyone").replace(
        "    loss_total, unweighted = 0.0, 0.0\n",
        "    loss_total, unweighted = 0.0, 0.0\n    n = torch.tensor([float(total)])\n    dist.all_reduce(n)\n"
        "    everyone = n.item()\n"), "all-reduces exactly once per call"),
]
MUTANTS_74.append((wraps_course(HEADER_74, "course_accumulate(ddp_model, micro_batches, loss_fn)"),
                   "is your own code, not the course's implementation"))
# w3-07 w74_12: a step that changes nothing (lr=0) passed: the step itself is what the contract forbids
MUTANTS_74.append((body_74(step=True).replace("lr=0.1", "lr=0.0"), "takes no optimizer step"))
# w4-07 w74_one_big_forward: the micro-batches joined into one forward and one backward
MUTANTS_74.append((HEADER_74 + textwrap.indent(textwrap.dedent("""\
    ddp_model.zero_grad(set_to_none=True)
    x = torch.cat([x for x, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    loss = loss_fn(ddp_model(x), y)
    loss.backward()
    return loss.item()
"""), "    "), "runs backward on each micro-batch before the next forward"))
# w4-07 w74_item_per_micro: a value read per micro-batch (a wait for the GPU each); and float() per micro-batch
MUTANTS_74.append((body_74(read="loss.item()", returned="float(loss_total)"),
                   "reads the loss from the device once per call"))
MUTANTS_74.append((body_74(read="float(loss)", returned="float(loss_total)"),
                   "reads the loss from the device once per call"))
MESSAGES_74 = {len(MUTANTS_74) - 2: "costs a wait per micro-batch", len(MUTANTS_74) - 1: "__float__ at line",
               len(MUTANTS_74) - 3: "one forward over the micro-batches joined together",
               15: "forward pass ran outside no_sync and its backward inside it",
               2: "the one backward that all-reduced was micro-batch 1's",
               len(MUTANTS_74) - 4: "called SGD.step()"}

# w5-07 w74_11: a detached tensor returned: the hint no longer says it holds the graph; one that does, says so
MESSAGES_74[next(i for i, (src, _) in enumerate(MUTANTS_74) if src == body_74(returned="loss_total"))] = \
    "returned a Tensor (detached)"
MESSAGES_74[next(i for i, (src, _) in enumerate(MUTANTS_74)
                 if src == body_74(returned="loss * 0 + loss_total.item()"))] = "returned a Tensor that still holds the graph"
# w5-07 w74_15: the running loss summed without detach, read once with .item(): harmless (backward freed
# the saved activations; the kept autograd nodes are small), accepted
RIGHT_74["running loss not detached"] = body_74(read="loss")
# w5-07 w73_12: a tensor kept between calls (at module level) and added to: every later call's totals
# carry the earlier ones
MUTANTS_73.append((file_73("""\
    global _T
    if "_T" not in globals():
        _T = torch.zeros(3, dtype=torch.float64, device=collective_device())
    _T += torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=_T.device)
    dist.all_reduce(_T)
    l, c, n = _T.tolist()
    return (l / n, c / n) if n else (math.nan, math.nan)
""").replace("def global_metrics", "_T = None\n\n\ndef global_metrics").replace(
    'if "_T" not in globals():', "if _T is None:"), "computes each call from its own arguments (nothing kept between calls)"))
MESSAGES_73[len(MUTANTS_73) - 1] = "a tensor kept between calls"
# w6-07 w73_12: async_op=True and no .wait(): named as the un-awaited handle, not as a missing reduce
MUTANTS_73.append((file_73("""\
    t = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, async_op=True)
    return finish(*t.tolist())
"""), "waits for the all-reduce before reading its result"))
MESSAGES_73[len(MUTANTS_73) - 1] = "returns a handle (a Work) that nothing waits on"
RIGHT_73["async_op=True, then wait()"] = file_73("""\
    t = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, async_op=True).wait()
    return finish(*t.tolist())
""")
# w6-07 w74_18: F.cross_entropy(reduction='sum') / total in place of the loss_fn given: the check's loss_fn
# is label-smoothed, so ignoring it shows
MUTANTS_74.append((body_74().replace("loss_fn(ddp_model(x), y) * (len(x) / total)",
                                     "torch.nn.functional.cross_entropy(ddp_model(x), y, reduction='sum') / total"),
                   "uses the loss_fn it is given"))
MESSAGES_74[len(MUTANTS_74) - 1] = "the check's loss_fn is cross-entropy with label_smoothing"
# w6-07 w74_10: every forward first, then a backward per loss: the hint names both orders, not only a sum
MUTANTS_74.append((HEADER_74 + textwrap.indent(textwrap.dedent("""\
    ddp_model.zero_grad(set_to_none=True)
    total = sum(len(x) for x, _ in micro_batches)
    losses = []
    with ddp_model.no_sync():
        for x, y in micro_batches[:-1]:
            losses.append(loss_fn(ddp_model(x), y) * (len(x) / total))
    x, y = micro_batches[-1]
    losses.append(loss_fn(ddp_model(x), y) * (len(x) / total))
    with ddp_model.no_sync():
        for loss in losses[:-1]:
            loss.backward()
    losses[-1].backward()
    return float(sum(loss.detach() for loss in losses))
"""), "    "), "runs backward on each micro-batch before the next forward"))
MESSAGES_74[len(MUTANTS_74) - 1] = "kept and each given its own backward afterwards"
# w7-07 w74_13: every backward with retain_graph=True and the running loss not detached: the right
# .grad and order (FBFB), but every micro-batch's saved activations stay alive; retain_graph alone
# keeps the previous one's during the next forward
MUTANTS_74.append((body_74(read="loss").replace("loss.backward()", "loss.backward(retain_graph=True)"),
                   "keeps one micro-batch's activations alive at a time"))
MESSAGES_74[len(MUTANTS_74) - 1] = "retain_graph=True"
MUTANTS_74.append((body_74().replace("loss.backward()", "loss.backward(retain_graph=True)"),
                   "keeps one micro-batch's activations alive at a time"))
MESSAGES_74[len(MUTANTS_74) - 1] = "were still in memory"
# w7-07 w74_18: the running total kept at module level between calls: named as state kept, not as the value
MUTANTS_74.append((body_74().replace("loss_total, unweighted = 0.0, 0.0",
                                     "global _total\n    loss_total, unweighted = _total, 0.0").replace(
    "return loss_total.item()", "_total = loss_total\n    return loss_total.item()").replace(
    "def accumulate", "_total = 0.0\n\n\ndef accumulate"),
    "computes each call from its own arguments (nothing kept between calls)"))
MESSAGES_74[len(MUTANTS_74) - 1] = "the running total lives on between calls"
# w7-07 w72_23: device_ids=[torch.cuda.current_device()]: right where the rank's setup called
# torch.cuda.set_device(LOCAL_RANK), as the lesson's does (and w6-07's grey .to('cuda') relies on the same)
RIGHT_72["device_ids=[current_device()] on a GPU"] = body_72(
    ddp="DDP(model, device_ids=[torch.cuda.current_device()] if device.type == 'cuda' else None)")
# w7-07 w72_21: the device taken from LOCAL_RANK on a GPU (what torchrun's setup binds each rank to): right
RIGHT_72["device from LOCAL_RANK on a GPU"] = body_72(
    make=f"make_model().to(torch.device('cuda', int({ENV}.get('LOCAL_RANK', 0))) if torch.device(device).type == "
         "'cuda' else device)",
    ddp=f"DDP(model, device_ids=[int({ENV}.get('LOCAL_RANK', 0))] if torch.device(device).type == 'cuda' else None)")
# w7-07 w73_17: cuda:{rank % device_count()}: the local rank only with one process per GPU; the pass as
# under nccl runs 2 processes on machines of 4 GPUs, where global rank 2 would take cuda:2
MUTANTS_73.append((file_73("""\
    device = collective_device() if dist.get_backend() != "nccl" else \\
        torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
    totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    return finish(*totals.tolist())
"""), "puts the tensor on this rank's own GPU, cuda:LOCAL_RANK"))
MESSAGES_73[len(MUTANTS_73) - 1] = "is the local rank only when every node runs one process per GPU"

# w9-07 w73_14: every rank all-reduces, then the rank without samples returns nan from its own count:
# named as joined (not w4-07's "without joining the all-reduce")
MUTANTS_73.append((file_73("""\
    totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
    dist.all_reduce(totals)
    total_loss, total_correct, n = totals.tolist()
    if count == 0:
        return math.nan, math.nan
    return total_loss / n, total_correct / n
"""), "every rank gets the same result"))
MESSAGES_73[len(MUTANTS_73) - 1] = "joined the all-reduce, then returned nan from its own count"
# w9-07 w73_12: all_reduce with ReduceOp.AVG: every sum divided by the world size, so the ratios are the
# same (an extra rounding at most, within the check's tolerance): right
RIGHT_73["ReduceOp.AVG"] = file_73("""\
    totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
    dist.all_reduce(totals, op=dist.ReduceOp.AVG)
    return finish(*totals.tolist())
""")
# w9-07 w74_13: every micro-batch but the last forwarded through ddp_model.module (DDP's forward skipped,
# so its backward does not all-reduce), no no_sync(): on this plain model (no buffers) the same .grad and
# one all-reduce; the contract names no_sync() as the supported way and what the module route skips
RIGHT_74["forward through .module, not no_sync"] = HEADER_74 + textwrap.indent(textwrap.dedent("""\
    ddp_model.zero_grad(set_to_none=True)
    total = sum(len(x) for x, _ in micro_batches)
    running = 0.0
    last = len(micro_batches) - 1
    for i, (x, y) in enumerate(micro_batches):
        model = ddp_model.module if i < last else ddp_model
        loss = loss_fn(model(x), y) * (len(x) / total)
        loss.backward()
        running = running + loss.detach()
    return float(running)
"""), "    ")
# w10-07 w72_11: the model moved to cuda:current_device(), not to `device`: the same device wherever the
# launcher called torch.cuda.set_device(LOCAL_RANK), as the course's does and as `device` is derived (7.3's
# collective_device() relies on the same); the pass message now says "the rank's own device", true for both
RIGHT_72["model on cuda:current_device() on a GPU"] = body_72(
    make="make_model().to(torch.device('cuda', torch.cuda.current_device()) if device.type == 'cuda' else device)",
    ddp="DDP(model, device_ids=[torch.cuda.current_device()] if device.type == 'cuda' else None)")
# w10-07 w72_12: the writer chosen by LOCAL_RANK == 0: the message says LOCAL_RANK is 0 on every node
MESSAGES_72[20] = "LOCAL_RANK is 0 on every node"
# w10-07 w73_10: one all_reduce, then three .item() reads of its tensor: right. The contract asks for one
# collective, not one read; on a GPU the first .item() waits for the all-reduce and the next two copy 8 bytes
# each from an idle stream (microseconds), once per evaluation, not per step as 7.4's loss read is
RIGHT_73[".item() per value"] = file_73("""\
    t = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
    dist.all_reduce(t)
    n = t[2].item()
    if n == 0:
        return math.nan, math.nan
    return t[0].item() / n, t[1].item() / n
""")
# w10-07 w73_03: two all_reduces (the loss in float64, the counts in int64): the hint names the two calls,
# not all_gather_object; w10-07 w73_11: dtype=torch.float read as Python's float: the hint says it is float32
MUTANTS_73.append((file_73("""\
    loss = torch.tensor([loss_sum], dtype=torch.float64, device=collective_device())
    counts = torch.tensor([correct, count], dtype=torch.int64, device=collective_device())
    dist.all_reduce(loss)
    dist.all_reduce(counts)
    c, n = counts.tolist()
    return finish(loss.item(), c, n)
"""), "makes exactly one collective call"))
MESSAGES_73[len(MUTANTS_73) - 1] = "your 2 calls (all_reduce, all_reduce) are 2 round trips"
MUTANTS_73.append((file_73("""\
    totals = torch.tensor([loss_sum, correct, count], dtype=torch.float, device=collective_device())
    dist.all_reduce(totals)
    return finish(*totals.tolist())
"""), "is exact for large counts"))
MESSAGES_73[len(MUTANTS_73) - 1] = "torch.float is float32, not Python's float"
# w10-07 w74_15: the last forward inside no_sync, its backward outside: no all-reduce, named as the forward
MUTANTS_74.append((HEADER_74 + textwrap.indent(textwrap.dedent("""\
    ddp_model.zero_grad(set_to_none=True)
    total = sum(len(x) for x, _ in micro_batches)
    run = 0.0
    with ddp_model.no_sync():
        for x, y in micro_batches[:-1]:
            loss = loss_fn(ddp_model(x), y) * (len(x) / total)
            loss.backward()
            run = run + loss.detach()
        x, y = micro_batches[-1]
        last = loss_fn(ddp_model(x), y) * (len(x) / total)
    last.backward()
    run = run + last.detach()
    return float(run)
"""), "    "), "all-reduces exactly once per call"))
MESSAGES_74[len(MUTANTS_74) - 1] = "forward pass ran inside no_sync and its backward outside it"

# w11-07 w73_19: nan when the global count is not above 1 ('> 1' for '> 0'): passed while no case had a
# total of exactly one sample; the case "one sample in all" fails it on every seed, and names the count
MUTANTS_73.append((file_73("""\
    t = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
    dist.all_reduce(t)
    l, c, n = t.tolist()
    return (l / n if n else math.nan, c / n if n > 1 else math.nan)
"""), "returns the means of a job with one sample in all"))
MESSAGES_73[len(MUTANTS_73) - 1] = "your accuracy came back nan with a global count of exactly 1 sample"
BOTH_SEEDS.add(("7.3", len(MUTANTS_73) - 1))
# w11-07 w73_14: reduced and divided in float64, then the result cast to float32: was told "reduce in float64"
MUTANTS_73.append((file_73("""\
    t = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
    dist.all_reduce(t)
    if t[2].item() == 0:
        return math.nan, math.nan
    r = (t[:2] / t[2]).float().tolist()
    return r[0], r[1]
"""), "is exact for large counts"))
MESSAGES_73[len(MUTANTS_73) - 1] = "the result was cast to float32 afterwards"
BOTH_SEEDS.add(("7.3", len(MUTANTS_73) - 1))

# w11-07 w74_13: the old .grad halved (mul_(0.5)) instead of cleared: was told to weight each micro-batch's loss
MUTANTS_74.append((body_74().replace(
    "ddp_model.zero_grad(set_to_none=True)",
    "for p in ddp_model.parameters():\n        if p.grad is not None:\n            p.grad.mul_(0.5)"),
    "starts from cleared gradients"))
MESSAGES_74[len(MUTANTS_74) - 1] = "0.5 of that leftover gradient is still in .grad (scaled, not cleared)"

EXERCISES = {
    "7.2": ("train_ddp", RIGHT_72, MUTANTS_72, lesson07.judge_7_2),
    "7.3": ("global_metrics", RIGHT_73, MUTANTS_73, lesson07.judge_7_3),
    "7.4": ("accumulate", RIGHT_74, MUTANTS_74, lesson07.judge_7_4),
}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """Every right answer and mutant of 7.2-7.4, on every seed, in ONE torchrun launch; returns
    {(exercise, name, seed): CheckResult-like (status, message)}. The launch goes through a
    torchrun without --log-line-prefix-template, as torch 2.11's (the GPU box's) is: the checks
    graded 1 of 4 there while the launcher passed that option."""
    folder = tmp_path_factory.mktemp("lesson07-files")
    jobs, keys = [], []
    for ex, (function, right, mutants, _) in EXERCISES.items():
        candidates = list(right.items()) + [(f"mutant{i}", src) for i, (src, _) in enumerate(mutants)]
        if ex == "7.2":
            candidates += [(f"error{i}", src) for i, (src, _) in enumerate(ERRORS_72)]
        for name, source in candidates:
            path = folder / f"{ex.replace('.', '_')}_{name.replace(' ', '_').replace(',', '')}.py"
            path.write_text(source)
            for seed in seeds_for(ex, name):
                jobs.append({"exercise": ex, "file": str(path), "function": function, "seed": seed, "timeout_s": 10})
                keys.append((ex, name, seed, path))
    with pytest.MonkeyPatch.context() as mp:
        use_old_torchrun(mp)
        assert not launch.torchrun_accepts("--log_line_prefix_template")
        observations = lesson07.run_rank_jobs(jobs, timeout_s=600)
    out = {}
    for (ex, name, seed, path), obs in zip(keys, observations):
        judge = EXERCISES[ex][3]
        try:
            out[(ex, name, seed)] = ("pass", judge(obs, seed, path))
        except lesson07.CheckFailed as exc:
            out[(ex, name, seed)] = ("fail", exc.sentence())
        except NotImplementedError:
            out[(ex, name, seed)] = ("not_implemented", "")
        except Exception as exc:
            out[(ex, name, seed)] = ("error", f"{type(exc).__name__}: {exc}")
    return out


RIGHT_CASES = [(ex, name) for ex, (_, right, _, _) in EXERCISES.items() for name in right]
MUTANT_CASES = [(ex, f"mutant{i}", prop) for ex, (_, _, mutants, _) in EXERCISES.items()
                for i, (_, prop) in enumerate(mutants)]


@pytest.mark.parametrize("ex, name", RIGHT_CASES, ids=[f"{e}-{n}" for e, n in RIGHT_CASES])
def test_right_answers_pass_on_every_seed(verdicts, ex, name):
    for seed in seeds_for(ex, name):
        status, message = verdicts[(ex, name, seed)]
        assert status == "pass", f"seed {seed}: {message}"


@pytest.mark.parametrize("ex, name, prop", MUTANT_CASES, ids=[f"{e}-{n}" for e, n, _ in MUTANT_CASES])
def test_mutants_fail_on_the_right_property_on_every_seed(verdicts, ex, name, prop):
    said = {"7.2": MESSAGES_72, "7.3": MESSAGES_73, "7.4": MESSAGES_74}.get(ex, {}).get(int(name.removeprefix("mutant")))
    for seed in seeds_for(ex, name):
        status, message = verdicts[(ex, name, seed)]
        assert status == "fail", f"seed {seed}: {status}: {message}"
        assert f"'{prop}'" in message, f"seed {seed}: {message}"
        if said:
            assert said in message, f"seed {seed}: the message should say {said!r}: {message}"


@pytest.mark.parametrize("index", range(len(ERRORS_72)))
def test_7_2_device_ids_for_a_gpu_is_an_error_that_says_why(verdicts, index):
    for seed in seeds_for("7.2", f"error{index}"):
        status, message = verdicts[("7.2", f"error{index}", seed)]
        assert status == "error" and ERRORS_72[index][1] in message, f"seed {seed}: {status}: {message}"


def test_at_least_eight_mutants_per_exercise():
    assert len(MUTANTS_71) >= 8
    for ex, (_, _, mutants, _) in EXERCISES.items():
        assert len(mutants) >= 8, ex


def test_stubs_and_wrong_objects_need_no_launch(tmp_path):
    """A stub is 'not implemented' without starting any process; wrong objects get a sentence.
    (The notebook tests run each check end to end on the lesson's solutions.)"""
    stub = tmp_path / "stub.py"
    stub.write_text(HEADER_72 + '    """doc"""\n    # YOUR CODE HERE\n    raise NotImplementedError("Exercise 7.2")\n')
    result = run_check("7.2", stub)
    assert result.status == "not_implemented" and result.seconds < 2, result
    missing = run_check("7.3", tmp_path / "missing.py")
    assert missing.status == "fail" and "run the exercise's `%%writefile` cell first" in missing.message
    assert "expected the path of your exercise file" in run_check("7.4", 3).message
    broken = tmp_path / "broken.py"
    broken.write_text("def accumulate(:\n")
    result = run_check("7.4", broken)
    assert result.status == "error" and "syntax error at line 1" in result.message
    renamed = tmp_path / "renamed.py"
    renamed.write_text("def accumulate_gradients(ddp_model, micro_batches, loss_fn):\n    return 0.0\n")
    assert "defines accumulate()" in run_check("7.4", renamed).message


def test_the_lesson_removes_its_work_folder_when_the_kernel_stops(tmp_path):
    """Lesson 07 writes the exercise files, the tar shards (16 MB) and checkpoints into WORK: the
    folder goes when the kernel's interpreter exits, normally or after an error (dozens of
    /tmp/lesson07-* were left behind by mkdtemp)."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    cells = json.loads((Path(__file__).parents[2] / "solutions" / "07-distributed-data-parallel.ipynb").read_text())
    source = "".join("".join(c["source"]) for c in cells["cells"] if c["cell_type"] == "code")
    assert "mkdtemp(" not in source
    lines = [line for line in source.splitlines() if "_WORK = " in line or line.startswith("WORK = ")]
    for ending in ("", "raise RuntimeError('a cell failed')"):
        program = "\n".join(["import tempfile", "from pathlib import Path", *lines,
                             "(WORK / 'shards').mkdir()", "print(WORK)", ending])
        run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                             env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
        folder = Path(run.stdout.strip())
        assert folder.parent == tmp_path and not folder.exists(), (run.stdout, run.stderr)
