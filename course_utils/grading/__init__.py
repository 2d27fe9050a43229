"""The grader's parts (the command line is `python -m course_utils.grade`).

- `lessons`:  the released lessons (the course's own solutions/), their exercises and points,
              and which lesson a submitted notebook is;
- `prepare`:  the notebook the grader runs: the submission with the released check cells
              restored as hand-in cells, parameters injected;
- `kernel`:   runs it in a Jupyter kernel, cell by cell, with limits, and survives errors,
              timeouts and kernel deaths;
- `handin`:   inside that kernel: copies each exercise's object out to the checker;
- `checker`:  the trusted process that runs the checks, one forked process per check;
- `review`:   static signs that a submission reaches for the grading machinery;
- `reap`:     no process a kernel or a check started outlives it (markers, subreapers);
- `report`:   the table, the JSON and the CSV gradebook.
"""
