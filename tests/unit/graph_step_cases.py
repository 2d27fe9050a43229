"""Exercise 5.5's right and wrong answers, as data: each case is a make_graphed_step written the way a
learner might, with the verdict a real GPU capture gives it and the property check 5.5 names.

One importable place for every use:
- tests/unit/test_checks_lesson05_graphs.py grades each through check 5.5 on the CPU (the emulated
  capture on the virtual CUDA device), on several seeds;
- on a GPU (issue 38), `python tests/unit/graph_step_cases.py --device cuda` grades each case through
  the real torch.cuda.graph and prints its verdict beside the emulation's (`compare()`).

`Case.expected` is "pass", "fail" (then `prop` is the property check 5.5 names) or "error" (the
learner's code raises, as it raises on a GPU; `words` must be in the message). `optimizer` picks the
optimizer a scenario hands over: "sgd" and "adam" (capturable) are the check's own; a case with
"adam-not-capturable" is graded by `grade_scenario` only (the check never hands one out).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F


@dataclass
class Case:
    name: str
    answer: object
    expected: str                 # "pass", "fail" or "error"
    prop: str = ""                # the property check 5.5 names ("fail")
    words: str = ""               # more words the message must hold
    optimizer: str = "sgd"        # what grade_scenario hands over: "sgd", "adam", "adam-not-capturable"
    why: str = ""                 # what a GPU does with it

    def __repr__(self) -> str:   # pytest ids
        return self.name


# -- the pieces answers are made of -----------------------------------------------------------------

def _warm(model, optimizer, images, labels, warmup):
    for _ in range(warmup):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()


def _warm_on_side_stream(model, optimizer, images, labels, warmup, side=None):
    side = side or torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _warm(model, optimizer, images, labels, warmup)
    torch.cuda.current_stream().wait_stream(side)
    return side


def _capture(model, optimizer, images, labels, *, during=None, zero_grad=True, **graph_kwargs):
    graph = torch.cuda.CUDAGraph()
    if zero_grad:
        optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph, **graph_kwargs):
        loss = F.cross_entropy(model(images), labels)
        if during is not None:
            during(loss)
        loss.backward()
        optimizer.step()
    return graph, loss


def _stepper(graph, images, labels, loss, *, after=None, returns=None):
    def step(batch_images, batch_labels):
        if batch_images.shape != images.shape or batch_labels.shape != labels.shape:
            raise ValueError(f"the graph replays {tuple(images.shape)}; got {tuple(batch_images.shape)}")
        images.copy_(batch_images)
        labels.copy_(batch_labels)
        graph.replay()
        out = loss.detach().clone()
        if after is not None:
            after(out)
        return returns(out) if returns is not None else out
    return step


# -- right answers ------------------------------------------------------------------------------------

def right(model, optimizer, example_images, example_labels, warmup=3):
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


def right_empty_like(model, optimizer, example_images, example_labels, warmup=3):
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = torch.empty_like(example_images), torch.empty_like(example_labels)
    images.copy_(example_images)
    labels.copy_(example_labels)
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


def right_pool_stream_thread_local(model, optimizer, example_images, example_labels, warmup=3):
    """torch.cuda.graph's documented arguments: a pool handle, the warm-up's stream, thread_local."""
    side = _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels, pool=torch.cuda.graph_pool_handle(), stream=side,
                           capture_error_mode="thread_local")
    return _stepper(graph, images, labels, loss)


def right_relaxed(model, optimizer, example_images, example_labels, warmup=3):
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels, capture_error_mode="relaxed")
    return _stepper(graph, images, labels, loss)


def right_records_an_event(model, optimizer, example_images, example_labels, warmup=3):
    """A CUDA event recorded after each replay (to time it later): no wait for the device."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)
    events = []

    def record(_):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        events.append(event)
    return _stepper(graph, images, labels, loss, after=record)


def right_zero_grad_inside(model, optimizer, example_images, example_labels, warmup=3):
    """zero_grad(set_to_none=True) as the captured step's first line: the gradients are None at once."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
    return _stepper(graph, images, labels, loss)


def right_by_hand_capture_begin(model, optimizer, example_images, example_labels, warmup=3):
    """capture_begin/capture_end on a side stream, without the context manager."""
    side = _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.stream(side):
        graph.capture_begin()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    return _stepper(graph, images, labels, loss)


def right_graphs_module_names(model, optimizer, example_images, example_labels, warmup=3):
    """torch.cuda.graphs.CUDAGraph and torch.cuda.graphs.graph: the paths the API docs render (x-05 F6)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph = torch.cuda.graphs.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graphs.graph(graph):
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
    return _stepper(graph, images, labels, loss)


def right_accelerator_streams(model, optimizer, example_images, example_labels, warmup=3):
    """torch.Stream and torch.accelerator.current_stream() (torch 2.6+) for the warm-up (x-05 F6)."""
    side = torch.Stream(device=example_images.device)
    side.wait_stream(torch.accelerator.current_stream())
    with side:
        _warm(model, optimizer, example_images, example_labels, warmup)
    torch.accelerator.current_stream().wait_stream(side)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


def right_zeros_default_dtype(model, optimizer, example_images, example_labels, warmup=3):
    """torch.zeros(shape, device=...) without dtype=: float32, as the batches are (x-05 F4)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images = torch.zeros(example_images.shape, device=example_images.device)
    labels = torch.zeros(example_labels.shape, device=example_labels.device, dtype=torch.long)
    images.copy_(example_images)
    labels.copy_(example_labels)
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


def right_empty_like_unfilled(model, optimizer, example_images, example_labels, warmup=3):
    """Static buffers from torch.empty_like, not filled before the capture: a capture runs nothing, and the
    first replay reads the first batch copied in (x-05 F5)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = torch.empty_like(example_images), torch.empty_like(example_labels)
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


def right_zeros_like_buffers(model, optimizer, example_images, example_labels, warmup=3):
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = torch.zeros_like(example_images), torch.zeros_like(example_labels)
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


def right_event_query(model, optimizer, example_images, example_labels, warmup=3):
    """event.record(); event.query() after each replay: a poll, not a wait (x-05 F9)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)
    event = torch.cuda.Event()

    def poll(_):
        event.record()
        event.query()
    return _stepper(graph, images, labels, loss, after=poll)


def right_warmup_on_the_current_stream(model, optimizer, example_images, example_labels, warmup=3):
    """The warm-up on the caller's stream: PyTorch's docs use a side stream, CUDA does not refuse this."""
    _warm(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


def right_zero_fill_inside(model, optimizer, example_images, example_labels, warmup=3):
    """zero_grad(set_to_none=False) inside the capture: the zero fill is replayed with the step."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        optimizer.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
    return _stepper(graph, images, labels, loss)


def right_cuda_literal(model, optimizer, example_images, example_labels, warmup=3):
    """device="cuda": the current device, which is where the caller's batch lives (walk w2-05)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images = torch.zeros(example_images.shape, dtype=example_images.dtype, device="cuda")
    labels = torch.zeros(example_labels.shape, dtype=example_labels.dtype, device="cuda")
    images.copy_(example_images)
    labels.copy_(example_labels)
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


def right_replays_on_its_stream_with_waits(model, optimizer, example_images, example_labels, warmup=3):
    """The replay on the capture's stream, ordered with the caller's by wait_stream both ways."""
    side = _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels, stream=side)

    def step(batch_images, batch_labels):
        if batch_images.shape != images.shape or batch_labels.shape != labels.shape:
            raise ValueError("another shape")
        images.copy_(batch_images)
        labels.copy_(batch_labels)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            graph.replay()
        torch.cuda.current_stream().wait_stream(side)
        return loss.detach().clone()
    return step


# -- streams ------------------------------------------------------------------------------------------

def replays_on_its_stream_unordered(model, optimizer, example_images, example_labels, warmup=3):
    """The replay on the capture's stream; the caller's stream never waits for it, nor it for the caller's
    copy: on a GPU the clone and the next copy_ race the replay (x-05 F3)."""
    side = _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels, stream=side)

    def step(batch_images, batch_labels):
        if batch_images.shape != images.shape or batch_labels.shape != labels.shape:
            raise ValueError("another shape")
        images.copy_(batch_images)
        labels.copy_(batch_labels)
        with torch.cuda.stream(side):
            graph.replay()
        return loss.detach().clone()
    return step


def right_no_wait_after_the_warmup(model, optimizer, example_images, example_labels, warmup=3):
    """The caller's stream never waits for the warm-up's (w5-05, 5.5-24): torch.cuda.graph synchronises the device
    as it begins, so the capture and everything after it see the warm-up's work. A right answer."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _warm(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels, stream=side)

    def step(batch_images, batch_labels):
        if batch_images.shape != images.shape or batch_labels.shape != labels.shape:
            raise ValueError("another shape")
        images.copy_(batch_images)
        labels.copy_(batch_labels)
        graph.replay()
        return loss.detach().clone()
    return step


def warms_up_without_waiting(model, optimizer, example_images, example_labels, warmup=3):
    """The side stream never waits for the caller's before the warm-up (w5-05, 5.5-18): on a GPU the warm-up
    reads a batch and weights the caller's stream may still be writing."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        _warm(model, optimizer, example_images, example_labels, warmup)
    torch.cuda.current_stream().wait_stream(side)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels, stream=side)

    def step(batch_images, batch_labels):
        if batch_images.shape != images.shape or batch_labels.shape != labels.shape:
            raise ValueError("another shape")
        images.copy_(batch_images)
        labels.copy_(batch_labels)
        graph.replay()
        return loss.detach().clone()
    return step


def capture_end_on_another_stream(model, optimizer, example_images, example_labels, warmup=3):
    """capture_begin inside `with torch.cuda.stream(side)`, capture_end after leaving it (x-05 F3)."""
    side = _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.stream(side):
        graph.capture_begin()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
    graph.capture_end()
    return _stepper(graph, images, labels, loss)


# -- host reads inside the capture --------------------------------------------------------------------

def _reads_while_capturing(read):
    def answer(model, optimizer, example_images, example_labels, warmup=3):
        _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
        images, labels = example_images.clone(), example_labels.clone()
        graph, loss = _capture(model, optimizer, images, labels, during=read)
        return _stepper(graph, images, labels, loss)
    return answer


def _print(loss):
    print(loss)


item_while_capturing = _reads_while_capturing(lambda loss: loss.item())
print_while_capturing = _reads_while_capturing(_print)
cpu_while_capturing = _reads_while_capturing(lambda loss: loss.cpu())
tolist_while_capturing = _reads_while_capturing(lambda loss: loss.tolist())
numpy_while_capturing = _reads_while_capturing(lambda loss: loss.detach().numpy())
synchronize_while_capturing = _reads_while_capturing(lambda loss: torch.cuda.synchronize())
event_synchronize_while_capturing = _reads_while_capturing(
    lambda loss: torch.cuda.current_stream().record_event().synchronize())
guard_while_capturing = _reads_while_capturing(lambda loss: bool(torch.isfinite(loss)) or None)


# -- static inputs ------------------------------------------------------------------------------------

def host_static_inputs(model, optimizer, example_images, example_labels, warmup=3):
    """torch.empty(shape, dtype=...) without device=: host memory, a GPU's model cannot read it."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images = torch.empty(example_images.shape, dtype=example_images.dtype)
    labels = torch.empty(example_labels.shape, dtype=example_labels.dtype)
    images.copy_(example_images)
    labels.copy_(example_labels)
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


def _rebinds(rebind):
    def answer(model, optimizer, example_images, example_labels, warmup=3):
        _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
        images, labels = example_images.clone(), example_labels.clone()
        graph, loss = _capture(model, optimizer, images, labels)

        def step(batch_images, batch_labels):
            if batch_images.shape != images.shape or batch_labels.shape != labels.shape:
                raise ValueError("another shape")
            rebind(images, batch_images)
            rebind(labels, batch_labels)
            graph.replay()
            return loss.detach().clone()
        return step
    return answer


def _set_data(static, batch):
    static.data = batch


rebinds_with_data = _rebinds(_set_data)
rebinds_with_set_ = _rebinds(lambda static, batch: static.set_(batch))


def cuda0_written_in(model, optimizer, example_images, example_labels, warmup=3):
    """Static inputs on "cuda:0" whatever the example's device: another GPU when the batch is on cuda:1
    (walk w2-05)."""
    images = torch.empty(example_images.shape, dtype=example_images.dtype, device="cuda:0")
    labels = torch.empty(example_labels.shape, dtype=example_labels.dtype, device="cuda:0")
    images.copy_(example_images)
    labels.copy_(example_labels)
    _warm_on_side_stream(model, optimizer, images, labels, warmup)
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


def clones_inside_the_capture(model, optimizer, example_images, example_labels, warmup=3):
    """The static inputs cloned from the example inside the graph: every replay clones the example again."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        images, labels = example_images.clone(), example_labels.clone()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
    return _stepper(graph, images, labels, loss)


def labels_not_copied(model, optimizer, example_images, example_labels, warmup=3):
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)

    def step(batch_images, batch_labels):
        if batch_images.shape != images.shape or batch_labels.shape != labels.shape:
            raise ValueError("another shape")
        images.copy_(batch_images)
        graph.replay()
        return loss.detach().clone()
    return step


def warms_up_on_random_inputs(model, optimizer, example_images, example_labels, warmup=3):
    """Static inputs filled with random numbers drawn on the device, the warm-up trained on them (walk w2-05)."""
    images = torch.randn_like(example_images)
    labels = torch.randint_like(example_labels, 0, 2)
    _warm_on_side_stream(model, optimizer, images, labels, warmup)
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


def rebinds_the_name(model, optimizer, example_images, example_labels, warmup=3):
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)
    state = {"images": images, "labels": labels}

    def step(batch_images, batch_labels):
        if batch_images.shape != images.shape:
            raise ValueError("another shape")
        state["images"], state["labels"] = batch_images, batch_labels     # new tensors: the graph never sees them
        graph.replay()
        return loss.detach().clone()
    return step


def example_batch_as_inputs(model, optimizer, example_images, example_labels, warmup=3):
    """The caller's example tensors captured as the inputs: every batch is copied over them."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    graph, loss = _capture(model, optimizer, example_images, example_labels)
    return _stepper(graph, example_images, example_labels, loss)


def checks_the_batch_size_only(model, optimizer, example_images, example_labels, warmup=3):
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)

    def step(batch_images, batch_labels):
        if len(batch_images) != len(images):
            raise ValueError("another batch size")
        images.copy_(batch_images)
        labels.copy_(batch_labels)
        graph.replay()
        return loss.detach().clone()
    return step


def checks_the_images_only(model, optimizer, example_images, example_labels, warmup=3):
    """The labels' shape is not checked: 1 label broadcasts into every row (walk w2-05)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)

    def step(batch_images, batch_labels):
        if batch_images.shape != images.shape:
            raise ValueError("another shape")
        images.copy_(batch_images)
        labels.copy_(batch_labels)
        graph.replay()
        return loss.detach().clone()
    return step


def relies_on_copy_raising(model, optimizer, example_images, example_labels, warmup=3):
    """copy_'s RuntimeError turned into ValueError: a batch of 1 sample broadcasts, no error (walk w2-05)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)

    def step(batch_images, batch_labels):
        try:
            images.copy_(batch_images)
            labels.copy_(batch_labels)
        except RuntimeError as exc:
            raise ValueError(str(exc)) from None
        graph.replay()
        return loss.detach().clone()
    return step


def refuses_short_batches_only(model, optimizer, example_images, example_labels, warmup=3):
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)

    def step(batch_images, batch_labels):
        if len(batch_images) < len(images) or batch_images.shape[1:] != images.shape[1:]:
            raise ValueError("a short batch")
        images.copy_(batch_images[:len(images)])
        labels.copy_(batch_labels[:len(labels)])
        graph.replay()
        return loss.detach().clone()
    return step


def short_batch_into_the_buffers(model, optimizer, example_images, example_labels, warmup=3):
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)

    def step(batch_images, batch_labels):
        images[:len(batch_images)].copy_(batch_images)       # the rest: stale samples from the previous batch
        labels[:len(batch_labels)].copy_(batch_labels)
        graph.replay()
        return loss.detach().clone()
    return step


# -- a wait for the device every step -----------------------------------------------------------------

def _waits(after=None, returns=None):
    def answer(model, optimizer, example_images, example_labels, warmup=3):
        _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
        images, labels = example_images.clone(), example_labels.clone()
        graph, loss = _capture(model, optimizer, images, labels)
        return _stepper(graph, images, labels, loss, after=after, returns=returns)
    return answer


def _guard(loss):
    if not torch.isfinite(loss):
        raise RuntimeError("the loss diverged")


def _event_synchronize(loss):
    event = torch.cuda.Event()
    event.record()
    event.synchronize()


returns_a_float = _waits(returns=float)
returns_item = _waits(returns=lambda loss: loss.item())
isfinite_guard_every_step = _waits(after=_guard)
synchronize_after_replay = _waits(after=lambda loss: torch.cuda.synchronize())
event_synchronize_every_step = _waits(after=_event_synchronize)
prints_every_step = _waits(after=_print)
copies_to_the_host = _waits(returns=lambda loss: loss.cpu())


# -- capture order and gradients ----------------------------------------------------------------------

def checks_the_number_of_values(model, optimizer, example_images, example_labels, warmup=3):
    """numel() compared, not the shape: a batch of as many values in another layout reaches copy_ (walk w3-05)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)

    def step(batch_images, batch_labels):
        if batch_images.numel() != images.numel() or batch_labels.numel() != labels.numel():
            raise ValueError("another size")
        images.copy_(batch_images)
        labels.copy_(batch_labels)
        graph.replay()
        return loss.detach().clone()
    return step


def inputs_moved_with_to_cuda(model, optimizer, example_images, example_labels, warmup=3):
    """example_images.to('cuda') as the graph's inputs: on the batch's device it is no copy (walk w3-05)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.to("cuda"), example_labels.to("cuda")
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


def right_stream_on_the_batchs_device(model, optimizer, example_images, example_labels, warmup=3):
    """torch.cuda.Stream(device=...) and current_stream(device) named: as right as without (walk w3-05)."""
    device = example_images.device
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        _warm(model, optimizer, example_images, example_labels, warmup)
    torch.cuda.current_stream(device).wait_stream(side)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels, stream=side)
    return _stepper(graph, images, labels, loss)


def captured_before_warmup(model, optimizer, example_images, example_labels, warmup=3):
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    return _stepper(graph, images, labels, loss)


def stale_gradients(model, optimizer, example_images, example_labels, warmup=3):
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels, zero_grad=False)
    return _stepper(graph, images, labels, loss)


def zeroed_not_freed_gradients(model, optimizer, example_images, example_labels, warmup=3):
    """zero_grad(set_to_none=False) before the capture: backward inside the graph adds into .grad."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    optimizer.zero_grad(set_to_none=False)
    graph, loss = _capture(model, optimizer, images, labels, zero_grad=False)
    return _stepper(graph, images, labels, loss)


def warmup_without_optimizer_steps(model, optimizer, example_images, example_labels, warmup=3):
    for _ in range(warmup):
        F.cross_entropy(model(example_images), example_labels).backward()
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


def fixed_warmup(model, optimizer, example_images, example_labels, warmup=3):
    return right(model, optimizer, example_images, example_labels, warmup=3)


def one_warmup_step_short(model, optimizer, example_images, example_labels, warmup=3):
    return right(model, optimizer, example_images, example_labels, warmup=warmup - 1)


def throwaway_graph_for_its_pool(model, optimizer, example_images, example_labels, warmup=3):
    """A first graph captured only to borrow its memory pool: two captures (walk w2-05)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    first = torch.cuda.CUDAGraph()
    with torch.cuda.graph(first):
        example_images.sum()
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels, pool=first.pool())
    return _stepper(graph, images, labels, loss)


# -- replays ------------------------------------------------------------------------------------------

def returns_the_captured_loss(model, optimizer, example_images, example_labels, warmup=3):
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)

    def step(batch_images, batch_labels):
        if batch_images.shape != images.shape or batch_labels.shape != labels.shape:
            raise ValueError("another shape")
        images.copy_(batch_images)
        labels.copy_(batch_labels)
        graph.replay()
        return loss                             # overwritten by the next replay
    return step


def eager_every_step(model, optimizer, example_images, example_labels, warmup=3):
    right(model, optimizer, example_images, example_labels, warmup)

    def step(batch_images, batch_labels):
        if batch_images.shape != example_images.shape or batch_labels.shape != example_labels.shape:
            raise ValueError("another shape")
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(batch_images), batch_labels)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def replays_twice(model, optimizer, example_images, example_labels, warmup=3):
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)

    def step(batch_images, batch_labels):
        if batch_images.shape != images.shape or batch_labels.shape != labels.shape:
            raise ValueError("another shape")
        images.copy_(batch_images)
        labels.copy_(batch_labels)
        graph.replay()
        graph.replay()
        return loss.detach().clone()
    return step


def graphed_callables(model, optimizer, example_images, example_labels, warmup=3):
    """torch.cuda.make_graphed_callables: forward and backward graphed, the optimizer step eager."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    graphed = torch.cuda.make_graphed_callables(model, (example_images.clone(),))

    def step(batch_images, batch_labels):
        if batch_images.shape != example_images.shape or batch_labels.shape != example_labels.shape:
            raise ValueError("another shape")
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(graphed(batch_images), batch_labels)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def optimizer_outside_the_graph(model, optimizer, example_images, example_labels, warmup=3):
    """Forward and backward captured, optimizer.step() eager after each replay (walk w2-05)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
    return _stepper(graph, images, labels, loss, after=lambda _: optimizer.step())


def extra_optimizer_step(model, optimizer, example_images, example_labels, warmup=3):
    """The whole step captured, and one more optimizer.step() in Python after each replay (walk w2-05)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss, after=lambda _: optimizer.step())


_CACHED: dict = {}
_BY_SHAPE: dict = {}


def caches_a_graph_per_shape(model, optimizer, example_images, example_labels, warmup=3):
    """One graph per batch shape, kept across calls: a later model gets the first one's graph (walk w2-05)."""
    key = (tuple(example_images.shape), tuple(example_labels.shape))
    if key not in _BY_SHAPE:
        _BY_SHAPE[key] = right(model, optimizer, example_images, example_labels, warmup)
    return _BY_SHAPE[key]


_BY_ID: dict = {}


def caches_by_model_and_optimizer_id(model, optimizer, example_images, example_labels, warmup=3):
    """A step kept per (id(model), id(optimizer)): a second call with the same model and optimizer neither warms
    up nor captures, and hands back the first call's graph (walk w9-05 w55_24: passed every scenario)."""
    key = (id(model), id(optimizer))
    if key not in _BY_ID:
        _BY_ID[key] = right(model, optimizer, example_images, example_labels, warmup)
    return _BY_ID[key]


def caches_the_graph(model, optimizer, example_images, example_labels, warmup=3):
    """State kept between calls: the first graph captured is handed out again, for another model."""
    if "step" not in _CACHED:
        _CACHED["step"] = right(model, optimizer, example_images, example_labels, warmup)
    return _CACHED["step"]


def course_graph(model, optimizer, example_images, example_labels, warmup=3):
    from course_utils.train import _GraphedStep
    graphed = _GraphedStep(model, optimizer, torch.nn.CrossEntropyLoss(), None, False, example_images.device)
    return lambda x, y: graphed(x, y, None, False)


CAPTURE_READ = "reads nothing on the host while capturing"
WAITS = "returns without waiting for the device"
SHAPES = "a batch of another shape raises ValueError"

# -- walk w4-05 ------------------------------------------------------------------------------------------

def returns_a_clone_with_its_graph(model, optimizer, example_images, example_labels, warmup=3):
    """static_loss.clone() without detach: the captured graph's history rides along (w4-05, 5.5-28)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)

    def step(batch_images, batch_labels):
        if batch_images.shape != images.shape or batch_labels.shape != labels.shape:
            raise ValueError("another shape")
        images.copy_(batch_images)
        labels.copy_(batch_labels)
        graph.replay()
        return loss.clone()
    return step


def keeps_every_returned_loss(model, optimizer, example_images, example_labels, warmup=3):
    """Every returned loss kept in a list in the closure: one device tensor per step (w4-05, 5.5-32)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)
    history = []
    return _stepper(graph, images, labels, loss, after=history.append)


def no_zero_grad_in_the_warmup(model, optimizer, example_images, example_labels, warmup=3):
    """The warm-up never clears the gradients: each warm-up step adds to the last's (w4-05, 5.5-29)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            F.cross_entropy(model(example_images), example_labels).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels, stream=side)
    return _stepper(graph, images, labels, loss)


def clones_before_the_replay(model, optimizer, example_images, example_labels, warmup=3):
    """The loss cloned before graph.replay(): each call returns the step before's (w4-05, 5.5-30)."""
    side = _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels, stream=side)

    def step(batch_images, batch_labels):
        if batch_images.shape != images.shape or batch_labels.shape != labels.shape:
            raise ValueError("another shape")
        images.copy_(batch_images)
        labels.copy_(batch_labels)
        out = loss.detach().clone()
        graph.replay()
        return out
    return step


def stream_on_device_zero(model, optimizer, example_images, example_labels, warmup=3):
    """torch.cuda.Stream(device=0) while the batch lives on cuda:1 (w4-05, 5.5-27)."""
    side = _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup,
                                side=torch.cuda.Stream(device=0))
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels, stream=side)
    return _stepper(graph, images, labels, loss)


def cudnn_benchmark_before_the_capture(model, optimizer, example_images, example_labels, warmup=3):
    """torch.backends.cudnn.benchmark switched on between the warm-up and the capture (w4-05, 5.5-33)."""
    side = _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    torch.backends.cudnn.benchmark = True
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels, stream=side)
    return _stepper(graph, images, labels, loss)


def right_warmup_on_side_capture_on_its_own(model, optimizer, example_images, example_labels, warmup=3):
    """Warm-up on a side stream, torch.cuda.graph(g) on its own stream: PyTorch's documented example (w4-05, 5.5-23)."""
    _warm_on_side_stream(model, optimizer, example_images, example_labels, warmup)
    images, labels = example_images.clone(), example_labels.clone()
    graph, loss = _capture(model, optimizer, images, labels)
    return _stepper(graph, images, labels, loss)


CASES = [
    # right answers: a GPU captures and trains them exactly as ordinary steps
    Case("right", right, "pass", why="the lesson's answer"),
    Case("right, torch.empty_like inputs", right_empty_like, "pass"),
    Case("right, pool + stream + thread_local", right_pool_stream_thread_local, "pass",
         why="torch.cuda.graph(g, pool=graph_pool_handle(), stream=side, capture_error_mode='thread_local')"),
    Case("right, capture_error_mode relaxed", right_relaxed, "pass"),
    Case("right, records a CUDA event per step", right_records_an_event, "pass",
         why="event.record() queues a marker; nothing waits"),
    Case("right, zero_grad inside the capture", right_zero_grad_inside, "pass",
         why="set_to_none inside the capture: backward makes the gradients in the graph's pool"),
    Case("right, capture_begin by hand on a side stream", right_by_hand_capture_begin, "pass"),
    Case("right, torch.cuda.graphs.* names", right_graphs_module_names, "pass", why="the same objects as torch.cuda.*"),
    Case("right, torch.Stream and torch.accelerator", right_accelerator_streams, "pass",
         why="the device-agnostic stream API (torch 2.6+)"),
    Case("right, torch.zeros inputs without dtype", right_zeros_default_dtype, "pass",
         why="float32, as the batches are"),
    Case("right, empty_like inputs left unfilled", right_empty_like_unfilled, "pass",
         why="a capture runs nothing: the garbage labels are never checked"),
    Case("right, zeros_like inputs", right_zeros_like_buffers, "pass"),
    Case("right, event.query() per step", right_event_query, "pass", why="cudaEventQuery polls"),
    Case("right, warm-up on the current stream", right_warmup_on_the_current_stream, "pass",
         why="torch's docs warm up on a side stream; a GPU run must confirm CUDA accepts this (README's GPU list)"),
    Case("right, stream made on the batch's device", right_stream_on_the_batchs_device, "pass",
         why="torch.cuda.Stream() without device= is on the current device, the batch's (the contract says so)"),
    Case("right, zero fill inside the capture", right_zero_fill_inside, "pass",
         why="the fill is captured and replayed before backward adds into the gradients"),
    Case("right, device='cuda' literal", right_cuda_literal, "pass", why="the current device: the batch's"),
    Case("right, replay on its stream with waits both ways", right_replays_on_its_stream_with_waits, "pass"),
    Case("right, capturable Adam", right, "pass", optimizer="adam"),
    Case("right, Adam not capturable", right, "error", words="capturable is False", optimizer="adam-not-capturable",
         why="torch refuses: 'Attempting CUDA graph capture of step() for an instance of Adam but param_groups' "
             "capturable is False.'"),
    # streams: CUDA orders work across streams only where it is asked to
    Case("replays on its stream, unordered", replays_on_its_stream_unordered, "fail",
         "orders its streams: no race with the caller's stream", words="before side stream",
         why="the copy_ into the inputs, the replay and the loss's clone run concurrently"),
    Case("right, no wait for the warm-up after it", right_no_wait_after_the_warmup, "pass",
         why="torch.cuda.graph synchronises the device on entry"),
    Case("a warm-up on a side stream that never waited for the caller's", warms_up_without_waiting, "fail",
         "orders its streams: no race with the caller's stream", words="before the warm-up",
         why="the warm-up's first kernels read the example batch and the weights while the caller's stream may "
             "still be writing them"),
    Case("capture_end on another stream", capture_end_on_another_stream, "fail", "captures on one stream",
         words="Capture must end on the same stream it began on",
         why="torch: 'Capture must end on the same stream it began on.'"),
    # host reads while capturing: CUDA refuses each
    Case("item() while capturing", item_while_capturing, "fail", CAPTURE_READ),
    Case("print(loss) while capturing", print_while_capturing, "fail", CAPTURE_READ),
    Case("loss.cpu() while capturing", cpu_while_capturing, "fail", CAPTURE_READ),
    Case("loss.tolist() while capturing", tolist_while_capturing, "fail", CAPTURE_READ),
    Case("loss.numpy() while capturing", numpy_while_capturing, "fail", CAPTURE_READ,
         why="a CUDA tensor has no numpy(): TypeError, as on a GPU"),
    Case("torch.cuda.synchronize() while capturing", synchronize_while_capturing, "fail", CAPTURE_READ),
    Case("event.synchronize() while capturing", event_synchronize_while_capturing, "fail", CAPTURE_READ),
    Case("an isfinite guard while capturing", guard_while_capturing, "fail", CAPTURE_READ),
    # static inputs
    Case("static inputs made on the host", host_static_inputs, "fail", "keeps the graph's inputs on the device"),
    Case("static.data = batch", rebinds_with_data, "fail", "copies each batch into the captured inputs",
         why="a replay reads the captured storage: the graph trains on the first batch forever"),
    Case("static.set_(batch)", rebinds_with_set_, "fail", "copies each batch into the captured inputs"),
    Case("the name rebound", rebinds_the_name, "fail", "copies each batch into the captured inputs"),
    Case("static inputs on cuda:0 written in", cuda0_written_in, "fail", "keeps the graph's inputs on the device",
         words="cuda:0", why="another GPU than the batch's cuda:1: the warm-up raises"),
    Case("the inputs cloned inside the capture", clones_inside_the_capture, "fail",
         "copies each batch into the captured inputs", why="each replay clones the example again"),
    Case("the labels not copied", labels_not_copied, "fail", "copies each batch into the captured inputs",
         words="the labels given to step()"),
    Case("warm-up on random inputs", warms_up_on_random_inputs, "fail", "warms up on the example batch"),
    Case("the example batch as the inputs", example_batch_as_inputs, "fail", "leaves the example batch unchanged"),
    Case("checks the batch size only", checks_the_batch_size_only, "fail", SHAPES, words="RuntimeError"),
    Case("refuses short batches only", refuses_short_batches_only, "fail", SHAPES, words="was accepted"),
    Case("checks the images' shape only", checks_the_images_only, "fail", SHAPES,
         words="with 1 label (copy_ broadcasts the label to every row) was accepted",
         why="1 label broadcasts into every row: no error, the wrong labels"),
    Case("relies on copy_ raising", relies_on_copy_raising, "fail", SHAPES,
         words="a batch of 1 sample (copy_ broadcasts it into every row of the captured buffers) was accepted",
         why="1 sample broadcasts into every row: no error, one sample trained on"),
    Case("a short batch into the buffers", short_batch_into_the_buffers, "fail", SHAPES),
    Case("checks numel(), not the shape", checks_the_number_of_values, "fail", SHAPES, words="laid out channels last",
         why="copy_ raises RuntimeError for the channels-last batch, not the ValueError the contract names"),
    Case("inputs made with .to('cuda')", inputs_moved_with_to_cuda, "fail", "leaves the example batch unchanged",
         words="is no copy when the batch is already there",
         why="on the current device, the batch's, .to('cuda') returns the very tensor: each copy_ overwrites it"),
    # a wait every step
    Case("returns float(loss)", returns_a_float, "fail", WAITS, words="__float__"),
    Case("returns loss.item()", returns_item, "fail", WAITS, words="item"),
    Case("an isfinite guard every step", isfinite_guard_every_step, "fail", WAITS, words="__bool__"),
    Case("torch.cuda.synchronize() after replay", synchronize_after_replay, "fail", WAITS, words="synchronize"),
    Case("event.synchronize() every step", event_synchronize_every_step, "fail", WAITS, words="event.synchronize"),
    Case("print(loss) every step", prints_every_step, "fail", WAITS),
    Case("returns loss.cpu()", copies_to_the_host, "fail", WAITS, words="copy to the host"),
    # capture order, gradients, warm-up
    Case("captured before the warm-up", captured_before_warmup, "fail", "captures after the warm-up"),
    Case("stale gradients at the capture", stale_gradients, "fail", "clears the gradients before the capture",
         words="from step "),
    Case("zero_grad(set_to_none=False) before the capture", zeroed_not_freed_gradients, "fail",
         "clears the gradients before the capture"),
    Case("warm-up without optimizer steps", warmup_without_optimizer_steps, "fail",
         "warms up `warmup` ordinary steps, then captures one"),
    Case("warmup fixed at 3", fixed_warmup, "fail", "warms up `warmup` ordinary steps, then captures one",
         words="times before the capture; expected the"),
    Case("one warm-up step short", one_warmup_step_short, "fail", "warms up `warmup` ordinary steps, then captures one",
         words="times before the capture; expected the"),
    Case("a throwaway graph for its pool", throwaway_graph_for_its_pool, "fail",
         "warms up `warmup` ordinary steps, then captures one", words="captured 2 graphs"),
    # replays
    Case("returns the captured loss", returns_the_captured_loss, "fail", "returns each step's own loss"),
    Case("eager every step", eager_every_step, "fail", "replays the graph: no Python model call per step"),
    Case("replays twice", replays_twice, "fail", "one replay per step"),
    Case("optimizer.step() in Python after the replay", optimizer_outside_the_graph, "fail",
         "replays the whole step: no optimizer.step() in Python per call", words="optimizer steps ran in Python"),
    Case("an extra optimizer.step() after the replay", extra_optimizer_step, "fail",
         "replays the whole step: no optimizer.step() in Python per call", words="optimizer steps ran in Python"),
    Case("make_graphed_callables", graphed_callables, "fail", "captures the whole step as one graph",
         why="a partial capture: valid GPU code, not this exercise (the optimizer step stays eager)"),
    Case("the first graph cached for every call", caches_the_graph, "fail",
         "captures a graph of the model it is given, in every call", words="earlier call"),
    Case("a step cached per (id(model), id(optimizer))", caches_by_model_and_optimizer_id, "fail",
         "captures a graph of the model it is given, in every call",
         words="earlier call",      # the first call may meet a dead model's id (test_checks_lesson05_graphs.py)
         why="the check calls make_graphed_step twice with the same model and optimizer"),
    Case("a graph cached per shape", caches_a_graph_per_shape, "fail",
         "captures a graph of the model it is given, in every call", words="earlier call",
         why="the check's scenarios share one shape on every seed"),
    Case("the course's _GraphedStep", course_graph, "fail", "is your own code"),
    # walk w4-05
    Case("returns static_loss.clone() without detach", returns_a_clone_with_its_graph, "fail",
         "returns each step's loss as a detached tensor", words="a clone alone keeps the capture's graph"),
    Case("keeps every returned loss in the closure", keeps_every_returned_loss, "fail",
         "keeps nothing per call: memory stays flat over the steps", words="a list in the closure"),
    Case("no zero_grad in the warm-up steps", no_zero_grad_in_the_warmup, "fail",
         "clears the gradients in each warm-up step", words="never cleared the gradients"),
    Case("clones the loss before the replay", clones_before_the_replay, "fail", "returns each step's own loss",
         words="clone the loss after graph.replay()"),
    Case("a side stream made on cuda:0, the batch on cuda:1", stream_on_device_zero, "fail",
         "captures on a stream of the batch's device", words="device=0",
         why="emulated (the capture stream's device is not the work's); a box with two GPUs must confirm (README)"),
    Case("cudnn.benchmark switched on before the capture", cudnn_benchmark_before_the_capture, "fail",
         "leaves the caller's global settings alone", words="torch.backends.cudnn.benchmark from False to True",
         why="the caller's switch; on a GPU the capture would be the first pass that tunes (README's GPU list)"),
    Case("right, warm-up on a side stream, capture on the graph's own", right_warmup_on_side_capture_on_its_own,
         "pass", why="PyTorch's CUDA-graph docs example exactly; README's GPU list: confirm with the model here"),
]


def _verdict(case: Case, device: str, seeds) -> dict:
    from course_utils.checks.lesson05_graphs import grade_scenario
    verdicts = [grade_scenario(case.answer, device, seed=seed, optimizer=case.optimizer) for seed in seeds]
    return {device: "; ".join(sorted({v.status + (f": {v.prop}" if v.prop else "") for v in verdicts})),
            f"{device} message": verdicts[0].message[:300]}


def _capture_still_works() -> bool:
    """After a capture that failed: can this process still capture? On torch before 2.12 a capture that
    raised inside `torch.cuda.graph` can leave the caching allocator believing a capture is under way
    (pytorch/pytorch#180395), and every later capture in the process fails for that reason alone."""
    try:
        x = torch.zeros(4, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.add_(1)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x * 2
        graph.replay()
        torch.cuda.synchronize()
        return bool(float(y.sum()) == 8.0)
    except Exception:
        return False


def _child(names: list[str], device: str, seeds) -> None:
    """In a process of its own: grade `names` in order, one ROW line each; stop after a case that left
    this process unable to capture (the parent goes on in a fresh one)."""
    import json
    by_name = {c.name: c for c in CASES}
    for name in names:
        row = _verdict(by_name[name], device, seeds)
        print("ROW " + json.dumps({"case": name, **row}), flush=True)
        if not row[device].startswith("pass") and not _capture_still_works():
            print("POISONED", flush=True)
            return


def _isolated(device: str, seeds, names=None) -> dict:
    """Every case (or those named) on `device` in as few processes as the device allows: a fresh process
    after each case that broke capturing for the rest of its process (see `_capture_still_works`)."""
    import json
    import subprocess
    names, rows, restarts = list(names or [c.name for c in CASES]), {}, 0
    while names:
        done = subprocess.run([sys.executable, __file__, "--child", device, "--seeds", str(len(seeds)),
                               "--names", json.dumps(names)], capture_output=True, text=True, timeout=600)
        got = [json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("ROW ")]
        for row in got:
            rows[row.pop("case")] = row
        if not got:                      # the child died before its first case: record it, go on
            rows[names[0]] = {device: "error: the grading process died",
                              f"{device} message": (done.stderr or done.stdout)[-300:]}
            got = [None]
        names = names[len(got):]
        restarts += bool(names)
    rows["_restarts"] = restarts
    return rows


def compare(devices=("cpu", "cuda"), seeds=(0,)) -> list[dict]:
    """Each case through `grade_scenario` on each device: the verdicts side by side (issue 38). The
    emulation ("cpu") grades in this process; a real device in child processes, a fresh one after each
    case that left its process unable to capture (torch 2.11's allocator after a failed capture)."""
    seeds = list(seeds)
    real = {d: _isolated(d, seeds) for d in devices if d != "cpu"}
    rows = []
    for case in CASES:
        row = {"case": case.name, "expected": case.expected + (f": {case.prop}" if case.prop else "")}
        for device in devices:
            row.update(_verdict(case, device, seeds) if device == "cpu" else real[device][case.name])
        rows.append(row)
    for device, graded in real.items():
        rows.append({"case": "_processes", "expected": "", device: f"{graded['_restarts'] + 1} processes"})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", action="append", help="cpu (the emulation) and/or cuda (the real capture)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--names", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import json
        _child(json.loads(args.names), args.child, range(args.seeds))
        return 0
    devices = args.device or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    rows = compare(devices, range(args.seeds))
    for row in rows:
        print(f"{row['case']:48s} expected {row['expected']:60s} " + " | ".join(f"{d}: {row.get(d)}" for d in devices))
    if args.json:
        import json
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
