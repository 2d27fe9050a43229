"""The virtual CUDA device: placement, copies, syncs, mixed-device errors, streams and events."""
import pytest
import torch
import torch.nn.functional as F

from course_utils.checks.virtual_cuda import MIXED_DEVICES, NO_AUTOGRAD, DeviceTensor, VirtualCuda


def test_tensors_on_the_device_report_cuda_and_compute_on_the_host():
    with VirtualCuda() as vc:
        assert torch.cuda.is_available()
        x = torch.arange(6.0).view(2, 3)
        d = x.to("cuda")
        assert isinstance(d, DeviceTensor) and d.device == torch.device("cuda", 0) and d.is_cuda
        y = (d * 2 + 1).sum(0)
        assert y.device.type == "cuda"
        for made in (torch.zeros(3, device="cuda"), torch.arange(4, device=d.device), torch.empty_like(d),
                     torch.ones(2).cuda(), d.float(), d[0], d[:, 1:], F.pad(d.view(1, 1, 2, 3), (1, 1, 1, 1))):
            assert made.device.type == "cuda"
        assert torch.equal(y.cpu(), (x * 2 + 1).sum(0))
        assert [c.kind for c in vc.copies] == ["h2d", "h2d", "d2h"]     # .to, .cuda, .cpu
    assert not torch.cuda.is_available() or torch.cuda.device_count() > 0
    assert torch.equal(d.cpu(), x)      # still readable after the block


def test_mixing_device_and_host_tensors_raises_what_cuda_raises():
    with VirtualCuda():
        d = torch.ones(3, device="cuda")
        with pytest.raises(RuntimeError, match="same device"):
            d + torch.ones(3)
        with pytest.raises(RuntimeError, match="same device"):
            torch.cat([d, torch.ones(2)])
        assert (d + torch.tensor(2.0)).device.type == "cuda"        # a 0-dim host tensor is allowed
        idx = torch.tensor([2, 0])
        assert torch.equal(d[idx].cpu(), torch.ones(2))               # host indices: an implicit copy
    assert MIXED_DEVICES.startswith("Expected all tensors")


def test_copies_record_pinning_blocking_and_the_stream():
    with VirtualCuda() as vc:
        host = torch.randn(4, 5)
        pinned = host.pin_memory()
        assert pinned.is_pinned() and not host.is_pinned()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            a = pinned.to("cuda", non_blocking=True)
        b = host.to("cuda", non_blocking=True)          # pageable: the host waits anyway
        c = torch.tensor([1.0, 2.0], device="cuda")       # from Python data: a blocking copy
        copies = vc.h2d()
        assert [(x.pinned, x.non_blocking, x.blocks_host) for x in copies] == [
            (True, True, False), (False, True, True), (False, False, True)]
        assert copies[0].stream == side.id and copies[1].stream == vc.default_stream.id
        assert copies[0].where.endswith(".py:" + str(copies[0].where.rsplit(":", 1)[1]))
        assert len(vc.syncs) == 2
        del a, b, c


def test_host_reads_are_syncs_and_numpy_is_refused():
    with VirtualCuda() as vc:
        d = torch.arange(4.0, device="cuda")
        d.sum().item()
        float(d[0])
        d.tolist()
        repr(d)
        torch.equal(d, d)
        d[d > 1]
        with pytest.raises(TypeError, match="cpu"):
            d.numpy()
        assert len(vc.syncs) == 6


def test_generators_belong_to_a_device():
    with VirtualCuda() as vc:
        g = vc.generator(3)
        assert g.device.type == "cuda"
        a = torch.randint(0, 9, (5,), device="cuda", generator=g)
        assert a.device.type == "cuda"
        with pytest.raises(RuntimeError, match="'cpu' device type for generator"):
            torch.randint(0, 9, (5,), generator=g)
        with pytest.raises(RuntimeError, match="'cuda' device type for generator"):
            torch.rand(5, device="cuda", generator=torch.Generator())
        torch.manual_seed(5)
        first = torch.rand(3, device="cuda").cpu()
        torch.manual_seed(5)
        assert torch.equal(torch.rand(3, device="cuda").cpu(), first)
        assert torch.equal(torch.randint(0, 9, (5,), device="cuda", generator=vc.generator(3)).cpu(), a.cpu())


def test_a_side_stream_is_invisible_until_waited_for():
    with VirtualCuda() as vc:
        side = torch.cuda.Stream()
        pinned = torch.randn(8).pin_memory()
        with torch.cuda.stream(side):
            early = pinned.to("cuda", non_blocking=True)
        (early * 2).sum()                                    # read at once: a race
        assert len(vc.races) == 1
        with torch.cuda.stream(side):
            late = pinned.to("cuda", non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)
        (late * 2).sum()
        assert len(vc.races) == 1
        event = torch.cuda.Event()
        with torch.cuda.stream(side):
            third = pinned.to("cuda", non_blocking=True)
            event.record()
        torch.cuda.current_stream().wait_event(event)
        third.sum()
        assert len(vc.races) == 1
        with torch.cuda.stream(side):
            fourth = pinned.to("cuda", non_blocking=True)
        torch.cuda.synchronize()                            # the host waited: everything is done
        fourth.sum()
        assert len(vc.races) == 1 and vc.syncs[-1].what == "torch.cuda.synchronize"


def test_record_stream_is_needed_for_memory_used_on_another_stream():
    with VirtualCuda() as vc:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            a = torch.ones(4).pin_memory().to("cuda", non_blocking=True)
            b = torch.ones(4).pin_memory().to("cuda", non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)
        vc.mark(a, "batch a")
        vc.mark(b, "batch b")
        a.sum(), b.sum()
        assert sorted(x.label for x in vc.unrecorded()) == ["batch a", "batch b"]
        a.record_stream(torch.cuda.current_stream())
        b.record_stream(side)                                # the wrong stream
        assert [x.label for x in vc.unrecorded()] == ["batch b"]
        b[1:].record_stream(torch.cuda.current_stream())     # a view records its memory
        assert vc.unrecorded() == []


def test_no_autograd_on_the_device_and_a_clear_error():
    with VirtualCuda():
        d = torch.ones(3, device="cuda")
        with pytest.raises(RuntimeError, match="no gradients"):
            d.requires_grad_()
        with pytest.raises(RuntimeError, match="no gradients"):
            d.requires_grad = True
        with pytest.raises(RuntimeError, match="no gradients"):
            torch.nn.Linear(2, 2).to("cuda")
        with pytest.raises(RuntimeError, match="no gradients"):
            d * torch.tensor(2.0, requires_grad=True)
    assert "no gradients" in NO_AUTOGRAD


def test_leaving_the_block_restores_torch_cuda():
    before = (torch.cuda.is_available, torch.cuda.Stream, torch.cuda.synchronize)
    with VirtualCuda():
        assert torch.cuda.Stream is not before[1]
    assert (torch.cuda.is_available, torch.cuda.Stream, torch.cuda.synchronize) == before
    assert torch.cuda.is_available() == before[0]()


def test_view_writes_and_in_place_ops_keep_the_allocation():
    with VirtualCuda() as vc:
        side = torch.cuda.Stream()
        d = torch.zeros(4, 3, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            d[1:].add_(1)                                     # written on the side stream
        d.sum()
        assert len(vc.races) == 1
        d2 = torch.zeros(2, device="cuda")
        d2.copy_(torch.ones(2))
        assert torch.equal(d2.cpu(), torch.ones(2)) and vc.h2d()[-1].what == "Tensor.copy_"


def test_the_course_prefetcher_and_accel_helpers_are_right_on_the_virtual_device():
    from course_utils import accel
    from course_utils.prefetch import CudaPrefetcher
    with VirtualCuda() as vc:
        batches = [(torch.randn(4, 3).pin_memory(), torch.arange(4).pin_memory()) for _ in range(5)]
        assert isinstance(accel.new_stream("cuda"), torch.cuda.Stream)
        seen = 0
        for images, labels in CudaPrefetcher(batches, torch.device("cuda")):
            assert images.is_cuda and labels.is_cuda
            (images * 2).sum(), labels.sum()
            seen += 1
        assert seen == 5
        assert vc.races == [] and vc.unrecorded() == [] and vc.syncs == []
        assert len(vc.h2d()) == 10 and all(c.non_blocking and c.pinned for c in vc.h2d())
        assert all(c.stream != vc.default_stream.id for c in vc.h2d())


def test_a_dataloader_pins_its_batches_through_the_virtual_device():
    """DataLoader(pin_memory=True) pins in a thread of its own (with workers) or in the loop: both
    pin through the virtual device, so its batches copy without making the host wait (lesson 08)."""
    from torch.utils.data import DataLoader, TensorDataset
    data = TensorDataset(torch.arange(24.0).view(12, 2), torch.arange(12))
    for workers in (0, 1):
        with VirtualCuda() as vc:
            assert torch.cuda.is_bf16_supported()
            got = []
            for x, y in DataLoader(data, batch_size=4, num_workers=workers, pin_memory=True):
                assert vc.is_pinned(x) and vc.is_pinned(y), workers
                got.append(x.to("cuda", non_blocking=True))
            assert vc.syncs == [] and all(c.pinned and not c.blocks_host for c in vc.h2d())
            assert torch.equal(torch.cat([g.cpu() for g in got]), data.tensors[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_beside_a_real_gpu_the_virtual_device_takes_the_next_index():
    real = torch.ones(3, device="cuda")
    with VirtualCuda() as vc:
        assert vc.device.index >= 1
        d = vc.to_device(torch.ones(3))
        assert d.device == vc.device and d.device != real.device
        with pytest.raises(RuntimeError, match="same device"):
            d + real
    assert torch.cuda.is_available() and (real * 2).sum().item() == 6.0    # the real GPU works after the block


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_checks_of_lesson_03_pass_on_a_real_gpu_with_a_device_keyed_cache():
    """On a GPU the checks run the learner's code on the real device and on the virtual one; a
    cache of constants keyed by device (the 3.3 solution) must not hand one's tensors to the other."""
    from course_utils.checks import run_check
    from test_checks_lesson03 import GoodPrefetcher, crop_flip, good_normalize
    for exercise, answer in (("3.1", GoodPrefetcher), ("3.2", crop_flip), ("3.3", good_normalize)):
        result = run_check(exercise, answer)
        assert result.status == "pass", (exercise, result.message)


def test_beside_a_real_gpu_current_device_points_at_the_virtual_device(monkeypatch):
    """Learner code that builds `torch.device("cuda", torch.cuda.current_device())` or counts the
    devices must reach the virtual device, not the real GPU at cuda:0 (issue 19, item 18). One
    real GPU is faked here, so the CPU-only CI sees what a GPU machine would."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with VirtualCuda() as vc:
        assert vc.device == torch.device("cuda", 1)
        assert torch.cuda.current_device() == 1 and torch.cuda.device_count() == 2
        here = torch.device("cuda", torch.cuda.current_device())
        made = torch.zeros(3, device=here)
        last = vc.to_device(torch.ones(3)).to(torch.device("cuda", torch.cuda.device_count() - 1))
        assert made.device == vc.device == last.device
        with torch.cuda.device(torch.cuda.current_device()):
            assert (made + last).sum().item() == 3.0
    assert torch.cuda.current_device() == 0 and torch.cuda.device_count() == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_real_gpu_pass_of_check_3_1_sees_a_missing_wait_stream():
    """On a fast GPU the copy finishes long before the host reads the batch, so a prefetcher
    without wait_stream read right values (issue 19, item 17). The real pass holds the side
    stream busy before each copy: the mutant now reads unfinished copies, the answer does not."""
    from course_utils.checks._core import CheckFailed
    from course_utils.checks.lesson03 import _check_cuda_streams
    from test_checks_lesson03 import GoodPrefetcher, NoWaitStream
    _check_cuda_streams(GoodPrefetcher)
    with pytest.raises(CheckFailed, match="the consumer waits for the copy") as failed:
        _check_cuda_streams(NoWaitStream)
    assert "before their copy had finished" in failed.value.detail      # (str() is the property only)


def test_memory_of_an_exited_virtual_device_is_finished_work():
    """A learner's cache of device constants (lesson 03's _MEAN_STD) outlives one check's virtual
    device; read again inside the next one, its writes are long finished: no race."""
    with VirtualCuda() as first:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            cached = torch.ones(4, device="cuda") * 2
    with VirtualCuda() as second:
        out = cached + torch.zeros(4, device="cuda")
        assert not second.races and torch.equal(out.cpu(), torch.full((4,), 2.0))
    assert first is not second


def test_a_device_tensor_as_a_slice_bound_is_a_read_on_the_host():
    with VirtualCuda() as vc:
        x = torch.arange(10, device="cuda")
        k = torch.tensor(3, device="cuda")
        y = x[k:k + 4]
        assert torch.equal(y.cpu(), torch.arange(3, 7))
        assert any("slice bound" in s.what for s in vc.syncs)


# -- issue 37 (x-03 B1, B3, B6; x-08 F3): copies in flight, threads, two devices, generators ---------

def test_a_host_write_into_a_pinned_source_before_its_copy_is_done_is_a_race():
    with VirtualCuda() as vc:
        side = torch.cuda.Stream()
        buf = torch.zeros(4).pin_memory()
        with torch.cuda.stream(side):
            d = buf.to("cuda", non_blocking=True)
        buf.copy_(torch.ones(4))                           # the DMA may not have read it yet
        assert [r.kind for r in vc.races] == ["host_write"]
        vc.races.clear()
        side.synchronize()                                 # now it has
        buf.fill_(2.0)
        with torch.cuda.stream(side):
            e = buf.to("cuda", non_blocking=True)
        event = torch.cuda.Event()
        event.record(side)
        event.synchronize()
        buf.numpy()[:] = 3.0                               # after the wait: fine, even through numpy
        vc.settle()
        assert vc.races == [] and torch.equal(d.cpu(), torch.zeros(4)) and torch.equal(e.cpu(), torch.full((4,), 2.0))
        with torch.cuda.stream(side):
            buf.to("cuda", non_blocking=True)
        buf.numpy()[:] = 4.0                               # numpy escapes the mode: seen when compared
        vc.settle()
        assert [r.kind for r in vc.races] == ["host_write"]


def test_a_non_blocking_copy_to_the_host_lands_only_when_the_host_waits():
    with VirtualCuda() as vc:
        values = torch.arange(4.0, device="cuda")
        early = values.to("cpu", non_blocking=True)
        assert early.is_pinned() and not vc.syncs
        assert torch.isnan(early.clone()).all()           # read at once: not there yet (and a race)
        assert [r.kind for r in vc.races] == ["host_read"]
        torch.cuda.current_stream().synchronize()
        assert torch.equal(early, torch.arange(4.0))
        dst = torch.zeros(4).pin_memory()
        dst.copy_(values, non_blocking=True)
        assert torch.equal(dst.clone(), torch.zeros(4))   # what was there before
        torch.cuda.synchronize()
        assert torch.equal(dst, torch.arange(4.0))


def test_threads_have_their_own_current_stream_and_run_on_the_device():
    import threading
    with VirtualCuda() as vc:
        side = torch.cuda.Stream()
        seen = {}

        def work():
            seen["before"] = torch.cuda.current_stream()
            with torch.cuda.stream(side):
                seen["inside"] = torch.cuda.current_stream()
                seen["copy"] = torch.ones(3).pin_memory().to("cuda", non_blocking=True)

        with torch.cuda.stream(side):
            thread = threading.Thread(target=work)
            thread.start()
            thread.join()
            assert torch.cuda.current_stream() is side
        assert seen["before"] is vc.default_stream and seen["inside"] is side
        assert isinstance(seen["copy"], DeviceTensor) and vc.h2d()[-1].stream == side.id


def test_the_second_of_two_devices_catches_code_for_device_0():
    from course_utils.checks.virtual_cuda import OTHER_DEVICE
    with VirtualCuda(second=True) as vc:
        assert vc.device == torch.device("cuda", 1) and torch.cuda.current_device() == 0
        for wrong in (lambda: torch.ones(2).to("cuda"), lambda: torch.ones(2).to("cuda:0"),
                      lambda: torch.ones(2).cuda(), lambda: torch.zeros(2, device="cuda")):
            with pytest.raises(RuntimeError, match=OTHER_DEVICE):
                wrong()
        assert torch.ones(2).to(vc.device).device == vc.device
        other = torch.cuda.Stream()                         # on the current device, cuda:0
        with torch.cuda.stream(other):
            assert torch.cuda.current_device() == 0
            torch.ones(2).pin_memory().to(vc.device, non_blocking=True)
        assert vc.h2d()[-1].stream == vc.default_stream.id  # queued on cuda:1's current stream
        with torch.cuda.device(1):
            assert torch.zeros(2, device="cuda").device == vc.device
        first = vc.to_device(torch.ones(2))
    with VirtualCuda():
        with pytest.raises(RuntimeError, match="cuda:0 and cuda:1"):
            first + torch.ones(2, device="cuda")


def test_every_random_op_takes_a_device_generator_and_where_takes_python_numbers():
    with VirtualCuda() as vc:
        g = vc.generator(0)
        p = torch.full((8,), 0.5, device="cuda")
        made = [torch.bernoulli(p, generator=g), torch.empty(8, device="cuda").uniform_(generator=g),
                torch.empty(8, device="cuda", dtype=torch.long).random_(0, 9, generator=g),
                torch.multinomial(torch.ones(9, device="cuda"), 8, True, generator=g)]
        assert all(isinstance(t, DeviceTensor) for t in made)
        with pytest.raises(RuntimeError, match="'cuda' device type for generator"):
            torch.bernoulli(p, generator=torch.Generator())
        mask = torch.arange(4, device="cuda") > 1
        x = torch.ones(4, device="cuda", dtype=torch.float16)
        assert torch.where(mask, -1, 1).dtype == torch.int64 and torch.where(mask, x, 0.0).dtype == torch.float16
        assert torch.equal(torch.where(mask, -1, 1).cpu(), torch.tensor([1, 1, -1, -1]))
        torch.empty(3, pin_memory=True)                      # the factory argument pins through the device
        assert not vc.h2d()


def test_memory_handed_out_again_before_the_other_stream_is_done_is_a_hazard():
    def one(vc, side, record, wait_back):
        consumer = torch.cuda.current_stream()
        if wait_back:
            side.wait_stream(consumer)
        with torch.cuda.stream(side):
            batch = torch.ones(4).pin_memory().to("cuda", non_blocking=True)
        consumer.wait_stream(side)
        vc.mark(batch, "batch")
        if record:
            batch.record_stream(consumer)
        batch.sum()                                           # read on the consumer's stream; freed on return

    for record, wait_back, hazard in ((False, False, True), (True, False, False), (False, True, False)):
        with VirtualCuda() as vc:
            side = torch.cuda.Stream()
            one(vc, side, record, wait_back)
            one(vc, side, record, wait_back)                  # the next allocation on the side stream
            assert bool(vc.reuse_hazards()) == hazard, (record, wait_back)
    with VirtualCuda() as vc:
        x = torch.ones(10, device="cuda")
        vc.reset_log()
        for _ in range(5):
            y = x * 2
            del y
        assert vc.peak_bytes == 40 and vc.allocated_bytes == 200 and vc.ops == 5


def test_a_gpu_of_its_own_per_local_rank():
    """Lesson 07's nccl pass (x-07 F2): GPU `index` of a node of `count`; a tensor asked for on another
    GPU of the node, or on one the node does not have, fails as it would there."""
    with VirtualCuda(index=1, count=2, other_device="found {found}, own {own}") as vc:
        assert torch.cuda.current_device() == 1 and torch.cuda.device_count() == 2
        assert torch.tensor([1.0], device="cuda").device == vc.device == torch.device("cuda", 1)
        assert torch.zeros(2, device=torch.device("cuda", 1)).is_cuda
        assert torch.ones(2).to("cuda:1").is_cuda
        with pytest.raises(RuntimeError, match="found cuda:0, own cuda:1"):
            torch.tensor([1.0], device=torch.device("cuda", 0))
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.ones(2).to(torch.device("cuda", 3))
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.zeros(2, device="cuda:2")
    from course_utils.checks.virtual_cuda import OTHER_DEVICE
    with VirtualCuda() as vc:           # without an index: the one device, and work put on another is caught
        assert torch.tensor([1.0], device="cuda").device == vc.device
        with pytest.raises(RuntimeError, match=OTHER_DEVICE):
            torch.tensor([1.0], device="cuda:5")


def test_pinned_allocations_and_generators_made_are_counted():   # w11-03: what lesson 03's checks name
    with VirtualCuda() as vc:
        buffer = torch.empty(4, 3, pin_memory=True)
        assert vc.is_pinned(buffer) and len(vc.pinned_made) == 1 and "pin_memory=True" in vc.pinned_made[0]
        assert not vc.pins                       # an allocation, not a pin_memory() copy
        made = vc.generators_made
        torch.Generator(device="cuda"), torch.Generator()
        assert vc.generators_made == made + 2
        vc.reset_log()
        assert not vc.pinned_made
