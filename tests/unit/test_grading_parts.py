"""The grader's parts: identification, the restored notebook, review flags, the kernel runner
(timeouts, interrupts, deaths) and the checker's isolation (exits, crashes, loops, forgeries)."""
import asyncio
import os
import sys

import cloudpickle
import nbformat
import pytest

import gradekit as kit
from course_utils.authoring import ROOT
from course_utils.grading import checker, kernel
from course_utils.grading.lessons import expected_from_name, identify, released_lessons
from course_utils.grading.prepare import GRADER_TAG, Prepared, prepare
from course_utils.grading.review import pickle_flags, review_flags

STUDENTS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    solutions = kit.mini_course(tmp_path_factory.mktemp("course"))
    return solutions, released_lessons(solutions)


# -- which lesson is it ---------------------------------------------------------------------

@pytest.mark.parametrize("path", STUDENTS + SOLUTIONS, ids=[f"{p.parent.name}/{p.stem}" for p in STUDENTS + SOLUTIONS])
def test_every_released_notebook_is_identified_as_itself(path):
    lessons = released_lessons()
    nb = nbformat.read(str(path), as_version=4)
    found = identify(nb, lessons)
    assert found.lesson is not None and found.lesson.name == path.stem and found.note is None


def test_student_notebooks_carry_the_lesson_in_their_metadata():
    for path in STUDENTS:
        meta = nbformat.read(str(path), as_version=4).metadata["course"]
        assert meta["lesson"] == path.stem
        assert meta["exercises"] == [e.id for e in released_lessons()[path.stem].exercises]


def test_content_wins_over_metadata_and_metadata_over_nothing(mini):
    solutions, lessons = mini
    nb = kit.solved(solutions, "00")
    nb.metadata["course"] = {"lesson": "01-measure-the-baseline"}
    found = identify(nb, lessons)
    assert found.lesson.name == "00-welcome-and-setup" and "metadata says lesson 01" in found.note
    empty = nbformat.v4.new_notebook()
    empty.metadata["course"] = {"lesson": "01-measure-the-baseline"}
    found = identify(empty, lessons)
    assert found.lesson.name == "01-measure-the-baseline" and "none of lesson 01" in found.note
    assert identify(nbformat.v4.new_notebook(), lessons).lesson is None


def test_the_file_name_says_which_lesson_was_expected(mini):
    _, lessons = mini
    assert expected_from_name("01-measure-the-baseline.ipynb", lessons).number == 1
    assert expected_from_name("01-alice.ipynb", lessons).number == 1
    assert expected_from_name("alice.ipynb", lessons) is None
    assert expected_from_name("99-nothing.ipynb", lessons) is None
    nb = kit.solved(mini[0], "00")
    assert identify(nb, lessons, expected=lessons["01-measure-the-baseline"]).mismatch


# -- the notebook the grader runs -------------------------------------------------------------

def test_check_cells_are_restored_once_after_the_exercise_and_parameters_injected(mini):
    solutions, lessons = mini
    lesson = lessons["01-measure-the-baseline"]
    nb = kit.solved(solutions, "01")
    at = kit.check_cell(nb, "1.1")
    nb.cells.insert(at, kit.code('check("1.1", time_it)\ncheck("1.1", time_it)'))        # duplicated
    nb.cells[kit.check_cell(nb, "1.3")].source = 'check("1.3", lambda t: "input-bound")'   # edited
    del nb.cells[kit.check_cell(nb, "1.2")]                                                # deleted
    ex = kit.index_of(nb, lambda c: c.get("id") == "01-029")
    nb.cells[ex].source += '\ncheck("1.2", stall_fraction)\ncheck("7.1", stall_fraction)'  # inside the exercise cell
    prep = prepare(nb, lesson, smoke=True)
    restored = [c for c in prep.nb.cells if GRADER_TAG in c.metadata.get("tags", [])]
    assert [c.metadata["course_grader"]["exercise"] for c in restored] == [e.id for e in lesson.exercises]
    assert all("check(" not in c.source for c in prep.nb.cells if GRADER_TAG not in c.metadata.get("tags", [])
               and c.cell_type == "code")
    for e in lesson.exercises:   # right after the learner's exercise cell
        assert prep.handin_cells[e.id] == prep.exercise_cells[e.id] + 1
        assert prep.nb.cells[prep.exercise_cells[e.id]].get("id") == e.exercise_cell_id
    assert 'check("1.3", diagnose)' in prep.nb.cells[prep.handin_cells["1.3"]].source
    assert "def stall_fraction" in prep.nb.cells[prep.exercise_cells["1.2"]].source
    notes = " ".join(prep.notes)
    assert "1.1 had 3 check calls" in notes and "1.3 (cell" in notes and "edited" in notes and "7.1" in notes
    params = next(i for i, c in enumerate(prep.nb.cells) if "parameters" in c.metadata.get("tags", []))
    assert prep.nb.cells[params + 1].source.endswith("SMOKE = True\n")
    assert prep.origin[params + 1] is None and prep.origin[0] == 1


def test_a_notebook_without_its_exercise_still_gets_its_check_cells(mini):
    solutions, lessons = mini
    nb = nbformat.v4.new_notebook()
    nb.cells = [kit.code("x = 1")]
    prep = prepare(nb, lessons["01-measure-the-baseline"], smoke=False)
    assert len(prep.handin_cells) == len(lessons["01-measure-the-baseline"].exercises) and all(v is None for v in prep.exercise_cells.values())


# -- review flags ----------------------------------------------------------------------------

@pytest.mark.parametrize("path", STUDENTS + SOLUTIONS, ids=[f"{p.parent.name}/{p.stem}" for p in STUDENTS + SOLUTIONS])
def test_the_course_itself_raises_no_review_flag(path):
    nb = nbformat.read(str(path), as_version=4)
    lesson = released_lessons()[path.stem]
    assert review_flags(nb, lesson.lines) == []


def test_review_flags_the_usual_ways_of_reaching_for_the_grader():
    nb = nbformat.v4.new_notebook()
    nb.cells = [kit.code("import torch\nimport numpy as np"),
                kit.code("torch.allclose = lambda *a, **k: True"),
                kit.code("torch.backends.cudnn.benchmark = True\nnp.random.seed(0)"),
                kit.code("import course_utils.checks._core as c"),
                kit.code("import os\nos._exit(0)"),
                kit.code("import sys\nf = sys._getframe(1)"),
                kit.code("setattr(np, 'isclose', print)")]
    flags = review_flags(nb)
    assert [f.split(" ")[1] for f in flags] == ["2", "4", "5", "6", "7"]
    assert "torch.allclose = ..." in flags[0] and "checks or grader" in flags[1]


def test_a_pickle_built_to_act_on_the_checker_is_flagged():
    class Evil:
        def __reduce__(self):
            return (setattr, (os, "environ", {}))
    assert pickle_flags(cloudpickle.dumps(Evil())) and "builtins.setattr" in pickle_flags(cloudpickle.dumps(Evil()))[0]

    def honest(x, n=3):
        return [os.path.join(str(x), str(i)) for i in range(n)]
    assert pickle_flags(cloudpickle.dumps((honest, {}, {}))) == []
    assert pickle_flags(b"not a pickle")


# -- the kernel runner -------------------------------------------------------------------------

def test_timeouts_interrupts_deaths_and_restarts(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel, "PROBE_S", 1.5)
    nb = nbformat.v4.new_notebook()
    nb.cells = [kit.code(s) for s in (
        "x = 41",
        "while True:\n    pass",                                                     # interrupted
        "import time\nwhile True:\n    try:\n        time.sleep(100)\n    except KeyboardInterrupt:\n        pass",
        "x += 1\nprint(x)",
        "import os\nos._exit(3)",                                                    # dies
        "print('after', x)",
        "raise ValueError('this one')",
        "import os\nos._exit(4)",                                                    # dies a third time
        "print('never')")]
    prep = Prepared(nb, list(range(1, len(nb.cells) + 1)))
    x = asyncio.run(kernel.execute(prep, cwd=tmp_path, env=dict(os.environ), cell_timeout=2, notebook_timeout=120,
                                   log_path=tmp_path / "k.log"))
    assert x.startup_error is None
    assert x.failures[1] == "ran longer than the 2 s a cell may take and was interrupted"
    assert x.failures[2].startswith("ran longer") and x.failures[4].startswith("killed the kernel")
    assert x.failures[6] == "raised ValueError: this one"
    events = " ".join(x.events)
    assert "the kernel did not stop after cell 3 (`import time`) was interrupted" in events
    assert "the kernel died in cell 5 (`import os`)" in events and "restarted it" in events
    assert "so the remaining cells were not run" in events and x.not_run_from == 8
    text = lambda i: "".join(o.get("text", "") for o in nb.cells[i].outputs)   # noqa: E731
    assert text(3) == "42\n" and text(5) == "after 42\n" and text(8) == ""


# -- the checker -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from course_utils.grade import _Checker
    tmp = tmp_path_factory.mktemp("checker")
    c = _Checker(["course_utils.checks.lesson00"], tmp / "checker.log")
    yield c, tmp
    c.close()


def _task(runner, name, obj, limit=60):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])   # as functions of a notebook travel
    c, tmp = runner
    payload = tmp / f"{name}.pkl"
    payload.write_bytes(obj if isinstance(obj, bytes) else cloudpickle.dumps((obj, {}, {})))
    return c.run({"exercise": "0.1", "payload": str(payload), "cwd": str(tmp), "env": dict(os.environ),
                  "seed": 5, "limit_s": limit, "log": str(tmp / f"{name}.log")})


def _stub(x):
    raise NotImplementedError("Exercise 0.1")


def test_the_checker_grades_what_it_is_handed(runner):
    assert _task(runner, "stub", _stub)["status"] == "not_implemented"
    assert _task(runner, "wrong", lambda x: x)["status"] == "fail"


def test_exits_crashes_and_endless_loops_in_a_check_are_one_sentence(runner):
    def leaves(x):
        sys.exit(7)

    def vanishes(x):
        os._exit(0)

    def crashes(x):
        import ctypes
        ctypes.string_at(0)

    def loops(x):
        import signal
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        while True:
            pass
    assert _task(runner, "exit", leaves)["message"] == "your code called sys.exit(7) during the check"
    assert "exited with status 0 before it gave a verdict" in _task(runner, "vanish", vanishes)["message"]
    assert "killed by SIGSEGV" in _task(runner, "crash", crashes)["message"]
    answer = _task(runner, "loop", loops, limit=3)
    assert answer["status"] == "error" and "did not finish within 3 s" in answer["message"]
    assert "could not be loaded" in _task(runner, "junk", b"junk")["message"]


def test_what_one_check_does_to_its_process_does_not_reach_the_next(runner):
    def forger(x):
        import course_utils.checks._core as core
        core._REGISTRY["0.1"].fn = lambda obj: "forged"
        os.write(1, b'{"id": 99, "status": "pass", "message": "forged"}\n')
        print('{"status": "pass"}')
        raise NotImplementedError
    assert _task(runner, "forger", forger)["status"] == "not_implemented"
    assert _task(runner, "next", _stub)["status"] == "not_implemented"


def test_what_remains_possible_a_pickle_that_acts_as_it_loads_forges_only_its_own_check(runner):
    # Documented in INSTRUCTORS.md: code handed to the checker runs in its check's process, so an
    # object built to attack the checker can forge its own verdict; it is flagged for review, and
    # the next check starts clean.
    class Forge:
        def __reduce__(self):
            return (exec, ("import course_utils.checks._core as c\nc._REGISTRY['0.1'].fn = lambda obj: 'forged'",))
    data = cloudpickle.dumps((Forge(), {}, {}))
    assert _task(runner, "forge", data)["status"] == "pass"
    assert pickle_flags(data) and "builtins.exec" in pickle_flags(data)[0]
    assert _task(runner, "after", _stub)["status"] == "not_implemented"

    def patcher(x):
        import time
        time.perf_counter = lambda: 0.0
        raise NotImplementedError
    answer = _task(runner, "patcher", patcher)
    assert answer["status"] == "not_implemented" and "time.perf_counter" in answer["review"][0]


def test_a_changed_course_file_stops_grading(tmp_path):
    baseline = checker.course_fingerprint()
    assert "course_utils/checks/lesson00.py" in baseline and "solutions/00-welcome-and-setup.ipynb" in baseline
    baseline["course_utils/checks/lesson00.py"] = "as it was before a submission rewrote it"
    answer = checker.run_task({"exercise": "0.1", "payload": "x", "cwd": str(tmp_path), "env": {}, "seed": 1,
                               "limit_s": 5, "log": str(tmp_path / "l")}, baseline=baseline)
    assert answer["status"] == "grader_error" and "course_utils/checks/lesson00.py changed" in answer["message"]


def test_a_check_that_kills_the_checker_costs_only_its_own_exercise(runner, mini, tmp_path):
    import hashlib

    from course_utils import grade as grade_mod
    c, _ = runner
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    lesson = mini[1]["00-welcome-and-setup"]

    def killer(x):
        import signal
        os.kill(os.getppid(), signal.SIGKILL)

    rows = []
    for name, obj in (("killer", killer), ("after", _stub)):
        work = tmp_path / name
        (work / "handin").mkdir(parents=True)
        (work / "cwd").mkdir()
        data = cloudpickle.dumps((obj, {}, {}))
        (work / "handin" / "0.1.pkl").write_bytes(data)
        book = nbformat.v4.new_notebook()
        book.cells = [kit.code("pass")]
        sub = grade_mod._Sub(tmp_path / f"{name}.ipynb", name, lesson=lesson, work=work,
                             prepared=Prepared(book, [None], {"0.1": 0}, {"0.1": None}),
                             execution=kernel.Execution(), handed={"0.1": hashlib.sha256(data).hexdigest()})
        grade_mod._check_one(sub, c, grade_mod.GradeOptions(), seed=3)
        rows.append(sub)
    killed, after = rows
    assert killed.records[0]["status"] == "error" and "checker process died" in killed.records[0]["message"]
    assert killed.status == "graded" and any("killed the grader's checker" in r for r in killed.review)
    assert after.records[0]["status"] == "not_implemented"


# -- an answer that replaces the check's comparisons (issue 21) ---------------------------------------

def _garbage(x):
    import numpy as np
    return np.zeros((x.shape[1], x.shape[2], 3), dtype=np.uint8)


def test_an_answer_that_replaces_the_checks_comparisons_gets_no_points(runner):
    """Exercise 0.1 passed with garbage when the answer replaced torch.equal, torch.allclose and NumPy's
    comparisons inside the check's process; the review flagged nothing."""
    import weakref

    def with_lambdas(x):
        import numpy as np
        import torch
        torch.equal = lambda *a, **k: True
        torch.allclose = lambda *a, **k: True
        np.abs = lambda a, *r, **k: np.zeros_like(a)
        np.array_equal = lambda *a, **k: True
        return _garbage(x)

    def with_library_functions(x):   # nothing of the submission's own code is left in the modules
        import operator

        import numpy as np
        import torch
        torch.equal = operator.is_not
        np.abs = np.zeros_like
        np.array_equal = operator.is_not
        return _garbage(x)

    def puts_them_back(x):   # replaced while the check compares, put back once it has finished with them
        import numpy as np
        import torch
        saved = puts_them_back.__dict__.setdefault("saved", (torch.equal, np.abs, np.array_equal))
        torch.equal = lambda *a, **k: True
        np.abs = lambda a, *r, **k: np.zeros_like(a)
        np.array_equal = lambda *a, **k: True

        def restore(*_):
            torch.equal, np.abs, np.array_equal = saved
        out = _garbage(x)
        weakref.finalize(out, restore)
        return out

    for name, answer in (("lambdas", with_lambdas), ("library", with_library_functions), ("back", puts_them_back)):
        said = _task(runner, f"compare-{name}", answer)
        assert said["status"] == "fail", (name, said)
        assert said["message"].startswith("property 'leaves the check's own functions alone' does not hold: your "
                                          "code replaced "), said["message"]
        assert "torch.equal" in said["message"] or "numpy.abs" in said["message"], said["message"]
        assert any("during its check" in r for r in said["review"]), said["review"]


def test_a_pickle_that_replaces_the_comparisons_as_it_loads_gets_no_points(runner):
    class Patch:
        def __reduce__(self):
            return (exec, ("import torch, numpy\ntorch.equal = lambda *a, **k: True\n"
                           "numpy.array_equal = lambda *a, **k: True\nnumpy.abs = numpy.zeros_like",))
    said = _task(runner, "compare-load", cloudpickle.dumps(((Patch(), _garbage), {}, {})))
    assert said["status"] == "fail" and "your code replaced" in said["message"], said
    assert any("while it was loaded" in r for r in said["review"]), said["review"]


def test_the_reference_answer_and_the_course_patching_torch_cuda_are_not_tampering(runner):
    import numpy as np
    import torch

    def to_image(x):
        mean = torch.tensor((0.4914, 0.4822, 0.4465)).view(3, 1, 1)
        std = torch.tensor((0.2470, 0.2435, 0.2616)).view(3, 1, 1)
        return (x * std + mean).mul(255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
    said = _task(runner, "reference", to_image)
    assert said["status"] == "pass" and said["review"] == [], said
    from course_utils.grading.checker import _rebinding
    wrapped = torch._disable_dynamo(torch.manual_seed) if hasattr(torch, "_disable_dynamo") else None
    if wrapped is not None:   # torch's dynamo wraps torch.manual_seed when it is first imported
        assert not _rebinding(torch.manual_seed, wrapped)
    assert _rebinding(np.abs, np.zeros_like) and _rebinding(np.abs, lambda a: a)


def test_review_flags_reaching_for_the_parent_process_and_rewriting_a_librarys_namespace():
    nb = nbformat.v4.new_notebook()
    nb.cells = [kit.code("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"),
                kit.code("import psutil\npsutil.Process().parent().kill()"),
                kit.code("import numpy as np\nvars(np)['abs'] = print"),
                kit.code("import torch\ntorch.__dict__.update(equal=print)")]
    flags = review_flags(nb)
    assert [f.split(" ")[1] for f in flags] == ["1", "2", "3", "4"]
    assert "other processes" in flags[0] and "other processes" in flags[1]
    assert "rewrites a library's namespace" in flags[2] and "rewrites a library's namespace" in flags[3]


# -- the results file: always whole (issue 30) ----------------------------------------------------------

KILLED_WRITER = '''
import json, sys
sys.path.insert(0, sys.argv[2])
from course_utils.grading.results import ResultsFile
results = ResultsFile(sys.argv[1])
rows = [{"submission": f"s{i}", "path": f"/x/s{i}.ipynb", "blob": "x" * 20000} for i in range(40)]
n = 0
print("ready", flush=True)
while True:
    n += 1
    results.write({"seed": 1, "n": n}, rows[: 1 + n % 40])
'''


def test_a_kill_at_any_instant_leaves_a_whole_results_file(tmp_path):
    """SIGKILL a process that rewrites the results file in a loop, 25 times at random instants: the
    file is valid JSON every time, and no temporary file is left but the one being written."""
    import json
    import random
    import signal
    import subprocess
    import time
    script = tmp_path / "writer.py"
    script.write_text(KILLED_WRITER)
    path = tmp_path / "grades.json"
    seen = set()
    for _ in range(25):
        proc = subprocess.Popen([sys.executable, str(script), str(path), str(ROOT)], stdout=subprocess.PIPE)
        proc.stdout.readline()
        time.sleep(random.uniform(0.0, 0.05))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if path.exists():
            data = json.loads(path.read_text())   # never half-written
            assert data["results_format"] == 2 and len(data["submissions"]) == 1 + data["grader"]["n"] % 40
            seen.add(data["grader"]["n"])
    assert len(seen) > 1
    assert len(list(tmp_path.glob(".grades.json.*.tmp"))) <= 25


def test_a_full_disk_leaves_the_previous_results_file_and_no_temporary_file(tmp_path, monkeypatch):
    import errno
    import json

    from course_utils.grading import results
    path = tmp_path / "grades.json"
    results.atomic_write(path, json.dumps({"grader": {}, "submissions": []}))
    real_write = os.write

    def full(fd, data):
        real_write(fd, bytes(data[:10]))
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(results.os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        results.atomic_write(path, json.dumps({"grader": {"seed": 2}, "submissions": [{"x": "y" * 1000}]}))
    monkeypatch.setattr(results.os, "write", real_write)
    assert json.loads(path.read_text()) == {"grader": {}, "submissions": []}
    assert [p.name for p in tmp_path.iterdir()] == ["grades.json"]


def test_two_graders_never_write_one_results_file_and_a_foreign_file_is_not_overwritten(tmp_path):
    from course_utils.grading.results import ResultsError, ResultsFile
    first, second = ResultsFile(tmp_path / "g.json"), ResultsFile(tmp_path / "g.json")
    first.lock()
    with pytest.raises(ResultsError, match="another grader is writing"):
        second.lock()
    first.close()
    second.lock()
    second.close()
    (tmp_path / "notes.json").write_text('{"my": "notes"}')
    with pytest.raises(ResultsError, match="not a results file this grader wrote"):
        ResultsFile(tmp_path / "notes.json").load()


def test_the_checker_warms_a_check_once_before_it_forks(tmp_path, monkeypatch):
    """w6-06: a check's first imports (6.2: sympy, 3-15 s on a busy machine) run in the checker, once, outside
    the check's limit and the fork's, not again in every forked check."""
    from course_utils.checks import _core
    calls = []
    monkeypatch.setitem(_core._REGISTRY, "99.73", _core._Exercise("99.73", "warm", 1, lambda obj: None, 5,
                                                                  None, lambda: calls.append(1)))
    for _ in range(2):
        checker.run_task({"exercise": "99.73", "payload": str(tmp_path / "none.pkl"), "cwd": str(tmp_path),
                          "env": {}, "seed": 1, "limit_s": 5, "log": str(tmp_path / "l")})
    assert calls == [1]
