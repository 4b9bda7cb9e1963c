"""What `optimize()` hands back as the loader: the user's batches, on the device.

* `DeviceLoader` iterates a loader (the user's, or the DataLoader the loader pass rebuilt).
* `DeviceBatches` is a list or tuple of batches that stays a mutable sequence: index, slice,
  `len`, iteration and `random.shuffle` work as on the user's list.

Both move every batch to the device when it is read (any nesting of tuples, lists, dicts,
namedtuples and dataclasses; non-tensors untouched; `non_blocking` copies when the memory is
pinned) and then apply the context's batch transforms."""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableSequence
from typing import Any, overload

import torch
from torch.utils.data import DistributedSampler

from autoopt.runtime.loading.batch import to_device

Transform = Callable[[Any], Any]


class _Mover:
    """Moves a batch to the device, then applies the transforms in order."""

    def __init__(
        self, device: torch.device | None, non_blocking: bool, transforms: list[Transform] | None
    ) -> None:
        self.device = device
        self.non_blocking = non_blocking
        # The context's list itself, so a transform a later pass appends still applies.
        self.transforms = transforms if transforms is not None else []

    def __call__(self, batch: Any) -> Any:
        batch = to_device(batch, self.device, self.non_blocking)
        for transform in self.transforms:
            batch = transform(batch)
        return batch


class LoaderProxy:
    """Stands in for the loader in `_loader`: `len()` and the attributes a subclass does not
    define (`loader.dataset`, `loader.batch_size`, `loader.sampler`) are the wrapped loader's."""

    _loader: Any

    @property
    def loader(self) -> Any:
        """The wrapped loader."""
        return self._loader

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails; guard against recursion before __init__ ran.
        loader = self.__dict__.get("_loader")
        if loader is None:
            raise AttributeError(name)
        return getattr(loader, name)


class DeviceLoader(LoaderProxy):
    """Iterates the wrapped loader, yielding batches moved to `device` and transformed.

    `epoch_sampler`: a DistributedSampler autoopt created; the n-th pass calls its
    `set_epoch(n)` (n = 0, 1, ...) until the user calls `set_epoch` on it themselves.
    `draw_base_seed`: the rebuilt loader has persistent workers the user's loader did not have.
    A DataLoader draws a base seed from its generator (or the global RNG) each time it starts an
    iterator; a persistent one starts it once and only resets it on later passes, so its sampler
    would then draw other numbers than the user's. Drawing the seed on those passes keeps every
    epoch's order equal to the user's loader."""

    def __init__(
        self,
        loader: Any,
        device: torch.device | None,
        *,
        non_blocking: bool = False,
        transforms: list[Transform] | None = None,
        epoch_sampler: DistributedSampler | None = None,
        draw_base_seed: bool = False,
        rebuilt: bool = False,
    ) -> None:
        self._loader = loader
        self._move = _Mover(device, non_blocking, transforms)
        self._epoch_sampler = epoch_sampler
        self._epoch_set = epoch_sampler.epoch if epoch_sampler is not None else 0
        self._draw_base_seed = draw_base_seed
        self._epoch = 0
        self.rebuilt = rebuilt  # `loader` is then the rebuilt DataLoader, not the user's

    @property
    def epoch(self) -> int:
        """How many passes over the loader have started."""
        return self._epoch

    def __iter__(self) -> Iterator[Any]:
        sampler = self._epoch_sampler
        if sampler is not None:
            if sampler.epoch != self._epoch_set:
                self._epoch_sampler = None  # the user calls set_epoch: their epochs rule
            else:
                # Each rank's shuffle is seeded by (seed + epoch): without this every epoch
                # would see the same order, the classic DistributedSampler pitfall.
                sampler.set_epoch(self._epoch)
                self._epoch_set = self._epoch
        if self._draw_base_seed and self._loader._iterator is not None:  # a reset, not a start
            torch.empty((), dtype=torch.int64).random_(generator=self._loader.generator)
        self._epoch += 1
        return map(self._move, iter(self._loader))

    def __repr__(self) -> str:
        how = "rebuilt" if self.rebuilt else "wrapped"
        return f"DeviceLoader({how}, device={self._move.device}, loader={self._loader!r})"


class DeviceBatches(MutableSequence):
    """The user's list (or tuple) of batches as a mutable sequence whose items are read on the
    device. Slicing gives another `DeviceBatches` over that part of the list.

    Writes go to the user's list. A batch read from this sequence and written back (as
    `random.shuffle`, `reverse` and `x[i], x[j] = x[j], x[i]` do) is stored as the original
    batch, not as its device copy, so shuffling never moves the whole list to the device."""

    _RECENT = 2  # reads remembered for write-back: a swap reads two items, then writes them

    def __init__(
        self,
        batches: list[Any] | tuple[Any, ...],
        device: torch.device | None,
        *,
        non_blocking: bool = False,
        transforms: list[Transform] | None = None,
    ) -> None:
        self._batches = batches if isinstance(batches, list) else list(batches)
        self._move = _Mover(device, non_blocking, transforms)
        self._recent: list[tuple[Any, Any]] = []  # (device batch, original batch)

    @property
    def loader(self) -> list[Any]:
        """The list being read (the user's own list; a copy when a tuple was given)."""
        return self._batches

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> DeviceBatches: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            part = DeviceBatches(self._batches[index], None)
            part._move = self._move  # the same device, pinning and (live) transforms
            return part
        original = self._batches[index]
        moved = self._move(original)
        self._recent = [*self._recent[1 - self._RECENT :], (moved, original)]
        return moved

    def __setitem__(self, index: int | slice, value: Any) -> None:
        if isinstance(index, slice):
            self._batches[index] = [self._original(v) for v in value]
        else:
            self._batches[index] = self._original(value)

    def __delitem__(self, index: int | slice) -> None:
        del self._batches[index]

    def __len__(self) -> int:
        return len(self._batches)

    def insert(self, index: int, value: Any) -> None:
        self._batches.insert(index, self._original(value))

    def __iter__(self) -> Iterator[Any]:
        return map(self._move, self._batches)

    def __repr__(self) -> str:
        return f"DeviceBatches({len(self)} batches, device={self._move.device})"

    def _original(self, value: Any) -> Any:
        return next((orig for moved, orig in self._recent if moved is value), value)
