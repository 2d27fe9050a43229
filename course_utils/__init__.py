"""course_utils: the helper package of the Feed the GPU course.

One concept per module: env, timing, monitor, data, models, train, sim, plotting, checks,
grade, authoring (and the lessons' own modules as they arrive). Notebooks import what they use,
e.g. `from course_utils.env import print_env`.
"""
__version__ = "0.1.0"

import os as _os

if _os.environ.get("COURSE_MP_START"):
    # How DataLoader workers start: "fork" (Linux's default), "spawn" (macOS's and Windows'
    # default) or "forkserver". The tests run the worker lessons with "spawn" to prove that
    # they work where workers cannot inherit what a notebook defined (lesson 02).
    import multiprocessing as _mp
    _mp.set_start_method(_os.environ["COURSE_MP_START"], force=True)
