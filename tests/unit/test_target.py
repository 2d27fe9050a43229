import itertools

import pytest
import torch

from course_utils.sim import SimulatedAccelerator
from course_utils.target import CPU_MODEL_WIDTH, Target, pick_target
from course_utils.train import train

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")


@no_gpu
def test_without_a_gpu_the_default_is_the_simulator(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    target = pick_target()
    try:
        assert target.kind == "sim" and target.simulated and not target.cuda
        assert isinstance(target.run_on, SimulatedAccelerator)
        assert target.device == torch.device("cpu") and target.model() is None
        assert "simulated" in target.label and "simulated" in target.describe()
    finally:
        target.close()


def test_course_device_cpu_trains_the_real_narrow_model(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    target = pick_target()
    assert target.kind == "cpu" and not target.simulated and target.run_on == torch.device("cpu")
    model = target.model()
    assert model.stem[0].out_channels == CPU_MODEL_WIDTH
    assert "COURSE_DEVICE=cpu" in target.label and "simulated" not in target.label
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    result = train(model, itertools.repeat((x, y)), device=target.run_on, steps=2, progress=False)
    assert result.steps == 2 and len(result.losses) == 2


def test_course_device_sim_and_an_explicit_simulator(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "sim")
    mine = SimulatedAccelerator(step_ms=1)
    try:
        target = pick_target(sim=mine)
        assert target.kind == "sim" and target.run_on is mine
    finally:
        mine.close()


def test_unknown_devices_are_refused_with_a_sentence(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "tpu")
    with pytest.raises(ValueError, match="COURSE_DEVICE"):
        pick_target()
    with pytest.raises(ValueError, match="kind must be"):
        Target("gpu", torch.device("cpu"), "cpu")


@no_gpu
def test_asking_for_a_missing_gpu_says_so(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cuda:1")
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        pick_target()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_local_rank_picks_the_device(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    monkeypatch.setenv("LOCAL_RANK", str(torch.cuda.device_count() - 1))
    target = pick_target()
    assert target.kind == "cuda" and target.device.index == torch.cuda.device_count() - 1
    assert next(target.model().parameters()).device == target.device
