"""Lesson 07: a program with a classic DDP bug, to see what a hang looks like.

    torchrun --standalone --nproc_per_node=2 ddp_hang.py --timeout 3
    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc_per_node=2 ddp_hang.py --timeout 3

The data is split by hand, unevenly: rank 0 has one batch more than rank 1 (what happens without
DistributedSampler's padding, e.g. with a hand-made split or a reader that does not pad its
last shard). Rank 0 therefore runs one more training step, and that step's backward pass
all-reduces the gradients. Rank 1 has finished its epoch and waits at the barrier before the
checkpoint. Each waits for a partner that is doing something else:

- by default both wait until the process group's timeout (`init_process_group(timeout=)`:
  30 minutes for gloo unless you set it, 10 for nccl), then fail with a message about a
  timed-out receive that does not name the mistake;
- with `TORCH_DISTRIBUTED_DEBUG=DETAIL` every collective is first compared with the other
  ranks' (which call, which shapes and dtypes), and the mismatch is reported at once, naming
  both calls.

The lesson runs it on gloo with CPU ranks on every machine. On nccl the same bug behaves
otherwise: nccl does not compare the calls (its barrier is itself an all-reduce, which can pair
up with rank 0's), so it may not hang at all, and where a collective does wait, the watchdog
reports "Watchdog caught collective operation timeout: WorkNCCL(...)" after the timeout and
aborts the process instead of raising an exception.

The gradients are averaged here by hand, with the very all-reduce DDP issues in backward (a
`DistributedDataParallel` would behave the same; with torch 2.14.1's CPU build, DDP's
constructor crashes when TORCH_DISTRIBUTED_DEBUG=DETAIL is set, so this program does without it).
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_utils.launch import init_process_group


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=1800, help="the process group's timeout, seconds")
    parser.add_argument("--batches", type=int, default=3, help="rank 1's batches (rank 0 gets one more)")
    args = parser.parse_args()
    device = init_process_group(timeout_s=args.timeout)     # the lesson runs it on gloo, CPU ranks
    rank = dist.get_rank()
    print(f"rank {rank}: TORCH_DISTRIBUTED_DEBUG={os.environ.get('TORCH_DISTRIBUTED_DEBUG', 'OFF')}, "
          f"collective timeout {args.timeout:g} s", flush=True)

    torch.manual_seed(0)                                          # the same start on every rank
    model = torch.nn.Linear(8, 4).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    my_batches = args.batches + (1 if rank == 0 else 0)          # THE BUG: uneven shards
    for step in range(my_batches):
        x, y = torch.randn(16, 8, device=device), torch.randint(0, 4, (16,), device=device)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(grads)                                    # what DDP does in backward
        grads /= dist.get_world_size()
        torch.nn.utils.vector_to_parameters(grads, [p.grad for p in model.parameters()])
        optimizer.step()
        print(f"rank {rank}: step {step} done", flush=True)
    print(f"rank {rank}: epoch over, waiting at the barrier before the checkpoint", flush=True)
    dist.barrier()
    print(f"rank {rank}: past the barrier (this line should never print)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
