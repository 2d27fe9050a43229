"""Small released lessons and submissions for the grader's tests (built from the real lessons).

A mini lesson keeps, from the course's own `solutions/NN-*.ipynb`, the title, the setup cell,
the parameters cells and each exercise (heading, solution cell, check cell): the real
exercises with the real checks, without the minutes of measurements in between.
"""
from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from course_utils.authoring import student_source
from course_utils.grading.lessons import EXERCISE_HEADING, ROOT, check_calls

SOURCES = {"00": "00-welcome-and-setup.ipynb", "01": "01-measure-the-baseline.ipynb"}


def mini_lesson(name: str):
    nb = nbformat.read(str(ROOT / "solutions" / name), as_version=4)
    keep, first_code = [], True
    for i, cell in enumerate(nb.cells):
        if i == 0:
            keep.append(cell)
        elif cell.cell_type == "markdown" and EXERCISE_HEADING.search(cell.source):
            keep.append(cell)
        elif cell.cell_type == "code":
            if first_code or "parameters" in cell.metadata.get("tags", []) or cell.source.startswith("SMOKE = SMOKE"):
                keep.append(cell)
                first_code = False
            elif "### BEGIN SOLUTION" in cell.source or check_calls(cell.source):
                keep.append(cell)
    out = copy.deepcopy(nb)
    out.cells = [copy.deepcopy(c) for c in keep]
    setup = next(c for c in out.cells if c.cell_type == "code")
    # the environment report imports DALI and probes devices: seconds per kernel, nothing to grade
    setup.source = "\n".join(line for line in setup.source.splitlines() if "print_env()" not in line)
    for cell in out.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return out


def mini_course(folder: Path) -> Path:
    """A `solutions/` folder with mini lessons 00 and 01; returns it."""
    solutions = Path(folder) / "solutions"
    solutions.mkdir(parents=True, exist_ok=True)
    for name in SOURCES.values():
        nbformat.write(mini_lesson(name), str(solutions / name))
    return solutions


def solved(solutions: Path, number: str):
    return nbformat.read(str(solutions / SOURCES[number]), as_version=4)


def unsolved(solutions: Path, number: str):
    nb = solved(solutions, number)
    out = student_source(nb, SOURCES[number])
    return out


def index_of(nb, predicate) -> int:
    return next(i for i, c in enumerate(nb.cells) if predicate(c))


def check_cell(nb, exercise_id: str) -> int:
    return index_of(nb, lambda c: c.cell_type == "code" and exercise_id in check_calls(c.source))


def code(source: str):
    return nbformat.v4.new_code_cell(source)


def write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


# -- the reference answers, run through their checks in one process ------------------------------

def reference_answers(number: str) -> dict:
    """{exercise id: (object, kwargs)} that the released lesson's own solution cells hand to their
    check cells, run in this process from the mini lesson (setup, parameters, exercises), in a
    namespace of its own. `%%writefile {expr}` cells (lesson 07) write their file."""
    import re

    from course_utils.grading.lessons import released_lessons
    lesson = next(l for l in released_lessons().values() if l.name.startswith(number + "-"))
    nb = mini_lesson(lesson.path.name)
    handed: dict = {}

    def check(exercise_id, obj, **kwargs):
        handed[exercise_id] = (obj, kwargs)

    ns: dict = {"__name__": "__main__"}
    for cell in nb.cells:
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        source = cell.source
        magic = re.match(r"%%writefile\s+(.*)\n", source)
        if magic:
            target = eval("f" + repr(magic.group(1).strip()), ns)
            Path(target).write_text(source[magic.end():])
            continue
        exec(compile(source, f"<cell {cell.get('id')}>", "exec"), ns)
        ns["check"] = check
    return handed


def run_references_twice(numbers, skip=()) -> list[dict]:
    """Each reference answer through its check twice in this process: one dict per exercise (one
    with "error" for a lesson whose cells did not run)."""
    import time
    import traceback

    from course_utils.checks import run_check
    out = []
    for number in numbers:
        t0 = time.perf_counter()
        try:
            answers = reference_answers(number)
        except Exception:
            out.append({"lesson": number, "error": traceback.format_exc()})
            continue
        setup_s = time.perf_counter() - t0
        for exercise_id, (obj, kwargs) in answers.items():
            if exercise_id in skip:
                continue
            runs = [run_check(exercise_id, obj, **kwargs) for _ in range(2)]
            out.append({"exercise": exercise_id, "status": [r.status for r in runs],
                        "message": [r.message for r in runs], "seconds": [r.seconds for r in runs],
                        "setup_s": round(setup_s, 2)})
    return out


def measure_references(numbers, skip=(), repeats: int = 2) -> list[dict]:
    """Each reference answer through the grader's checker (a forked process per check, as graded),
    `repeats` times: the seconds its check took (what `_core.TIME_LIMITS_S` is fitted to)."""
    import os
    import tempfile

    import cloudpickle

    from course_utils.grade import _Checker
    tmp = Path(tempfile.mkdtemp(prefix="measure-"))
    checker = _Checker([f"course_utils.checks.lesson{int(n):02d}" for n in numbers], tmp / "checker.log")
    out = []
    try:
        for number in numbers:
            for exercise_id, (obj, kwargs) in reference_answers(number).items():
                if exercise_id in skip:
                    continue
                payload = tmp / f"{exercise_id}.pkl"
                payload.write_bytes(cloudpickle.dumps((obj, kwargs, {})))
                answers = [checker.run({"exercise": exercise_id, "payload": str(payload), "cwd": str(tmp),
                                        "env": dict(os.environ), "seed": 7 + i, "limit_s": 900,
                                        "log": str(tmp / f"{exercise_id}.log")}) for i in range(repeats)]
                out.append({"exercise": exercise_id, "status": [a["status"] for a in answers],
                            "seconds": [a["seconds"] for a in answers]})
    finally:
        checker.close()
    return out


if __name__ == "__main__":   # python tests/unit/gradekit.py twice|measure 00 01 ... [--skip 2.2,8.1]
    import json
    import sys
    command, args = sys.argv[1], sys.argv[2:]
    skip = ()
    if "--skip" in args:
        at = args.index("--skip")
        skip = tuple(args[at + 1].split(","))
        args = args[:at] + args[at + 2:]
    run = {"twice": run_references_twice, "measure": measure_references}[command]
    for row in run(args, skip):
        print(json.dumps(row), flush=True)
