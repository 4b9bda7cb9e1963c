"""batch.map_tensors / to_device: every nesting of containers, non-tensors untouched."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, namedtuple

import torch

from autoopt.runtime.loading.batch import any_tensor, map_tensors, to_device

Pair = namedtuple("Pair", ["x", "y"])


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    label: int
    extra: dict


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: torch.Tensor
    tag: str = "t"


def _double(t: torch.Tensor) -> torch.Tensor:
    return t * 2


def test_nested_containers_are_rebuilt_with_their_types() -> None:
    meta = object()
    batch = {
        "pair": Pair(torch.ones(2), [torch.ones(1), "text", 3]),
        "sample": Sample(torch.ones(3), 7, {"mask": torch.ones(2), "id": meta}),
        "frozen": Frozen(torch.ones(1)),
        "ordered": OrderedDict(z=torch.ones(1)),
        "tuple": (torch.ones(1), None),
    }
    out = map_tensors(batch, _double)
    assert isinstance(out["pair"], Pair)
    assert torch.equal(out["pair"].x, torch.full((2,), 2.0))
    assert out["pair"].y[1] == "text" and out["pair"].y[2] == 3
    assert torch.equal(out["pair"].y[0], torch.full((1,), 2.0))
    assert isinstance(out["sample"], Sample) and out["sample"].label == 7
    assert torch.equal(out["sample"].extra["mask"], torch.full((2,), 2.0))
    assert out["sample"].extra["id"] is meta  # the same object, not a copy
    assert isinstance(out["frozen"], Frozen) and out["frozen"].tag == "t"
    assert torch.equal(out["frozen"].a, torch.full((1,), 2.0))
    assert isinstance(out["ordered"], OrderedDict)
    assert out["tuple"][1] is None
    assert torch.equal(batch["pair"].x, torch.ones(2))  # the input is left as it was


def test_to_device_moves_every_tensor_and_none_is_a_no_op() -> None:
    batch = (torch.ones(2, dtype=torch.float64), {"ids": torch.arange(3)}, "keep")
    assert to_device(batch, None) is batch
    out = to_device(batch, torch.device("meta"))
    assert out[0].device.type == "meta" and out[0].dtype == torch.float64
    assert out[1]["ids"].device.type == "meta"
    assert out[2] == "keep"
    assert not any_tensor(out, lambda t: t.device.type == "cpu")
    assert any_tensor(batch, lambda t: t.dtype == torch.int64)
