"""The grader's command line on small notebooks written here (each runs a real kernel)."""
import json

import nbformat
import pytest

from course_utils.grade import check_cells, main

GOOD = '''
import numpy as np, torch
from course_utils.checks import check
from course_utils.data import CIFAR10_MEAN, CIFAR10_STD
def to_image(x):
    m = torch.tensor(CIFAR10_MEAN).view(3, 1, 1); s = torch.tensor(CIFAR10_STD).view(3, 1, 1)
    return ((x * s + m) * 255).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()
'''


def _write(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("SMOKE = False")] + [nbformat.v4.new_code_cell(s) for s in sources]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nbformat.write(nb, str(path))
    return path


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grade")
    good = _write(tmp / "good.ipynb", GOOD, 'assert SMOKE is True\ncheck("0.1", to_image)')
    bad = _write(tmp / "bad.ipynb", GOOD, 'check("0.1", lambda x: x)', "1 / 0", 'check("0.1", to_image)')
    out = tmp / "grades.json"
    code_good = main([str(good), "--smoke", "--json", str(tmp / "good.json")])
    code_both = main([str(good), str(bad), "--smoke", "--json", str(out)])
    return code_good, code_both, json.loads(out.read_text())


def test_exit_status_is_zero_only_when_everything_passed(graded):
    code_good, code_both, _ = graded
    assert code_good == 0 and code_both == 1


def test_records_name_the_failure_the_crash_and_the_cell_that_never_ran(graded):
    records = graded[2]
    by = {(r["notebook"], r["status"]): r for r in records}
    assert by[("good.ipynb", "pass")]["points"] == 1
    assert ("bad.ipynb", "fail") in by
    crash = by[("bad.ipynb", "crashed")]["message"]
    assert "cell 4 (`1 / 0`)" in crash and "ZeroDivisionError" in crash
    assert by[("bad.ipynb", "missing")]["exercise"] == "0.1"
    for r in records:
        assert set(r) == {"notebook", "exercise", "status", "points", "max_points", "message"}


def test_the_table_is_printed(graded, capsys):
    # the fixture printed before capsys; run a one-notebook grade of a missing file instead
    with pytest.raises(SystemExit):
        main(["does-not-exist.ipynb"])
    assert "no such notebook" in capsys.readouterr().err


def test_check_cells_finds_every_check_call(tmp_path):
    path = _write(tmp_path / "n.ipynb", 'check("1.1", f)', "x = 1\ncheck('1.2', g)", "# check(\"9.9\", no) in a comment")
    assert check_cells(path) == ["1.1", "1.2"]
