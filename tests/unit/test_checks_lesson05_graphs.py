"""Check 5.5 (a training step captured as a CUDA graph) and its mutants: each plausible wrong answer
fails on the property it breaks, on every seed; the right answer passes, twice in one process."""
import pytest
import torch
import torch.nn.functional as F

from course_utils.checks import run_check
from course_utils.graph_capture import EmulatedGraphs

from mutants import Mutant, rejected

SEEDS = range(2)


def right(model, optimizer, example_images, example_labels, warmup=3):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(example_images), example_labels).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    images, labels = example_images.clone(), example_labels.clone()
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()

    def step(batch_images, batch_labels):
        if batch_images.shape != images.shape or batch_labels.shape != labels.shape:
            raise ValueError(f"the graph replays shapes {tuple(images.shape)}; got {tuple(batch_images.shape)}: "
                             "drop_last=True")
        images.copy_(batch_images)
        labels.copy_(batch_labels)
        graph.replay()
        return loss.detach().clone()
    return step


def _build(model, optimizer, example_images, example_labels, warmup, *, item=False, zero_grad=True,
           capture_first=False):
    images, labels = example_images.clone(), example_labels.clone()

    def warm():
        for _ in range(warmup):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(example_images), example_labels).backward()
            optimizer.step()
    if not capture_first:
        warm()
    graph = torch.cuda.CUDAGraph()
    if zero_grad:
        optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = F.cross_entropy(model(images), labels)
        if item:
            loss.item()
        loss.backward()
        optimizer.step()
    if capture_first:
        warm()
    return graph, images, labels, loss


def item_while_capturing(model, optimizer, example_images, example_labels, warmup=3):
    graph, images, labels, loss = _build(model, optimizer, example_images, example_labels, warmup, item=True)
    return lambda x, y: (images.copy_(x), labels.copy_(y), graph.replay(), loss.clone())[-1]


def captured_before_warmup(model, optimizer, example_images, example_labels, warmup=3):
    graph, images, labels, loss = _build(model, optimizer, example_images, example_labels, warmup, capture_first=True)

    def step(x, y):
        if x.shape != images.shape:
            raise ValueError("shape")
        images.copy_(x), labels.copy_(y)
        graph.replay()
        return loss.clone()
    return step


def stale_gradients(model, optimizer, example_images, example_labels, warmup=3):
    graph, images, labels, loss = _build(model, optimizer, example_images, example_labels, warmup, zero_grad=False)

    def step(x, y):
        if x.shape != images.shape:
            raise ValueError("shape")
        images.copy_(x), labels.copy_(y)
        graph.replay()
        return loss.clone()
    return step


def rebinds_the_batch(model, optimizer, example_images, example_labels, warmup=3):
    graph, images, labels, loss = _build(model, optimizer, example_images, example_labels, warmup)
    state = {"images": images}

    def step(x, y):
        if x.shape != images.shape:
            raise ValueError("shape")
        state["images"] = x                     # a new tensor: the graph never sees it
        graph.replay()
        return loss.clone()
    return step


def returns_the_captured_loss(model, optimizer, example_images, example_labels, warmup=3):
    graph, images, labels, loss = _build(model, optimizer, example_images, example_labels, warmup)

    def step(x, y):
        if x.shape != images.shape:
            raise ValueError("shape")
        images.copy_(x), labels.copy_(y)
        graph.replay()
        return loss                             # overwritten by the next replay
    return step


def eager_every_step(model, optimizer, example_images, example_labels, warmup=3):
    _build(model, optimizer, example_images, example_labels, warmup)

    def step(x, y):
        if x.shape != example_images.shape:
            raise ValueError("shape")
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def replays_twice(model, optimizer, example_images, example_labels, warmup=3):
    graph, images, labels, loss = _build(model, optimizer, example_images, example_labels, warmup)

    def step(x, y):
        if x.shape != images.shape:
            raise ValueError("shape")
        images.copy_(x), labels.copy_(y)
        graph.replay()
        graph.replay()
        return loss.clone()
    return step


def short_batch_into_the_buffers(model, optimizer, example_images, example_labels, warmup=3):
    graph, images, labels, loss = _build(model, optimizer, example_images, example_labels, warmup)

    def step(x, y):
        images[:len(x)].copy_(x), labels[:len(y)].copy_(y)   # the rest: stale samples from the previous batch
        graph.replay()
        return loss.clone()
    return step


def fixed_warmup(model, optimizer, example_images, example_labels, warmup=3):
    return right(model, optimizer, example_images, example_labels, warmup=3)


def course_graph(model, optimizer, example_images, example_labels, warmup=3):
    from course_utils.train import _GraphedStep
    graphed = _GraphedStep(model, optimizer, torch.nn.CrossEntropyLoss(), None, False, example_images.device)
    return lambda x, y: graphed(x, y, None, False)


MUTANTS = [
    Mutant("item_while_capturing", item_while_capturing, "reads nothing on the host while capturing"),
    Mutant("captured_before_warmup", captured_before_warmup, "trains exactly as ordinary steps would"),
    Mutant("stale_gradients", stale_gradients, "trains exactly as ordinary steps would"),
    Mutant("rebinds_the_batch", rebinds_the_batch, "trains exactly as ordinary steps would"),
    Mutant("returns_the_captured_loss", returns_the_captured_loss, "returns each step's own loss"),
    Mutant("eager_every_step", eager_every_step, "replays the graph: no Python model call per step"),
    Mutant("replays_twice", replays_twice, "one replay per step"),
    Mutant("short_batch_into_the_buffers", short_batch_into_the_buffers, "a batch of another shape raises ValueError"),
    Mutant("fixed_warmup", fixed_warmup, "warms up `warmup` ordinary steps, then captures one"),
    Mutant("course_graph", course_graph, "is your own code"),
]


def test_the_right_answer_passes_twice_in_one_process():
    for _ in range(2):
        result = run_check("5.5", right)
        assert result.status == "pass", result.message
    assert "emulated" in result.message


@pytest.mark.parametrize("mutant", MUTANTS, ids=repr)
def test_mutants_fail_on_their_property(mutant):
    rejected("5.5", mutant, SEEDS)


def test_stub_and_wrong_type():
    def stub(model, optimizer, example_images, example_labels, warmup=3):
        raise NotImplementedError("Exercise 5.5")
    assert run_check("5.5", stub).status == "not_implemented"
    assert run_check("5.5", 42).status == "fail"


def test_the_emulated_capture_runs_nothing_and_refuses_host_reads():
    with EmulatedGraphs() as graphs:
        x = torch.ones(3)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            x.mul_(2)
        assert torch.equal(x, torch.ones(3)), "a capture records; it does not run"
        g.replay()
        g.replay()
        assert torch.equal(x, torch.full((3,), 4.0)) and graphs.graphs[0].replays == 2
        with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                (x * 2).sum().item()
    assert torch.cuda.CUDAGraph is not g.__class__ or torch.cuda.is_available()
