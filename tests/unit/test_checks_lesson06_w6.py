"""Lesson 06 after the sixth walk (w6-06): six caches passed (6.1 keyed on id(costs) or on one or two cost
fields, 6.3 keyed on the devices, batch, param_bytes and placement, returning a copy): the checks now change
one cost (one size) at a time between calls, as the lesson's what-ifs and its SGD-against-Adam comparison do,
change the same costs object in place, and remember what earlier checks in the process asked. Messages that
restated the formula or pointed at the wrong term now name it. The walker's answers verbatim in lesson06_w6/."""
import pathlib
import runpy

import pytest

from mutants import Mutant, passes, rejected

HERE = pathlib.Path(__file__).parent / "lesson06_w6"


def _load(stem):
    ns = runpy.run_path(str(next(HERE.glob(f"{stem}*.py"))))
    if "dp_scatter" in ns:
        return ns["dp_scatter"], ns["dp_gather"]
    return ns.get("estimate_dp") or ns["dp_memory"]


STALE_61 = "computes every call from its own arguments"
MUTANTS = [
    # caches that passed on seeds 1-6
    ("6.1", "w61_30", STALE_61, "a cache keyed on some of the arguments"),
    ("6.1", "w61_31", STALE_61, "a cache keyed on some of the arguments"),
    ("6.1", "w61_32", STALE_61, "a cache keyed on some of the arguments"),
    ("6.1", "w61_33", STALE_61, "a cache keyed on some of the arguments"),
    ("6.1", "w61_34", STALE_61, "a cache keyed on some of the arguments"),
    ("6.3", "w63_29", "computes every call from its own sizes", "keep nothing between calls"),
    # messages that named another term, or only restated the formula
    # (seed 1's first case has no host time: left out and charged to the host give one number, both named)
    ("6.1", "w61_28", "one device: batch / (compute + device-0 work)", "or charged to the host"),
    ("6.1", "w61_27", "pays the serial stages once per step", "yours leaves out reduce_ms"),
    ("6.1", "w61_29", "scatters and gathers the samples that leave device 0", "yours gathers all"),
    ("6.3", "w63_13", "device 0 holds the state, its input and its peak",
     "yours counts the gathered outputs of the other devices' pieces only"),
    ("6.3", "w63_20", "one device holds the whole step", "yours runs one device through the multi-device formula"),
    ("6.3", "w63_28", "device 0 holds the state, its input and its peak", "yours gives the reduce's moment"),
]


@pytest.mark.parametrize("exercise, stem, prop, words", MUTANTS, ids=[m[1] for m in MUTANTS])
def test_w6_06_rejected(exercise, stem, prop, words):
    rejected(exercise, Mutant(stem, _load(stem), prop, words=words), ["1"])


def test_w6_06_caches_fail_on_every_seed_also_when_a_kernel_runs_the_check_again():
    """The walker's seeds 1-6 in one process (a cache filled by an earlier run answers the next run's calls):
    a fate that depends on the seed, or on what ran before, is a bug of the check."""
    for stem in ("w61_30", "w61_32", "w61_33"):
        rejected("6.1", Mutant(stem, _load(stem), STALE_61), ["2", "3", "4"])
    rejected("6.3", Mutant("w63_29", _load("w63_29"), "computes every call from its own sizes"), ["2", "3"])


def test_w6_06_device0_on_the_host_named_where_only_it_gives_the_number():
    rejected("6.1", Mutant("w61_28", _load("w61_28"), "device 0's own work every step",
                           words="yours charges device0_ms to the host"), ["3"])


def test_w6_06_dim_ignored_is_named_where_the_count_differs():
    """w62_40 slices along dim 0 whatever dim is: on seed 2 it was told only the piece count."""
    rejected("6.2", Mutant("w62_40", _load("w62_40"), "splits like DataParallel",
                           words="not along dim=1 as asked"), ["2"])


def test_w6_06_right_answers_pass():
    """The walker's answers, and w62_22: an int output_device read as outputs[0]'s device when
    torch.cuda.is_available() is False. Kept passing: on a machine with CUDA it is the right answer (0 is
    cuda:0), and on a machine without one an int device has no right answer (torch's own gather raises
    there; DataParallel without GPUs never gathers), so the contract says nothing it breaks."""
    passes("6.1", _load("a61"), ["1"])
    passes("6.1", _load("w61_19"), ["1"])     # strict '>' for the bound: the spec allows either on ties
    passes("6.2", _load("a62"), ["1"])
    passes("6.3", _load("a63"), ["1"])
    passes("6.2", _load("w62_22"), ["1"])
