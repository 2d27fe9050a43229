"""One notebook's runner: `python -m course_utils.grading.runner JOB.json` (started by the grader).

The grader starts one runner per notebook, in a session of its own, and the runner starts the
notebook's kernel (`grading.kernel`): so the kernel's parent is its own runner, never the grader.
A notebook that kills its kernel's parent (`os.kill(os.getppid(), SIGKILL)`) ends its own run
only; the grader records it and goes on with the others, and its results file holds them all.

The runner makes itself non-dumpable (no process of the same user opens its pipes through
/proc) and a child subreaper: what the kernel orphans (a process that forks twice, clears its
environment, starts a session of its own) becomes the runner's child, and is killed with
everything else below it when the notebook is done. The grader itself is not a subreaper while
notebooks run, so that a kernel whose runner died is never adopted by the grader.

Protocol: JOB.json names the pickled `Prepared` notebook, the kernel's folder, environment, limits
and log, and where to write the executed notebook. stdout (a private copy of it: anything else the
runner prints goes to its log) carries JSON lines: {"cell": i} before cell i runs, and at the end
{"execution": {...}} (a `kernel.Execution`).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pickle
import sys
from pathlib import Path


def light_imports() -> None:
    """Leave out what nbformat's schema validator imports and the grader never needs: jsonschema's
    optional IRI checker (`rfc3987_syntax`) builds a grammar at import, a second of CPU per process
    (and per notebook, in its runner). jsonschema then simply does not check the "iri" format."""
    if "rfc3987_syntax" not in sys.modules:
        sys.modules["rfc3987_syntax"] = None


def _reply(out, message: dict) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def main(argv=None) -> int:
    light_imports()
    from course_utils.grading import reap
    from course_utils.grading.checker import _non_dumpable
    from course_utils.grading.kernel import execute
    _non_dumpable()
    reap.become_subreaper()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    job = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    reap.die_with_parent(job.get("parent"))   # a grader killed with SIGKILL takes its runners with it
    prepared = pickle.loads(Path(job["prepared"]).read_bytes())

    def on_cell(index: int) -> None:
        _reply(out, {"cell": index})

    try:
        x = asyncio.run(execute(prepared, cwd=Path(job["cwd"]), env=job["env"], cell_timeout=job["cell_timeout_s"],
                                notebook_timeout=job["notebook_timeout_s"], log_path=Path(job["log"]),
                                on_cell=on_cell))
        import nbformat
        nbformat.write(prepared.nb, job["executed"])
    finally:
        reap.kill_children()   # what the kernel orphaned below us
        reap.kill_marked(job["env"].get(reap.ENV, ""))
    _reply(out, {"execution": dataclasses.asdict(x)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
