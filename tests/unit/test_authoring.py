import json
from pathlib import Path

import nbformat
import pytest

from course_utils.authoring import AuthoringError, KEEP_OUTPUT, ROOT, clean_solution, make_student, student_source
from course_utils.grade import check_cells


def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def test_solution_regions_become_stubs_at_their_indentation():
    code = ("def f(x):\n    ### BEGIN SOLUTION\n    y = x * 2\n    return y\n    ### END SOLUTION\n\n"
            "class A:\n    def g(self):\n        ### BEGIN SOLUTION\n        return 1\n        ### END SOLUTION\n")
    cell = nbformat.v4.new_code_cell(code)
    cell.outputs = [nbformat.v4.new_output("stream", text="hi")]
    cell.execution_count = 3
    nb = _nb(nbformat.v4.new_markdown_cell("## Exercise 4.2 — something\n<!-- BEGIN SOLUTION -->forty-two<!-- END SOLUTION -->"),
             cell)
    out = student_source(nb)
    src = out.cells[1].source
    assert "y = x * 2" not in src and "return 1" not in src
    assert '    # YOUR CODE HERE\n    raise NotImplementedError("Exercise 4.2")\n' in src
    assert '        # YOUR CODE HERE\n        raise NotImplementedError("Exercise 4.2")\n' in src
    assert out.cells[1].outputs == [] and out.cells[1].execution_count is None
    assert "forty-two" not in out.cells[0].source and "_Your answer here._" in out.cells[0].source
    assert "y = x * 2" in nb.cells[1].source, "the solution notebook itself is untouched"


def test_student_notebooks_say_which_lesson_they_are():
    nb = _nb(nbformat.v4.new_markdown_cell("## Exercise 3.1"), nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n"),
             nbformat.v4.new_code_cell('check("3.1", x)'), nbformat.v4.new_code_cell("check('3.2', y)"))
    assert student_source(nb, "03-prefetch.ipynb").metadata["course"] == {"lesson": "03-prefetch", "exercises": ["3.1", "3.2"]}
    assert "course" not in student_source(nb).metadata


def test_a_region_without_an_exercise_heading_is_an_error():
    nb = _nb(nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n"))
    with pytest.raises(AuthoringError, match="no '## Exercise N.M' heading"):
        student_source(nb)
    nb = _nb(nbformat.v4.new_markdown_cell("## Exercise 1.1"), nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n"))
    with pytest.raises(AuthoringError, match="unmatched"):
        student_source(nb)


def test_clean_keeps_only_nbval_outputs():
    keep = nbformat.v4.new_code_cell(f"# {KEEP_OUTPUT}\nprint(1)")
    keep.outputs = [nbformat.v4.new_output("stream", text="1\n")]
    drop = nbformat.v4.new_code_cell("print(2)")
    drop.outputs = [nbformat.v4.new_output("stream", text="2\n")]
    out = clean_solution(_nb(keep, drop))
    assert out.cells[0].outputs and out.cells[0].execution_count
    assert out.cells[1].outputs == [] and out.cells[1].execution_count is None


def test_student_notebooks_are_up_to_date():
    stale = make_student(check=True)
    assert not stale, f"notebooks/ is out of date for {stale}: run `make student`"


SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_notebooks_follow_the_lesson_shape(path):
    nb = nbformat.read(str(path), as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    assert "What you will learn" in nb.cells[0].source or "will learn" in nb.cells[0].source
    assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells), "no cell tagged parameters"
    assert any("print_env()" in c.source for c in nb.cells if c.cell_type == "code")
    for c in nb.cells:
        if c.cell_type == "code" and c.outputs:
            assert KEEP_OUTPUT in c.source, f"{path.name}: outputs committed outside {KEEP_OUTPUT} cells"
    headings = [h for c in nb.cells if c.cell_type == "markdown"
                for h in __import__("re").findall(r"^## Exercise (\d+\.\d+)", c.source, __import__("re").M)]
    assert headings, "a lesson has exercises"
    assert sorted(headings) == sorted(check_cells(path)), "one check cell per exercise heading"
    assert any("## Summary" in c.source for c in nb.cells if c.cell_type == "markdown")
