"""The learners' Python, the course's code and its data, in a shared read-only place (HUB_SHARED).

Found when trying it: the course's `.venv/bin/python` is a link to the interpreter it was built
from, and when that lives under /root (pyenv's, mode 0700) no learner can run it. So the learners
get an environment of their own, built once per installation:

    HUB_SHARED/env/       bin/python -> the system's python3.X (the .venv's own base interpreter when
                          every user can run it); lib/, share/, etc/ hard-linked from the course's
                          .venv (the same files: no second copy of torch; a full copy where the two
                          folders are on different filesystems); pyvenv.cfg naming that interpreter
    HUB_SHARED/course/    a snapshot of course_utils/, notebooks/ (the student versions and their
                          scripts), .jupyter/ and solutions/ (readable by the grader's group only),
                          which the environment imports course_utils from
    HUB_SHARED/data/cifar the course's data, prepared once (COURSE_DATA for every learner)

Everything is root's and read-only to the learners (files 0644, folders 0755, nothing writable by
others); `verify()` runs the environment as `nobody` (importing torch, course_utils, JupyterLab
and JupyterHub's single-user server) to prove that a learner can. The environment is rebuilt when
the course's .venv changes (its install stamps), the course snapshot on every `make hub`.
"""
from __future__ import annotations

import grp
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .settings import ROOT, HubError

__all__ = ["LearnerEnv", "build", "base_python", "others_can_run", "verify", "prepare_data", "snapshot_course"]


@dataclass
class LearnerEnv:
    python: Path           # what the learners run (HUB_SHARED/env/bin/python)
    course: Path           # the course snapshot (its course_utils is what they import)
    data: Path             # COURSE_DATA
    how: str               # "hard links" or "copy"

    @property
    def notebooks(self) -> Path:
        return self.course / "notebooks"


def others_can_run(path: Path) -> bool:
    """Whether a user who is neither the owner nor in the group can execute `path`: every folder on
    the way (links resolved) searchable by others, the file executable by others."""
    real = Path(os.path.realpath(path))
    try:
        if not real.stat().st_mode & 0o001:
            return False
        for folder in real.parents:
            if not folder.stat().st_mode & 0o001:
                return False
    except OSError:
        return False
    return True


def _venv_version(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise HubError(f"the course's environment ({venv}) does not run: run `make venv` first")
    return out.stdout.strip()


def base_python(venv: Path, version: str | None = None) -> Path:
    """The interpreter the learners' environment is built on: the .venv's own when any user can
    run it, else the system's python of the same version (/usr/bin, /usr/local/bin)."""
    version = version or _venv_version(venv)
    own = Path(os.path.realpath(venv / "bin" / "python"))
    candidates = [own] + [Path(p) / f"python{version}" for p in ("/usr/bin", "/usr/local/bin", "/opt/python/bin")]
    for candidate in candidates:
        if candidate.exists() and others_can_run(candidate):
            check = subprocess.run([str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                   capture_output=True, text=True, timeout=60)
            if check.stdout.strip() == version:
                return candidate
    raise HubError(f"the learners cannot run the course's Python ({own} is not executable by other users, "
                   f"e.g. under /root) and there is no system python{version} (/usr/bin/python{version}): install "
                   f"python{version} (Debian: apt-get install python{version}) or build .venv from a Python every "
                   "user can run (make venv PYTHON=/usr/bin/python3)")


def _key(venv: Path, python: Path) -> str:
    """What the environment was built from: the .venv's install stamps and the interpreter."""
    parts = [str(python), str(venv.resolve())]
    for stamp in (".installed", ".hub-installed"):
        path = venv / stamp
        parts.append(f"{stamp}:{path.stat().st_mtime_ns if path.exists() else 0}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _link_tree(source: Path, dest: Path) -> str:
    """Hard-link `source` into `dest` (cp -al); a copy where links cannot cross filesystems."""
    done = subprocess.run(["cp", "-al", str(source), str(dest)], capture_output=True, text=True)
    if done.returncode == 0:
        return "hard links"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest, symlinks=True)
    return "copy"


def _site_packages(env: Path, version: str) -> Path:
    return env / "lib" / f"python{version}" / "site-packages"


def _build_env(venv: Path, python: Path, version: str, dest: Path, course: Path, say) -> str:
    tmp = dest.with_name(dest.name + ".new")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    how = "hard links"
    for part in ("lib", "share", "etc"):
        if (venv / part).is_dir():
            if _link_tree(venv / part, tmp / part) == "copy":
                how = "copy"
    if (venv / "lib64").is_symlink() or (venv / "lib64").exists():
        os.symlink("lib", tmp / "lib64")
    (tmp / "bin").mkdir()
    os.symlink(python, tmp / "bin" / "python")
    for name in ("python3", f"python{version}"):
        os.symlink("python", tmp / "bin" / name)
    (tmp / "pyvenv.cfg").write_text(f"home = {python.parent}\ninclude-system-site-packages = false\n"
                                    f"version = {version}\nexecutable = {python}\n")
    site = _site_packages(tmp, version)
    # the editable install of course_utils points into the course's checkout: the snapshot replaces it
    for entry in site.iterdir():
        if entry.name.startswith(("__editable__", "course_utils-")) and "course_utils" in entry.name:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    (site / "_feed_the_gpu_course.pth").write_text(f"{course}\n")
    old = dest.with_name(dest.name + ".old")
    if dest.exists():
        shutil.rmtree(old, ignore_errors=True)      # one a previous hub stopped before it was removed
        os.rename(dest, old)
    os.rename(tmp, dest)
    if old.exists():                                # its links go while the hub starts (tens of thousands)
        import threading
        threading.Thread(target=shutil.rmtree, args=(old,), kwargs={"ignore_errors": True}, daemon=True,
                         name="remove the previous learners' environment").start()
    return how


def snapshot_course(dest: Path, *, grader_group: str | None = None, root: Path = ROOT) -> None:
    """Copy the course's code, student notebooks, Jupyter settings and released lessons into `dest`
    (replacing what was there). `solutions/` is readable by `grader_group` only (mode 0750)."""
    tmp = dest.with_name(dest.name + ".new")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "profiles")
    shutil.copytree(root / "course_utils", tmp / "course_utils", ignore=skip)
    shutil.copytree(root / "notebooks", tmp / "notebooks", ignore=skip)
    if (root / ".jupyter").is_dir():
        shutil.copytree(root / ".jupyter", tmp / ".jupyter", ignore=skip)
    for name in ("requirements.txt", "pyproject.toml"):
        if (root / name).exists():
            shutil.copy2(root / name, tmp / name)
    shutil.copytree(root / "solutions", tmp / "solutions", ignore=skip)
    _read_only(tmp)
    if grader_group is not None and os.geteuid() == 0:
        os.chown(tmp / "solutions", 0, grp.getgrnam(grader_group).gr_gid)
        os.chmod(tmp / "solutions", 0o750)
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        os.rename(dest, old)
    os.rename(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)


def _read_only(top: Path) -> None:
    """Folders 0755, files 0644 (0755 where executable): readable by all, writable by the owner only."""
    for folder, dirs, files in os.walk(top):
        os.chmod(folder, 0o755)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, 0o755 if mode & 0o111 else 0o644)


def _no_writable_by_others(top: Path) -> int:
    """Clear the group/other write bits under `top` (shared with the .venv's files by the links)."""
    fixed = 0
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not os.path.islink(path) and st.st_mode & 0o022:
                os.chmod(path, st.st_mode & ~0o022)
                fixed += 1
    return fixed


def prepare_data(dest: Path, python: Path, say) -> Path:
    """COURSE_DATA for every learner: `dest` when it already holds a valid copy; else the course's
    own prepared data (the real CIFAR-10 or the generated default) linked or copied there; else
    generated there (about half a minute). Returns the folder."""
    check = "from course_utils.data import validate_cifar_dir as v; import sys; v(sys.argv[1])"
    if dest.is_dir() and subprocess.run([str(python), "-c", check, str(dest)], capture_output=True).returncode == 0:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    find = ("from course_utils.data import prepare_cifar10; print(prepare_cifar10(generate=False).root)")
    env = {k: v for k, v in os.environ.items() if k != "COURSE_DATA"}
    found = subprocess.run([sys.executable, "-c", find], capture_output=True, text=True, env=env, cwd=str(ROOT))
    if found.returncode == 0 and Path(found.stdout.strip()).is_dir():
        source = Path(found.stdout.strip())
        say(f"the course's data for every learner: {source} -> {dest}")
        _link_tree(source, dest)
    else:
        say(f"preparing the course's data once for every learner in {dest} (about half a minute)")
        done = subprocess.run([str(python), "-m", "course_utils.data", "--regenerate", str(dest)],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise HubError(f"the course's data could not be prepared in {dest}: {done.stderr.strip()[-500:]}")
    _read_only(dest)
    return dest


def verify(python: Path, env_extra: dict | None = None, user: str = "nobody", *, full: bool = True) -> None:
    """Run the learners' environment as `user` (root only; as yourself otherwise): it must import
    torch, course_utils (from the snapshot), JupyterLab and JupyterHub's single-user server, and
    find the data (`full=False`: the course's code and the data only, for an environment that
    passed the full check when it was built)."""
    probe = ("import course_utils, course_utils.checks; from course_utils.data import prepare_cifar10; "
             "print(course_utils.__file__, prepare_cifar10(generate=False).root)")
    if full:
        probe = "import torch, jupyterlab, jupyterhub.singleuser; " + probe
    kwargs = {}
    if os.geteuid() == 0:
        import pwd
        entry = pwd.getpwnam(user)
        from .accounts import demote
        kwargs["preexec_fn"] = demote(entry.pw_uid, entry.pw_gid)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", **(env_extra or {})}
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, env=env, cwd="/",
                          timeout=300, **kwargs)
    if done.returncode != 0:
        raise HubError(f"the learners' environment does not run as {user!r}: {done.stderr.strip()[-800:]}")


def build(shared: Path, venv: Path, *, grader_group: str | None = None, say=print) -> LearnerEnv:
    """The learners' environment, course snapshot and data under `shared`, (re)built as needed."""
    venv = venv.absolute()
    if not (venv / "bin" / "python").exists():
        raise HubError(f"there is no course environment at {venv}: run `make venv` first")
    version = _venv_version(venv)
    python = base_python(venv, version)
    shared.mkdir(parents=True, exist_ok=True)
    os.chmod(shared, 0o755)
    for folder in shared.parents:
        if not folder.stat().st_mode & 0o001:
            raise HubError(f"HUB_SHARED={shared} is inside {folder}, which other users cannot enter (mode "
                           f"{folder.stat().st_mode & 0o777:o}): choose a folder every learner can reach, e.g. "
                           "HUB_SHARED=/srv/feed-the-gpu")
    course, env_dir = shared / "course", shared / "env"
    t0 = time.monotonic()
    snapshot_course(course, grader_group=grader_group)
    stamp = env_dir / ".feed-the-gpu-env.json"
    key = _key(venv, python)
    how = None
    try:
        built = json.loads(stamp.read_text())
        if built.get("key") == key:
            how = built.get("how")
    except (OSError, ValueError):
        pass
    fresh = how is None
    if fresh:
        say(f"building the learners' Python environment in {env_dir} from {python} and the course's packages ...")
        how = _build_env(venv, python, version, env_dir, course, say)
        fixed = _no_writable_by_others(env_dir)
        if fixed:
            say(f"  {fixed} file(s) of the course's environment were writable by other users: no longer")
        os.chmod(env_dir, 0o755)
        stamp.write_text(json.dumps({"key": key, "how": how, "python": str(python), "built": time.time()}))
        os.chmod(stamp, 0o644)
    learner_python = env_dir / "bin" / "python"
    data = prepare_data(shared / "data" / "cifar", learner_python, say)
    os.chmod(shared / "data", 0o755)
    verify(learner_python, {"COURSE_DATA": str(data)}, full=fresh)
    say(f"learners' environment ready in {time.monotonic() - t0:.0f} s ({how} of the course's packages, "
        f"Python {python})")
    return LearnerEnv(python=learner_python, course=course, data=data, how=how)
