"""Lesson 07: the smallest distributed program. Every process torchrun starts runs this file.

    torchrun --standalone --nproc_per_node=2 ddp_hello.py

torchrun gives each process its identity in environment variables (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT); `init_process_group` reads them ("env://") and
connects every process to the others. Then the ranks talk through *collectives*: calls that
every rank of the group makes, in the same order.
"""
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from course_utils.launch import backend, rank_device, report


def main():
    rank = int(os.environ["RANK"])               # which process this is, 0 .. WORLD_SIZE-1
    local_rank = int(os.environ["LOCAL_RANK"])   # which process on *this machine*: the GPU index
    world_size = int(os.environ["WORLD_SIZE"])
    device = rank_device()                       # cuda:LOCAL_RANK when the ranks have GPUs, else the CPU
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # with nccl, bind the group to this rank's GPU (device_id): its first barrier then uses it
    dist.init_process_group(backend(), timeout=timedelta(seconds=60),
                            device_id=device if backend() == "nccl" else None)
    print(f"rank {rank} of {world_size} (local rank {local_rank}) on {socket.gethostname()}, "
          f"pid {os.getpid()}, backend {dist.get_backend()}, device {device}, "
          f"{torch.get_num_threads()} thread(s)")

    # all_reduce: every rank contributes a tensor and every rank gets the sum
    x = torch.tensor([float(rank)], device=device)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    # broadcast: rank 0's tensor is copied to every rank
    seed = torch.tensor([1234 if rank == 0 else -1], device=device)
    dist.broadcast(seed, src=0)
    # all_gather_object: every rank gets a list of every rank's Python object
    who = [None] * world_size
    dist.all_gather_object(who, {"rank": rank, "pid": os.getpid(), "host": socket.gethostname()})
    print(f"rank {rank}: all_reduce(sum of ranks) = {x.item():g}, broadcast seed = {seed.item()}")
    dist.barrier()
    report({"world_size": world_size, "backend": dist.get_backend(), "sum_of_ranks": x.item(),
            "seed": int(seed.item()), "ranks": who, "threads": torch.get_num_threads()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
