"""Exercise 1.4 (I/O-, CPU- or device-bound?) proven by its mutants: the reference passes on
every seed, the stub is `not_implemented`, and each plausible wrong answer fails on the
property it gets wrong, on every seed (issue 14; the discipline of issue 11)."""
import numpy as np
import pytest

from course_utils.checks import run_check
from course_utils.io_probe import RUN_KINDS, make_run, synthetic_run

SEEDS = range(25)


def classify_run(run):
    if run.stall_fraction < 0.10:
        return "device-bound"
    if np.mean(run.loader_cores) >= 0.8 * min(run.loader_processes, run.usable_cores):
        return "cpu-bound"
    return "io-bound"


def _loaders_busy(run, threshold=0.8, stat=np.mean):
    return stat(run.loader_cores) >= threshold * min(run.loader_processes, run.usable_cores)


# -- the lesson's own warnings -----------------------------------------------------------------

def iowait_means_io(run):
    """'iowait is high, so it is I/O' (an absolute iowait threshold over the machine's cores)."""
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "io-bound" if run.iowait.mean() > 5 else "cpu-bound"


def idle_cpu_means_io(run):
    """'the CPUs are mostly idle, so it must be the disk' (machine-wide busy share)."""
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if run.cpu_busy.mean() >= 80 else "io-bound"


def util_means_io(run):
    """'%util is near 100, so the disk is saturated' (true of an HDD, not of an SSD or a virtual disk)."""
    if run.stall_fraction < 0.10:
        return "device-bound"
    if run.disk_util.mean() >= 90:
        return "io-bound"
    return classify_run(run)


def busy_against_all_cores(run):
    """Compares the loaders' cores with every core of the machine, not with what they could use."""
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if np.mean(run.loader_cores) >= 0.8 * run.usable_cores else "io-bound"


def busy_against_processes(run):
    """Compares with the number of loading processes, forgetting they share the cores."""
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if np.mean(run.loader_cores) >= 0.8 * run.loader_processes else "io-bound"


def loaders_before_stall(run):
    """Judges the loaders before asking whether the loop waited at all."""
    if _loaders_busy(run):
        return "cpu-bound"
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "io-bound"


# -- slightly off ------------------------------------------------------------------------------

def stall_threshold_015(run):
    if run.stall_fraction < 0.15:
        return "device-bound"
    return "cpu-bound" if _loaders_busy(run) else "io-bound"


def busy_threshold_07(run):
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if _loaders_busy(run, 0.7) else "io-bound"


def busy_threshold_09(run):
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if _loaders_busy(run, 0.9) else "io-bound"


# -- one sample instead of the run --------------------------------------------------------------

def peak_sample(run):
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if _loaders_busy(run, stat=np.max) else "io-bound"


def first_sample(run):
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if _loaders_busy(run, stat=lambda x: x[0]) else "io-bound"


def last_sample(run):
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if _loaders_busy(run, stat=lambda x: x[-1]) else "io-bound"


# -- issue 35: the edges and the mean's neighbours ----------------------------------------------

def stall_at_most(run):                              # "below 0.10" read as <=
    if run.stall_fraction <= 0.10:
        return "device-bound"
    return "cpu-bound" if _loaders_busy(run) else "io-bound"


def busy_strictly_above(run):                        # "at least 80%" read as >
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if np.mean(run.loader_cores) > 0.8 * min(run.loader_processes, run.usable_cores) else "io-bound"


def stall_rounded(run):                              # round(stall, 2) < 0.10: 0.095-0.0999 read as 0.10
    if round(run.stall_fraction, 2) < 0.10:
        return "device-bound"
    return "cpu-bound" if _loaders_busy(run) else "io-bound"


def stall_rounded_3(run):
    if round(run.stall_fraction, 3) < 0.10:
        return "device-bound"
    return "cpu-bound" if _loaders_busy(run) else "io-bound"


def share_rounded(run):
    if run.stall_fraction < 0.10:
        return "device-bound"
    share = np.mean(run.loader_cores) / min(run.loader_processes, run.usable_cores)
    return "cpu-bound" if round(share, 2) >= 0.8 else "io-bound"


def _middle_half(x):
    return np.mean(x[len(x) // 4: len(x) - len(x) // 4])


def _trimmed(x, share=0.1):
    k = int(len(x) * share)
    return np.mean(np.sort(x)[k: len(x) - k])


def median_loader(run):
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if _loaders_busy(run, stat=np.median) else "io-bound"


def middle_half_loader(run):                         # drops the start and end bursts the spec says are tested
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if _loaders_busy(run, stat=_middle_half) else "io-bound"


def trimmed_loader(run):
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if _loaders_busy(run, stat=_trimmed) else "io-bound"


def _mean_of(part):
    def classify_(run):
        if run.stall_fraction < 0.10:
            return "device-bound"
        return "cpu-bound" if _loaders_busy(run, stat=lambda x: np.mean(part(x))) else "io-bound"
    classify_.__name__ = "mean_of_part"
    return classify_


def first_sample_left_out(run):                      # w2-01: these passed on every seed
    return _mean_of(lambda x: x[1:])(run)


def last_sample_left_out(run):
    return _mean_of(lambda x: x[:-1])(run)


def first_and_last_left_out(run):
    return _mean_of(lambda x: x[1:-1])(run)


def last_two_left_out(run):
    return _mean_of(lambda x: x[:-2])(run)


def every_other_sample(run):                         # w2-01: passed on some seeds
    return _mean_of(lambda x: x[::2])(run)


def every_other_sample_from_the_second(run):         # the near-miss rule: the other half
    return _mean_of(lambda x: x[1::2])(run)


def could_use_one(run):                              # w2-01: named the iowait rule before
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if np.mean(run.loader_cores) >= 0.8 else "io-bound"


def could_use_this_machines_cores(run):
    import os
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if np.mean(run.loader_cores) >= 0.8 * min(run.loader_processes, os.cpu_count()) else "io-bound"


def clipped_to_what_they_could_use(run):
    """Passed after w2-01; wrong since w6-01: the spec now says the samples are averaged as recorded,
    without clipping (one process alternating 1.5 and 0.2 cores is CPU-bound by hint 3's mean)."""
    could = min(run.loader_processes, run.usable_cores)
    if run.stall_fraction < 0.10:
        return "device-bound"
    return "cpu-bound" if np.mean(np.minimum(run.loader_cores, could)) >= 0.8 * could else "io-bound"


def classify_as_shares(run):                         # the same rules written another way: passes
    if not run.stall_fraction >= 0.1:
        return "device-bound"
    return "cpu-bound" if np.mean(run.loader_cores / min(run.loader_processes, run.usable_cores)) >= 0.8 else "io-bound"


def could_use_the_machines_cores(run):               # w3-01: passed on every seed (no container in the draw)
    if run.stall_fraction < 0.10:
        return "device-bound"
    possible = min(run.loader_processes, run.cpu_busy.shape[1])
    return "cpu-bound" if np.mean(run.loader_cores) >= 0.8 * possible else "io-bound"


def only_the_workers(run):                           # w3-01: passed on 11 of 13 seeds
    if run.stall_fraction < 0.10:
        return "device-bound"
    possible = min(run.loader_processes - 1, run.usable_cores) or 1
    return "cpu-bound" if np.mean(run.loader_cores) >= 0.8 * possible else "io-bound"


def float16_mean(run):                               # w4-01: passed on every seed (no case that tight)
    if run.stall_fraction < 0.10:
        return "device-bound"
    possible = min(run.loader_processes, run.usable_cores)
    return "cpu-bound" if np.mean(run.loader_cores.astype(np.float16)) >= 0.8 * possible else "io-bound"


def rounded_to_one_place(run):                       # w4-01: told to test stall_fraction first
    if round(run.stall_fraction, 1) < 0.10:
        return "device-bound"
    possible = min(run.loader_processes, run.usable_cores)
    return "cpu-bound" if round(float(np.mean(run.loader_cores)), 1) >= 0.8 * possible else "io-bound"


def float32_figures(run):                            # right (w4-01), as 1.3's float32 answer is
    if np.float32(run.stall_fraction) < np.float32(0.10):
        return "device-bound"
    possible = min(run.loader_processes, run.usable_cores)
    return "cpu-bound" if np.mean(run.loader_cores.astype(np.float32)) >= 0.8 * possible else "io-bound"


# -- wrong form, side effects, reading the answer from the object --------------------------------

def other_spelling(run):
    return {"io-bound": "I/O-bound", "cpu-bound": "CPU-bound"}.get(classify_run(run), classify_run(run))


def sorts_in_place(run):
    run.loader_cores.sort()              # "only the distribution matters" -- but it is the caller's array
    return classify_run(run)


def reads_the_name(run):
    return run.name.split()[0]


def stall_in_percent(run):
    return "device-bound" if run.stall_fraction < 10 else classify_run(run)


MUTANTS = {
    iowait_means_io: "CPU-bound when the loading processes are busy",
    idle_cpu_means_io: "CPU-bound when the loading processes are busy",
    util_means_io: "CPU-bound when the loading processes are busy",
    busy_against_all_cores: "CPU-bound when the loading processes are busy",
    busy_against_processes: "CPU-bound when the loading processes are busy",
    loaders_before_stall: "device-bound when the loop rarely waits",
    stall_threshold_015: "uses the thresholds as specified",
    busy_threshold_07: "uses the thresholds as specified",
    busy_threshold_09: "uses the thresholds as specified",
    peak_sample: "judges the whole run",
    first_sample: "judges the whole run",
    last_sample: "judges the whole run",
    other_spelling: "answers one of the three labels",
    sorts_in_place: "leaves the run unchanged",
    reads_the_name: "answers one of the three labels",
    stall_in_percent: "tells the runs apart",
    stall_at_most: "uses the thresholds as specified",
    busy_strictly_above: "uses the thresholds as specified",
    stall_rounded: "uses the thresholds as specified",
    stall_rounded_3: "uses the thresholds as specified",
    share_rounded: "uses the thresholds as specified",
    median_loader: "judges the whole run",
    middle_half_loader: "judges the whole run",
    trimmed_loader: "judges the whole run",
}
# w2-01: (property, words of the hint that must name the slip)
NAMED = {
    first_sample_left_out: ("judges the whole run", "run.loader_cores[1:] (the first sample left out)"),
    last_sample_left_out: ("judges the whole run", "run.loader_cores[:-1] (or [:-2], ...: the last samples left out)"),
    first_and_last_left_out: ("judges the whole run", "run.loader_cores[1:-1]"),
    last_two_left_out: ("judges the whole run", "the last samples left out"),
    every_other_sample: ("judges the whole run", "run.loader_cores[::2] (every other sample)"),
    every_other_sample_from_the_second: ("judges the whole run", "run.loader_cores[1::2] (every other sample)"),
    could_use_one: ("", "as if the loaders could use one core"),
    could_use_this_machines_cores: ("", "os.cpu_count()"),
    could_use_the_machines_cores: ("reads the cores the run's machine let the loaders use (run.usable_cores)",
                                   "every core of the run's machine (run.cpu_busy.shape[1])"),
    only_the_workers: ("I/O-bound when the loading processes wait instead of computing",
                       "as if only the workers loaded"),
    float16_mean: ("uses the thresholds as specified", "averaged run.loader_cores in float16"),
    rounded_to_one_place: ("uses the thresholds as specified", "as if it rounded the figures"),
}


def _run(monkeypatch, fn, seed):
    monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
    return run_check("1.4", fn)


def test_reference_passes_on_every_seed(monkeypatch):
    for seed in SEEDS:
        for answer in (classify_run, classify_as_shares, float32_figures):
            result = _run(monkeypatch, answer, seed)
            assert result.status == "pass", (seed, answer.__name__, result.message)


def test_the_spec_counts_the_runs_the_check_classifies():
    import json
    from pathlib import Path
    cells = json.loads((Path(__file__).parents[2] / "solutions" / "01-measure-the-baseline.ipynb").read_text())["cells"]
    spec = next("".join(c["source"]) for c in cells if "What the check tests:** " in "".join(c["source"])
                and "fresh runs" in "".join(c["source"]))
    message = run_check("1.4", classify_run).message
    assert f"{message.split()[0]} fresh runs" in spec, (message, spec[:200])


def test_stub_is_not_implemented():
    def stub(run):
        raise NotImplementedError("Exercise 1.4")
    assert run_check("1.4", stub).status == "not_implemented"
    assert run_check("1.4", "io-bound").status == "fail"


@pytest.mark.parametrize("mutant", list(MUTANTS), ids=[m.__name__ for m in MUTANTS])
def test_mutant_fails_on_its_property_on_every_seed(monkeypatch, mutant):
    assert len(MUTANTS) >= 8
    for seed in SEEDS:
        result = _run(monkeypatch, mutant, seed)
        assert result.status == "fail", (mutant.__name__, seed, result.status, result.message)
        assert MUTANTS[mutant] in result.message, (mutant.__name__, seed, result.message)


@pytest.mark.parametrize("mutant", list(NAMED), ids=[m.__name__ for m in NAMED])
def test_near_misses_of_the_second_walk_fail_with_their_own_hint(monkeypatch, mutant):
    prop, words = NAMED[mutant]
    for seed in SEEDS:
        result = _run(monkeypatch, mutant, seed)
        assert result.status == "fail", (mutant.__name__, seed, result.message)
        assert prop in result.message and words in result.message, (mutant.__name__, seed, result.message)


def test_the_made_up_runs_have_the_means_they_were_asked_for():
    rng = np.random.default_rng(3)
    for _ in range(30):
        use, procs, cores = rng.uniform(0, 1), int(rng.integers(1, 20)), int(rng.choice([2, 8, 64]))
        run = make_run(rng, stall=0.5, loader_use=use, loader_processes=procs, cores=cores, disk_mb_s=123.0, util=45.0,
                       iowait=3.0)
        assert np.mean(run.loader_cores) / min(procs, cores) == pytest.approx(use, abs=1e-9)
        assert run.disk_read_mb_s.mean() == pytest.approx(123.0) and run.disk_util.mean() == pytest.approx(45.0)
        assert run.iowait.mean() == pytest.approx(3.0, rel=0.05)
        assert (run.cpu_busy + run.iowait <= 100 + 1e-9).all() and run.simulated
    for kind in RUN_KINDS:
        for _ in range(10):
            assert classify_run(synthetic_run(kind, rng)) == kind


def test_clipping_to_what_they_could_use_fails_on_every_seed(monkeypatch):
    """w6-01: the spec says the samples are averaged as recorded; the check's runs with samples above
    the cap tell the clip apart on every seed (tests/unit/test_checks_lesson01_w6.py names its hint)."""
    for seed in SEEDS[:3]:
        result = _run(monkeypatch, clipped_to_what_they_could_use, seed)
        assert result.status == "fail" and "averages run.loader_cores as recorded" in result.message, result.message
