"""A list of batches given to optimize() comes back as a mutable sequence of device batches."""

from __future__ import annotations

import random

import torch
from torch import nn

import autoopt
from autoopt.runtime.loading.device_loader import DeviceBatches

META = torch.device("meta")  # a real device move that needs no GPU


def _batches(n: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, 1), float(i)), torch.tensor([i, i])) for i in range(n)]


def _ids(seq: object) -> list[int]:
    return [int(y[0]) for _, y in seq]


def test_index_slice_len_iteration_on_the_device() -> None:
    user = _batches()
    seq = DeviceBatches(user, META)
    assert len(seq) == 6
    x, y = seq[2]
    assert x.device == META and y.device == META
    assert seq[-1][0].device == META
    part = seq[1:5:2]
    assert isinstance(part, DeviceBatches) and len(part) == 2
    assert part.loader == [user[1], user[3]] and part[0][0].device == META
    assert [b[0].device for b in seq] == [META] * 6
    assert user[2][0].device.type == "cpu"  # the user's batches are not moved


def test_random_shuffle_in_place_keeps_host_batches() -> None:
    user = _batches()
    plain = list(user)
    seq = DeviceBatches(user, None)
    random.seed(3)
    random.shuffle(seq)
    random.seed(3)
    random.shuffle(plain)
    assert _ids(seq) == _ids(plain) and _ids(seq) != list(range(6))
    # The swaps stored the user's own batch objects, not device copies of them.
    assert all(a is b for a, b in zip(seq.loader, plain, strict=True))

    on_meta = DeviceBatches(_batches(), META)
    random.shuffle(on_meta)
    assert all(x.device.type == "cpu" for x, _ in on_meta.loader)
    on_meta.reverse()
    assert all(x.device.type == "cpu" for x, _ in on_meta.loader)


def test_writes_reach_the_users_list() -> None:
    user = _batches(3)
    seq = DeviceBatches(user, None)
    extra = (torch.zeros(2, 1), torch.tensor([9, 9]))
    seq.append(extra)
    del seq[0]
    seq[0] = extra
    assert user[-1] is extra and user[0] is extra and len(user) == 3


def test_optimize_returns_a_list_of_batches_as_a_sequence() -> None:
    model = nn.Linear(1, 1)
    batches = _batches(4)
    model, loader = autoopt.optimize(
        model, batches, device="cpu", amp=False, compile=False, verbose=False
    )
    assert len(loader) == 4 and _ids(loader[1:3]) == [1, 2] and int(loader[3][1][0]) == 3
    random.seed(0)
    random.shuffle(loader)
    assert sorted(_ids(loader)) == [0, 1, 2, 3]
    assert "a sequence" in autoopt.report(model)["loader"].detail
