"""course_utils.loaders: throughput through train(), epoch start-up, worker memory, CPU share."""
import os
import sys
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from course_utils.loaders import (CpuUse, EpochTime, epoch_times, in_flight_batches, measure_loader,
                                  process_memory, worker_memory, worker_pids)


class Squares(Dataset):
    """Tiny tensors; item i is (i-filled image, i)."""

    def __init__(self, n=64, delay_s=0.0):
        self.n, self.delay_s = n, delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)
        return torch.full((3, 4, 4), float(i)), i


def test_in_flight_batches():
    assert in_flight_batches(DataLoader(Squares(), batch_size=4)) == 0
    assert in_flight_batches(DataLoader(Squares(), batch_size=4, num_workers=2)) == 4
    assert in_flight_batches(DataLoader(Squares(), batch_size=4, num_workers=2, prefetch_factor=5)) == 10
    assert in_flight_batches([1, 2, 3]) == 0


def test_measure_loader_counts_timed_steps_only(sim):
    batches = [(torch.zeros(8, 3, 4, 4), torch.zeros(8, dtype=torch.long))] * 5
    stats = measure_loader(batches, sim, 7, warmup=2)     # 9 steps: the 5-batch list is iterated twice
    assert stats.steps == 7 and stats.samples == 7 * 8
    assert stats.device_median_ms >= 9.5                            # the fixture's 10 ms device step
    # device-bound: the wall time per step is the device's step (a busy host stretches both alike)
    assert stats.step_time_ms == pytest.approx(stats.device_median_ms, rel=0.3)
    assert "simulated" in stats.device
    assert stats.samples_per_s == pytest.approx(8 / (stats.step_time_ms / 1e3), rel=1e-6)


def test_measure_loader_default_warmup_drains_the_prefetch_queue(sim):
    loader = DataLoader(Squares(64), batch_size=4, num_workers=2)
    stats = measure_loader(loader, sim, 3)
    assert stats.steps == 3          # 1 + 2 workers x 2 prefetched batches were skipped first


def test_measure_loader_guards():
    with pytest.raises(ValueError, match="needs a model"):
        measure_loader([(torch.zeros(2, 3), torch.zeros(2))], torch.device("cpu"), 3)
    with pytest.raises(ValueError, match="steps"):
        measure_loader([], torch.device("cpu"), 0, model=nn.Linear(3, 2))


def test_measure_loader_stops_on_a_used_up_iterator(sim):
    one_shot = iter([(torch.zeros(2, 3, 4, 4), torch.zeros(2, dtype=torch.long))] * 3)
    with pytest.raises(RuntimeError, match="no batches"):
        measure_loader(one_shot, sim, 10, warmup=0)


def test_measure_loader_trains_a_model_on_the_cpu():
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 40))
    loader = DataLoader(Squares(40), batch_size=8)
    stats = measure_loader(loader, torch.device("cpu"), 4, model=model, warmup=1)
    assert stats.steps == 4 and stats.samples == 32
    assert stats.device.startswith("CPU")


def test_epoch_times_persistent_workers_start_once():
    fresh = DataLoader(Squares(16), batch_size=4, num_workers=2)
    kept = DataLoader(Squares(16), batch_size=4, num_workers=2, persistent_workers=True)
    a, b = epoch_times(fresh, 3), epoch_times(kept, 3)
    assert all(isinstance(e, EpochTime) and e.batches == 4 for e in a + b)
    assert all(e.first_batch_s <= e.total_s for e in a + b)
    # epochs 2 and 3 reuse the workers: no start-up to pay, so their first batch comes sooner
    assert min(e.first_batch_s for e in b[1:]) < min(e.first_batch_s for e in a[1:])
    seen = []
    epoch_times(DataLoader(Squares(8), batch_size=4), 1, consume=seen.append)
    assert len(seen) == 2


def test_process_memory_of_this_process():
    m = process_memory()
    assert m.pid == os.getpid() and m.rss_mib > 10
    if sys.platform.startswith("linux"):
        assert m.uss_mib is not None and m.pss_mib is not None
        assert 0 < m.uss_mib <= m.pss_mib <= m.rss_mib + 1e-6


def test_worker_memory_names_each_worker():
    loader = DataLoader(Squares(32), batch_size=4, num_workers=2, persistent_workers=True)
    iterator = iter(loader)
    next(iterator)
    pids = worker_pids(iterator)
    assert len(pids) == 2 and os.getpid() not in pids
    mem = worker_memory(iterator)
    assert [m.pid for m in mem] == pids and all(m.rss_mib > 1 for m in mem)
    assert worker_pids(iter(DataLoader(Squares(4), batch_size=2))) == []
    del iterator, loader


def test_cpu_use_counts_our_work_and_workers():
    with CpuUse() as cpu:
        t_end = time.process_time() + 0.3
        while time.process_time() < t_end:
            pass
    assert 0.25 <= cpu.ours_cores * cpu.wall_s <= 0.5 and cpu.ours_cores <= 1.2
    assert cpu.others_cores >= 0 and cpu.wall_s >= 0.29
    assert "other processes" in str(cpu)

    class Busy(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            t_end = time.process_time() + 0.15       # 0.15 s of CPU, however busy the machine is
            while time.process_time() < t_end:
                pass
            return i

    with CpuUse() as cpu:
        list(DataLoader(Busy(), batch_size=None, num_workers=2))   # workers exit inside the block
    assert cpu.ours_cores * cpu.wall_s >= 0.55   # 4 x 0.15 s of worker CPU, counted once reaped
