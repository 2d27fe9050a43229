"""How a check is proven: its mutants (plausible wrong answers) fail on the named property, on
every seed. Used by tests/unit/test_checks_lesson0*.py.

    Mutant("forgets wait_stream", NoWaitStream, "the consumer waits for the copy")

`rejected(exercise_id, mutant, seeds)` runs the check once per seed (COURSE_CHECK_SEED) and
asserts the verdict each time: status "fail" (or the status the mutant names, "error" for an
answer whose natural fate is to crash) and the property in the message.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from course_utils.checks import run_check


@dataclass
class Mutant:
    name: str
    answer: object
    prop: str              # the property that must fail, as the check names it
    status: str = "fail"
    words: str = ""        # more words the message must hold (a hint, say)

    def __repr__(self) -> str:   # pytest ids
        return self.name


def rejected(exercise_id: str, mutant: Mutant, seeds) -> None:
    previous = os.environ.get("COURSE_CHECK_SEED")
    try:
        for seed in seeds:
            os.environ["COURSE_CHECK_SEED"] = str(seed)
            result = run_check(exercise_id, mutant.answer)
            where = f"{exercise_id} mutant '{mutant.name}', seed {seed}: {result.status}: {result.message}"
            assert result.status == mutant.status, where
            if mutant.status == "fail":
                assert f"property '{mutant.prop}'" in result.message or result.message.startswith(mutant.prop), where
            else:
                assert mutant.prop in result.message, where
            assert mutant.words in result.message, where
    finally:
        if previous is None:
            os.environ.pop("COURSE_CHECK_SEED", None)
        else:
            os.environ["COURSE_CHECK_SEED"] = previous


def passes(exercise_id: str, answer, seeds) -> None:
    previous = os.environ.get("COURSE_CHECK_SEED")
    try:
        for seed in seeds:
            os.environ["COURSE_CHECK_SEED"] = str(seed)
            result = run_check(exercise_id, answer)
            assert result.status == "pass", f"{exercise_id}, seed {seed}: {result.message}"
    finally:
        if previous is None:
            os.environ.pop("COURSE_CHECK_SEED", None)
        else:
            os.environ["COURSE_CHECK_SEED"] = previous
