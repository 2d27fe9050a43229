import time

import pytest
import torch

from course_utils import accel


def test_on_the_cpu_streams_are_harmless_stand_ins():
    side = accel.new_stream("cpu")
    consumer = accel.current_stream(torch.device("cpu"))
    x = torch.arange(6)
    with accel.use_stream(side):
        y = x.to("cpu", non_blocking=True) * 2
    consumer.wait_stream(side)
    accel.record_stream((y, [y], {"y": y}), consumer)
    side.synchronize()
    assert side.query() and torch.equal(y, torch.arange(6) * 2)
    assert "HostStream" in repr(side)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_pinning_only_where_a_gpu_can_use_it():
    batch = (torch.zeros(3), {"a": torch.ones(2)})
    assert accel.pin(batch) is batch and not accel.pinning_helps()


def test_host_events_time_the_host():
    start, end = accel.Event("cpu"), accel.Event("cpu")
    start.record()
    time.sleep(0.01)
    end.record()
    assert 9 <= start.elapsed_ms(end) <= 50
    with pytest.raises(RuntimeError, match="recorded"):
        accel.Event("cpu").elapsed_ms(end)


def test_simulator_events_time_the_simulated_device(sim):
    start, end = accel.Event(sim), accel.Event(sim)
    start.record()
    sim.step()
    sim.step()
    end.record()
    assert 19 <= start.elapsed_ms(end) <= 30


def test_is_cuda():
    assert not accel.is_cuda("cpu") and not accel.is_cuda(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_stream_helpers_and_events():
    device = torch.device("cuda", torch.cuda.current_device())
    side = accel.new_stream(device)
    assert isinstance(side, torch.cuda.Stream)
    x = torch.randn(1 << 20).pin_memory()
    with accel.use_stream(side):
        y = x.to(device, non_blocking=True)
    accel.current_stream(device).wait_stream(side)
    accel.record_stream(y, accel.current_stream(device))
    start, end = accel.Event(device), accel.Event(device)
    start.record()
    z = (y @ y)
    end.record()
    assert start.elapsed_ms(end) >= 0 and torch.allclose(z.cpu(), x @ x, rtol=1e-3)
    assert accel.pin(torch.zeros(2)).is_pinned()
