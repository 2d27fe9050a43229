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


# -- the usable core count, faked (issue 26: smoke sizes must hold on 1 to 128 cores) -------------

def test_course_cores_fakes_the_usable_core_count(monkeypatch):
    monkeypatch.setenv("COURSE_CORES", "64")
    assert env.usable_cores() == 64 and env.env_report().usable_cores == 64
    for bad in ("0", "-3", "many", "2000"):
        monkeypatch.setenv("COURSE_CORES", bad)
        with pytest.raises(ValueError, match="COURSE_CORES"):
            env.usable_cores()
    monkeypatch.delenv("COURSE_CORES")
    assert env.usable_cores() >= 1


@pytest.mark.parametrize("cores", [1, 2, 3, 8, 16, 32, 64, 128])
@pytest.mark.parametrize("batches, timed, prefetch", [(14, 12, 2), (14, 8, 2), (40, 20, 4), (3, 2, 2), (200, 150, 2)])
def test_workers_for_never_asks_more_batches_than_there_are(cores, batches, timed, prefetch):
    """Lesson 04 on a 16-core box: 16 workers x 2 batches ahead + 8 timed > the 14 smoke batches
    (StopIteration). The helper keeps the warm-up and the timed batches inside the loader."""
    workers = env.workers_for(batches, timed, prefetch_factor=prefetch, cores=cores)
    assert 0 <= workers <= cores
    assert env.batches_needed(workers, timed, prefetch_factor=prefetch) <= max(batches, 1 + timed)
    if workers < cores:       # capped: one more worker would not fit
        assert env.batches_needed(workers + 1, timed, prefetch_factor=prefetch) > batches


def test_batches_needed_sizes_a_smoke_dataset():
    assert env.batches_needed(0, 8) == 9 and env.batches_needed(16, 8) == 1 + 32 + 8
    assert env.batches_needed(16, 8, prefetch_factor=4) == 1 + 64 + 8
    assert env.workers_for(None, cores=64) == 64
    with pytest.raises(ValueError):
        env.batches_needed(-1, 3)


# -- bfloat16 only where the GPU computes it (issue 19, item 6) ------------------------------------

@pytest.mark.parametrize("capability, native, amp", [((7, 0), False, "fp16"), ((7, 5), False, "fp16"),
                                                     ((8, 0), True, "bf16"), ((9, 0), True, "bf16")])
def test_bf16_needs_compute_capability_8(monkeypatch, capability, native, amp):
    """torch.cuda.is_bf16_supported() says True on a V100 or T4 (emulated): the course asks the capability."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert env.bf16_native() is native and env.bf16_native("cuda:0") is native
    assert env.fast_amp("cuda") == amp and env.fast_amp(torch.device("cuda", 0)) == amp
    assert env.fast_amp("cpu") is None and env.bf16_native("cpu") is False


def test_bf16_on_the_virtual_cuda_device():
    """The checks' virtual CUDA device has no properties: it answers as an Ampere-or-newer GPU."""
    from course_utils.checks.virtual_cuda import VirtualCuda
    with VirtualCuda() as vc:
        assert env.bf16_native(vc.device) and env.fast_amp(vc.device) == "bf16"
    if not torch.cuda.is_available():
        assert env.fast_amp() is None and not env.bf16_native()


def test_fast_amp_without_a_gpu_or_for_the_simulator(sim):
    assert env.fast_amp(sim) is None and env.bf16_native(sim) is False


# -- DALI: the real import error and the wheel for torch's CUDA (issue 19, item 8) -------------------

@pytest.mark.parametrize("cuda, wheel", [("13.0", "nvidia-dali-cuda130"), ("12.8", "nvidia-dali-cuda120"),
                                         ("11.8", "nvidia-dali-cuda120"), (None, "nvidia-dali-cuda130")])
def test_dali_wheel_matches_torch_cuda_major(cuda, wheel):
    name, version = env.dali_wheel(cuda).split("==")
    assert name == wheel and version == env._pinned_dali_version()


def test_the_pinned_dali_matches_the_installed_torch():
    """torch 2.14.1 from PyPI is built for CUDA 13 (and so is the GPU box's 2.11): DALI must be cuda130."""
    from pathlib import Path
    reqs = (Path(env.__file__).resolve().parents[1] / "requirements.txt").read_text()
    assert env.dali_wheel(torch.version.cuda) + ";" in reqs


def test_a_missing_or_broken_dali_keeps_its_error(monkeypatch, capsys):
    import sys
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)       # import raises ImportError
    error = env.dali_import_error()
    assert error.startswith(("ImportError", "ModuleNotFoundError")) and "nvidia.dali" in error
    assert not env.has_dali()
    advice = env.dali_advice()
    assert error in advice and env.dali_wheel() in advice
    assert env.require(dali=True, what="The DALI section") is False
    out = capsys.readouterr().out
    assert error in out and env.dali_wheel() in out
    report = env.env_report()
    assert report.dali is None and error in "\n".join(report.lines())


def test_dali_one_batch_computes_what_numpy_does():
    """The setup check's pipeline, on DALI's CPU here (the same graph runs on the GPU there)."""
    if not env.has_dali():
        pytest.skip(env.dali_advice())
    assert env._dali_one_batch(None) < 1e-4


def test_dali_gpu_check_says_why_it_did_not_run(monkeypatch):
    if not torch.cuda.is_available():
        ok, text = env.dali_gpu_check()
        assert ok is None and "no CUDA GPU" in text
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(env, "dali_import_error", lambda: "OSError: libcudart.so.13: cannot open shared object file")
    ok, text = env.dali_gpu_check()
    assert ok is None and "libcudart.so.13" in text and env.dali_wheel() in text
    monkeypatch.setattr(env, "dali_import_error", lambda: None)

    def broken(device_id, batch_size=8):
        raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version")
    monkeypatch.setattr(env, "_dali_one_batch", broken)
    ok, text = env.dali_gpu_check("cuda:0")
    assert ok is False and "FAILED" in text and "insufficient" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_dali_runs_one_batch_on_the_gpu():
    if not env.has_dali():
        pytest.skip(env.dali_advice())
    ok, text = env.dali_gpu_check()
    assert ok is True, text
