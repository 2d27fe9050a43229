"""Models every lesson trains: a CIFAR ResNet-18 and a tiny CNN for smoke runs (lesson 01).

`resnet18_cifar()` is the usual CIFAR variant of ResNet-18 (3x3 stem, no max-pool, four
stages of two BasicBlocks, 11.2 M parameters at width 64). `width` scales every stage, so a
smoke run can use the same architecture at a fraction of the cost. `TinyCNN` is four conv
layers, small enough to train on a 2-core CPU in seconds.
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

__all__ = ["BasicBlock", "ResNet18CIFAR", "resnet18_cifar", "TinyCNN", "build_model", "count_parameters"]


class BasicBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18CIFAR(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 64):
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True))
        layers, in_ch = [], w
        for i, stride in enumerate([1, 2, 2, 2]):
            out_ch = w * 2 ** i
            layers += [BasicBlock(in_ch, out_ch, stride), BasicBlock(out_ch, out_ch, 1)]
            in_ch = out_ch
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def resnet18_cifar(num_classes: int = 10, width: int = 64) -> ResNet18CIFAR:
    """The CIFAR ResNet-18 (width 64 is the standard 11.2 M-parameter model)."""
    return ResNet18CIFAR(num_classes, width)


class TinyCNN(nn.Module):
    """Four 3x3 conv layers with BatchNorm and pooling, then a linear classifier (~0.1 M params)."""

    def __init__(self, num_classes: int = 10, width: int = 32):
        super().__init__()
        w = width
        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True))
        self.features = nn.Sequential(block(3, w), nn.MaxPool2d(2), block(w, 2 * w), nn.MaxPool2d(2),
                                      block(2 * w, 2 * w), nn.MaxPool2d(2), block(2 * w, 4 * w))
        self.fc = nn.Linear(4 * w, num_classes)

    def forward(self, x):
        x = self.features(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def build_model(name: str, num_classes: int = 10) -> nn.Module:
    """'resnet18' (width 64), 'resnet18-w16' (a quarter width, for CPU runs) or 'tiny'."""
    if name == "resnet18":
        return resnet18_cifar(num_classes)
    if name.startswith("resnet18-w"):
        return resnet18_cifar(num_classes, width=int(name.split("-w", 1)[1]))
    if name == "tiny":
        return TinyCNN(num_classes)
    raise ValueError(f"unknown model {name!r}: use 'resnet18', 'resnet18-w16' or 'tiny'")


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
