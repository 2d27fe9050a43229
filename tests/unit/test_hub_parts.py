"""The workshop hub's parts, one at a time (course_utils.hub; tests/hub/test_hub.py runs the whole room).

Settings from the environment, passwords kept for a state folder, cores and GPUs shared out
(`nvidia-smi -L` as a MIG machine prints it), a real memory cgroup where the machine lets root
make one, the learner's copy made once, a notebook collected only when it is the learner's own,
the learners' Python, and `make hub` refusing to start without root unless told.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils.hub import collect, resources, run, settings
from course_utils.hub.accounts import COURSE_FOLDER, ensure_copy
from course_utils.hub.settings import HubError

ROOT = Path(__file__).resolve().parents[2]


# -- settings --------------------------------------------------------------------------------------

def test_learners_from_names_or_a_file(tmp_path):
    assert settings.read_learners("alice,Bob, carol  dave,alice") == ["alice", "bob", "carol", "dave"]
    roster = tmp_path / "class.txt"
    roster.write_text("# workshop of 2026-12-01\nalice\n\nbob   # late\n")
    assert settings.read_learners(str(roster)) == ["alice", "bob"]
    for bad, words in (("", "names no learner"), ("al ice!", "cannot be a login name"), ("9lives", "starting with"),
                       ("x" * 40, "at most 31"), ("missing/class.txt", "no such file")):
        with pytest.raises(HubError, match=words):
            settings.read_learners(bad)


def test_settings_from_the_environment(tmp_path):
    s = settings.from_env({"HUB_LEARNERS": "alice,bob", "HUB_ADMIN": "teacher", "HUB_PORT": "8123",
                           "HUB_IP": "0.0.0.0", "HUB_STATE": str(tmp_path / "st"), "HUB_MEMORY": "6G"})
    assert (s.learners, s.admin, s.port, s.ip, s.memory_bytes) == (["alice", "bob"], "teacher", 8123, "0.0.0.0", 6 * 2**30)
    assert s.accounts == ["alice", "bob", "teacher"] and s.state == tmp_path / "st"
    assert s.shared == Path("/srv/feed-the-gpu") and not s.single_user
    single = settings.from_env({"HUB_LEARNERS": "a1", "HUB_SINGLE_USER": "1", "HUB_STATE": str(tmp_path)})
    assert single.single_user and single.shared == tmp_path / "shared" and single.port == 8000 and single.ip == "127.0.0.1"
    with pytest.raises(HubError, match="also one of HUB_LEARNERS"):
        settings.from_env({"HUB_LEARNERS": "alice", "HUB_ADMIN": "alice"})
    with pytest.raises(HubError, match="not a port"):
        settings.from_env({"HUB_LEARNERS": "alice", "HUB_PORT": "99999"})


@pytest.mark.parametrize("text, size", [("8G", 8 * 2**30), ("8GiB", 8 * 2**30), ("512M", 512 * 2**20),
                                        ("2048", 2048 * 2**20), ("none", 0), ("0", 0), (None, None), ("", None)])
def test_memory_sizes(text, size):
    assert settings.parse_memory(text) == size


def test_memory_sizes_refused():
    for bad in ("lots", "100M"):
        with pytest.raises(HubError):
            settings.parse_memory(bad)


def test_passwords_are_generated_once_and_kept(tmp_path):
    learners, admin, generated = settings.passwords(tmp_path, {})
    assert generated and len(learners) >= settings.MIN_PASSWORD and len(admin) >= settings.MIN_ADMIN_PASSWORD
    assert oct((tmp_path / "passwords.json").stat().st_mode & 0o777) == "0o600"
    again = settings.passwords(tmp_path, {})
    assert again == (learners, admin, False)          # a restarted hub keeps the password the room was given
    assert settings.passwords(tmp_path, {"HUB_PASSWORD": "workshop-2026"})[:2] == ("workshop-2026", admin)
    assert json.loads((tmp_path / "passwords.json").read_text())["learners"] == learners   # never the instructor's own
    for env, words in (({"HUB_PASSWORD": "short"}, "at least 8"), ({"HUB_ADMIN_PASSWORD": "x" * 10}, "at least 32"),
                       ({"HUB_PASSWORD": "y" * 40, "HUB_ADMIN_PASSWORD": "y" * 40}, "must differ")):
        with pytest.raises(HubError, match=words):
            settings.passwords(tmp_path, env)


# -- resources -------------------------------------------------------------------------------------

def test_cores_are_split_in_blocks_or_shared_round_robin():
    assert resources.split_cores(list(range(16)), ["a", "b", "c"]) == \
        {"a": [0, 1, 2, 3, 4], "b": [5, 6, 7, 8, 9], "c": [10, 11, 12, 13, 14]}
    assert resources.split_cores([0, 1], ["a", "b"]) == {"a": [0], "b": [1]}
    assert resources.split_cores([4, 5], ["a", "b", "c"]) == {"a": [4], "b": [5], "c": [4]}
    blocks = resources.split_cores(list(range(64)), [f"l{i}" for i in range(8)])
    assert all(len(v) == 8 for v in blocks.values()) and len({c for v in blocks.values() for c in v}) == 64


NVIDIA_SMI_MIG = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5c1e9f0a-1111-2222-3333-444455556666)
  MIG 3g.20gb     Device  0: (UUID: MIG-aaaaaaaa-1111-2222-3333-444455556666)
  MIG 3g.20gb     Device  1: (UUID: MIG-bbbbbbbb-1111-2222-3333-444455556666)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-77777777-1111-2222-3333-444455556666)
GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-88888888-1111-2222-3333-444455556666)
"""


def test_gpus_by_uuid_with_mig_instances_in_place_of_their_gpu():
    assert resources.parse_nvidia_smi(NVIDIA_SMI_MIG) == [
        "MIG-aaaaaaaa-1111-2222-3333-444455556666", "MIG-bbbbbbbb-1111-2222-3333-444455556666",
        "GPU-77777777-1111-2222-3333-444455556666", "GPU-88888888-1111-2222-3333-444455556666"]
    assert resources.parse_nvidia_smi("No devices were found\n") == []


def test_gpus_from_cuda_visible_devices_round_robin():
    assert resources.gpu_list({"CUDA_VISIBLE_DEVICES": "0, 2,MIG-x"}) == ["0", "2", "MIG-x"]
    for none in ("", "-1", "none"):
        assert resources.gpu_list({"CUDA_VISIBLE_DEVICES": none}) == []
    assert resources.gpu_list({}, nvidia_smi="no-such-nvidia-smi") == []
    assert resources.assign_gpus(["0", "1"], ["a", "b", "c"]) == {"a": "0", "b": "1", "c": "0"}
    assert resources.assign_gpus([], ["a", "b"]) == {"a": "", "b": ""}    # the simulated device


def test_default_memory_shares_out_ninety_percent():
    assert resources.default_memory(4, total=40 * 2**30) == 9 * 2**30


def test_a_real_memory_cgroup_caps_a_learner():
    """As root where the machine lets us make a cgroup: a process in a learner's cgroup capped at
    200 MiB is killed when it takes 400 MiB; the folders go once empty."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    cap = resources.MemoryCap.create(f"test-{os.getpid()}")
    if cap is None:
        pytest.skip("this machine lets the hub make no memory cgroup (make hub says: no memory cap)")
    try:
        folder = cap.add("alice", 200 * 2**20)
        code = ("import sys; from course_utils.hub.resources import MemoryCap; MemoryCap.join(sys.argv[1]); "
                "small = bytearray(50 * 2**20); print('small ok', flush=True); big = bytearray(400 * 2**20); print('big ok')")
        out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=120)
        assert "small ok" in out.stdout and "big ok" not in out.stdout and out.returncode != 0, (out.returncode, out.stdout)
        assert cap.pids("alice") == []
    finally:
        assert cap.remove() == []
    assert not cap.base.exists()


# -- the learner's copy, and collecting it ---------------------------------------------------------

def test_the_copy_is_made_once_and_never_overwritten(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert ensure_copy(home, ROOT / "notebooks", python=sys.executable)
    copy = home / COURSE_FOLDER
    assert sorted(p.name for p in copy.glob("*.ipynb")) == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert (copy / "scripts").is_dir() and oct(copy.stat().st_mode & 0o777) == "0o700"
    (copy / "00-welcome-and-setup.ipynb").write_text("my work")
    assert not ensure_copy(home, ROOT / "notebooks", python=sys.executable)
    assert (copy / "00-welcome-and-setup.ipynb").read_text() == "my work"


def test_a_notebook_is_collected_only_when_it_is_the_learners_own(tmp_path):
    name = collect.released_name("2")
    assert name.startswith("02-") and collect.released_name("02") == name
    home = tmp_path / "home"
    (home / COURSE_FOLDER).mkdir(parents=True)
    with pytest.raises(FileNotFoundError):
        collect.read_own_notebook(str(home), name, None)
    (tmp_path / "secret").write_text("not theirs")
    (home / COURSE_FOLDER / name).symlink_to(tmp_path / "secret")
    with pytest.raises(PermissionError, match="is a link"):
        collect.read_own_notebook(str(home), name, None)
    (home / COURSE_FOLDER / name).unlink()
    (home / COURSE_FOLDER / name).write_text("{}")
    assert collect.read_own_notebook(str(home), name, os.getuid()) == b"{}"
    with pytest.raises(PermissionError, match="belongs to uid"):
        collect.read_own_notebook(str(home), name, os.getuid() + 4242)
    other = tmp_path / "other-home"
    (other / COURSE_FOLDER).mkdir(parents=True)
    elsewhere = tmp_path / "home2"
    elsewhere.mkdir()
    (elsewhere / COURSE_FOLDER).symlink_to(other / COURSE_FOLDER)      # a folder linked to another learner's
    with pytest.raises(PermissionError, match="is a link or a file"):
        collect.read_own_notebook(str(elsewhere), name, None)
    with pytest.raises(HubError):
        collect.released_name("99")


# -- the learners' Python and refusing to start ----------------------------------------------------

def test_what_other_users_can_run(tmp_path):
    assert run is not None
    from course_utils.hub.learner_env import others_can_run
    assert others_can_run(Path("/usr/bin/env"))
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    tool = private / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    os.chmod(private, 0o700)
    assert not others_can_run(tool)                   # as under /root: the folder keeps everyone else out


def test_without_root_the_hub_refuses_unless_told(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HUB_LEARNERS", "alice,bob")
    monkeypatch.setenv("HUB_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("HUB_PORT", "18765")
    monkeypatch.delenv("HUB_SINGLE_USER", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert run.main([]) == 2
    err = capsys.readouterr().err
    assert "NOT be isolated" in err and "HUB_SINGLE_USER=1" in err
    monkeypatch.setenv("HUB_SINGLE_USER", "1")            # told: it goes on to prepare the hub

    def prepared(settings, hub_id):
        raise HubError("prepared (stopped here by the test)")
    monkeypatch.setattr(run, "_prepare", prepared)
    assert run.main([]) == 2 and "prepared (stopped here by the test)" in capsys.readouterr().err
    monkeypatch.setattr(os, "geteuid", lambda: 0)           # as root it refuses the single-user mode
    assert run.main([]) == 2 and "would run every learner's server as root" in capsys.readouterr().err


def test_hub_clean_removes_the_state_only(tmp_path, monkeypatch, capsys):
    state = tmp_path / "state"
    state.mkdir()
    (state / "jupyterhub.sqlite").write_text("")
    monkeypatch.setenv("HUB_LEARNERS", "alice")
    monkeypatch.setenv("HUB_STATE", str(state))
    assert run.main(["--clean"]) == 0 and not state.exists()
    assert "kept: the learners' accounts and homes" in capsys.readouterr().out


# -- a password per learner (HUB_PASSWORDS=each) ---------------------------------------------------

def test_the_shared_password_opens_any_learners_account_a_password_each_does_not(tmp_path):
    """Why HUB_PASSWORDS=each exists: JupyterHub's SharedPasswordAuthenticator lets whoever has the
    workshop's password in as ANY learner; with a password each, alice's opens alice's account only."""
    import asyncio

    from jupyterhub.authenticators.shared import SharedPasswordAuthenticator

    from course_utils.hub.auth import LearnerPasswordAuthenticator
    admin_pw = "A" * 40
    shared = SharedPasswordAuthenticator(user_password="workshop-pw", admin_password=admin_pw, admin_users={"teacher"})
    assert asyncio.run(shared.authenticate(None, {"username": "bob", "password": "workshop-pw"}))["name"] == "bob"
    each, new = settings.learner_passwords(tmp_path, ["alice", "bob"])
    assert new == ["alice", "bob"] and each["alice"] != each["bob"]
    assert settings.learner_passwords(tmp_path, ["alice", "bob", "carol"])[1] == ["carol"]   # kept; carol's is new
    auth = LearnerPasswordAuthenticator(learner_passwords=each, admin_password=admin_pw, admin_users={"teacher"})

    def login(name, password):
        return asyncio.run(auth.authenticate(None, {"username": name, "password": password}))
    assert login("alice", each["alice"]) == {"name": "alice", "admin": False, "groups": []}
    assert login("bob", each["alice"]) is None                  # alice's password does not open bob's account
    assert login("alice", "workshop-pw") is None
    assert login("teacher", admin_pw)["admin"] is True
    assert login("teacher", each["alice"]) is None
    assert settings.from_env({"HUB_LEARNERS": "alice", "HUB_PASSWORDS": "each"}).each_password
    with pytest.raises(HubError, match="HUB_PASSWORDS"):
        settings.from_env({"HUB_LEARNERS": "alice", "HUB_PASSWORDS": "mine"})


def test_make_targets_and_pins():
    """`make hub`, `make collect` and `make hub-clean` run the course's modules; the hub's packages
    and its proxy are pinned (hub/requirements.txt, hub/proxy/package-lock.json)."""
    def dry(*args):
        return subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "-m course_utils.hub" in dry("hub")
    assert "-m course_utils.hub --clean" in dry("hub-clean")
    assert "-m course_utils.hub.collect --lesson 02 --submissions submissions --smoke" in dry("collect", "LESSON=02")
    reqs = [line.split("#")[0].strip() for line in (ROOT / "hub" / "requirements.txt").read_text().splitlines()]
    reqs = [r for r in reqs if r]
    assert reqs and all("==" in r for r in reqs) and any(r.startswith("jupyterhub==6.") for r in reqs)
    package = json.loads((ROOT / "hub" / "proxy" / "package.json").read_text())
    lock = json.loads((ROOT / "hub" / "proxy" / "package-lock.json").read_text())
    pinned = package["dependencies"]["configurable-http-proxy"]
    assert pinned[0].isdigit() and lock["packages"]["node_modules/configurable-http-proxy"]["version"] == pinned


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_hub_dies_with_make_hub_even_when_it_is_killed(tmp_path):
    """`make hub`'s process SIGKILLed (no handler runs): the hub it started gets SIGTERM, as its own
    Ctrl-C would give it, instead of living on with its port and proxy."""
    import signal
    import subprocess
    import time

    import psutil
    pid_file = tmp_path / "child"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time; from course_utils.hub.run import _die_with_parent; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True, "
        f"preexec_fn=_die_with_parent); open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(120)")])
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child = psutil.Process(int(pid_file.read_text()))
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        gone, alive = psutil.wait_procs([child], timeout=10)
        assert not alive, "the hub's process outlived make hub's"
    finally:
        parent.kill()
