"""`make lab` in a real browser: what a learner does first, driven in headless Chromium.

Starts the lab exactly as `make lab` does (the same make target, on a free port), reads the
link it prints, and drives Debian's Chromium (/usr/bin/chromium; `make test` installs it when
missing) with Playwright, never a downloaded browser:

1. the link opens lesson 00, with no "news" pop-up over it;
2. Run > Run All Cells: the check line `[TODO] Exercise 0.1` appears, no cell shows an error,
   and a figure rendered;
3. the solution of 0.1 (taken from solutions/) is typed into the exercise cell, the cell and
   its check are run: `[PASS] Exercise 0.1`;
4. the live utilisation panel (`course_utils.live.LiveMonitor`) moves while a cell trains on
   the simulated device, and becomes a static figure when the cell ends.

The lesson runs from a copy in build/browser/ (the tracked notebook is never touched; autosave
is off in the test's own JupyterLab settings). Screenshots go to build/browser/*.png. Every wait
is on a condition with a deadline; the server and the browser are always stopped.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "browser"
LESSON = "00-welcome-and-setup.ipynb"
COPY = "00-welcome-and-setup-browser-test.ipynb"     # a copy of lesson 00, with its own name
# The flags that keep Chromium off the network (this machine has none beyond package registries).
CHROMIUM_ARGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]

pytestmark = pytest.mark.browser


def _chromium() -> str | None:
    for candidate in (os.environ.get("COURSE_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def _missing(what: str):
    """Skip on a learner's machine; fail in CI, where `make test` installs what the test needs."""
    message = f"{what}; `make browser-deps` installs Debian's chromium (as root)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _user_settings(folder: Path) -> None:
    """The test's own JupyterLab settings: every cell in the page (no windowing, so every
    output can be read) and no autosave."""
    settings = {
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
        "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    }
    for name, value in settings.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`make lab` on a free port: yields the link it printed; stops the server afterwards."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    home = tmp_path_factory.mktemp("lab")
    _user_settings(home / "settings")
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), PYTHONUNBUFFERED="1")
    env.pop("JUPYTER_TOKEN", None)
    port = _free_port()
    log = open(home / "lab.log", "w+")
    server = subprocess.Popen(["make", "--no-print-directory", "lab", f"PORT={port}", "LAB_ARGS=--no-browser"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                              start_new_session=True)
    try:
        url, deadline = None, time.monotonic() + 120
        while url is None and time.monotonic() < deadline and server.poll() is None:
            line = server.stdout.readline()
            match = re.search(r"(http://127\.0\.0\.1:\d+/\S+\?token=\S+)", line)
            url = match.group(1) if match else None
        if url is None:
            log.seek(0)
            pytest.fail(f"`make lab` printed no link within 120 s:\n{log.read()[-3000:]}")
        yield {"url": url, "port": port, "pid": server.pid}
    finally:
        _stop(server)
        log.close()


def _stop(process) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to the server's whole process group (make, the launcher,
    jupyter and its kernels)."""
    for sig, wait in ((signal.SIGINT, 10), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if process.poll() is not None:
            break
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(process.pid, signal.SIGKILL)      # kernels that outlived the server
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def page(lab):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed (requirements.txt pins it)")
    chromium = _chromium()
    if chromium is None:
        _missing("no Chromium found (looked for /usr/bin/chromium)")
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            pg = context.new_page()
            pg.set_default_timeout(60_000)
            yield pg
        finally:
            browser.close()


def _wait_idle(page, timeout_ms=180_000):
    """Until no cell is queued or running ([*]) and the kernel says idle."""
    page.wait_for_function(
        """() => {
            const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
            const prompts = [...panel.querySelectorAll('.jp-InputPrompt')];
            const busy = prompts.some(p => p.textContent.includes('*'));
            const status = panel.querySelector('.jp-Notebook-ExecutionIndicator');
            const idle = !status || status.getAttribute('data-status') === 'idle';
            return prompts.length > 0 && !busy && idle;
        }""", timeout=timeout_ms)


def _open(page, url: str, name: str):
    """Open `url` and wait until the notebook `name` is the current tab and its kernel is idle.
    Returns the notebook panel (found through its tab, so another open notebook cannot stand in)."""
    page.goto(url)
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current",
                       has=page.locator(".lm-TabBar-tabLabel", has_text=re.compile(f"^{re.escape(name)}$")))
    tab.wait_for(timeout=90_000)
    panel = page.locator(f"[id='{tab.get_attribute('data-id')}']")
    panel.locator(".jp-Cell").first.wait_for()
    panel.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=90_000)
    return panel


_STARTED = """(panelId) => {
    const panel = document.getElementById(panelId);
    return [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent));
}"""


def _run_all(page, panel):
    """Run > Run All Cells, as a learner would (the notebook must have the focus first). On a busy
    machine the menu can be opened before the notebook has the focus, and the click then runs
    nothing: it is repeated (at most three times) until a cell is queued or running."""
    panel_id = panel.get_attribute("id")
    for attempt in range(3):
        panel.locator(".jp-Cell").first.click()
        page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
        item = page.locator(".lm-Menu-item[data-command='runmenu:run-all']")
        item.wait_for()
        if "lm-mod-disabled" in (item.get_attribute("class") or ""):
            page.keyboard.press("Escape")
            page.wait_for_timeout(2_000)
            continue
        item.click()
        try:
            page.wait_for_function(_STARTED, arg=panel_id, timeout=30_000)
            return
        except Exception:
            page.keyboard.press("Escape")
    raise AssertionError(f"Run > Run All Cells queued no cell in three tries: {_state(page, panel)}")


def _state(page, panel) -> str:
    """What the notebook shows (prompts, kernel status, the last outputs): the failure message, since
    CI keeps no screenshot."""
    prompts = [p.strip() for p in panel.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()]
    status = panel.locator(".jp-Notebook-ExecutionIndicator").first.get_attribute("data-status") \
        if panel.locator(".jp-Notebook-ExecutionIndicator").count() else "none"
    outputs = [o[-300:] for o in panel.locator(".jp-OutputArea-output").all_inner_texts()][-4:]
    dialogs = page.locator(".jp-Dialog").all_inner_texts()
    return f"prompts={prompts}, kernel={status}, dialogs={dialogs}, last outputs={outputs}"


@pytest.fixture(autouse=True)
def _screenshot_on_failure(request):
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed and "page" in request.fixturenames:
        page = request.getfixturevalue("page")
        page.screenshot(path=str(OUT / f"failure-{request.node.name}.png"))


def _no_news_popup(page):
    toasts = page.locator(".Toastify__toast")
    texts = [t.lower() for t in toasts.all_inner_texts()]
    assert not any("news" in t for t in texts), f"a news pop-up is showing: {texts}"


def _solution_source() -> str:
    nb = json.loads((ROOT / "solutions" / LESSON).read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code" and "def to_image" in "".join(c["source"]))
    lines = "".join(cell["source"]).splitlines(keepends=True)
    return "".join(line for line in lines if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)


def test_lesson_00_runs_and_grades_in_the_browser(lab, page):
    started = time.monotonic()
    tracked = (ROOT / "notebooks" / LESSON).read_bytes()

    # 1. the link `make lab` printed opens lesson 00, without a news pop-up
    assert f"/lab/tree/notebooks/{LESSON}?token=" in lab["url"]
    _open(page, lab["url"], LESSON)
    page.screenshot(path=str(OUT / "1-make-lab-link.png"))
    _no_news_popup(page)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    token = lab["url"].split("token=")[1]
    assert token not in ps, "the token is on a process's command line"

    # 2. a copy of the lesson (the tracked notebook stays untouched): Run > Run All Cells
    shutil.copy(ROOT / "notebooks" / LESSON, OUT / COPY)
    copy_url = lab["url"].replace(f"/lab/tree/notebooks/{LESSON}", f"/lab/tree/build/browser/{COPY}")
    panel = _open(page, copy_url, COPY)
    _run_all(page, panel)
    check_cell = panel.locator(".jp-CodeCell").filter(has_text='check("0.1", to_image)')
    try:
        check_cell.locator(".jp-OutputArea-output", has_text="[TODO] Exercise 0.1").wait_for(timeout=240_000)
    except Exception as error:
        raise AssertionError(f"no [TODO] Exercise 0.1 line within 240 s of Run All: {_state(page, panel)}") from error
    _wait_idle(page)
    prompts = panel.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
    assert prompts and all(re.fullmatch(r"\[\d+\]:", p.strip()) for p in prompts), f"cells not run: {prompts}"
    outputs = panel.locator(".jp-OutputArea-output").all_inner_texts()
    errors = [o for o in outputs if "Traceback" in o or re.search(r"\b\w+Error\b", o) and "[TODO]" not in o]
    assert not errors, f"cells show errors: {errors[:2]}"
    images = panel.locator(".jp-RenderedImage img")
    assert images.count() >= 1, "no figure rendered"
    assert images.first.evaluate("img => img.naturalWidth > 100 && img.complete")
    images.first.evaluate("img => img.scrollIntoView({block: 'start'})")
    page.screenshot(path=str(OUT / "2-run-all-figure.png"))
    check_cell.scroll_into_view_if_needed()
    page.screenshot(path=str(OUT / "3-run-all-todo.png"))

    # 3. type the solution into the exercise cell, run it and its check
    exercise = panel.locator(".jp-CodeCell").filter(has_text='NotImplementedError("Exercise 0.1")')
    exercise.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.press("Delete")
    page.keyboard.insert_text(_solution_source())
    page.keyboard.press("Shift+Enter")       # runs the exercise cell, selects the check cell
    page.keyboard.press("Shift+Enter")       # runs the check
    passed = check_cell.locator(".jp-OutputArea-output", has_text="[PASS] Exercise 0.1")
    passed.wait_for(timeout=60_000)
    check_cell.scroll_into_view_if_needed()
    page.screenshot(path=str(OUT / "4-solved-pass.png"))
    _no_news_popup(page)
    assert (ROOT / "notebooks" / LESSON).read_bytes() == tracked, "the tracked lesson was modified"
    elapsed = time.monotonic() - started
    print(f"lesson 00 in the browser: {elapsed:.0f} s")


LIVE_CELLS = [
    "import itertools\nimport torch\nfrom course_utils.live import LiveMonitor\n"
    "from course_utils.sim import default_sim\nfrom course_utils.train import train\n"
    "sim = default_sim()\nx, y = torch.zeros(128, 3, 32, 32), torch.zeros(128, dtype=torch.long)",
    "with LiveMonitor(device=sim, title='browser test') as live:\n"
    "    train(None, live.count(itertools.repeat((x, y))), device=sim, steps=1000, progress=False)",
]


def test_the_live_panel_moves_while_a_cell_trains(lab, page):
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in LIVE_CELLS])
    nb.metadata = json.loads((ROOT / "notebooks" / LESSON).read_text())["metadata"]   # its kernel, no dialog
    OUT.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, OUT / "live-monitor.ipynb")
    url = lab["url"].replace(f"/lab/tree/notebooks/{LESSON}", "/lab/tree/build/browser/live-monitor.ipynb")
    panel = _open(page, url, "live-monitor.ipynb")
    _run_all(page, panel)
    training = panel.locator(".jp-CodeCell").nth(1)
    rate = training.locator(".course-live-rate")
    rate.wait_for(timeout=90_000)
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(set(seen)) < 3:
        prompt = training.locator(".jp-InputPrompt").inner_text()
        if "*" not in prompt:
            break
        text = rate.inner_text()
        if re.search(r"[\d,]+ samples/s", text):
            seen.append(text)
            if len(set(seen)) == 2:
                training.screenshot(path=str(OUT / "5-live-panel.png"))
        page.wait_for_timeout(150)
    assert len(set(seen)) >= 2, f"the live panel did not move while the cell ran: {seen}"
    assert "simulated" in training.locator(".course-live-monitor").inner_text()
    _wait_idle(page)
    figure = training.locator(".jp-RenderedImage img")
    figure.wait_for(timeout=30_000)
    assert training.locator(".course-live-monitor").count() == 0, "the live panel should give way to the figure"
    training.screenshot(path=str(OUT / "6-live-became-figure.png"))
