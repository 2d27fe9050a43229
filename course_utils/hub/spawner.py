"""The spawner `make hub` starts each learner's server with (JupyterHub's LocalProcessSpawner, plus
the learner's seat).

A seat (from the plan `course_utils.hub.run` writes) is the learner's cores, GPU and memory
cgroup. Before the server's process runs anything, still as root: it joins the learner's memory
cgroup, takes the learner's cores as its affinity mask and a private umask, then becomes the
learner (LocalProcessSpawner's switch of user). Its environment: the learners' Python first on
PATH, COURSE_DATA (shared, read-only), COURSE_DATA_HOME (the learner's own), CUDA_VISIBLE_DEVICES
(one GPU or MIG instance, or none: the simulated device), OMP_NUM_THREADS (the cores), the
course's Jupyter settings, the hub's process marker, and the COURSE_ modes the hub was started
with (COURSE_SMOKE, COURSE_DEVICE). Before it starts, the learner's copy of the course is made if
it does not exist; when it stops, every process it left behind is ended (`procs`).

With HUB_SINGLE_USER=1 (no root) every server runs as the hub's own user, in a folder per learner
under the state folder: nothing isolates the learners, as `make hub` says.
"""
from __future__ import annotations

import asyncio
import os

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Dict

from . import accounts, procs
from .resources import MemoryCap

__all__ = ["CourseSpawner", "FORWARDED"]

FORWARDED = ("COURSE_SMOKE", "COURSE_DEVICE", "COURSE_LIVE", "COURSE_SIM_HOST_RATE", "COURSE_MP_START")


class CourseSpawner(LocalProcessSpawner):
    """LocalProcessSpawner with the course's seat per learner (see the module's docstring)."""

    plan = Dict(config=True, help="the hub's plan (course_utils.hub.run): seats, paths, the learners' Python")

    @property
    def seat(self) -> dict:
        seats = self.plan.get("seats", {})
        return seats.get(self.user.name) or self.plan.get("admin_seat", {})

    @property
    def single_user(self) -> bool:
        return bool(self.plan.get("single_user"))

    def _home(self) -> str:
        if self.single_user:
            return os.path.join(self.plan["state"], "homes", self.user.name)
        import pwd
        return pwd.getpwnam(self.user.name).pw_dir

    @property
    def marker(self) -> str:
        return f"{self.plan['hub_id']}/{self.user.name}/"     # the closing / keeps alice's apart from alice2's

    def make_preexec_fn(self, name):
        seat, home = self.seat, self._home()
        switch = None if self.single_user else super().make_preexec_fn(name)

        def preexec():
            if seat.get("cgroup"):
                MemoryCap.join(seat["cgroup"])
            if seat.get("cores"):
                os.sched_setaffinity(0, seat["cores"])
            os.umask(0o077)
            if switch is not None:
                switch()
            else:
                os.chdir(home)
        return preexec

    def user_env(self, env):
        if not self.single_user:
            return super().user_env(env)
        env.update(USER=self.user.name, HOME=self._home(), SHELL="/bin/bash")
        return env

    def get_env(self):
        env = super().get_env()
        python_bin = os.path.dirname(self.plan["python"])
        seat = self.seat
        for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
            env.pop(key, None)
        env.update({
            "PATH": os.pathsep.join([python_bin, "/usr/local/bin", "/usr/bin", "/bin"]),
            "VIRTUAL_ENV": os.path.dirname(python_bin),
            "COURSE_DATA": self.plan["data"],
            "COURSE_DATA_HOME": os.path.join(env.get("HOME") or self._home(), ".feed-the-gpu-data"),
            "CUDA_VISIBLE_DEVICES": seat.get("gpu", ""),
            "JUPYTER_CONFIG_PATH": os.path.join(self.plan["course"], ".jupyter"),
            procs.MARK: self.marker,
        })
        if seat.get("cores"):
            env["OMP_NUM_THREADS"] = str(len(seat["cores"]))
        for key in FORWARDED:
            if key in os.environ:
                env[key] = os.environ[key]
        return env

    async def start(self):
        home = self._home()
        if self.single_user:
            os.makedirs(home, mode=0o700, exist_ok=True)
            uid = gid = None
        else:
            import pwd
            entry = pwd.getpwnam(self.user.name)
            uid, gid = entry.pw_uid, entry.pw_gid
        made = await asyncio.to_thread(accounts.ensure_copy, home, self.plan["notebooks"], uid=uid, gid=gid)
        self.log.info("%s's copy of the course in %s/%s: %s", self.user.name, home, accounts.COURSE_FOLDER,
                      "made now" if made else "kept (made before)")
        return await super().start()

    async def stop(self, now=False):
        await super().stop(now=now)
        cgroup = self.seat.get("cgroup")
        pids = []
        if cgroup:
            try:
                pids = [int(p) for p in open(os.path.join(cgroup, "cgroup.procs")).read().split()]
            except (OSError, ValueError):
                pids = []
        left = await asyncio.to_thread(procs.sweep, self.marker, pids=pids)
        if left:
            self.log.info("ended %d process(es) %s's server left running: %s", len(left), self.user.name, left)
