"""A lesson run stopped by its timeout in the middle of a multi-process launch leaves nothing
behind: lesson 07's training program (torchrun, 2 ranks, DataLoader workers in each) is started
from a notebook cell, and the notebook's execution timeout kills the kernel while the ranks
train. Every process of the run carries a marker in its environment; none may survive."""
import threading
import time
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.notebook


def _marked(marker):
    out = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("COURSE_TEST_RUN") == marker and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except (psutil.Error, OSError):
            pass
    return out


def test_a_lesson_run_stopped_by_timeout_leaves_no_process(monkeypatch):
    marker = uuid.uuid4().hex
    monkeypatch.setenv("COURSE_TEST_RUN", marker)
    monkeypatch.setenv("COURSE_SMOKE", "1")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import torch\nfrom course_utils.launch import torchrun"),   # the kernel ready
        nbformat.v4.new_code_cell('torchrun("ddp_train.py", "--epochs", 1000, "--batch-size", 8, "--width", 4, '
                                  '"--limit", 256, "--workers", 1, nproc=2, backend="gloo", timeout_s=600)'),
    ]
    seen = {"max": 0, "workers": 0}
    stop = threading.Event()

    def watch():                     # how many processes of the run exist while it runs
        while not stop.is_set():
            procs = _marked(marker)
            seen["max"] = max(seen["max"], len(procs))
            for p in procs:
                try:
                    if "torch.distributed.run" not in " ".join(p.cmdline()) and p.parent() and \
                            "ddp_train.py" in " ".join(p.parent().cmdline()):
                        seen["workers"] = max(seen["workers"], 1)
                except psutil.Error:
                    pass
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    client = NotebookClient(nb, timeout=35, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}})
    with pytest.raises(CellTimeoutError):
        client.execute()
    stop.set()
    watcher.join()
    # kernel + torchrun + 2 ranks + their workers were running when the timeout struck
    assert seen["max"] >= 4 and seen["workers"], f"the launch had not started its ranks and workers: {seen}"
    deadline = time.time() + 20
    while _marked(marker) and time.time() < deadline:
        time.sleep(0.5)
    left = [f"{p.pid}: {' '.join(p.cmdline())[:100]}" for p in _marked(marker)]
    assert not left, f"left behind after the timeout: {left}"
