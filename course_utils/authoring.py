"""Authoring tools: student notebooks from solutions, and clean reference outputs.

    python -m course_utils.authoring student           # write notebooks/ from solutions/ (make student)
    python -m course_utils.authoring student --check   # fail if notebooks/ is out of date
    python -m course_utils.authoring refresh-outputs   # re-run solutions/ in smoke mode and store
                                                       # only the NBVAL_CHECK_OUTPUT cells' outputs

`solutions/` is the source of truth. In a code cell, every region between `### BEGIN SOLUTION`
and `### END SOLUTION` becomes, at the same indentation,

    # YOUR CODE HERE
    raise NotImplementedError("Exercise N.M")

where N.M comes from the nearest `## Exercise N.M` heading above. In markdown cells a region
between `<!-- BEGIN SOLUTION -->` and `<!-- END SOLUTION -->` becomes "_Your answer here._".
Student notebooks carry no outputs at all. Their notebook metadata says which lesson they are,
`{"course": {"lesson": "01-measure-the-baseline", "exercises": ["1.1", "1.2", "1.3"]}}`: the
grader checks that claim against the notebook's content to tell a submission's lesson.
"""
from __future__ import annotations

import argparse
import copy
import re
import sys
import tempfile
from pathlib import Path

import nbformat

__all__ = ["make_student", "student_source", "clean_solution", "refresh_outputs", "ROOT"]

ROOT = Path(__file__).resolve().parent.parent
EXERCISE_HEADING = re.compile(r"^#{2,3}\s+Exercise\s+(\d+\.\d+)", re.M)
CODE_REGION = re.compile(r"^([ \t]*)### BEGIN SOLUTION[^\n]*\n.*?^[ \t]*### END SOLUTION[^\n]*(\n|$)", re.M | re.S)
MD_REGION = re.compile(r"<!-- BEGIN SOLUTION -->.*?<!-- END SOLUTION -->", re.S)
KEEP_OUTPUT = "NBVAL_CHECK_OUTPUT"
_VOLATILE_CELL_METADATA = ("execution", "papermill", "collapsed", "scrolled", "jupyter")


class AuthoringError(ValueError):
    pass


def _stub(exercise_id: str, indent: str, newline: str) -> str:
    return f"{indent}# YOUR CODE HERE\n{indent}raise NotImplementedError(\"Exercise {exercise_id}\"){newline}"


def _clean_metadata(cell) -> None:
    for key in _VOLATILE_CELL_METADATA:
        cell.metadata.pop(key, None)


def student_source(nb: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """The student version of a solution notebook (a new object; the input is not changed)."""
    nb = copy.deepcopy(nb)
    current = None
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            headings = EXERCISE_HEADING.findall(cell.source)
            if headings:
                current = headings[-1]
            cell.source = MD_REGION.sub("_Your answer here._", cell.source)
        elif cell.cell_type == "code":
            if "### BEGIN SOLUTION" in cell.source:
                if current is None:
                    raise AuthoringError(f"{name}: cell {i} has a solution region but no '## Exercise N.M' heading above it")
                new = CODE_REGION.sub(lambda m: _stub(current, m.group(1), m.group(2)), cell.source)
                if "### BEGIN SOLUTION" in new or "### END SOLUTION" in new:
                    raise AuthoringError(f"{name}: cell {i} has an unmatched BEGIN/END SOLUTION marker")
                cell.source = new
            cell.outputs = []
            cell.execution_count = None
        _clean_metadata(cell)
    nb.metadata.pop("papermill", None)
    if name.endswith(".ipynb"):
        nb.metadata["course"] = {"lesson": Path(name).stem, "exercises": _check_ids(nb)}
    return nb


def _check_ids(nb) -> list[str]:
    """Exercise ids of the `check("N.M", ...)` calls that start a line of a code cell, in order."""
    call = re.compile(r"""^\s*check\(\s*["'](\d+\.\d+)["']""", re.M)
    return [ex for c in nb.cells if c.cell_type == "code" for ex in call.findall(c.source)]


def clean_solution(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Strip outputs except in NBVAL_CHECK_OUTPUT cells (whose outputs nbval compares)."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            if KEEP_OUTPUT in cell.source and cell.outputs:
                # nbval compares only cells that look executed: keep a count on them
                cell.execution_count = cell.execution_count or 1
                for out in cell.outputs:
                    if out.get("output_type") == "execute_result":
                        out["execution_count"] = cell.execution_count
                    if "metadata" in out:
                        out["metadata"] = {}
            else:
                cell.outputs = []
                cell.execution_count = None
        _clean_metadata(cell)
    nb.metadata.pop("papermill", None)
    return nb


def _dumps(nb) -> str:
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def make_student(solutions=ROOT / "solutions", notebooks=ROOT / "notebooks", *, check: bool = False,
                 only: list[str] | None = None) -> list[str]:
    """Write (or, with check=True, compare) every student notebook, or only those whose solution
    file names are in `only`. Returns the out-of-date names."""
    solutions, notebooks = Path(solutions), Path(notebooks)
    stale = []
    sources = sorted(solutions.glob("*.ipynb"))
    if only:
        wanted = {Path(name).name for name in only}
        sources = [p for p in sources if p.name in wanted]
    for src in sources:
        text = _dumps(student_source(nbformat.read(str(src), as_version=4), src.name))
        dest = notebooks / src.name
        if not dest.exists() or dest.read_text() != text:
            stale.append(src.name)
            if not check:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(text)
    extra = [] if only else sorted({p.name for p in notebooks.glob("*.ipynb")} - {p.name for p in sources})
    for name in extra:
        stale.append(name)
        if not check:
            (notebooks / name).unlink()
    return stale


def refresh_outputs(paths) -> None:
    """Execute solution notebooks in smoke mode and store the outputs of NBVAL_CHECK_OUTPUT cells."""
    import os
    import papermill as pm

    for path in paths:
        path = Path(path).resolve()
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / path.name
            os.environ["COURSE_SMOKE"] = "1"
            pm.execute_notebook(str(path), str(out), parameters={"SMOKE": True}, kernel_name="python3",
                                cwd=str(path.parent), progress_bar=False)
            executed = nbformat.read(str(out), as_version=4)
        source = nbformat.read(str(path), as_version=4)
        by_id = {c.get("id"): c for c in executed.cells}
        for cell in source.cells:
            if cell.cell_type == "code" and KEEP_OUTPUT in cell.source:
                cell.outputs = by_id[cell.get("id")].outputs
                cell.execution_count = by_id[cell.get("id")].execution_count
        path.write_text(_dumps(clean_solution(source)))
        print(f"refreshed {path.name}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.authoring")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("student", help="write notebooks/ from solutions/")
    p.add_argument("--check", action="store_true", help="only report notebooks that are out of date")
    p.add_argument("names", nargs="*", help="solution notebooks to convert (default: all)")
    p = sub.add_parser("clean", help="strip outputs from solutions/ except NBVAL_CHECK_OUTPUT cells")
    p.add_argument("paths", nargs="*")
    p = sub.add_parser("refresh-outputs", help="re-run solutions in smoke mode, keep NBVAL_CHECK_OUTPUT outputs")
    p.add_argument("paths", nargs="*")
    args = parser.parse_args(argv)
    if args.command == "student":
        stale = make_student(check=args.check, only=args.names or None)
        if args.check:
            if stale:
                print("notebooks/ is out of date for: " + ", ".join(stale) + ". Run `make student`.")
                return 1
            print("notebooks/ is up to date.")
        else:
            print(f"wrote {len(stale)} notebook(s)" + (": " + ", ".join(stale) if stale else ""))
        return 0
    paths = args.paths or sorted((ROOT / "solutions").glob("*.ipynb"))
    if args.command == "clean":
        for path in paths:
            path = Path(path)
            path.write_text(_dumps(clean_solution(nbformat.read(str(path), as_version=4))))
        return 0
    refresh_outputs(paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
