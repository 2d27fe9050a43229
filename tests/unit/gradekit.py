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
