"""Run the prepared notebook in a Jupyter kernel, cell by cell, and survive what it does.

- A cell that raises is recorded in one sentence and execution goes on (so a learner who got
  1.1 wrong still hands in 1.2): `sys.exit()` is just an error of that cell.
- A cell that runs past the per-cell limit is interrupted; if the kernel does not answer
  within `PROBE_S` afterwards (code that swallows KeyboardInterrupt), it is restarted.
- A kernel that dies (`os._exit`, a crash, out of memory) is restarted: the cells that had
  run cleanly before are run again in the new kernel (their first outputs are kept), the cell
  that killed it is skipped, and execution goes on; after `MAX_RESTARTS` restarts it stops.
- The whole notebook has a time limit; cells not reached are reported as such.

Every kernel runs in its own session (process group) with its own working folder, environment
and log file, and its whole process tree is killed when it is done, with every process that
carries its marker (`course_utils.grading.reap`).
"""
from __future__ import annotations

import asyncio
import copy
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Execution", "execute", "MAX_RESTARTS", "PROBE_S"]

MAX_RESTARTS = 2
PROBE_S = 15.0
STARTUP_S = 120.0
_TIMEOUT_TOKEN = "course-grader-cell-timeout"


@dataclass
class Execution:
    failures: dict = field(default_factory=dict)   # graded cell index -> one sentence
    events: list = field(default_factory=list)     # restarts and limits, one sentence each
    not_run_from: int | None = None                # first cell never run
    not_run_reason: str | None = None
    seconds: float = 0.0
    startup_error: str | None = None               # the kernel could not start (the grader's failure)
    restarts: int = 0


def _sentence(ename: str, evalue: str) -> str:
    evalue = re.sub(r"\((?:\d+|<[^>]*>)\.py, line (\d+)\)", r"(line \1)", str(evalue)).strip()
    evalue = evalue.splitlines()[0] if evalue else ""
    if len(evalue) > 200:
        evalue = evalue[:197] + "..."
    if ename == "SystemExit":
        return f"called sys.exit({evalue})" if evalue else "called sys.exit()"
    return f"raised {ename}: {evalue}" if evalue else f"raised {ename}"


def _kill_tree(pid: int | None) -> None:
    """Kill a kernel's process group and every descendant still alive."""
    if not pid:
        return
    try:
        import psutil
        procs = psutil.Process(pid).children(recursive=True)
    except Exception:
        procs = []
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    for p in procs:
        try:
            p.kill()
        except Exception:
            pass


class _Life:
    """One kernel process: start it, run cells, stop it."""

    def __init__(self, nb, *, cwd, env, log):
        self.nb, self.cwd, self.env, self.log = nb, cwd, env, log
        self.km = self.kc = self.client = None
        self.replies: dict[int, dict] = {}

    async def start(self) -> None:
        from jupyter_client import AsyncKernelManager
        from nbclient import NotebookClient

        self.km = AsyncKernelManager(kernel_name="python3")
        await self.km.start_kernel(cwd=str(self.cwd), env=self.env, stdout=self.log, stderr=self.log)
        self.kc = self.km.client()
        self.kc.start_channels()
        await self.kc.wait_for_ready(timeout=STARTUP_S)

        async def executed(cell, cell_index, execute_reply):
            self.replies[cell_index] = execute_reply

        self.client = NotebookClient(self.nb, km=self.km, kernel_name="python3", allow_errors=True,
                                     interrupt_on_timeout=True, record_timing=False, iopub_timeout=10,
                                     error_on_timeout={"ename": "CellTimeoutError", "evalue": _TIMEOUT_TOKEN,
                                                       "traceback": []},
                                     on_cell_executed=executed)
        self.client.kc = self.kc

    @property
    def pid(self):
        try:
            return self.km.provisioner.process.pid
        except Exception:
            return None

    async def run(self, index: int, timeout: float, count: int):
        """(status, sentence): status in ok | error | timeout | dead."""
        cell = self.nb.cells[index]
        self.client.timeout = max(1, int(timeout + 0.999))
        self.replies.pop(index, None)
        from nbclient.exceptions import DeadKernelError
        try:
            await self.client.async_execute_cell(cell, index, execution_count=count)
        except DeadKernelError:
            return "dead", None
        reply = (self.replies.get(index) or {}).get("content", {})
        if reply.get("status") == "error":
            if reply.get("evalue") == _TIMEOUT_TOKEN:
                return "timeout", None
            return "error", _sentence(reply.get("ename", "an error"), reply.get("evalue", ""))
        return "ok", None

    async def responsive(self) -> bool:
        """Does the kernel answer a trivial request within PROBE_S (after an interrupt)?"""
        from queue import Empty
        msg_id = self.kc.execute("", silent=True, store_history=False)
        deadline = time.monotonic() + PROBE_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = await self.kc.get_shell_msg(timeout=left)
            except (Empty, asyncio.TimeoutError):
                return False
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return True
        return False

    async def stop(self) -> None:
        pid = self.pid
        try:
            if self.kc is not None:
                self.kc.stop_channels()
            if self.km is not None and self.km.has_kernel:
                await asyncio.wait_for(self.km.shutdown_kernel(now=True), 30)
        except Exception:
            pass
        finally:
            _kill_tree(pid)
            from course_utils.grading.reap import ENV, kill_marked
            if self.env.get(ENV):   # what escaped the tree: setsid'd or double-forked (torchrun's ranks...)
                kill_marked(self.env[ENV])


async def execute(prepared, *, cwd, env, cell_timeout: float, notebook_timeout: float,
                  log_path, label=None, on_cell=None) -> Execution:
    """Execute `prepared.nb` in place (outputs land in its cells) and say what went wrong.
    `on_cell(index)` is called before each cell runs (the grader's runner reports progress with it)."""
    label = label or prepared.label
    cells = prepared.nb.cells
    result = Execution()
    t0 = time.monotonic()
    deadline = t0 + notebook_timeout
    ok: list[int] = []
    count = 0
    start = 0
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        while True:
            life = _Life(prepared.nb, cwd=cwd, env=env, log=log)
            try:
                try:
                    await asyncio.wait_for(life.start(), timeout=min(STARTUP_S, max(1.0, deadline - time.monotonic())))
                except Exception as exc:
                    log.flush()
                    tail = [line for line in Path(log_path).read_text(errors="replace").splitlines() if line.strip()][-1:]
                    result.startup_error = (f"the grader could not start a python3 kernel: "
                                            f"{type(exc).__name__}: {exc}".rstrip(": ")
                                            + (f" (its log ends: {tail[0].strip()[:200]})" if tail else ""))
                    result.not_run_from, result.not_run_reason = start, "the kernel could not start"
                    break
                stop_at = None   # (index, why, where to go on) when this life ended early
                if result.restarts:
                    for j in ok:
                        if on_cell is not None:
                            on_cell(j)
                        backup = copy.deepcopy(cells[j])
                        status, _ = await life.run(j, max(1.0, min(cell_timeout, deadline - time.monotonic())), backup.execution_count or 0)
                        cells[j] = backup
                        if status == "dead":
                            stop_at = (j, f"{label(j)} killed the kernel when it was re-run after a restart", start)
                            break
                        if time.monotonic() >= deadline:
                            break
                if stop_at is None:
                    index = start
                    while index < len(cells):
                        cell = cells[index]
                        if cell.cell_type != "code" or not cell.source.strip():
                            index += 1
                            continue
                        left = deadline - time.monotonic()
                        if left <= 0:
                            result.not_run_from = index
                            result.not_run_reason = f"the notebook reached its limit of {notebook_timeout:g} s"
                            break
                        limit = min(cell_timeout, left)
                        count += 1
                        if on_cell is not None:
                            on_cell(index)
                        status, sentence = await life.run(index, limit, count)
                        if status == "ok":
                            ok.append(index)
                        elif status == "error":
                            result.failures[index] = sentence
                        elif status == "timeout":
                            if limit < cell_timeout:
                                result.failures[index] = (f"was stopped when the notebook reached its limit of "
                                                          f"{notebook_timeout:g} s")
                                result.not_run_from = index + 1
                                result.not_run_reason = f"the notebook reached its limit of {notebook_timeout:g} s"
                                break
                            result.failures[index] = f"ran longer than the {cell_timeout:g} s a cell may take and was interrupted"
                            if not await life.responsive():
                                stop_at = (index, f"the kernel did not stop after {label(index)} was interrupted", index + 1)
                                break
                        else:   # dead
                            result.failures[index] = "killed the kernel (os._exit, a crash, or out of memory)"
                            stop_at = (index, f"the kernel died in {label(index)}", index + 1)
                            break
                        index += 1
                if stop_at is None:
                    break
                where, why, resume = stop_at
                if result.restarts >= MAX_RESTARTS:
                    result.events.append(f"{why}; it had been restarted {result.restarts} times already, so the "
                                         "remaining cells were not run")
                    result.not_run_from = resume
                    result.not_run_reason = f"the kernel died {result.restarts + 1} times"
                    break
                result.restarts += 1
                if where in ok:
                    ok.remove(where)
                result.events.append(f"{why}; the grader restarted it, re-ran the {len(ok)} cells that had run "
                                     "cleanly before, and went on after that cell")
                start = resume
            finally:
                await life.stop()
    result.seconds = time.monotonic() - t0
    return result
