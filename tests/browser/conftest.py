import pytest


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item (the browser tests screenshot their failures)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
