"""The ring all-reduce model and its fit (lesson 07)."""

import numpy as np
import pytest

from course_utils import allreduce


def test_ring_factor_and_time():
    assert allreduce.ring_factor(1) == 0 and allreduce.ring_factor(2) == 1.0
    assert allreduce.ring_factor(8) == pytest.approx(1.75)
    assert allreduce.ring_time(1e9, 1, latency_s=1e-5, bandwidth=1e10) == 0.0
    assert allreduce.ring_time(1e9, 4, latency_s=1e-5, bandwidth=1e10) == pytest.approx(1e-5 + 1.5 * 0.1)
    assert np.allclose(allreduce.ring_time(np.array([0.0, 1e6]), 2, latency_s=2e-5, bandwidth=1e9), [2e-5, 1.02e-3])
    with pytest.raises(ValueError):
        allreduce.ring_factor(0)
    with pytest.raises(ValueError):
        allreduce.ring_time(1.0, 2, latency_s=0.0, bandwidth=0.0)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_fit_recovers_latency_and_bandwidth_from_noisy_timings(n):
    rng = np.random.default_rng(n)
    sizes = np.array([4096 * 4 ** i for i in range(9)], dtype=float)
    latency, bandwidth = 150e-6, 2.5e9
    times = allreduce.ring_time(sizes, n, latency_s=latency, bandwidth=bandwidth) * rng.uniform(0.95, 1.05, sizes.size)
    fit = allreduce.fit_ring(sizes, times, n, label="synthetic")
    assert fit.latency_s == pytest.approx(latency, rel=0.1)
    assert fit.bandwidth == pytest.approx(bandwidth, rel=0.06)
    assert max(abs(r) for r in fit.relative_residuals) < 0.1
    assert "synthetic" in str(fit) and f"among {n}" in str(fit)
    # the latency grows with the ring's steps: 2(N-1)
    assert fit.predict(0.0, 2 * n) - fit.predict(0.0, n) == pytest.approx(fit.latency_s * n / (n - 1), rel=1e-9)


def test_fit_keeps_latency_non_negative_and_refuses_nonsense():
    fit = allreduce.fit_ring([1e5, 1e6, 1e7], [1e-5, 9e-4, 9.9e-3], 2)       # a line through them crosses 0 above 0 bytes
    assert fit.latency_s == 0.0 and fit.bandwidth > 0
    with pytest.raises(ValueError):
        allreduce.fit_ring([1e3], [1e-3], 2)
    with pytest.raises(ValueError):
        allreduce.fit_ring([1e3, 1e6], [1e-3, 1e-3 * 0.5], 2)              # shrinking times: no bandwidth
    with pytest.raises(ValueError):
        allreduce.fit_ring([1e3, 1e6], [1e-3, 2e-3], 1)


def test_step_model_hides_communication_behind_backward():
    kw = dict(latency_s=0.0, bandwidth=1e9)
    # 1 GB/s, 10 MB, 2 ranks: 10 ms of all-reduce
    assert allreduce.ddp_step_time(0.030, 1e7, 2, **kw) == pytest.approx(0.030)           # 20 ms hidden
    assert allreduce.ddp_step_time(0.003, 1e7, 2, **kw) == pytest.approx(0.003 + 0.010 - 0.002)
    assert allreduce.ddp_step_time(0.003, 1e7, 1, **kw) == pytest.approx(0.003)
    eff = [allreduce.scaling_efficiency(c, 1e7, 8, **kw) for c in (1e-3, 1e-2, 1e-1)]
    assert eff == sorted(eff) and eff[-1] == pytest.approx(1.0) and 0 < eff[0] < 0.2


def test_interconnects_name_their_sources():
    names = {i.name for i in allreduce.INTERCONNECTS}
    assert {"PCIe 4.0 x16", "NVLink 4 (H100 SXM)", "IB HDR, 1 GPU/node", "IB HDR, 8xA100 nodes"} <= names
    for link in allreduce.INTERCONNECTS:
        assert link.source and link.bandwidth > 1e9 and 0 < link.latency_s < 1e-3
        assert link.scope in ("in a node", "between nodes")
    pcie4 = next(i for i in allreduce.INTERCONNECTS if i.name == "PCIe 4.0 x16")
    assert pcie4.bandwidth == pytest.approx(16e9 * 16 * 128 / 130 / 8, rel=0.01)     # 16 GT/s x16, 128b/130b


def test_between_nodes_of_several_gpus_every_nic_carries_the_ring():
    """x-07 F3: 2 nodes x 8 GPUs over HDR were predicted with one NIC's 25 GB/s as the bus bandwidth
    (3.8 ms for ResNet-18's gradients): NCCL uses all 8 NICs, NVLink inside the node."""
    links = {i.name: i for i in allreduce.INTERCONNECTS}
    assert allreduce.hierarchical_bandwidth(25e9, 8, 300e9) == 200e9
    assert allreduce.hierarchical_bandwidth(50e9, 8, 300e9) == 300e9          # NVLink is then the limit
    hdr8 = links["IB HDR, 8xA100 nodes"]
    assert hdr8.bandwidth == 200e9 and hdr8.applies(16) and not hdr8.applies(8) and not hdr8.applies(12)
    assert links["IB HDR, 1 GPU/node"].bandwidth == 25e9 and links["IB HDR, 1 GPU/node"].applies(2)
    assert links["NVLink 4 (H100 SXM)"].applies(8) and not links["NVLink 4 (H100 SXM)"].applies(16)
    t16 = allreduce.ring_time(44.7e6, 16, latency_s=0.0, bandwidth=hdr8.bandwidth)
    assert 0.3e-3 < t16 < 0.5e-3
    assert all(i.topology for i in allreduce.INTERCONNECTS)
