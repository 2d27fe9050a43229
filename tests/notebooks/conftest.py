"""Collects each notebook's smoke duration and prints them at the end of the run."""
import pytest

DURATIONS: list[tuple[str, float, str]] = []


@pytest.fixture
def record_duration():
    def record(name: str, seconds: float, how: str) -> None:
        DURATIONS.append((name, seconds, how))
    return record


def pytest_terminal_summary(terminalreporter):
    if not DURATIONS:
        return
    terminalreporter.section("notebook smoke durations")
    for name, seconds, how in sorted(DURATIONS, key=lambda d: -d[1]):
        terminalreporter.write_line(f"{seconds:7.1f} s  {how:9s} {name}")
    terminalreporter.write_line(f"{sum(d[1] for d in DURATIONS):7.1f} s  total")
