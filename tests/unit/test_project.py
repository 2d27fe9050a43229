"""The two commands: `make lab` opens a safe server, `make test` is what CI runs."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_lab_runs_the_course_launcher():
    out = subprocess.run(["make", "-n", "lab", "PORT=8899"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "-m course_utils.lab --port 8899" in out
    assert "token" not in out.lower(), "make lab must not put a token on any command line"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci
    assert "make lab" in readme and "make test" in readme


def test_requirements_are_pinned_in_one_place():
    reqs = [l for l in (ROOT / "requirements.txt").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert all("==" in r for r in reqs), [r for r in reqs if "==" not in r]
    names = {re.split("==", r)[0] for r in reqs}
    for needed in ("torch", "torchvision", "nvidia-dali-cuda130", "jupyterlab", "papermill", "nbval", "pytest"):
        assert needed in names
    env = (ROOT / "environment.yml").read_text()
    assert "-r requirements.txt" in env and "python=3.11" in env
