"""`make hub`: the workshop's JupyterHub (`python -m course_utils.hub [--clean]`).

1. reads the settings (`settings`: HUB_LEARNERS, HUB_ADMIN, HUB_PASSWORD, HUB_PORT, HUB_IP ...);
   without root it refuses unless HUB_SINGLE_USER=1, because learners would not be isolated;
2. as root: an account per learner and for the admin (`accounts`), a system account for the
   grader (`make collect`), the learners' environment, the course's snapshot and data in
   HUB_SHARED (`learner_env`);
3. shares out the cores, memory and GPUs (`resources`) and writes the plan (state/plan.json);
4. starts JupyterHub (6.x, with configurable-http-proxy from npm) on HUB_IP:HUB_PORT, prints the
   address and, when it was generated, the password;
5. on Ctrl-C or SIGTERM stops the hub, which stops every learner's server and the proxy, then
   ends whatever they left behind (`procs`) and removes the memory cgroups.

`--clean` (make hub-clean) removes the state folder: the database, cookie secret, passwords and
plan. It leaves the learners' accounts and homes (their work) and HUB_SHARED.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .settings import ROOT, HubError, Settings, from_env, learner_passwords, passwords

__all__ = ["main", "proxy_command", "plan", "clean", "NOT_ROOT"]

PROXY = ROOT / ".venv" / "hub-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
NOT_ROOT = ("`make hub` runs as root on a workshop server: each learner gets an account of their own, so that no "
            "learner's code can read another's work. Without root every learner's server would run as you, and "
            "the learners would NOT be isolated from each other (any of them could read or change the others' "
            "notebooks). Run it as root (sudo make hub ...), or, for a rehearsal on your own machine, start it "
            "anyway with HUB_SINGLE_USER=1.")


def _say(text: str) -> None:
    print(text, flush=True)


def _die_with_parent() -> None:
    """In the hub's process, before it starts (Linux): SIGTERM it when `make hub`'s process dies, even by
    SIGKILL, which no handler sees (a hub left behind once held its port and spun its proxy for an hour).
    The hub's own SIGTERM handling then stops every learner's server and the proxy."""
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def proxy_command() -> str:
    """configurable-http-proxy: HUB_PROXY when set, else as `make hub-deps` installed it (npm, into
    .venv/hub-proxy), else one on PATH (`npm install -g`)."""
    proxy = os.environ.get("HUB_PROXY") or (str(PROXY) if PROXY.exists() else shutil.which("configurable-http-proxy"))
    if not proxy or not os.access(proxy, os.X_OK):
        raise HubError(f"configurable-http-proxy is not installed ({proxy or PROXY}): `make hub-deps` installs it "
                       "with npm (Node.js 20 or newer)")
    node = shutil.which("node")
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip() if node else ""
    if not version or int(version.lstrip("v").split(".")[0]) < 20:
        raise HubError(f"configurable-http-proxy 5 needs Node.js 20 or newer (found {version or 'none'}): install "
                       "it (Debian 13's nodejs, or NodeSource's for Debian 12)")
    return proxy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


def _usable_core_list() -> list[int]:
    from course_utils.env import usable_cores
    try:
        mask = sorted(os.sched_getaffinity(0))
    except AttributeError:
        mask = list(range(os.cpu_count() or 1))
    return mask[:max(1, min(len(mask), usable_cores()))]


def plan(settings: Settings, hub_id: str, *, python: str, course: str, data: str, notebooks: str,
         proxy: str, cap=None) -> dict:
    """What the hub's configuration and spawner read: ports, paths, and each learner's seat."""
    from .resources import assign_gpus, default_memory, gpu_list, split_cores
    cores = _usable_core_list()
    gpus = gpu_list()
    split = split_cores(cores, settings.learners)
    gpu_of = assign_gpus(gpus, settings.learners)
    memory = settings.memory_bytes if settings.memory_bytes is not None else default_memory(len(settings.learners))
    seats = {}
    for name in settings.learners:
        seat = {"cores": split[name], "gpu": gpu_of[name], "memory_bytes": memory if cap and memory else None,
                "cgroup": str(cap.add(name, memory)) if cap and memory else None}
        seats[name] = seat
    return {
        "hub_id": hub_id, "ip": settings.ip, "port": settings.port, "hub_port": _free_port(),
        "proxy_api_port": _free_port(), "proxy": proxy, "state": str(settings.state),
        "learners": settings.learners, "admin": settings.admin, "single_user": settings.single_user,
        "python": python, "course": course, "data": data, "notebooks": notebooks, "shared": str(settings.shared),
        "seats": seats, "admin_seat": {"cores": cores, "gpu": ",".join(gpus), "cgroup": None},
        "gpus": gpus, "cores": cores, "memory_cgroups": str(cap.base) if cap else None,
        "memory_version": cap.version if cap else None, "grader_user": settings.grader_user,
    }


def _describe(p: dict, learner_password: str, generated: bool, created: list[str],
              each: dict | None = None, new: list[str] = ()) -> str:
    shared_cores = len(set(c for s in p["seats"].values() for c in s["cores"])) < sum(
        len(s["cores"]) for s in p["seats"].values())
    lines = ["", "Feed the GPU: the workshop hub", ""]
    where = "this machine only; HUB_IP=0.0.0.0 opens it to the room" if p["ip"] in ("127.0.0.1", "localhost") \
        else "open to the room"
    host = p["ip"] if p["ip"] not in ("0.0.0.0", "") else socket.gethostname()
    lines.append(f"  address    http://{host}:{p['port']}/   ({where})")
    lines.append(f"  learners   {', '.join(p['learners'])} ({len(p['learners'])}), each logs in with their name")
    if each is not None:
        lines.append(f"  passwords  one per learner (HUB_PASSWORDS=each), kept in {p['state']}/learner-passwords.json"
                     + ("; the new ones, shown once:" if new else ""))
        lines += [f"               {name:<12s} {each[name]}" for name in new]
    elif generated:
        lines.append(f"  password   {learner_password}   (generated now, shown once; kept in {p['state']}/passwords.json)")
    else:
        lines.append(f"  password   the workshop's (HUB_PASSWORD, or the one shown when this hub first started: "
                     f"{p['state']}/passwords.json)")
    if p.get("admin"):
        lines.append(f"  admin      {p['admin']} (password in {p['state']}/passwords.json)")
    if created:
        lines.append(f"  accounts   created now: {', '.join(created)}")
    lines.append("")
    for name, seat in p["seats"].items():
        cores = seat["cores"]
        text = f"cores {','.join(map(str, cores))}" + (" (shared)" if shared_cores else "")
        text += f", memory cap {seat['memory_bytes'] / 2**30:.1f} GiB" if seat.get("memory_bytes") else ", no memory cap"
        text += f", GPU {seat['gpu']}" if seat["gpu"] else ", no GPU: the simulated device"
        lines.append(f"  {name:<10s} {text}")
    if not p.get("memory_cgroups") and not p["single_user"]:
        lines.append("  (no memory cap: this machine lets the hub create no cgroup of its own)")
    if shared_cores:
        lines.append(f"  ({len(p['learners'])} learners share {len(p['cores'])} cores: speed-graded checks will often "
                     "find the machine busy and be graded later)")
    if p["single_user"]:
        lines.append("  HUB_SINGLE_USER=1: every learner's server runs as you; the learners are NOT isolated")
    lines.append("\n  Ctrl-C stops the hub and every learner's server.\n")
    return "\n".join(lines)


def clean(settings: Settings) -> int:
    """make hub-clean: remove the state folder (refused while its hub runs)."""
    pid_file = settings.state / "jupyterhub.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text().strip()), 0)
            _say(f"the hub of {settings.state} is running (pid {pid_file.read_text().strip()}): stop it first (Ctrl-C)")
            return 2
        except (OSError, ValueError):
            pass
    if settings.state.exists():
        shutil.rmtree(settings.state)
        _say(f"removed the hub's state: {settings.state} (database, cookie secret, passwords, plan)")
    else:
        _say(f"no hub state at {settings.state}")
    _say(f"kept: the learners' accounts and homes (their work; `userdel --remove NAME` removes one) and "
         f"{settings.shared} (the learners' environment and data; remove it with rm -rf)")
    return 0


def _prepare(settings: Settings, hub_id: str) -> tuple[dict, list[str], list[int]]:
    """Accounts, environment, seats: (plan, accounts created now, their uids)."""
    from .resources import MemoryCap
    proxy = proxy_command()
    created, uids = [], []
    if settings.single_user:
        from course_utils.data import prepare_cifar10
        data = str(prepare_cifar10().root)
        python, course, notebooks = sys.executable, str(ROOT), str(ROOT / "notebooks")
        cap = None
    else:
        from . import accounts, learner_env
        accounts.ensure_user(settings.grader_user, system=True)
        for name in settings.accounts:
            entry, made = accounts.ensure_user(name)
            if made:
                created.append(name)
                uids.append(entry.pw_uid)
        env = learner_env.build(settings.shared, ROOT / ".venv", grader_group=settings.grader_user, say=_say)
        python, course, data, notebooks = str(env.python), str(env.course), str(env.data), str(env.notebooks)
        cap = MemoryCap.create(hub_id)
    p = plan(settings, hub_id, python=python, course=course, data=data, notebooks=notebooks, proxy=proxy, cap=cap)
    known = {}
    accounts_file = settings.state / "accounts.json"
    if accounts_file.exists():
        known = json.loads(accounts_file.read_text())
    known["created"] = sorted(set(known.get("created", [])) | set(created))
    accounts_file.write_text(json.dumps(known))
    return p, created, uids


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def _created_uids(settings: Settings) -> list[int]:
    import pwd
    try:
        names = json.loads((settings.state / "accounts.json").read_text()).get("created", [])
    except (OSError, ValueError):
        return []
    out = []
    for name in names:
        try:
            out.append(pwd.getpwnam(name).pw_uid)
        except KeyError:
            continue
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.hub", description=__doc__.split("\n")[0])
    parser.add_argument("--clean", action="store_true", help="remove the hub's state folder (make hub-clean)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the hub to answer")
    args = parser.parse_args(argv)
    try:
        settings = from_env()
        if args.clean:
            return clean(settings)
        root = os.geteuid() == 0
        if not root and not settings.single_user:
            raise HubError(NOT_ROOT)
        if root and settings.single_user:
            raise HubError("HUB_SINGLE_USER=1 as root would run every learner's server as root: leave it unset "
                           "(as root each learner gets an account of their own)")
        if not _port_free(settings.ip, settings.port):
            raise HubError(f"port {settings.port} on {settings.ip} is already in use (another hub, or `make lab`?): "
                           f"start it on another one, e.g. make hub HUB_PORT={settings.port + 1}")
        settings.state.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(settings.state, 0o700)
        learner_password, admin_password, generated = passwords(settings.state)
        each, new = learner_passwords(settings.state, settings.learners) if settings.each_password else (None, [])
        hub_id = secrets.token_hex(4)
        p, created, _ = _prepare(settings, hub_id)
    except HubError as exc:
        print(f"\nmake hub: {exc}\n", file=sys.stderr)
        return 2
    plan_file = settings.state / "plan.json"
    fd = os.open(plan_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(p, f, indent=1)
    env = dict(os.environ, COURSE_HUB_PLAN=str(plan_file), COURSE_HUB_PASSWORD=learner_password,
               COURSE_HUB_ADMIN_PASSWORD=admin_password, PYTHONUNBUFFERED="1")
    if each is not None:
        env["COURSE_HUB_LEARNER_PASSWORDS"] = json.dumps(each)
    from .procs import MARK, sweep
    env[MARK] = f"{hub_id}/:hub"
    config = Path(__file__).with_name("jupyterhub_config.py")
    hub = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)], env=env, cwd=str(settings.state),
                           start_new_session=True, preexec_fn=_die_with_parent)
    stopping: list[int] = []

    def forward(signum, frame):
        stopping.append(signum)
        try:
            hub.send_signal(signal.SIGTERM if signum == signal.SIGTERM else signal.SIGINT)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    code = 0
    try:
        deadline = time.monotonic() + args.timeout
        url = f"http://127.0.0.1:{p['port']}/hub/api" if p["ip"] in ("0.0.0.0", "127.0.0.1", "") else \
            f"http://{p['ip']}:{p['port']}/hub/api"
        while not _answers(url) and hub.poll() is None and not stopping:
            if time.monotonic() > deadline:
                _say(f"the hub did not answer within {args.timeout:.0f} s; stopping it")
                hub.send_signal(signal.SIGTERM)
                break
            time.sleep(0.3)
        if hub.poll() is None and not stopping:
            _say(_describe(p, learner_password, generated, created, each, new))
            _say(f"  Feed the GPU workshop hub open at http://{p['ip']}:{p['port']}/\n")
        while True:
            try:
                code = hub.wait(timeout=None if not stopping else 60)
                break
            except subprocess.TimeoutExpired:
                _say("the hub did not stop within 60 s of the signal: killing it")
                hub.kill()
    finally:
        if hub.poll() is None:
            hub.kill()
            hub.wait()
        cgroup_pids = []
        if p.get("memory_cgroups"):
            from .resources import MemoryCap
            cap = MemoryCap(Path(p["memory_cgroups"]), p["memory_version"])
            cgroup_pids = cap.pids()
        ended = sweep(f"{hub_id}/", pids=cgroup_pids, uids=_created_uids(settings) if not settings.single_user else ())
        if p.get("memory_cgroups"):
            left = MemoryCap(Path(p["memory_cgroups"]), p["memory_version"]).remove()
            if left:
                _say(f"the memory cgroups of {', '.join(left)} still hold processes: {p['memory_cgroups']}")
        for s, handler in previous.items():
            signal.signal(s, handler)
        _say(f"the hub stopped" + (f"; ended {len(ended)} process(es) its servers left running" if ended else
                                    "; no process of its servers left running"))
    return 0 if stopping else code
