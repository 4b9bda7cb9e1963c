"""An independent count of what autograd saves: torch's saved-tensor hooks, no autoopt code."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def hooked_saved_bytes(fn: Callable[[], object], model: nn.Module, *outside: torch.Tensor) -> int:
    """Bytes of the storages autograd saves for backward while `fn` runs, each once, the
    model's parameters (and views of them) and the `outside` tensors left out."""
    params = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *outside)}
    seen: dict[int, int] = {}
    kept: list[torch.Tensor] = []  # alive, so that no address is reused while counting

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
            kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())
