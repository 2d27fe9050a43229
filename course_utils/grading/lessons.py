"""The released lessons, and which lesson a submitted notebook is.

What a lesson's exercises and points are comes from the course itself, never from a
submission: the released copy of each lesson (`solutions/NN-name.ipynb` of the course the
grader is installed from) says which exercises it has and what its check cells look like, and
the check registry (`course_utils.checks`, the `@exercise` declarations) gives each one's points
and time limit. A new lesson in `solutions/` with its `course_utils/checks/lessonNN.py` is
graded without any change here.

A submission is identified by its content (exercise headings, stubs, check calls and the
released cells' ids), checked against the metadata `make student` writes
(`metadata.course.lesson`); the file name only says which lesson was *expected*.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

__all__ = ["ROOT", "Exercise", "Lesson", "LessonError", "Identification", "released_lessons",
           "identify", "expected_from_name", "exercise_ids_in", "check_calls", "EXERCISE_HEADING",
           "registered", "released_lines"]

ROOT = Path(__file__).resolve().parents[2]
EXERCISE_HEADING = re.compile(r"^#{2,3}\s+Exercise\s+(\d+\.\d+)", re.M)
STUB = re.compile(r"""NotImplementedError\(\s*["']Exercise\s+(\d+\.\d+)["']""")
CHECK_CALL = re.compile(r"""^\s*check\(\s*["'](\d+\.\d+)["']""", re.M)
LESSON_FILE = re.compile(r"^(\d{2})-")
SOLUTION_BEGIN = "### BEGIN SOLUTION"


class LessonError(RuntimeError):
    """The course's own released lesson is not gradable (a maintainer's bug, never the learner's)."""


@dataclass(frozen=True)
class Exercise:
    id: str                      # "1.2"
    title: str
    points: int
    time_limit_s: float
    check_source: str            # the released check cell, e.g. 'check("1.2", stall_fraction)'
    check_cell_id: str | None
    exercise_cell_id: str | None  # the released cell holding the solution region
    defines: tuple[str, ...]     # names the released exercise cell defines at top level
    uses: tuple[str, ...]        # names the released check cell reads (what it hands over)


@dataclass(frozen=True)
class Lesson:
    name: str                    # "01-measure-the-baseline"
    number: int
    path: Path
    title: str
    exercises: tuple[Exercise, ...]
    cell_ids: frozenset[str] = field(repr=False)
    parameters_cell_id: str | None = None
    lines: frozenset[str] = field(default=frozenset(), repr=False)   # its code, stripped, line by line
    error: str | None = None     # why it cannot be graded (a check missing from the registry...)

    @property
    def max_points(self) -> int:
        return sum(e.points for e in self.exercises)

    @property
    def label(self) -> str:
        return f"lesson {self.name[:2]} ({self.name[3:]})"

    def exercise(self, exercise_id: str) -> Exercise:
        return next(e for e in self.exercises if e.id == exercise_id)


def check_calls(source: str) -> list[str]:
    """Exercise ids of the `check("N.M", ...)` calls that start a line of `source`."""
    return CHECK_CALL.findall(source)


def exercise_ids_in(nb) -> set[str]:
    """Every exercise id a notebook mentions in a heading, a stub or a check call."""
    ids = set()
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            ids |= set(EXERCISE_HEADING.findall(cell.source))
        elif cell.cell_type == "code":
            ids |= set(STUB.findall(cell.source)) | set(check_calls(cell.source))
    return ids


def registered(exercise_id: str) -> tuple[str, int, float]:
    """(title, points, time limit in s) of a registered check, from the course's registry."""
    from course_utils.checks import _core, list_exercises
    lesson = int(exercise_id.split(".")[0])
    try:
        list_exercises(lesson)
    except ModuleNotFoundError as exc:
        raise LessonError(f"the course has no checks for lesson {lesson:02d} "
                          f"(course_utils/checks/lesson{lesson:02d}.py): {exc}") from None
    spec = _core._REGISTRY.get(exercise_id)
    if spec is None:
        raise LessonError(f"exercise {exercise_id} has a check cell but no registered check "
                          f"(an @exercise(\"{exercise_id}\", ...) in course_utils/checks/lesson{lesson:02d}.py)")
    return spec.title, int(spec.points), float(spec.time_limit_s)


def _top_level_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _names_read(source: str) -> tuple[str, ...]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check":
            for arg in node.args[1:] + [k.value for k in node.keywords]:
                out += [n.id for n in ast.walk(arg) if isinstance(n, ast.Name) and n.id not in out]
    return tuple(out)


def _load_lesson(path: Path) -> Lesson:
    import nbformat
    m = LESSON_FILE.match(path.name)
    if not m:
        raise LessonError(f"{path.name}: a lesson's file name starts with its number, e.g. 01-name.ipynb")
    number = int(m.group(1))
    nb = nbformat.read(str(path), as_version=4)
    title = next((c.source.splitlines()[0].lstrip("# ").strip() for c in nb.cells
                  if c.cell_type == "markdown" and c.source.strip()), path.stem)
    exercises, current, solution_cell = [], None, {}
    parameters = None
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            heads = EXERCISE_HEADING.findall(cell.source)
            if heads:
                current = heads[-1]
            continue
        if cell.cell_type != "code":
            continue
        if "parameters" in cell.metadata.get("tags", []) and parameters is None:
            parameters = cell.get("id")
        if SOLUTION_BEGIN in cell.source and current:
            solution_cell[current] = cell
        for ex_id in check_calls(cell.source):
            if int(ex_id.split(".")[0]) != number:
                raise LessonError(f"{path.name}: check cell for exercise {ex_id} in lesson {number:02d}")
            if any(e[0] == ex_id for e in exercises):
                raise LessonError(f"{path.name}: exercise {ex_id} has two check cells")
            exercises.append((ex_id, cell))
    if not exercises:
        raise LessonError(f"{path.name} has no check cells")
    out, error = [], None
    for ex_id, cell in exercises:
        try:
            title_, points, limit = registered(ex_id)
        except LessonError as exc:   # this lesson cannot be graded; the others still can
            title_, points, limit, error = ex_id, 0, 0.0, error or f"{path.name}: {exc}"
        sol = solution_cell.get(ex_id)
        out.append(Exercise(ex_id, title_, points, limit, cell.source, cell.get("id"),
                            sol.get("id") if sol is not None else None,
                            tuple(sorted(_top_level_names(sol.source))) if sol is not None else (),
                            _names_read(cell.source)))
    ids = frozenset(c.get("id") for c in nb.cells if c.get("id"))
    lines = {line.strip() for c in nb.cells if c.cell_type == "code" for line in c.source.splitlines()}
    lines |= {"# YOUR CODE HERE"} | {f'raise NotImplementedError("Exercise {e.id}")' for e in out}
    return Lesson(path.stem, number, path, title, tuple(out), ids, parameters, frozenset(lines), error)


def released_lines(lesson: Lesson) -> frozenset[str]:
    """The released lesson's own code lines (stripped): what a review flag never holds against a learner."""
    return lesson.lines


@lru_cache(maxsize=8)
def _released(folder: str, stamp: tuple) -> dict[str, Lesson]:
    lessons = {}
    for path in sorted(Path(folder).glob("*.ipynb")):
        lesson = _load_lesson(path)
        lessons[lesson.name] = lesson
    return lessons


def released_lessons(folder=None) -> dict[str, Lesson]:
    """The course's released lessons by name, read from `solutions/` (or `folder`)."""
    folder = Path(folder) if folder else ROOT / "solutions"
    stamp = tuple((p.name, p.stat().st_mtime_ns) for p in sorted(folder.glob("*.ipynb")))
    if not stamp:
        raise LessonError(f"no released lessons in {folder}")
    return _released(str(folder), stamp)


@dataclass
class Identification:
    lesson: Lesson | None
    note: str | None = None          # how it was told, when it is not plain
    expected: Lesson | None = None   # what the file name (or --lesson) asked for

    @property
    def mismatch(self) -> bool:
        return self.expected is not None and (self.lesson is None or self.lesson.name != self.expected.name)


def expected_from_name(file_name: str, lessons: dict[str, Lesson]) -> Lesson | None:
    """The lesson a file name announces by its `NN-` prefix (None when it announces none)."""
    m = LESSON_FILE.match(Path(file_name).name)
    if not m:
        return None
    return next((lesson for lesson in lessons.values() if lesson.number == int(m.group(1))), None)


def _content_score(nb, lesson: Lesson, ids_seen: set[str], cell_ids: set[str], title: str) -> float:
    mine = {e.id for e in lesson.exercises}
    score = len(ids_seen & mine) / len(mine)
    score += len(cell_ids & lesson.cell_ids) / max(1, len(lesson.cell_ids))
    if title and title == lesson.title:
        score += 0.5
    return score


def identify(nb, lessons: dict[str, Lesson], *, expected: Lesson | None = None) -> Identification:
    """Which released lesson `nb` is: by content, checked against `metadata.course.lesson`."""
    ids_seen = exercise_ids_in(nb)
    cell_ids = {c.get("id") for c in nb.cells if c.get("id")}
    title = next((c.source.splitlines()[0].lstrip("# ").strip() for c in nb.cells
                  if c.cell_type == "markdown" and c.source.strip()), "")
    scores = {name: _content_score(nb, lesson, ids_seen, cell_ids, title) for name, lesson in lessons.items()}
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])
    meta = nb.metadata.get("course", {}) if isinstance(nb.metadata.get("course"), dict) else {}
    claimed = lessons.get(str(meta.get("lesson")))
    best, best_score = ranked[0] if ranked else (None, 0.0)
    if best_score > 0 and (len(ranked) < 2 or ranked[1][1] < best_score):
        lesson = lessons[best]
        note = None
        if claimed is not None and claimed.name != lesson.name:
            note = (f"its metadata says {claimed.label}, but its content is {lesson.label}: "
                    f"graded as {lesson.label}")
        return Identification(lesson, note, expected)
    if claimed is not None:
        return Identification(claimed, f"its content has none of {claimed.label}'s exercises; "
                                       f"graded as {claimed.label} by its metadata", expected)
    if best_score > 0:
        tied = " and ".join(lessons[n].label for n, s in ranked if s == best_score)
        return Identification(None, f"its content matches {tied} equally", expected)
    return Identification(None, "it has no exercise of any released lesson and no course metadata", expected)
