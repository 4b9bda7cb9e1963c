"""The common transforms, on PIL images and CHW tensors; random ones keep the input's size and
otherwise do nothing (the point is to run the script, not to augment)."""

import enum
import sys

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"


def _size(size):
    return (size, size) if isinstance(size, int) else tuple(size)


def _resize(img, size):
    h, w = _size(size)
    if isinstance(img, Image.Image):
        return img.resize((w, h))
    squeeze = img.dim() == 3
    out = F.interpolate(img[None].float() if squeeze else img.float(), size=(h, w))
    return out[0] if squeeze else out


class Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img


class _Identity:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, img):
        return img


class ToTensor:
    def __call__(self, img):
        if isinstance(img, torch.Tensor):
            return img
        arr = np.asarray(img, dtype=np.float32) / 255.0
        if arr.ndim == 2:
            arr = arr[:, :, None]
        return torch.from_numpy(arr.transpose(2, 0, 1).copy())


class PILToTensor(ToTensor):
    pass


class ToPILImage:
    def __init__(self, mode=None):
        pass

    def __call__(self, pic):
        if isinstance(pic, Image.Image):
            return pic
        arr = (pic.detach().clamp(0, 1) * 255).byte().permute(1, 2, 0).numpy()
        return Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)


class Normalize:
    def __init__(self, mean, std, inplace=False):
        self.mean = torch.as_tensor(mean, dtype=torch.float32).reshape(-1, 1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32).reshape(-1, 1, 1)

    def __call__(self, tensor):
        return (tensor - self.mean) / self.std


class Resize:
    def __init__(self, size, *args, **kwargs):
        self.size = size

    def __call__(self, img):
        return _resize(img, self.size)


Scale = Resize


class CenterCrop(Resize):
    pass


class RandomResizedCrop(Resize):
    pass


class RandomCrop(Resize):
    pass


class Grayscale:
    def __init__(self, num_output_channels=1):
        self.n = num_output_channels

    def __call__(self, img):
        if isinstance(img, Image.Image):
            return img.convert("L").convert("RGB" if self.n == 3 else "L")
        return img.mean(0, keepdim=True).expand(self.n, -1, -1)


class RandomApply:
    def __init__(self, transforms, p=0.5):
        self.transforms = transforms

    def __call__(self, img):
        return img


class RandomChoice(RandomApply):
    pass


class RandomOrder(Compose):
    pass


class Lambda:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, img):
        return self.fn(img)


class ConvertImageDtype:
    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, img):
        return img.to(self.dtype)


RandomHorizontalFlip = RandomVerticalFlip = ColorJitter = RandomGrayscale = _Identity
RandomRotation = RandomAffine = GaussianBlur = RandomSolarize = Pad = _Identity
RandomErasing = AutoAugment = RandAugment = TrivialAugmentWide = RandomPerspective = _Identity


transforms = sys.modules[__name__]  # `from torchvision.transforms import transforms`


def __getattr__(name):  # any other transform: identity
    return _Identity
