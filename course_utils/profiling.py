"""Profiling the data path with cProfile, beside torch.profiler's op table (lesson 01).

`torch.profiler` records PyTorch operators. The input pipeline is mostly *not* operators: PIL
images, torchvision's Python transforms, the dataset's `__getitem__`, collation. In its op
table all of that appears as the self time of one opaque row, `enumerate(DataLoader)...`.
Python's own profiler, cProfile, records every Python function and C call instead, so it
names where the data path's time goes:

    result = profile_batches(iter(loader), batches=10)
    for row in top_functions(result.stats, 12): ...
    time_by_library(result.stats)            # {"PIL": s, "torchvision": s, "torch": s, ...}

`opaque_share(prof)` is the share of a torch.profiler run's CPU time that its op table can
only attribute to the DataLoader row. cProfile slows Python-heavy code down (every call is
recorded), so read its times as shares, not as speeds; `profile_batches` measures that
overhead against the same batches without the profiler.
"""
from __future__ import annotations

import cProfile
import pstats
import re
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProfileResult", "profile_batches", "top_functions", "time_by_library", "library_of", "opaque_share"]

_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve())
_PYTHON_OWNERS = {"builtins", "dict", "list", "str", "bytes", "tuple", "object", "type", "int", "float", "set",
                  "frozenset", "memoryview", "bytearray", "method", "function", "generator", "super"}


@dataclass
class ProfileResult:
    """A cProfile run over `batches` batches, and the same number of batches timed without it."""
    stats: pstats.Stats
    batches: int
    profiled_s: float
    unprofiled_s: float

    @property
    def overhead(self) -> float:
        """How many times slower the batches ran under cProfile."""
        return self.profiled_s / self.unprofiled_s if self.unprofiled_s > 0 else float("nan")


def profile_batches(iterator, batches: int = 10) -> ProfileResult:
    """Time `batches` batches of `iterator` without a profiler, then profile `batches` more with
    cProfile (call it on a started iterator: the first batch pays for start-up)."""
    t0 = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    plain = time.perf_counter() - t0
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    try:
        for _ in range(batches):
            next(iterator)
    finally:
        profiler.disable()
    profiled = time.perf_counter() - t0
    return ProfileResult(pstats.Stats(profiler), batches, profiled, plain)


_BUILTIN_OWNER = re.compile(r"(?:built-in method |method '[^']*' of ')([A-Za-z_][\w.]*)")


def library_of(filename: str, name: str) -> str:
    """The package a profiled function belongs to: the folder under site-packages, 'course_utils',
    'python' for the standard library and built-ins, or the owner named in a C function's name
    (`<built-in method torch._C...>` is torch, `<method 'decode' of 'ImagingDecoder' objects>`
    is the object's module when it is named)."""
    if filename == "~":                      # C functions: the owner is in the name
        match = _BUILTIN_OWNER.search(name)
        if match:
            top = match.group(1).split(".")[0]
            if top.startswith(("Imaging", "_imaging")):
                return "PIL"
            if top in _PYTHON_OWNERS or top.startswith("__") or top in getattr(sys, "stdlib_module_names", ()):
                return "python"
            return top
        return "python"
    path = Path(filename)
    parts = path.parts
    if "site-packages" in parts or "dist-packages" in parts:
        i = max(k for k, p in enumerate(parts) if p in ("site-packages", "dist-packages"))
        return parts[i + 1].split(".")[0] if i + 1 < len(parts) else "?"
    if "course_utils" in parts:
        return "course_utils"
    try:
        if str(path.resolve()).startswith(_STDLIB):
            return "python"
    except OSError:
        pass
    return "your code" if not filename.startswith("<") else "python"


def top_functions(stats: pstats.Stats, n: int = 12, sort: str = "tottime") -> list[dict]:
    """The `n` functions with the most own time (`sort="tottime"`) or cumulative time ("cumtime"),
    each as {function, library, calls, own_ms, cumulative_ms}."""
    key = {"tottime": 2, "cumtime": 3}[sort]
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][key])[:n]
    out = []
    for (filename, line, name), (_, calls, tottime, cumtime, _) in rows:
        where = name if filename == "~" else f"{Path(filename).name}:{line}({name})"
        out.append({"function": where, "library": library_of(filename, name), "calls": calls,
                    "own_ms": tottime * 1e3, "cumulative_ms": cumtime * 1e3})
    return out


def time_by_library(stats: pstats.Stats) -> dict[str, float]:
    """Own time (seconds) summed by library, largest first: where the data path's time goes."""
    totals: dict[str, float] = {}
    for (filename, _, name), (_, _, tottime, _, _) in stats.stats.items():
        lib = library_of(filename, name)
        totals[lib] = totals.get(lib, 0.0) + tottime
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def opaque_share(prof) -> float:
    """Share of a torch.profiler run's total self CPU time that sits in the DataLoader's own row
    (`enumerate(DataLoader)...`), i.e. that the op table cannot attribute to any operator."""
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    loader = sum(e.self_cpu_time_total for e in events if e.key.startswith("enumerate(DataLoader)"))
    return loader / total if total else 0.0


if __name__ == "__main__":  # pragma: no cover - `python -m course_utils.profiling FILE.prof`
    stats = pstats.Stats(sys.argv[1])
    for lib, seconds in time_by_library(stats).items():
        print(f"{lib:20s} {seconds * 1e3:10.1f} ms")
