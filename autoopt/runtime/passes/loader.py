"""Pass: loader (AO101-AO104, AO503). Batches arrive on the device, loaded in parallel.

What happens to `optimize(..., loader)`:

* **Rebuilt** — an exact `torch.utils.data.DataLoader` over a map-style dataset is rebuilt with
  `pin_memory=True` (CUDA only), worker processes (rule below), `persistent_workers=True` and a
  `prefetch_factor` when it has workers, keeping dataset, sampler (which carries the user's
  shuffle), batch_sampler, batch_size, collate_fn, drop_last, generator, worker_init_fn,
  timeout, multiprocessing_context and in_order. Under torchrun the sampler becomes a
  `DistributedSampler` keeping the user's shuffle and drop_last.
* **Wrapped** — anything that cannot be rebuilt safely is iterated as it is, with the reason in
  the report: a DataLoader subclass (its constructor may differ), an IterableDataset (sharding
  across workers is the dataset's job), a DataLoader with nothing to change (e.g. the user chose
  `num_workers` and there is no pinning or sampler to add), and any other iterable.
* **A list or tuple of batches** comes back as a `DeviceBatches` sequence (index, slice, len,
  `random.shuffle`), reading the user's list.

What comes back (`autoopt.runtime.loading.device_loader`) yields batches already on `ctx.device`,
applies `ctx.batch_transforms`, supports `len()` when the underlying loader does and exposes its
attributes (`dataset`, `batch_size`, `sampler`, ...).

Sample order: every epoch yields the same samples in the same order as the user's loader, drawn
from the same RNG (the loader's `generator`, else the global torch RNG) at the same points:
* Workers are only added over torch's own samplers (sequential, random, subset, weighted,
  distributed, in torch's BatchSampler), which draw nothing when an iterator starts and then
  draw from their own generator or once from the global RNG. A custom sampler may draw from the
  global RNG as it goes; workers read ahead, which would change when, so it gets none.
* Workers autoopt adds are persistent; `DeviceLoader` draws the base seed a non-persistent
  loader draws each epoch, so later epochs keep the user's order.
* Under torchrun the order is the `DistributedSampler`'s (each rank a shard): autoopt calls
  `set_epoch(n)` on the n-th pass over the one it created, until the user calls `set_epoch`
  themselves; a DistributedSampler the user made is left to the user.
* Random augmentations inside the dataset run in the workers, seeded per worker as in any
  DataLoader with workers: the same samples, augmented with other random numbers.

Worker rule (`num_workers` is only chosen when the user left it at 0):
* 0 for an in-memory `TensorDataset`: indexing resident tensors is cheaper than the IPC a
  worker adds.
* CUDA: `min(8, cores - 1)`, where `cores` = CPUs this process may use / local world size; one
  core stays with the training process that feeds the GPU.
* CPU training: `min(4, cores // 8)`, i.e. none below 8 cores per process. Workers compete with
  the training's own intra-op threads for the same cores, so on small machines they make CPU
  training slower; on large ones a few overlap decoding with compute.
* 0 when the start method is not `fork` and the dataset (or collate/worker_init functions)
  cannot be pickled, since workers would fail to start.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)

from autoopt.runtime import hardware
from autoopt.runtime.context import Context
from autoopt.runtime.loading.device_loader import DeviceBatches, DeviceLoader
from autoopt.runtime.report import PassResult

NAME = "loader"
MAX_WORKERS_CUDA = 8
MAX_WORKERS_CPU = 4
CPU_CORES_PER_WORKER = 8  # on CPU training, one worker per 8 cores the process owns
PREFETCH_CUDA = 4
PREFETCH_CPU = 2
# Samplers whose iterator draws nothing when it starts (workers start it early and read ahead).
_ORDER_SAFE_SAMPLERS = (
    SequentialSampler,
    RandomSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    DistributedSampler,
)


def run(ctx: Context) -> PassResult | None:
    """Rebuild or wrap `ctx.loader`; set `ctx.loader` to the `DeviceLoader` or `DeviceBatches`."""
    if ctx.loader is None:
        return PassResult.skipped(NAME, "no loader given")
    if isinstance(ctx.loader, DeviceLoader | DeviceBatches):
        return PassResult.skipped(NAME, "the loader was already prepared by autoopt")
    device = ctx.device
    cuda = device is not None and device.type == "cuda"
    user = ctx.loader
    if not _iterable(user):
        raise TypeError(
            f"optimize(loader=...) needs an iterable of batches (a DataLoader, a list of "
            f"batches, ...), got {type(user).__name__}"
        )
    where = f"batches moved to {device}" if device is not None else "batches left where they are"
    unsharded: list[str] = []  # a loader iterated as it is is not split across ranks
    if ctx.dist is not None and not _is_distributed_sampler(getattr(user, "sampler", None)):
        unsharded.append("not sharded: every rank iterates all of it")
    if isinstance(user, list | tuple):
        ctx.loader = DeviceBatches(user, device, transforms=ctx.batch_transforms)
        what = f"{type(user).__name__} is not a DataLoader"
        return PassResult.applied(
            NAME, f"wrapped ({what}): a sequence, " + ", ".join([*unsharded, where])
        )

    loader = user
    rebuilt = False
    notes: list[str] = []
    reason = _cannot_rebuild(user)
    if reason is not None:
        notes = unsharded
    else:
        plan = _plan(user, ctx, cuda, notes)
        if plan is None:
            reason = "; ".join(notes) or "nothing to change"
            notes = []
        else:
            loader = DataLoader(**plan)
            rebuilt = True

    pinned = cuda and bool(getattr(loader, "pin_memory", False))
    # A DistributedSampler autoopt made gets set_epoch calls; the user's own is left to them.
    ours = _inner_sampler(loader) if rebuilt else None
    if not _is_distributed_sampler(ours) or ours is _inner_sampler(user):
        ours = None
    ctx.loader = DeviceLoader(
        loader,
        device,
        non_blocking=pinned,
        transforms=ctx.batch_transforms,
        epoch_sampler=ours,
        draw_base_seed=rebuilt and loader.persistent_workers and not user.persistent_workers,
        rebuilt=rebuilt,
    )
    if pinned:
        where += " (non_blocking)"
    if rebuilt:
        return PassResult.applied(NAME, "rebuilt: " + ", ".join([*notes, where]))
    return PassResult.applied(NAME, f"wrapped ({reason}): " + ", ".join([*notes, where]))


def _iterable(obj: Any) -> bool:
    # Not `iter(obj)`: on a DataLoader with workers that would start the worker processes.
    return hasattr(obj, "__iter__") or hasattr(obj, "__getitem__")


def _cannot_rebuild(loader: Any) -> str | None:
    """Why `loader` may not be rebuilt, or None when it may."""
    if not isinstance(loader, DataLoader):
        return f"{type(loader).__name__} is not a DataLoader"
    if type(loader) is not DataLoader:
        return f"DataLoader subclass {type(loader).__name__} may not take the same arguments"
    if isinstance(loader.dataset, IterableDataset):
        return "IterableDataset: sharding across workers and ranks is the dataset's own job"
    return None


def _plan(loader: DataLoader, ctx: Context, cuda: bool, notes: list[str]) -> dict[str, Any] | None:
    """The arguments of the rebuilt DataLoader, or None when a rebuild would change nothing
    (or cannot keep the user's semantics; the reason then goes to `notes`)."""
    kwargs: dict[str, Any] = {
        "dataset": loader.dataset,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "num_workers": loader.num_workers,
        "persistent_workers": loader.persistent_workers,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):  # torch >= 2.6
        kwargs["in_order"] = loader.in_order
    if getattr(loader, "pin_memory_device", ""):
        kwargs["pin_memory_device"] = loader.pin_memory_device
    changed = False

    # Batching: the user's own batch_sampler, or (batch_size, drop_last) over a sampler.
    custom_batches = loader.batch_size is None and loader.batch_sampler is not None
    sampler = loader.sampler
    if ctx.dist is not None and not _is_distributed_sampler(_inner_sampler(loader)):
        dist_sampler = _distributed_sampler(loader, ctx)
        if dist_sampler is None:
            notes.append(
                f"{type(_inner_sampler(loader)).__name__} cannot be sharded across ranks; "
                "every rank iterates all of it"
            )
            return None
        if custom_batches:
            batch_sampler = loader.batch_sampler
            kwargs["batch_sampler"] = BatchSampler(
                dist_sampler, batch_sampler.batch_size, batch_sampler.drop_last
            )
        else:
            sampler = dist_sampler
        notes.append(
            f"DistributedSampler(shuffle={dist_sampler.shuffle}, "
            f"drop_last={dist_sampler.drop_last}) over {ctx.dist.world_size} ranks"
        )
        changed = True
    if "batch_sampler" not in kwargs:
        if custom_batches:
            kwargs["batch_sampler"] = loader.batch_sampler
        else:
            kwargs.update(sampler=sampler, batch_size=loader.batch_size, drop_last=loader.drop_last)

    if cuda and not loader.pin_memory:
        kwargs["pin_memory"] = True
        notes.append("pin_memory=True")
        changed = True

    if loader.num_workers > 0:
        notes.append(f"num_workers={loader.num_workers} chosen by the user, kept")
    elif (custom := _custom_sampler(loader)) is not None:
        notes.append(
            f"num_workers=0 (custom {custom}: workers would change when it draws random "
            "numbers, and so the order)"
        )
    else:
        workers, why = choose_workers(loader, cuda, _local_world_size(ctx))
        if workers > 0:
            prefetch = PREFETCH_CUDA if cuda else PREFETCH_CPU
            kwargs.update(num_workers=workers, persistent_workers=True, prefetch_factor=prefetch)
            notes.append(
                f"num_workers={workers} ({why}), persistent_workers=True, "
                f"prefetch_factor={prefetch}"
            )
            changed = True
        else:
            notes.append(f"num_workers=0 ({why})")
    return kwargs if changed else None


def choose_workers(loader: DataLoader, cuda: bool, local_world_size: int = 1) -> tuple[int, str]:
    """How many worker processes to give a loader the user left at `num_workers=0`, and why."""
    if isinstance(loader.dataset, TensorDataset):
        return 0, "in-memory TensorDataset: workers would only add IPC"
    cores = max(1, hardware.available_cpus() // max(1, local_world_size))
    if cuda:
        workers = min(MAX_WORKERS_CUDA, cores - 1)
        why = f"{cores} cores per process, one kept for the training process"
    else:
        workers = min(MAX_WORKERS_CPU, cores // CPU_CORES_PER_WORKER)
        why = f"CPU training on {cores} cores per process; workers would compete for them"
        if workers > 0:
            why = f"CPU training on {cores} cores per process: one worker per 8 cores"
    if workers <= 0:
        return 0, why
    start = loader.multiprocessing_context
    method = start.get_start_method() if start is not None else multiprocessing.get_start_method()
    if method != "fork":
        blocker = _unpicklable(loader)
        if blocker is not None:
            return 0, f"{blocker} cannot be pickled for '{method}' worker processes"
    return workers, why


def _local_world_size(ctx: Context) -> int:
    if ctx.dist is None:
        return 1
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _unpicklable(loader: DataLoader) -> str | None:
    for name in ("dataset", "collate_fn", "worker_init_fn"):
        try:
            pickle.dumps(getattr(loader, name))
        except Exception:  # pickling can raise almost anything (TypeError, PicklingError, ...)
            return name
    return None


def _inner_sampler(loader: DataLoader) -> Any:
    """The sampler that picks indices: inside the user's batch_sampler when there is one."""
    if loader.batch_size is None and loader.batch_sampler is not None:
        return getattr(loader.batch_sampler, "sampler", None)
    return loader.sampler


def _custom_sampler(loader: DataLoader) -> str | None:
    """The name of a sampler or batch sampler that is not one of torch's order-safe ones."""
    if loader.batch_size is None and type(loader.batch_sampler) is not BatchSampler:
        return type(loader.batch_sampler).__name__
    inner = _inner_sampler(loader)
    return None if type(inner) in _ORDER_SAFE_SAMPLERS else type(inner).__name__


def _is_distributed_sampler(sampler: Any) -> bool:
    return isinstance(sampler, DistributedSampler)


def _distributed_sampler(loader: DataLoader, ctx: Context) -> DistributedSampler | None:
    """A DistributedSampler with the user's shuffle and drop_last, or None when the user's
    sampling (weighted, subset, custom) has no sharded equivalent."""
    assert ctx.dist is not None
    inner = _inner_sampler(loader)
    custom_batches = loader.batch_size is None and loader.batch_sampler is not None
    if custom_batches and type(loader.batch_sampler) is not BatchSampler:
        return None
    if type(inner) is RandomSampler:
        if inner.replacement or getattr(inner, "_num_samples", None) is not None:
            return None  # sampling with replacement or a different count has no sharded twin
        shuffle = True
    elif type(inner) is SequentialSampler:
        shuffle = False
    else:
        return None
    drop_last = loader.batch_sampler.drop_last if custom_batches else loader.drop_last
    return DistributedSampler(
        loader.dataset,
        num_replicas=ctx.dist.world_size,
        rank=ctx.dist.rank,
        shuffle=shuffle,
        drop_last=drop_last,
    )
