import json
import math
import signal
import sys
import time

import pytest

from course_utils.checks import CheckError, CheckFailed, check, exercise, expect_callable, run_check


@exercise("99.1", "a test exercise: square a number", points=3, time_limit_s=1)
def _check_square(square):
    expect_callable(square, "a function square(x)")
    for x in (2, -3, 0.5):
        if square(x) != x * x:
            raise CheckFailed("squares its input", f"square({x}): yours {square(x)}, expected {x * x}", "x * x")
    return "squares correctly."


def _stub(x):
    raise NotImplementedError("Exercise 99.1")


def _broken(x):
    return {}[x]


def test_the_four_outcomes():
    ok = run_check("99.1", lambda x: x * x)
    assert (ok.status, ok.points, ok.max_points) == ("pass", 3, 3)
    bad = run_check("99.1", lambda x: x + x)
    assert bad.status == "fail" and bad.points == 0
    assert "property 'squares its input' does not hold" in bad.message
    assert "expected 9" in bad.message and "Hint: x * x" in bad.message
    todo = run_check("99.1", _stub)
    assert todo.status == "not_implemented" and "not implemented yet" in todo.message
    err = run_check("99.1", _broken)
    assert err.status == "error" and "KeyError" in err.message and "return {}[x]" in err.message


def test_a_busy_line_prints_no_score():
    """w6-02: "[BUSY] Exercise 2.2 (0/3 points): not graded ... neither passed nor failed" read as a fail."""
    from course_utils.checks._core import CheckResult
    busy = CheckResult("2.2", "busy", 0, 3, "not graded: the machine was busy").line()
    assert busy.startswith("[BUSY] Exercise 2.2 (3 points when graded): not graded") and "0/3" not in busy
    assert CheckResult("2.1", "fail", 0, 1, "no").line().startswith("[FAIL] Exercise 2.1 (0/1 points): ")


def test_a_wrong_type_gets_a_sentence():
    result = run_check("99.1", 42)
    assert result.status == "fail"
    assert result.message.startswith("expected a function square(x), but got an object of type int: 42")
    assert run_check("99.1", None).message.count("None") >= 1


def test_unknown_exercises_are_named():
    with pytest.raises(ValueError, match="no exercise '99.7'"):
        run_check("99.7", None)
    with pytest.raises(ValueError, match="looks like"):
        run_check("seven", None)


def test_results_are_appended_as_json_lines(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    monkeypatch.setenv("COURSE_RESULTS", str(path))
    monkeypatch.setenv("COURSE_NOTEBOOK", "99-test.ipynb")
    run_check("99.1", lambda x: x * x)
    run_check("99.1", _stub)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["status"] for r in records] == ["pass", "not_implemented"]
    for r in records:
        assert {"exercise", "status", "points", "max_points", "message"} <= set(r)
        assert r["notebook"] == "99-test.ipynb"


def test_check_prints_and_strict_mode_raises(capsys, monkeypatch):
    check("99.1", lambda x: x * x)
    assert "[PASS] Exercise 99.1 (3/3 points)" in capsys.readouterr().out
    monkeypatch.setenv("COURSE_STRICT", "1")
    check("99.1", lambda x: x * x)
    with pytest.raises(CheckError, match="TODO"):
        check("99.1", _stub)


def test_a_check_that_runs_forever_is_stopped(monkeypatch):
    from course_utils.checks import _core
    monkeypatch.setattr(_core._LoadWatch, "busy_sentence", lambda self: "")   # a quiet machine (CI may be busy)

    def slow(x):
        time.sleep(5)
    t0 = time.perf_counter()
    result = run_check("99.1", slow)
    assert result.status == "error" and "did not finish within its time limit of 1 s" in result.message
    assert time.perf_counter() - t0 < 3


# -- time limits fitted to the references (issue 21) ------------------------------------------------

def test_every_check_has_a_time_limit_fitted_to_what_its_reference_needs():
    from course_utils.checks import _core, list_exercises
    for lesson in range(9):
        list_exercises(lesson)
    specs = {k: v for k, v in _core._REGISTRY.items() if not k.startswith("99.")}
    assert len(specs) >= 27
    for exercise_id, spec in specs.items():
        if exercise_id in _core.TIME_LIMITS_S:   # fitted here: 10 s or at least 10 times the reference
            limit, reference = _core.TIME_LIMITS_S[exercise_id]
            assert spec.time_limit_s == limit and spec.reference_s == reference
            assert limit >= max(10, 10 * reference), exercise_id
        else:   # the check names its own (timed, worker processes, torchrun)
            assert spec.time_limit_s != _core.DEFAULT_TIME_LIMIT_S, f"{exercise_id} has no fitted limit"
    pure = ["0.1", "1.2", "1.3", "1.4", "2.1", "6.1", "6.2", "6.3", "7.1", "8.2"]
    assert all(specs[e].time_limit_s <= 10 for e in pure)


def test_an_endless_loop_in_a_pure_function_costs_seconds_and_names_the_limit(monkeypatch):
    from course_utils.checks import _core
    monkeypatch.setattr(_core._LoadWatch, "busy_sentence", lambda self: "")   # a quiet machine (CI may be busy)

    def stall_fraction(step_log, skip_first=1):   # exercise 1.2, looping forever (was: 316 s)
        while True:
            pass
    t0 = time.perf_counter()
    result = run_check("1.2", stall_fraction)
    assert time.perf_counter() - t0 < 10 + 5
    assert result.status == "error"
    assert result.message.startswith("the check did not finish within its time limit of 10 s (the course's own "
                                     "answer takes well under a second here once its libraries are loaded)")
    assert "loop forever" in result.message


def test_a_time_limit_that_cuts_a_first_import_leaves_the_next_call_a_clean_import(tmp_path, monkeypatch):
    """w6-06: 6.2's first call ran past its 10 s limit while torch imported sympy; every later call in that
    kernel said `your code raised AttributeError: module 'sympy' has no attribute 'logic'` (the package was
    dropped, its finished submodules were not, and a fresh import of the package never named them again)."""
    from course_utils.checks import _core
    monkeypatch.setattr(_core._LoadWatch, "busy_sentence", lambda self: "")
    pkg = tmp_path / "slowpkg_w606"
    pkg.mkdir()
    (pkg / "logic.py").write_text("VALUE = 42\n")
    (pkg / "__init__.py").write_text("import pathlib, time\nimport slowpkg_w606.logic\n"
                                     "_first = pathlib.Path(__file__).with_name('first')\n"
                                     "if _first.exists():\n    _first.unlink()\n    time.sleep(5)\n")
    (pkg / "first").write_text("")   # the first import is slow (cut by the limit), the next ones quick
    monkeypatch.syspath_prepend(str(tmp_path))

    def check_fn(obj):
        import slowpkg_w606
        assert slowpkg_w606.logic.VALUE == 42
        return "all properties hold."
    monkeypatch.setitem(_core._REGISTRY, "99.71", _core._Exercise("99.71", "slow first import", 1, check_fn, 0.5))
    try:
        first = run_check("99.71", None)
        assert first.status == "error" and "time limit of 0.5 s" in first.message
        assert sys.modules["slowpkg_w606"].logic is sys.modules["slowpkg_w606.logic"]   # finished, whole
        second = run_check("99.71", None)
        assert second.status == "pass", second.message
    finally:
        for name in [n for n in sys.modules if n.startswith("slowpkg_w606")]:
            del sys.modules[name]


def test_a_checks_warmup_runs_once_outside_its_time_limit(monkeypatch):
    from course_utils.checks import _core
    calls = []

    def warm():
        calls.append(1)
        time.sleep(0.7)      # longer than the limit: not charged to it
    monkeypatch.setitem(_core._REGISTRY, "99.72", _core._Exercise("99.72", "warm", 1, lambda obj: None, 0.5,
                                                                  None, warm))
    assert run_check("99.72", None).status == "pass"
    assert run_check("99.72", None).status == "pass"
    assert calls == [1]


def test_the_checker_gives_a_check_half_its_limit_to_stop_on_its_own_5_to_60_s():
    from course_utils import grade
    assert grade._grace(10) == 5 and grade._grace(30) == 15 and grade._grace(580) == 60
    assert "time limit of 10 s" in grade._limit_sentence("1.2")


# -- the tripwire the learner's code cannot switch off (issue 21) ----------------------------------

TARGET = '''
import math

def reference(x):
    return 2 * x

def helper(x):
    return x + 0
'''


@pytest.fixture
def target(tmp_path, monkeypatch):
    """A module standing for the course's implementation (its `reference` is off limits)."""
    import importlib
    import sys
    (tmp_path / "course_reference_standin.py").write_text(TARGET)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("course_reference_standin", None)
    module = importlib.import_module("course_reference_standin")
    yield module
    sys.modules.pop("course_reference_standin", None)


def _trip(module, **kwargs):
    from course_utils.checks import Tripwire
    return Tripwire(module.reference, prop="doubles it itself", why="that is the course's answer",
                    hint="multiply", **kwargs)


def _verdict(trip, fn):
    try:
        out = trip.call(fn, 21)
    except CheckFailed as exc:
        return exc.sentence()
    return out


def test_the_tripwire_catches_the_forbidden_call_and_lets_honest_code_through(target):
    import threading
    trip = _trip(target)
    assert _verdict(trip, lambda x: x + x) == 42
    assert _verdict(trip, lambda x: target.helper(x) * 2) == 42   # the module's other functions are fine

    def threaded(x):   # threads started the usual way are watched, and honest ones pass
        out = []
        t = threading.Thread(target=lambda: out.append(x * 2))
        t.start()
        t.join()
        return out[0]
    assert _verdict(trip, threaded) == 42
    said = _verdict(trip, target.reference)
    assert said.startswith("property 'doubles it itself' does not hold: your code called "
                           "course_reference_standin.reference: that is the course's answer")

    def in_a_thread(x):
        out = []
        t = threading.Thread(target=lambda: out.append(target.reference(x)))
        t.start()
        t.join()
        return out[0]
    assert "your code called course_reference_standin.reference" in _verdict(trip, in_a_thread)
    c_trip = _trip(target, c_names=("factorial",))
    assert "your code called math.factorial" in _verdict(c_trip, lambda x: math.factorial(3) * 7)
    with trip.watching():   # one tripwire, a property per call site (lesson 06's `_call`)
        target.reference(1)
    with pytest.raises(CheckFailed) as failed:
        trip.verdict("splits it", "own words", "h")
    assert failed.value.sentence() == ("property 'splits it' does not hold: your code called "
                                       "course_reference_standin.reference: own words. Hint: h")


def _switch_offs(target):
    import ctypes
    import importlib
    import sys
    import threading

    def setprofile_none(x):
        sys.setprofile(None)
        return target.reference(x)

    def off_and_back_on(x):
        hook = sys.getprofile()
        sys.setprofile(None)
        out = target.reference(x)
        sys.setprofile(hook)
        return out

    def through_ctypes(x):
        ctypes.pythonapi.PyEval_SetProfile(None, None)
        return target.reference(x)

    def threads_unwatched(x):
        threading.setprofile(None)
        out = []
        t = threading.Thread(target=lambda: out.append(target.reference(x)))
        t.start()
        t.join()
        return out[0]

    def threads_unwatched_quietly(x):
        threading._profile_hook = None
        out = []
        t = threading.Thread(target=lambda: out.append(target.reference(x)))
        t.start()
        t.join()
        return out[0]

    def raw_thread(x):
        import _thread
        out = []
        _thread.start_new_thread(lambda: out.append(target.reference(x)), ())
        while not out:
            time.sleep(0.01)
        return out[0]

    def fresh_copy(x):
        return importlib.reload(target).reference(x)

    return {"sys.setprofile(None)": (setprofile_none, "sys.setprofile, at line"),
            "off and back on": (off_and_back_on, "sys.setprofile, at line"),
            "ctypes": (through_ctypes, "sys.setprofile, at line"),
            "threading.setprofile(None)": (threads_unwatched, "threading.setprofile, at line"),
            "threading._profile_hook": (threads_unwatched_quietly, "a thread started after the threads' profiler"),
            "_thread": (raw_thread, "a thread started with _thread"),
            "importlib.reload": (fresh_copy, "a fresh copy of course_reference_standin.py")}


@pytest.mark.parametrize("way", list(_switch_offs(None)))
def test_switching_the_tripwire_off_fails_with_a_sentence_saying_so(target, way):
    import sys
    import threading
    answer, words = _switch_offs(target)[way]
    said = _verdict(_trip(target), answer)
    assert isinstance(said, str) and said.startswith("property 'doubles it itself' does not hold"), said
    assert words in said, said
    assert sys.getprofile() is None and threading.getprofile() is None   # the watch is gone afterwards


def test_in_a_process_the_learners_code_forks_the_forbidden_call_raises(target):
    import os

    def forks(x):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.write(w, str(target.reference(x)).encode())
            except CheckFailed:
                os.write(w, b"tripped")
            os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        said = os.read(r, 100)
        os.close(r)
        return said
    assert _verdict(_trip(target), forks) == b"tripped"


def test_changing_the_profiler_during_any_check_fails_it_lessons_06_included():
    """Issue 21: `sys.setprofile(None)` switched lesson 06's watch off, and 6.1-6.3 then accepted the
    course's own functions (6.2 the check's own reference helpers)."""
    import sys
    import threading

    from course_utils import scaling
    from course_utils.checks import lesson06

    def estimate_dp(costs, n, batch, loader):
        sys.setprofile(None)
        threading.setprofile(None)
        p = scaling.predict_dp(costs, n, batch, loader)
        return {"samples_per_s": p.samples_per_s, "efficiency": p.efficiency, "bound": p.bound}

    def dp_scatter(inputs, n, dim=0):
        sys.setprofile(None)
        return lesson06.reference_scatter(inputs, n, dim)

    def dp_gather(outputs, dim=0):
        sys.setprofile(None)
        return lesson06.reference_gather(outputs, dim)

    def dp_memory(n, batch, **sizes):
        import ctypes
        ctypes.pythonapi.PyEval_SetProfile(None, None)
        return scaling.dp_memory(n, batch, **sizes)

    for exercise_id, answer in (("6.1", estimate_dp), ("6.2", (dp_scatter, dp_gather)), ("6.3", dp_memory)):
        result = run_check(exercise_id, answer)
        assert result.status == "fail", (exercise_id, result.message)
        assert result.message.startswith("property 'leaves the profiler alone' does not hold: your code changed "
                                         "the profiler while the check ran (sys.setprofile, at line"), result.message
    assert run_check("99.1", lambda x: x * x).status == "pass"   # nothing carries over to the next check


# -- every reference answer, twice in one process (issue 21) ------------------------------------------

SLOW = ("2.2", "8.1", "7.2", "7.3", "7.4", "7.5")   # speed-graded (2.2, 8.1) or torchrun launches (7.2-7.5): 100 s more


@pytest.fixture(scope="module")
def twice():
    """The solutions' own answers (their exercise cells run from the released lessons), each through its
    check twice in ONE process (a fresh one, not this test's). COURSE_TWICE_ALL=1 adds the slow ones."""
    import json
    import os
    import subprocess
    import sys

    from course_utils.grading.lessons import ROOT
    skip = () if os.environ.get("COURSE_TWICE_ALL") == "1" else SLOW
    env = dict(os.environ, MPLBACKEND="Agg", COURSE_SMOKE="1", PYTHONPATH=str(ROOT))
    env.pop("COURSE_CHECK_SEED", None)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "unit" / "gradekit.py"), "twice",
                           *[f"{n:02d}" for n in range(9)], "--skip", ",".join(skip) or "none"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stderr[-3000:]
    broken = [r for r in rows if "error" in r]
    assert not broken, "a lesson's cells did not run:\n" + "\n".join(r["error"] for r in broken)
    return {r["exercise"]: r for r in rows}, skip


def _all_exercises():
    from course_utils.grading.lessons import released_lessons
    return [e.id for lesson in released_lessons().values() for e in lesson.exercises]


@pytest.mark.parametrize("exercise_id", _all_exercises())
def test_a_reference_answer_gets_the_same_verdict_twice_in_one_process(twice, exercise_id):
    rows, skip = twice
    if exercise_id in skip:
        pytest.skip(f"{exercise_id} is slow (speed-graded or torchrun): COURSE_TWICE_ALL=1 runs it")
    row = rows[exercise_id]
    assert row["status"] == ["pass", "pass"], row["message"]
    from course_utils.checks import _core
    limit = _core._REGISTRY[exercise_id].time_limit_s
    assert max(row["seconds"]) < limit / 3, (exercise_id, row["seconds"], limit)


# -- within_check_limit: a learner's answer re-used in a lesson cell, bounded like its check (issue 35) --

def test_a_reused_answer_is_stopped_at_its_checks_limit_with_one_sentence():
    import time as _time
    from course_utils.checks import OverCheckLimit, call_within_check_limit, check_time_limit, within_check_limit
    from course_utils.checks._core import _lookup
    assert check_time_limit("1.2") == _lookup("1.2").time_limit_s == 10
    t0 = _time.perf_counter()
    with pytest.raises(OverCheckLimit) as stop:
        with within_check_limit("1.2", "your stall_fraction", limit_s=0.3):
            while True:                       # swallows what Exception catches: not this
                try:
                    _time.sleep(10)
                except Exception:
                    pass
    assert _time.perf_counter() - t0 < 2.0
    assert str(stop.value) == ("your stall_fraction did not finish within 0.3 s, the time limit of check 1.2, "
                               "and was stopped here")
    assert not isinstance(stop.value, Exception)
    # an answer that returns, or raises, is left alone; no alarm is left behind
    assert call_within_check_limit("1.2", lambda x: x + 1, 41) == 42
    with pytest.raises(NotImplementedError):
        call_within_check_limit("1.2", lambda: (_ for _ in ()).throw(NotImplementedError("Exercise 1.2")))
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_an_answer_that_swallows_the_stop_is_stopped_again_every_second():
    import time as _time
    from course_utils.checks import OverCheckLimit, within_check_limit
    caught = []
    t0 = _time.perf_counter()
    with pytest.raises(OverCheckLimit):
        with within_check_limit("1.2", limit_s=0.2):
            for _ in range(2):
                try:
                    while True:
                        pass
                except BaseException as exc:    # noqa: BLE001 (the learner's)
                    caught.append(exc)
            while True:
                pass
    assert len(caught) == 2 and _time.perf_counter() - t0 < 4.0


def test_an_enclosing_alarm_is_kept():
    """Inside a check (its own limit) or another bounded block, the outer limit still fires."""
    import time as _time
    from course_utils.checks import within_check_limit
    from course_utils.checks._core import _time_limit
    t0 = _time.perf_counter()
    with pytest.raises(TimeoutError, match="outer"):
        with _time_limit(0.3, "outer"):
            with within_check_limit("1.2", limit_s=5):
                while True:
                    pass
    assert _time.perf_counter() - t0 < 2.0
    with _time_limit(2.0, "outer"):
        with within_check_limit("1.2", limit_s=5):
            pass
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 1.0 < left <= 2.0                              # re-armed with what was left of it
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_courses_own_work_inside_the_block_does_not_count():
    """A timer times the course's training step: on a busy CPU six steps took 32 s, past check 1.1's
    30 s. `excluded(fn)` stops the countdown while the course's function runs."""
    import time as _time
    from course_utils.checks import OverCheckLimit, within_check_limit

    def step():
        _time.sleep(0.15)

    def time_it(fn):
        for _ in range(4):
            fn()
        return "timed"
    with within_check_limit("1.1", limit_s=0.3) as bound:
        assert time_it(bound.excluded(step)) == "timed"            # 0.6 s of steps, within 0.3 s
    with pytest.raises(OverCheckLimit):
        with within_check_limit("1.1", limit_s=0.3):
            time_it(step)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
