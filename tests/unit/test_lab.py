"""`make lab`'s launcher: localhost only, the token never on a command line, a busy port stops it
with advice and no link, the project's Jupyter configuration (no news pop-up) comes first."""
import json
import os
import socket
import subprocess
import sys

from course_utils import lab


def test_the_command_line_carries_no_token_and_binds_localhost():
    cmd = lab.lab_command(8899)
    line = " ".join(cmd)
    assert "--ServerApp.ip=127.0.0.1" in cmd and "--ServerApp.port=8899" in cmd
    assert "--ServerApp.port_retries=0" in cmd, "a busy port must not silently move the course elsewhere"
    assert "token" not in line.lower() and "0.0.0.0" not in line
    assert f"--ServerApp.default_url=/lab/tree/{lab.FIRST_LESSON}" in cmd
    assert ("--allow-root" in cmd) == (os.getuid() == 0), "--allow-root only when running as root"


def test_the_token_and_the_project_configuration_travel_in_the_environment(monkeypatch):
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", "/somewhere/else")
    env = lab.lab_environment("s3cret")
    assert env["JUPYTER_TOKEN"] == "s3cret"
    first, *rest = env["JUPYTER_CONFIG_PATH"].split(os.pathsep)
    assert first == str(lab.ROOT / ".jupyter") and rest == ["/somewhere/else"], "the learner's own config still applies"


def test_the_project_configuration_turns_off_the_news_pop_up():
    config = json.loads((lab.ROOT / ".jupyter" / "labconfig" / "page_config.json").read_text())
    assert config["disabledExtensions"]["@jupyterlab/apputils-extension:announcements"] is True


def test_a_busy_port_stops_with_advice_and_no_link():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not lab.port_is_free(port)
        proc = subprocess.run([sys.executable, "-m", "course_utils.lab", "--port", str(port), "--no-browser"],
                              capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2
    assert f"make lab PORT={port + 2}" in out and "already in use" in out
    assert "http://" not in out and "token" not in out
