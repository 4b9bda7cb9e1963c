"""DeviceLoader and DeviceBatches at the edges their integration tests do not reach (each test
kills mutants that survived `make mutation`; docs/benchmarks/mutation.md)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

from autoopt.runtime.loading import device_loader
from autoopt.runtime.loading.device_loader import DeviceBatches, DeviceLoader, LoaderProxy

CPU = torch.device("cpu")


@pytest.fixture
def moves(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any]]:
    """Records the (device, non_blocking) of every batch moved."""
    seen: list[tuple[Any, Any]] = []

    def record(batch: Any, device: Any, non_blocking: bool = False) -> Any:
        seen.append((device, non_blocking))
        return batch

    monkeypatch.setattr(device_loader, "to_device", record)
    return seen


def test_the_device_and_non_blocking_reach_every_copy(moves: list[tuple[Any, Any]]) -> None:
    batches = [torch.ones(2), torch.zeros(2)]
    list(DeviceLoader(batches, CPU))
    list(DeviceBatches(batches, CPU))
    assert moves == [(CPU, False)] * 4  # blocking unless asked: memory may not be pinned
    moves.clear()
    list(DeviceLoader(batches, CPU, non_blocking=True))
    list(DeviceBatches(batches, CPU, non_blocking=True))
    assert moves == [(CPU, True)] * 4


def test_transforms_apply_after_the_move() -> None:
    loader = DeviceLoader([torch.ones(2)], CPU, transforms=[lambda b: b * 3])
    assert torch.equal(next(iter(loader)), torch.full((2,), 3.0))


def test_a_proxy_before_init_raises_attribute_error_with_the_name() -> None:
    proxy = LoaderProxy.__new__(LoaderProxy)
    with pytest.raises(AttributeError, match="^batch_size$"):
        _ = proxy.batch_size


def test_wrapped_by_default_rebuilt_when_said() -> None:
    assert not DeviceLoader([], CPU).rebuilt
    assert repr(DeviceLoader([], CPU)).startswith("DeviceLoader(wrapped, device=cpu")
    assert repr(DeviceLoader([], CPU, rebuilt=True)).startswith("DeviceLoader(rebuilt, ")


class _Persistent:
    """A loader with a persistent iterator: `_iterator` is set once the first pass started."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(0)
        self._iterator: object | None = None

    def __iter__(self) -> Any:
        self._iterator = object()
        return iter([torch.ones(1)])


def _one_draw(generator: torch.Generator) -> torch.Tensor:
    """The generator's state after the draw a DataLoader makes when it starts an iterator."""
    probe = torch.Generator()
    probe.set_state(generator.get_state())
    torch.empty((), dtype=torch.int64).random_(generator=probe)
    return probe.get_state()


@pytest.mark.parametrize("draw", [False, True])
def test_the_base_seed_is_drawn_on_resets_only_and_only_when_asked(draw: bool) -> None:
    loader = _Persistent()
    wrapped = DeviceLoader(loader, CPU, draw_base_seed=draw)
    start = loader.generator.get_state()
    list(wrapped)  # the first pass: the DataLoader draws its own seed, we draw nothing
    assert torch.equal(loader.generator.get_state(), start)
    expected = _one_draw(loader.generator) if draw else start
    list(wrapped)  # a reset of the persistent iterator: one int64 draw, as a fresh start makes
    assert torch.equal(loader.generator.get_state(), expected)
    assert not DeviceLoader(loader, CPU)._draw_base_seed  # off by default


def _sampler(epoch: int = 0) -> DistributedSampler:
    sampler = DistributedSampler(TensorDataset(torch.arange(8)), num_replicas=2, rank=0)
    sampler.set_epoch(epoch)
    return sampler


def test_passes_set_the_epoch_from_zero_whatever_the_sampler_held() -> None:
    sampler = _sampler(epoch=5)
    loader = DeviceLoader([torch.ones(1)], CPU, epoch_sampler=sampler)
    for n in range(3):
        list(loader)
        assert sampler.epoch == n
    assert loader.epoch == 3


def test_once_the_user_sets_the_epoch_their_epochs_rule_for_good() -> None:
    sampler = _sampler()
    loader = DeviceLoader([torch.ones(1)], CPU, epoch_sampler=sampler)
    list(loader)
    sampler.set_epoch(7)
    list(loader)
    list(loader)
    assert sampler.epoch == 7 and loader._epoch_sampler is None


def test_a_tuple_of_batches_becomes_a_list_that_can_be_shuffled() -> None:
    batches = DeviceBatches((torch.zeros(1), torch.ones(1)), CPU)
    assert isinstance(batches.loader, list)
    batches[0], batches[1] = batches[1], batches[0]
    assert [b.item() for b in batches] == [1.0, 0.0]


def test_slice_writes_store_the_originals_not_the_device_copies() -> None:
    originals = [torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)]
    batches = DeviceBatches(list(originals), CPU, transforms=[torch.clone])
    batches[0:2] = [batches[1], batches[0]]
    assert batches.loader[0] is originals[1] and batches.loader[1] is originals[0]


def test_only_the_last_two_reads_are_kept_alive() -> None:
    """A swap needs the last two reads; older device copies must be freed."""
    batches = DeviceBatches([torch.ones(1) for _ in range(5)], CPU, transforms=[torch.clone])
    first = weakref.ref(batches[0])
    for i in range(1, 3):
        batches[i]
    gc.collect()
    assert first() is None
