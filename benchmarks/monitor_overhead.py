"""How much does UtilizationMonitor slow a training loop? (a benchmark, not a test)

    .venv/bin/python benchmarks/monitor_overhead.py [--rounds 6] [--steps 60]

Trains the tiny CNN on CPU-resident random batches (on the GPU when there is one) through the
course's training loop, alternating rounds without and with a monitor sampling every 100 ms,
and reports the median step time of each and the overhead in percent. Alternating rounds in
one run cancels slow drifts of the machine; the target is an overhead under 1%. Because that
difference is often smaller than the noise between rounds, it also times the sampler itself
(one sample, repeated) and reports the share of one core it takes at the chosen interval: an
upper bound on what the monitor can take from the loop.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch

from course_utils.env import device_label, pick_device
from course_utils.models import TinyCNN
from course_utils.monitor import UtilizationMonitor
from course_utils.train import train


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--interval", type=float, default=0.1)
    args = parser.parse_args(argv)

    device = pick_device()
    torch.manual_seed(0)
    model = TinyCNN().to(device)
    x = torch.randn(128, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (128,), device=device)
    train(model, itertools.repeat((x, y)), device=device, steps=10, progress=False)  # warm-up
    plain, monitored = [], []
    for _ in range(args.rounds):
        r = train(model, itertools.repeat((x, y)), device=device, steps=args.steps, progress=False)
        plain.append(r.stats.step_time_ms)
        with UtilizationMonitor(interval_s=args.interval):
            r = train(model, itertools.repeat((x, y)), device=device, steps=args.steps, progress=False)
        monitored.append(r.stats.step_time_ms)
    a, b = statistics.median(plain), statistics.median(monitored)
    print(f"device: {device_label(device)}")
    print(f"median step time without monitor: {a:.3f} ms, with monitor every {args.interval * 1e3:.0f} ms: {b:.3f} ms")
    print(f"overhead: {100 * (b - a) / a:+.2f}% over {args.rounds} alternating rounds of {args.steps} steps "
          f"(rounds differ by up to {100 * (max(plain) - min(plain)) / a:.1f}% among themselves)")
    mon = UtilizationMonitor(interval_s=args.interval)
    mon.start()
    mon._stop.set()   # stop the background thread; sample by hand below
    mon._thread.join()
    t0 = time.perf_counter()
    for _ in range(500):
        mon._sample()
    per_sample_s = (time.perf_counter() - t0) / 500
    print(f"one sample costs {per_sample_s * 1e6:.0f} us: {100 * per_sample_s / args.interval:.3f}% of one core "
          f"at one sample every {args.interval * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
