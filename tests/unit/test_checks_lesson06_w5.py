"""Lesson 06 after the fifth walk (w5-06): no wrong answer passed; the messages that pointed away from
the mistake (w63_13, w61_20, w62_27) or only restated the formula (w61_15, w61_16, w61_25, w63_03, w63_22, w63_23) now
name it. The walker's answers verbatim in lesson06_w5/."""
import pathlib
import runpy

import pytest

from mutants import Mutant, rejected

HERE = pathlib.Path(__file__).parent / "lesson06_w5"


def _load(stem):
    ns = runpy.run_path(str(next(HERE.glob(f"{stem}*.py"))))
    if "dp_scatter" in ns:
        return ns["dp_scatter"], ns["dp_gather"]
    return ns.get("estimate_dp") or ns["dp_memory"]


MUTANTS = [
    # one replica too few ("replica 0 is the model"): the formula only
    ("6.1", "w61_15", "the host launches the step once and works for every replica", "one replica fewer than the pieces"),
    # the one-device baseline at batch / n_devices, or with a replica's host work: the formula only
    ("6.1", "w61_16", "efficiency compares with one device alone", "on batch / n_devices"),
    ("6.1", "w61_25", "efficiency compares with one device alone", "a replica's host work"),
    # device 0's piece of the input dropped with the batch on the host: told 'counts the input inside the max'
    ("6.3", "w63_13", "a batch left on the host puts only its piece on device 0",
     "yours leaves out device 0's piece of the input"),
    # both moments summed, the whole batch's activations on device 0, the others' outputs: the formula only
    ("6.3", "w63_03", "device 0 holds the state, its input and its peak", "yours adds the two moments"),
    ("6.3", "w63_22", "device 0 holds the state, its input and its peak", "the whole batch's activations"),
    ("6.3", "w63_23", "the others hold a replica, their piece and their peak",
     "its piece's outputs and their gradient"),
    # cat on outputs[0]'s device (the CPU), then .to(target): told about .cpu()/.tolist()/.numpy()
    ("6.2", "w62_27", "gathers on the device, nothing through the host", "joins the outputs on outputs[0]'s device"),
]


@pytest.mark.parametrize("exercise, stem, prop, words", MUTANTS, ids=[m[1] for m in MUTANTS])
def test_w5_06_named(exercise, stem, prop, words):
    rejected(exercise, Mutant(stem, _load(stem), prop, words=words), ["1"])


def test_w5_06_baseline_loader_named_on_every_seed():
    """w61_20 (the baseline's loader charged for the whole batch) was told 'the speed-up over one device' on
    seed 1 (loader-bound: both give the same number) and the formula on seeds 2-3."""
    rejected("6.1", Mutant("w61_20", _load("w61_20"), "efficiency compares with one device alone, same loader",
                           words="charges the one-device baseline's loader for the whole global batch"), ["1", "2", "3"])
