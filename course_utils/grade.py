"""Grade notebooks headless: `python -m course_utils.grade NOTEBOOK... [--smoke] [--json FILE]`.

Each notebook runs top to bottom with papermill (`--smoke` sets its `SMOKE` parameter and env
COURSE_SMOKE=1), its check cells append their results to a private results file, and the
grader prints one table: notebook, exercise, status, points, message. A check cell that never
ran is reported as `missing`; a notebook that crashes outside an exercise is reported as
`crashed`, with the cell. The exit status is 0 only when every check of every notebook passed.

Instructors: `make grade NB="submissions/*.ipynb" GRADE_FLAGS=` grades at full size.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["grade_notebook", "check_cells", "NotebookGrade", "main"]

CHECK_CALL = re.compile(r"""^\s*check\(\s*["'](\d+\.\d+)["']""", re.M)


def check_cells(path) -> list[str]:
    """Exercise ids of the check cells in a notebook, in order."""
    import nbformat
    nb = nbformat.read(str(path), as_version=4)
    ids = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            ids += CHECK_CALL.findall(cell.source)
    return ids


@dataclass
class NotebookGrade:
    notebook: str
    records: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    crashed: str | None = None

    @property
    def passed(self) -> bool:
        return bool(self.records) and not self.crashed and all(r["status"] == "pass" for r in self.records)


def grade_notebook(path, *, smoke: bool = False, output_dir=None, timeout_s: int = 900) -> NotebookGrade:
    """Execute one notebook headless and collect its check results."""
    import papermill as pm

    path = Path(path).resolve()
    name = path.name
    expected = check_cells(path)
    grade = NotebookGrade(name)
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        results = Path(tmp) / "results.jsonl"
        out = Path(output_dir).resolve() / name if output_dir else Path(tmp) / name
        out.parent.mkdir(parents=True, exist_ok=True)
        env_backup = dict(os.environ)
        os.environ.update({"COURSE_RESULTS": str(results), "COURSE_NOTEBOOK": name})
        os.environ.pop("COURSE_STRICT", None)
        if smoke:
            os.environ["COURSE_SMOKE"] = "1"
        t0 = time.perf_counter()
        try:
            pm.execute_notebook(str(path), str(out), parameters={"SMOKE": True} if smoke else {},
                                kernel_name="python3", cwd=str(path.parent), progress_bar=False,
                                execution_timeout=timeout_s)
        except pm.PapermillExecutionError as exc:
            grade.crashed = (f"crashed outside an exercise in {_cell_name(out, exc.exec_count)}: "
                             f"{exc.ename}: {exc.evalue}")
        except Exception as exc:  # kernel died, timeout, unreadable notebook
            grade.crashed = f"could not be executed: {type(exc).__name__}: {exc}"
        finally:
            grade.seconds = time.perf_counter() - t0
            os.environ.clear()
            os.environ.update(env_backup)
        recorded = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    for r in recorded:
        grade.records.append({"notebook": name, "exercise": r["exercise"], "status": r["status"],
                              "points": r["points"], "max_points": r["max_points"], "message": r["message"]})
    seen = Counter(r["exercise"] for r in recorded)
    for ex in expected:
        if seen[ex]:
            seen[ex] -= 1
        else:
            grade.records.append({"notebook": name, "exercise": ex, "status": "missing", "points": 0,
                                  "max_points": 0, "message": "this check cell did not run"
                                  + (" (the notebook stopped earlier)" if grade.crashed else "")})
    if grade.crashed:
        grade.records.append({"notebook": name, "exercise": "-", "status": "crashed", "points": 0,
                              "max_points": 0, "message": grade.crashed})
    return grade


def _cell_name(executed_path, exec_count) -> str:
    """'cell N (`first line`)' for the cell that ran with `exec_count`, N counted from 1 in the
    notebook as written (papermill's injected parameters and error banners do not count)."""
    import nbformat
    try:
        cells = nbformat.read(str(executed_path), as_version=4).cells
    except Exception:
        return f"the cell with execution count {exec_count}"
    added = {"injected-parameters", "papermill-error-cell-tag"}
    written = [c for c in cells if not added & set(c.metadata.get("tags", []))]
    for number, cell in enumerate(written, start=1):
        if cell.cell_type == "code" and cell.get("execution_count") == exec_count:
            first = next((line for line in cell.source.splitlines() if line.strip()), "")
            return f"cell {number} (`{first.strip()[:60]}`)"
    return f"the cell with execution count {exec_count}"


def _table(grades: list[NotebookGrade]) -> str:
    rows = [("notebook", "exercise", "status", "points", "message")]
    for g in grades:
        for r in g.records:
            msg = r["message"] if len(r["message"]) <= 100 else r["message"][:97] + "..."
            rows.append((g.notebook, r["exercise"], r["status"], f"{r['points']}/{r['max_points']}", msg))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 7)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", help="notebooks to grade")
    parser.add_argument("--smoke", action="store_true", help="quick sizes (SMOKE parameter, COURSE_SMOKE=1)")
    parser.add_argument("--json", metavar="FILE", help="write every record to FILE as a JSON list")
    parser.add_argument("--output-dir", metavar="DIR", help="keep the executed notebooks in DIR")
    parser.add_argument("--timeout", type=int, default=900, help="seconds a single cell may run (default 900)")
    args = parser.parse_args(argv)

    grades = []
    for nb in args.notebooks:
        if not Path(nb).is_file():
            parser.error(f"no such notebook: {nb}")
        print(f"grading {nb} {'(smoke)' if args.smoke else '(full size)'} ...", flush=True)
        g = grade_notebook(nb, smoke=args.smoke, output_dir=args.output_dir, timeout_s=args.timeout)
        earned = sum(r["points"] for r in g.records)
        possible = sum(r["max_points"] for r in g.records)
        print(f"  {g.notebook}: {earned}/{possible} points in {g.seconds:.1f} s"
              + (f"; {g.crashed}" if g.crashed else ""), flush=True)
        grades.append(g)
    print()
    print(_table(grades))
    records = [r for g in grades for r in g.records]
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(records, indent=2) + "\n")
    ok = all(g.passed for g in grades)
    total = sum(r["points"] for r in records), sum(r["max_points"] for r in records)
    print(f"\n{'ALL CHECKS PASSED' if ok else 'NOT ALL CHECKS PASSED'}: {total[0]}/{total[1]} points")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
