"""Lesson 06 after the seventh walk (w7-06): no wrong answer passed. `check("6.1", f, seed=N)` (a learner
rerunning the printed seed) was reported as "your code raised TypeError" (the check's own argument error):
the three checks now take seed=, and an argument a check does not take is named as the call's mistake. A
truncated samples/s (float(int(x))) was told about the one-device formula on 3 seeds of 4: it is now named
as truncation on every seed."""
import math
import pathlib
import runpy

import pytest

from course_utils.checks import run_check
from mutants import Mutant, rejected

RIGHT = pathlib.Path(__file__).parent / "lesson06_w6"


def _load(stem):
    ns = runpy.run_path(str(next(RIGHT.glob(f"{stem}*.py"))))
    return ns.get("estimate_dp") or ns["dp_memory"]


def _changed(key, how):
    right = _load("a61")

    def estimate_dp(costs, n_devices, batch_size, loader_samples_per_s):
        out = dict(right(costs, n_devices, batch_size, loader_samples_per_s))
        out[key] = how(out[key])
        return out
    return estimate_dp


@pytest.mark.parametrize("name, key, how, words", [
    ("w7-06 a25 float(int(sps))", "samples_per_s", lambda v: float(int(v)), "truncated to a whole number"),
    ("math.floor of samples/s to 1 decimal", "samples_per_s", lambda v: math.floor(v * 10) / 10,
     "truncated to 1 decimal"),
    ("math.ceil of samples/s", "samples_per_s", lambda v: float(math.ceil(v)), "rounded up to a whole number"),
    ("efficiency truncated to 3 decimals", "efficiency", lambda v: math.trunc(v * 1000) / 1000,
     "truncated to 3 decimals"),
], ids=lambda v: v if isinstance(v, str) and " " in v else "")
def test_w7_06_truncation_is_named_as_truncation_on_every_seed(name, key, how, words):
    rejected("6.1", Mutant(name, _changed(key, how), "returns the numbers unrounded", words=words),
             ["1", "2", "3", "4", "5"])


def test_w7_06_seed_reruns_the_printed_inputs():
    right = _load("a61")
    first = run_check("6.1", right, seed=1234)
    assert first.status == "pass" and "(seed 1234)" in first.message, first.message
    truncated = _changed("samples_per_s", lambda v: float(int(v)))
    a, b = run_check("6.1", truncated, seed=77), run_check("6.1", truncated, seed=77)
    assert a.status == b.status == "fail" and a.message == b.message, (a.message, b.message)
    memory = run_check("6.3", _load("a63"), seed=5)
    assert memory.status == "pass" and "(seed 5)" in memory.message, memory.message


def test_w7_06_a_seed_or_argument_the_check_does_not_take_is_not_blamed_on_the_answer():
    right = _load("a61")
    bad = run_check("6.1", right, seed="five")
    assert bad.status == "fail" and "seed= takes a whole number" in bad.message, bad.message
    other = run_check("6.1", right, sed=5)
    assert other.status == "error" and "your code" not in other.message, other.message
    assert "does not take" in other.message and "seed=" in other.message, other.message


def test_w7_06_the_specifications_count_what_the_checks_count():
    """w7-06: 6.1's specification said 'about 60 configurations a run' and 6.3's '39' while the checks ran 72
    and 46: the numbers in the lesson's text are the ones the checks print."""
    import json
    import re
    lesson = pathlib.Path(__file__).parents[2] / "solutions" / "06-data-parallel.ipynb"
    cells = ["".join(c["source"]) for c in json.loads(lesson.read_text(encoding="utf-8"))["cells"]]
    for exercise, answer in (("6.1", _load("a61")), ("6.3", _load("a63"))):
        spec = next(c for c in cells if f"## Exercise {exercise}" in c and "configurations a" in c)
        said = re.search(r"\((\d+) configurations a\s+run", spec)
        ran = re.search(r"on (\d+) configurations", run_check(exercise, answer, seed=3).message)
        assert said and ran and said.group(1) == ran.group(1), (exercise, said, ran)
