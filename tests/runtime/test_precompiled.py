"""A model the user compiled in place (`model.compile()`) before `optimize()`: left to its own
compile, trained as the same model compiled by hand, and autoopt's own bookkeeping (the trials'
clocks, the layout guard, device moves) never traced by dynamo."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import autoopt

from .models import DropoutMLP, SmallCNN, batches, cnn_data, mlp_data


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimize: dict | None) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if optimize is not None:
        model, optimizer = autoopt.optimize(model, optimizer=optimizer, verbose=False, **optimize)
    torch.manual_seed(1)
    losses = []
    for xb, yb in batches(x, y, 16) * 3:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", ["cnn", "dropout"])
def test_a_model_compiled_in_place_trains_as_compiled_by_hand(name: str, tmp_path: Path) -> None:
    """compile="auto" with a compile cache (the trials measure compile, on a CNN the layout
    too): the user's compile is kept, no graph break comes from autoopt's code (on main dynamo
    traced it and raised from the compile log), and training matches the hand-compiled model."""
    build, data = (SmallCNN, cnn_data) if name == "cnn" else (DropoutMLP, mlp_data)
    torch.manual_seed(0)
    reference = build()
    model = copy.deepcopy(reference)
    x, y = data(48)
    reference.compile(backend="aot_eager")
    expected = fit(reference, x, y, None)
    breaks = dict(counters["graph_break"])
    model.compile(backend="aot_eager")
    got = fit(model, x, y, {"compile_cache": tmp_path, "amp": False})
    result = autoopt.report(model)["compile"]
    assert result.status.value == "skipped" and "Module.compile()" in result.detail
    assert dict(counters["graph_break"]) == breaks  # none from autoopt's layers
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
