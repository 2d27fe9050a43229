"""The live utilisation panel: its state after known samples, its drawing, its updates from the
sampling thread while the loop runs, and what it leaves behind (a static figure)."""
import itertools
import time

import numpy as np
import pytest
import torch

from course_utils import live as live_module
from course_utils.live import LiveMonitor, LiveState, _Panel, live_state
from course_utils.monitor import Timeline
from course_utils.train import train


def _timeline(**kw):
    t = np.arange(1, 11) * 0.1                     # ten samples, 0.1 .. 1.0 s
    base = dict(t_s=t, cpu_percent=np.column_stack([np.full(10, 90.0), np.r_[np.zeros(5), np.full(5, 40.0)]]),
                gpu_util=np.r_[np.zeros(5), np.full(5, 80.0)], gpu_mem_mb=np.full(10, 1234.0),
                device="a test GPU", ours_cores=np.r_[np.zeros(5), np.full(5, 1.2)],
                others_cores=np.r_[np.zeros(5), np.full(5, 0.1)])
    base.update(kw)
    return Timeline(**base)


def test_state_reads_the_last_refresh_window():
    s = live_state(_timeline(), [], now_s=1.0, refresh_s=0.45)
    # the samples after 0.55 s: t = 0.6 .. 1.0
    assert s.device_util == pytest.approx(80.0) and s.device_mem_mb == pytest.approx(1234.0)
    assert s.core_percent == pytest.approx([90.0, 40.0])
    assert s.ours_cores == pytest.approx(1.2) and s.others_cores == pytest.approx(0.1)
    assert s.util_history == pytest.approx([0.0] * 5 + [80.0] * 5)
    assert s.samples == 0 and s.samples_per_s is None and not s.simulated
    wide = live_state(_timeline(), [], now_s=1.0, refresh_s=1.0)
    assert wide.device_util == pytest.approx(40.0) and wide.core_percent == pytest.approx([90.0, 20.0])


def test_state_without_a_device_or_a_split():
    s = live_state(_timeline(gpu_util=None, gpu_mem_mb=None, ours_cores=None, others_cores=None), [], 1.0)
    assert s.device_util is None and s.device_mem_mb is None and s.ours_cores is None
    empty = live_state(Timeline(np.zeros(0), np.zeros((0, 2))), [], 0.0)
    assert empty.core_percent == [] and empty.device_util is None


def test_samples_per_s_counts_the_last_window():
    counts = [(0.5 + 0.1 * i, 128 * (i + 1)) for i in range(40)]      # a batch of 128 every 0.1 s
    s = live_state(_timeline(), counts, now_s=4.4, rate_window_s=2.0)
    assert s.samples == 128 * 40
    assert s.samples_per_s == pytest.approx(1280, rel=0.07)
    young = live_state(_timeline(), counts[:6], now_s=1.0, rate_window_s=2.0)   # younger than the window
    assert young.samples_per_s == pytest.approx(5 * 128 / 0.5)
    assert live_state(_timeline(), counts[:1], now_s=0.52).samples_per_s is None   # too short to tell


def test_the_panel_draws_the_state():
    panel = _Panel("baseline")
    state = LiveState(elapsed_s=3.2, device="simulated accelerator (7.4 ms/step)", simulated=True, device_util=63.4,
                      device_mem_mb=None, core_percent=[97.0, 12.0], ours_cores=1.1, others_cores=0.4, samples=2560,
                      samples_per_s=2480.0, util_history=[10.0, 60.0, 63.0], rate_history=[2000.0, 2480.0])
    panel.draw(state)
    assert panel.device_bar.value == pytest.approx(63.4)
    assert "simulated" in panel.header.value and "baseline" in panel.header.value
    assert "simulated busy 63%" in panel.device_text.value
    assert "2,480 samples/s (simulated device step)" in panel.rate.value and "2,560 samples so far" in panel.rate.value
    assert "core 0 97%" in panel.cores.value and "core 1 12%" in panel.cores.value
    assert "<b>1.1</b> cores" in panel.cores.value and "<b>0.4</b> cores" in panel.cores.value
    panel.draw(LiveState(0.0, "none", False, None, None, [5.0], None, None, 0, None))
    assert panel.device_bar.value == 0 and "no device readings" in panel.device_text.value
    assert "simulated" not in panel.header.value


def test_count_passes_batches_through_and_keeps_the_loader_attributes():
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(10.0)), batch_size=4)
    live = LiveMonitor(device="cpu", live=False)
    counted = live.count(loader)
    assert len(counted) == 3 and counted.num_workers == 0 and counted.batch_size == 4
    with live:
        batches = [b for b in counted]
    assert [b[0].tolist() for b in batches] == [b[0].tolist() for b in loader]
    assert live._total == 10


class _FakeHandle:
    def __init__(self, log):
        self.log = log

    def update(self, bundle, raw=False):
        self.log.append(("update", bundle))


@pytest.fixture
def fake_kernel(monkeypatch):
    """Pretend to run in a Jupyter kernel, recording what is displayed."""
    import IPython.display
    log = []

    def display(bundle, raw=False, display_id=None):
        log.append(("display", bundle))
        return _FakeHandle(log)

    monkeypatch.setattr(live_module, "in_kernel", lambda: True)
    monkeypatch.setattr(IPython.display, "display", display)
    monkeypatch.delenv("COURSE_LIVE", raising=False)
    return log


def test_the_panel_moves_while_the_loop_runs_then_becomes_a_figure(fake_kernel, sim):
    x, y = torch.zeros(32, 3, 32, 32), torch.zeros(32, dtype=torch.long)
    seen = []
    with LiveMonitor(device=sim, title="test", refresh_s=0.2, interval_s=0.05) as live:
        assert live.live
        original = live._refresh

        def watching(force=False):
            original(force)
            seen.append(live._panel.rate.value)
        live._refresh = watching
        train(None, live.count(itertools.repeat((x, y))), device=sim, steps=120, progress=False)
    kinds = [kind for kind, _ in fake_kernel]
    assert kinds == ["display", "update"]
    first, last = fake_kernel[0][1], fake_kernel[1][1]
    assert "application/vnd.jupyter.widget-view+json" in first and "text/plain" in first
    assert "application/vnd.jupyter.widget-view+json" not in last, "the end state must not need a widget"
    assert last["image/png"] and "simulated" in last["text/plain"] and "3,840 training samples" in last["text/plain"]
    rates = [v for v in dict.fromkeys(seen) if "samples so far" in v]
    assert len(rates) >= 3, "the panel should have been redrawn several times while the loop ran"
    assert live.refreshes >= 3 and live.refresh_seconds / live.refreshes < 0.01


def test_course_live_0_keeps_only_the_figure(fake_kernel, monkeypatch):
    monkeypatch.setenv("COURSE_LIVE", "0")
    with LiveMonitor(device="cpu", interval_s=0.05) as live:
        time.sleep(0.15)
    assert not live.live
    assert [kind for kind, _ in fake_kernel] == ["display"] and "image/png" in fake_kernel[0][1]


def test_outside_a_kernel_it_prints_the_summary(capsys):
    with LiveMonitor(device="cpu", interval_s=0.05, title="plain") as live:
        time.sleep(0.15)
    assert not live.live
    out = capsys.readouterr().out
    assert out.startswith("plain: ") and "the course" in out and "other processes" in out
