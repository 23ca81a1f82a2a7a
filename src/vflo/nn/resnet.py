"""A ResNet-18 trunk (He et al. 2016) for Entity Augmentation's image guests; it needs a GPU.

Written here because torchvision does not import beside the pinned CPU build of PyTorch.
Batch normalisation keeps running statistics, so guests built from it are put in eval mode
for scoring like any other module.
"""

from __future__ import annotations

import torch
from torch import nn

from vflo.errors import MethodError


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.skip(x))


def resnet18_trunk(channels: int, *, require_gpu: bool = True) -> nn.Sequential:
    """Convolutional ResNet-18 up to global pooling (512 features per image)."""
    if require_gpu and not torch.cuda.is_available():
        raise MethodError(
            "the 'resnet18' guest needs a CUDA GPU and none is available here; use the small convolutional guest "
            "(e.g. ['reshape 1 28 14', 'conv 16 3', 'relu', 'maxpool 2', ...]) on a CPU"
        )
    layers: list[nn.Module] = [nn.Conv2d(channels, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
    cin = 64
    for cout, stride in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)):
        layers.append(BasicBlock(cin, cout, stride))
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers)
