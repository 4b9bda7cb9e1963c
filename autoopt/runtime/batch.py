"""Apply a function to every tensor in a batch of any nesting: tuples, lists, dicts, namedtuples,
dataclasses. Everything that is not a tensor comes back untouched (the same object)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`obj` with `fn` applied to each tensor inside it (containers rebuilt, others kept)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(v, fn) for v in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(map_tensors(v, fn) for v in obj)
    if isinstance(obj, Mapping):
        try:
            return type(obj)({k: map_tensors(v, fn) for k, v in obj.items()})
        except TypeError:  # mapping types whose constructor takes other arguments
            return {k: map_tensors(v, fn) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {
            f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init
        }
        return dataclasses.replace(obj, **changes)
    return obj


def any_tensor(obj: Any, predicate: Callable[[torch.Tensor], bool]) -> bool:
    """True if some tensor inside `obj` satisfies `predicate`."""
    found = False

    def check(t: torch.Tensor) -> torch.Tensor:
        nonlocal found
        found = found or predicate(t)
        return t

    map_tensors(obj, check)
    return found


def to_device(obj: Any, device: torch.device | str | None, non_blocking: bool = False) -> Any:
    """`obj` with every tensor moved to `device` (no-op when `device` is None).

    Meant for host-to-device moves: `non_blocking=True` overlaps the copy with compute when the
    source is pinned host memory (from pageable memory the copy is synchronous anyway). Do not
    use it to copy device tensors back to the host and read them at once."""
    if device is None:
        return obj
    target = torch.device(device)

    def move(t: torch.Tensor) -> torch.Tensor:
        return t.to(target, non_blocking=non_blocking)

    return map_tensors(obj, move)
