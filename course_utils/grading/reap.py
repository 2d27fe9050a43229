"""No process that a graded notebook or a check started outlives grading.

Every process the grader starts carries a marker in its environment, `COURSE_GRADER_RUN`
(one value per kernel, per check and for the checker, all starting with the run's id), and
every process those start inherits it: torchrun and its ranks (which run in sessions of their
own), DataLoader workers, a process a submission starts with `setsid` or by forking twice. When
a kernel or a check is done, every process that carries its marker is killed; when the run is
done, every process that carries the run's id.

On Linux the checker and each notebook's runner also make themselves child subreapers: a process
orphaned below them (its parent died first) becomes their child rather than init's, so they can
still find and kill it (`kill_children`): the checker after each check, a runner when its notebook
is done. The command line itself is not one, so that a kernel whose runner died is never adopted
by the grader (and cannot reach it as its parent). The runners, the checker and each check die
with their parent (`die_with_parent`): a grader killed with SIGKILL leaves none of them behind, and
its kernels stop on their own when their runner is gone (ipykernel watches its parent).

What escapes both: a process that clears its own environment *and* is orphaned outside a
subreaper (a kernel's grandchild that double-forks with `env -i`); INSTRUCTORS.md says how to
grade untrusted code in a container, where nothing survives the container.
"""
from __future__ import annotations

import contextlib
import os
import sys

__all__ = ["ENV", "marked", "kill_marked", "become_subreaper", "subreaper", "is_subreaper", "kill_children",
           "die_with_parent"]

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


def die_with_parent(parent_pid: int | None = None) -> bool:
    """prctl(PR_SET_PDEATHSIG, SIGKILL): this process is killed when its parent dies, however it
    dies (SIGKILL included): a grader that is killed takes its runners and checker with it. With
    `parent_pid`, exits at once if the parent is already gone. True when it took effect (Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        import signal
        if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except Exception:
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
    return True


def _set_subreaper(on: bool) -> bool:
    """prctl(PR_SET_CHILD_SUBREAPER, on); True when it took effect (Linux only)."""
    global _SUBREAPER
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        if ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0) == 0:
            _SUBREAPER = on
            return True
    except Exception:
        pass
    return False


def become_subreaper() -> bool:
    """Orphans below this process become its children from now on (for a process of the grader's
    own, such as the checker)."""
    return _set_subreaper(True) and _SUBREAPER


@contextlib.contextmanager
def subreaper():
    """This process is a child subreaper inside the block, and no longer after it (the command
    line, which may run inside another program: a test runner must not adopt orphans later)."""
    was = _SUBREAPER
    on = was or _set_subreaper(True)
    try:
        yield on
    finally:
        if on and not was:
            _set_subreaper(False)


def is_subreaper() -> bool:
    """Did `become_subreaper()` succeed in this process?"""
    return _SUBREAPER


def kill_children(*, keep=(), since: float | None = None, wait_s: float = 5.0) -> list[int]:
    """SIGKILL every live descendant of this process except the pids in `keep` (and theirs), and
    with `since` (a `time.time()`) only those started after it; reap the ones that were our
    children, zombies included (a subreaper inherits them). Returns the pids it killed."""
    import psutil
    spared = set(keep)
    for pid in keep:
        try:
            spared |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            pass
    me = os.getpid()
    live, dead = [], []
    try:
        found = psutil.Process(me).children(recursive=True)
    except psutil.Error:
        found = []
    for proc in found:
        try:
            if proc.pid in spared or (since is not None and proc.create_time() < since - 1):
                continue
            (dead if proc.status() == psutil.STATUS_ZOMBIE else live).append(proc)
        except psutil.Error:
            pass
    for proc in live:
        try:
            proc.kill()
        except psutil.Error:
            pass
    if live:
        psutil.wait_procs(live, timeout=wait_s)   # reaps those that are our children
    for proc in dead:
        try:
            if proc.ppid() == me:
                os.waitpid(proc.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError, OSError):
            pass
    return [p.pid for p in live]
