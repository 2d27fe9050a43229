"""course_utils.parity: what a parity verdict says; the full runs are exercised by lesson 08's check."""
import pytest

from course_utils import parity


def test_result_difference_and_verdict():
    inside = parity.ParityResult(0.80, 0.70, 60, 128, 0.15, 0, 4000, "CPU")
    outside = parity.ParityResult(0.80, 0.60, 60, 128, 0.15, 0, 4000, "CPU")
    assert inside.difference == pytest.approx(-0.10) and inside.passed
    assert not outside.passed and "OUTSIDE" in str(outside) and "-20.0 points" in str(outside)
    assert inside.as_dict()["model"] == parity.PARITY_MODEL


def test_every_budget_has_a_measured_tolerance():
    assert set(parity.TOLERANCE) == set(parity.MEASURED) == {parity.parity_steps(True), parity.parity_steps(False)}
    assert all(0 < t < 0.3 for t in parity.TOLERANCE.values())
    with pytest.raises(ValueError, match="budgets whose tolerance was measured"):
        parity.accuracy_parity(lambda ctx: None, steps=17)


def test_test_batches_are_normalised_like_the_evaluation_transform():
    import torch
    from course_utils import data
    batches = parity.test_batches("cpu", 24, batch_size=10)
    assert [len(y) for _, y in batches] == [10, 10, 4]
    images, _ = data.load_cifar10_arrays(train=False, limit=1)
    expected = data.eval_transform()(__import__("PIL.Image", fromlist=["Image"]).fromarray(images[0]))
    assert torch.allclose(batches[0][0][0], expected, atol=1e-5)
