"""Inside the submission's kernel: hand each exercise's object to the grader's checker.

The grader replaces every check cell of a submission with the released lesson's check cell,
wrapped so that its `check("N.M", obj, ...)` does not grade anything here (nothing the
submission's kernel says about a verdict counts): it copies `obj` (and any keyword arguments)
with cloudpickle into the folder named by env `COURSE_HANDIN_DIR`, where the trusted checker
process picks it up after the notebook has finished. Functions and classes the notebook
defined travel by value, with the helpers and globals they use; modules and the course's own
code travel by reference.

When the object cannot be handed in (a name that was never defined, a global that cannot be
copied), the reason is written next to it in one sentence, and the grader reports it.
"""
from __future__ import annotations

import linecache
import os
import pickle
import sys
import types
from pathlib import Path

__all__ = ["run_check_cell", "MAX_BYTES", "ENV"]

ENV = "COURSE_HANDIN_DIR"
MAX_BYTES = 1 << 30   # 1 GiB: anything larger is a dataset, not an answer


def _folder() -> Path:
    folder = os.environ.get(ENV)
    if not folder:
        raise RuntimeError("this cell hands an exercise to the grader; it runs only under "
                           "`python -m course_utils.grade` (use `check(...)` in the lab)")
    return Path(folder)


def _write(folder: Path, exercise_id: str, suffix: str, data: bytes) -> None:
    for old in (".pkl", ".err"):
        (folder / f"{exercise_id}{old}").unlink(missing_ok=True)
    tmp = folder / f".{exercise_id}{suffix}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, folder / f"{exercise_id}{suffix}")


def _cell_sources() -> dict:
    """The kernel's cell sources from linecache, so tracebacks in the checker show the lines."""
    return {k: v for k, v in linecache.cache.items()
            if isinstance(v, tuple) and len(v) == 4 and v[1] is None and ("ipykernel_" in k or k.startswith("<ipython-"))}


def _describe(value) -> str:
    kind = type(value).__name__
    return f"a {kind}" if not isinstance(value, types.ModuleType) else f"module {value.__name__}"


def _culprit(obj, dumps) -> str:
    """The first global of the notebook that `obj` uses and that cannot be copied, if any."""
    main = sys.modules.get("__main__")
    seen, todo = set(), [obj]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        functions = []
        if isinstance(item, types.FunctionType):
            functions = [item]
        elif isinstance(item, type) and getattr(item, "__module__", None) == "__main__":
            functions = [v for v in vars(item).values() if isinstance(v, types.FunctionType)]
        for fn in functions:
            codes, names = [fn.__code__], set()
            while codes:
                code = codes.pop()
                names |= set(code.co_names)
                codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
            for name in sorted(names):
                if name in fn.__globals__ and fn.__globals__ is getattr(main, "__dict__", None):
                    value = fn.__globals__[name]
                    try:
                        dumps(value)
                    except Exception as exc:
                        return (f"it uses the notebook's global `{name}` ({_describe(value)}), which "
                                f"cannot be copied ({type(exc).__name__}: {exc})")
                    if isinstance(value, (types.FunctionType, type)):
                        todo.append(value)
    return ""


def run_check_cell(exercise_id: str, cell) -> None:
    """Run a released check cell (`cell(check)`) with a `check` that hands objects to the grader."""
    import cloudpickle

    folder = _folder()
    handed = []

    def check(ex_id, obj, **kwargs):
        if ex_id != exercise_id:
            return
        try:
            data = cloudpickle.dumps((obj, kwargs, _cell_sources()), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            what = getattr(obj, "__name__", type(obj).__name__)
            why = _culprit(obj, cloudpickle.dumps) or f"{type(exc).__name__}: {exc}"
            raise _NotHanded(f"the grader could not copy `{what}` out of the notebook: {why}. "
                             "Create that object inside your function, or pass it in as an argument.") from None
        if len(data) > MAX_BYTES:
            raise _NotHanded(f"`{getattr(obj, '__name__', 'the object')}` copies to {len(data) / 2**20:,.0f} MiB, "
                             f"more than the {MAX_BYTES >> 20} MiB the grader accepts: does it keep a dataset in a global?")
        _write(folder, exercise_id, ".pkl", data)
        handed.append(len(data))

    try:
        cell(check)
    except _NotHanded as exc:
        _write(folder, exercise_id, ".err", str(exc).encode())
        print(f"[NOT HANDED IN] Exercise {exercise_id}: {exc}")
        return
    except NameError as exc:
        name = getattr(exc, "name", None) or str(exc)
        message = (f"`{name}` is not defined when the check cell runs: the cell that should define "
                   "it did not run, failed, or names it differently")
        _write(folder, exercise_id, ".err", ("missing:" + message).encode())
        print(f"[NOT HANDED IN] Exercise {exercise_id}: {message}.")
        return
    except Exception as exc:
        message = f"the check cell raised {type(exc).__name__}: {exc}"
        _write(folder, exercise_id, ".err", message.encode())
        print(f"[NOT HANDED IN] Exercise {exercise_id}: {message}.")
        return
    if handed:
        print(f"Exercise {exercise_id} handed to the grader ({handed[-1] / 1024:,.1f} KiB); "
              "its verdict comes from the grader's own process.")
    else:
        _write(folder, exercise_id, ".err", f"the check cell did not hand exercise {exercise_id} in".encode())


class _NotHanded(Exception):
    pass
