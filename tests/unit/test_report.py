"""course_utils.report: the capstone's report card (built from a made-up climb: no timing here)."""
import json

import numpy as np
import pytest

from course_utils import report
from course_utils.ladder import LadderResult
from course_utils.monitor import synthetic_timeline
from course_utils.parity import ParityResult


def _climb(simulated=True):
    ceiling = {"samples_per_s": 16000.0, "steps": 19}
    rows = [{"name": "baseline", "short": "baseline", "samples_per_s": 2400.0, "fraction_of_ceiling": 0.15,
             "stall_fraction": 0.9, "speedup_over_baseline": 1.0},
            {"name": "DALI", "short": "DALI", "skipped": "NVIDIA DALI cannot be imported here"},
            {"name": "yours", "short": "yours", "samples_per_s": 15200.0, "fraction_of_ceiling": 0.95,
             "stall_fraction": 0.01, "device_busy_fraction": 0.96, "speedup_over_baseline": 6.33}]
    config = {"batch_size": 128, "steps": 20, "num_workers": 2, "model": None}
    return LadderResult("simulated accelerator (test)" if simulated else "NVIDIA H100 (cuda:0)", simulated, config,
                        ceiling, rows, host="CPU: test", date="2026-01-01T00:00:00")


def _card(**extra):
    rng = np.random.default_rng(0)
    timelines = {"baseline": synthetic_timeline("sync-bound", cores=2, seconds=2, rng=rng),
                 "final": synthetic_timeline("compute-bound", cores=2, seconds=2, rng=rng)}
    parity = ParityResult(0.80, 0.78, 60, 128, 0.15, 3, 4000, "CPU: test")
    return report.ReportCard.from_climb(_climb(), final="yours", parity=parity, timelines=timelines, **extra)


def test_card_says_what_was_measured_where():
    card = _card(notes=["a note"])
    text = card.markdown()
    assert "yours runs at 95% of the model-only ceiling, 6.3x the baseline" in text
    assert "SIMULATED" in text and "| **yours** (final) | 15,200 | 95% |  | 96% | 1% | 6.3x | device-side |" in text
    assert "skipped: NVIDIA DALI cannot be imported here" in text
    assert "the final pipeline 78.0% (-2.0 points; tolerance +/-15)" in text
    assert "Not measured: this machine has fewer than 2 GPUs" in text and "- a note" in text
    for key in ("cpu", "usable_cores", "torch", "dali", "date", "host"):
        assert key in card.machine
    assert set(card.timelines) == {"baseline", "final"} and card.timelines["final"]["device_util"]


def test_final_must_be_a_measured_rung():
    with pytest.raises(ValueError, match="not among the rungs"):
        report.ReportCard.from_climb(_climb(), final="warp drive")


def test_write_load_and_compare(tmp_path, capsys):
    card = _card(multi_gpu={"gpus": 4, "samples_per_s": 40000.0, "single_samples_per_s": 11000.0, "efficiency": 0.91})
    paths = card.write(tmp_path)
    assert paths["markdown"].name == f"report-{card.machine['host']}.md"
    assert all(p.exists() and p.stat().st_size > 0 for p in paths.values())
    assert "scaling efficiency 91%" in paths["markdown"].read_text()
    assert "![utilisation timelines]" in paths["markdown"].read_text()
    loaded = report.ReportCard.load(paths["json"])
    assert loaded.final == "yours" and loaded.rungs == card.rungs
    table = report.compare([loaded, loaded])
    assert table.count("| yours | 95% | -2.0 |") == 2
    assert report.main([str(paths["json"])]) == 0
    assert "| host |" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "a card"}))
    assert report.main([str(bad)]) == 1


def test_host_slug_is_a_safe_file_name():
    assert report.host_slug("gpu box #3 (lab)") == "gpu-box-3-lab"
    assert report.host_slug("") not in ("", ".")


def test_a_card_without_parity_says_so_and_points_to_its_notes():
    bare = report.ReportCard.from_climb(_climb(), final="yours").markdown()
    assert "## Accuracy parity\n\nNot measured for this card.\n" in bare
    noted = report.ReportCard.from_climb(_climb(), final="yours", notes=["parity: see check 8.1"]).markdown()
    assert "Not measured for this card (see the notes)." in noted and "- parity: see check 8.1" in noted


def test_report_dir_is_the_notebooks_course_folder_or_course_build(tmp_path, monkeypatch):
    """w1-08: lesson 08 found build/ through course_utils.__file__, which wrote into another checkout's build/ when the
    package was installed from there."""
    from course_utils.report import report_dir
    monkeypatch.delenv("COURSE_BUILD", raising=False)
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    assert report_dir() == tmp_path / "build"
    monkeypatch.chdir(tmp_path)
    assert report_dir() == tmp_path / "build"
    monkeypatch.setenv("COURSE_BUILD", str(tmp_path / "elsewhere"))
    assert report_dir() == tmp_path / "elsewhere"


def test_the_headline_names_rungs_faster_than_the_final_one():
    """w1-08: "yours runs at 92% ..." above a table in which three rungs ran faster."""
    climb = _climb()
    climb.rungs.insert(1, {"name": "CUDA graph", "short": "graph",
                           "step": {"amp": "bf16", "channels_last": True, "graph": True},
                           "samples_per_s": 30000.0,
                           "fraction_of_ceiling": 1.875, "stall_fraction": 0.0, "speedup_over_baseline": 12.5})
    card = report.ReportCard.from_climb(climb, final="yours")
    assert card.headline().endswith("; faster in the same run: CUDA graph (188%); slower in the same run: baseline (15%)")
    assert "faster in the same run" not in _card().headline()
    assert _card().headline().endswith("; slower in the same run: baseline (15%)")
    assert "cores used by this course | by other programs |" in _card().markdown()


def test_the_same_code_within_the_measured_spread_is_not_ranked():
    """w2-08: the card named the course's device-resident rung (88%) "faster in the same run" than the learner's
    identical pipeline (69%): a rung is faster only beyond the spread of one pipeline measured twice in the run."""
    climb = _climb()
    climb.rungs.insert(1, {"name": "device-resident", "short": "resident", "samples_per_s": 15200.0 * 88 / 69,
                           "fraction_of_ceiling": 1.21, "stall_fraction": 0.0, "speedup_over_baseline": 8.1})
    climb.rungs.insert(2, {"name": "CUDA graph", "short": "graph",
                           "step": {"amp": "bf16", "channels_last": True, "graph": True},
                           "samples_per_s": 60000.0,
                           "fraction_of_ceiling": 3.75, "stall_fraction": 0.0, "speedup_over_baseline": 25.0})
    spread = {"rung": "device-resident", "first": 17100.0, "again": 14900.0}
    card = report.ReportCard.from_climb(climb, final="yours", spread=spread)
    words = card.headline()
    assert "faster in the same run: CUDA graph (375%)" in words and "faster in the same run: device" not in words
    assert ("not told apart from yours by this run, within the noise of one measurement (at least 20%, or twice the "
            "widest spread of a pipeline measured more than once here (device-resident 17,100, 14,900 samples/s; each "
            "such pipeline compared by its median): 30%): device-resident (121%)") in words
    assert "cannot rank" not in words                              # 30%: narrower than the climb's 44%
    # a pair closer than 10% apart: the floor, 20% (w2-08's second smoke run: the same code 11% apart, called faster)
    climb.rungs[1].update(samples_per_s=15200.0 * 97 / 87, fraction_of_ceiling=0.97 * 1.1)
    close = report.ReportCard.from_climb(climb, final="yours", spread=dict(spread, again=16500.0))
    assert "faster in the same run: device" not in close.headline() and ": 20%): device-resident" in close.headline()
    # without a second measurement: 5%, as the ladder's ties
    assert "faster in the same run: device-resident" in report.ReportCard.from_climb(climb, final="yours").headline()


def test_a_device_busy_most_of_the_time_is_the_limit_whatever_the_waits():
    """w2-08: the CUDA-graph rung read "input-bound" with the device busy 93% (its waits overlapped queued steps)."""
    from course_utils.ladder import limited_by
    assert limited_by({"stall_fraction": 0.35, "device_util": 0.93, "steps_in_flight_fraction": 0.95}) == "compute-bound"
    assert limited_by({"stall_fraction": 0.35, "device_util": 0.60, "steps_in_flight_fraction": 0.95}) == "input-bound"
    assert limited_by({"stall_fraction": 0.35, "device_util": None}) == "input-bound"


def test_rungs_above_the_ceiling_are_said_from_the_numbers():
    """w2-08: "rungs above the fp32 ceiling here: DALI (174%), ... CUDA graph (950%)" under a markdown that said only
    rungs changing the step can pass it, and an H100 whose figures give the graph about 3x."""
    from course_utils.ladder import above_ceiling_words
    from course_utils.sim import H100, SimulatedAccelerator
    sim = SimulatedAccelerator(profile=H100, scale=0.41)
    ceiling = {"samples_per_s": 128 / 12.73e-3}
    rows = [{"name": "device-resident", "fraction_of_ceiling": 0.88, "step": {}},
            {"name": "DALI", "fraction_of_ceiling": 1.74, "step": {}},
            {"name": "device-resident + bf16 + CUDA graph", "fraction_of_ceiling": 9.5,
             "step": {"amp": "bf16", "channels_last": True, "graph": True}}]
    words = above_ceiling_words(rows, ceiling, sim, 128)
    assert "device-resident + bf16 + CUDA graph (950%), where the H100's figures give its step alone 333% " in words
    assert "above it although they run its own fp32 eager step: DALI (174%)" in words
    assert "its steps took 12.7 ms on average, the batch over its samples/s, where the simulated device charges 4.5 ms" in words
    assert above_ceiling_words(rows[:1], ceiling, sim, 128) == "rungs above the fp32 ceiling here: none"
    # a graph far above its own figure, with no fp32 rung above: the slow ceiling is still said
    words = above_ceiling_words(rows[:1] + rows[2:], ceiling, sim, 128)
    assert "the ceiling's steps took 12.7 ms on average (the batch over its samples/s; the median step printed with the ceiling is another figure) against the 4.5 ms the simulated device charges" in words
    # on a real device: no figures to compare with
    assert "H100's figures" not in above_ceiling_words(rows, ceiling, None, 128)


def _w3_climb():
    """Walk w3-08's second run: yours (device-resident with drop_last=False, the same code) at 133% of a slow ceiling,
    the course's device-resident at 102%."""
    climb = _climb()
    climb.rungs[1:2] = [
        {"name": "prefetcher", "short": "prefetcher", "samples_per_s": 10712.0, "fraction_of_ceiling": 1.12,
         "stall_fraction": 0.02, "speedup_over_baseline": 5.4, "step": {}},
        {"name": "device-resident", "short": "device-resident", "samples_per_s": 9717.0, "fraction_of_ceiling": 1.02,
         "stall_fraction": 0.06, "speedup_over_baseline": 4.9, "step": {}},
        {"name": "device-resident + bf16 + CUDA graph", "short": "graph", "samples_per_s": 86506.0,
         "fraction_of_ceiling": 9.08, "stall_fraction": 0.25, "speedup_over_baseline": 43.5,
         "step": {"amp": "bf16", "channels_last": True, "graph": True}}]
    climb.rungs[-1].update(samples_per_s=12628.0, fraction_of_ceiling=1.33, step={})
    return climb


def test_the_same_code_measured_in_turns_is_never_ranked_by_one_lucky_measurement():
    """w3-08: "the same within the noise (... 9,717 and 8,873 samples/s: 20%): prefetcher (112%)" with yours at 133% and
    device-resident (102%, the same code) in no group: yours is measured again in turns with device-resident, the noise
    is the widest spread of every pipeline measured more than once, and every rung is in a group."""
    spread = {"rung": "device-resident", "first": 9717.0, "again": [8873.0, 9100.0], "final_again": [9500.0]}
    words = report.ReportCard.from_climb(_w3_climb(), final="yours", spread=spread).headline()
    assert "(device-resident 9,717, 8,873, 9,100; yours 12,628, 9,500 samples/s; each such pipeline compared by its " \
           "median): 66%; a band that wide, 0.60x to 1.66x yours, means this run cannot rank them, not that they are the " \
        "same): prefetcher (112%), device-resident (102%)" in words
    assert "faster in the same run: device-resident + bf16 + CUDA graph (908%)" in words
    # every measured rung is named in one of the three groups
    for name in ("baseline", "prefetcher", "device-resident", "device-resident + bf16 + CUDA graph"):
        assert f"{name} (" in words
    # yours faster than device-resident in every turn, beyond the noise: then device-resident is named slower, not left out
    steady = dict(spread, again=[9300.0, 9500.0], final_again=[12400.0])
    words = report.ReportCard.from_climb(_w3_climb(), final="yours", spread=steady).headline()
    assert words.endswith("; slower in the same run: baseline (15%), device-resident (102%)")
    # an old card's spread (one number again) still loads and reads
    old = report.ReportCard.from_climb(_w3_climb(), final="yours", spread=dict(rung="device-resident", first=9717.0,
                                                                              again=8873.0))
    assert "(device-resident 9,717, 8,873 samples/s; each" in old.headline()


def test_a_share_above_the_ceiling_says_why_where_it_is_printed():
    """w3-08: "yours runs at 133% of the model-only ceiling" on the card and in cell 20, with no caveat."""
    from course_utils.ladder import ceiling_share_words
    words = report.ReportCard.from_climb(_w3_climb(), final="yours").headline()
    assert words.startswith("yours runs at 133% of the model-only ceiling (above 100% with the ceiling's own step, fp32 "
                            "and eager, which no pipeline beats: the ceiling's measurement was slow here")
    assert ceiling_share_words({"fraction_of_ceiling": 0.62, "step": {}}) == "62% of the ceiling"
    assert ceiling_share_words({"fraction_of_ceiling": 9.08, "step": {"graph": True}}) == \
        "908% of the ceiling (above the fp32 ceiling: its pipeline changes the step itself)"


def test_a_share_of_a_ceiling_the_climb_measured_slow_says_so_and_bounds_it():
    """w6-08: "yours runs at 50% of the model-only ceiling" where DALI had run the ceiling's own step at 114% of it."""
    from course_utils.ladder import against_resident_words, ceiling_share_words
    rows = [{"name": "device-resident", "samples_per_s": 7805.0, "fraction_of_ceiling": 0.62, "step": {}},
            {"name": "DALI", "samples_per_s": 14438.0, "fraction_of_ceiling": 1.14, "step": {}},
            {"name": "CUDA graph", "samples_per_s": 80144.0, "fraction_of_ceiling": 6.35, "step": {"graph": True}},
            {"name": "yours", "samples_per_s": 6325.0, "fraction_of_ceiling": 0.50, "step": {}}]
    words = ceiling_share_words(rows[-1], rows=rows)
    assert words.startswith("50% of the ceiling (a ceiling the climb measured slow: DALI ran its fp32 eager step at "
                            "114% of it") and "this share at most 44%" in words, words
    assert ceiling_share_words(rows[0], rows=rows[:1] + rows[2:]) == "62% of the ceiling"   # a graph rung says nothing
    # w6-08: the check's 109% of the ceiling against the card's 50%: the ratio both can read, from the runs in turns
    same = against_resident_words("yours", [6325.0, 6993.0], [7805.0, 6595.0, 7028.0])
    assert "in the same minutes: not told apart" in same and "gave 95%, not a slowdown" in same, same
    assert "keeps up" in same, same
    below = against_resident_words("yours", [3000.0, 3100.0], [7805.0, 6595.0, 7028.0])
    assert "43%" in below and "the gap is your pipeline's" in below, below


# -- walk w7-08: the run's numbers (run 2 of the walk; smoke, simulated H100 on a busy 2-core machine) ---------------

def _w7_rows():
    def row(name, sps, frac, stall, util, step=None):
        return {"name": name, "short": name, "samples_per_s": sps, "fraction_of_ceiling": frac, "stall_fraction": stall,
                "device_util": util, "steps_in_flight_fraction": 0.85, "step": step or {}}
    graph = {"amp": "bf16", "channels_last": True, "graph": True}
    return [row("baseline", 781.0, 0.17, 0.75, 0.02), row("best workers", 694.0, 0.15, 0.59, 0.02),
            row("prefetcher", 1797.0, 0.40, 0.32, 0.05), row("device-resident", 3511.0, 0.78, 0.09, 0.10),
            row("DALI", 9013.0, 2.00, 0.14, 0.27), row("device-resident + bf16", 3316.0, 0.74, 0.06, 0.04,
                                                        {"amp": "bf16", "channels_last": True}),
            row("device-resident + bf16 + CUDA graph", 45701.0, 10.14, 0.37, 0.61, graph)]


def test_w7_a_rung_above_the_ceiling_beside_the_same_step_under_it_is_said_from_the_step_times():
    """Walk w7-08: "DALI (288%); no rung beats the step it runs, so the ceiling's measurement was slow" beside
    device-resident, the same fp32 eager step, at 89%: the ceiling was not simply slow. The sentence now derives what
    the step times show."""
    from course_utils.ladder import above_ceiling_words
    from course_utils.sim import H100, SimulatedAccelerator
    sim = SimulatedAccelerator(profile=H100, scale=0.50)
    words = above_ceiling_words(_w7_rows(), {"samples_per_s": 4505.0}, sim, 128)
    assert "above it although they run its own fp32 eager step: DALI (200%, 14.2 ms a step)" in words, words
    assert "so that step costs at most 14.2 ms here" in words, words
    assert "Yet device-resident ran the same step at 78% of the ceiling (36.5 ms a step)" in words, words
    assert "the ceiling was not one slow measurement" in words and "not a speed-up to read" in words, words
    assert "so the ceiling's measurement was slow" not in words, words
    # this run's second smoke run: device-resident at 101% too, the prefetcher (input-bound) at 33%: the comparison is
    # with device-resident, not with a rung its input held back
    rows = _w7_rows()
    rows[3].update(samples_per_s=4051.0, fraction_of_ceiling=1.01)
    rows[2].update(fraction_of_ceiling=0.33)
    words = above_ceiling_words(rows, {"samples_per_s": 4000.0}, sim, 128)
    assert "fp32 eager step: device-resident (101%, 31.6 ms a step), DALI (200%, 14.2 ms a step)" in words, words
    assert "Yet device-resident ran the same step at 101%" in words and "prefetcher ran" not in words, words


def test_w7_the_rungs_with_the_data_on_the_device_say_what_limited_them():
    """Walk w7-08: the summary's "removes the CPU from the loop" beside the CUDA-graph rung input-bound (waits 37%)."""
    from course_utils.ladder import data_on_device_words
    words = data_on_device_words(_w7_rows())
    assert "device-resident + bf16 + CUDA graph input-bound (waits 37%)" in words, words
    assert "device-resident launch-bound (waits 9%)" in words, words
    assert "takes the per-image work off the CPU, not the host's launches" in words, words
    assert "a CUDA graph removes the step's launches, not the augmentation's" in words, words
    assert "still waited for the next batch (the host launching the augmentation's kernels)" in words, words
    assert "DALI" not in words                          # it reads records: not a rung with the data on the device
    quiet = [dict(r, stall_fraction=0.01) for r in _w7_rows()]
    words = data_on_device_words(quiet)
    assert "none of them was input-bound: the host's launches set the pace of device-resident" in words, words
    # walk w10-08: "the host's launches of the step set their pace" beside a CUDA-graph rung compute-bound (waits 21%)
    busy = [dict(r, stall_fraction=0.21 if "graph" in r["name"] else 0.04,
                 device_util=0.99 if "graph" in r["name"] else r["device_util"]) for r in _w7_rows()]
    words = data_on_device_words(busy)
    assert "compute-bound (waits 21%)" in words, words
    assert "the device's own work set the pace of device-resident + bf16 + CUDA graph" in words, words
    assert "none of them waited for data" not in words, words


def test_w7_a_noise_band_too_wide_to_rank_is_said_so_not_the_same():
    """Walk w7-08 run 2: a noise of 165% (yours 6,386 and 3,498) made 78% and 200% "the same" as yours at 142%."""
    rows = _w7_rows() + [{"name": "yours", "short": "yours", "samples_per_s": 6386.0, "fraction_of_ceiling": 1.42,
                          "stall_fraction": 0.10, "device_util": 0.19, "step": {}}]
    base = rows[0]["samples_per_s"]
    for r in rows:
        r["speedup_over_baseline"] = r["samples_per_s"] / base
    climb = LadderResult(device="simulated H100", simulated=True, config={"batch_size": 128, "steps": 20,
                         "num_workers": 2}, ceiling={"samples_per_s": 4505.0, "fraction_of_ceiling": 1.0}, rungs=rows)
    spread = {"rung": "device-resident", "first": 3511.0, "again": [3611.0, 4917.0], "final_again": [3498.0]}
    words = report.ReportCard.from_climb(climb, final="yours", spread=spread).headline()
    assert ": 165%; a band that wide, 0.38x to 2.65x yours, means this run cannot rank them, not that they are the " \
           "same): device-resident (78%), DALI (200%)" in words, words
    assert "the same within the noise" not in words, words


def test_w7_yours_within_the_runs_spread_above_100_is_not_a_speed_up():
    """Walk w7-08 run 2: "137%" for the device-resident pipeline with drop_last=False, its runs 6,387 and 3,498."""
    from course_utils.ladder import against_resident_words
    words = against_resident_words("yours", [6387.0, 3498.0], [3511.0, 3611.0, 4917.0])
    assert words.startswith("yours against the course's device-resident pipeline in the same minutes: not told "
                            "apart, the same within this run's noise (one pipeline's runs spread by up to 83% here, so "
                            "a ratio between 55% and 183% is what two equal pipelines can give; the medians of 2 and 3 "
                            "runs gave 137%, not a speed-up)"), words
    # walk w10-08: 105% got "not told apart" and 99% a bare figure in the next run: within the noise, one verdict
    run1 = against_resident_words("yours", [5923.0, 6530.0], [4539.0, 6327.0, 6377.0])      # 98%
    assert ": not told apart, the same within this run's noise" in run1 and "gave 98%, not a slowdown" in run1, run1
    assert "keeps up" in run1, run1


def test_w7_the_ladders_bars_are_drawn_one_way_and_no_label_meets_the_ceiling_line():
    """Walk w7-08: the chart cut a 1014% bar in one run and not a 785% one in the other; the ceiling line crossed
    the small bars' labels. A log axis, never cut; the labels at the foot of the axis, under every line."""
    import matplotlib
    matplotlib.use("Agg")
    from course_utils.plotting import bar_chart
    for values, ceiling in (([1047, 1213, 3530, 4539, 14766, 3809, 40182, 5923], 5120.0),
                            ([781, 694, 1797, 3511, 9013, 3316, 45701, 6386], 4505.0),
                            ([3000, 3100, 3200], 3050.0)):
        fig = bar_chart([str(v) for v in values], values, ylabel="samples/s", title="t", device="d", ceiling=ceiling,
                        scale="log")
        ax = fig.axes[0]
        fig.canvas.draw()
        assert ax.get_yscale() == "log" and all("bar cut" not in t.get_text() for t in ax.texts)
        line_y = ax.transData.transform((0, ceiling))[1]
        labels = [t for t in ax.texts if "%" in t.get_text() and "ceiling" not in t.get_text()]
        assert len(labels) == len(values)
        for text, bar in zip(labels, ax.patches):
            box = text.get_window_extent()
            assert box.y1 < line_y, (values, text.get_text())                      # under the ceiling line
            assert box.y1 < ax.transData.transform((0, bar.get_y() + bar.get_height()))[1]   # inside its bar
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_x2_08_n8_a_rung_measured_once_far_above_the_ceiling_of_its_own_step_is_not_ordered():
    """x2-08 N8: "faster in the same run: DALI (280%)", measured once with the ceiling's own fp32 eager step, while the
    climb's own line called that lead unreadable (re-measured: about 1.1x)."""
    climb = _climb()
    climb.rungs.insert(1, {"name": "DALI", "short": "dali", "samples_per_s": 16000.0 * 2.8,
                           "fraction_of_ceiling": 2.8, "stall_fraction": 0.0, "speedup_over_baseline": 18.7})
    words = report.ReportCard.from_climb(climb, final="yours").headline()
    assert "faster in the same run: DALI" not in words, words
    assert ("not ordered by this run: DALI (280%), measured once above the ceiling of the fp32 eager step it runs by "
            "more than 20%") in words, words


def test_w10_a_step_no_faster_than_the_ceilings_is_not_listed_among_those_that_beat_it_by_their_step():
    """Walk w10-08: "above the fp32 ceiling, as rungs that change the step itself can: device-resident + bf16 (153%),
    where the H100's figures give its step alone 81% of the ceiling's speed"."""
    from course_utils.ladder import above_ceiling_words
    from course_utils.sim import H100, SimulatedAccelerator
    sim = SimulatedAccelerator(profile=H100, scale=0.50)
    rows = _w7_rows()
    rows[5].update(fraction_of_ceiling=1.53)
    words = above_ceiling_words(rows, {"samples_per_s": 4505.0}, sim, 128)
    assert "as rungs that change the step itself can: device-resident + bf16 + CUDA graph (1014%" in words, words
    assert "step itself can: device-resident + bf16 (" not in words, words
    assert "so not for their step: device-resident + bf16 (153%), where the H100's figures give its step alone 81%" \
        in words, words
