"""The virtual CUDA device for training steps: tensors say where they live, training works, host
tensors mixed in fail as on a GPU, every wait of the host is logged (and refused while capturing)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.checks.virtual_cuda_training import VirtualCudaTraining
from course_utils.graph_capture import CAPTURE_ERROR


def test_tensors_say_where_they_live_and_training_works():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    model(torch.zeros(1, 3, 6, 6))
    with VirtualCudaTraining() as vc:
        vc.put_module(model)
        x = torch.randn(5, 3, 6, 6, device="cuda")
        y = torch.randint(0, 2, (5,)).cuda()              # a blocking copy from host memory: a wait
        assert x.device.type == "cuda" and x.is_cuda and not x.is_cpu and x.get_device() == vc.device.index
        assert next(model.parameters()).device == vc.device
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).step()
        assert loss.device.type == "cuda" and model[0].weight.grad.device.type == "cuda"
        host = torch.zeros(3)
        assert host.device.type == "cpu" and (x.mean() + torch.tensor(1.0)).device.type == "cuda"
        assert [s.what for s in vc.syncs] == ["Tensor.cuda (a blocking copy to the device)"]


def test_host_tensors_mixed_into_device_work_fail_as_on_a_gpu():
    with VirtualCudaTraining():
        weight = torch.randn(4, 3, 3, 3, device="cuda")
        with pytest.raises(RuntimeError, match="same device"):
            F.conv2d(torch.empty(2, 3, 8, 8), weight)
        with pytest.raises(RuntimeError, match="same device"):
            torch.randn(3, device="cuda") + torch.ones(3)
        static = torch.empty(2, 3, 8, 8)
        static.copy_(torch.randn(2, 3, 8, 8, device="cuda"))   # a copy between them is allowed
        assert static.device.type == "cpu"


@pytest.mark.parametrize("read, name", [
    (lambda t: t.item(), "Tensor.item"), (lambda t: float(t), "Tensor.__float__"),
    (lambda t: bool(t > 0), "Tensor.__bool__"), (lambda t: t.tolist(), "Tensor.tolist"),
    (lambda t: print(t), "Tensor.__repr__"), (lambda t: f"{t:.3f}", "Tensor.__format__"),
    (lambda t: t.cpu(), "Tensor.cpu (a copy to the host)"), (lambda t: t.to("cpu"), "Tensor.to (a copy to the host)"),
    (lambda t: torch.cuda.synchronize(), "torch.cuda.synchronize"),
    (lambda t: torch.cuda.Event().synchronize(), "event.synchronize"),
    (lambda t: torch.tensor([1.0], device="cuda"), "torch.tensor(..., device='cuda'): a blocking copy"),
])
def test_every_wait_is_logged_and_refused_while_capturing(read, name, capsys):
    with VirtualCudaTraining() as vc:
        t = torch.ones((), device="cuda")
        read(t)
        assert len(vc.syncs) == 1 and vc.syncs[0].what.startswith(name), vc.syncs
        assert vc.syncs[0].where.endswith(".py:" + vc.syncs[0].where.rsplit(":", 1)[1])
        with pytest.raises(RuntimeError, match=CAPTURE_ERROR):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                read(t * 2)
        with vc.quiet():
            t.item()
        assert len(vc.syncs) == 2        # the one above, and the synchronize torch.cuda.graph makes first


def test_numpy_of_a_device_tensor_is_cudas_type_error():
    with VirtualCudaTraining():
        with pytest.raises(TypeError, match="can't convert cuda"):
            torch.ones(2, device="cuda").numpy()
        assert torch.ones(2).numpy().shape == (2,)


def test_host_work_outside_the_device_is_not_a_wait():
    with VirtualCudaTraining() as vc:
        host = torch.arange(4.0)
        host.sum().item()
        pinned = host.pin_memory()
        assert pinned.is_pinned() and not host.is_pinned()
        moved = pinned.to("cuda", non_blocking=True)       # pinned and non_blocking: no wait
        assert moved.device.type == "cuda" and vc.syncs == []
        with vc.quiet():
            assert torch.equal(moved, host)
    assert not hasattr(torch.Tensor.pin_memory, "__self__")
