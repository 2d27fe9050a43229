"""Check 7.5 (shards for every rank and worker): the right answers pass, each mutant fails on its
property on every seed, the stub is 'not implemented'. Every answer x seed is one job of ONE
torchrun launch with 2 gloo ranks (`run_rank_jobs`), judged by `judge_7_5`, as the check does;
one test goes through `check()` itself."""
import pytest

from course_utils.checks import lesson07, run_check

SEEDS = [5, 1234]

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

    def set_epoch(self, epoch, start=0):
        self.epoch, self.start = epoch, start

    def __iter__(self):
'''


def answer(*, order="seeded", rank_part="contiguous", cut="even_k", workers="strided", resume="before",
           epoch_used=True, worker_info=True):
    """The ShardStream source with one knob per mistake (the defaults are right)."""
    e = "self.epoch" if epoch_used else "0"
    lines = ["rank, world = dist.get_rank(), dist.get_world_size()",
             "info = get_worker_info()" if worker_info else "info = None",
             "worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)",
             "n = sum(self.shard_sizes)",
             "k = math.ceil(n / (world * self.batch_size))"]
    if order == "seeded":
        lines.append(f"order = np.random.default_rng([self.seed, {e}]).permutation(len(self.shard_sizes)).tolist()")
    elif order == "global":
        lines.append("order = torch.randperm(len(self.shard_sizes)).tolist()")
    if order == "samples":     # every sample shuffled: each rank then reads from every shard
        lines += ["stream = [(s, i) for s in range(len(self.shard_sizes)) for i in range(self.shard_sizes[s])]",
                  f"stream = [stream[j] for j in np.random.default_rng([self.seed, {e}]).permutation(n)]"]
    else:
        lines.append("stream = [(int(s), i) for s in order for i in range(self.shard_sizes[s])]")
    if rank_part == "contiguous":
        lines.append("mine = stream[rank * n // world:(rank + 1) * n // world]")
    elif rank_part == "rest_on_last":
        lines += ["per = n // world", "mine = stream[rank * per:(rank + 1) * per if rank < world - 1 else n]"]
    elif rank_part == "none":
        lines.append("mine = stream")
    elif rank_part == "whole_shards":
        lines.append("mine = [(s, i) for s in order[rank::world] for i in range(self.shard_sizes[s])]")
    if cut == "even_k":
        lines.append("batches = [mine[j * len(mine) // k:(j + 1) * len(mine) // k] for j in range(k)]")
    elif cut == "full":
        lines.append("batches = [mine[j:j + self.batch_size] for j in range(0, len(mine), self.batch_size)]")
    elif cut == "drop_last":
        lines.append("batches = [mine[j:j + self.batch_size] for j in range(0, len(mine) - self.batch_size + 1, "
                     "self.batch_size)]")
    elif cut == "pad":
        lines += ["need = k * self.batch_size",
                  "mine = (mine * (need // max(1, len(mine)) + 1))[:need]",
                  "batches = [mine[j:j + self.batch_size] for j in range(0, need, self.batch_size)]"]
    if workers == "strided":
        pick = "batches[self.start:][worker::workers]" if resume == "before" else \
            "batches[worker::workers]" if resume == "ignored" else "batches[worker::workers][self.start:]"
    elif workers == "none":
        pick = "batches[self.start:]"
    elif workers == "whole_shards":      # the rank's shards dealt to its workers
        lines += ["shards = sorted({s for s, _ in mine}, key=[s for s, _ in mine].index)[worker::workers]",
                  "batches = [b for b in batches if b and b[0][0] in shards]"]
        pick = "batches[self.start:]"
    lines.append(f"yield from {pick}")
    return HEADER + "".join(f"        {line}\n" for line in lines)


RIGHT = {"solution": answer(),
         "tensor batches": answer().replace("yield from batches[self.start:][worker::workers]",
                                            "for b in batches[self.start:][worker::workers]:\n"
                                            "            yield torch.tensor(b)")}

MUTANTS = [
    (answer(workers="none"), "every sample exactly once per epoch"),               # split by rank only: workers repeat
    (answer(rank_part="none", cut="full"), "every sample exactly once per epoch"),  # every rank reads everything
    (answer(rank_part="whole_shards", cut="full"), "every rank and every worker gets samples"),  # one shard, two ranks
    (answer(workers="whole_shards"), "every rank and every worker gets samples"),    # one shard, two workers
    (answer(epoch_used=False), "a different split every epoch"),
    (answer(rank_part="rest_on_last", cut="full"), "every rank yields the same number of batches"),
    (answer(cut="full"), "every rank yields the same number of batches"),           # ceil(share / B) per rank
    (answer(resume="ignored"), "resumes where it stopped"),                          # restarts the epoch
    (answer(resume="per_worker"), "resumes where it stopped"),                       # skips start per worker
    (answer(cut="drop_last"), "every sample exactly once per epoch"),
    (answer(cut="pad"), "every sample exactly once per epoch"),                      # DistributedSampler's padding
    (answer(order="global"), "every sample exactly once per epoch"),                 # unseeded: ranks disagree
    (answer(order="samples"), "each rank reads only its part of the shards"),
    (answer().replace("k = math.ceil(n / (world * self.batch_size))", "k = math.ceil(n / (world * self.batch_size)) + 1"),
     "every rank yields the same number of batches"),                                # equal, but not the number asked
    (answer().replace("(j + 1) * len(mine) // k]", "(j + 1) * len(mine) // k] * 2"),
     "yields batches of 1 to batch_size samples"),
]


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson07-shards")
    jobs, keys = [], []
    for name, source in list(RIGHT.items()) + [(f"mutant{i}", src) for i, (src, _) in enumerate(MUTANTS)]:
        path = folder / f"7_5_{name.replace(' ', '_')}.py"
        path.write_text(source)
        for seed in SEEDS:
            jobs.append({"exercise": "7.5", "file": str(path), "function": "ShardStream", "seed": seed,
                         "timeout_s": 20})
            keys.append((name, seed, path))
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
    for seed in SEEDS:
        status, message = verdicts[(name, seed)]
        assert status == "pass", f"seed {seed}: {message}"


@pytest.mark.parametrize("i, prop", list(enumerate(p for _, p in MUTANTS)), ids=[f"mutant{i}" for i in range(len(MUTANTS))])
def test_mutants_fail_on_the_right_property_on_every_seed(verdicts, i, prop):
    for seed in SEEDS:
        status, message = verdicts[(f"mutant{i}", seed)]
        assert status == "fail", f"seed {seed}: {status}: {message}"
        assert f"'{prop}'" in message, f"seed {seed}: {message}"


def test_at_least_eight_mutants():
    assert len(MUTANTS) >= 8


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
