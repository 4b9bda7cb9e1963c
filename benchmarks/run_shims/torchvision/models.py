"""Small conv nets with torchvision's ResNet/VGG attribute names (conv1 ... layer4, avgpool, fc;
features, classifier) and feature widths, so code that reads `fc.in_features` or strips the
last children still fits together."""

import torch
from torch import nn


class ResNet(nn.Module):
    def __init__(self, width=512, num_classes=1000, **kwargs):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(2, ceil_mode=True)
        self.layer1 = nn.Conv2d(8, 8, 3, 1, 1)
        self.layer2 = nn.Conv2d(8, 16, 3, 2, 1)
        self.layer3 = nn.Conv2d(16, 16, 3, 1, 1)
        self.layer4 = nn.Conv2d(16, width, 1)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _resnet(width):
    def build(pretrained=False, progress=True, weights=None, **kwargs):
        return ResNet(width, **kwargs)

    return build


resnet18 = resnet34 = _resnet(512)
resnet50 = resnet101 = resnet152 = wide_resnet50_2 = resnext50_32x4d = _resnet(2048)


class VGG(nn.Module):
    def __init__(self, num_classes=1000, **kwargs):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.MaxPool2d(2))
        self.avgpool = nn.AdaptiveAvgPool2d(7)
        self.classifier = nn.Sequential(
            nn.Linear(16 * 49, 64), nn.ReLU(), nn.Linear(64, num_classes)
        )

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def _vgg(pretrained=False, **kwargs):
    return VGG(**kwargs)


vgg11 = vgg13 = vgg16 = vgg19 = vgg11_bn = vgg13_bn = vgg16_bn = vgg19_bn = alexnet = _vgg
