"""Check 7.5 (shards for every rank and worker): the right answers pass, each mutant fails on its
property on every seed, the stub is 'not implemented'. Every answer x seed is one job of ONE
torchrun launch with 2 gloo ranks (`run_rank_jobs`), judged by `judge_7_5`, as the check does;
one test goes through `check()` itself."""
import pytest

from course_utils.checks import lesson07, run_check

SEEDS = [5, 1234]            # right answers, in the launch
MORE_SEEDS = [0, 2, 3, 11, 77, 4321]     # every mutant, in this process (the simulator below)


def seeds_for(name):
    """In the launch, a mutant runs on one seed (alternately): its fate does not depend on the seed,
    and the in-process simulator tries it on MORE_SEEDS besides. The solution and the padding answer
    run on both; the other right answers, variants of the solution, on one."""
    if name.startswith("mutant"):
        return [SEEDS[int(name.removeprefix("mutant")) % 2]]
    return SEEDS if name in ("solution", "padding") else [SEEDS[len(name) % 2]]

HEADER = '''"""Exercise 7.5"""
import math

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info


class ShardStream(IterableDataset):
    def __init__(self, shard_sizes, batch_size, *, seed=0):
        self.shard_sizes = [int(n) for n in shard_sizes]
        self.batch_size = int(batch_size)
        self.seed = seed
        self.epoch, self.start = 0, 0
        self.rank, self.world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)

    def set_epoch(self, epoch, start=0):
        self.epoch, self.start = epoch, start

    def __iter__(self):
'''


def answer(*, order="seeded", rank_part="contiguous", last="drop", workers="runs", resume="rotated",
           epoch_used=True, rank_from="init", batch=None):
    """The ShardStream source with one knob per mistake (the defaults are right)."""
    e = "self.epoch" if epoch_used else "0"
    b = batch or "self.batch_size"
    rank = {"init": "self.rank, self.world_size",
            "iter": "dist.get_rank(), dist.get_world_size()",
            "iter_or_0": "(dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)"}[rank_from]
    lines = [f"rank, world = {rank}",
             "info = get_worker_info()",
             "worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)",
             "n = sum(self.shard_sizes)",
             f"rng = np.random.default_rng([self.seed, {e}])"]
    if order in ("seeded", "samples"):
        lines.append("order = rng.permutation(len(self.shard_sizes)).tolist()")
    elif order == "global":
        lines.append("order = torch.randperm(len(self.shard_sizes)).tolist()")
    lines.append("stream = [(int(s), i) for s in order for i in range(self.shard_sizes[s])]")
    if order == "samples":       # every sample shuffled: each rank then reads from every shard
        lines.append("stream = [stream[j] for j in rng.permutation(n)]")
    if last in ("drop", "drop_more", "drop_fixed", "drop_at_start", "drop_by_parity"):
        k = f"n // (world * {b}) - 1" if last == "drop_more" else f"n // (world * {b})"
        lines.append(f"k = {k}")
        if last == "drop_fixed":        # the same samples left out every epoch: the dataset's last ones
            lines += [f"keep = set(sorted((s, i) for s in range(len(self.shard_sizes)) "
                      f"for i in range(self.shard_sizes[s]))[:k * world * {b}])",
                      "stream = [p for p in stream if p in keep]", "offset = 0"]
        elif last == "drop_at_start":     # the cut always at the stream's start (w4-07 w75_fixed_offset)
            lines.append("offset = 0")
        elif last == "drop_by_parity":    # 0 in even epochs, the most in odd ones (w4-07 w75_tail_always_dropped)
            lines.append(f"offset = 0 if {e} % 2 == 0 else n - k * world * {b}")
        else:
            lines.append(f"offset = int(rng.integers(0, n - k * world * {b} + 1))")
        if rank_part == "contiguous":
            lines.append(f"mine = stream[offset + rank * k * {b}:offset + (rank + 1) * k * {b}]")
        elif rank_part == "none":
            lines.append(f"mine = stream[offset:offset + k * {b}]")
        elif rank_part == "whole_shards":
            lines += ["mine = [(s, i) for s in order[rank::world] for i in range(self.shard_sizes[s])]",
                      f"k = len(mine) // {b}"]
    else:                               # pad: wrap around the stream
        k = f"math.ceil(n / (world * {b}))" + (" + 1" if last == "pad_more" else "")
        lines += [f"k = {k}", f"mine = [stream[j % n] for j in range(rank * k * {b}, (rank + 1) * k * {b})]"]
    lines.append(f"batches = [mine[j * {b}:(j + 1) * {b}] for j in range(k)]")
    if workers == "runs":
        lines += ["counts = [k // workers + (w < k % workers) for w in range(workers)]",
                  "role = (worker + self.start) % workers" if resume == "rotated" else "role = worker",
                  "lo = sum(counts[:role])",
                  "done = min(counts[role], max(0, -(-(self.start - role) // workers)))"
                  if resume != "ignored" else "done = 0",
                  "yield from batches[lo + done:lo + counts[role]]"]
    elif workers == "strided":
        lines.append("yield from batches[self.start:][worker::workers]")
    elif workers == "none":
        lines.append("yield from batches[self.start:]")
    elif workers == "whole_shards":      # the rank's shards dealt to its workers
        lines += ["shards = sorted({s for s, _ in mine}, key=[s for s, _ in mine].index)[worker::workers]",
                  "yield from [x for x in batches[self.start:] if x and x[0][0] in shards]"]
    return HEADER + "".join(f"        {line}\n" for line in lines)


RIGHT = {"solution": answer(),
         "padding": answer(last="pad"),
         # w4-07's right answer: the epoch advanced inside __iter__ (every use calls set_epoch first, which
         # overwrites it). (Its other one, a generator seeded with seed + epoch, is a mutant since w11-07)
         "epoch advanced in __iter__": answer() + "        self.epoch += 1\n",
         "tensor batches": answer().replace("yield from batches[lo + done:lo + counts[role]]",
                                            "for x in batches[lo + done:lo + counts[role]]:\n"
                                            "            yield torch.tensor(x)")}

MUTANTS = [
    (answer(workers="strided"), "each worker reads its own stretch of the rank's shards"),   # the 3.4x
    (answer(rank_from="iter"), "reads the rank and world size in the main process"),        # raises under spawn
    (answer(rank_from="iter_or_0"), "reads the rank and world size in the main process"),   # rank 0 of 1 there
    (answer(workers="none"), "every sample exactly once per epoch, but for the padding"),   # workers repeat
    (answer(rank_part="none"), "every sample at least once per epoch"),                      # ranks read the same
    (answer(rank_part="whole_shards"), "every rank and every worker gets samples"),          # one shard, two ranks
    (answer(workers="whole_shards"), "every rank and every worker gets samples"),            # one shard, two workers
    (answer(epoch_used=False), "a different split every epoch"),
    (answer().replace("        rank, world = self.rank, self.world_size\n",
                      "        rank, world = self.rank, self.world_size\n"
                      "        if getattr(self, '_kept', None) is not None:\n"
                      "            yield from self._kept\n"
                      "            return\n", 1)
     .replace("        yield from batches[lo + done:lo + counts[role]]\n",
              "        self._kept = batches[lo + done:lo + counts[role]]\n"
              "        yield from self._kept\n"), "a different split every epoch"),    # state kept between calls
    (answer(last="drop_more"), "drops fewer than world_size x batch_size samples"),
    (answer(last="pad_more"), "pads fewer than world_size x batch_size samples"),
    (answer(last="drop_fixed"), "drops other samples every epoch"),
    (answer(last="drop_at_start"), "drops other samples every epoch", "never came in"),
    (answer(last="drop_by_parity"), "drops other samples every epoch", "alternate between two sets"),
    (answer(resume="ignored"), "resumes where it stopped"),                                  # restarts the epoch
    (answer(resume="unrotated"), "resumes where it stopped"),                                # worker 0 first again
    (answer(order="global"), "a different split every epoch, drawn from (seed, epoch) alone",
     "did not compute the same plan"),                                                      # unseeded: ranks disagree
    (answer(order="samples"), "each rank reads only its part of the shards"),
    (answer(batch="(self.batch_size - 1)"), "every batch holds batch_size samples"),
    (answer().replace("yield from batches[lo + done:lo + counts[role]]",
                      "yield from [x[:-1] if j == 0 else x for j, x in enumerate(batches[lo + done:lo + counts[role]])]"),
     "every batch holds batch_size samples"),                                               # one batch short
    # w3-07 w75_10: the generator made once and kept on the object (each worker's copy starts it afresh)
    (answer().replace("rng = np.random.default_rng([self.seed, self.epoch])",
                      "self._rng = getattr(self, '_rng', None) or np.random.default_rng(self.seed)\n"
                      "        rng = self._rng"), "a different split every epoch", "something kept between calls"),
]

SOLUTION_OFFSET = "offset = int(rng.integers(0, n - k * world * self.batch_size + 1))"
SOLUTION_ORDER = "order = rng.permutation(len(self.shard_sizes)).tolist()"
MUTANTS += [
    # w5-07 w75_15: the offset's upper bound exclusive: with one shard its last sample is never trained
    (answer().replace(SOLUTION_OFFSET, "offset = int(rng.integers(0, max(1, n - k * world * self.batch_size)))"),
     "every sample is trained in some epoch", "the shard's last sample is never trained"),
    # w5-07 w75_16: the shards never shuffled, only the cut moves: each rank reads the same half every epoch
    (answer().replace(SOLUTION_ORDER, "order = list(range(len(self.shard_sizes)))"),
     "a different split every epoch: the shards a rank reads change with the epoch", "the shards' order never changes"),
    # w5-07 w75_17: the offset from the global, unseeded np.random (each process draws its own)
    (answer().replace(SOLUTION_OFFSET, "offset = int(np.random.randint(0, n - k * world * self.batch_size + 1))"),
     "a different split every epoch, drawn from (seed, epoch) alone", "did not compute the same plan"),
    # w5-07 w75_18: set_epoch keeps the resumed epoch's start when none is given
    (answer().replace("    def set_epoch(self, epoch, start=0):\n        self.epoch, self.start = epoch, start\n",
                      "    def set_epoch(self, epoch, start=None):\n        self.epoch = epoch\n"
                      "        if start is not None:\n            self.start = start\n"),
     "resumes where it stopped", "the start of the resumed epoch was kept"),
    # w5-07 w75_19: a generator seeded with the worker id: the workers of a rank cut different plans
    (answer().replace("rng = np.random.default_rng([self.seed, self.epoch])",
                      "rng = np.random.default_rng([self.seed, self.epoch, worker])"),
     "a different split every epoch, drawn from (seed, epoch) alone", "workers of a rank"),
]
# w6-07 w75_14, w75_15: two splits of a rank's K batches among its workers that are right with two workers
# only (the longer runs last; ceil(K/W) each); case (6) reads with four workers, K % 4 = 2, resumed at K - 1
SOLUTION_COUNTS = "counts = [k // workers + (w < k % workers) for w in range(workers)]"
MUTANTS += [
    (answer().replace(SOLUTION_COUNTS, "counts = [k // workers + (w >= workers - k % workers) for w in range(workers)]"),
     "resumes where it stopped", "the longer runs first"),
    (answer().replace(SOLUTION_COUNTS, "counts = [max(0, min(-(-k // workers), k - w * -(-k // workers))) "
                                       "for w in range(workers)]"),
     "resumes where it stopped", "ceil(K / W) each"),
]
# w7-07 w75_18: the offset drawn in whole batches: with one sample left over it is always 0 (the hint
# named only the exclusive bound, which this answer did not have)
MUTANTS.append((answer().replace(SOLUTION_OFFSET, "offset = int(rng.integers(0, (n - k * world * self.batch_size) "
                                                  "// self.batch_size + 1)) * self.batch_size"),
                "every sample is trained in some epoch", "an offset in whole batches"))
# w7-07 w75_19 (and w6-07's grey epoch % (remainder + 1)): a cut that walks along with the epoch. With one
# sample left over it alternates, which the contract's "nor the same ones every other epoch" could be read to
# forbid; w6-07's decision keeps this family passing (each sample comes in some epoch; the cut moves), so
# both stay right here, and the check's parity test is the large-remainder case (3) only
RIGHT["offset walks with the epoch"] = answer().replace(
    SOLUTION_OFFSET, "offset = (self.seed + self.epoch) % (n - k * world * self.batch_size + 1)")
assert all(src != RIGHT["solution"] for src, *_ in MUTANTS[-8:])
RIGHT["Python random offset"] = answer().replace(         # w5-07 w75_14: another seeded generator, right
    SOLUTION_OFFSET, "offset = __import__('random').Random(self.seed * 1000003 + self.epoch).randint("
                     "0, n - k * world * self.batch_size)")


# w11-07: three answers that passed. The seed ignored (w75_15); seed and epoch mixed into one number (w75_08,
# w4-07's "right" answer until then: (seed, epoch + 1) and (seed + 1, epoch) draw the same plan, what 7.1 says
# of another mix); the generator kept on the object, made anew only when the epoch changes (w75_10: the same
# epoch iterated twice gave other batches). Case 0 reads, in the rank's process, the last epoch twice in a
# row and the first epoch with the next seed
SOLUTION_RNG = "rng = np.random.default_rng([self.seed, self.epoch])"
MUTANTS += [
    (answer().replace(SOLUTION_RNG, "rng = np.random.default_rng(self.epoch)"),
     "a different split every epoch, drawn from (seed, epoch) alone", "the seed is ignored"),
    (answer().replace(SOLUTION_RNG, "rng = np.random.default_rng(self.seed + self.epoch)"),
     "a different split every epoch, drawn from (seed, epoch) alone",
     "the seed and the epoch are mixed into one number (seed + epoch?), so (seed, epoch + 1) and (seed + 1, epoch) "
     "draw the same plan"),
    (answer().replace(SOLUTION_RNG,
                      "if getattr(self, '_gen', None) is None or self._gen_epoch != self.epoch:\n"
                      "            self._gen, self._gen_epoch = np.random.default_rng([self.seed, self.epoch]), "
                      "self.epoch\n"
                      "        rng = self._gen"),
     "a different split every epoch, drawn from (seed, epoch) alone", "state kept between iterations"),
]
KEPT_PER_EPOCH = len(MUTANTS) - 1

# w11-07 w75_14: a pad that does not pad (k = ceil(n / (W x B)) batches, the offset drawn up to n - k x W x B,
# which is negative): rng.integers raised ValueError in a DataLoader worker, and the ERROR showed the start of
# the worker's traceback, cut inside the grading code, without the exception's text or the learner's line
ERROR_IN_WORKER = answer().replace("k = n // (world * self.batch_size)", "k = math.ceil(n / (world * self.batch_size))")
ERROR_LINE = next(j + 1 for j, line in enumerate(ERROR_IN_WORKER.splitlines()) if "offset = int(rng.integers" in line)


def test_an_exception_in_a_worker_shows_its_text_and_the_learners_line(verdicts):
    status, message = verdicts[("error in a worker", SEEDS[len("error in a worker") % 2])]
    assert status == "error", message
    assert "ValueError: high <= 0" in message and f"at line {ERROR_LINE} of " in message, message
    assert "lesson07_ranks.py" not in message and "Original Traceback" not in message, message


def test_a_generator_kept_per_epoch_fails_on_more_seeds_in_process():
    """w11-07 w75_10, simulated with a copy of the object per worker, as forked workers get one (iterating
    one object per worker, as the other simulated mutants are, its workers would disagree instead)."""
    source, prop, words = MUTANTS[KEPT_PER_EPOCH]
    for seed in SEEDS + MORE_SEEDS:
        status, message = _verdict(_observe(source, seed, fork=True), seed)
        assert status == "fail" and f"'{prop}'" in message and words in message, f"seed {seed}: {message}"
    assert _verdict(_observe(RIGHT["solution"], SEEDS[0], fork=True), SEEDS[0])[0] == "pass"


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson07-shards")
    jobs, keys = [], []
    for name, source in list(RIGHT.items()) + [(f"mutant{i}", src) for i, (src, *_) in enumerate(MUTANTS)] + \
            [("error in a worker", ERROR_IN_WORKER)]:
        path = folder / f"7_5_{name.replace(' ', '_')}.py"
        path.write_text(source)
        for seed in seeds_for(name):
            jobs.append({"exercise": "7.5", "file": str(path), "function": "ShardStream", "seed": seed,
                         "timeout_s": 20})
            keys.append((name, seed, path))
    path = folder / "7_5_solution.py"                 # once more, its first epoch read by spawned workers
    jobs.append({"exercise": "7.5", "file": str(path), "function": "ShardStream", "seed": SEEDS[0],
                 "timeout_s": 20, "spawn": True})
    keys.append(("solution, spawned workers", SEEDS[0], path))
    observations = lesson07.run_rank_jobs(jobs, timeout_s=600)
    out = {}
    for (name, seed, path), obs in zip(keys, observations):
        try:
            out[(name, seed)] = ("pass", lesson07.judge_7_5(obs, seed, path))
        except lesson07.CheckFailed as exc:
            out[(name, seed)] = ("fail", exc.sentence())
        except NotImplementedError:
            out[(name, seed)] = ("not_implemented", "")
        except Exception as exc:
            out[(name, seed)] = ("error", f"{type(exc).__name__}: {exc}")
    return out


@pytest.mark.parametrize("name", list(RIGHT))
def test_right_answers_pass_on_every_seed(verdicts, name):
    for seed in seeds_for(name):
        status, message = verdicts[(name, seed)]
        assert status == "pass", f"seed {seed}: {message}"


def test_the_solution_passes_with_spawned_workers(verdicts):
    """The learner's class, loaded from a file, reaches workers started by spawn (it is imported
    there by name), and a rank read in __init__ travels with it."""
    status, message = verdicts[("solution, spawned workers", SEEDS[0])]
    assert status == "pass", message


@pytest.mark.parametrize("i, prop, words", [(i, m[1], m[2] if len(m) > 2 else "") for i, m in enumerate(MUTANTS)],
                         ids=[f"mutant{i}" for i in range(len(MUTANTS))])
def test_mutants_fail_on_the_right_property_on_every_seed(verdicts, i, prop, words):
    for seed in seeds_for(f"mutant{i}"):
        status, message = verdicts[(f"mutant{i}", seed)]
        assert status == "fail", f"seed {seed}: {status}: {message}"
        assert f"'{prop}'" in message, f"seed {seed}: {message}"
        assert words in message, f"seed {seed}: {message}"


def test_at_least_eight_mutants():
    assert len(MUTANTS) >= 26


def test_stub_and_wrong_objects_need_no_launch(tmp_path):
    stub = tmp_path / "stub.py"
    stub.write_text(HEADER + '        # YOUR CODE HERE\n        raise NotImplementedError("Exercise 7.5")\n')
    result = run_check("7.5", stub)
    assert result.status == "not_implemented" and result.seconds < 2, result
    assert "expected the path of your exercise file" in run_check("7.5", 3).message
    renamed = tmp_path / "renamed.py"
    renamed.write_text("class Shards:\n    pass\n")
    assert "defines ShardStream" in run_check("7.5", renamed).message


def test_check_itself_passes_the_solution(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CHECK_SEED", "77")
    path = tmp_path / "shards_yours.py"
    path.write_text(RIGHT["solution"])
    result = run_check("7.5", path)
    assert result.status == "pass", result.message


# -- near misses, judged in this process on observations made without torchrun ----------------------------

def _observe(source, seed, world=2, edit=None, fork=False):
    """What the rank harness records for `source`, computed in this process: each rank's stream
    with its rank set, each worker's batches (get_worker_info patched), delivered in the
    DataLoader's turns. `edit(case_index, rank, epoch, batches)` may change a rank's record."""
    import copy
    import types
    from course_utils.checks.lesson07_ranks import _seed_and_repeat_75, cases_75
    module = types.ModuleType("answer75")
    exec(compile(source, "answer75.py", "exec"), module.__dict__)

    def read(stream, workers):
        outs = []
        for w in range(max(1, workers)):
            module.get_worker_info = (lambda w=w: types.SimpleNamespace(id=w, num_workers=workers)) if workers \
                else (lambda: None)
            mine = copy.deepcopy(stream) if fork and workers else stream      # a forked worker's own copy
            outs.append([[list(p) for p in b] for b in mine])
        delivered, j = [], 0
        while any(j < len(o) for o in outs):
            delivered += [[w, o[j]] for w, o in enumerate(outs) if j < len(o)]
            j += 1
        return delivered

    obs = []
    for rank in range(world):
        results = []
        for i, case in enumerate(cases_75(seed, world)):
            stream = module.ShardStream(list(case["sizes"]), case["batch_size"], seed=case["seed"])
            stream.rank, stream.world_size = rank, world
            entry = {"epochs": {}, "resume": None}
            for epoch in case["epochs"]:
                stream.set_epoch(epoch)
                batches = read(stream, case["workers"])
                entry["epochs"][str(epoch)] = edit(i, rank, epoch, batches) if edit else batches
            if case["resume"]:
                again = module.ShardStream(list(case["sizes"]), case["batch_size"], seed=case["seed"])
                again.rank, again.world_size = rank, world
                again.set_epoch(case["resume"][0], start=case["resume"][1])
                entry["resume"] = read(again, case["workers"])
            if i == 0:
                entry["in_process"] = {}
                for epoch in case["epochs"]:
                    stream.set_epoch(epoch)
                    entry["in_process"][str(epoch)] = read(stream, 0)

                def make(sizes, batch_size, *, seed, rank=rank):
                    made = module.ShardStream(sizes, batch_size, seed=seed)
                    made.rank, made.world_size = rank, world
                    return made
                _seed_and_repeat_75(make, stream, case, entry, lambda st: read(st, 0))
            results.append(entry)
        obs.append({"rank": rank, "world": world, "results": results})
    return obs


def _verdict(obs, seed):
    try:
        return "pass", lesson07.judge_7_5(obs, seed, "answer75.py")
    except lesson07.CheckFailed as exc:
        return "fail", exc.sentence()


@pytest.mark.parametrize("seed", SEEDS)
def test_in_process_observations_agree_with_the_launch(verdicts, seed):
    """The simulator below gives the verdicts the real launch gave (so the near misses are judged
    on what the harness would record)."""
    for name, source in list(RIGHT.items())[:2] + [(f"mutant{i}", MUTANTS[i][0]) for i in (0, 8, 9, 12, 13, 14, 19)]:
        if seed in seeds_for(name):
            assert _verdict(_observe(source, seed), seed)[0] == verdicts[(name, seed)][0], name


# the mutants whose record the simulator reproduces (not those that read the rank in the workers,
# keep state in the object the simulator iterates once per worker, or draw from the global generator)
SIMULATED = [i for i, m in enumerate(MUTANTS) if i not in (1, 2, 8, 16, 20, 23, 24, KEPT_PER_EPOCH)]


@pytest.mark.parametrize("i", SIMULATED, ids=[f"mutant{i}" for i in SIMULATED])
def test_mutants_fail_on_more_seeds_in_process(i):
    source, prop, *words = MUTANTS[i]
    for seed in SEEDS + MORE_SEEDS:
        status, message = _verdict(_observe(source, seed), seed)
        assert status == "fail" and f"'{prop}'" in message, f"seed {seed}: {message}"
        assert not words or words[0] in message, f"seed {seed}: {message}"


def test_right_answers_pass_on_100_seeds_in_process():
    """Chance must not fail a right answer: the six-epoch single-shard case (remainder world x batch
    - 1, so 10 or 12 places for the cut) fails a cut drawn from (seed, epoch) only if it repeats a
    2-cycle four times (1 in 10,000 at most), and case 0's split only if three epochs read the same
    samples (two epochs did at seeds 126 and 235, which failed right answers there). 300 seeds were
    tried once; 100 here, for time: the solution, an offset that walks with the epoch, and padding."""
    for name in ("solution", "offset walks with the epoch", "padding"):
        for seed in range(100):
            assert _verdict(_observe(RIGHT[name], seed), seed)[0] == "pass", (name, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_batch_size_edges(seed):
    """A batch one sample short fails, one sample too many fails, exactly batch_size passes."""
    for delta, status in ((-1, "fail"), (+1, "fail"), (0, "pass")):
        def edit(i, rank, epoch, batches, delta=delta):
            if i == 0 and rank == 1 and epoch == 0 and delta:
                w, pairs = batches[2]
                spare = batches[-1][1][-1]
                batches[2] = [w, pairs[:-1] if delta < 0 else pairs + [spare]]
            return batches
        verdict, message = _verdict(_observe(RIGHT["solution"], seed, edit=edit), seed)
        assert verdict == status, (delta, message)
        if status == "fail":
            assert "'every batch holds batch_size samples'" in message


def test_a_ranks_part_at_the_edge_of_what_it_may_touch():
    """The rank-read allowance (its distinct samples plus two of the largest shard; four with
    padding, whose wrap-around is a second stretch): on the edge passes, one sample past fails."""
    sizes = [10, 10, 10, 10, 10, 10]
    def batches(pairs):
        return [[0, pairs]]
    inside = [(1, i) for i in range(10)] + [(2, 0), (2, 1)]                  # 12 samples, 2 shards: 20 <= 32
    assert lesson07._rank_reads_too_much(batches(inside), sizes) is None
    spread = inside + [(0, 9), (3, 0)]                     # 14 samples touching 4 shards: 40 > 14 + 20 = 34
    assert lesson07._rank_reads_too_much(batches(spread), sizes) == (40, 34)
    on = [(1, i) for i in range(10)] + [(2, i) for i in range(10)] + [(0, 9), (3, 0)]    # 22 + 20 = 42 >= 40
    assert lesson07._rank_reads_too_much(batches(on), sizes) is None
    one_short = [(1, i) for i in range(10)] + [(2, i) for i in range(9)] + [(0, 9), (3, 0)]   # 21 + 20 = 41 >= 40
    assert lesson07._rank_reads_too_much(batches(one_short), sizes) is None
    two_short = [(1, i) for i in range(10)] + [(2, i) for i in range(8)] + [(0, 9), (3, 0)]   # 20 + 20 = 40: on it
    assert lesson07._rank_reads_too_much(batches(two_short), sizes) is None
    three_short = [(1, i) for i in range(10)] + [(2, i) for i in range(7)] + [(0, 9), (3, 0)]   # 39 < 40
    assert lesson07._rank_reads_too_much(batches(three_short), sizes) == (40, 39)
    padded = three_short + [(1, 0)]                        # a repeat: padding, two more shards allowed
    assert lesson07._rank_reads_too_much(batches(padded), sizes) is None


def test_worker_stretches_that_touch_but_do_not_overlap():
    """Two workers' stretches of a shard meeting at a boundary (9 | 10) do not overlap; sharing one
    sample's position does."""
    apart = [[0, [[0, i] for i in range(10)]], [1, [[0, i] for i in range(10, 20)]]]
    assert lesson07._stretch_overlap(apart, set()) is None
    across = [[0, [[0, i] for i in range(10)] + [[0, 15]]], [1, [[0, i] for i in range(10, 15)]]]
    assert lesson07._stretch_overlap(across, set()) == (0, 1, 0, 10, 14)
    assert lesson07._stretch_overlap(across, {(0, 15)}) is None            # a padded repeat does not count


# w8-07 75_10: the cut's offset up to the remainder + 1: on the epochs that draw remainder + 1 the last
# rank's part runs one sample past the stream's end, and its last batch is short. It failed on every seed,
# told to "drop the remainder, or pad it"; the message now names the offset. In this process only (the
# simulator reproduces it): the launch above stays as long as it was
OFFSET_PAST_THE_END = answer().replace(SOLUTION_OFFSET, "offset = int(rng.integers(0, n - k * world * self.batch_size + 2))")


def test_an_offset_past_the_remainder_is_named_on_every_seed():
    assert OFFSET_PAST_THE_END != RIGHT["solution"]
    for seed in SEEDS + MORE_SEEDS:
        status, message = _verdict(_observe(OFFSET_PAST_THE_END, seed), seed)
        assert status == "fail" and "'every batch holds batch_size samples'" in message, f"seed {seed}: {message}"
        assert "past the end of the epoch's stream" in message and "the cut's offset runs from 0 to the remainder" \
            in message, f"seed {seed}: {message}"


def test_a_short_batch_elsewhere_keeps_the_remainder_hint():
    """The mutants whose batches are short for another reason are not told about the offset."""
    shorts = [i for i, m in enumerate(MUTANTS) if m[1] == "every batch holds batch_size samples"]
    assert len(shorts) == 2
    for i in shorts:
        source = MUTANTS[i][0]
        status, message = _verdict(_observe(source, SEEDS[0]), SEEDS[0])
        assert status == "fail" and "drop the remainder, or pad it" in message, message


# the near-miss rule on the remainder's edge, case (7) (a stream that divides into full batches): a padding
# answer that always adds a batch, right wherever there is a remainder; in this process only
PAD_ALWAYS_ONE_MORE = answer(last="pad").replace("k = math.ceil(n / (world * self.batch_size))",
                                                 "k = n // (world * self.batch_size) + 1")


def test_padding_one_batch_too_many_on_an_exact_stream_fails_on_every_seed():
    assert PAD_ALWAYS_ONE_MORE != answer(last="pad")
    for seed in SEEDS + MORE_SEEDS:
        status, message = _verdict(_observe(PAD_ALWAYS_ONE_MORE, seed), seed)
        assert status == "fail" and "'pads fewer than world_size x batch_size samples'" in message, \
            f"seed {seed}: {message}"
