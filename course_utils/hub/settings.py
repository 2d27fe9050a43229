"""What the instructor sets for `make hub`, read from the environment, and the hub's secrets.

    HUB_LEARNERS   the learners: comma-separated names (`alice,bob`) or a file with one name a line
    HUB_ADMIN      the instructor's account, the hub's admin (default: none)
    HUB_PASSWORD   the workshop's shared password for the learners (8+ characters; generated and
                   printed once when unset, then kept in the state folder)
    HUB_ADMIN_PASSWORD  the admin's password (32+ characters, as JupyterHub asks; generated when
                   unset and kept in the state folder, never printed)
    HUB_PASSWORDS=each  a password per learner instead (generated once, printed, kept in the state
                   folder): with a shared one, anyone who has it can log in as any learner
    HUB_PORT       the port the room connects to (8000); HUB_IP the address (127.0.0.1: this
                   machine only; 0.0.0.0 opens it to the room)
    HUB_STATE      the hub's state: database, cookie secret, passwords, plan (.hub/ in the course)
    HUB_SHARED     the learners' read-only environment and data (/srv/feed-the-gpu)
    HUB_MEMORY     each learner's memory cap (8G, 512M; `none`): default 90% of RAM shared out
    HUB_SINGLE_USER=1  run without root: every learner's server as you, NOT isolated
"""
from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["HubError", "Settings", "read_learners", "from_env", "parse_memory", "passwords", "learner_passwords",
           "ROOT", "MIN_PASSWORD", "MIN_ADMIN_PASSWORD"]

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"^[a-z][a-z0-9_-]{0,30}$")
MIN_PASSWORD, MIN_ADMIN_PASSWORD = 8, 32      # what JupyterHub's SharedPasswordAuthenticator asks


class HubError(Exception):
    """Something the instructor must fix before the hub can start: one sentence that says what."""


@dataclass
class Settings:
    learners: list[str]
    admin: str | None = None
    port: int = 8000
    ip: str = "127.0.0.1"
    state: Path = ROOT / ".hub"
    shared: Path = Path("/srv/feed-the-gpu")
    memory_bytes: int | None = None      # None: 90% of RAM shared out; 0: no cap
    single_user: bool = False
    grader_user: str = "ftg-grader"
    each_password: bool = False          # HUB_PASSWORDS=each: a password per learner
    extra: dict = field(default_factory=dict)

    @property
    def accounts(self) -> list[str]:
        """Every account the hub serves: the learners, then the admin."""
        return self.learners + ([self.admin] if self.admin and self.admin not in self.learners else [])


def _check_name(name: str, what: str) -> str:
    if not NAME.match(name):
        raise HubError(f"{what} {name!r} cannot be a login name: use lower-case letters, digits, '-' and '_', "
                       "starting with a letter, at most 31 characters")
    return name


def read_learners(value: str) -> list[str]:
    """The learners named by HUB_LEARNERS: a file with one name a line (blank lines and # comments
    skipped), or names separated by commas or spaces. Each is a login name; duplicates are dropped."""
    value = (value or "").strip()
    if not value:
        raise HubError("HUB_LEARNERS names no learner: give their names, e.g. HUB_LEARNERS=alice,bob, or a file "
                       "with one name a line (HUB_LEARNERS=class.txt)")
    path = Path(value).expanduser()
    if path.is_file():
        text = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
    elif "/" in value or value.endswith(".txt"):
        raise HubError(f"HUB_LEARNERS={value!r} looks like a file, but there is no such file")
    else:
        text = value
    names = []
    for raw in re.split(r"[,\s]+", text):
        if raw and raw.lower() not in names:
            names.append(_check_name(raw.lower(), "the learner"))
    if not names:
        raise HubError(f"HUB_LEARNERS ({value}) names no learner")
    return names


def parse_memory(value: str | None) -> int | None:
    """'8G' / '8GiB' / '512M' / '2048' (MiB) -> bytes; 'none' or '0' -> 0 (no cap); unset -> None (default)."""
    if value is None or not value.strip():
        return None
    text = value.strip().lower().removesuffix("b").removesuffix("i")
    if text in ("none", "0", "off", "no"):
        return 0
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    number, unit = (text[:-1], text[-1]) if text[-1] in units else (text, "m")
    try:
        size = float(number) * units[unit]
    except ValueError:
        raise HubError(f"HUB_MEMORY={value!r}: give a size such as 8G or 512M, or `none`") from None
    if size < 256 * 2**20:
        raise HubError(f"HUB_MEMORY={value!r}: less than 256 MiB cannot hold a lesson's kernel")
    return int(size)


def from_env(environ=None) -> Settings:
    """The hub's settings from the environment (see the module's docstring)."""
    env = os.environ if environ is None else environ
    learners = read_learners(env.get("HUB_LEARNERS", ""))
    admin = env.get("HUB_ADMIN", "").strip().lower() or None
    if admin is not None:
        _check_name(admin, "HUB_ADMIN")
        if admin in learners:
            raise HubError(f"HUB_ADMIN={admin} is also one of HUB_LEARNERS: the instructor needs an account of their own")
    try:
        port = int(env.get("HUB_PORT", "8000"))
        assert 1 <= port <= 65535
    except (ValueError, AssertionError):
        raise HubError(f"HUB_PORT={env.get('HUB_PORT')!r} is not a port number (1-65535)") from None
    state = Path(env.get("HUB_STATE") or ROOT / ".hub").expanduser().absolute()
    single = env.get("HUB_SINGLE_USER", "").strip().lower() in ("1", "true", "yes", "on")
    shared = Path(env.get("HUB_SHARED") or (state / "shared" if single else "/srv/feed-the-gpu")).expanduser().absolute()
    grader = env.get("HUB_GRADER_USER", "ftg-grader").strip()
    _check_name(grader, "HUB_GRADER_USER")
    each = env.get("HUB_PASSWORDS", "").strip().lower()
    if each not in ("", "shared", "each"):
        raise HubError(f"HUB_PASSWORDS={each!r}: leave it unset (one password for the workshop) or set it to `each` "
                       "(a password per learner)")
    return Settings(learners=learners, admin=admin, port=port, ip=env.get("HUB_IP", "127.0.0.1").strip() or "127.0.0.1",
                    state=state, shared=shared, memory_bytes=parse_memory(env.get("HUB_MEMORY")), single_user=single,
                    grader_user=grader, each_password=each == "each")


def passwords(state: Path, environ=None) -> tuple[str, str, bool]:
    """(learners' password, admin's password, whether the learners' one was generated just now).

    HUB_PASSWORD and HUB_ADMIN_PASSWORD win when set; otherwise the ones generated for this state
    folder the first time (state/passwords.json, readable by root only) are kept, so that a
    restarted hub takes the password the room was given."""
    env = os.environ if environ is None else environ
    path = state / "passwords.json"
    stored = {}
    if path.exists():
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            stored = {}
    learners = env.get("HUB_PASSWORD") or stored.get("learners")
    generated = not learners
    if generated:
        learners = secrets.token_urlsafe(9)              # 12 characters that survive being read out
    admin = env.get("HUB_ADMIN_PASSWORD") or stored.get("admin") or secrets.token_urlsafe(33)
    if len(learners) < MIN_PASSWORD:
        raise HubError(f"HUB_PASSWORD has {len(learners)} characters: JupyterHub asks at least {MIN_PASSWORD}")
    if len(admin) < MIN_ADMIN_PASSWORD:
        raise HubError(f"HUB_ADMIN_PASSWORD has {len(admin)} characters: JupyterHub asks at least {MIN_ADMIN_PASSWORD}")
    if admin == learners:
        raise HubError("HUB_ADMIN_PASSWORD and HUB_PASSWORD must differ")
    keep = {"learners": learners if not env.get("HUB_PASSWORD") else stored.get("learners"),
            "admin": admin if not env.get("HUB_ADMIN_PASSWORD") else stored.get("admin")}
    keep = {k: v for k, v in keep.items() if v}
    if keep != stored:
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(keep, f)
    return learners, admin, generated


def learner_passwords(state: Path, learners: list[str]) -> tuple[dict[str, str], list[str]]:
    """HUB_PASSWORDS=each: every learner's own password, generated once per learner and kept in
    state/learner-passwords.json (root only). Returns (all of them, the learners given one just now)."""
    path = state / "learner-passwords.json"
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        stored = {}
    new = [name for name in learners if name not in stored]
    for name in new:
        stored[name] = secrets.token_urlsafe(9)
    if new:
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(stored, f)
    return {name: stored[name] for name in learners}, new
