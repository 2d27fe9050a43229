"""Lesson 07's figures for the README: the all-reduce fit and a DDP run against one process.
(A benchmark, not a test.)

    .venv/bin/python benchmarks/ddp_cpu.py [--steps 40] [--json build/ddp_cpu.json]

With the lesson's programs, through the course's launcher, on this machine's backend (gloo with
2 processes without a GPU, nccl with one process per GPU):
1. `allreduce_bench.py` from 4 KiB to 256 MiB (9 repeats each), fitted to latency + 2(N-1)/N x bytes / bandwidth;
2. `ddp_train.py` (ResNet-18, width 16 on a CPU, 64 on GPUs) with N processes and with 1, in
   alternating rounds so that a busy moment does not land on one of them only, plus the thread
   sweep (launcher's threads per rank against every core per rank).
Each launch also records how much CPU other processes took meanwhile (`CpuUse`): on a shared
machine that says how far to trust the figures.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from course_utils import allreduce
from course_utils.env import env_report, usable_cores
from course_utils.launch import default_backend, default_nproc, threads_per_rank, torchrun
from course_utils.loaders import CpuUse


def job_samples_per_s(result) -> float:
    return sum(r["epochs"][-1]["samples_per_s"] for r in result["per_rank"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per epoch of each DDP run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    nproc = default_nproc()
    backend = default_backend(nproc)      # the 1-process runs below use the same backend, for a fair ratio
    gpu = backend == "nccl" or (nproc == 1 and torch.cuda.is_available())
    report = env_report()
    hardware = (", ".join(g["name"] for g in report.gpus) if gpu else
                f"{report.cpu}, {usable_cores()} cores") + f"; torch {report.torch}, {backend}"
    print(f"{nproc} processes on {backend}: {hardware}")

    sizes = [4096 * 4 ** i for i in range(9)]          # 4 KiB .. 256 MiB
    with CpuUse() as cpu:
        bench = torchrun("allreduce_bench.py", "--sizes", *sizes, "--repeats", 9, nproc=max(nproc, 2),
                         backend=backend if nproc >= 2 else "gloo", timeout_s=900, echo=False).result
    fit = allreduce.fit_ring([r["bytes"] for r in bench["results"]], [r["seconds"] for r in bench["results"]],
                             bench["world_size"], label=hardware)
    print(f"all-reduce: {fit}   ({cpu})")
    for r, res in zip(bench["results"], fit.relative_residuals):
        print(f"  {r['bytes']:>12,d} B  {r['seconds'] * 1e3:9.3f} ms  (fit {res:+.0%})")

    width, batch = (64, 256) if gpu else (16, 64)
    checkpoint = Path(tempfile.mkdtemp(prefix="ddp-cpu-")) / "ddp_train.pt"     # not left in the working directory
    common = ["--epochs", 2, "--steps", args.steps, "--batch-size", batch, "--width", width, "--limit", 20_000,
              "--checkpoint", checkpoint]
    runs = {nproc: [], 1: []}
    others = []
    sweep = {}
    for _ in range(args.rounds):
        for n in (nproc, 1):
            extra = ["--thread-sweep", *sorted({threads_per_rank(nproc), usable_cores()})] if n == nproc else []
            with CpuUse() as cpu:
                result = torchrun("ddp_train.py", *common, *extra, nproc=n, backend=backend, device="cuda" if gpu else "cpu",
                                  timeout_s=1800, echo=False).result
            others.append(cpu.others_cores)
            runs[n].append(job_samples_per_s(result))
            for rank in result["per_rank"]:
                for point in rank.get("thread_sweep", []):
                    sweep.setdefault(point["threads"], []).append(point["samples_per_s"])
            print(f"  {n} process(es): {runs[n][-1]:,.0f} samples/s ({cpu})")
    ddp, solo = statistics.median(runs[nproc]), statistics.median(runs[1])
    sweep = {t: sum(v) / args.rounds for t, v in sweep.items()}
    print(f"DDP, {nproc} processes x batch {batch}: {ddp:,.0f} samples/s; 1 process: {solo:,.0f}; "
          f"ratio {ddp / solo:.2f}x; other processes took {statistics.median(others):.2f} cores (median)")
    for t, sps in sorted(sweep.items()):
        print(f"  {t} thread(s) per rank: {sps:,.0f} samples/s")
    out = {"hardware": hardware, "nproc": nproc, "backend": backend,
           "allreduce": {"latency_s": fit.latency_s, "bandwidth": fit.bandwidth, "n": fit.n,
                         "points": bench["results"], "relative_residuals": fit.relative_residuals},
           "ddp_samples_per_s": runs[nproc], "one_process_samples_per_s": runs[1], "thread_sweep": sweep,
           "others_cores": others, "width": width, "batch": batch}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
