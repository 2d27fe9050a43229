"""What do UtilizationMonitor and its live view cost a training loop? (a benchmark, not a test)

    .venv/bin/python benchmarks/monitor_overhead.py [--rounds 6] [--steps 60] [--no-kernel]

Trains the tiny CNN on CPU-resident random batches (on the GPU when there is one) through the
course's training loop, in alternating rounds: without a monitor, with a `UtilizationMonitor`
sampling every 100 ms, and with a `LiveMonitor` (the same sampler, plus the ipywidgets panel
redrawn every 0.5 s). Alternating rounds in one run cancels slow drifts of the machine. The
live rounds run inside a real Jupyter kernel (started through nbclient), so every redraw goes
through the kernel's comm and ZeroMQ sockets to a client, as it does to JupyterLab.

Because a difference of 1% is often smaller than the noise between rounds, it also reports
the monitor's own cost directly: the CPU time its thread spent sampling and redrawing, per
second of training. That is an upper bound on what it can take from the loop, and, as a
share of one core, the most it can add to each step (if every microsecond of it held up the
loop's thread). The target is under 1%.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time

import torch

from course_utils.env import device_label, pick_device
from course_utils.models import TinyCNN
from course_utils.monitor import UtilizationMonitor
from course_utils.train import train


def measure(rounds: int, steps: int, interval: float, live_in_kernel: bool) -> dict:
    """Alternating rounds; returns median step times and the monitor threads' CPU time."""
    from course_utils.live import LiveMonitor

    device = pick_device()
    torch.manual_seed(0)
    model = TinyCNN().to(device)
    x = torch.randn(128, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (128,), device=device)

    def batches():
        return itertools.repeat((x, y))

    train(model, batches(), device=device, steps=10, progress=False)  # warm-up
    times = {"none": [], "monitor": [], "live": []}
    cost = {"monitor": [0.0, 0.0], "live": [0.0, 0.0]}   # [thread CPU seconds, wall seconds]
    for _ in range(rounds):
        times["none"].append(train(model, batches(), device=device, steps=steps, progress=False).stats.step_time_ms)
        t0 = time.perf_counter()
        with UtilizationMonitor(interval, device=device) as mon:
            r = train(model, batches(), device=device, steps=steps, progress=False)
        times["monitor"].append(r.stats.step_time_ms)
        cost["monitor"][0] += mon.sample_seconds
        cost["monitor"][1] += time.perf_counter() - t0
        t0 = time.perf_counter()
        with LiveMonitor(device=device, interval_s=interval, final_plot=False, live=live_in_kernel) as live:
            r = train(model, live.count(batches()), device=device, steps=steps, progress=False)
        times["live"].append(r.stats.step_time_ms)
        cost["live"][0] += live.monitor.sample_seconds + live.refresh_seconds
        cost["live"][1] += time.perf_counter() - t0
        refreshes = live.refreshes
    return {"device": device_label(device), "times": times, "cost": cost, "refreshes_last_round": refreshes,
            "live_panel": bool(live.live)}


KERNEL_CELL = """
import json, sys
sys.argv = ["monitor_overhead"]
sys.path.insert(0, {root!r})
from benchmarks.monitor_overhead import measure
print("RESULT " + json.dumps(measure({rounds}, {steps}, {interval}, True)))
"""


def measure_in_kernel(rounds: int, steps: int, interval: float) -> dict:
    """`measure` inside a Jupyter kernel driven by nbclient: the live panel's redraws are real
    comm messages over ZeroMQ."""
    from pathlib import Path

    import nbformat
    from nbclient import NotebookClient
    root = str(Path(__file__).resolve().parents[1])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        KERNEL_CELL.format(root=root, rounds=rounds, steps=steps, interval=interval))])
    NotebookClient(nb, timeout=3600, kernel_name="python3").execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.get("output_type") == "stream")
    line = next(l for l in text.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--no-kernel", action="store_true",
                        help="run here, not in a Jupyter kernel (the live panel then has no front end to talk to)")
    args = parser.parse_args(argv)

    if args.no_kernel:
        result = measure(args.rounds, args.steps, args.interval, live_in_kernel=False)
        where = "in this process (no kernel: the live rounds sample and count, and draw no panel)"
    else:
        result = measure_in_kernel(args.rounds, args.steps, args.interval)
        where = "inside a Jupyter kernel (nbclient): the live panel redrawn through real comm messages"
    times, cost = result["times"], result["cost"]
    base = statistics.median(times["none"])
    print(f"device: {result['device']}; {args.rounds} alternating rounds of {args.steps} steps, {where}")
    spread = 100 * (max(times["none"]) - min(times["none"])) / base
    print(f"median step time without a monitor: {base:.3f} ms (rounds differ by up to {spread:.1f}% among themselves)")
    for kind, label in (("monitor", "UtilizationMonitor"), ("live", "LiveMonitor (panel every 0.5 s)")):
        med = statistics.median(times[kind])
        thread_s, wall_s = cost[kind]
        share = 100 * thread_s / wall_s
        print(f"{label:32s} median step {med:.3f} ms: {100 * (med - base) / base:+.2f}% against none; "
              f"its thread used {share:.3f}% of one core ({1e3 * thread_s / wall_s:.2f} ms per second), "
              f"at most {share * base / 100 * 1e3:.1f} us of each {base:.1f} ms step")
    if not result["live_panel"]:
        print("(the live rounds drew no panel: run without --no-kernel for the panel's cost)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
