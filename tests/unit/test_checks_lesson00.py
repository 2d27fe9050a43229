import numpy as np
import torch

from course_utils.checks import run_check
from course_utils.data import CIFAR10_MEAN, CIFAR10_STD

MEAN = torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
STD = torch.tensor(CIFAR10_STD).view(3, 1, 1)


def good(x):
    return ((x * STD + MEAN) * 255).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def test_correct_passes():
    assert run_check("0.1", good).status == "pass"


def test_common_mistakes_fail_on_the_right_property():
    no_permute = lambda x: ((x * STD + MEAN) * 255).round().clamp(0, 255).to(torch.uint8).numpy()  # noqa: E731
    assert "shape is (H, W, 3)" in run_check("0.1", no_permute).message
    floats = lambda x: ((x * STD + MEAN) * 255).permute(1, 2, 0).numpy()  # noqa: E731
    assert "dtype is uint8" in run_check("0.1", floats).message
    no_unnormalise = lambda x: (x * 255).clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()  # noqa: E731
    assert "recovers the original pixels" in run_check("0.1", no_unnormalise).message
    tensor = lambda x: (x * STD + MEAN).permute(1, 2, 0)  # noqa: E731
    assert "returns a NumPy array" in run_check("0.1", tensor).message

    def in_place(x):
        x.mul_(STD).add_(MEAN)
        return (x * 255).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()
    assert "leaves its input unchanged" in run_check("0.1", in_place).message


def test_stub_is_not_implemented():
    def stub(x):
        raise NotImplementedError("Exercise 0.1")
    assert run_check("0.1", stub).status == "not_implemented"
