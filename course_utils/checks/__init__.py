"""The graders: `check("N.M", obj)` tests what you wrote on fresh, seeded inputs.

Each lesson's checks live in `lessonNN.py` and are loaded when first used. See `_core.py`
for how a check runs, reports and records its result.
"""
from ._core import (CheckError, CheckFailed, CheckResult, Tripwire, WrongType, check, close, exercise,
                    expect_callable, expect_class, list_exercises, run_check)
from .bounded import OverCheckLimit, call_within_check_limit, check_time_limit, within_check_limit

__all__ = ["check", "run_check", "CheckResult", "CheckFailed", "CheckError", "WrongType", "exercise",
           "expect_callable", "expect_class", "close", "list_exercises", "Tripwire",
           "OverCheckLimit", "within_check_limit", "call_within_check_limit", "check_time_limit"]
