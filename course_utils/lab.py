"""`make lab`: open the course in JupyterLab, safely (what `make lab` runs).

    python -m course_utils.lab [--port 8888] [--no-browser]

- listens on 127.0.0.1 only, behind a fresh random token;
- the token travels in the server's environment (`JUPYTER_TOKEN`), never on its command line,
  where `ps` would show it to every user of the machine;
- a busy port stops it before anything starts, with the advice to use `make lab PORT=...`;
  the link is printed only once the server answers, so it is never a dead link;
- the project's own Jupyter configuration (`.jupyter/` at the course's root, added to
  `JUPYTER_CONFIG_PATH`) turns off JupyterLab's "news" pop-up;
- as root (in a container, say) Jupyter refuses to start without `--allow-root`: it is added
  only then.
Ctrl-C stops the server.
"""
from __future__ import annotations

import argparse
import errno
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIRST_LESSON = "notebooks/00-welcome-and-setup.ipynb"


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on host:port (we could bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as err:
            if err.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def busy_port_message(port: int) -> str:
    return (f"Port {port} is already in use (another `make lab`, or another server), so the course did not "
            f"start and there is no link to open. Start it on another port, e.g.\n\n"
            f"    make lab PORT={port + 2}\n")


def lab_command(port: int, root: Path = ROOT, *, open_browser: bool = False) -> list[str]:
    """The `jupyter lab` command line: no token on it (it comes from the environment)."""
    jupyter = Path(sys.executable).with_name("jupyter")
    cmd = [str(jupyter) if jupyter.exists() else "jupyter", "lab",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--ServerApp.root_dir={root}", f"--ServerApp.default_url=/lab/tree/{FIRST_LESSON}",
           f"--ServerApp.open_browser={open_browser}"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")
    return cmd


def lab_environment(token: str, root: Path = ROOT) -> dict:
    """The server's environment: the token, and the project's Jupyter configuration first."""
    env = dict(os.environ)
    env["JUPYTER_TOKEN"] = token
    config = str(root / ".jupyter")
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (config, env.get("JUPYTER_CONFIG_PATH")) if p)
    return env


def _answers(port: int, token: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8888)))
    parser.add_argument("--no-browser", action="store_true", help="do not open a web browser")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the server to answer")
    args = parser.parse_args(argv)

    if not port_is_free(args.port):
        print(busy_port_message(args.port), file=sys.stderr)
        return 2
    token = secrets.token_urlsafe(24)
    server = subprocess.Popen(lab_command(args.port, open_browser=False), env=lab_environment(token), cwd=ROOT)

    def forward(signum, frame):
        server.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    deadline = time.monotonic() + args.timeout
    while not _answers(args.port, token):
        if server.poll() is not None:
            print(f"\nJupyterLab stopped before it answered (exit code {server.returncode}); see its messages above."
                  + ("\n" + busy_port_message(args.port) if not port_is_free(args.port) else ""), file=sys.stderr)
            return server.returncode or 1
        if time.monotonic() > deadline:
            print(f"\nJupyterLab did not answer within {args.timeout:.0f} s; stopping it.", file=sys.stderr)
            server.terminate()
            server.wait(timeout=30)
            return 1
        time.sleep(0.3)
    url = f"http://127.0.0.1:{args.port}/lab/tree/{FIRST_LESSON}?token={token}"
    print(f"\n  Feed the GPU is open at:\n\n    {url}\n\n  (Ctrl-C here stops it.)\n", flush=True)
    has_screen = sys.platform in ("darwin", "win32") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    if has_screen and not args.no_browser and not os.environ.get("CI"):
        try:
            import webbrowser
            webbrowser.open(url)
        except Exception:
            pass
    while True:
        try:
            return server.wait()
        except KeyboardInterrupt:
            continue


if __name__ == "__main__":
    raise SystemExit(main())
