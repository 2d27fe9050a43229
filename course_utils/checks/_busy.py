"""Too busy to grade speed: what other programs took from a speed-graded check (2.2, 8.1).

A speed-graded check compares two pipelines measured in one run. When other programs take the
cores a pipeline needs while it is timed (another learner's training on a shared server, a
build, a second notebook), a right answer measures slow: check 2.2's right loader measured 0.79x
its baseline with one of two cores kept busy. Such a check does not say FAIL: it raises
`MachineBusy`, whose result is "not graded: the machine was busy (X cores taken by other
programs)", and the grader runs it again later (`course_utils.grading.busy`).

`OthersCpu` measures what OTHER programs used, never the check's own processes: the busy time of
the cores this process may run on (its affinity mask, so another learner pinned to other cores
does not count), minus the CPU time of this process and its children (DataLoader workers), per
second of wall time. Under a CPU quota (cgroup `cpu.max`) only what the others leave below the
quota counts: on a 64-core node with a 2-core quota, programs busy on the other 62 cores took
nothing from the check.
"""
from __future__ import annotations

import os
import time

__all__ = ["OthersCpu", "busy_limit", "BUSY_SHARE", "BUSY_MIN_CORES", "MachineBusy"]

# A check counts the machine as busy when other programs took at least this share of its usable
# cores while it measured (and never less than BUSY_MIN_CORES). On 2 cores: 0.2 cores. Check 2.2's
# ideal gain is about the number of free cores (2.0x on 2 quiet cores, its bar 1.2x): 0.2 cores
# taken leave 1.8 free, a tenth of the gain gone, which the right loader's margin absorbs (it
# measured 1.31-1.62x quiet); one core taken leaves one free, and the right loader measured 0.79x.
BUSY_SHARE = 0.1
BUSY_MIN_CORES = 0.2


def busy_limit(cores: int | float) -> float:
    """Cores other programs may take while a speed-graded check measures before it counts the
    machine as too busy to judge speed: a tenth of the usable cores, at least 0.2."""
    return max(BUSY_MIN_CORES, BUSY_SHARE * float(cores))


def _my_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:   # macOS, Windows: every core
        return list(range(os.cpu_count() or 1))


class OthersCpu:
    """Context manager: cores' worth of CPU time other programs took from this process's cores
    during the block (`others_cores`), and what this process and its children used (`ours_cores`).

        with OthersCpu() as others:
            stats = measure_loader(loader, device, 24)
        if others.others_cores >= busy_limit(others.usable): ...

    `usable` is `usable_cores()` (the affinity mask and a CPU quota); `free_cores` what the others
    left of it."""

    def __init__(self):
        self.wall_s = self.ours_cores = self.others_cores = self.free_cores = 0.0
        self.usable = 1

    def __enter__(self) -> "OthersCpu":
        import psutil

        from ..loaders import _own_seconds
        self._cores = _my_cores()
        self._proc = psutil.Process()
        self._own0 = _own_seconds(self._proc)
        t = os.times()
        self._reaped0 = t.children_user + t.children_system
        self._busy0 = self._busy_now()
        self._t0 = time.perf_counter()
        return self

    def _busy_now(self) -> float:
        import psutil

        from ..loaders import _busy_seconds
        per_cpu = psutil.cpu_times(percpu=True)
        return sum(_busy_seconds(per_cpu[i]) for i in self._cores if i < len(per_cpu))

    def __exit__(self, *exc) -> None:
        from ..env import cpu_quota_cores, usable_cores
        from ..loaders import _own_seconds
        wall = max(time.perf_counter() - self._t0, 1e-9)
        busy = self._busy_now() - self._busy0
        own1 = _own_seconds(self._proc)
        live = sum(max(v - self._own0.get(pid, 0.0), 0.0) for pid, v in own1.items())
        t = os.times()
        ours = live + (t.children_user + t.children_system) - self._reaped0   # workers that exited meanwhile
        self.wall_s = wall
        self.ours_cores = ours / wall
        others_on_mask = max(busy - ours, 0.0) / wall
        self.usable = usable_cores()
        quota = cpu_quota_cores()
        mask_free = len(self._cores) - others_on_mask
        self.free_cores = max(0.0, min(float(self.usable), mask_free, quota if quota is not None else mask_free))
        self.others_cores = max(0.0, self.usable - self.free_cores)

    def __str__(self) -> str:
        return (f"other programs {self.others_cores:.1f} of {self.usable} usable cores, this check "
                f"{self.ours_cores:.1f}, over {self.wall_s:.1f} s")


class MachineBusy(Exception):
    """Raised by a speed-graded check that measured while other programs took too much of the
    machine to judge speed: the check's result is "not graded" (status `busy`), not a FAIL, and
    the grader runs it again later. `others_cores` of the `cores` usable were taken; `what` says
    what was being measured."""

    def __init__(self, others_cores: float, cores: int, what: str = "while it measured speed", held: str = ""):
        super().__init__(others_cores)
        self.others_cores, self.cores, self.what = float(others_cores), int(cores), what
        self.held = held      # what the check did judge before the speed (a sentence), if anything

    def sentence(self) -> str:
        held = f" {self.held}." if self.held else ""
        return (f"not graded: the machine was busy ({self.others_cores:.1f} of its {self.cores} cores taken by other "
                f"programs {self.what}), too busy to judge speed fairly.{held} Your answer was neither passed nor "
                "failed: the grader runs this check again when the machine is quieter; in a notebook, run this "
                "cell again once the other programs are done (`top` shows them)")
