"""Per lesson: the checks' mutants (written, rejected on their property) and each check's time on
its right answer. Not a test: the proof is tests/unit/test_checks_lesson0*.py, which runs every
mutant over several seeds; this prints the table the README and reports quote.

    .venv/bin/python benchmarks/check_table.py              # every lesson, seed 0, 3 timed runs
    .venv/bin/python benchmarks/check_table.py --lessons 3 5 --repeats 5

Times are wall seconds of `run_check` on this machine (shared machines make them noisy).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
os.environ.setdefault("COURSE_SMOKE", "1")

from course_utils.checks import run_check  # noqa: E402


def _right_answers(lesson: int) -> dict:
    """exercise -> the right answer the unit tests pass to it."""
    m = __import__(f"test_checks_lesson0{lesson}")
    return {
        0: lambda: {"0.1": m.good},
        1: lambda: {"1.1": m.time_it, "1.2": m.stall, "1.3": m.diagnose},
        2: lambda: {"2.1": m.choose, "2.2": m.fast_loader, "2.3": m.WorkerSafe},
        3: lambda: {"3.1": m.GoodPrefetcher, "3.2": m.crop_flip, "3.3": m.good_normalize},
        4: lambda: {"4.1": m.make_cifar_pipeline(), "4.2": m.make_cifar_epochs(), "4.3": m.make_jpeg_pipeline()},
        5: lambda: {"5.1": m.amp_step, "5.2": m.accumulate, "5.3": m.largest, "5.4": m.fixed_loop},
    }[lesson]()


def _mutants(lesson: int) -> dict:
    """exercise -> its Mutant list, as the unit tests define them."""
    m = __import__(f"test_checks_lesson0{lesson}")
    out = {}
    for name, value in vars(m).items():
        if name.startswith("MUTANTS") and isinstance(value, list):
            exercise = {"MUTANTS": f"{lesson}.1"}.get(name) or f"{lesson}.{name.split('_')[1][1]}"
            out.setdefault(exercise, []).extend(value)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lessons", type=int, nargs="*", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each check on its right answer")
    parser.add_argument("--seed", default="0")
    args = parser.parse_args(argv)
    os.environ["COURSE_CHECK_SEED"] = args.seed
    print(f"{'lesson':>6} {'exercise':>8} {'mutants':>8} {'rejected':>9} {'check s (median)':>17}")
    for lesson in args.lessons:
        try:
            answers, mutants = _right_answers(lesson), _mutants(lesson)
        except Exception as exc:  # e.g. lesson 04 without DALI
            print(f"{lesson:>6}  skipped: {exc}")
            continue
        totals = [0, 0, 0.0]
        for exercise, answer in answers.items():
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                result = run_check(exercise, answer)
                times.append(time.perf_counter() - t0)
                if result.status != "pass":
                    print(f"  {exercise}: the right answer did not pass: {result.message}")
            written = mutants.get(exercise, [])
            rejected = 0
            for m in written:
                r = run_check(exercise, m.answer)
                ok = r.status == m.status and (m.prop in r.message)
                rejected += ok
                if not ok:
                    print(f"  {exercise} mutant '{m.name}' NOT rejected on its property: {r.status}: {r.message[:160]}")
            median = statistics.median(times)
            print(f"{lesson:>6} {exercise:>8} {len(written):>8} {rejected:>9} {median:>17.2f}")
            totals[0] += len(written)
            totals[1] += rejected
            totals[2] = max(totals[2], median)
        print(f"{lesson:>6} {'all':>8} {totals[0]:>8} {totals[1]:>9} {totals[2]:>17.2f}  (slowest)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
