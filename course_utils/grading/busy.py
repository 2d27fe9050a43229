"""The grader's second look at checks that found the machine too busy to judge speed.

A speed-graded check (2.2, 8.1) that measured while other programs took the cores it needed
says "not graded: the machine was busy" (status `busy`, `course_utils.checks._busy`). The grader
does not turn that into a FAIL: once every submission of the run has been checked, it waits for
the machine to be quiet (other programs using less than `busy_limit` of the cores, measured
over a few seconds), runs each busy check again on the object its submission handed in, with the
same seed, and keeps the new verdict. After `retries` tries a check that still found the machine
busy stays "not graded"; the row says so, the exit status is 3, and running the same command
again grades that submission again (its row is not kept).
"""
from __future__ import annotations

import time

__all__ = ["busy_exercises", "wait_until_quiet", "quiet_now", "DEFAULT_RETRIES", "DEFAULT_WAIT_S"]

DEFAULT_RETRIES = 2          # tries after the first, per busy check
DEFAULT_WAIT_S = 120.0       # how long each try waits for a quiet machine before it runs anyway


def busy_exercises(records: list[dict]) -> list[str]:
    """The exercises of a submission's records that were not graded because the machine was busy."""
    return [r["exercise"] for r in records if r.get("status") == "busy"]


def quiet_now(window_s: float = 3.0) -> tuple[bool, float, int]:
    """(quiet, cores other programs used, usable cores), measured over `window_s` seconds with this
    process doing nothing: quiet when the others stayed under `busy_limit`."""
    from course_utils.checks._busy import OthersCpu, busy_limit
    with OthersCpu() as others:
        time.sleep(window_s)
    return others.others_cores < busy_limit(others.usable), others.others_cores, others.usable


def wait_until_quiet(limit_s: float, say=print, *, window_s: float = 3.0) -> tuple[bool, float]:
    """Wait up to `limit_s` seconds for the machine to be quiet; (quiet, what the others used last)."""
    deadline = time.monotonic() + max(0.0, limit_s)
    told = False
    while True:
        quiet, others, cores = quiet_now(window_s)
        if quiet:
            return True, others
        if time.monotonic() + window_s > deadline:
            return False, others
        if not told:
            say(f"waiting for the machine to be quieter before the busy checks run again: other programs use "
                f"{others:.1f} of its {cores} cores (up to {limit_s:.0f} s)")
            told = True
