import pytest
import torch

from course_utils import env
from course_utils.sim import SimulatedAccelerator


def test_print_env_reports_the_machine(capsys):
    report = env.print_env()
    out = capsys.readouterr().out
    for word in ("Python", "PyTorch", "CUDA", "CPU", "RAM", "DALI", "NVML"):
        assert word in out
    assert report.usable_cores >= 1 and report.ram_gib > 0
    assert report.cuda_available == torch.cuda.is_available()


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("0", False), ("", False)])
def test_smoke_mode_reads_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("COURSE_SMOKE", value)
    assert env.smoke_mode() is expected


def test_pick_device_defaults_to_what_is_there(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert env.pick_device().type == expected
    assert env.pick_device("cpu").type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_pick_device_refuses_a_missing_gpu_with_a_sentence(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cuda")
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        env.pick_device()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_require_explains_and_skips(capsys):
    assert env.require(gpu=True, what="Pinned bandwidth") is False
    out = capsys.readouterr().out
    assert "Pinned bandwidth needs 1 CUDA GPU" in out and "skipped" in out
    assert env.require() is True


def test_device_label_names_the_hardware():
    assert "CPU" in env.device_label("cpu")
    sim = SimulatedAccelerator(step_ms=1)
    try:
        assert "simulated" in env.device_label(sim)
    finally:
        sim.close()


def test_pick_device_modes(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "sim")
    assert env.pick_device() == torch.device("cpu")      # the simulator keeps tensors in host memory
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert env.pick_device() == torch.device("cpu")
    monkeypatch.setenv("COURSE_DEVICE", "bogus:device")
    with pytest.raises(ValueError, match="use unset"):
        env.pick_device()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_local_rank_chooses_the_gpu(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    last = torch.cuda.device_count() - 1
    monkeypatch.setenv("LOCAL_RANK", str(last))
    assert env.pick_device() == torch.device("cuda", last)
    monkeypatch.setenv("LOCAL_RANK", str(last + 1))
    with pytest.raises(RuntimeError, match="LOCAL_RANK"):
        env.pick_device()
