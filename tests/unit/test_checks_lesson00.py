"""Check 0.1, proven: the solution passes, the stub is 'not implemented', every mutant fails on its
property on every seed."""
import numpy as np
import pytest
import torch

from course_utils.checks import run_check
from course_utils.data import CIFAR10_MEAN, CIFAR10_STD
from mutants import Mutant, passes, rejected

MEAN = torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
STD = torch.tensor(CIFAR10_STD).view(3, 1, 1)
SEEDS = range(8)          # every run has both extremes and all three shapes: a few seeds suffice


def good(x):
    return ((x * STD + MEAN) * 255).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def good_numpy(x):
    pixels = (x.numpy() * np.array(CIFAR10_STD)[:, None, None] + np.array(CIFAR10_MEAN)[:, None, None]) * 255
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8).transpose(1, 2, 0)


def no_permute(x):
    return ((x * STD + MEAN) * 255).round().clamp(0, 255).to(torch.uint8).numpy()


def transposed(x):                                   # (W, H, 3): right only for square pictures
    return ((x * STD + MEAN) * 255).round().clamp(0, 255).permute(2, 1, 0).to(torch.uint8).numpy()


def floats(x):
    return ((x * STD + MEAN) * 255).round().clamp(0, 255).permute(1, 2, 0).numpy()


def float64_array(x):
    return good(x).astype(np.float64)


def no_unnormalise(x):
    return (x * 255).clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def truncates(x):                                    # .to(uint8) without round: one grey level short, often
    return ((x * STD + MEAN) * 255).clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def to_pil(x):                                       # ToPILImage multiplies by 255 and truncates
    import torchvision.transforms as T
    return np.array(T.ToPILImage()((x * STD + MEAN).clamp(0, 1)))


def no_clamp(x):
    return ((x * STD + MEAN) * 255).round().permute(1, 2, 0).numpy().astype(np.uint8)


def wrong_order(x):                                  # (x + mean) * std
    return ((x + MEAN) * STD * 255).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def swapped(x):
    return ((x * MEAN + STD) * 255).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def imagenet(x):
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    return ((x * std + mean) * 255).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def other_cifar_std(x):                              # the (0.2023, 0.1994, 0.2010) of many repositories
    std = torch.tensor([0.2023, 0.1994, 0.2010]).view(3, 1, 1)
    return ((x * std + MEAN) * 255).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def bgr(x):
    return np.ascontiguousarray(good(x)[..., ::-1])


def tensor(x):
    return (x * STD + MEAN).permute(1, 2, 0)


def in_place(x):
    x.mul_(STD).add_(MEAN)
    return (x * 255).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


MUTANTS = [
    Mutant("no permute", no_permute, "shape is (H, W, 3)"),
    Mutant("permute(2, 1, 0)", transposed, "shape is (H, W, 3)"),
    Mutant("float values", floats, "dtype is uint8"),
    Mutant("a float64 array", float64_array, "dtype is uint8"),
    Mutant("forgets Normalize", no_unnormalise, "recovers the original pixels exactly"),
    Mutant("truncates instead of rounding", truncates, "recovers the original pixels exactly", words="round"),
    Mutant("ToPILImage (truncates)", to_pil, "recovers the original pixels exactly"),
    Mutant("(x + mean) * std", wrong_order, "recovers the original pixels exactly"),
    Mutant("mean and std swapped", swapped, "recovers the original pixels exactly"),
    Mutant("ImageNet's constants", imagenet, "recovers the original pixels exactly"),
    Mutant("the other CIFAR std", other_cifar_std, "recovers the original pixels exactly"),
    Mutant("BGR", bgr, "recovers the original pixels exactly"),
    Mutant("no clamp", no_clamp, "clamps to 0..255"),
    Mutant("returns a tensor", tensor, "returns a NumPy array"),
    Mutant("in place", in_place, "leaves its input unchanged"),
]


def test_correct_answers_pass():
    passes("0.1", good, SEEDS)
    passes("0.1", good_numpy, SEEDS)


@pytest.mark.parametrize("mutant", MUTANTS, ids=repr)
def test_mutants_rejected(mutant):
    rejected("0.1", mutant, SEEDS)


def test_stub_is_not_implemented():
    def stub(x):
        raise NotImplementedError("Exercise 0.1")
    assert run_check("0.1", stub).status == "not_implemented"
    assert run_check("0.1", None).status == "fail"
