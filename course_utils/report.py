"""The capstone's report card: every rung tried against the ceiling, on this machine (lesson 08).

    card = ReportCard.from_climb(ladder_result, final="yours", parity=parity_result,
                                 timelines={"baseline": baseline_timeline, "final": final_timeline})
    print(card.markdown())
    paths = card.write("build")      # build/report-<host>.md, .json and the two figures

A learner shares the files; an instructor compares machines from their JSON:

    python -m course_utils.report build/report-*.json       # one row per machine

What a card holds: the machine (CPU, cores, RAM, GPUs, driver, torch, DALI, date), the device the
rungs ran on (labelled simulated where it was), the workload, every rung's samples/s, fraction of
the model-only ceiling, stall fraction and speed-up over the baseline (all measured in one run),
the final pipeline, its accuracy parity with the baseline's pipeline, the baseline's and the
final pipeline's utilisation timelines (summaries in the JSON, side by side in a figure), and,
where it ran, the multi-GPU rung's scaling efficiency.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import socket
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .ladder import RATIO_NOISE, SAME_RUN_FLOOR, SHARED_LABEL, ceiling_share_words, limited_by

__all__ = ["ReportCard", "machine_facts", "host_slug", "timeline_record", "plot_timelines", "compare", "main",
           "report_dir", "SAME_RUN_FLOOR"]


def _in_flight(row: dict):
    """A row's share of the wall time with a step in flight (older rows: `device_busy_fraction`)."""
    return row.get("steps_in_flight_fraction", row.get("device_busy_fraction"))


def _share(fraction) -> str:
    return "" if fraction is None else f"{fraction:.0%}"


def report_dir() -> Path:
    """Where lesson 08 writes its report card: `$COURSE_BUILD` when set, else `build/` in the course
    folder the notebook runs in (the parent of `notebooks/` or `solutions/` when it runs there, the
    working directory otherwise). Never found through the installed package: with course_utils
    installed from another checkout, that would write into that checkout's `build/` (walk w1-08)."""
    import os
    if os.environ.get("COURSE_BUILD"):
        return Path(os.environ["COURSE_BUILD"])
    here = Path.cwd()
    return (here.parent if here.name in ("notebooks", "solutions") else here) / "build"


def host_slug(name: str | None = None) -> str:
    """This machine's name, made safe for a file name (`report-<host>.md`)."""
    name = name or socket.gethostname() or "this-machine"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "this-machine"


def machine_facts() -> dict:
    """What the card says about the hardware and software: `env.env_report()`, the GPU driver
    (through NVML, when there is one), the host's name and the date."""
    from .env import env_report
    facts = asdict(env_report())
    facts.pop("smoke", None)
    facts["driver"] = _driver_version()
    facts["host"] = host_slug()
    facts["date"] = datetime.datetime.now().isoformat(timespec="seconds")
    return facts


def _driver_version() -> str | None:
    """The NVIDIA driver's version through NVML; None without one (or when NVML does not say)."""
    from .monitor import nvml_call, nvml_close, nvml_open, nvml_text
    if nvml_open() is not None:
        return None
    try:
        return nvml_text(nvml_call("nvmlSystemGetDriverVersion"))
    finally:
        nvml_close()


def timeline_record(timeline, *, points: int = 200) -> dict:
    """A `monitor.Timeline` as JSON: its summary and, thinned to at most `points` samples, the
    time axis, the device's utilisation and the mean CPU utilisation over the cores."""
    n = len(timeline.t_s)
    keep = np.unique(np.linspace(0, n - 1, min(points, n)).astype(int)) if n else np.zeros(0, int)
    cpu = np.asarray(timeline.cpu_percent, dtype=float)
    return {"device": timeline.device, "host": timeline.host, "simulated": bool(timeline.simulated),
            "summary": {k: round(v, 2) if isinstance(v, float) else v for k, v in timeline.summary().items()},
            "t_s": [round(float(t), 3) for t in np.asarray(timeline.t_s)[keep]],
            "device_util": None if timeline.gpu_util is None else
            [round(float(u), 1) for u in np.asarray(timeline.gpu_util)[keep]],
            "cpu_mean": [round(float(c), 1) for c in (cpu.mean(axis=1)[keep] if cpu.size else [])]}


def plot_timelines(timelines: dict, *, title: str = "Utilisation: the baseline and the final pipeline"):
    """The timelines side by side, one column each (device above, every CPU core below, the same
    utilisation scale), on one time axis (seconds since each run began, so a faster run ends
    sooner), titled with its mean device utilisation."""
    import matplotlib.pyplot as plt
    names = list(timelines)
    fig, axes = plt.subplots(2, len(names), figsize=(5.5 * len(names), 4.8), sharey="row", squeeze=False)
    for col, name in enumerate(names):
        timeline = timelines[name]
        util = timeline.summary().get("device_util_mean_percent")
        timeline.plot(ax=axes[:, col], title=f"{name}" + (f": device busy {util:.0f}% on average" if util is not None else ""))
    end = max(float(t.t_s[-1]) for t in timelines.values() if len(t.t_s))
    for ax in axes.flat:
        ax.set_xlim(0, end)
    from .plotting import stamp
    first = next(iter(timelines.values()))
    fig.suptitle(title + (" (simulated device)" if first.simulated else ""))
    fig.tight_layout()
    stamp(fig, first.device)
    return fig


@dataclass
class ReportCard:
    """One machine's climb (lesson 08); see the module docstring."""
    machine: dict
    device: str
    simulated: bool
    workload: dict
    ceiling: dict
    rungs: list[dict]
    final: str
    parity: dict | None = None
    timelines: dict = field(default_factory=dict)
    multi_gpu: dict | None = None
    notes: list[str] = field(default_factory=list)
    # pipelines measured more than once in the run (samples/s): {"rung": name, "first": x, "again": y or [y, ...]}, and
    # "final_again": [the final pipeline's measurements after its row's], taken in turns with the rung's
    spread: dict | None = None

    @classmethod
    def from_climb(cls, result, *, final: str, workload: dict | None = None, parity=None, timelines=None,
                   multi_gpu: dict | None = None, notes=(), spread: dict | None = None) -> "ReportCard":
        """A card from a `ladder.LadderResult` whose rows include the final pipeline's (named
        `final`); `parity` a `parity.ParityResult` (or its dict); `timelines` {name: Timeline};
        `spread` pipelines measured more than once in the same run ({"rung": name, "first": samples/s,
        "again": samples/s or a list, "final_again": [the final pipeline's later measurements]}): rungs closer to
        the final one than the noise they give are named the same within noise."""
        names = [r["name"] for r in result.rungs]
        if final not in names:
            raise ValueError(f"the final pipeline {final!r} is not among the rungs measured: {names}")
        work = {"batch_size": result.config["batch_size"], "steps_per_rung": result.config["steps"],
                "model": result.config.get("model") or "none: the simulated device's step",
                "num_workers": result.config["num_workers"]}
        work.update(workload or {})
        parity = parity.as_dict() if hasattr(parity, "as_dict") else parity
        card = cls(machine_facts(), result.device, result.simulated, work, dict(result.ceiling),
                   [dict(r) for r in result.rungs], final, parity,
                   {k: timeline_record(v) for k, v in (timelines or {}).items()}, multi_gpu, list(notes),
                   dict(spread) if spread else None)
        card._timeline_objects = dict(timelines or {})
        return card

    # -- what it says --------------------------------------------------------------------------
    @property
    def final_row(self) -> dict:
        return next(r for r in self.rungs if r["name"] == self.final)

    @property
    def baseline_row(self) -> dict | None:
        return next((r for r in self.rungs if r["name"] == "baseline" and not r.get("skipped")), None)

    def repeats(self) -> dict:
        """{pipeline: [samples/s, ...]} for every pipeline measured more than once in this run (`spread`)."""
        if not self.spread:
            return {}
        s = self.spread
        again = s.get("again", [])
        groups = {s["rung"]: [s["first"], *(again if isinstance(again, (list, tuple)) else [again])]}
        if s.get("final_again"):
            groups[self.final] = [self.final_row["samples_per_s"], *s["final_again"]]
        return {name: values for name, values in groups.items() if len(values) > 1}

    def headline(self) -> str:
        """One sentence: the final pipeline as a fraction of the ceiling and against the baseline, and every other
        rung in one of three groups: faster, the same within the noise, slower."""
        row = self.final_row
        base = self.baseline_row
        against = (f", {row['samples_per_s'] / base['samples_per_s']:.1f}x the baseline "
                   f"({base['fraction_of_ceiling']:.0%} of the ceiling)") if base else ""
        kind = "a simulated device" if self.simulated else self.device
        # walk w1-08: "yours runs at 92%" under a table with three rungs faster: the table is the measurement, say so.
        # Walk w2-08: "faster in the same run: device-resident (88%)" beside yours at 69%, the same code: a rung is
        # faster only by more than twice the spread of one pipeline measured twice in this run (the range of two
        # measurements understates that of three: yours, and the same code twice, went 13,969 / 16,469 / 18,922 in one
        # smoke run), 5% when none was.
        # Walk w3-08: yours at 133% and device-resident at 102%, the same code, with a noise of 20% from the
        # device-resident pipeline measured twice; device-resident in no group. Now the widest spread of every pipeline
        # measured more than once (yours too, in turns with device-resident), each compared by its median, and every
        # rung in a group.
        noise, repeats = self.noise(), self.repeats()

        def value(name, samples_per_s):
            return float(np.median(repeats[name])) if name in repeats else samples_per_s

        mine = value(self.final, row["samples_per_s"])
        others = [r for r in self.rungs if r["name"] != self.final and not r.get("skipped")
                  and r.get("samples_per_s") is not None]
        groups = {"faster": [], "same": [], "slower": [], "unread": []}
        # x2-08 N8: "faster in the same run: DALI (280%)", measured once, running the ceiling's own fp32 eager step:
        # no rung beats the step it runs, so a measurement that far above the ceiling is the load's, not an order
        # (the climb's own line says so); such a rung is named as not ordered by this run
        above = 1 + max(noise, SAME_RUN_FLOOR)
        for r in others:
            theirs = value(r["name"], r["samples_per_s"])
            if (r["name"] not in repeats and not r.get("step") and r.get("fraction_of_ceiling") is not None
                    and r["fraction_of_ceiling"] > above):
                groups["unread"].append(f"{r['name']} ({r['fraction_of_ceiling']:.0%})")
                continue
            group = "faster" if theirs > mine * (1 + noise) else "slower" if theirs < mine / (1 + noise) else "same"
            groups[group].append(f"{r['name']} ({r['fraction_of_ceiling']:.0%})")
        if repeats:
            measured = "; ".join(f"{name} " + ", ".join(f"{v:,.0f}" for v in values) for name, values in repeats.items())
            told = (f"at least {SAME_RUN_FLOOR:.0%}, or twice the widest spread of a pipeline measured more than once "
                    f"here ({measured} samples/s; each such pipeline compared by its median): {noise:.0%}")
        else:
            told = f"{noise:.0%}, no pipeline was measured twice here"
        beaten = f"; faster in the same run: {', '.join(groups['faster'])}" if groups["faster"] else ""
        # walk w7-08: a noise of 165% made 78% and 200% "the same" as yours: within the noise, this run does not order
        # them, which is all it can say; a band wider than the climb's own (44%) is said to be too wide to rank
        wide = (f"; a band that wide, {1 / (1 + noise):.2f}x to {1 + noise:.2f}x yours, means this run cannot rank "
                "them, not that they are the same" if noise > RATIO_NOISE else "")
        tied = (f"; not told apart from yours by this run, within the noise of one measurement ({told}{wide}): "
                f"{', '.join(groups['same'])}" if groups["same"] else "")
        slower = f"; slower in the same run: {', '.join(groups['slower'])}" if groups["slower"] else ""
        unread = (f"; not ordered by this run: {', '.join(groups['unread'])}, measured once above the ceiling of the "
                  f"fp32 eager step it runs by more than {above - 1:.0%} (no rung beats the step it runs: the load "
                  "moved that measurement, not the pipeline)" if groups["unread"] else "")
        return (f"{self.final} runs at {ceiling_share_words(row, 'the model-only ceiling', rows=self.rungs)}{against}, "
                f"on {kind}; measured in one run on {self.machine['host']}{beaten}{tied}{slower}{unread}")

    def noise(self) -> float:
        """The relative spread of one measurement in this run: twice the widest of the pipelines measured more than
        once (`spread`), at least SAME_RUN_FLOOR; 5% when no pipeline was measured twice."""
        spreads = [max(v) / min(v) - 1 for v in self.repeats().values() if min(v) > 0]
        if not spreads:
            return 0.05
        return max(SAME_RUN_FLOOR, 2 * max(spreads))

    def markdown(self) -> str:
        m = self.machine
        gpus = ", ".join(g["name"] for g in m.get("gpus", [])) or "none"
        lines = [f"# Feed the GPU: report card for {m['host']}", "",
                 f"**{self.headline()}.**", "",
                 "## The machine", "",
                 f"- CPU: {m['cpu']}, {m['usable_cores']} usable cores; RAM {m['ram_gib']:.0f} GiB",
                 f"- GPU: {gpus}" + (f" (driver {m['driver']})" if m.get("driver") else ""),
                 f"- Python {m['python']}, torch {m['torch']}, torchvision {m['torchvision']}, "
                 f"DALI {m['dali'] or 'not installed'}; {m['date']}",
                 f"- device the rungs ran on: {self.device}" + (" (SIMULATED: the loaders are real, the device "
                                                                "is a stand-in)" if self.simulated else ""),
                 f"- workload: " + ", ".join(f"{k} {v}" for k, v in self.workload.items()), "",
                 "## Every rung against the ceiling (one run)", "",
                 "| rung | samples/s | of the ceiling | device busy | a step in flight | host waits for data | "
                 "vs baseline | limited by |",
                 "|---|---:|---:|---:|---:|---:|---:|---|",
                 f"| model-only ceiling | {self.ceiling['samples_per_s']:,.0f} | 100% | "
                 f"{_share(self.ceiling.get('device_util'))} | {_share(_in_flight(self.ceiling))} | | | "
                 f"{limited_by(self.ceiling)} |"]
        for r in self.rungs:
            name = f"**{r['name']}** (final)" if r["name"] == self.final else r["name"]
            if r.get("skipped"):
                lines.append(f"| {name} | skipped: {r['skipped']} | | | | | | |")
                continue
            speedup = f"{r['speedup_over_baseline']:.1f}x" if r.get("speedup_over_baseline") else ""
            lines.append(f"| {name} | {r['samples_per_s']:,.0f} | {r['fraction_of_ceiling']:.0%} | "
                         f"{_share(r.get('device_util'))} | {_share(_in_flight(r))} | {r['stall_fraction']:.0%} | "
                         f"{speedup} | {limited_by(r)} |")
        if any(limited_by(r) == SHARED_LABEL for r in self.rungs if not r.get("skipped")):
            lines += ["", f"{SHARED_LABEL}: the ceiling's own step, hardly a wait for data, yet under "
                          f"{1 / (1 + RATIO_NOISE):.0%} of the ceiling: the host launched the same kernels slower than "
                          "when the ceiling was measured, its cores shared with the rung's own loading work (workers, "
                          "a prefetching thread) or with other programs."]
        lines += ["", "## Accuracy parity", ""]
        if self.parity:
            p = self.parity
            lines.append(f"After {p['steps']} steps of {p['batch_size']} from seed {p['seed']} ({p['model']} on "
                         f"{p['device']}): the baseline's pipeline {p['baseline']:.1%}, the final pipeline "
                         f"{p['yours']:.1%} ({100 * p['difference']:+.1f} points; tolerance +/-"
                         f"{100 * p['tolerance']:.0f}): {'within' if p['passed'] else 'OUTSIDE'} the tolerance.")
        else:
            lines.append("Not measured for this card" + (" (see the notes)." if self.notes else "."))
        if self.timelines:
            # every program's CPU use, and (where the monitor told them apart) the course's and the others' cores:
            # walk w1-08 read "98%" for a baseline that used a quarter of a core on a machine others kept busy
            lines += ["", "## Utilisation", "", "| run | device busy (mean) | CPU, every program (mean of cores) | "
                      "busiest core | cores used by this course | by other programs |", "|---|---:|---:|---:|---:|---:|"]
            for name, t in self.timelines.items():
                s = t["summary"]
                util = s.get("device_util_mean_percent")
                ours, others = s.get("ours_cores_mean"), s.get("others_cores_mean")
                lines.append(f"| {name} | {'' if util is None else f'{util:.0f}%'} | {s['cpu_mean_percent']:.0f}% | "
                             f"{s['cpu_busiest_core_percent']:.0f}% | {'' if ours is None else f'{ours:.2f}'} | "
                             f"{'' if others is None else f'{others:.2f}'} |")
        lines += ["", "## More than one GPU", ""]
        if self.multi_gpu and self.multi_gpu.get("efficiency") is not None:
            g = self.multi_gpu
            lines.append(f"{g['gpus']} GPUs under DDP: {g['samples_per_s']:,.0f} samples/s against "
                         f"{g['single_samples_per_s']:,.0f} on one: scaling efficiency {g['efficiency']:.0%}.")
        else:
            lines.append((self.multi_gpu or {}).get("note", "Not measured: this machine has fewer than 2 GPUs."))
        if self.notes:
            lines += ["", "## Notes", ""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items()}

    # -- figures and files ---------------------------------------------------------------------
    def plot_rungs(self):
        """Every measured rung against the ceiling (the final pipeline's bar in orange)."""
        from .plotting import bar_chart
        measured = [r for r in self.rungs if not r.get("skipped")]
        fig = bar_chart([r.get("short", r["name"]) for r in measured], [r["samples_per_s"] for r in measured],
                        ylabel="samples/s", device=self.device, ceiling=self.ceiling["samples_per_s"], scale="log",
                        fractions=[r["fraction_of_ceiling"] for r in measured],
                        title=f"Every rung tried on {self.machine['host']}"
                              + (" (simulated device)" if self.simulated else ""))
        ax = fig.axes[0]
        for bar, r in zip(ax.patches, measured):
            if r["name"] == self.final:
                bar.set_color("tab:orange")
        return fig

    def write(self, folder="build") -> dict:
        """Write report-<host>.md and .json (and the figures the markdown shows) into `folder`;
        returns their paths."""
        import matplotlib.pyplot as plt
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"report-{self.machine['host']}"
        paths = {"markdown": folder / f"{stem}.md", "json": folder / f"{stem}.json",
                 "rungs_png": folder / f"{stem}-rungs.png"}
        fig = self.plot_rungs()
        fig.savefig(paths["rungs_png"], dpi=110)
        plt.close(fig)
        text = self.markdown() + f"\n![every rung against the ceiling]({paths['rungs_png'].name})\n"
        timelines = getattr(self, "_timeline_objects", {})
        if timelines:
            paths["timelines_png"] = folder / f"{stem}-timelines.png"
            fig = plot_timelines(timelines)
            fig.savefig(paths["timelines_png"], dpi=110)
            plt.close(fig)
            text += f"\n![utilisation timelines]({paths['timelines_png'].name})\n"
        paths["markdown"].write_text(text)
        paths["json"].write_text(json.dumps(self.as_dict(), indent=2) + "\n")
        return paths

    @classmethod
    def load(cls, path) -> "ReportCard":
        """A card written by `write()` (its JSON)."""
        return cls(**json.loads(Path(path).read_text()))


def compare(cards) -> str:
    """One markdown row per card: the machine, the device, the ceiling, the baseline's and the
    final pipeline's fractions of it, and parity (for an instructor comparing machines)."""
    lines = ["| host | CPU cores | device | ceiling samples/s | baseline | final pipeline | of the ceiling | "
             "parity (points) | date |", "|---|---:|---|---:|---:|---|---:|---:|---|"]
    for card in cards:
        base, final = card.baseline_row, card.final_row
        device = card.device + (" (simulated)" if card.simulated and "simulated" not in card.device else "")
        cells = [card.machine["host"], card.machine["usable_cores"], device, f"{card.ceiling['samples_per_s']:,.0f}",
                 f"{base['fraction_of_ceiling']:.0%}" if base else "", card.final,
                 f"{final['fraction_of_ceiling']:.0%}",
                 f"{100 * card.parity['difference']:+.1f}" if card.parity else "", card.machine["date"][:10]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.report",
                                     description="Compare report cards (the JSON files lesson 08 writes).")
    parser.add_argument("files", nargs="+", help="report-<host>.json files")
    args = parser.parse_args(argv)
    cards = []
    for name in args.files:
        try:
            cards.append(ReportCard.load(name))
        except (OSError, ValueError, TypeError) as exc:
            print(f"{name}: not a report card ({exc})", file=sys.stderr)
    if not cards:
        return 1
    print(compare(cards))
    return 0


if __name__ == "__main__":
    sys.exit(main())
