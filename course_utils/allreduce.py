"""What an all-reduce costs: the ring model, fitted to a measurement (lesson 07).

DDP all-reduces every gradient every step. NCCL (and gloo's ring algorithm) does it as a *ring*:
the tensor is cut into N chunks, and in 2(N-1) steps each rank sends one chunk to its neighbour
(N-1 steps of reduce-scatter, then N-1 of all-gather). Every rank therefore sends, and
receives, 2(N-1)/N times the tensor's bytes, whatever N is, and pays a fixed cost per step.
The time is

    t(bytes, N) = latency + 2(N-1)/N * bytes / bandwidth

`bandwidth` here is what NCCL's tests call *bus bandwidth*: the algorithm bandwidth times
2(N-1)/N, a normalisation that makes the figure independent of N and comparable with a link's
published speed, whatever algorithm NCCL actually runs (rings, trees, NVLS on NVSwitch nodes;
nccl-tests, doc/PERFORMANCE.md (nccl-tests, doc/PERFORMANCE.md:
https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md). Between nodes of several
GPUs, NCCL spreads its channels over every NIC of the node and crosses the node on NVLink, so the
bus bandwidth is about min(NVLink, NICs per node x one NIC), not one NIC's speed
(`hierarchical_bandwidth`; each `Interconnect` says which topology it assumes). `fit_ring()` finds latency and bandwidth
from (bytes, seconds) pairs measured by `notebooks/scripts/allreduce_bench.py`; `predict()`
uses them (or published figures, `INTERCONNECTS`) for other sizes and N.

`ddp_step_time()` is the lesson's scaling model: a step is the compute, plus whatever part of
the all-reduce the backward pass could not hide.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ring_factor", "ring_time", "RingFit", "fit_ring", "Interconnect", "INTERCONNECTS", "hierarchical_bandwidth",
           "ddp_step_time", "scaling_efficiency"]


def ring_factor(n: int) -> float:
    """2(N-1)/N: the multiple of the tensor's bytes each rank sends in a ring all-reduce."""
    n = int(n)
    if n < 1:
        raise ValueError(f"N must be >= 1; got {n}")
    return 2.0 * (n - 1) / n


def ring_time(nbytes, n: int, *, latency_s: float, bandwidth: float):
    """Seconds for a ring all-reduce of `nbytes` among `n` ranks (0 for a single rank):
    latency + 2(N-1)/N * bytes / bandwidth (bandwidth in bytes per second)."""
    if bandwidth <= 0:
        raise ValueError("bandwidth must be > 0 bytes/s")
    nbytes = np.asarray(nbytes, dtype=float)
    if int(n) == 1:
        return np.zeros_like(nbytes) if nbytes.shape else 0.0
    t = latency_s + ring_factor(n) * nbytes / bandwidth
    return t if np.ndim(t) else float(t)


@dataclass
class RingFit:
    """latency (s) and bus bandwidth (bytes/s) fitted to all-reduce timings among `n` ranks."""
    latency_s: float
    bandwidth: float
    n: int
    bytes: list[float] = field(default_factory=list, repr=False)
    seconds: list[float] = field(default_factory=list, repr=False)
    label: str = ""

    def predict(self, nbytes, n: int | None = None):
        """Seconds for `nbytes` among `n` ranks (default: as measured). For another N the
        latency is scaled by the number of ring steps, 2(N-1), from the measured N's."""
        n = self.n if n is None else int(n)
        latency = self.latency_s * (n - 1) / (self.n - 1) if self.n > 1 and n > 1 else self.latency_s
        return ring_time(nbytes, n, latency_s=latency, bandwidth=self.bandwidth)

    @property
    def relative_residuals(self) -> list[float]:
        """(measured - fit) / measured at each size."""
        fit = np.asarray(self.predict(self.bytes), dtype=float)
        measured = np.asarray(self.seconds, dtype=float)
        return ((measured - fit) / measured).tolist()

    def __str__(self) -> str:
        where = f" [{self.label}]" if self.label else ""
        return (f"all-reduce among {self.n}: {self.latency_s * 1e6:,.0f} us + {ring_factor(self.n):.2f} x bytes / "
                f"{self.bandwidth / 1e9:.2f} GB/s{where}")


def fit_ring(nbytes, seconds, n: int, *, label: str = "") -> RingFit:
    """Least-squares fit of t = latency + 2(N-1)/N * bytes / bandwidth to measured all-reduces.

    The errors are weighted by 1/t (relative errors), so the small sizes, which decide the
    latency, count as much as the large ones, which decide the bandwidth. The latency is kept
    >= 0 (a negative one is refitted through the origin)."""
    x = ring_factor(n) * np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if x.shape != t.shape or x.size < 2:
        raise ValueError("need at least two (bytes, seconds) pairs of equal length")
    if n < 2:
        raise ValueError("an all-reduce among one rank moves nothing: measure with N >= 2")
    if np.any(t <= 0):
        raise ValueError("times must be > 0 seconds")
    w = 1.0 / t
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if latency < 0:
        per_byte = float(np.sum(w * w * x * t) / np.sum(w * w * x * x))
        latency = 0.0
    if per_byte <= 0:
        raise ValueError("the times do not grow with the size: cannot fit a bandwidth (too noisy?)")
    return RingFit(float(latency), float(1.0 / per_byte), int(n), list(map(float, nbytes)),
                   list(map(float, seconds)), label)


def hierarchical_bandwidth(nic: float, nics_per_node: int, in_node: float) -> float:
    """Bus bandwidth of an all-reduce between nodes of several GPUs: NCCL's channels cross the node on
    its in-node link (NVLink) and leave it through all of its NICs at once, so the slower of the two
    decides: min(in-node link, NICs per node x one NIC's speed)."""
    return min(float(in_node), int(nics_per_node) * float(nic))


@dataclass(frozen=True)
class Interconnect:
    """A published link speed, as the bus bandwidth an all-reduce can use, with its source and the
    topology it assumes: `gpus_per_node` = 0 for a link inside one node (up to `max_in_node` GPUs),
    else the GPUs of each of the nodes it joins (N must then be a multiple of it, and span 2 nodes)."""
    name: str
    bandwidth: float        # bytes/s, per direction, per GPU (bus bandwidth)
    latency_s: float        # per all-reduce at small sizes (an assumed order of magnitude)
    scope: str              # "in a node" or "between nodes"
    source: str
    gpus_per_node: int = 0
    max_in_node: int = 8

    def applies(self, n: int) -> bool:
        """Can N devices be joined by this link, in its topology?"""
        n = int(n)
        if self.gpus_per_node == 0:
            return 2 <= n <= self.max_in_node
        return n >= 2 * self.gpus_per_node and n % self.gpus_per_node == 0

    @property
    def topology(self) -> str:
        if self.gpus_per_node == 0:
            return f"GPUs of one node (up to {self.max_in_node})"
        if self.gpus_per_node == 1:
            return "nodes of 1 GPU, 1 NIC each"
        return f"nodes of {self.gpus_per_node} GPUs, 1 NIC per GPU, NVLink inside"


# Per-direction link speeds from the vendors' specifications. These are peaks: measured NCCL
# bus bandwidth is typically 70-90% of them. The latencies are orders of magnitude for a small
# NCCL all-reduce (tens of microseconds), stated as assumptions, not measured here.
_HDR, _NDR, _NVLINK3, _NVLINK4 = 25e9, 50e9, 300e9, 450e9
INTERCONNECTS = [
    Interconnect("PCIe 4.0 x16", 31.5e9, 20e-6, "in a node",
                 "PCI-SIG PCIe 4.0 (pcisig.com/specifications): 16 GT/s per lane, 128b/130b encoding, 16 lanes = 31.5 GB/s "
                 "per direction"),
    Interconnect("PCIe 5.0 x16", 63.0e9, 20e-6, "in a node",
                 "PCI-SIG PCIe 5.0 (pcisig.com/specifications): 32 GT/s per lane, 16 lanes = 63 GB/s per direction"),
    Interconnect("NVLink 3 (A100)", _NVLINK3, 10e-6, "in a node",
                 "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): NVLink 600 GB/s per GPU, both directions together"),
    Interconnect("NVLink 4 (H100 SXM)", _NVLINK4, 10e-6, "in a node",
                 "NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): NVLink 900 GB/s per GPU, both directions together"),
    Interconnect("IB HDR, 1 GPU/node", _HDR, 30e-6, "between nodes",
                 "InfiniBand Trade Association roadmap (infinibandta.org): HDR = 200 Gb/s per 4x port (e.g. NVIDIA "
                 "ConnectX-6) = 25 GB/s; one GPU and one NIC per node", gpus_per_node=1),
    Interconnect("IB NDR, 1 GPU/node", _NDR, 30e-6, "between nodes",
                 "InfiniBand Trade Association roadmap (infinibandta.org): NDR = 400 Gb/s per 4x port (e.g. NVIDIA "
                 "ConnectX-7) = 50 GB/s; one GPU and one NIC per node", gpus_per_node=1),
    Interconnect("IB HDR, 8xA100 nodes", hierarchical_bandwidth(_HDR, 8, _NVLINK3), 30e-6, "between nodes",
                 "8 HDR NICs per node (DGX A100) = 200 GB/s, below NVLink 3's 300: min of the two; NVIDIA's NCCL "
                 "maintainer measures 192 GB/s all-reduce bus bandwidth there (github.com/NVIDIA/nccl/issues/1576)",
                 gpus_per_node=8),
    Interconnect("IB NDR, 8xH100 nodes", hierarchical_bandwidth(_NDR, 8, _NVLINK4), 30e-6, "between nodes",
                 "8 NDR NICs per node (DGX H100) = 400 GB/s, below NVLink 4's 450: min of the two", gpus_per_node=8),
    Interconnect("Ethernet 100 Gb/s", 12.5e9, 50e-6, "between nodes",
                 "IEEE 802.3 (100 Gigabit Ethernet): 100 Gb/s = 12.5 GB/s; one GPU and one NIC per node", gpus_per_node=1),
]


def ddp_step_time(compute_s: float, grad_bytes: float, n: int, *, latency_s: float, bandwidth: float,
                  overlap: float = 2 / 3) -> float:
    """Seconds per DDP step on `n` devices: the compute, plus the part of the gradients'
    all-reduce that the backward pass does not hide. DDP starts reducing a bucket as soon as its
    gradients are ready, so up to `overlap` x compute (the backward's share of a step, about
    two thirds) can run alongside it; the rest waits at the end of backward."""
    comm = ring_time(grad_bytes, n, latency_s=latency_s, bandwidth=bandwidth)
    hidden = overlap * compute_s
    return compute_s + max(0.0, comm - hidden)


def scaling_efficiency(compute_s: float, grad_bytes: float, n: int, *, latency_s: float, bandwidth: float,
                       overlap: float = 2 / 3) -> float:
    """Speed-up on `n` devices divided by `n` (1.0 = perfect), for a fixed batch per device."""
    step = ddp_step_time(compute_s, grad_bytes, n, latency_s=latency_s, bandwidth=bandwidth, overlap=overlap)
    return compute_s / step if math.isfinite(step) and step > 0 else 0.0
