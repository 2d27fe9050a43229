"""The CUDA-only paths of course_utils, on a real GPU (every test here skips without one).

Their CPU twins run everywhere (COURSE_DEVICE=cpu, tests/notebooks/test_gpu_paths.py); these
check what only a GPU can: CUDA events, asynchronous copies, the caching allocator, OOM forms.
"""
import itertools

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture
def gpu():
    from course_utils.env import pick_device
    return pick_device("cuda")


def test_step_timer_reads_cuda_events_without_a_sync_per_step(gpu):
    from course_utils.timing import StepTimer
    from course_utils.train import train

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 10)).to(gpu)
    x = torch.randn(256, 3, 32, 32, device=gpu)
    y = torch.randint(0, 10, (256,), device=gpu)
    timer = StepTimer(gpu, skip_first=2)
    result = train(model, itertools.repeat((x, y)), device=gpu, steps=12, timer=timer, progress=False)
    stats = result.stats
    assert stats.steps == 10 and not stats.synced_every_step
    assert len(stats.device_ms) == 10 and all(d > 0 for d in stats.device_ms)
    assert stats.device_busy_fraction > 0.5, "a device-bound loop keeps the GPU busy"
    spans = stats.device_spans
    assert all(a <= b for a, b in spans) and spans[-1][1] <= stats.step_log[-1]["step_end"] + 1e-3


def test_benchmark_on_a_named_gpu_uses_its_stream(gpu):
    from course_utils.timing import benchmark

    a = torch.randn(2048, 2048, device=gpu)
    result = benchmark(lambda: a @ a, device=gpu, warmup=2, repeats=5)
    assert result.median_ms > 0 and "cuda" in result.device


def test_train_with_fp16_and_a_scaler_on_the_gpu(gpu):
    from course_utils.models import resnet18_cifar
    from course_utils.train import train

    x = torch.randn(32, 3, 32, 32, device=gpu)
    y = torch.randint(0, 10, (32,), device=gpu)
    result = train(resnet18_cifar(width=16), itertools.repeat((x, y)), device=gpu, steps=3, amp="fp16",
                   channels_last=True, progress=False)
    assert all(torch.isfinite(torch.tensor(result.losses)))


def test_step_memory_is_measured_after_a_warm_up_step(gpu):
    from course_utils.memory import measure_step_memory, usable_device_memory
    from course_utils.models import resnet18_cifar

    x, y = torch.randn(64, 3, 32, 32, device=gpu), torch.randint(0, 10, (64,), device=gpu)
    m = measure_step_memory(resnet18_cifar(width=16), x, y, device=gpu)
    assert m.method == "torch.cuda.max_memory_allocated" and m.peak_bytes > m.state_bytes > 0
    assert usable_device_memory(gpu) >= torch.cuda.mem_get_info(gpu)[0]


def test_a_real_out_of_memory_is_recognised(gpu):
    from course_utils.memory import is_out_of_memory, release_device_memory

    total = torch.cuda.get_device_properties(gpu).total_memory
    with pytest.raises(Exception) as info:
        torch.empty(int(total * 2), dtype=torch.uint8, device=gpu)
    assert is_out_of_memory(info.value)
    release_device_memory(gpu)


def test_cuda_prefetcher_streams_and_record_stream(gpu):
    from course_utils.prefetch import CudaPrefetcher

    batches = [(torch.full((1 << 20,), float(i)).pin_memory(), torch.tensor([i]).pin_memory()) for i in range(5)]
    seen = [float(x[0]) for x, _ in CudaPrefetcher(batches, gpu)]
    assert seen == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_ladder_smoke_on_the_gpu(gpu):
    from course_utils.ladder import LadderConfig, climb

    result = climb(LadderConfig(steps=4, limit=1024, batch_size=64, device=str(gpu),
                                rungs=["baseline", "device-resident", "device-resident + bf16"]), progress=False)
    assert result.simulated is False and result.config["model"] == "resnet18"
    assert all(r["samples_per_s"] > 0 for r in result.rungs if not r.get("skipped"))


def test_target_on_the_gpu_trains_the_full_model(gpu, monkeypatch):
    from course_utils.target import pick_target

    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    target = pick_target()
    assert target.cuda and target.model_width == 64 and target.gpu_section("anything")


def test_lesson_05s_memory_cap_is_a_real_limit(gpu):
    """On a big card lesson 05 caps the allocator (its sweep and search took minutes on an H200):
    an allocation past the cap runs out of memory, one under it does not."""
    from course_utils.memory import is_out_of_memory, limit_device_memory, release_device_memory

    try:
        cap = limit_device_memory(gpu, 2 * 2**30)
        assert cap == 2 * 2**30
        kept = torch.empty(2**30, dtype=torch.uint8, device=gpu)
        with pytest.raises(Exception) as info:
            torch.empty(2 * 2**30, dtype=torch.uint8, device=gpu)
        assert is_out_of_memory(info.value)
        del kept
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, gpu)
        release_device_memory(gpu)
