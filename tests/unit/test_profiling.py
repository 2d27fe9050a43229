"""course_utils.profiling and the script lesson 01 profiles (cProfile beside torch.profiler)."""
import pstats
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from course_utils import data
from course_utils.profiling import library_of, opaque_share, profile_batches, time_by_library, top_functions

ROOT = Path(__file__).resolve().parents[2]


def slow_python_function(n):
    return sum(i * i for i in range(n))


def test_cprofile_names_the_functions_of_the_data_path():
    iterator = (slow_python_function(20_000) for _ in range(100))
    result = profile_batches(iterator, batches=5)
    assert result.batches == 5 and result.profiled_s > 0 and result.unprofiled_s > 0 and result.overhead > 0
    rows = top_functions(result.stats, 5, sort="cumtime")
    assert any("slow_python_function" in r["function"] for r in rows)
    assert all(r["own_ms"] >= 0 and r["cumulative_ms"] >= r["own_ms"] - 1e-6 for r in rows)
    by_lib = time_by_library(result.stats)
    assert sum(by_lib.values()) == pytest.approx(result.stats.total_tt, rel=1e-6)
    assert "your code" in by_lib or "python" in by_lib


@pytest.mark.parametrize("filename, name, library", [
    ("~", "<built-in method torch.as_tensor>", "torch"),
    ("~", "<method 'div' of 'torch._C.TensorBase' objects>", "torch"),
    ("~", "<built-in method PIL._imaging.fill>", "PIL"),
    ("~", "<method 'decode' of 'ImagingDecoder' objects>", "PIL"),
    ("~", "<built-in method builtins.isinstance>", "python"),
    ("~", "<built-in method marshal.loads>", "python"),
    ("~", "<built-in method __new__ of type object at 0x1>", "python"),
    ("/x/lib/python3.11/site-packages/torchvision/transforms/functional.py", "to_tensor", "torchvision"),
    ("/x/site-packages/PIL/Image.py", "fromarray", "PIL"),
    ("/repo/course_utils/data.py", "__getitem__", "course_utils"),
    ("<string>", "<module>", "python"),
])
def test_library_of(filename, name, library):
    assert library_of(filename, name) == library


def test_the_op_table_leaves_the_data_path_opaque():
    from torch.profiler import ProfilerActivity, profile

    dataset = data.CIFAR10Binary(train=True, transform=data.baseline_transform(), limit=128)
    iterator = iter(DataLoader(dataset, batch_size=32, num_workers=0))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        next(iterator)
    share = opaque_share(prof)
    assert 0.2 < share < 1.0, share


def test_the_profiling_script_runs_under_cprofile(tmp_path, monkeypatch, capsys):
    """The script lesson 01 shows with `python -m cProfile -o ...`: its main() under cProfile, in this
    process (a subprocess would profile torch's import too, which takes long on a small machine)."""
    import cProfile
    import importlib.util

    monkeypatch.setenv("COURSE_DEVICE", "sim")
    spec = importlib.util.spec_from_file_location("profile_baseline", ROOT / "notebooks" / "scripts" / "profile_baseline.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "baseline.prof"
    profiler = cProfile.Profile()
    assert profiler.runcall(script.main, ["--steps", "3", "--limit", "512", "--batch-size", "64"]) == 0
    profiler.dump_stats(out)
    assert "3 steps on simulated" in capsys.readouterr().out
    stats = pstats.Stats(str(out))
    assert any(name == "train" for (_, _, name) in stats.stats)
    by_lib = time_by_library(stats)
    assert {"torchvision", "PIL"} <= set(by_lib), by_lib


def test_quiet_kineto_holds_back_kinetos_lines_and_says_what_they_were(capfd):
    """The profiler's C++ library prints start/stop markers and, without a GPU, 'gpuGetDeviceCount
    failed' on the process's stderr (issue 35): held back, named in one sentence; other lines pass."""
    import os
    from torch.profiler import ProfilerActivity, profile
    from course_utils.profiling import loader_rows, quiet_kineto
    said = []
    with quiet_kineto(report=said.append):
        os.write(2, b"USDT:2026-11-27 05:46:20 23187:23187 SyncActivityProfilerHandler.cpp:39] profiler_start\n")
        os.write(2, b"ERROR:2026-11-27 05:46:24 23187:23187 DeviceProperties.cpp:56] gpuGetDeviceCount failed "
                    b"with code 35\n")
        os.write(2, b"a line of the lesson's own\n")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in DataLoader(list(range(8)), batch_size=4):
                pass
    err = capfd.readouterr().err
    assert "a line of the lesson's own" in err and "USDT" not in err and "gpuGetDeviceCount" not in err
    assert len(said) == 1 and "Kineto" in said[0] and "found none" in said[0] and "code 35" in said[0]
    assert [r.count for r in loader_rows(prof)] == [3]           # the DataLoader's row: two batches and the end
    with quiet_kineto(report=said.append):
        pass
    assert len(said) == 1                                         # nothing held back: nothing said


def test_quiet_kineto_lets_other_kineto_errors_through(capfd):
    import os
    from course_utils.profiling import quiet_kineto
    said = []
    with quiet_kineto(report=said.append):
        os.write(2, b"STAGE:2026-11-27 05:49:49 26749:26749 SyncActivityProfilerHandler.cpp:38] Completed Stage: Warm Up\n")
        os.write(2, b"ERROR:2026-11-27 05:49:49 26749:26749 CuptiActivityApi.cpp:12] CUPTI_ERROR_INSUFFICIENT_PRIVILEGES\n")
    err = capfd.readouterr().err
    assert "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES" in err and "Warm Up" not in err
    assert len(said) == 1 and "found none" not in said[0]
