"""`seed_everything`: one seed for python, numpy, torch and every CUDA device."""

from __future__ import annotations

import os
import random

import torch


def seed_everything(seed: int, deterministic: bool = False) -> int:
    """Seed `random`, numpy (if installed), torch and all CUDA devices with `seed`.

    With `deterministic=True` also set `cudnn.deterministic=True`, `cudnn.benchmark=False`,
    `torch.use_deterministic_algorithms(True)` and the cuBLAS workspace variable it needs.
    Returns the seed."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed_everything(seed=...) needs an int, got {type(seed).__name__}")
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)  # for subprocesses (workers started by spawn)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
    torch.cuda.manual_seed_all(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
    return seed
