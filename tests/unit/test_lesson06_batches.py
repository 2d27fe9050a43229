"""w6-06: smoke run 2 crashed in the timeline cell (StopIteration) when the measured host speed made the lesson
choose 1024 samples per device: batch 4096 of the 10,000 records a smoke run reads is two batches (the last one
dropped), and the cell drew three. Every draw of several batches in lesson 06 goes round the loader again."""
import itertools
import json
import pathlib
import re

import torch

from course_utils.device_data import DeviceLoader

NOTEBOOK = pathlib.Path(__file__).parents[2] / "solutions" / "06-data-parallel.ipynb"


def _code() -> str:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def test_the_largest_batch_the_lesson_can_choose_still_gives_three_draws_in_smoke_mode():
    code = _code()
    per_device = max(int(v) for v in re.search(r"for b in \(([\d, ]+)\) if predict_dp", code).group(1).split(","))
    n_devices = int(re.search(r"N_DEVICES = (\d+)", code).group(1))
    records = int(re.search(r"LIMIT = ([\d_]+) if SMOKE", code).group(1).replace("_", ""))
    big = per_device * n_devices
    assert records // big < 3          # the case that crashed: fewer batches per epoch than the cell draws
    loader = DeviceLoader(torch.zeros(records, 1), torch.zeros(records), big, seed=0)
    batches = itertools.chain.from_iterable(itertools.repeat(loader))    # the cell's idiom
    assert [len(next(batches)[0]) for _ in range(3)] == [big] * 3


def test_no_cell_draws_several_batches_from_one_pass_of_a_loader():
    code = _code()
    # the cells that draw several batches go round the loader again (walk w7-06 removed cell 39's draw; the
    # timing cell's `iterator` is the one left); a fresh iter() of a loader is only ever drawn from once
    assert "itertools.chain.from_iterable(itertools.repeat(loader))" in code
    assert not re.search(r"=\s*iter\(", code)
    assert not re.search(r"=\s*iter\((fixed|naive)_loader\(", code)
