import itertools
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from course_utils.models import TinyCNN
from course_utils.train import evaluate, train


def _batches(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = torch.randn(n, 3, 32, 32, generator=g) * 0.3
    x[:, 0] += y.view(-1, 1, 1) / 3  # a learnable signal
    return TensorDataset(x, y)


def test_train_on_cpu_lowers_the_loss():
    torch.manual_seed(0)
    model = TinyCNN(width=8)
    loader = DataLoader(_batches(), batch_size=16, shuffle=True)
    result = train(model, loader, device="cpu", steps=30, progress=False)
    assert result.steps == 30 and len(result.losses) == 30
    assert sum(result.losses[-5:]) < sum(result.losses[:5])
    assert result.stats.steps == 29 and result.stats.samples_per_s > 0
    assert 0 <= evaluate(model, loader, device="cpu") <= 1


def test_train_with_bf16_autocast_and_channels_last_runs():
    model = TinyCNN(width=8)
    loader = DataLoader(_batches(32), batch_size=16)
    result = train(model, loader, device="cpu", epochs=2, amp="bf16", channels_last=True, progress=False)
    assert result.steps == 4 and all(torch.isfinite(torch.tensor(result.losses)))


def test_batch_transform_runs_before_the_forward():
    seen = []

    def transform(images, labels):
        seen.append(images.dtype)
        return images.float() / 255, labels

    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    y = torch.zeros(8, dtype=torch.long)
    train(TinyCNN(width=8), [(x, y)], device="cpu", progress=False, batch_transform=transform)
    assert seen == [torch.uint8]


def test_train_with_the_simulated_device_needs_no_model(sim):
    x, y = torch.zeros(32, 3, 32, 32), torch.zeros(32, dtype=torch.long)
    result = train(None, itertools.repeat((x, y)), device=sim, steps=6, progress=False)
    assert result.steps == 6 and result.losses == []
    assert 9.5 <= result.stats.device_median_ms <= 16
    assert 0.045 <= result.stats.total_s <= 0.08, "5 counted steps of 10 ms, synchronised once at the end"
    assert sim.steps_run == 6


def test_on_the_simulator_a_batch_transform_is_computed_once_and_charged_every_step(sim):
    seen = []

    def transform(images, labels):
        seen.append(images.dtype)
        return images.float() / 255, labels               # two kernels, 2 x (in + out) bytes

    x, y = torch.zeros(64, 3, 32, 32, dtype=torch.uint8), torch.zeros(64, dtype=torch.long)
    busy_before = sim.busy_seconds()
    train(None, itertools.repeat((x, y)), device=sim, steps=4, batch_transform=transform, progress=False)
    assert seen == [torch.uint8], "computed for the first batch of this shape, then charged (SimulatedAccelerator.run_timed)"
    assert sim.charged_kernels == 4 * 2
    moved = x.numel() * (1 + 4) + x.numel() * (4 + 4)       # uint8 -> float32, then float32 / 255
    per_step_ms = 2 * sim.kernel_us / 1e3 + moved / (sim.bandwidth_gbs * 1e9) * 1e3
    assert sim.charged_ms == pytest.approx(4 * per_step_ms, rel=1e-6)
    busy_ms = (sim.busy_seconds() - busy_before) * 1e3
    assert busy_ms >= 4 * 10 + 4 * per_step_ms * 0.9, "the charged work adds to the device's busy time"


def test_train_finishes_with_one_synchronisation(sim):
    x, y = torch.zeros(8, 3, 32, 32), torch.zeros(8, dtype=torch.long)
    train(None, itertools.repeat((x, y)), device=sim, steps=5, progress=False)
    t0 = time.perf_counter()
    sim.synchronize()
    assert time.perf_counter() - t0 < 0.005, "train() returns only when the device has finished"


def test_train_errors_are_sentences():
    with pytest.raises(ValueError, match="amp must be one of"):
        train(TinyCNN(), [], device="cpu", amp="fp8")
    with pytest.raises(ValueError, match="needs a model"):
        train(None, [], device="cpu")
    with pytest.raises(RuntimeError, match="no batches"):
        train(TinyCNN(), [], device="cpu", progress=False)


def test_a_one_shot_iterator_that_runs_out_stops_the_loop(sim):
    x, y = torch.zeros(4, 3, 32, 32), torch.zeros(4, dtype=torch.long)
    result = train(None, iter([(x, y)] * 3), device=sim, steps=10, progress=False)
    assert result.steps == 3


def test_closing_the_loader_after_an_early_stop_is_not_timed():
    """x-03 C1: leaving the loop with a `break` closed the loader's iterator at once, and a
    DataLoader's workers shut down (seconds under spawn) inside the last timed step."""
    from course_utils.sim import SimulatedAccelerator

    closed_at = []

    class SlowToClose:
        def __iter__(self):
            try:
                while True:
                    yield torch.zeros(4, 3, 8, 8), torch.zeros(4, dtype=torch.long)
            finally:
                time.sleep(0.5)                           # a worker pool shutting down
                closed_at.append(time.perf_counter())

    device = SimulatedAccelerator(step_ms=1.0)
    result = train(None, SlowToClose(), device=device, steps=5, progress=False)
    assert closed_at, "the loader's iterator was closed"
    assert result.stats.total_s < 0.3, result.stats.total_s
    assert result.stats.step_log[-1]["step_end"] < closed_at[0] - 0.4


def test_a_cuda_graph_trains_an_epochs_short_last_batch_eagerly_and_replays_the_rest():
    """x-08 F2: `drop_last=False` and `cuda_graph=True` together (what exercise 8.1 asks, with the course's fastest
    rung's part) used to raise at the first epoch's end on a GPU. A batch of another shape now runs eagerly, on the
    same parameters and optimizer state: the same weights as an eager run of the same batches (on the emulated
    capture of the virtual CUDA device for training steps, which replays what was recorded, as a GPU does)."""
    from course_utils.checks.virtual_cuda_training import VirtualCudaTraining
    from course_utils.train import GRAPH_WARMUP, _GraphedStep

    data = _batches(6 * 8 + 3)                       # 6 full batches of 8 and a short one of 3, per epoch
    torch.manual_seed(0)
    eager = TinyCNN(width=4)
    graphed = TinyCNN(width=4)
    graphed.load_state_dict(eager.state_dict())
    loader = DataLoader(data, batch_size=8, shuffle=False)
    reference = train(eager, loader, device="cpu", epochs=2, progress=False)
    made = []
    with VirtualCudaTraining() as vc:
        vc.put_module(graphed)
        original = _GraphedStep.__init__

        def keep(self, *args, **kwargs):
            original(self, *args, **kwargs)
            made.append(self)
        _GraphedStep.__init__ = keep
        try:
            result = train(graphed, loader, device="cuda", epochs=2, cuda_graph=True, progress=False)
        finally:
            _GraphedStep.__init__ = original
        graphs = list(vc.graphs.graphs)
    assert result.steps == 14 and len(result.losses) == 14
    step = made[0]
    assert step.eager_steps == 2 and step.shapes[0][0] == 8, "the short batch of each epoch ran eagerly"
    assert len(graphs) == 1 and graphs[0].replays == 14 - GRAPH_WARMUP - 2
    for a, b in zip(eager.parameters(), graphed.parameters()):
        assert torch.allclose(a, b.detach(), atol=1e-5), "the eager step and the replays trained one model"
    assert result.losses == pytest.approx(reference.losses, abs=1e-5)
