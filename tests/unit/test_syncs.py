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
