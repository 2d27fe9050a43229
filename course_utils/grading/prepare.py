"""The notebook the grader runs: the submission, with the released check cells restored.

Every check statement of the submission (`check("N.M", ...)` at the top level of a cell) is
taken out, a cell that is the released check cell (by its id) but was edited is dropped, and
for each exercise of the released lesson its own check cell is put back once, after the
learner's exercise cell, wrapped so that it hands the object to the grader (see `handin`)
instead of grading it in the submission's kernel. Everything else the learner wrote stays.
"""
from __future__ import annotations

import ast
import copy
import re
import textwrap
from dataclasses import dataclass, field

from .lessons import EXERCISE_HEADING, STUB, Lesson

__all__ = ["Prepared", "prepare", "cell_label", "GRADER_TAG"]

GRADER_TAG = "course-grader-check"
PARAMETERS_TAG = "injected-parameters"


@dataclass
class Prepared:
    nb: object                                   # the notebook to execute
    origin: list                                 # graded index -> submission cell number (1-based) or None
    handin_cells: dict = field(default_factory=dict)     # exercise id -> graded index of its restored cell
    exercise_cells: dict = field(default_factory=dict)   # exercise id -> graded index of the learner's cell
    notes: list = field(default_factory=list)            # what was restored, replaced or ignored

    def label(self, index: int) -> str:
        """'cell N (`first line`)', N counted in the submission as written."""
        return cell_label(self.nb.cells[index], self.origin[index])


def cell_label(cell, number) -> str:
    first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
    first = first if len(first) <= 50 else first[:47] + "..."
    where = f"cell {number}" if number else "the grader's cell"
    return f"{where} (`{first}`)"


def _check_statements(source: str):
    """(ids of top-level check calls, source with them removed) or None when it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    lines = source.splitlines(keepends=True)
    ids, drop = [], set()
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "check":
            first = call.args[0] if call.args else None
            ids.append(first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else "?")
            drop |= set(range(node.lineno - 1, node.end_lineno))
    rest = "".join(line for i, line in enumerate(lines) if i not in drop)
    return ids, rest


def _defines(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        names = set(re.findall(r"^(?:def|class)\s+(\w+)", source, re.M))
        return names | set(re.findall(r"^(\w+)\s*=", source, re.M))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def handin_source(lesson: Lesson, exercise) -> str:
    body = textwrap.indent(exercise.check_source.rstrip() or "pass", "    ")
    return (f"# Restored by the grader from the released {lesson.name}: this check cell hands exercise\n"
            f"# {exercise.id} to the grader's own checker process (nothing printed here is a verdict).\n"
            f"def _course_check_cell(check):\n{body}\n"
            f"__import__(\"course_utils.grading.handin\", fromlist=[\"run_check_cell\"]).run_check_cell("
            f"\"{exercise.id}\", _course_check_cell)\n"
            f"del _course_check_cell\n")


def prepare(submission, lesson: Lesson, *, smoke: bool) -> Prepared:
    """The notebook to execute for `submission` (an nbformat v4 notebook) graded as `lesson`."""
    import nbformat

    nb = copy.deepcopy(submission)
    released_check_ids = {e.check_cell_id: e for e in lesson.exercises if e.check_cell_id}
    counts: dict[str, int] = {}
    notes: list[str] = []
    cells, origin = [], []
    for number, cell in enumerate(nb.cells, start=1):
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            for key in ("execution", "papermill"):
                cell.metadata.pop(key, None)
            tags = cell.metadata.get("tags", [])
            if GRADER_TAG in tags or PARAMETERS_TAG in tags:
                notes.append(f"cell {number} looked like a grader's cell and was dropped")
                continue
            parsed = _check_statements(cell.source)
            was_check_cell = released_check_ids.get(cell.get("id"))
            if was_check_cell is not None and cell.source.strip() != was_check_cell.check_source.strip():
                notes.append(f"the check cell of exercise {was_check_cell.id} (cell {number}) was edited; "
                             "the released one replaced it")
            if parsed is None:
                if was_check_cell is not None:
                    continue
            else:
                ids, rest = parsed
                for ex_id in ids:
                    counts[ex_id] = counts.get(ex_id, 0) + 1
                if was_check_cell is not None and not (_defines(rest) & set(was_check_cell.uses)):
                    continue      # the check cell itself: the released one replaces it
                if ids:
                    if not rest.strip():
                        continue  # a copy of a check cell
                    cell.source = rest
        cells.append(cell)
        origin.append(number)
    for e in lesson.exercises:
        n = counts.get(e.id, 0)
        if n == 0:
            notes.append(f"the check cell of exercise {e.id} was missing; the released one was restored")
        elif n > 1:
            notes.append(f"exercise {e.id} had {n} check calls; the released check cell runs once")
    foreign = sorted(set(counts) - {e.id for e in lesson.exercises})
    if foreign:
        notes.append(f"check calls for {', '.join(foreign)} are not exercises of {lesson.label} and were ignored")

    # where each restored check cell goes: after the learner's exercise cell
    anchors, exercise_cells = {}, {}
    for e in lesson.exercises:
        anchor = None
        for i, cell in enumerate(cells):
            if e.exercise_cell_id and cell.get("id") == e.exercise_cell_id:
                anchor = i
        if anchor is None:
            for i, cell in enumerate(cells):
                if cell.cell_type == "code" and _defines(cell.source) & set(e.uses or e.defines):
                    anchor = i
        if anchor is None:
            for i, cell in enumerate(cells):
                if cell.cell_type == "code" and e.id in STUB.findall(cell.source):
                    anchor = i
        exercise_cells[e.id] = anchor if anchor is not None and cells[anchor].cell_type == "code" else None
        if anchor is None:
            for i, cell in enumerate(cells):
                if cell.cell_type == "markdown" and e.id in EXERCISE_HEADING.findall(cell.source):
                    anchor = i
        anchors[e.id] = len(cells) - 1 if anchor is None else anchor

    parameters_at = None
    for i, cell in enumerate(cells):
        if cell.cell_type == "code" and ("parameters" in cell.metadata.get("tags", [])
                                         or (lesson.parameters_cell_id and cell.get("id") == lesson.parameters_cell_id)):
            parameters_at = i
            break

    used_ids = {c.get("id") for c in cells}
    out_cells, out_origin = [], []
    handin_cells, learner_cells = {}, {}

    def add(cell, number):
        out_cells.append(cell)
        out_origin.append(number)

    def parameters_cell():
        cell = nbformat.v4.new_code_cell("# Parameters injected by the grader (--smoke)\nSMOKE = True\n")
        cell.metadata["tags"] = [PARAMETERS_TAG]
        cell["id"] = _unique("grader-parameters", used_ids)
        return cell

    if smoke and parameters_at is None:
        add(parameters_cell(), None)
    for i, cell in enumerate(cells):
        add(cell, origin[i])
        for e_id, at in exercise_cells.items():
            if at == i:
                learner_cells[e_id] = len(out_cells) - 1
        if smoke and i == parameters_at:
            add(parameters_cell(), None)
        for e in lesson.exercises:
            if anchors[e.id] == i:
                restored = nbformat.v4.new_code_cell(handin_source(lesson, e))
                restored.metadata["tags"] = [GRADER_TAG]
                restored.metadata["course_grader"] = {"exercise": e.id}
                restored["id"] = _unique("grader-" + e.id.replace(".", "-"), used_ids)
                add(restored, None)
                handin_cells[e.id] = len(out_cells) - 1
    if not cells:   # an empty notebook still gets its check cells
        for e in lesson.exercises:
            restored = nbformat.v4.new_code_cell(handin_source(lesson, e))
            restored.metadata["tags"] = [GRADER_TAG]
            restored.metadata["course_grader"] = {"exercise": e.id}
            restored["id"] = _unique("grader-" + e.id.replace(".", "-"), used_ids)
            add(restored, None)
            handin_cells[e.id] = len(out_cells) - 1
    nb.cells = out_cells
    nb.metadata.pop("papermill", None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    return Prepared(nb, out_origin, handin_cells, learner_cells, notes)


def _unique(base: str, used: set) -> str:
    name, n = base, 1
    while name in used:
        n += 1
        name = f"{base}-{n}"
    used.add(name)
    return name
