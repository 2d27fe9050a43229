"""Lesson 07: how long does an all-reduce take, against the size of the tensor?

    torchrun --standalone --nproc_per_node=2 allreduce_bench.py --sizes 4096 65536 1048576

Each size is timed the way lesson 01 times anything: warm-up first, every rank starts together
(a barrier), the device is synchronised before the clock is read (on GPUs), and the median of
several repeats is kept. A collective is as slow as its slowest rank, so each repeat counts the
longest time any rank saw (an all_reduce with MAX). Rank 0 reports the times in seconds.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

from course_utils.launch import init_process_group, report


def time_all_reduce(numel, repeats, warmup, device):
    tensor = torch.ones(numel, dtype=torch.float32, device=device)
    worst = torch.zeros(1, dtype=torch.float64, device=device)
    times = []
    for i in range(warmup + repeats):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        worst.fill_(time.perf_counter() - t0)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)     # the slowest rank sets the pace
        if i >= warmup:
            times.append(worst.item())
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", required=True, help="tensor sizes in bytes (float32)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()

    device = init_process_group(timeout_s=120)      # this rank's device, the group bound to it on nccl
    results = []
    for size in args.sizes:
        seconds = time_all_reduce(max(1, size // 4), args.repeats, args.warmup, device)
        results.append({"bytes": max(1, size // 4) * 4, "seconds": seconds})
        if dist.get_rank() == 0:
            print(f"{results[-1]['bytes']:>12,d} bytes: {seconds * 1e3:9.3f} ms "
                  f"({results[-1]['bytes'] / seconds / 1e9:6.2f} GB/s of tensor)")
    report({"world_size": dist.get_world_size(), "backend": dist.get_backend(), "device": str(device),
            "results": results})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
