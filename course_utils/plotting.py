"""Figures that always say which device produced them (every lesson).

- `stamp(fig, device)`: write the hardware (or 'simulated ...') in the figure's corner.
- `bar_chart(...)`: one bar per configuration, optionally against a ceiling line.
- `step_breakdown(stats)`: the loop's steps on a time axis, host (waiting for data / in the step)
  above the device's busy spans (lesson 01).
"""
from __future__ import annotations

import matplotlib.pyplot as plt

__all__ = ["stamp", "bar_chart", "step_breakdown"]


def stamp(fig, device: str) -> None:
    """Put 'measured on: <device>' in the bottom-right corner of `fig`, wrapped to the figure's
    width (a line wider than the figure would make the notebook's tight bounding box widen the
    image and squeeze the axes); when it takes more than one line, the axes move up to make room."""
    import textwrap
    import re
    text = f"measured on: {device}"
    per_line = max(40, int(fig.get_figwidth() * 72 / (7 * 0.58)))     # 7-point characters across the figure
    glued = re.sub(r"(\d) (?=[A-Za-z%/]+\b)", "\\1\u00a0", text)   # a number and its unit on one line ("1500 GB/s")
    lines = [line.replace("\u00a0", " ") for line in textwrap.wrap(glued, per_line)] or [text]
    fig.text(0.995, 0.005, "\n".join(lines), ha="right", va="bottom", fontsize=7, color="dimgrey")
    if len(lines) > 1:
        extra = (len(lines) - 1) * 7 * 1.3 / 72 / fig.get_figheight()
        fig.subplots_adjust(bottom=min(fig.subplotpars.bottom + extra, 0.5))


def bar_chart(labels, values, *, ylabel: str, title: str, device: str, ceiling: float | None = None,
              ceiling_label: str = "ceiling", fmt: str = "{:,.0f}", ax=None, scale: str = "linear",
              allow_cut: bool = True, fractions=None):
    """Bars of `values` named by `labels`, each annotated; a dashed line at `ceiling` if given.
    `fractions`, when given, are the bars' shares of the ceiling as the caller's table prints them: each label
    formats that very number (walk w9-08: a table's 1510% beside a chart's 1511%, the one divided from rounded
    figures, the other not), not value / ceiling computed again here.
    The ceiling's label sits beyond the right end of its line, outside the bars, where no bar's label
    can be drawn over it (w2-08: "ceiling 8,9551,654" over the first bar). One bar far above all the
    others (more than 3x the next, a CUDA graph's 950% beside rungs under 100%) would flatten them:
    the axis then stops at twice the next one, and that bar is drawn cut, its label inside it, unless
    `allow_cut=False` (lesson 04, w9-04: a cut bar beside one of the same kind read 2:1 for 3.4:1).

    `scale="log"` (lesson 08's ladder and report card): a log axis, never cut, whatever the values (walk w7-08: the
    same chart drawn cut in one run and whole in the next, as a CUDA graph's bar crossed 3x the next one or not), each
    bar's label inside its bar at the foot of the axis, below every bar's top and below the ceiling line, which
    therefore never crosses a label (the red line ran through the small bars' labels)."""
    values = list(values)
    if scale == "log" and values and min(values) > 0:
        return _log_bar_chart(labels, values, ylabel=ylabel, title=title, device=device, ceiling=ceiling,
                              ceiling_label=ceiling_label, fmt=fmt, ax=ax, fractions=fractions)
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(labels) + 2), 3.6))
    fig = ax.figure
    values = list(values)
    top = max(values + [ceiling or 0]) * 1.25
    ordered = sorted(values, reverse=True)
    cut = None
    if allow_cut and len(ordered) > 2 and ordered[1] > 0 and ordered[0] > 3 * max(ordered[1], ceiling or 0):
        cut = 2 * max(ordered[1], ceiling or 0)
        top = cut * 1.1
    bars = ax.bar(range(len(values)), [min(v, cut) if cut else v for v in values], color="tab:blue")
    for i, (bar, value) in enumerate(zip(bars, values)):
        text = fmt.format(value)
        if ceiling:
            text += _share_of(value, ceiling, fractions, i)
        if cut and value > cut:
            ax.annotate(text + "\n(bar cut)", (bar.get_x() + bar.get_width() / 2, cut * 0.97), ha="center", va="top",
                        fontsize=8, color="white")
            continue
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    if ceiling:
        ax.axhline(ceiling, color="tab:red", ls="--", lw=1)
        ax.text(1.01, ceiling, f"{ceiling_label}\n{fmt.format(ceiling)}", transform=ax.get_yaxis_transform(),
                ha="left", va="center", color="tab:red", fontsize=8, clip_on=False)
    ax.set_xticks(range(len(labels)), labels, rotation=15 if len(labels) > 4 else 0, ha="right" if len(labels) > 4 else "center")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_xlim(-0.6, len(values) - 0.4)
    ax.set_ylim(0, top)
    fig.tight_layout()
    stamp(fig, device)
    return fig


def _share_of(value, ceiling, fractions, i) -> str:
    """A bar's share of the ceiling as a label: the caller's own fraction where given (the table's number)."""
    return "\n" + f"{(fractions[i] if fractions is not None else value / ceiling):.0%}"


def _log_bar_chart(labels, values, *, ylabel, title, device, ceiling, ceiling_label, fmt, ax, fractions=None):
    import math

    from matplotlib.transforms import blended_transform_factory
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(labels) + 2), 3.6))
    fig = ax.figure
    every = values + ([ceiling] if ceiling else [])
    high, low = math.log10(max(every) * 1.6), math.log10(min(every))
    # the foot of the axis low enough that every bar's top and the ceiling stand above its lowest 30%, where the
    # labels go: bottom <= (low - 0.3 * high) / 0.7, and at least a factor 2 under the lowest
    bottom = min(low - math.log10(2), (low - 0.3 * high) / 0.7)
    ax.set_yscale("log")
    ax.set_ylim(10 ** bottom, 10 ** high)
    bars = ax.bar(range(len(values)), [v - 10 ** bottom for v in values], bottom=10 ** bottom, color="tab:blue")
    foot = blended_transform_factory(ax.transData, ax.transAxes)
    for i, (bar, value) in enumerate(zip(bars, values)):
        text = fmt.format(value)
        if ceiling:
            text += _share_of(value, ceiling, fractions, i)
        ax.text(bar.get_x() + bar.get_width() / 2, 0.02, text, transform=foot, ha="center", va="bottom", fontsize=8,
                color="white", fontweight="bold")
    if ceiling:
        ax.axhline(ceiling, color="tab:red", ls="--", lw=1)
        ax.text(1.01, ceiling, f"{ceiling_label}\n{fmt.format(ceiling)}", transform=ax.get_yaxis_transform(),
                ha="left", va="center", color="tab:red", fontsize=8, clip_on=False)
    ax.set_xticks(range(len(labels)), labels, rotation=15 if len(labels) > 4 else 0,
                  ha="right" if len(labels) > 4 else "center")
    ax.set_ylabel(f"{ylabel} (log scale)")
    ax.set_title(title)
    ax.set_xlim(-0.6, len(values) - 0.4)
    fig.tight_layout()
    stamp(fig, device)
    return fig


def step_breakdown(stats, *, title: str = "Where each step's time goes", max_steps: int = 40, ax=None):
    """The first `max_steps` counted steps on one time axis (lesson 01): what the training loop
    (the host) was doing — waiting for the next batch (orange) or in the step, launching work or
    blocked on the device (blue) — and, below, when the device was working on a step (green,
    from device events). Where the two overlap, loading and computing run side by side."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 2.9))
    fig = ax.figure
    log = stats.step_log[:max_steps]
    if not log:
        raise ValueError("no counted steps to draw")
    t0 = log[0]["fetch_start"]
    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    waits = [(ms(e["fetch_start"]), ms(e["fetch_end"]) - ms(e["fetch_start"])) for e in log]
    steps = [(ms(e["fetch_end"]), ms(e["step_end"]) - ms(e["fetch_end"])) for e in log]
    ax.broken_barh(waits, (2.1, 0.8), color="tab:orange", label="loop: waiting for data")
    ax.broken_barh(steps, (2.1, 0.8), color="tab:blue", label="loop: in the step (launching, or waiting for the device)")
    lanes = [(2.5, "host\n(training loop)")]
    if stats.device_spans:
        spans = [(ms(a), max(ms(b) - ms(a), 0.0)) for a, b in stats.device_spans[:max_steps]]
        ax.broken_barh(spans, (0.6, 0.8), color="tab:green", label="device: a step in flight (it may idle inside, "
                                                                    "waiting for launches)")
        lanes.append((1.0, "device"))
    ax.set_yticks([y for y, _ in lanes], [name for _, name in lanes])
    ax.set_ylim(0.3, 3.3)
    end = max(ms(log[-1]["step_end"]), *(ms(b) for _, b in (stats.device_spans or [])[:max_steps]))
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel(f"ms since step {1} of the {len(log)} shown")
    busy, util = stats.steps_in_flight_fraction, stats.device_util
    extra = f", a step in flight {busy:.0%}" if busy is not None else ""
    extra += f", device busy {util:.0%}" if util is not None else ""
    sync = " (synchronised every step)" if stats.synced_every_step else ""
    ax.set_title(f"{title}{sync}: stalled on data {stats.stall_fraction:.0%} of the wall time{extra}", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=3, frameon=False)
    fig.tight_layout()
    stamp(fig, stats.device)
    return fig
