"""A few batches from the user's loader, drawn without a trace: every RNG (torch CPU and CUDA,
Python, numpy, and the loader's and its samplers' own generators) is as it was, and a loader with
persistent workers is left without a started iterator, so its next epoch is the one it would
have been without tuning.

Only from a loader that provably yields its batches again: a DataLoader over a map-style dataset
(its sampler indexes the dataset anew at each epoch), or a sequence of batches (a list). Any
other iterable may read a stream that the training loop reads too (an IterableDataset over a
socket, a file handle, a queue, shards consumed as they are read): a fresh iterator over it would
take the loop's batches, so tuning stands down instead."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from autoopt.runtime.errors import error_summary
from autoopt.runtime.loading.batch import tensor_shapes
from autoopt.runtime.trials.choices import rng_preserved


def draw(loader: Any, n: int) -> tuple[list[Any], str]:
    """Up to `n` batches from a fresh iterator over `loader`, or ([], why not)."""
    if loader is None:
        return [], "no loader given: tuning measures plans on the loader's batches"
    why_not = not_reiterable(loader)
    if why_not:
        return [], why_not
    # Even creating the iterator draws from an RNG (a DataLoader's base seed), so all of it
    # happens with the RNGs saved.
    with rng_preserved(loader_generators(loader)):
        # A persistent-worker DataLoader keeps its iterator (None before its first epoch).
        fresh_persistent = (
            isinstance(loader, DataLoader)
            and loader.persistent_workers
            and loader.num_workers > 0
            and loader._iterator is None
        )
        iterator = iter(loader)
        try:
            drawn = list(itertools.islice(iterator, n))
        except Exception as err:
            return [], f"could not draw batches from the loader ({error_summary(err)})"
        finally:
            del iterator  # a worker loader shuts its workers down here
            if fresh_persistent:
                # Dropping the kept iterator makes the user's first epoch start one (and draw
                # its base seed) as it would have.
                loader._iterator = None
    if not drawn:
        return [], "the loader yielded no batches"
    return drawn, ""


def not_reiterable(loader: Any) -> str:
    """Why drawing batches from `loader` could take them from the training loop ("" when it
    provably yields them again: a DataLoader over a map-style dataset, or a sequence)."""
    if isinstance(loader, DataLoader):
        if not isinstance(loader.dataset, IterableDataset):
            return ""
        return (
            f"the loader reads an IterableDataset ({type(loader.dataset).__name__}): a fresh "
            "iterator over it may take batches from a stream the training loop reads too (a "
            "socket, a file, a queue), so tuning does not draw from it; tune on a map-style "
            "Dataset or a list of batches, or pass tune=False"
        )
    if isinstance(loader, Sequence):
        return ""
    if hasattr(loader, "__next__"):
        return "the loader is a one-shot iterator; drawing from it would consume it"
    return (
        f"the loader ({type(loader).__name__}) is neither a DataLoader over a map-style dataset "
        "nor a sequence of batches: a fresh iterator over it may take batches from a stream "
        "the training loop reads too, so tuning does not draw from it"
    )


def loader_generators(loader: Any) -> list[torch.Generator]:
    """The torch generators a loader draws from: its own and its (batch) sampler's."""
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    owners = (loader, sampler, batch_sampler, getattr(batch_sampler, "sampler", None))
    found: dict[int, torch.Generator] = {}
    for owner in owners:
        gen = getattr(owner, "generator", None)
        if isinstance(gen, torch.Generator):
            found[id(gen)] = gen
    return list(found.values())


def one_shape(batches: list[Any]) -> bool:
    """Whether every batch holds tensors of the same shapes and dtypes, in the same order
    (what CUDA graphs need: one graph is recorded per input shape)."""
    return len({tensor_shapes(batch) for batch in batches}) == 1
