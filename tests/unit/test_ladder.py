"""course_utils.ladder: a tiny climb checks the command line and the JSON structure (not timings)."""
import json

import pytest

from course_utils import ladder


def test_rungs_are_named_functions_in_order():
    names = [fn.rung_name for fn in ladder.RUNGS]
    assert names[:4] == ["baseline", "best workers", "prefetcher", "device-resident"]
    assert len(set(names)) == len(names)
    assert all(callable(fn) and fn.__doc__ and fn.rung_short for fn in ladder.RUNGS)


def test_unknown_rung_is_refused():
    with pytest.raises(ValueError, match="unknown rung"):
        ladder._select(ladder.RUNGS, ["warp drive"])


def test_tiny_climb_writes_table_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "ladder.json", tmp_path / "ladder.png"
    code = ladder.main(["--smoke", "--steps", "3", "--limit", "512", "--batch-size", "32", "--num-workers", "1",
                        "--step-ms", "2", "--json", str(out), "--plot", str(png)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "ceiling" in printed and "device-resident" in printed and "simulated" in printed
    result = json.loads(out.read_text())
    assert png.stat().st_size > 1000
    assert set(result) >= {"device", "simulated", "config", "ceiling", "rungs", "best", "host", "torch_version", "date"}
    assert result["simulated"] is True and "simulated" in result["device"]
    assert result["config"]["steps"] == 3 and result["config"]["batch_size"] == 32
    assert result["config"]["step_ms"] == 2.0
    assert [r["name"] for r in result["rungs"]] == [fn.rung_name for fn in ladder.RUNGS]
    skipped = {r["name"]: r["skipped"] for r in result["rungs"] if r.get("skipped")}
    assert "device-resident + bf16" not in skipped, "mixed precision is measured beside the simulator too"
    measured = [r for r in result["rungs"] if not r.get("skipped")]
    assert "DALI" in [r["name"] for r in measured] or "DALI" in skipped
    assert ("skipped" in printed) == bool(skipped)
    for row in [result["ceiling"], *measured]:
        assert row["steps"] == 3                                  # 3 counted steps, after the warm-up
        assert row["samples_per_s"] > 0 and 0 <= row["stall_fraction"] <= 1
        assert row["device"] == result["device"]
    for row in measured:
        assert row["fraction_of_ceiling"] > 0 and row["description"]
        assert row["speedup_over_baseline"] > 0
    assert result["rungs"][0]["speedup_over_baseline"] == 1.0
    assert result["best"]["name"] in [r["name"] for r in result["rungs"]]


def test_selected_rungs_only(tmp_path):
    result = ladder.climb(ladder.LadderConfig(steps=3, limit=256, batch_size=32, step_ms=1,
                                              rungs=["device-resident"]), progress=False)
    assert [r["name"] for r in result.rungs] == ["device-resident"]
    assert result.rungs[0]["speedup_over_baseline"] is None          # no baseline climbed
    assert "device-resident" in result.table()


def test_course_device_cpu_climbs_with_the_real_narrow_model():
    result = ladder.climb(ladder.LadderConfig(steps=3, limit=256, batch_size=16, num_workers=1, device="cpu",
                                              rungs=["baseline", "prefetcher", "device-resident",
                                                     "device-resident + bf16"]), progress=False)
    assert result.simulated is False and "simulated" not in result.device
    assert result.config["model"] == "resnet18-w8"
    assert [r["name"] for r in result.rungs if not r.get("skipped")] == [
        "baseline", "prefetcher", "device-resident", "device-resident + bf16"]
    assert all(r["samples_per_s"] > 0 for r in result.rungs)


# -- the building blocks lesson 08 composes ------------------------------------------------------------

def _tiny_set(n=96, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    return ladder.TrainingSet(rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, n))


def test_training_set_gives_the_same_images_three_ways():
    import numpy as np
    import torch
    ts = _tiny_set()
    records = ts.records()
    assert records.shape == (96, 3073) and (records[:, 0] == ts.labels).all()
    assert (records[5, 1:].reshape(3, 32, 32).transpose(1, 2, 0) == ts.images[5]).all()
    images, labels = ts.on_device("cpu")
    assert images.shape == (96, 3, 32, 32) and images.dtype == torch.uint8 and ts.on_device("cpu")[0] is images
    assert torch.equal(images[7].permute(1, 2, 0), torch.from_numpy(ts.images[7])) and labels.dtype == torch.int64
    item, label = ts.dataset(None)[3]
    assert np.array_equal(np.asarray(item), ts.images[3]) and label == int(ts.labels[3])
    with pytest.raises(ValueError):
        ladder.TrainingSet(ts.images[:, :16], ts.labels)


def test_pipelines_run_in_a_context_and_become_rows(sim):
    import torch
    config = ladder.LadderConfig(steps=3, batch_size=16, num_workers=0, device="sim")
    with ladder.ladder_context(config, sim=sim, progress=False, training_set=_tiny_set()) as ctx:
        assert ctx.kind == "sim" and ctx.batch_size == 16 and torch.get_num_threads() == 1
        pipeline = ladder.device_resident_pipeline(ctx)
        seen = list(ctx.model_batches(pipeline))
        assert len(seen) == 6 and seen[0][0].dtype == torch.float32 and seen[0][0].shape == (16, 3, 32, 32)
        ceiling = ladder.measure_ceiling(ctx).stats
        row = ladder.measure_rung(ctx, ladder.device_resident_pipeline, ceiling, name="yours")
        assert row["name"] == "yours" and row["steps"] == 3 and row["fraction_of_ceiling"] > 0
        assert "device" in row["description"]
        amp_row = ladder.measure_rung(ctx, ladder.mixed_precision_pipeline, ceiling)
        assert not amp_row.get("skipped") and amp_row["steps"] == 3
        result = ladder.LadderResult.from_rows(ctx, ceiling, [row])
        assert result.rungs[0]["speedup_over_baseline"] is None and result.config["step_ms"] > 0
    assert "device-resident" in pipeline.describe() and "AugmentBatch" in pipeline.describe()


def test_the_profiled_simulator_tells_the_h100s_story(monkeypatch):
    """Beside the course's simulated H100: the eager ceiling is launch-bound (the device idles
    between kernels), bf16 at batch 128 does not beat it, a CUDA graph does, and is compute-bound."""
    from course_utils import sim as simmod
    monkeypatch.setenv("COURSE_SIM_HOST_RATE", "9000")
    simmod.host_speed(refresh=True)
    try:
        result = ladder.climb(ladder.LadderConfig(steps=8, limit=512, device="sim",
                                                  rungs=["device-resident + bf16", "device-resident + bf16 + CUDA graph"]),
                              progress=False)
    finally:
        simmod._HOST_SPEED = None
    from course_utils.bottleneck import diagnose
    assert "H100" in result.device and "simulated" in result.device
    assert diagnose(result.ceiling).kind == "launch-bound" and result.ceiling["device_util"] < 0.85
    bf16, graph = result.rungs
    assert bf16["fraction_of_ceiling"] < 1.0, "at batch 128 bf16 adds launch work and saves none"
    assert graph["fraction_of_ceiling"] > 1.8, "one launch per step instead of hundreds"
    assert graph["device_util"] > result.ceiling["device_util"], "the device idles less between kernels"
    assert "launch-bound" in result.table()


def test_the_cuda_graph_rung_needs_a_gpu_or_the_simulator():
    config = ladder.LadderConfig(steps=2, batch_size=8, num_workers=0, device="cpu", model="tiny")
    with ladder.ladder_context(config, progress=False, training_set=_tiny_set(32)) as ctx:
        with pytest.raises(ladder.RungSkipped, match="need a GPU"):
            ladder.cuda_graph_pipeline(ctx)


def test_channels_last_runs_on_a_copy_of_the_model():
    import torch
    config = ladder.LadderConfig(steps=2, batch_size=8, num_workers=0, device="cpu", model="tiny")
    with ladder.ladder_context(config, progress=False, training_set=_tiny_set(32)) as ctx:
        before = next(ctx.model.parameters()).clone()
        ctx.run(ladder.mixed_precision_pipeline(ctx))
        weight = ctx.model.features[0][0].weight
        assert weight.is_contiguous() and torch.equal(next(ctx.model.parameters()), before)


def test_the_table_names_a_tie_rather_than_a_winner():     # w2-03: 7,110 against 7,112 samples/s, "best" named
    def row(name, sps):
        return {"name": name, "short": name, "samples_per_s": sps, "fraction_of_ceiling": sps / 12_626,
                "stall_fraction": 0.1, "device_util": 0.3}
    result = ladder.LadderResult(device="d", simulated=True, config={"batch_size": 128, "steps": 20, "num_workers": 2},
                                 ceiling=row("ceiling", 12_626), rungs=[row("prefetcher", 7_110),
                                                                         row("device-resident", 7_112)])
    assert "best: device-resident at 56% of the ceiling (prefetcher within 5% of it: a tie" in result.table()
    result.rungs[0]["samples_per_s"] = 5_000
    assert "within 5%" not in result.table()
    # w8-03: a notebook that measures two rounds says which one the table's "best" is of
    assert "best in round 1: device-resident at 56% of the ceiling" in result.table(best_in="round 1")


def test_the_workers_bar_is_labelled_as_the_table_names_it():   # w2-03: the bar said "workers", the table "best workers"
    assert ladder.rung_best_workers.rung_short == "best workers"


def test_the_bf16_bar_is_labelled_as_the_table_names_it():   # w3-08: the bar said "chan. last", the table did not
    assert ladder.rung_mixed_precision.rung_short.replace("\n", " ") == ladder.rung_mixed_precision.rung_name


def test_bf16_against_fp32_is_said_from_the_numbers_and_the_same_in_both_runs():
    """w3-08: the lesson said the simulator charges bf16 the H100's slower step; run 1's table had bf16 3% faster,
    run 2's 17% slower. One measurement of each cannot tell the charge (81%) from a tie: both runs say so."""
    from course_utils.sim import H100, SimulatedAccelerator

    def rows(fp32, bf16):
        return [{"name": "device-resident", "samples_per_s": fp32}, {"name": "device-resident + bf16", "samples_per_s": bf16}]
    said = []
    for scale, fp32, bf16, ceiling in ((0.55, 10857, 11160, 15639), (0.43, 9717, 8052, 9530)):
        words = ladder.precision_words(rows(fp32, bf16), {"samples_per_s": ceiling},
                                       SimulatedAccelerator(profile=H100, scale=scale), 128)
        assert f"bf16 against fp32 here: {bf16:,} against {fp32:,} samples/s" in words
        said.append(words.split(": ")[-1])
    assert said == ["both that and a tie lie within the noise, so this run cannot tell them apart"] * 2
    sim = SimulatedAccelerator(profile=H100, scale=0.43)
    assert ladder.precision_words(rows(9717, 6600), None, sim, 128).endswith(": slower, as that charge")
    assert "the same within the noise, not as far apart as that charge (the ceiling's steps took 13.4 ms on average" in \
        ladder.precision_words(rows(9717, 12000), {"samples_per_s": 9530}, sim, 128)
    assert ladder.precision_words(rows(9717, 3000), None, sim, 128).endswith("slower than even that charge, beyond the noise")
    # on a real device, no charge to compare with
    assert ladder.precision_words(rows(9717, 8052)).endswith(": the same within that noise; this run cannot order them")
    assert ladder.precision_words(rows(9717, 4000)).endswith(": bf16 slower beyond it")
    assert ladder.precision_words(rows(9717, 8052)[:1]) == "bf16 against fp32: not both measured here"


def test_the_table_says_what_one_measurement_cannot_order():
    """w3-08: "best workers" 1.3x the baseline in one run and 0.9x in the next: both runs name it as not told apart."""
    for speedup in (1.3, 0.9):
        rows = [{"name": "baseline", "speedup_over_baseline": 1.0},
                {"name": "best workers", "speedup_over_baseline": speedup},
                {"name": "prefetcher", "speedup_over_baseline": 2.8}, {"name": "DALI", "skipped": "no DALI"}]
        words = ladder.one_run_words(rows)
        assert f": best workers ({speedup:.1f}x the baseline) cannot be told from the baseline here" in words
        assert "prefetcher" not in words and "'limited by' is that measurement's too" in words
