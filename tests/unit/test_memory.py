import pytest
import torch
from torch import nn

from course_utils.memory import (GraphWatch, SavedTensorMeter, StepReadings, fit_linear, measure_step_memory,
                                 state_bytes)
from course_utils.models import TinyCNN


def test_saved_tensor_meter_counts_activations_and_their_release():
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    x = torch.randn(32, 64)
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        loss = model(x).square().mean()
        during = meter.live_bytes
        loss.backward()
    assert during >= 32 * 256 * 4, "at least the hidden activation is saved"
    assert meter.peak_bytes >= during and meter.live_bytes == 0, "backward frees what was saved"
    with SavedTensorMeter(exclude=model.parameters()) as big:
        model(torch.randn(128, 64)).square().mean().backward()
    assert big.peak_bytes == pytest.approx(4 * meter.peak_bytes, rel=0.05), "saved bytes grow with the batch"


def test_graph_watch_sees_a_kept_loss_keep_its_graph():
    model = nn.Linear(8, 1)
    watch = GraphWatch()
    loss_fn = watch.wrap(lambda out: out.square().mean())
    kept = []
    for _ in range(3):
        loss = loss_fn(model(torch.randn(4, 8)))
        loss.backward()
        kept.append(loss)
    assert watch.alive == 3 and watch.marked == 3
    kept.clear()
    del loss
    assert watch.alive == 0


def test_state_bytes_and_step_memory_on_cpu():
    model = TinyCNN(width=8)
    params = sum(p.numel() for p in model.parameters()) * 4
    assert state_bytes(model) == 2 * params
    small = measure_step_memory(model, torch.randn(4, 3, 32, 32), torch.zeros(4, dtype=torch.long), device="cpu")
    large = measure_step_memory(model, torch.randn(16, 3, 32, 32), torch.zeros(16, dtype=torch.long), device="cpu")
    assert "estimate" in small.method and large.activation_bytes > 3 * small.activation_bytes
    assert large.peak_bytes == large.state_bytes + large.activation_bytes


def test_linear_fit():
    fit = fit_linear([8, 16, 32], [100 + 10 * b for b in (8, 16, 32)])
    assert fit.fixed_bytes == pytest.approx(100) and fit.per_sample_bytes == pytest.approx(10)
    assert fit.largest_within(1000) == 90 and fit.max_relative_error < 1e-9
    with pytest.raises(ValueError):
        fit_linear([8, 8], [1, 2])


def test_step_readings_read_before_each_batch():
    counter = iter(range(100))
    readings = StepReadings([1, 2, 3], lambda: next(counter))
    assert list(readings) == [1, 2, 3] and readings.values == [0, 1, 2] and len(readings) == 3


def test_saved_tensor_meter_frees_a_dropped_retained_graph_and_keeps_gradients_right():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    x = torch.randn(8, 32)
    model(x).pow(2).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        loss = model(x).pow(2).sum()
        loss.backward(retain_graph=True)
        assert meter.live_bytes > 0, "retain_graph keeps the saved tensors"
        del loss
        assert meter.live_bytes == 0, "no reference cycle through the packed tensors keeps the graph alive"
    assert all(torch.allclose(a, p.grad) for a, p in zip(expected, model.parameters()))


def test_saved_tensor_meter_counts_a_storage_once_and_parameters_only_when_asked():
    x = torch.randn(100, requires_grad=True)
    with SavedTensorMeter() as meter:
        y = x * 2                  # multiplying by a number saves no tensor
        (y * y).sum()              # y is saved twice, as both operands: one storage
    assert meter.saved_count == 2 and meter.peak_bytes == 400
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))   # the 2nd weight is saved
    with SavedTensorMeter(exclude=model.parameters()) as without:
        model(torch.randn(4, 16))
    with SavedTensorMeter() as with_params:
        model(torch.randn(4, 16))
    assert with_params.peak_bytes > without.peak_bytes


def test_state_bytes_counts_optimizer_state_and_bf16_halves_activations():
    model = TinyCNN(width=8)
    params = sum(p.numel() for p in model.parameters()) * 4
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    fp32 = measure_step_memory(model, torch.randn(8, 3, 32, 32), torch.zeros(8, dtype=torch.long),
                               device="cpu", optimizer=opt)
    assert state_bytes(model, opt) == 3 * params == fp32.state_bytes
    bf16 = measure_step_memory(TinyCNN(width=8), torch.randn(8, 3, 32, 32), torch.zeros(8, dtype=torch.long),
                               device="cpu", amp="bf16")
    assert bf16.activation_bytes < 0.75 * fp32.activation_bytes
