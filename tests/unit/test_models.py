import pytest
import torch

from course_utils.models import TinyCNN, build_model, count_parameters, resnet18_cifar


def test_resnet18_is_the_standard_cifar_model():
    model = resnet18_cifar()
    assert count_parameters(model) == 11_173_962
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_narrow_and_tiny_models():
    assert count_parameters(resnet18_cifar(width=16)) < count_parameters(resnet18_cifar()) / 10
    assert TinyCNN()(torch.zeros(3, 3, 32, 32)).shape == (3, 10)
    assert isinstance(build_model("resnet18-w16"), torch.nn.Module)
    with pytest.raises(ValueError, match="unknown model"):
        build_model("vgg")
