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
only attribute to the DataLoader row; `loader_rows(prof)` are those rows themselves (an op table
sorted by total time may not reach them). `quiet_kineto()` keeps the profiler's tracing library
(Kineto) from printing its start/stop markers and, without a GPU, "gpuGetDeviceCount failed" into
the notebook, and says in one sentence what it kept back. cProfile slows Python-heavy code down (every call is
recorded), so read its times as shares, not as speeds; `profile_batches` measures that
overhead against the same batches without the profiler.
"""
from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import re
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProfileResult", "profile_batches", "top_functions", "time_by_library", "library_of", "opaque_share",
           "loader_rows", "quiet_kineto", "kineto_sentence"]

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


def loader_rows(prof) -> list:
    """The op table's rows of the DataLoader (`enumerate(DataLoader)#...__next__`): where the time of
    loading the batches appears (its self time is the data path, not any operator)."""
    return [e for e in prof.key_averages() if e.key.startswith("enumerate(DataLoader)")]


# What Kineto, torch.profiler's tracing library, writes to the process's stderr (C++, past Python):
# its start and stop markers, its stages, and, on a machine without a GPU, that CUDA found no device.
_KINETO_LINE = re.compile(r"^(USDT|STAGE|ERROR|WARNING|INFO):\S+ \S+ \d+:\d+ \w+\.cpp:\d+\]")
_NO_GPU = re.compile(r"gpuGetDeviceCount failed with code (\d+)|cudaGetDeviceCount|no CUDA-capable device")


def kineto_sentence(lines: list[str]) -> str:
    """One sentence saying what Kineto's lines `lines` were (empty when there were none)."""
    if not lines:
        return ""
    markers = sum(("profiler_start" in x or "profiler_stop" in x or x.startswith("STAGE")) for x in lines)
    no_gpu = [x for x in lines if _NO_GPU.search(x)]
    others = len(lines) - markers - len(no_gpu)
    parts = []
    if markers:
        parts.append(f"{markers} marker{'s' if markers != 1 else ''} of when it started and stopped recording")
    if no_gpu:
        code = _NO_GPU.search(no_gpu[0]).group(1)
        parts.append("that it looked for a GPU and found none (\"gpuGetDeviceCount failed" +
                     (f" with code {code}" if code else "") + "\": CUDA's answer on a machine without a GPU driver)")
    if others:
        parts.append(f"{others} other line{'s' if others != 1 else ''}")
    return ("(torch.profiler's tracing library, Kineto, wrote " + " and ".join(parts) +
            " to the process's error output; kept out of this output: they are not errors of this lesson.)")


@contextlib.contextmanager
def quiet_kineto(report=print):
    """Inside the block, what Kineto writes to the process's stderr (file descriptor 2, below Python)
    is held back; when the block ends, its start/stop markers and its "no GPU" error are dropped,
    every other line goes to stderr as usual, and `report` (print) gets one sentence saying what
    was dropped. Python's own warnings are not
    touched (they go through sys.stderr). Lesson 01's profiler cells use it."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode(errors="replace").splitlines()
            # held back: the start/stop markers and stages, and "no GPU" where there is none; any other
            # line of Kineto's (a CUPTI error on a GPU, say) may matter, and goes through
            kineto = [x for x in lines if _KINETO_LINE.match(x) and (x.startswith(("USDT", "STAGE")) or _NO_GPU.search(x))]
            rest = [x for x in lines if x not in kineto]
            if rest:
                sys.stderr.write("\n".join(rest) + "\n")
            if kineto and report is not None:
                report(kineto_sentence(kineto))


if __name__ == "__main__":  # pragma: no cover - `python -m course_utils.profiling FILE.prof`
    stats = pstats.Stats(sys.argv[1])
    for lib, seconds in time_by_library(stats).items():
        print(f"{lib:20s} {seconds * 1e3:10.1f} ms")
