"""One OS user per learner (as root), with a home of their own holding a copy of the course.

- `ensure_user(name)`: the account, created when missing (`useradd`, a home of mode 0700, group of
  its own); an existing one is used as it is, unless it is a system account (uid below UID_MIN).
- `ensure_copy(...)`: `~/feed-the-gpu/`, the student notebooks and the programs they launch
  (notebooks/scripts), made once: a learner who logs in again finds their own work, never a
  fresh copy over it. The copy is made by the learner's own uid (a forked process that drops
  root first), so nothing the learner put in their home can make root write elsewhere. The
  folder is 0700: a learner's work stays theirs even where homes are readable by all.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

from .settings import HubError

__all__ = ["COURSE_FOLDER", "uid_min", "ensure_user", "ensure_copy", "remove_user", "demote"]

COURSE_FOLDER = "feed-the-gpu"


def uid_min() -> int:
    """UID_MIN of /etc/login.defs (1000 by default): accounts below it are the system's."""
    try:
        for line in Path("/etc/login.defs").read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "UID_MIN":
                return int(parts[1])
    except (OSError, ValueError):
        pass
    return 1000


def ensure_user(name: str, *, system: bool = False) -> tuple[pwd.struct_passwd, bool]:
    """(the account, whether it was created now). `system=True`: a system account without a home
    or a login shell (the grader's)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        entry = None
    if entry is not None:
        if not system and entry.pw_uid < uid_min():
            raise HubError(f"{name!r} is a system account on this machine (uid {entry.pw_uid}): name the learner "
                           "otherwise")
        return entry, False
    if shutil.which("useradd") is None:
        raise HubError(f"there is no account {name!r} and no `useradd` to create it")
    cmd = (["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group"] if system else
           ["useradd", "--create-home", "--shell", "/bin/bash", "--user-group", "--comment", "Feed the GPU workshop"])
    done = subprocess.run(cmd + [name], capture_output=True, text=True)
    if done.returncode != 0:
        raise HubError(f"useradd could not create {name!r}: {done.stderr.strip()}")
    entry = pwd.getpwnam(name)
    if not system and os.path.isdir(entry.pw_dir):
        os.chmod(entry.pw_dir, 0o700)
    return entry, True


def remove_user(name: str) -> None:
    """Remove an account and its home (`userdel --remove`): for the tests' own learners."""
    subprocess.run(["userdel", "--remove", name], capture_output=True)


def demote(uid: int, gid: int):
    """A preexec_fn that makes the child process the user `uid` (group `gid`, no other groups)."""
    def preexec():
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        os.umask(0o077)
    return preexec


_COPY = r"""
import os, shutil, sys
source, home = sys.argv[1], sys.argv[2]
dest = os.path.join(home, %r)
if os.path.lexists(dest):
    print("kept"); sys.exit(0)
tmp = dest + ".copying"
shutil.rmtree(tmp, ignore_errors=True)
os.mkdir(tmp, 0o700)
skip = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "profiles")
for name in sorted(os.listdir(source)):
    path = os.path.join(source, name)
    if name.endswith(".ipynb"):
        shutil.copyfile(path, os.path.join(tmp, name))
    elif os.path.isdir(path) and not skip(source, [name]):
        shutil.copytree(path, os.path.join(tmp, name), ignore=skip)
os.rename(tmp, dest)
print("made")
""" % COURSE_FOLDER


def ensure_copy(home: str | Path, notebooks: str | Path, *, uid: int | None = None, gid: int | None = None,
                python: str = "/usr/bin/python3") -> bool:
    """Make `home/feed-the-gpu` from the student notebooks in `notebooks` (and the folders beside
    them: scripts/), unless it exists: True when made now. With `uid`, made by that user."""
    kwargs = {}
    if uid is not None:
        kwargs["preexec_fn"] = demote(uid, gid if gid is not None else uid)
    done = subprocess.run([python, "-I", "-c", _COPY, str(notebooks), str(home)], capture_output=True, text=True,
                          cwd="/", timeout=120, **kwargs)
    if done.returncode != 0:
        raise HubError(f"could not copy the notebooks into {home}: {done.stderr.strip()[-500:]}")
    return done.stdout.strip() == "made"
