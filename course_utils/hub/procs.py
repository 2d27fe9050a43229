"""Nothing of the hub's left running once it stops.

Every process the hub starts carries `COURSE_HUB_RUN` in its environment (`<hub id>/proxy`,
`<hub id>/<learner>`), and everything those start inherits it: the learner's server, its
kernels, DataLoader workers, torchrun and its ranks. When a learner's server stops, and when the
hub stops (Ctrl-C, SIGTERM), every process carrying the marker is ended (SIGTERM, then SIGKILL),
and so is every process still in a learner's memory cgroup and, for accounts the hub created,
every process of that account: a process that cleared its environment and left its session is
found there too.
"""
from __future__ import annotations

import os
import signal
import time

__all__ = ["MARK", "marked", "end", "sweep"]

MARK = "COURSE_HUB_RUN"


def marked(value: str, *, prefix: bool = True) -> list:
    """Live processes (not this one) whose COURSE_HUB_RUN is `value` (or starts with it)."""
    import psutil
    me, found = os.getpid(), []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            mark = proc.environ().get(MARK)
            if mark is not None and (mark.startswith(value) if prefix else mark == value) \
                    and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _of_users(uids: set[int]) -> list:
    import psutil
    if not uids:
        return []
    found = []
    for proc in psutil.process_iter(["pid", "uids", "status"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real in uids and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError, TypeError):
            continue
    return found


def end(procs: list, wait_s: float = 5.0) -> list[int]:
    """SIGTERM, `wait_s` seconds, then SIGKILL: returns the pids that would not die (none, normally)."""
    import psutil
    procs = [p for p in procs if p.pid != os.getpid()]
    for sig, wait in ((signal.SIGTERM, wait_s), (signal.SIGKILL, wait_s)):
        alive = []
        for proc in procs:
            try:
                proc.send_signal(sig)
                alive.append(proc)
            except psutil.Error:
                continue
        if not alive:
            break
        _, procs = psutil.wait_procs(alive, timeout=wait)
        if not procs:
            break
    return [p.pid for p in procs]


def sweep(value: str, *, pids=(), uids=(), wait_s: float = 5.0) -> list[int]:
    """End every process marked `value` (a prefix), the `pids` given (a learner's cgroup) and every
    process of the `uids` given; returns the pids found."""
    import psutil
    found = {p.pid: p for p in marked(value)}
    for pid in pids:
        try:
            found.setdefault(int(pid), psutil.Process(int(pid)))
        except (psutil.Error, ValueError):
            continue
    for proc in _of_users(set(uids)):
        found.setdefault(proc.pid, proc)
    found.pop(os.getpid(), None)
    if found:
        end(list(found.values()), wait_s)
        time.sleep(0.1)
    return sorted(found)
