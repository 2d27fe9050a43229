import torch

from course_utils.syncs import SyncCounter


def test_counts_value_reads_and_explicit_waits():
    x = torch.randn(10)
    with SyncCounter(host_reads=True) as syncs:
        loss = (x * 2).sum()
        loss.item()
        float(loss)
        f"{loss:.3f}"
        torch.cuda.synchronize()     # a no-op without a GPU, still counted
        torch.cuda.empty_cache()
    names = syncs.by_name()
    assert syncs.count >= 5
    assert names.get("item") == 1 and names.get("torch.cuda.synchronize") == 1
    assert names.get("torch.cuda.empty_cache") == 1
    assert all(w for w in syncs.where)


def test_pure_device_work_makes_no_sync_and_pause_hides_bookkeeping():
    x = torch.randn(64, 64)
    with SyncCounter(host_reads=True) as syncs:
        for _ in range(5):
            x = torch.tanh(x @ x)
        with syncs.paused():
            x.sum().item()
    assert syncs.count == 0
    assert torch.cuda.synchronize.__module__.startswith("torch"), "the wrappers are removed on exit"


def test_reports_the_callers_line_and_skips_host_tensors_without_host_reads():
    x = torch.randn(4)
    with SyncCounter(host_reads=True) as syncs:
        loss = (x * 2).sum()
        str(loss)
        if loss > 100:
            pass
    assert syncs.calls == ["__repr__", "__bool__"]
    assert all(w.rpartition(":")[2].isdigit() and "course_utils/syncs.py" not in w and "/torch/" not in w
               for w in syncs.where), syncs.where
    with SyncCounter(host_reads=False, cuda_debug=False) as syncs:
        x.sum().item()        # a CPU tensor and no GPU in play: nothing to wait for
    assert syncs.count == 0


def test_sgd_is_free_the_course_loop_reads_once_and_grad_scaler_once_per_step():
    import itertools

    import torch.nn.functional as F
    from torch import nn

    from course_utils.train import train

    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with SyncCounter(host_reads=True) as syncs:
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(model(torch.randn(4, 12)), torch.zeros(4, dtype=torch.long)).backward()
            opt.step()
    assert syncs.count == 0, syncs.calls
    batch = (torch.randn(4, 3, 2, 2), torch.zeros(4, dtype=torch.long))
    with SyncCounter(host_reads=True) as syncs:
        train(model, itertools.repeat(batch), device="cpu", steps=4, progress=False)
    assert syncs.by_name() == {"tolist": 1}
    with SyncCounter(host_reads=True) as syncs:
        train(model, itertools.repeat(batch), device="cpu", steps=3, amp="fp16", progress=False)
    assert syncs.by_name().get("item") == 3      # GradScaler.step reads its inf flag every step


def test_a_warning_from_a_read_names_the_callers_line():
    """torch's "requires_grad=True to a scalar" warning, raised inside the counter, is given the line that
    read the value, not course_utils/syncs.py's (walk w6-05)."""
    import warnings
    x = torch.ones(2, requires_grad=True)
    loss = (x * 2).sum()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SyncCounter(host_reads=True):
            value = float(loss)
    assert value == 4.0
    # torch raises that warning once per process: a warning of the same origin (this module's line) stands in for it
    import course_utils.syncs as syncs_module
    with warnings.catch_warnings(record=True) as stand_in:
        warnings.simplefilter("always")
        syncs_module._warning_at_caller(
            lambda: warnings.warn_explicit("a scalar from a tensor that requires grad", UserWarning,
                                           syncs_module.__file__, 90), (), {})
    caught = caught + stand_in
    assert caught
    assert all(w.filename == __file__ for w in caught), [(w.filename, w.lineno, str(w.message)[:60]) for w in caught]
