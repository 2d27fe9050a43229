"""Lesson 07: your answers to exercises 7.2-7.4, together in one DDP program.

    torchrun --standalone --nproc_per_node=2 ddp_exercises.py --train ddp_train_yours.py \
        --metrics metrics_yours.py --accumulate accumulate_yours.py

Every rank runs this file:

1. `train_ddp` (exercise 7.2) trains a small CIFAR ResNet-18 on this rank's share of a CIFAR-10
   subset, writes the checkpoint from rank 0 and reads it back on every rank;
2. `global_metrics` (exercise 7.3) turns each rank's counts on its part of the test set into the
   test loss and accuracy of the whole test set, the same on every rank;
3. `accumulate` (exercise 7.4) accumulates one step's gradients over micro-batches, and the
   program counts DDP's all-reduces and compares `.grad` with one backward of the whole batch.

Each part uses the learner's function from the file given, or, where that exercise is not done
yet (its function raises NotImplementedError), the course's own (`course_train_ddp`,
`course_global_metrics`, `course_accumulate` below), and says which it used. Rank 0 reports.
"""
import argparse
import contextlib
import gc
import importlib.util
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from course_utils.data import prepare_cifar10
from course_utils.device_data import cifar10_on_device, normalize_batch
from course_utils.launch import init_process_group, report
from course_utils.models import resnet18_cifar
from course_utils.train import train

GRADING_ENV = "COURSE_GRADING_RANKS"       # set by the checks' ranks: the course's answers refuse to run there


def _not_for_grading(name):
    if os.environ.get(GRADING_ENV):
        raise RuntimeError(f"{name} is the course's implementation: the check grades your own code")


# -- the course's answers (used where an exercise is not done yet) ---------------------------------

def course_train_ddp(make_model, dataset, *, device, epochs, batch_size, lr, seed, checkpoint):
    """Exercise 7.2, the course's answer."""
    _not_for_grading("course_train_ddp")
    model = make_model().to(device)
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=lr)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        train(ddp_model, loader, device=device, optimizer=optimizer, epochs=1, progress=False)
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), checkpoint)
    dist.barrier()
    model.load_state_dict(torch.load(checkpoint, map_location=device))
    return model


def collective_device():
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def course_global_metrics(loss_sum, correct, count):
    """Exercise 7.3, the course's answer."""
    _not_for_grading("course_global_metrics")
    totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=collective_device())
    dist.all_reduce(totals)
    loss_sum, correct, count = totals.tolist()
    if count == 0:
        return math.nan, math.nan
    return loss_sum / count, correct / count


def course_accumulate(ddp_model, micro_batches, loss_fn):
    """Exercise 7.4, the course's answer."""
    _not_for_grading("course_accumulate")
    ddp_model.zero_grad(set_to_none=True)
    total = sum(len(images) for images, _ in micro_batches)
    loss_total = 0.0
    for i, (images, labels) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else ddp_model.no_sync():
            loss = loss_fn(ddp_model(images), labels) * (len(images) / total)
            loss.backward()
        loss_total = loss_total + loss.detach()      # on the device: no host sync per micro-batch
    return float(loss_total)


# -- running the learner's, or the course's --------------------------------------------------------

def learner_function(path, name):
    """The function `name` from the learner's file, or None if there is no such file."""
    if not path or not Path(path).is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"yours_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name, None)


def run(yours, course, *args, **kwargs):
    """Call the learner's function; the course's if it is missing or not implemented yet.
    Every rank gets the same answer to 'not implemented' (the stub raises before any collective)."""
    if yours is not None:
        try:
            return yours(*args, **kwargs), "yours"
        except NotImplementedError:
            pass
    return course(*args, **kwargs), "the course's (exercise not done yet)"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", help="the file of exercise 7.2 (train_ddp)")
    p.add_argument("--metrics", help="the file of exercise 7.3 (global_metrics)")
    p.add_argument("--accumulate", help="the file of exercise 7.4 (accumulate)")
    p.add_argument("--limit", type=int, default=512, help="training records; the test set gets a fifth as many")
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--checkpoint", required=True, help="where rank 0 writes the checkpoint (a path every rank sees)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main():
    args = parse_args()
    device = init_process_group(timeout_s=120)
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world} (local rank {os.environ.get('LOCAL_RANK')}), backend {dist.get_backend()}, "
          f"device {device}", flush=True)
    if rank == 0:
        prepare_cifar10()
    dist.barrier()
    images, labels = cifar10_on_device("cpu", train=True, limit=args.limit)
    dataset = TensorDataset(*normalize_batch(images, labels))
    used = {}

    # 1. exercise 7.2: train, checkpoint from rank 0, read back everywhere
    def make_model():
        torch.manual_seed(args.seed + rank)          # different on every rank: DDP makes them agree
        return resnet18_cifar(width=args.width)

    trained, used["7.2"] = run(learner_function(args.train, "train_ddp"), course_train_ddp, make_model, dataset,
                             device=device, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                             seed=args.seed, checkpoint=args.checkpoint)
    flat = torch.cat([p.detach().double().flatten() for p in trained.parameters()])
    spread = torch.stack([flat.sum(), -flat.sum()]).to(device)
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    same_weights = bool(spread[0] + spread[1] == 0)

    # 2. exercise 7.3: each rank counts its part of the test set; global_metrics combines them
    test_images, test_labels = cifar10_on_device("cpu", train=False, limit=max(args.limit // 5, 64))
    mine = list(range(rank, len(test_labels), world))
    trained.eval()
    with torch.no_grad():
        x, y = normalize_batch(test_images[mine].to(device), test_labels[mine].to(device))
        logits = trained(x)
        loss_sum = F.cross_entropy(logits, y, reduction="sum").item()
        correct = int((logits.argmax(1) == y).sum().item())
    (test_loss, accuracy), used["7.3"] = run(learner_function(args.metrics, "global_metrics"), course_global_metrics,
                                             loss_sum, correct, len(mine))
    everyone = [None] * world
    dist.all_gather_object(everyone, (test_loss, accuracy))

    # 3. exercise 7.4: accumulate one step over micro-batches; count DDP's all-reduces. A fresh copy of the
    # trained model: train_ddp's own DDP wrapper may still hold hooks on the trained model's parameters
    model = resnet18_cifar(width=args.width).to(device)
    model.load_state_dict(trained.state_dict())
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    reduced_in = set()
    backward_no = [0]
    ddp.register_forward_pre_hook(lambda *_: backward_no.__setitem__(0, backward_no[0] + 1))

    def counting_hook(state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        reduced_in.add(backward_no[0])
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counting_hook)
    model.eval()        # BatchNorm then normalises every micro-batch as it does the whole batch
    batch_x, batch_y = dataset[rank * 64:(rank + 1) * 64]
    batch_x, batch_y = batch_x.to(device), batch_y.to(device)
    F.cross_entropy(ddp(batch_x), batch_y).backward()        # the whole batch at once: the reference
    reference = [p.grad.detach().clone() for p in model.parameters()]
    reduced_in.clear()
    micro = list(zip(batch_x.tensor_split(args.micro_batches), batch_y.tensor_split(args.micro_batches)))
    step_loss, used["7.4"] = run(learner_function(args.accumulate, "accumulate"), course_accumulate, ddp, micro,
                                 F.cross_entropy)
    difference = max(float((p.grad - r).abs().max()) for p, r in zip(model.parameters(), reference)
                     if p.grad is not None)
    scale = max(float(r.abs().max()) for r in reference)

    report({"world_size": world, "backend": dist.get_backend(), "device": str(device), "used": used,
            "same_weights": same_weights, "test_images": len(test_labels), "per_rank_metrics": everyone,
            "micro_batches": args.micro_batches, "backwards_that_all_reduced": len(reduced_in),
            "grad_difference": difference, "grad_scale": scale, "step_loss": step_loss})
    # Free every DDP (train_ddp's own included, which may linger in a reference cycle) while Python
    # is fully alive: left to the interpreter's exit, gloo's threads can be torn down holding work
    # that refers to Python objects, and a run that went well ends in SIGABRT (as ddp_train.py found)
    del ddp, model, trained
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
