"""What the grader writes: the table it prints, the JSON of everything, the CSV gradebook."""
from __future__ import annotations

import csv
import io
import json

from .results import FORMAT, atomic_write

__all__ = ["table", "write_json", "write_csv", "csv_text", "exercise_columns", "verdict_line"]

ICONS = {"pass": "PASS", "fail": "FAIL", "not_implemented": "TODO", "error": "ERROR", "missing": "MISSING",
         "busy": "BUSY"}


def verdict_line(record: dict) -> str:
    """The line a check cell prints in the lab, for the executed copy."""
    icon = ICONS.get(record["status"], record["status"].upper())
    return (f"[{icon}] Exercise {record['exercise']} ({record['points']}/{record['max_points']} points): "
            f"{record['message']}")


def _short(text: str, width: int = 110) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 3] + "..."


def table(submissions: list[dict]) -> str:
    """One row per exercise and a total per submission; notes and review flags below."""
    rows = [("submission", "exercise", "status", "points", "message")]
    for s in submissions:
        for r in s["exercises"]:
            rows.append((s["submission"], r["exercise"], r["status"], f"{r['points']}/{r['max_points']}",
                         _short(r["message"])))
        summary = s["status"].replace("_", " ") + (f"; {len(s['review'])} REVIEW flag(s)" if s["review"] else "")
        if s.get("reason"):
            summary += f": {s['reason']}"
        rows.append((s["submission"], "total", "", f"{s['points']}/{s['max_points']}", _short(summary)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 7)
    extra = []
    for s in submissions:
        for note in s["notes"]:
            extra.append(f"  {s['submission']}: {note}")
        for flag in s["review"]:
            extra.append(f"  {s['submission']}: REVIEW: {flag}")
    if extra:
        lines += ["", "Notes:"] + extra
    return "\n".join(lines)


def write_json(path, run: dict, submissions: list[dict]) -> None:
    """The whole gradebook as JSON, written atomically (see `results.atomic_write`)."""
    atomic_write(path, json.dumps({"results_format": FORMAT, "grader": run, "submissions": submissions},
                                  indent=2) + "\n")


def exercise_columns(submissions: list[dict]) -> list[str]:
    ids = {r["exercise"] for s in submissions for r in s["exercises"]}
    return sorted(ids, key=lambda e: tuple(int(x) for x in e.split(".")))


def csv_text(submissions: list[dict]) -> str:
    """The gradebook: one row per submission, a column per exercise, the total."""
    columns = exercise_columns(submissions)
    f = io.StringIO(newline="")
    out = csv.writer(f)
    out.writerow(["submission", "path", "lesson", "status"] + [f"ex {c}" for c in columns]
                 + ["points", "max_points", "review_flags", "notes"])
    for s in submissions:
        points = {r["exercise"]: r["points"] for r in s["exercises"]}
        out.writerow([s["submission"], s["path"], s["lesson"] or "", s["status"]]
                     + [points.get(c, "") for c in columns]
                     + [s["points"], s["max_points"], len(s["review"]), " | ".join(s["notes"])])
    return f.getvalue()


def write_csv(path, submissions: list[dict]) -> None:
    """The CSV gradebook, written atomically (rebuilt from the results after every submission)."""
    atomic_write(path, csv_text(submissions))
