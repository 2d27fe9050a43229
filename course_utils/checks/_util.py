"""Small helpers the lesson checks share."""
from __future__ import annotations

import contextlib
import functools
import importlib
import os
import types

import numpy as np

from ._core import CheckFailed


def fresh_rng(seed: int | None = None) -> tuple[np.random.Generator, int]:
    """A generator with a new seed on every run (inputs the learner has not seen), and the
    seed, so that a failure can be reproduced (set env COURSE_CHECK_SEED to fix it, or pass
    `seed`, where a check takes `check(..., seed=N)`)."""
    if seed is None:
        seed = int(os.environ.get("COURSE_CHECK_SEED") or int.from_bytes(os.urandom(4), "little"))
    return np.random.default_rng(seed), seed


# -- the learner writes it: the course's own implementation is off limits during a check ------

class UsesCourseCode(CheckFailed):
    """Raised when the learner's answer calls the course's own implementation of the exercise."""

    def __init__(self, name: str):
        super().__init__("is your own code",
                         f"it calls `{name}`, the course's own implementation of what this exercise asks",
                         "write it yourself (reading the course's code is fine; calling it is not the exercise)")


def _resolve(target: str):
    """'package.module:Name.attr' -> (the function object to trip, its display name)."""
    module_name, _, path = target.partition(":")
    obj = importlib.import_module(module_name)
    for part in path.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, property):
        obj = obj.fget
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if not isinstance(obj, types.FunctionType):
        raise TypeError(f"{target} is not a Python function")
    return obj, f"{module_name}.{path}"


def _tripwire_code(name: str, closure_size: int) -> types.CodeType:
    """A code object that raises UsesCourseCode(name), with `closure_size` free variables (a
    function's code can only be swapped for one with as many)."""
    cells = [f"_c{i}" for i in range(closure_size)]
    inner = ("def tripwire(*args, **kwargs):\n"
             + "".join(f"    {c}\n" for c in cells)
             + f"    raise __import__('course_utils.checks._util', fromlist=['_']).UsesCourseCode({name!r})\n")
    outer = "def make():\n" + "".join(f"    {c} = None\n" for c in cells) + "".join(
        "    " + line + "\n" for line in inner.splitlines()) + "    return tripwire\n"
    namespace: dict = {}
    exec(compile(outer, f"<course code: {name}>", "exec"), namespace)
    return namespace["make"]().__code__


@contextlib.contextmanager
def course_code_forbidden(targets):
    """Within the block, calling any of `targets` ('module:qualname' of course functions and
    methods) raises `UsesCourseCode`, however the learner got hold of the function (imported it
    by name, subclassed its class, or called it through another course helper). The functions'
    code is swapped, and restored on leaving the block."""
    saved = []
    try:
        for target in targets:
            fn, name = _resolve(target)
            closure = len(fn.__code__.co_freevars)
            saved.append((fn, fn.__code__, fn.__defaults__, fn.__kwdefaults__))
            fn.__code__ = _tripwire_code(name, closure)
            fn.__defaults__, fn.__kwdefaults__ = None, None
        yield
    finally:
        for fn, code, defaults, kwdefaults in reversed(saved):
            fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, defaults, kwdefaults


def forbids(*targets: str):
    """Decorator for a check: the course's implementations `targets` are off limits while it runs."""
    def decorate(check_fn):
        @functools.wraps(check_fn)
        def run(*args, **kwargs):
            with course_code_forbidden(targets):
                return check_fn(*args, **kwargs)
        run.forbidden = targets
        return run
    return decorate


@contextlib.contextmanager
def one_thread():
    """Torch's intra-op threads set to one for the block (and restored). The correctness checks
    run many small tensor operations; on a busy machine, or one shared with DataLoader workers,
    several threads waiting for each other at every operation make them many times slower."""
    import torch
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def single_threaded(check_fn):
    """Decorator: run a correctness check with `one_thread()`."""
    @functools.wraps(check_fn)
    def run(*args, **kwargs):
        with one_thread():
            return check_fn(*args, **kwargs)
    return run
