"""Synthetic datasets with torchvision's names and constructor signatures: a few dozen PIL
images of the real dataset's size and mode, random labels (AUTOOPT_RUN_SAMPLES, default 64)."""

import os

import numpy as np
import torch
from PIL import Image

SAMPLES = int(os.environ.get("AUTOOPT_RUN_SAMPLES", "64"))


class _Synthetic(torch.utils.data.Dataset):
    size = (32, 32)
    mode = "RGB"
    n_classes = 10

    def __init__(
        self,
        root=None,
        train=True,
        transform=None,
        target_transform=None,
        download=False,
        split=None,
        **kwargs,
    ):
        self.root = root
        self.transform = transform
        self.target_transform = target_transform
        self.rng = np.random.default_rng(0 if train else 1)
        channels = 1 if self.mode == "L" else 3
        shape = (SAMPLES, *self.size) + (() if channels == 1 else (channels,))
        self.data = self.rng.integers(0, 256, size=shape, dtype=np.uint8)
        self.targets = [int(t) for t in self.rng.integers(0, self.n_classes, size=SAMPLES)]
        self.classes = [str(i) for i in range(self.n_classes)]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = [(f"{i}.png", t) for i, t in enumerate(self.targets)]
        self.imgs = self.samples
        self.labels = self.targets

    def __len__(self):
        return SAMPLES

    def __getitem__(self, index):
        img = Image.fromarray(self.data[index], mode=self.mode)
        target = self.targets[index]
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target


class MNIST(_Synthetic):
    size, mode = (28, 28), "L"


class FashionMNIST(MNIST):
    pass


class KMNIST(MNIST):
    pass


class EMNIST(MNIST):
    pass


class CIFAR10(_Synthetic):
    pass


class CIFAR100(_Synthetic):
    n_classes = 100


class SVHN(_Synthetic):
    pass


class STL10(_Synthetic):
    size = (96, 96)


class ImageFolder(_Synthetic):
    size = (64, 64)
    n_classes = 2

    def __init__(self, root=None, transform=None, target_transform=None, **kwargs):
        super().__init__(root, True, transform, target_transform)


class ImageNet(ImageFolder):
    pass


class CelebA(_Synthetic):
    size = (64, 64)


class FakeData(_Synthetic):
    def __init__(
        self,
        size=SAMPLES,
        image_size=(3, 32, 32),
        num_classes=10,
        transform=None,
        target_transform=None,
        random_offset=0,
    ):
        type(self).size = tuple(image_size[1:])
        type(self).mode = "L" if image_size[0] == 1 else "RGB"
        type(self).n_classes = num_classes
        super().__init__(None, True, transform, target_transform)


def __getattr__(name):  # any other dataset: a small RGB one
    return type(name, (_Synthetic,), {})
