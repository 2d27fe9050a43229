"""How far apart two CORRECT pipelines' accuracies land: what lesson 08's parity tolerance is set from.

    .venv/bin/python benchmarks/parity_tolerance.py --steps 60 --repeats 12

Each repeat runs `course_utils.parity.accuracy_parity` with a new seed, comparing the baseline's
pipeline (torchvision in DataLoader workers) with the device-resident one (`AugmentBatch` on
uint8 batches): both correct, so their accuracy difference is the noise of training alone. It
prints every pair and the mean, standard deviation and largest absolute value of the
difference; `parity.TOLERANCE` is set to about 3.5 standard deviations (a correct pipeline then
fails about once in 2,000 runs) and `parity.MEASURED` records the run. Writes the numbers as
JSON with `--json FILE`. `--marked` trains on CIFAR-10 marked as lesson 08's check marks it
(each image's index in two pixels, no zero pixel: `checks.lesson08.marked_cifar`), to show the
tolerance holds for the check's parity runs too.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from course_utils.env import device_label
from course_utils.ladder import device_resident_pipeline
from course_utils.parity import TOLERANCE, accuracy_parity


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60, choices=sorted(TOLERANCE))
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--device", help="as COURSE_DEVICE: sim (default without a GPU), cpu, cuda")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--marked", action="store_true", help="train on CIFAR-10 marked as lesson 08's check does")
    args = parser.parse_args(argv)
    images = None
    if args.marked:
        from course_utils.checks.lesson08 import marked_cifar
        images = marked_cifar(args.steps)
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.repeats):
        t0 = time.perf_counter()
        result = accuracy_parity(device_resident_pipeline, device=args.device, steps=args.steps, seed=seed,
                                 training_images=images)
        rows.append(result.as_dict())
        print(f"seed {seed:2d}: baseline's pipeline {result.baseline:.3f}, device-resident {result.yours:.3f}, "
              f"difference {result.difference:+.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    diffs = [r["difference"] for r in rows]
    summary = {"steps": args.steps, "repeats": args.repeats, "mean": statistics.fmean(diffs),
               "sd": statistics.stdev(diffs), "max_abs": max(abs(d) for d in diffs),
               "baseline_range": [min(r["baseline"] for r in rows), max(r["baseline"] for r in rows)],
               "device": rows[0]["device"], "host": device_label("cpu"), "tolerance_now": TOLERANCE[args.steps],
               "marked": args.marked}
    print(f"difference over {args.repeats} seeds: mean {summary['mean']:+.3f}, sd {summary['sd']:.3f}, largest "
          f"{summary['max_abs']:.3f}; 3.5 sd = {3.5 * summary['sd']:.3f} (tolerance now {TOLERANCE[args.steps]})")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
