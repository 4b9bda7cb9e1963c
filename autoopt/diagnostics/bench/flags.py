"""torch's process-wide backend flags, which a configuration may set for the whole process
(`optimize()`'s backends pass turns on TF32 and cudnn.benchmark on CUDA; pytorch-autotune leaves
its winner's): read them, and put them back before another configuration runs, so that each
one runs with the flags it set up and eager fp32 with torch's defaults."""

from __future__ import annotations

from typing import Any

import torch

_ATTRS: dict[str, tuple[Any, str]] = {
    "cudnn.benchmark": (torch.backends.cudnn, "benchmark"),
    "cudnn.deterministic": (torch.backends.cudnn, "deterministic"),
    "cudnn.allow_tf32": (torch.backends.cudnn, "allow_tf32"),
    "matmul.allow_tf32": (torch.backends.cuda.matmul, "allow_tf32"),
}


def read() -> dict[str, Any]:
    """The flags now."""
    flags = {name: getattr(owner, attr) for name, (owner, attr) in _ATTRS.items()}
    flags["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return flags


def restore(flags: dict[str, Any]) -> None:
    """Set the flags `read()` returned."""
    # The precision first: torch ties it to matmul.allow_tf32 (setting one sets the other).
    torch.set_float32_matmul_precision(flags["float32_matmul_precision"])
    for name, (owner, attr) in _ATTRS.items():
        setattr(owner, attr, flags[name])


def changed(since: dict[str, Any]) -> dict[str, Any]:
    """The flags whose value differs from `since`, with their values now."""
    return {name: value for name, value in read().items() if value != since[name]}
