"""The figures of issue 14's sections, in one run (a benchmark, not a test):

    .venv/bin/python benchmarks/io_storage_decoders.py [--images-per-class 20] [--repeats 3]

- lesson 01, "Is it I/O?": the training files read cold (dropped from the page cache), warm
  and from a RAM disk; the disk's capacity for random 110 kB reads; three recorded runs
  (every sample from the disk, the baseline, the ceiling) with their figures;
- lesson 04: single-thread JPEG decoding with PIL, torchvision.io, simplejpeg and OpenCV on
  the generated JPEG folder; the six storage formats (size on disk, per-image read cost cold
  and warm, decode cost).

Each measurement is repeated `--repeats` times and the median printed, with the machine's
description; run it on a quiet machine (it says how many cores other programs used).
"""
from __future__ import annotations

import argparse
import io
import itertools
import statistics
import time
import warnings

import numpy as np
import torch
from torch.utils.data import DataLoader

from course_utils import data, io_probe, storage
from course_utils.env import device_label, print_env
from course_utils.hardware import disk_of
from course_utils.jpeg_folder import jpeg_folder
from course_utils.loaders import CpuUse
from course_utils.sim import default_sim
from course_utils.train import train


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def io_section(repeats: int) -> None:
    info = data.prepare_cifar10()
    files = [info.root / name for name in data.TRAIN_FILES]
    print(f"\n== Is it I/O? (lesson 01): {sum(f.stat().st_size for f in files) / 1e6:.0f} MB of training files on "
          f"{disk_of(files[0]).label}")
    cold, warm, ram, cap = [], [], [], []
    for _ in range(repeats):
        r = io_probe.cold_and_warm_read(files)
        cold.append(r.cold.mb_per_s if r.cold else None)
        warm.append(r.warm.mb_per_s)
        rd = io_probe.ram_disk_read(files)
        ram.append(rd.mb_per_s if rd else None)
        cap.append(io_probe.disk_capacity(files, 110_000, readers=4, seconds=1.0).mb_per_s)
    print(f"read cold {_median(cold) or float('nan'):,.0f} MB/s, warm {_median(warm):,.0f} MB/s, RAM disk "
          f"{_median(ram) or float('nan'):,.0f} MB/s; random 110 kB reads, 4 in flight: {_median(cap):,.0f} MB/s "
          f"(medians of {repeats})")
    sim = default_sim()
    runs = {
        "every sample from the disk": lambda: DataLoader(io_probe.ColdRecords(files), batch_size=128, shuffle=True),
        "the baseline": lambda: DataLoader(data.CIFAR10Binary(train=True, transform=data.baseline_transform(),
                                                              limit=62 * 128), batch_size=128, shuffle=True),
        "the ceiling": lambda: itertools.repeat((torch.zeros(128, 3, 32, 32), torch.zeros(128, dtype=torch.long))),
    }
    for name, make in runs.items():
        io_probe.evict(files)
        with CpuUse() as cpu, io_probe.IoMonitor(files[0], interval_s=0.05) as mon:
            result = train(None, make(), device=sim, steps=60, progress=False)
        run = io_probe.RecordedRun.from_timeline(name, mon.timeline, stall_fraction=result.stats.stall_fraction,
                                                 loader_processes=1)
        print(f"{name:28s} {result.stats.samples_per_s:8,.0f} samples/s; {run.figures()}; "
              f"other programs used {cpu.others_cores:.1f} cores")
    print(f"(steps on {device_label(sim)})")


def decoder_section(folder, repeats: int) -> None:
    import cv2
    import simplejpeg
    from PIL import Image
    from torchvision.io import decode_jpeg

    cv2.setNumThreads(1)
    encoded = [f.read_bytes() for f in folder.files]
    tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in encoded]
    pixels = np.mean([np.prod(simplejpeg.decode_jpeg_header(b)[:2]) for b in encoded])
    decoders = {
        "PIL": lambda: [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in encoded],
        "torchvision.io": lambda: [decode_jpeg(t) for t in tensors],
        "simplejpeg": lambda: [simplejpeg.decode_jpeg(b, colorspace="RGB") for b in encoded],
        "OpenCV (BGR->RGB)": lambda: [cv2.cvtColor(cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR),
                                                   cv2.COLOR_BGR2RGB) for b in encoded],
    }
    rates = {}
    for name, fn in decoders.items():
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        rates[name] = len(encoded) / statistics.median(times)
    print(f"\n== JPEG decoding, 1 thread (lesson 04): {len(encoded)} JPEGs of ~{pixels / 1e3:.0f} kpixels, "
          f"{device_label('cpu')}")
    print(" / ".join(f"{name} {rate:,.0f}" for name, rate in rates.items()) + " images/s; OpenCV = "
          f"{rates['OpenCV (BGR->RGB)'] / rates['PIL']:.2f}x PIL")


def storage_section(folder, repeats: int) -> None:
    images = storage.images_for_storage(folder.files, 224)
    stored = storage.write_formats(images, data.data_home() / "storage-formats-benchmark")
    runs = [storage.measure_formats(stored, random_reads=500, rounds=3) for _ in range(repeats)]
    print(f"\n== Storage formats (lesson 04): {len(images)} images of 224x224 on {disk_of(data.data_home()).label}; "
          f"medians of {repeats} runs of 3 rounds each (the lesson's measurement); microseconds per image")
    print(f"{'format':36s} {'kB/image':>8s} {'cold':>7s} {'warm':>7s} {'rnd cold':>8s} {'rnd warm':>8s} {'decode':>7s}")
    for k, r in enumerate(runs[0]):
        same = [run[k] for run in runs]
        print(f"{r.description:36s} {r.bytes_per_image / 1e3:8.1f} {_median(x.read_cold_us for x in same) or 0:7.1f} "
              f"{_median(x.read_warm_us for x in same):7.1f} {_median(x.random_cold_us for x in same) or 0:8.1f} "
              f"{_median(x.random_warm_us for x in same):8.1f} {_median(x.decode_us for x in same):7.0f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images-per-class", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    print_env()
    with CpuUse() as cpu:
        io_section(args.repeats)
        folder = jpeg_folder(images_per_class=args.images_per_class, short_side=(160, 320))
        decoder_section(folder, args.repeats)
        storage_section(folder, args.repeats)
    print(f"\nother programs used {cpu.others_cores:.1f} cores on average during the whole run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
