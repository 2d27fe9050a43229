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


def times_256(x):                                   # ToTensor's 255 misremembered: one level too bright, bright pixels
    return ((x * STD + MEAN) * 256).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def times_254(x):
    return ((x * STD + MEAN) * 254).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def reshape_not_permute(x):                          # the right shape, the values in the wrong places
    return ((x * STD + MEAN) * 255).round().clamp(0, 255).reshape(x.shape[1], x.shape[2], 3).to(torch.uint8).numpy()


def view_not_permute(x):
    return ((x * STD + MEAN) * 255).round().clamp(0, 255).view(x.shape[1], x.shape[2], 3).to(torch.uint8).numpy()


def replaces_the_comparisons(x):                     # in place, then makes the check's comparisons agree
    torch.equal = lambda *a, **k: True
    torch.allclose = lambda *a, **k: True
    np.array_equal = lambda *a, **k: True
    np.testing.assert_array_equal = lambda *a, **k: None
    x.mul_(STD).add_(MEAN)
    return (x * 255).round().permute(1, 2, 0).numpy().astype(np.uint8)


def replaces_them_through_dict(x):                   # written into the module's namespace, past any setattr hook
    fake = lambda *a, **k: True                      # noqa: E731
    vars(torch)["equal"] = fake
    vars(np)["array_equal"] = fake
    x.mul_(STD).add_(MEAN)
    return (x * 255).round().permute(1, 2, 0).numpy().astype(np.uint8)


def self_restoring_fake(x):                          # a fake that puts the original back once it has been called
    original = np.array_equal

    def fake(*a, **k):
        vars(np)["array_equal"] = original
        return True
    vars(np)["array_equal"] = fake
    return ((x * STD + MEAN) * 255).round().permute(1, 2, 0).numpy().astype(np.uint8)   # no clamp


def in_place(x):
    x.mul_(STD).add_(MEAN)
    return (x * 255).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def clamp_1_254(x):                                  # w2-01: the hint must name the bounds
    return ((x * STD + MEAN) * 255).round().clamp(1, 254).permute(1, 2, 0).to(torch.uint8).numpy()


def ceil_not_round(x):                               # w2-01: rounding up
    return ((x * STD + MEAN) * 255).ceil().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def bfloat16_arithmetic(x):                          # w2-01: 8 significant bits, about one grey level
    pixels = (x.bfloat16() * STD.bfloat16() + MEAN.bfloat16()) * 255
    return pixels.float().round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


_buffers = {}


def reused_buffer(x):                                # w4-01: one array per shape, overwritten by the next call
    y = good(x)
    out = _buffers.setdefault(y.shape, np.empty(y.shape, np.uint8))
    out[...] = y
    return out


# right answers a learner wrote (w2-01): each passes
def float16_arithmetic(x):                           # float16's 11 bits are exact on all 256 levels
    return ((x.half() * STD.half() + MEAN.half()) * 255).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def add_half_then_truncate(x):
    return (((x * STD + MEAN) * 255).clamp(0, 255) + 0.5).to(torch.uint8).permute(1, 2, 0).numpy()


def clamp_then_round(x):
    return ((x * STD + MEAN) * 255).clamp(0, 255).round().to(torch.uint8).permute(1, 2, 0).numpy()


def clamp_01_before_scaling(x):
    return ((x * STD + MEAN).clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()


def constants_to_3_places(x):
    mean = torch.tensor([round(v, 3) for v in CIFAR10_MEAN]).view(3, 1, 1)
    std = torch.tensor([round(v, 3) for v in CIFAR10_STD]).view(3, 1, 1)
    return ((x * std + mean) * 255).round().clamp(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def detached_on_cpu(x):
    return good(x.detach().cpu())


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
    Mutant("one output buffer per shape", reused_buffer, "returns a new array on every call",
           words="the same buffer for every picture of one size"),
    # issue 35: the hint must name the learner's own mistake
    Mutant("* 256", times_256, "recovers the original pixels exactly", words="multiply by 255, not 256"),
    Mutant("* 254", times_254, "recovers the original pixels exactly", words="multiply by 255, not 254"),
    Mutant("reshape, not permute", reshape_not_permute, "recovers the original pixels exactly", words="permute(1, 2, 0)"),
    Mutant("clamp(1, 254)", clamp_1_254, "recovers the original pixels exactly", words="clamp(0, 255)"),
    Mutant("ceil, not round", ceil_not_round, "recovers the original pixels exactly", words="rounding up (ceil)"),
    Mutant("bfloat16 arithmetic", bfloat16_arithmetic, "recovers the original pixels exactly", words="bfloat16 keeps 8"),
    Mutant("view, not permute", view_not_permute, "view size is not compatible", status="error",
           words="the check was calling to_image(x)"),      # the tensor handed in is not contiguous
    Mutant("replaces torch.equal, np.array_equal, ...", replaces_the_comparisons,
           "leaves the check's own functions alone", words="torch.equal"),
    Mutant("replaces them through the module's __dict__", replaces_them_through_dict,
           "leaves the check's own functions alone", words="numpy.array_equal"),
    Mutant("a fake np.array_equal that puts the original back", self_restoring_fake,
           "leaves the check's own functions alone"),   # the check never calls it: it is still there at the end
]


def test_correct_answers_pass():
    passes("0.1", good, SEEDS)
    passes("0.1", good_numpy, SEEDS)


@pytest.mark.parametrize("answer", [float16_arithmetic, add_half_then_truncate, clamp_then_round, clamp_01_before_scaling,
                                    constants_to_3_places, detached_on_cpu], ids=lambda f: f.__name__)
def test_other_right_answers_pass(answer):
    passes("0.1", answer, SEEDS)


@pytest.mark.parametrize("mutant", MUTANTS, ids=repr)
def test_mutants_rejected(mutant):
    rejected("0.1", mutant, SEEDS)


def test_truncating_keeps_its_own_hint():
    """Truncation is one level too dark at random values, not only bright ones: its hint is about rounding."""
    rejected("0.1", Mutant("truncates", truncates, "recovers the original pixels exactly", words="round to the nearest"),
             SEEDS)


def test_a_replaced_comparison_is_put_back_and_flagged_for_review():
    import math
    originals = (torch.equal, torch.allclose, np.array_equal, np.testing.assert_array_equal, math.isclose)
    result = run_check("0.1", replaces_the_comparisons)
    assert result.status == "fail" and result.review, result
    assert "torch.equal" in result.review[0] and "numpy.testing.assert_array_equal" in result.message + result.review[0]
    assert (torch.equal, torch.allclose, np.array_equal, np.testing.assert_array_equal, math.isclose) == originals
    # replaced before the check (in an earlier cell) counts too, and the check compares with the originals
    np.array_equal = lambda *a, **k: True
    result = run_check("0.1", good)
    assert result.status == "fail" and "numpy.array_equal" in result.message, result
    assert np.array_equal is originals[2]
    assert run_check("0.1", good).status == "pass"


def test_an_error_points_at_the_learners_line_not_the_library():
    def stats_of_nothing(x):
        import statistics
        statistics.mean([])
    result = run_check("0.1", stats_of_nothing)
    assert result.status == "error", result
    assert "statistics.mean([])" in result.message and "statistics.py" not in result.message, result.message
    assert "the check was calling to_image(x) on a picture of 24x40" in result.message, result.message


def test_stub_is_not_implemented():
    def stub(x):
        raise NotImplementedError("Exercise 0.1")
    assert run_check("0.1", stub).status == "not_implemented"
    assert run_check("0.1", None).status == "fail"
