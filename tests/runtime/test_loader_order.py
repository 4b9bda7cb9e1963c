"""The loader optimize() returns yields the same samples in the same order as the user's loader,
every epoch: the user's loader is built twice from the same seeds, one copy goes through
optimize() (which rebuilds it with persistent workers), and three epochs of each are compared
exactly, with the global torch RNG driven the same way on both sides as a training script does."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

import autoopt
from autoopt.runtime import hardware
from autoopt.runtime.context import Context, DistState
from autoopt.runtime.options import Options
from autoopt.runtime.passes import loader as loader_pass

EPOCHS = 3


class Numbers(Dataset):
    """Map-style and not a TensorDataset, so the loader pass gives it workers."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(i)]), i


class EagerShuffle(Sampler[int]):
    """A user's sampler that draws its permutation from the global RNG as soon as it is iterated
    (a plain method, not a generator function)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.n).tolist())

    def __len__(self) -> int:
        return self.n


def _seed_worker(worker_id: int) -> None:
    torch.manual_seed(torch.initial_seed() % 2**32 + worker_id)


DATA = Numbers()
CONFIGS: dict[str, Callable[[], DataLoader]] = {
    "seeded generator": lambda: DataLoader(
        DATA, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(7)
    ),
    "global RNG": lambda: DataLoader(DATA, batch_size=3, shuffle=True),
    "no shuffle": lambda: DataLoader(DATA, batch_size=5),
    "sampling with replacement": lambda: DataLoader(
        DATA, batch_size=4, sampler=RandomSampler(DATA, replacement=True, num_samples=40)
    ),
    "weighted sampler": lambda: DataLoader(
        DATA, batch_size=3, sampler=WeightedRandomSampler([1.0 + i for i in range(12)], 12)
    ),
    "subset sampler with its own generator": lambda: DataLoader(
        DATA,
        batch_size=2,
        sampler=SubsetRandomSampler(range(0, 12, 2), generator=torch.Generator().manual_seed(3)),
    ),
    "batch sampler": lambda: DataLoader(
        DATA, batch_sampler=BatchSampler(RandomSampler(DATA), batch_size=5, drop_last=False)
    ),
    "worker_init_fn": lambda: DataLoader(
        DATA, batch_size=3, shuffle=True, worker_init_fn=_seed_worker
    ),
    "custom sampler drawing from the global RNG": lambda: DataLoader(
        DATA, batch_size=3, sampler=EagerShuffle(12)
    ),
}


def _epochs(loader: object, reseed: bool) -> list[list[list[int]]]:
    """Three epochs of sample ids, with the global RNG used between epochs like a training loop."""
    torch.manual_seed(0)
    seen = []
    for epoch in range(EPOCHS):
        if reseed:
            torch.manual_seed(100 + epoch)
        seen.append([[int(v) for v in x.view(-1)] for x, _ in loader])
        torch.rand(5)  # the training's own draws (dropout, init, ...)
    return seen


@pytest.fixture
def many_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "available_cpus", lambda: 16)  # CPU training gets 2 workers


@pytest.mark.usefixtures("many_cores")
@pytest.mark.parametrize("reseed", [True, False], ids=["seed each epoch", "seed once"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_epoch_has_the_users_order(config: str, reseed: bool) -> None:
    make = CONFIGS[config]
    expected = _epochs(make(), reseed)
    model, loader = autoopt.optimize(
        nn.Linear(1, 1), make(), device="cpu", amp=False, compile=False, verbose=False
    )
    detail = autoopt.report(model)["loader"].detail
    if config.startswith("custom sampler"):
        # Workers read ahead, which would move the sampler's draws: no workers, said why.
        assert "custom EagerShuffle" in detail and loader.loader.num_workers == 0
    else:
        assert loader.rebuilt and loader.loader.persistent_workers, detail
    assert _epochs(loader, reseed) == expected
    assert expected[0] != expected[1] or config == "no shuffle"  # the epochs really reshuffle


def _dist_ctx(loader: DataLoader) -> Context:
    ctx = Context(options=Options(), model=nn.Linear(1, 1), loader=loader, optimizer=None)
    ctx.device = torch.device("cpu")
    ctx.dist = DistState(rank=1, world_size=2, local_rank=1, backend="gloo")
    return ctx


def _dist_epochs(loader: DataLoader, sampler: DistributedSampler, first: int) -> list[list[int]]:
    """Epochs as a DDP script runs them: `sampler.set_epoch(epoch)` before each."""
    seen = []
    for epoch in range(first, first + EPOCHS):
        sampler.set_epoch(epoch)
        seen.append([int(v) for x, _ in loader for v in x.view(-1)])
    return seen


@pytest.mark.usefixtures("many_cores")
def test_the_users_own_distributed_sampler_keeps_the_users_epochs() -> None:
    def make() -> DataLoader:
        return DataLoader(DATA, batch_size=2, sampler=DistributedSampler(DATA, 2, 1, seed=5))

    reference = make()
    expected = _dist_epochs(reference, reference.sampler, first=4)  # e.g. resumed at epoch 4
    ctx = _dist_ctx(make())
    loader_pass.run(ctx)
    assert ctx.loader.rebuilt  # workers added
    assert _dist_epochs(ctx.loader, ctx.loader.sampler, first=4) == expected


@pytest.mark.usefixtures("many_cores")
def test_autoopts_distributed_sampler_follows_set_epoch_calls_by_the_user() -> None:
    ctx = _dist_ctx(DataLoader(DATA, batch_size=2, shuffle=True))
    loader_pass.run(ctx)
    made = ctx.loader.sampler
    assert isinstance(made, DistributedSampler) and made.shuffle
    twin = DistributedSampler(DATA, num_replicas=2, rank=1, shuffle=True)
    expected = _dist_epochs(DataLoader(DATA, batch_size=2, sampler=twin), twin, first=4)
    assert _dist_epochs(ctx.loader, made, first=4) == expected
