"""The margins of the timed checks (2.2 and 8.1): each one's right answer and a wrong one that must
fail on speed, graded again and again, alternately, on this machine. Not a test (the unit tests
prove each mutant fails); this measures how far the bars sit from both, which their docstrings
quote.

    .venv/bin/python benchmarks/check_bars.py 2.2 --runs 10
    .venv/bin/python benchmarks/check_bars.py 8.1 --runs 10 --json build/bars-81.json

2.2: the reference loader (a worker per usable core, persistent) against the unchanged
num_workers=0 baseline, and 4 workers per core (oversubscribed: it passes, and should gain no more than
the reference). 8.1: the reference pipeline (device-resident) against the course's
baseline pipeline and a per-sample augmentation loop. `--quiet` reports no other process to the
check (as tests/unit/test_checks_lesson02.py does), so that its bar is the quiet machine's while
other jobs share this one. `--only reference,"the course's baseline"` grades some of them; with
COURSE_SMOKE=0 set, at full size (`make gpu-check`'s check-8.1 stage on a GPU).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
os.environ.setdefault("COURSE_SMOKE", "1")

from course_utils.checks import run_check  # noqa: E402


def _answers(exercise: str) -> dict:
    if exercise == "2.2":
        import test_checks_lesson02 as m
        return {"reference": (m.fast_loader, "pass"), "num_workers=0 baseline": (m.baseline_loader, "fail"),
                "4 workers per core": (m.oversubscribed, "pass")}
    if exercise == "8.1":
        import test_checks_lesson08 as m
        return {"reference": (m.right, "pass"), "the course's baseline": (m.course_baseline, "fail"),
                "per-sample augmentation": (m.augments_sample_by_sample, "fail")}
    raise SystemExit(f"timed checks: 2.2 and 8.1, not {exercise}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exercise", choices=["2.2", "8.1"])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quiet", action="store_true", help="report no other process to the check")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--only", help="answers to grade, comma-separated (default: all three)")
    args = parser.parse_args(argv)
    if args.quiet:             # the checks' measure of other programs' CPU (course_utils/checks/_busy.py)
        import course_utils.checks.lesson02 as lesson02
        import course_utils.checks.lesson08 as lesson08
        from test_checks_lesson02 import QuietMachine
        lesson02.OthersCpu = lesson08.OthersCpu = QuietMachine
    answers = _answers(args.exercise)
    if args.only:
        wanted = [a.strip() for a in args.only.split(",")]
        unknown = [a for a in wanted if a not in answers]
        if unknown:
            raise SystemExit(f"no answer {unknown}; the answers: {', '.join(answers)}")
        answers = {name: answers[name] for name in wanted}
    rows = []
    for run in range(args.runs):
        for name, (answer, expected) in answers.items():
            t0 = time.perf_counter()
            result = run_check(args.exercise, answer)
            row = {"run": run, "answer": name, "expected": expected, "status": result.status,
                   "seconds": round(time.perf_counter() - t0, 1), "message": result.message}
            rows.append(row)
            flag = "" if result.status == expected else "   <-- UNEXPECTED"
            print(f"{run:2d} {name:26s} {result.status:5s} {row['seconds']:5.1f}s  {result.message[:260]}{flag}",
                  flush=True)
    for name, (_, expected) in answers.items():
        mine = [r for r in rows if r["answer"] == name]
        right = sum(r["status"] == expected for r in mine)
        print(f"{name}: {right}/{len(mine)} runs {expected}ed as they should")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["status"] == r["expected"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
