import os

import pytest


@pytest.fixture(autouse=True)
def _no_results_file(monkeypatch):
    """Unit tests never write to a learner's results file or raise under strict mode."""
    monkeypatch.delenv("COURSE_RESULTS", raising=False)
    monkeypatch.delenv("COURSE_STRICT", raising=False)
    monkeypatch.delenv("COURSE_NOTEBOOK", raising=False)
    yield


@pytest.fixture
def sim():
    from course_utils.sim import SimulatedAccelerator
    device = SimulatedAccelerator(step_ms=10.0)
    yield device
    device.close()
