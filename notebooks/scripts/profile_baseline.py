"""Train lesson 01's baseline for a few steps: the program to run under a profiler (lesson 01).

    python notebooks/scripts/profile_baseline.py --steps 50
    python -m cProfile -o profiles/baseline.prof notebooks/scripts/profile_baseline.py --steps 50
    nsys profile --trace=cuda,nvtx,osrt --sample=cpu --output=profiles/baseline --force-overwrite=true \
        python notebooks/scripts/profile_baseline.py --steps 60 --nvtx

The baseline: CIFAR-10 from its binary files, pad-crop-flip-normalise in torchvision, a
DataLoader with `--workers` workers (0 by default), the course's one training loop. With a GPU
the ResNet-18 trains on it; without one the step is the simulated accelerator (labelled so).
`--nvtx` (GPU only) marks each wait for a batch as an NVTX range named "data", which Nsight
Systems shows on the main thread's row.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # course_utils, when run from anywhere

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from course_utils import data  # noqa: E402
from course_utils.env import device_label, pick_device  # noqa: E402
from course_utils.models import resnet18_cifar  # noqa: E402
from course_utils.sim import default_sim  # noqa: E402
from course_utils.train import train  # noqa: E402


def nvtx_batches(loader):
    """Yield the loader's batches, each wait for one marked as an NVTX range "data"."""
    iterator = iter(loader)
    while True:
        torch.cuda.nvtx.range_push("data")
        try:
            batch = next(iterator)
        except StopIteration:
            return
        finally:
            torch.cuda.nvtx.range_pop()
        yield batch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="records to load (all 50,000 by default)")
    parser.add_argument("--nvtx", action="store_true", help="mark data waits as NVTX ranges (GPU only)")
    args = parser.parse_args(argv)
    device = pick_device()
    on_gpu = device.type == "cuda"
    run_on, model = (device, resnet18_cifar()) if on_gpu else (default_sim(), None)
    dataset = data.CIFAR10Binary(train=True, transform=data.baseline_transform(), limit=args.limit)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                        pin_memory=on_gpu, drop_last=True)
    if args.nvtx and not on_gpu:
        print("--nvtx needs a GPU (NVTX ranges are for Nsight Systems' CUDA timeline): ignored here")
    batches = nvtx_batches(loader) if args.nvtx and on_gpu else loader
    result = train(model, batches, device=run_on, steps=args.steps, progress=False, desc="baseline")
    print(f"{result.steps} steps on {device_label(run_on)}: {result.stats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
