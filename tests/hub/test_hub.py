"""`make hub` for real: a workshop of two learners on this machine, through a browser (issue 36).

As root (the normal case on a workshop server, and CI's), with Debian's Chromium driven by
Playwright as tests/browser/test_lab.py drives `make lab`:

1. `make hub` starts for three learners and an instructor (accounts made for the test), with a
   learners' environment and data built in a fresh shared folder; its output names the address
   and the generated password;
2. two learners log in at once (two browser contexts), each gets their own server with lesson 00
   open, runs it (Run All Cells: the check line `[TODO] Exercise 0.1` appears); one solves
   exercise 0.1 ([PASS]); both save;
3. isolation, from inside the first learner's kernel: the other learner's notebook, the released
   solutions and the shared environment are out of reach; the kernel runs as the learner, on the
   learner's own cores, in the learner's memory cgroup; the admin sees every learner, a learner
   does not;
4. `make collect LESSON=00`: both notebooks copied (the third learner, who never came, named and
   skipped) and graded as the grader's account: 1/1 and "not implemented";
5. SIGTERM to `make hub` (what a scheduler sends; Ctrl-C takes the same path): the hub stops, and no
   process of the hub's or of the learners' is left, nor their memory cgroups.

Skipped with a sentence when not root, without Chromium, Playwright or the hub's proxy (Node.js
20+, `make hub-deps`). Every wait has a deadline; the accounts and the state made here are removed
at the end; the learners' environment is kept for the next run (build/hub-test/shared, else
/var/tmp). Screenshots and logs go to build/hub-test/.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "hub-test"
LESSON = "00-welcome-and-setup.ipynb"
CHROMIUM_ARGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
PROXY = ROOT / ".venv" / "hub-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"

pytestmark = pytest.mark.browser


def _chromium() -> str | None:
    for candidate in (os.environ.get("COURSE_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def _skip_unless_ready():
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("the workshop hub makes an account per learner, which needs root (CI runs `make test` as root; "
                    "HUB_SINGLE_USER=1 rehearses it without isolation)")
    if _chromium() is None:
        message = "no Chromium found (looked for /usr/bin/chromium); `make browser-deps` installs Debian's chromium"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    try:
        import playwright  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is not installed (requirements.txt pins it)")
    if not PROXY.exists():
        pytest.skip("the hub's proxy is not installed (configurable-http-proxy needs Node.js 20+; `make hub-deps`)")
    if shutil.which("useradd") is None:
        pytest.skip("no useradd to make the learners' accounts")


def _others_can_enter(folder: Path) -> bool:
    return all(f.stat().st_mode & 0o001 for f in [folder, *folder.parents] if f.exists())


def _shared_folder() -> Path:
    """Where the learners' environment is built for the test: a folder every user can enter, on the
    .venv's filesystem (the environment is then hard links, made in a second), kept between runs
    (a second run reuses it; removing 45,000 links costs more than making them): build/hub-test/shared
    in the course when others can enter the course's folder, else /var/tmp or /tmp."""
    venv_dev = (ROOT / ".venv").stat().st_dev
    for folder in (OUT / "shared", Path("/var/tmp/feed-the-gpu-hub-test"), Path("/tmp/feed-the-gpu-hub-test")):
        parent = folder.parent
        parent.mkdir(parents=True, exist_ok=True)
        if _others_can_enter(parent) and parent.stat().st_dev == venv_dev:
            return folder
    pytest.skip("no folder that every user can enter on the filesystem of .venv (the course is inside a private "
                "folder such as /root, and /var/tmp and /tmp are other filesystems): the learners' environment "
                "would be a full copy of the course's packages (6 GB)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_group(proc, sig=signal.SIGTERM, wait=90) -> float:
    t0 = time.monotonic()
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return 0.0
    try:
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        raise AssertionError(f"`make hub` did not stop within {wait} s of the signal")
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def workshop():
    _skip_unless_ready()
    tag = uuid.uuid4().hex[:5]
    names = {"a": f"ftg{tag}a", "b": f"ftg{tag}b", "c": f"ftg{tag}c", "admin": f"ftg{tag}t", "grader": f"ftg{tag}g"}
    for name in names.values():
        assert subprocess.run(["id", name], capture_output=True).returncode != 0, f"{name} exists already"
    base = Path(tempfile.mkdtemp(prefix="feed-the-gpu-hub-test-"))      # the state, submissions, gradebook
    shared = _shared_folder()
    state = base / "state"
    port = _free_port()
    env = dict(os.environ, HUB_LEARNERS=f"{names['a']},{names['b']},{names['c']}", HUB_ADMIN=names["admin"],
               HUB_STATE=str(state), HUB_SHARED=str(shared), HUB_PORT=str(port), HUB_GRADER_USER=names["grader"],
               COURSE_SMOKE="1", PYTHONUNBUFFERED="1")
    for key in ("HUB_PASSWORD", "HUB_ADMIN_PASSWORD", "HUB_IP", "HUB_MEMORY", "HUB_SINGLE_USER", "CUDA_VISIBLE_DEVICES"):
        env.pop(key, None)
    OUT.mkdir(parents=True, exist_ok=True)
    log = open(OUT / "hub.log", "w+")
    t0 = time.monotonic()
    hub = subprocess.Popen(["make", "--no-print-directory", "hub"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=log, text=True, start_new_session=True)
    info = {"names": names, "port": port, "state": state, "shared": shared, "env": env, "proc": hub, "base": base}
    try:
        lines, deadline = [], time.monotonic() + 420
        while time.monotonic() < deadline and hub.poll() is None:
            line = hub.stdout.readline()
            lines.append(line)
            if "workshop hub open at" in line:
                break
        text = "".join(lines)
        if "workshop hub open at" not in text:
            log.seek(0)
            pytest.fail(f"`make hub` did not open within 420 s:\n{text[-3000:]}\n{log.read()[-3000:]}")
        info["started_s"] = time.monotonic() - t0
        info["output"] = text
        import threading              # keep reading what the hub prints, so that it never blocks on a full pipe

        def drain():
            try:
                for line in hub.stdout:
                    log.write(line)
            except ValueError:        # the log was closed: the test is over
                pass
        threading.Thread(target=drain, daemon=True).start()
        found = re.search(r"password\s+(\S+)\s+\(generated now", text)
        assert found, f"the generated password was not printed:\n{text}"
        info["password"] = found.group(1)
        info["plan"] = json.loads((state / "plan.json").read_text())
        yield info
    finally:
        if hub.poll() is None:           # a failed test: stop it as the room would (it cleans up after itself)
            try:
                _stop_group(hub, signal.SIGTERM, wait=60)
            except AssertionError:
                pass
        log.close()
        for name in names.values():
            for _ in range(20):          # userdel refuses an account that still runs a process
                if subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True).returncode != 0:
                    break
                time.sleep(0.25)
            subprocess.run(["userdel", "--remove", name], capture_output=True)
            subprocess.run(["groupdel", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(shared / "grading", ignore_errors=True)     # the grader's staging: this run's learners


def _login(browser, hub_url: str, name: str, password: str):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{hub_url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", password)
    page.click("#login_submit")
    return page


def _notebook(page, name: str):
    """Wait for `name` to be the current tab with an idle kernel; its panel."""
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current",
                       has=page.locator(".lm-TabBar-tabLabel", has_text=re.compile(f"^{re.escape(name)}$")))
    tab.wait_for(timeout=180_000)
    panel = page.locator(f"[id='{tab.get_attribute('data-id')}']")
    panel.locator(".jp-Cell").first.wait_for()
    indicator = panel.locator(".jp-Notebook-ExecutionIndicator")
    deadline, idle_since = time.monotonic() + 180, None     # idle, and still idle 3 s later: JupyterLab may
    while time.monotonic() < deadline:                      # replace the kernel it started first
        idle = indicator.get_attribute("data-status") == "idle"
        idle_since = (idle_since or time.monotonic()) if idle else None
        if idle_since and time.monotonic() - idle_since > 3:
            return panel
        time.sleep(0.25)
    raise AssertionError(f"the kernel of {name} was not idle within 180 s")


def _run_all(page, panel):
    panel.locator(".jp-Cell").first.click()
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()


def _wait_idle(page, timeout_ms=240_000):
    page.wait_for_function(
        """() => {
            const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
            const prompts = [...panel.querySelectorAll('.jp-InputPrompt')];
            const busy = prompts.some(p => p.textContent.includes('*'));
            const status = panel.querySelector('.jp-Notebook-ExecutionIndicator');
            return prompts.length > 0 && !busy && (!status || status.getAttribute('data-status') === 'idle');
        }""", timeout=timeout_ms)


def _type_into(page, cell, source: str):
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.press("Delete")
    page.keyboard.insert_text(source)


def _solution_source() -> str:
    nb = json.loads((ROOT / "solutions" / LESSON).read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code" and "def to_image" in "".join(c["source"]))
    return "".join(line for line in "".join(cell["source"]).splitlines(keepends=True) if "### " not in line)


PROBE = """import os
def probe(what, action):
    try:
        action()
        print("PROBE", what, "ALLOWED")
    except OSError as exc:
        print("PROBE", what, "denied", type(exc).__name__)
probe("read-other", lambda: open({other!r}).read())
probe("list-other", lambda: os.listdir({other_home!r}))
probe("write-env", lambda: open(os.path.join(os.environ["VIRTUAL_ENV"], "probe.txt"), "w"))
probe("read-solutions", lambda: os.listdir({solutions!r}))
probe("write-data", lambda: open(os.path.join(os.environ["COURSE_DATA"], "probe.bin"), "wb"))
from course_utils.env import usable_cores
print("PROBE cores", usable_cores(), "of", os.cpu_count())
print("PROBE whoami", os.getuid(), sorted(os.sched_getaffinity(0)), repr(os.environ["CUDA_VISIBLE_DEVICES"]))
"""


def _kernel_of(name: str):
    import psutil
    uid = pwd.getpwnam(name).pw_uid
    for proc in psutil.process_iter(["pid", "uids", "cmdline"]):
        if proc.info["uids"] and proc.info["uids"].real == uid and "ipykernel_launcher" in " ".join(proc.info["cmdline"] or []):
            return proc
    return None


def test_a_workshop_of_two_learners_through_a_browser(workshop):
    from playwright.sync_api import sync_playwright
    import requests

    started = time.monotonic()
    names, plan = workshop["names"], workshop["plan"]
    a, b, c = names["a"], names["b"], names["c"]
    hub_url = f"http://127.0.0.1:{workshop['port']}"
    assert plan["seats"][a]["cores"] != plan["seats"][b]["cores"] or len(plan["cores"]) < 2, plan["seats"]
    home_a, home_b = pwd.getpwnam(a).pw_dir, pwd.getpwnam(b).pw_dir

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), headless=True, args=CHROMIUM_ARGS)
        pages = []
        try:
            # 2. both learners log in at once: two servers start side by side
            page_a = _login(browser, hub_url, a, workshop["password"])
            page_b = _login(browser, hub_url, b, workshop["password"])
            pages += [("a", page_a), ("b", page_b)]
            panel_a, panel_b = _notebook(page_a, LESSON), _notebook(page_b, LESSON)
            assert f"/user/{a}/lab/tree/feed-the-gpu/{LESSON}" in page_a.url
            assert f"/user/{b}/lab/tree/feed-the-gpu/{LESSON}" in page_b.url
            logged_in_s = time.monotonic() - started
            for page, panel in ((page_a, panel_a), (page_b, panel_b)):
                _run_all(page, panel)
            for page, panel, who in ((page_a, panel_a, "a"), (page_b, panel_b, "b")):
                check = panel.locator(".jp-CodeCell").filter(has_text='check("0.1", to_image)')
                check.locator(".jp-OutputArea-output", has_text="[TODO] Exercise 0.1").wait_for(timeout=240_000)
                _wait_idle(page)
                page.screenshot(path=str(OUT / f"{who}-lesson-00-ran.png"))
            ran_s = time.monotonic() - started

            # learner a solves exercise 0.1; both save
            exercise = panel_a.locator(".jp-CodeCell").filter(has_text='NotImplementedError("Exercise 0.1")')
            _type_into(page_a, exercise, _solution_source())
            page_a.keyboard.press("Shift+Enter")
            page_a.keyboard.press("Shift+Enter")
            check_a = panel_a.locator(".jp-CodeCell").filter(has_text='check("0.1", to_image)')
            check_a.locator(".jp-OutputArea-output", has_text="[PASS] Exercise 0.1").wait_for(timeout=60_000)

            # 3. isolation, from inside a's kernel (a cell typed at the end of the notebook)
            last = panel_a.locator(".jp-Cell").last
            last.click()
            page_a.keyboard.press("Escape")
            page_a.keyboard.press("b")
            probe = PROBE.format(other=f"{home_b}/feed-the-gpu/{LESSON}", other_home=home_b,
                                 solutions=f"{workshop['shared']}/course/solutions")
            _type_into(page_a, panel_a.locator(".jp-Cell").last, probe)
            page_a.keyboard.press("Shift+Enter")
            probe_out = panel_a.locator(".jp-OutputArea-output", has_text="PROBE whoami")
            probe_out.wait_for(timeout=60_000)
            said = probe_out.inner_text()
            page_a.screenshot(path=str(OUT / "a-isolation-probe.png"))
            for what in ("read-other", "list-other", "write-env", "read-solutions", "write-data"):
                assert f"PROBE {what} denied" in said, said
            uid_a = pwd.getpwnam(a).pw_uid
            assert f"PROBE cores {len(plan['seats'][a]['cores'])} of" in said, said
            assert f"PROBE whoami {uid_a} {sorted(plan['seats'][a]['cores'])} ''" in said, said
            for page in (page_a, page_b):
                page.keyboard.press("Control+s")
            for home in (home_a, home_b):
                deadline = time.monotonic() + 30
                path = Path(home, "feed-the-gpu", LESSON)
                while time.monotonic() < deadline and '"outputs": []' in path.read_text() and \
                        "[TODO] Exercise 0.1" not in path.read_text():
                    time.sleep(0.5)
            # what each learner saved: lesson 00 run without an error, the check's verdict, their own cores
            for home, verdict in ((home_a, "[PASS] Exercise 0.1"), (home_b, "[TODO] Exercise 0.1")):
                saved = json.loads(Path(home, "feed-the-gpu", LESSON).read_text())
                outputs = [o for cell in saved["cells"] if cell["cell_type"] == "code" for o in cell["outputs"]]
                text = "".join("".join(o.get("text", "")) for o in outputs)
                assert not [o for o in outputs if o["output_type"] == "error"], home
                assert verdict in text, (home, text[-1500:])
                cores = len(plan["seats"][a]["cores"])
                assert f"{cores} usable cores" in text, text[:1500]
        except BaseException:
            for who, page in pages:
                try:
                    page.screenshot(path=str(OUT / f"failure-{who}.png"))
                except Exception:
                    pass
            raise
        finally:
            browser.close()

    # the kernels seen from outside: the learner's uid, cores and memory cgroup
    import psutil
    for who in (a, b):
        kernel = _kernel_of(who)
        assert kernel is not None, f"no kernel of {who} running"
        assert sorted(kernel.cpu_affinity()) == sorted(plan["seats"][who]["cores"])
        if plan["seats"][who]["cgroup"]:
            assert plan["seats"][who]["cgroup"].rsplit("/", 1)[-1] == who
            assert kernel.pid in [int(x) for x in Path(plan["seats"][who]["cgroup"], "cgroup.procs").read_text().split()]
        assert stat_mode(Path(home_a)) == 0o700 and stat_mode(Path(home_a, "feed-the-gpu")) == 0o700

    # the admin sees every learner; a learner does not
    def session(name, password):
        s = requests.Session()
        s.get(f"{hub_url}/hub/login")
        r = s.post(f"{hub_url}/hub/login", data={"username": name, "password": password, "_xsrf": s.cookies.get("_xsrf")},
                   allow_redirects=False)
        assert r.status_code == 302, (name, r.status_code)
        return s
    admin_password = json.loads((workshop["state"] / "passwords.json").read_text())["admin"]
    users = session(names["admin"], admin_password).get(f"{hub_url}/hub/api/users")
    assert users.status_code == 200 and {a, b, c} <= {u["name"] for u in users.json()}
    assert session(b, workshop["password"]).get(f"{hub_url}/hub/api/users").status_code == 403
    s = requests.Session()        # the learners' password does not open the admin's account
    s.get(f"{hub_url}/hub/login")
    r = s.post(f"{hub_url}/hub/login", data={"username": names["admin"], "password": workshop["password"],
                                             "_xsrf": s.cookies.get("_xsrf")}, allow_redirects=False)
    assert r.status_code != 302, r.status_code

    # 4. the class's gradebook
    t_collect = time.monotonic()
    subs, out = workshop["base"] / "submissions", workshop["base"] / "gradebook"
    collected = subprocess.run(["make", "--no-print-directory", "collect", "LESSON=00", f"SUBMISSIONS={subs}",
                                f"GRADE_FLAGS=--smoke --jobs 2 --output {out}"], cwd=ROOT, env=workshop["env"],
                               capture_output=True, text=True, timeout=600)
    (OUT / "collect.log").write_text(collected.stdout + collected.stderr)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-2000:]
    assert f"{c}: no {LESSON}" in collected.stdout
    assert sorted(p.name for p in subs.iterdir()) == sorted([a, b])
    grades = json.loads((out / "grades-00.json").read_text())
    by = {Path(s["path"]).parent.name: s for s in grades["submissions"]}
    assert by[a]["exercises"][0]["status"] == "pass" and by[a]["points"] == by[a]["max_points"] == 1, by[a]
    assert by[b]["exercises"][0]["status"] == "not_implemented", by[b]
    assert (out / "gradebook-00.csv").exists() and (out / "graded-00").is_dir()
    collect_s = time.monotonic() - t_collect

    # 5. SIGTERM: the hub, the proxy, every server, kernel and cgroup go
    stop_s = _stop_group(workshop["proc"], signal.SIGTERM)
    hub_id = plan["hub_id"]
    uids = {pwd.getpwnam(n).pw_uid for k, n in names.items() if k != "grader"}
    left = []
    for proc in psutil.process_iter(["pid", "uids", "cmdline"]):
        try:
            mark = proc.environ().get("COURSE_HUB_RUN", "")
        except (psutil.Error, OSError):
            mark = ""
        if mark.startswith(hub_id + "/") or (proc.info["uids"] and proc.info["uids"].real in uids):
            left.append(f"{proc.pid}: {' '.join(proc.info['cmdline'] or [])[:100]}")
    assert not left, f"processes left after the hub stopped: {left}"
    if plan.get("memory_cgroups"):
        assert not Path(plan["memory_cgroups"]).exists(), "the learners' memory cgroups were left behind"
    with socket.socket() as s:                        # nothing listens on the room's port any more
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", workshop["port"]))
    print(f"\nmake hub answered after {workshop['started_s']:.0f} s (the learners' environment and data built); "
          f"two learners in lesson 00 after {logged_in_s:.0f} s, run after {ran_s:.0f} s; collect and grade "
          f"{collect_s:.0f} s; stopped in {stop_s:.1f} s; the test {time.monotonic() - started:.0f} s after the start")


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777
