"""Figures that always say which device produced them (every lesson).

- `stamp(fig, device)`: write the hardware (or 'simulated ...') in the figure's corner.
- `bar_chart(...)`: one bar per configuration, optionally against a ceiling line.
- `step_breakdown(stats)`: per-step data-wait and compute as stacked bars (lesson 01).
"""
from __future__ import annotations

import matplotlib.pyplot as plt

__all__ = ["stamp", "bar_chart", "step_breakdown"]


def stamp(fig, device: str) -> None:
    """Put 'measured on: <device>' in the bottom-right corner of `fig`."""
    fig.text(0.995, 0.005, f"measured on: {device}", ha="right", va="bottom", fontsize=7, color="dimgrey")


def bar_chart(labels, values, *, ylabel: str, title: str, device: str, ceiling: float | None = None,
              ceiling_label: str = "ceiling", fmt: str = "{:,.0f}", ax=None):
    """Bars of `values` named by `labels`, each annotated; a dashed line at `ceiling` if given."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(labels) + 2), 3.6))
    fig = ax.figure
    bars = ax.bar(range(len(values)), values, color="tab:blue")
    for bar, value in zip(bars, values):
        text = fmt.format(value)
        if ceiling:
            text += f"\n{value / ceiling:.0%}"
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    if ceiling:
        ax.axhline(ceiling, color="tab:red", ls="--", lw=1)
        ax.annotate(f"{ceiling_label} {fmt.format(ceiling)}", (-0.45, ceiling), ha="left",
                    va="bottom", color="tab:red", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=15 if len(labels) > 4 else 0, ha="right" if len(labels) > 4 else "center")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(0, max(list(values) + [ceiling or 0]) * 1.25)
    fig.tight_layout()
    stamp(fig, device)
    return fig


def step_breakdown(stats, *, title: str = "Where each step's time goes", max_steps: int = 80, ax=None):
    """Stacked bars per step: time blocked waiting for data (orange) and compute (blue)."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 3.2))
    fig = ax.figure
    waits = stats.data_wait_ms[:max_steps]
    comps = stats.compute_ms[:max_steps]
    steps = range(len(waits))
    ax.bar(steps, comps, color="tab:blue", label="compute (device work, synchronised)")
    ax.bar(steps, waits, bottom=comps, color="tab:orange", label="waiting for data")
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    ax.set_title(f"{title}: stalled on data {stats.stall_fraction:.0%} of the time")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    stamp(fig, stats.device)
    return fig
