"""save_image writes nothing; make_grid concatenates along the width."""

import torch


def make_grid(tensor, *args, **kwargs):
    if isinstance(tensor, (list, tuple)):
        tensor = torch.stack(list(tensor))
    if tensor.dim() == 4:
        return torch.cat(list(tensor), dim=-1)
    return tensor


def save_image(tensor, *args, **kwargs):
    return None
