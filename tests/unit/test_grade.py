"""The grader end to end, on one batch of submissions that each carry a defect an instructor met.

One batch (real kernels, real checks of lessons 00 and 01, two notebooks at a time) is graded
once for the module; each test reads its own submission's row. Every test here failed on the
grader before issue 12.
"""
import csv
import json

import nbformat
import pytest

import gradekit as kit
from course_utils import grade as grade_mod
from course_utils.grade import GradeOptions, check_cells, grade, main
from course_utils.grading import kernel

SEED = 1234


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batch")
    solutions = kit.mini_course(tmp / "course")
    subs = tmp / "submissions"
    paths = []

    # alice: solved 00 with its check cell copied three more times (was: 4 of 1 points)
    nb = kit.solved(solutions, "00")
    at = kit.check_cell(nb, "0.1")
    for _ in range(3):
        nb.cells.insert(at, kit.code('check("0.1", to_image)'))
    paths.append(kit.write(nb, subs / "alice" / "00-welcome-and-setup.ipynb"))

    # bob: unsolved 00 that redefines `check`, forges and garbles the results file, and edits
    # its check cell into a fake PASS line (was: full marks, exit 0)
    nb = kit.unsolved(solutions, "00")
    nb.cells.insert(2, kit.code(
        "import json, os\n"
        "def check(*args, **kwargs):\n"
        "    print('[PASS] Exercise 0.1 (1/1 points): all properties hold.')\n"
        "path = os.environ.get('COURSE_RESULTS', 'results.jsonl')\n"
        "with open(path, 'w') as f:\n"
        "    f.write(json.dumps({'exercise': '0.1', 'status': 'pass', 'points': 1, 'max_points': 1,\n"
        "                        'message': 'forged'}) + '\\n')\n"
        "    f.write('this is not json {\\n')\n"))
    nb.cells[kit.check_cell(nb, "0.1")].source = "print('[PASS] Exercise 0.1 (1/1 points): all properties hold.')"
    paths.append(kit.write(nb, subs / "bob" / "00-welcome-and-setup.ipynb"))

    # carol: lesson 00, solved, handed in under lesson 01's file name (was: ALL CHECKS PASSED)
    paths.append(kit.write(kit.solved(solutions, "00"), subs / "carol" / "01-measure-the-baseline.ipynb"))

    # dave: 1.1 has a syntax error; 1.2 solved but its check cell deleted; 1.3 and 1.4 solved; a cell calls
    # sys.exit and another kills the kernel (was: 1.2 and 1.3 "missing 0/0", total 0/0)
    nb = kit.solved(solutions, "01")
    ex11 = kit.index_of(nb, lambda c: c.get("id") == "01-024")
    nb.cells[ex11].source = "def time_it(fn, device, warmup=3, repeats=10):\n    return (\n"
    del nb.cells[kit.check_cell(nb, "1.2")]
    nb.cells.insert(ex11 + 1, kit.code("import sys\nsys.exit(3)"))
    at = kit.index_of(nb, lambda c: c.get("id") == "01-029")
    nb.cells.insert(at + 1, kit.code("import os\nos._exit(1)"))
    paths.append(kit.write(nb, subs / "dave" / "01-measure-the-baseline.ipynb"))

    # erin: 1.2 still a stub with its check cell deleted (was: all passed); 1.1 uses a global that
    # cannot be copied out of the notebook; 1.3 and 1.4 solved
    nb = kit.solved(solutions, "01")
    stub = kit.unsolved(solutions, "01")
    at = kit.index_of(nb, lambda c: c.get("id") == "01-029")
    nb.cells[at].source = stub.cells[at].source
    del nb.cells[kit.check_cell(nb, "1.2")]
    ex11 = kit.index_of(nb, lambda c: c.get("id") == "01-024")
    nb.cells[ex11].source = ("import threading\n_lock = threading.Lock()\n" + nb.cells[ex11].source.replace(
        "    ### BEGIN SOLUTION\n", "    ### BEGIN SOLUTION\n    with _lock:\n        pass\n", 1))
    paths.append(kit.write(nb, subs / "erin" / "01-measure-the-baseline.ipynb"))

    # frank: a truncated file in the middle of the batch (was: the batch stopped, no table, no JSON)
    text = (solutions / kit.SOURCES["01"]).read_text()
    (subs / "frank").mkdir(parents=True)
    (subs / "frank" / "01-measure-the-baseline.ipynb").write_text(text[: len(text) // 2])
    paths.append(subs / "frank" / "01-measure-the-baseline.ipynb")

    # gina: solved 00; a cell leaves a detached process behind (double fork, new session: no longer
    # the kernel's descendant), and so does her to_image when the checker calls it (with an empty
    # environment too); a cell notes where tempfile writes (was: processes and temp files left)
    sleeper = tmp / "sleeper.py"
    sleeper.write_text(SLEEPER)
    nb = kit.solved(solutions, "00")
    at = kit.index_of(nb, lambda c: c.get("id") == "00-020")
    pids = tmp / "pids"
    pids.mkdir()
    nb.cells.insert(at, kit.code(
        "import subprocess, sys, tempfile\n"
        f"subprocess.run([sys.executable, {str(sleeper)!r}, {str(pids / 'kernel')!r}, 'detach'], check=True)\n"
        f"open({str(pids / 'tempdir')!r}, 'w').write(tempfile.mkdtemp())"))
    nb.cells[at + 1].source += (
        "\n\n\n_solved = to_image\n\n\n"
        "def to_image(x):\n"
        "    import os, subprocess, sys\n"
        f"    if not os.path.exists({str(pids / 'check')!r}):\n"
        f"        subprocess.run([sys.executable, {str(sleeper)!r}, {str(pids / 'check')!r}, 'detach', 'noenv'])\n"
        "    return _solved(x)\n")
    paths.append(kit.write(nb, subs / "gina" / "00-welcome-and-setup.ipynb"))

    # hal: solved 00, then a cell that kills its kernel's parent, again and again (was: the grader killed,
    # no verdict for the others, no JSON)
    nb = kit.solved(solutions, "00")
    nb.cells.insert(kit.check_cell(nb, "0.1") + 1, kit.code(
        "import os, signal, time\n"
        "for _ in range(3):\n"
        "    os.kill(os.getppid(), signal.SIGKILL)\n"
        "    time.sleep(1)"))
    nb.cells.append(kit.code("print('never')"))
    paths.insert(0, kit.write(nb, subs / "hal" / "00-welcome-and-setup.ipynb"))   # graded first

    calls = []
    real_run = grade_mod._Checker.run
    real_exec = grade_mod._execute_in_runner

    def run(self, task):
        calls.append(("check", grade_mod.time.monotonic()))
        return real_run(self, task)

    async def execute(*args, **kwargs):
        t0 = grade_mod.time.monotonic()
        out = await real_exec(*args, **kwargs)
        calls.append(("notebook", (t0, grade_mod.time.monotonic())))
        return out

    grade_mod._Checker.run = run
    grade_mod._execute_in_runner = execute
    try:
        opts = GradeOptions(smoke=True, cell_timeout_s=300, notebook_timeout_s=600, jobs=2, seed=SEED,
                            output_dir=tmp / "out", solutions=solutions, quiet=True)
        code, run_info, rows = grade([str(p) for p in paths], opts)
    finally:
        grade_mod._Checker.run = real_run
        grade_mod._execute_in_runner = real_exec
    from course_utils.grading import report
    report.write_json(tmp / "grades.json", run_info, rows)
    report.write_csv(tmp / "grades.csv", rows)
    by = {r["submission"]: r for r in rows}
    return {"code": code, "run": run_info, "rows": rows, "by": by, "tmp": tmp, "calls": calls,
            "solutions": solutions, "pids": pids}


SLEEPER = '''import os, subprocess, sys, time
pidfile, mode = sys.argv[1], sys.argv[2]
if mode == "detach":   # start the sleeper in a session of its own and leave: it is orphaned
    env = {} if "noenv" in sys.argv[3:] else None
    subprocess.Popen([sys.executable, __file__, pidfile, "sleep"], start_new_session=True, env=env)
    deadline = time.time() + 30
    while not os.path.exists(pidfile) and time.time() < deadline:
        time.sleep(0.05)
    sys.exit(0)
with open(pidfile + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(pidfile + ".tmp", pidfile)
time.sleep(600)
'''


def _row(batch, who, lesson):
    return batch["by"][f"{who}/{lesson}.ipynb"]


def _ex(row, exercise_id):
    return next(r for r in row["exercises"] if r["exercise"] == exercise_id)


def test_every_submission_gets_a_row_and_the_batch_exit_status_is_not_passed(batch):
    assert len(batch["rows"]) == 8
    assert batch["code"] == 1


def test_duplicated_check_cells_count_once(batch):
    row = _row(batch, "alice", "00-welcome-and-setup")
    assert [r["status"] for r in row["exercises"]] == ["pass"]
    assert (row["points"], row["max_points"]) == (1, 1)
    assert any("4 check calls" in n for n in row["notes"])


def test_redefined_check_forged_results_and_an_edited_check_cell_earn_nothing(batch):
    row = _row(batch, "bob", "00-welcome-and-setup")
    assert row["status"] == "graded"
    assert _ex(row, "0.1")["status"] == "not_implemented"
    assert (row["points"], row["max_points"]) == (0, 1)
    assert any("was edited" in n for n in row["notes"])
    assert any(f.startswith("cell 3 ") and "grader's variables" in f for f in row["review"])


def test_a_lesson_under_another_lessons_file_name_is_not_graded_as_that_lesson(batch):
    row = _row(batch, "carol", "01-measure-the-baseline")
    assert row["status"] == "not_graded"
    assert row["lesson"] == "00-welcome-and-setup" and row["expected_lesson"] == "01-measure-the-baseline"
    assert (row["points"], row["max_points"]) == (0, 7)
    assert "lesson 00" in row["reason"] and "--lesson 00" in row["reason"]


def test_a_syntax_error_in_one_exercise_does_not_cost_the_others(batch):
    row = _row(batch, "dave", "01-measure-the-baseline")
    statuses = {r["exercise"]: r["status"] for r in row["exercises"]}
    assert statuses == {"1.1": "error", "1.2": "pass", "1.3": "pass", "1.4": "pass"}
    assert (row["points"], row["max_points"]) == (5, 7)
    ex11 = _ex(row, "1.1")["message"]
    assert "SyntaxError" in ex11 and "def time_it" in ex11 and ex11.startswith("cell ")
    notes = " ".join(row["notes"])
    assert "called sys.exit(3)" in notes
    assert "the kernel died in cell" in notes and "restarted it" in notes


def test_a_deleted_check_cell_is_restored(batch):
    row = _row(batch, "erin", "01-measure-the-baseline")
    assert _ex(row, "1.2")["status"] == "not_implemented" and _ex(row, "1.3")["status"] == "pass"
    assert (row["points"], row["max_points"]) == (4, 7)
    assert any("1.2 was missing" in n for n in row["notes"])


def test_an_object_that_cannot_be_copied_is_one_sentence_naming_the_global(batch):
    ex11 = _ex(_row(batch, "erin", "01-measure-the-baseline"), "1.1")
    assert ex11["status"] == "error" and "`_lock`" in ex11["message"] and "cannot be copied" in ex11["message"]


def test_a_truncated_notebook_gets_a_row_and_does_not_stop_the_batch(batch):
    row = _row(batch, "frank", "01-measure-the-baseline")
    assert row["status"] == "not_graded" and "truncated" in row["reason"]
    assert (row["points"], row["max_points"]) == (0, 7)
    assert [r["status"] for r in row["exercises"]] == ["missing"] * 4


def test_no_process_a_notebook_or_a_check_started_outlives_grading(batch):
    import os

    import psutil
    row = _row(batch, "gina", "00-welcome-and-setup")
    assert [r["status"] for r in row["exercises"]] == ["pass"], row
    assert any("the check of exercise 0.1 left 1 process(es) running; the grader killed them" in n
               for n in row["notes"]), row["notes"]
    for who in ("kernel", "check"):
        pid = int((batch["pids"] / who).read_text())
        try:
            alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            alive = False
        assert not alive, f"the process {who} code left behind ({pid}) is still running"
    tempdir = (batch["pids"] / "tempdir").read_text()
    assert not os.path.exists(tempdir), "the kernel's temporary files outlived grading"
    assert "course-grade-" in tempdir   # the run's own folder, removed with it


def test_a_notebook_that_kills_its_kernels_parent_stops_only_itself(batch):
    """Issue 21: `os.kill(os.getppid(), SIGKILL)` in a notebook killed the grader."""
    row = _row(batch, "hal", "00-welcome-and-setup")
    assert row["status"] == "graded" and [r["status"] for r in row["exercises"]] == ["pass"], row
    notes = " ".join(row["notes"])
    assert "stopped the process that ran its kernel (the grader's runner for this notebook was killed by SIGKILL" \
        in notes and "were not run: the notebook stopped the process that ran it" in notes, notes
    assert any("other processes" in f for f in row["review"])
    assert batch["rows"][0] is row   # it ran first, and the notebooks after it were all graded
    assert _row(batch, "gina", "00-welcome-and-setup")["points"] == 1


def test_same_file_names_from_two_students_stay_apart(batch):
    alice, bob = _row(batch, "alice", "00-welcome-and-setup"), _row(batch, "bob", "00-welcome-and-setup")
    assert alice["path"] != bob["path"] and alice["executed"] != bob["executed"]
    assert alice["points"] == 1 and bob["points"] == 0
    out = batch["tmp"] / "out"
    assert (out / "alice" / "00-welcome-and-setup.ipynb").exists() and (out / "bob" / "00-welcome-and-setup.ipynb").exists()


def test_the_executed_copy_shows_each_verdict_at_its_check_cell(batch):
    import nbformat
    nb = nbformat.read(_row(batch, "dave", "01-measure-the-baseline")["executed"], as_version=4)
    assert "5/7 points" in nb.cells[0].source
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "[PASS] Exercise 1.2" in text and "[ERROR] Exercise 1.1" in text


def test_totals_come_from_the_released_lesson(batch):
    for row in batch["rows"]:
        lesson = row["lesson"] if row["status"] == "graded" else row["expected_lesson"]
        if lesson:
            assert row["max_points"] == {"00-welcome-and-setup": 1, "01-measure-the-baseline": 7}[lesson]
        assert all(r["points"] <= r["max_points"] for r in row["exercises"])


def test_checks_run_while_no_notebook_runs_and_with_recorded_seeds(batch):
    calls = batch["calls"]
    notebooks = [t for kind, t in calls if kind == "notebook"]
    checks = [t for kind, t in calls if kind == "check"]
    assert len(notebooks) == 6 and checks
    assert not [t for t in checks for start, end in notebooks if start < t < end]
    row = _row(batch, "erin", "01-measure-the-baseline")
    assert _ex(row, "1.3")["seed"] == grade_mod._exercise_seed(SEED, "1.3")
    assert batch["run"]["seed"] == SEED


def test_the_json_and_csv_gradebook(batch):
    data = json.loads((batch["tmp"] / "grades.json").read_text())
    assert data["grader"]["seed"] == SEED and len(data["submissions"]) == 8
    rows = list(csv.DictReader((batch["tmp"] / "grades.csv").open()))
    assert [r["submission"] for r in rows] == [r["submission"] for r in batch["rows"]]
    dave = next(r for r in rows if r["submission"] == "dave/01-measure-the-baseline.ipynb")
    assert (dave["ex 1.1"], dave["ex 1.2"], dave["ex 1.3"], dave["ex 1.4"], dave["points"], dave["max_points"]) == ("0", "1", "2", "2", "5", "7")
    alice = next(r for r in rows if r["submission"] == "alice/00-welcome-and-setup.ipynb")
    assert alice["ex 1.1"] == "" and alice["ex 0.1"] == "1"


def test_nonsensical_limits_are_refused(capsys):
    for args in (["--timeout", "0"], ["--timeout", "-5"], ["--timeout", "nan"], ["--notebook-timeout", "abc"],
                 ["--jobs", "0"], ["--seed", "-1"], ["--timeout", "100", "--notebook-timeout", "10"],
                 ["--timeout", "inf"], ["--timeout", "0.01"], ["--notebook-timeout", "1e9"], ["--jobs", "1000"],
                 ["--gpus", ","]):
        with pytest.raises(SystemExit) as exc:
            main(["x.ipynb"] + args)
        assert exc.value.code == 2
    assert "must be a positive number" in capsys.readouterr().err


def test_a_missing_file_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["does-not-exist.ipynb"])
    assert exc.value.code == 2 and "no such notebook" in capsys.readouterr().err


def test_a_grader_failure_has_its_own_exit_status_and_still_writes_the_json(tmp_path):
    solutions = kit.mini_course(tmp_path / "course")
    nb = kit.write(kit.solved(solutions, "00"), tmp_path / "00-welcome-and-setup.ipynb")
    broken = kit.solved(solutions, "00")
    broken.cells.append(kit.code('check("0.9", to_image)'))   # a check cell with no registered check
    kit.write(broken, solutions / "00-welcome-and-setup.ipynb")
    out = tmp_path / "g.json"
    code = main([str(nb), "--smoke", "--released", str(solutions), "--json", str(out), "--csv", str(tmp_path / "g.csv")])
    assert code == 3
    assert not _adopts_orphans(), "the command line left its host process a child subreaper"
    row = json.loads(out.read_text())["submissions"][0]
    assert row["status"] == "grader_error" and "no registered check" in row["reason"]
    assert (tmp_path / "g.csv").read_text().count("\n") == 2
    from course_utils.grading.lessons import released_lessons
    lessons = released_lessons(solutions)   # one broken lesson does not stop the others
    assert lessons["00-welcome-and-setup"].error and lessons["01-measure-the-baseline"].error is None


def _adopts_orphans() -> bool:
    """PR_GET_CHILD_SUBREAPER for this process (False where Linux's prctl is not there)."""
    import ctypes
    import sys
    if not sys.platform.startswith("linux"):
        return False
    flag = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(37, ctypes.byref(flag), 0, 0, 0)
    return bool(flag.value)


def test_a_kernel_that_cannot_start_is_the_graders_failure(tmp_path, monkeypatch):
    import asyncio
    import os
    from course_utils.grading.prepare import Prepared
    import nbformat

    async def cannot_start(self):
        raise RuntimeError("no kernel here")
    monkeypatch.setattr(kernel._Life, "start", cannot_start)
    book = nbformat.v4.new_notebook()
    book.cells = [kit.code("x = 1")]
    x = asyncio.run(kernel.execute(Prepared(book, [1]), cwd=tmp_path, env=dict(os.environ), cell_timeout=5,
                                   notebook_timeout=10, log_path=tmp_path / "k.log"))
    assert x.startup_error == "the grader could not start a python3 kernel: RuntimeError: no kernel here"
    sub = grade_mod._Sub(tmp_path / "n.ipynb", "n.ipynb", prepared=Prepared(book, [1]), execution=x)
    grade_mod._problems(sub)
    assert sub.status == "grader_error"


def test_the_notebook_limit_stops_a_notebook_and_says_what_was_not_reached(tmp_path):
    solutions = kit.mini_course(tmp_path / "course")
    nb = kit.solved(solutions, "00")
    del nb.cells[1]   # no imports: this test is about the clock
    nb.cells.insert(kit.check_cell(nb, "0.1") - 1, kit.code("import time\ntime.sleep(60)"))
    path = kit.write(nb, tmp_path / "00-welcome-and-setup.ipynb")
    code, _, rows = grade([str(path)], GradeOptions(smoke=True, cell_timeout_s=60, notebook_timeout_s=5,
                                                    solutions=solutions, quiet=True, seed=1))
    row = rows[0]
    assert code == 1
    assert row["exercises"][0]["status"] == "missing"
    assert "never reached: the notebook reached its limit of 5 s" in row["exercises"][0]["message"]
    assert any("was stopped when the notebook reached its limit" in n for n in row["notes"])


def test_check_cells_finds_every_check_call(tmp_path):
    import nbformat
    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell(s) for s in
                  ('check("1.1", f)', "x = 1\ncheck('1.2', g)", "# check(\"9.9\", no) in a comment")]
    nbformat.write(book, str(tmp_path / "n.ipynb"))
    assert check_cells(tmp_path / "n.ipynb") == ["1.1", "1.2"]


def test_notebooks_side_by_side_each_get_their_own_device(tmp_path, monkeypatch):
    import asyncio

    from course_utils.grading.lessons import released_lessons
    solutions = kit.mini_course(tmp_path / "course")
    lesson = released_lessons(solutions)["00-welcome-and-setup"]
    seen, running = [], set()

    async def fake_execute(sub, opts, env):
        device = env["CUDA_VISIBLE_DEVICES"]
        assert device not in running, "two notebooks on one device at once"
        running.add(device)
        seen.append((device, env["OMP_NUM_THREADS"]))
        await asyncio.sleep(0.05)
        running.discard(device)
        return kernel.Execution()
    monkeypatch.setattr(grade_mod, "_execute_in_runner", fake_execute)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    subs = [grade_mod._Sub(tmp_path / f"{i}.ipynb", f"{i}.ipynb", lesson=lesson, nb=kit.solved(solutions, "00"))
            for i in range(5)]
    opts = GradeOptions(jobs=2, gpus=("2", "3"), quiet=True)
    asyncio.run(grade_mod._run_all(subs, opts, tmp_path / "work"))
    assert sorted(d for d, _ in seen) == ["2", "2", "2", "3", "3"] or sorted(d for d, _ in seen) == ["2", "2", "3", "3", "3"]
    from course_utils.env import usable_cores
    assert {threads for _, threads in seen} == {str(max(1, usable_cores() // 2))}   # the cores, shared
    assert grade_mod._checker_env(opts, subs[0], "0.1")["CUDA_VISIBLE_DEVICES"] == "2"


# -- a gradebook that survives an interrupted run, and a rerun that grades only what is missing (issue 30)

def _cli(args, tmp, *, stop=None, after=1):
    """Run the command line; with `stop` (a signal), send it once `after` more submissions were graded
    and the next notebook has started running. Returns (exit status, output)."""
    import os
    import subprocess
    import sys
    import time

    from course_utils.grading.lessons import ROOT
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    proc = subprocess.Popen([sys.executable, "-m", "course_utils.grade", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, graded = [], 0
    for line in proc.stdout:
        lines.append(line)
        if stop is None:
            continue
        if line.rstrip().endswith(" points") and line.startswith("["):
            graded += 1
        elif graded >= after and " running " in line:
            time.sleep(1.0)   # its runner and kernel are starting
            proc.send_signal(stop)
            stop = None
    return proc.wait(timeout=600), "".join(lines)


def _comparable(data):
    """A results file's rows without what differs between runs (times, run ids, the file's hash)."""
    rows = []
    for s in data["submissions"]:
        s = {k: v for k, v in s.items() if k not in ("seconds", "notebook_s", "checks_s")}
        s["grading"] = {k: v for k, v in (s.get("grading") or {}).items()
                        if k not in ("run", "graded_at", "file_sha256")}
        s["exercises"] = [{k: v for k, v in r.items() if k != "seconds"} for r in s["exercises"]]
        rows.append(s)
    return rows


def _left_running(run_id):
    import psutil
    left = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("COURSE_GRADER_RUN", "").startswith(run_id + "/") and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc.pid)
        except (psutil.Error, OSError):
            pass
    return left


def test_an_interrupted_run_resumes_and_its_gradebook_equals_an_uninterrupted_one(tmp_path):
    """Killed with SIGTERM, SIGINT and SIGKILL after some submissions were graded: the results file is
    valid and holds them each time, a rerun grades only what is missing (and a submission handed in
    again), and the gradebook it ends with equals that of one uninterrupted run with the same seed."""
    import signal
    import time
    solutions = kit.mini_course(tmp_path / "course")
    subs = [kit.write(how(solutions, "00"), tmp_path / "subs" / who / "00-welcome-and-setup.ipynb")
            for who, how in (("ann", kit.solved), ("ben", kit.unsolved), ("cat", kit.solved))]
    common = [*subs, "--smoke", "--released", solutions, "--seed", "77"]
    code, out = _cli([*common, "--jobs", "2", "--json", tmp_path / "whole.json", "--csv", tmp_path / "whole.csv"],
                     tmp_path)
    assert code == 1, out[-3000:]
    whole = json.loads((tmp_path / "whole.json").read_text())
    assert whole["grader"]["complete"] and [s["status"] for s in whole["submissions"]] == ["graded"] * 3

    command = [*common, "--json", tmp_path / "g.json", "--csv", tmp_path / "g.csv"]
    for stop, after, graded, kept, code_wanted in ((signal.SIGTERM, 1, 1, 0, 143), (signal.SIGINT, 1, 2, 1, 130),
                                                   (signal.SIGKILL, 0, 2, 2, -9)):
        code, out = _cli(command, tmp_path, stop=stop, after=after)
        assert code == code_wanted, out[-3000:]
        data = json.loads((tmp_path / "g.json").read_text())   # valid, whatever instant it was stopped at
        assert [s["status"] for s in data["submissions"]] == ["graded"] * graded + ["pending"] * (3 - graded)
        assert not data["grader"]["complete"]
        assert out.count("[kept] ") == kept, out[-3000:]   # a rerun grades only what is missing
        run_id = data["grader"]["run"]
        if stop != signal.SIGKILL:
            assert data["grader"]["interrupted"] == stop.name and data["grader"]["exit_status"] == code
            assert f"INTERRUPTED ({stop.name})" in out and "run the same command again" in out
            assert _left_running(run_id) == [], "notebooks or kernels outlived the grader"
            assert (tmp_path / "g.csv").read_text().count(",pending,") == 3 - graded
    deadline = time.monotonic() + 15   # killed outright: its runner, checker and kernel die with it
    while _left_running(run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _left_running(run_id) == []

    ann = kit.solved(solutions, "00")   # ann hands in again (a new cell, the same answer): graded again
    ann.cells.append(nbformat.v4.new_markdown_cell("done"))
    kit.write(ann, subs[0])
    code, out = _cli(command, tmp_path)
    assert code == 1 and out.count("[kept] ") == 1 and "[kept] ben/" in out, out[-3000:]
    assert "running ann/" in out and "running cat/" in out
    resumed = json.loads((tmp_path / "g.json").read_text())
    assert resumed["grader"]["complete"] and resumed["grader"]["exit_status"] == 1
    assert _comparable(resumed) == _comparable(whole)
    assert (tmp_path / "g.csv").read_text() == (tmp_path / "whole.csv").read_text()
    assert [h["interrupted"] for h in resumed["grader"]["history"]] == ["SIGTERM", "SIGINT", None]


def test_what_a_rerun_keeps(tmp_path):
    from course_utils.grading.lessons import released_lessons
    solutions = kit.mini_course(tmp_path / "course")
    lesson = released_lessons(solutions)["00-welcome-and-setup"]
    key = {"file_sha256": "f", "lesson_sha256": "l", "course_sha256": "c", "seed": 1, "smoke": True,
           "cell_timeout_s": 900.0, "notebook_timeout_s": 3600.0}
    sub = grade_mod._Sub(tmp_path / "a.ipynb", "a.ipynb", lesson=lesson, key=key)
    stored = {"status": "graded", "grading": dict(key, run="grade-1", graded_at="then"), "executed": None}
    keep = lambda row, **o: grade_mod._keep(sub, row, GradeOptions(**o))   # noqa: E731
    assert keep(stored)
    assert not keep(stored, regrade=True)                                            # --regrade
    for field, other in (("file_sha256", "g"), ("lesson_sha256", "m"), ("course_sha256", "d"), ("seed", 2),
                         ("smoke", False), ("cell_timeout_s", 60.0)):
        assert not keep(dict(stored, grading=dict(stored["grading"], **{field: other}))), field
    assert not keep(dict(stored, status="grader_error")) and not keep(dict(stored, status="pending"))
    assert not keep(stored, output_dir=tmp_path / "out")                             # its executed copy is not there
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a.ipynb").write_text("{}")
    assert keep(dict(stored, executed=str(tmp_path / "out" / "a.ipynb")), output_dir=tmp_path / "out")


def test_results_that_cannot_be_written_stop_the_run_and_keep_the_last_whole_file(tmp_path, monkeypatch):
    import errno

    from course_utils.grading import kernel as kernel_mod
    from course_utils.grading import results
    solutions = kit.mini_course(tmp_path / "course")
    paths = [kit.write(kit.solved(solutions, "00"), tmp_path / "subs" / w / "00-welcome-and-setup.ipynb")
             for w in ("a", "b", "c")]

    class NoChecker:
        errors = {}

        def __init__(self, *a, **k):
            pass

        def close(self, now=False):
            pass

    async def ran(sub, opts, work_root, total, slot=0):
        sub.execution = kernel_mod.Execution()

    def checked(sub, checker, opts, seed, run, total):
        sub.records = [{"exercise": "0.1", "title": "", "status": "pass", "points": 1, "max_points": 1,
                        "message": "ok", "seconds": 0.0, "seed": 1}]
    writes = []
    real_write = results.ResultsFile.write

    def write(self, run, rows):
        writes.append(1)
        if len(writes) >= 3:   # the file itself, then a's row; b's row meets a full disk
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, run, rows)
    monkeypatch.setattr(grade_mod, "_Checker", NoChecker)
    monkeypatch.setattr(grade_mod, "_run_notebook", ran)
    monkeypatch.setattr(grade_mod, "_finish", checked)
    monkeypatch.setattr(results.ResultsFile, "write", write)
    code, run, rows = grade([str(p) for p in paths], GradeOptions(solutions=solutions, quiet=True, seed=3,
                                                                   json=tmp_path / "g.json"))
    assert code == grade_mod.EXIT_GRADER and "No space left on device" in run["error"]
    data = json.loads((tmp_path / "g.json").read_text())
    assert [s["status"] for s in data["submissions"]] == ["graded", "pending", "pending"]
    assert len(writes) == 3 and not list(tmp_path.glob(".g.json.*.tmp"))
