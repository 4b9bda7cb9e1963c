"""Apply a function to every tensor in a batch of any nesting: tuples, lists, dicts, namedtuples,
dataclasses. Everything that is not a tensor comes back untouched (the same object)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch


def map_tensors(
    obj: Any,
    fn: Callable[[torch.Tensor], torch.Tensor],
    other: Callable[[Any], Any] | None = None,
) -> Any:
    """`obj` with `fn` applied to each tensor inside it (containers rebuilt, others kept, or
    passed through `other` when given: every leaf that is neither a tensor nor a container)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(v, fn, other) for v in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(map_tensors(v, fn, other) for v in obj)
    if isinstance(obj, Mapping):
        try:
            return type(obj)({k: map_tensors(v, fn, other) for k, v in obj.items()})
        except TypeError:  # mapping types whose constructor takes other arguments
            return {k: map_tensors(v, fn, other) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {
            f.name: map_tensors(getattr(obj, f.name), fn, other)
            for f in dataclasses.fields(obj)
            if f.init
        }
        return dataclasses.replace(obj, **changes)
    return obj if other is None else other(obj)


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside `obj`, in order."""
    found: list[torch.Tensor] = []
    map_tensors(obj, lambda t: found.append(t) or t)
    return found


def tensor_shapes(obj: Any) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    """The shape and dtype of every tensor inside `obj`, in order: what a compiled graph (a
    CUDA graph) is recorded for."""
    return tuple((tuple(t.shape), t.dtype) for t in tensors_in(obj))


def any_tensor(obj: Any, predicate: Callable[[torch.Tensor], bool]) -> bool:
    """True if some tensor inside `obj` satisfies `predicate`."""
    return any(predicate(t) for t in tensors_in(obj))


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


def batch_rows(obj: Any) -> int | None:
    """The number of samples in a batch that can be split along dim 0: every leaf is a tensor
    (or None) and every tensor has the same first dimension. None for anything else (a scalar
    tensor, strings, ints, an object of unknown structure): it cannot be split without guessing."""
    rows: set[int] = set()
    splittable = True

    def check(t: torch.Tensor) -> torch.Tensor:
        nonlocal splittable
        if t.dim() == 0:
            splittable = False
        else:
            rows.add(t.shape[0])
        return t

    def other(leaf: Any) -> Any:
        nonlocal splittable
        splittable = splittable and leaf is None
        return leaf

    map_tensors(obj, check, other)
    return rows.pop() if splittable and len(rows) == 1 else None


def split_rows(obj: Any, sizes: list[int]) -> list[Any]:
    """`obj` cut along dim 0 into consecutive parts of `sizes` rows (views, no copies)."""
    parts, start = [], 0
    for size in sizes:
        parts.append(map_tensors(obj, lambda t, a=start, b=start + size: t[a:b]))
        start += size
    return parts
