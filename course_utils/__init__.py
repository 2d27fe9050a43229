"""course_utils: the helper package of the Feed the GPU course.

One concept per module: env, timing, monitor, data, models, train, sim, plotting, checks,
grade, authoring (and the lessons' own modules as they arrive). Notebooks import what they use,
e.g. `from course_utils.env import print_env`.
"""
__version__ = "0.1.0"
