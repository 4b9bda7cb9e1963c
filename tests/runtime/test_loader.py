"""The loader pass: rebuilt vs wrapped (with reasons), kept options, device moves, set_epoch."""

from __future__ import annotations

import dataclasses
import multiprocessing
from collections import namedtuple
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
    WeightedRandomSampler,
)

import autoopt
from autoopt.runtime import hardware
from autoopt.runtime.context import Context, DistState
from autoopt.runtime.loading.device_loader import DeviceBatches, DeviceLoader
from autoopt.runtime.options import Options
from autoopt.runtime.passes import loader as loader_pass
from autoopt.runtime.passes.loader import choose_workers
from autoopt.runtime.report import Status

META = torch.device("meta")  # a real device move that needs no GPU: tensors lose their data
Pair = namedtuple("Pair", ["x", "y"])


@dataclasses.dataclass
class Item:
    x: torch.Tensor
    name: str


class Squares(Dataset):
    """Map-style, not a TensorDataset: the kind of dataset workers can help."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(i)]), i * i


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(6.0).view(6, 1))


class MyLoader(DataLoader):
    pass


def _ctx(loader: Any, device: torch.device | None = None, dist: DistState | None = None) -> Context:
    ctx = Context(options=Options(), model=nn.Linear(1, 1), loader=loader, optimizer=None)
    ctx.device = device
    ctx.dist = dist
    return ctx


def _run(loader: Any, **kwargs: Any) -> tuple[Any, Any]:
    ctx = _ctx(loader, **kwargs)
    result = loader_pass.run(ctx)
    assert isinstance(ctx.loader, DeviceBatches if isinstance(loader, list) else DeviceLoader)
    return ctx.loader, result


def _collate_tag(batch: list) -> Any:
    return torch.utils.data.default_collate(batch)


def _init_worker(worker_id: int) -> None:
    pass


def test_no_loader_is_skipped() -> None:
    ctx = _ctx(None)
    assert loader_pass.run(ctx).status is Status.SKIPPED
    assert ctx.loader is None


def test_tensor_dataset_on_cpu_is_wrapped_with_its_reason() -> None:
    data = TensorDataset(torch.arange(8.0).view(8, 1), torch.arange(8))
    user = DataLoader(data, batch_size=3, shuffle=True)
    wrapped, result = _run(user, device=torch.device("cpu"))
    assert not wrapped.rebuilt and wrapped.loader is user
    assert "wrapped" in result.detail and "TensorDataset" in result.detail
    assert len(wrapped) == 3 and wrapped.dataset is data and wrapped.batch_size == 3
    assert isinstance(wrapped.sampler, RandomSampler)
    seen = sorted(int(i) for _, y in wrapped for i in y)
    assert seen == list(range(8))


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: MyLoader(Squares(), batch_size=2), "subclass MyLoader"),
        (lambda: DataLoader(Stream(), batch_size=2), "IterableDataset"),
        (lambda: [(torch.ones(2, 1), torch.zeros(2))] * 3, "list is not a DataLoader"),
        (lambda: DataLoader(Squares(), batch_size=2, num_workers=2), "chosen by the user"),
    ],
)
def test_loaders_that_are_not_rebuilt_say_why(make: Any, reason: str) -> None:
    user = make()
    wrapped, result = _run(user, device=torch.device("cpu"))
    assert result.status is Status.APPLIED
    assert result.detail.startswith("wrapped") and reason in result.detail
    assert wrapped.loader is user and not getattr(wrapped, "rebuilt", False)


def test_not_iterable_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="iterable of batches"):
        loader_pass.run(_ctx(42))


def test_every_option_survives_the_rebuild() -> None:
    gen = torch.Generator().manual_seed(3)
    user = DataLoader(
        Squares(),
        batch_size=3,
        shuffle=True,
        drop_last=True,
        collate_fn=_collate_tag,
        generator=gen,
        worker_init_fn=_init_worker,
        timeout=7.0,
        num_workers=1,
        multiprocessing_context="spawn",
        prefetch_factor=3,
    )
    # Sharding across ranks forces a rebuild on CPU; the user's worker choice is kept.
    dist = DistState(rank=1, world_size=2, local_rank=1, backend="gloo")
    wrapped, result = _run(user, device=torch.device("cpu"), dist=dist)
    new = wrapped.loader
    assert wrapped.rebuilt and type(new) is DataLoader and new is not user
    assert "rebuilt" in result.detail and "num_workers=1 chosen by the user" in result.detail
    assert new.dataset is user.dataset
    assert new.batch_size == 3 and new.drop_last is True
    assert new.collate_fn is _collate_tag
    assert new.generator is gen and new.worker_init_fn is _init_worker
    assert new.timeout == 7.0 and new.num_workers == 1 and new.prefetch_factor == 3
    assert new.multiprocessing_context.get_start_method() == "spawn"
    assert new.pin_memory is False  # CPU: pinning is pointless
    sampler = new.sampler
    assert isinstance(sampler, DistributedSampler)
    assert sampler.shuffle is True and sampler.drop_last is True  # the user's shuffle/drop_last
    assert sampler.rank == 1 and sampler.num_replicas == 2


def test_distributed_sampler_keeps_no_shuffle_and_custom_batch_sampler() -> None:
    dist = DistState(rank=0, world_size=2, local_rank=0, backend="gloo")
    plain, _ = _run(DataLoader(Squares(), batch_size=2), dist=dist)
    assert isinstance(plain.sampler, DistributedSampler) and plain.sampler.shuffle is False
    assert [int(i) for x, _ in plain for i in x.view(-1)] == [0, 2, 4, 6, 8]

    user_batches = BatchSampler(RandomSampler(range(10)), batch_size=4, drop_last=True)
    custom, _ = _run(DataLoader(Squares(), batch_sampler=user_batches), dist=dist)
    inner = custom.loader.batch_sampler
    assert isinstance(inner, BatchSampler) and inner.batch_size == 4 and inner.drop_last
    assert isinstance(inner.sampler, DistributedSampler) and inner.sampler.shuffle is True
    assert len(custom) == 1  # 5 samples on this rank, batches of 4, last dropped


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_gets_plain_torchs_distributed_sampler_samples(
    rank: int, drop_last: bool, shuffle: bool
) -> None:
    """9 samples on 2 ranks, where DistributedSampler's drop_last decides whether the last
    sample is dropped or a first one repeated: two epochs of each rank's batches as the loop
    torch documents yields them (its own DistributedSampler and set_epoch)."""
    data = TensorDataset(torch.arange(9.0).view(9, 1))
    dist = DistState(rank=rank, world_size=2, local_rank=rank, backend="gloo")
    wrapped, _ = _run(
        DataLoader(data, batch_size=2, shuffle=shuffle, drop_last=drop_last), dist=dist
    )
    sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=shuffle,
                                 drop_last=drop_last)  # fmt: skip
    plain = DataLoader(data, batch_size=2, sampler=sampler, drop_last=drop_last)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        expected = [x.view(-1).tolist() for (x,) in plain]
        assert [x.view(-1).tolist() for (x,) in wrapped] == expected, epoch


def test_sampler_without_a_sharded_twin_is_wrapped_and_reported() -> None:
    dist = DistState(rank=0, world_size=2, local_rank=0, backend="gloo")
    weighted = WeightedRandomSampler([1.0] * 10, num_samples=10)
    wrapped, result = _run(DataLoader(Squares(), batch_size=2, sampler=weighted), dist=dist)
    assert not wrapped.rebuilt
    assert "WeightedRandomSampler cannot be sharded" in result.detail


def test_set_epoch_is_called_on_each_pass_and_reshuffles() -> None:
    dist = DistState(rank=0, world_size=2, local_rank=0, backend="gloo")
    wrapped, _ = _run(DataLoader(Squares(), batch_size=5, shuffle=True), dist=dist)
    epochs = []
    for expected in range(3):
        epochs.append([int(i) for x, _ in wrapped for i in x.view(-1)])
        assert wrapped.sampler.epoch == expected
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]
    assert all(len(e) == 5 for e in epochs)


def test_batches_of_every_shape_arrive_on_the_device_non_tensors_untouched() -> None:
    tag = object()
    batches = [
        (torch.ones(2), torch.zeros(2)),
        [torch.ones(2), "label"],
        {"x": torch.ones(2), "meta": {"ids": [1, 2], "obj": tag}},
        Pair(torch.ones(2), 3),
        Item(torch.ones(2), "item"),
    ]
    wrapped, result = _run(batches, device=META)
    assert "list is not a DataLoader" in result.detail and "moved to meta" in result.detail
    out = list(wrapped)
    assert len(wrapped) == 5 and len(out) == 5
    assert isinstance(out[0], tuple) and all(t.device == META for t in out[0])
    assert isinstance(out[1], list) and out[1][0].device == META and out[1][1] == "label"
    assert out[2]["x"].device == META and out[2]["meta"]["ids"] == [1, 2]
    assert out[2]["meta"]["obj"] is tag
    assert isinstance(out[3], Pair) and out[3].x.device == META and out[3].y == 3
    assert isinstance(out[4], Item) and out[4].x.device == META and out[4].name == "item"
    assert batches[0][0].device.type == "cpu"  # the user's batches are not modified


def test_batch_transforms_apply_after_the_move_including_later_ones() -> None:
    ctx = _ctx([torch.ones(2)], device=torch.device("cpu"))
    loader_pass.run(ctx)
    ctx.batch_transforms.append(lambda b: b * 3)  # a pass running after the loader pass
    assert torch.equal(next(iter(ctx.loader)), torch.full((2,), 3.0))


def test_generator_without_len_is_wrapped_and_len_raises() -> None:
    wrapped, _ = _run((torch.ones(1) for _ in range(2)), device=torch.device("cpu"))
    with pytest.raises(TypeError):
        len(wrapped)
    assert len(list(wrapped)) == 2


def test_worker_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = DataLoader(Squares(), batch_size=2)
    tensors = DataLoader(TensorDataset(torch.ones(4, 1)), batch_size=2)
    monkeypatch.setattr(hardware, "available_cpus", lambda: 16)
    assert choose_workers(tensors, cuda=True)[0] == 0
    assert choose_workers(loader, cuda=True)[0] == 8
    assert choose_workers(loader, cuda=True, local_world_size=4)[0] == 3  # 4 cores each
    assert choose_workers(loader, cuda=False)[0] == 2  # one worker per 8 cores
    monkeypatch.setattr(hardware, "available_cpus", lambda: 2)
    workers, why = choose_workers(loader, cuda=False)
    assert workers == 0 and "compete" in why
    assert choose_workers(loader, cuda=True)[0] == 1


def test_unpicklable_dataset_gets_no_workers_under_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    class Local(Squares):  # a class defined in a function cannot be pickled
        pass

    loader = DataLoader(Local(), batch_size=2)
    monkeypatch.setattr(hardware, "available_cpus", lambda: 16)
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda *a, **k: "spawn")
    workers, why = choose_workers(loader, cuda=True)
    assert workers == 0 and "dataset cannot be pickled" in why
    assert choose_workers(DataLoader(Squares(), batch_size=2), cuda=True)[0] == 8


def test_rebuild_adds_workers_and_persistent_prefetch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "available_cpus", lambda: 16)
    user = DataLoader(Squares(), batch_size=2, shuffle=True)
    wrapped, result = _run(user, device=torch.device("cpu"))
    new = wrapped.loader
    assert wrapped.rebuilt and new.num_workers == 2
    assert new.persistent_workers is True and new.prefetch_factor == 2
    assert new.sampler is user.sampler  # the user's shuffle, same sampler object
    assert "num_workers=2" in result.detail


def test_optimize_returns_the_wrapped_loader_end_to_end() -> None:
    model = nn.Linear(1, 1)
    batches = [(torch.ones(4, 1), torch.zeros(4, 1))] * 2
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, loader, opt = autoopt.optimize(
        model, batches, opt, amp=False, compile=False, verbose=False
    )
    assert isinstance(loader, DeviceBatches) and len(loader) == 2
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    assert autoopt.report(model)["loader"].status is Status.APPLIED


def test_sequential_sampler_stays_unshuffled_when_rebuilt_for_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hardware, "available_cpus", lambda: 16)
    wrapped, _ = _run(DataLoader(Squares(), batch_size=5), device=torch.device("cpu"))
    assert isinstance(wrapped.sampler, SequentialSampler)
