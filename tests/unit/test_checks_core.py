import json
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


def test_a_check_that_runs_forever_is_stopped():
    def slow(x):
        time.sleep(5)
    t0 = time.perf_counter()
    result = run_check("99.1", slow)
    assert result.status == "error" and "did not finish within 1 s" in result.message
    assert time.perf_counter() - t0 < 3
