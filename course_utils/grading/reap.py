"""No process that a graded notebook or a check started outlives grading.

Every process the grader starts carries a marker in its environment, `COURSE_GRADER_RUN`
(one value per kernel, per check and for the checker, all starting with the run's id), and
every process those start inherits it: torchrun and its ranks (which run in sessions of their
own), DataLoader workers, a process a submission starts with `setsid` or by forking twice. When
a kernel or a check is done, every process that carries its marker is killed; when the run is
done, every process that carries the run's id.

On Linux the checker and the command line also make themselves child subreapers: a process
orphaned below them (its parent died first) becomes their child rather than init's, so they
can still find and kill it after each check (`kill_children`).

What escapes both: a process that clears its own environment *and* is orphaned outside a
subreaper (a kernel's grandchild that double-forks with `env -i`); INSTRUCTORS.md says how to
grade untrusted code in a container, where nothing survives the container.
"""
from __future__ import annotations

import os
import sys

__all__ = ["ENV", "marked", "kill_marked", "become_subreaper", "is_subreaper", "kill_children"]

ENV = "COURSE_GRADER_RUN"
_SUBREAPER = False


def marked(value: str, *, prefix: bool = False) -> list:
    """Live processes (not this one) whose `COURSE_GRADER_RUN` is `value` (or starts with it)."""
    import psutil
    if not value:
        return []
    me, found = os.getpid(), []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            mark = proc.environ().get(ENV)
            if mark is None or not (mark.startswith(value) if prefix else mark == value):
                continue
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_marked(value: str, *, prefix: bool = False, wait_s: float = 5.0) -> list[int]:
    """SIGKILL every process `marked(value)` finds; returns their pids."""
    import psutil
    procs = marked(value, prefix=prefix)
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    if procs:
        psutil.wait_procs(procs, timeout=wait_s)
    return [p.pid for p in procs]


def become_subreaper() -> bool:
    """prctl(PR_SET_CHILD_SUBREAPER, 1): orphans below this process become its children (Linux)."""
    global _SUBREAPER
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        _SUBREAPER = ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except Exception:
        pass
    return _SUBREAPER


def is_subreaper() -> bool:
    """Did `become_subreaper()` succeed in this process?"""
    return _SUBREAPER


def kill_children(*, keep=(), wait_s: float = 5.0) -> list[int]:
    """SIGKILL every descendant of this process except the pids in `keep` (and theirs), and reap
    every child that has ended (a subreaper inherits zombies)."""
    import psutil
    keep = set(keep)
    me = psutil.Process()
    spared = set(keep)
    for pid in keep:
        try:
            spared |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            pass
    try:
        procs = [p for p in me.children(recursive=True) if p.pid not in spared]
    except psutil.Error:
        procs = []
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    if procs:
        psutil.wait_procs(procs, timeout=wait_s)
    if not keep:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
    return [p.pid for p in procs]
