"""The compile pass steady under changing shapes: a recompile on a changing batch size is
answered once (one report line at the user's call, with the fix), a static compile is made
dynamic so further sizes reuse one graph."""

from __future__ import annotations

import inspect
import logging

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import autoopt
from autoopt.runtime.passes import compile as compile_pass

from .models import MLP

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def eager_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo for real (recompiles are dynamo's), no inductor codegen; what an earlier test
    taught dynamo's automatic dynamic shapes about the shared forward chain is forgotten."""
    monkeypatch.setattr(compile_pass, "BACKEND", "eager")
    torch._dynamo.reset()


def train(sizes: list[int], verbose: bool = False) -> nn.Module:
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, compile=True, amp=False, verbose=verbose
    )
    for n in sizes:
        loss = model(torch.randn(n, 16)).square().mean()  # the call a changing shape is at
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


CALL_LINE = inspect.getsourcelines(train)[1] + next(
    i for i, line in enumerate(inspect.getsourcelines(train)[0]) if "the call a changing" in line
)


def test_a_static_compile_is_made_dynamic_once_sizes_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compile_pass, "COMPILE_OPTIONS", {"dynamic": False})
    counters.clear()
    model = train([8, 16, 24, 32, 40, 48])
    # The first compile, torch's static recompiles at 16 and 24, one dynamic compile at 32;
    # then none (without the reaction: one per size, 6).
    assert counters["frames"]["total"] == 4
    events = autoopt.report(model)["compile"].events
    (changed,) = [e for e in events if e.kind == "changing shape"]
    assert (changed.filename, changed.lineno) == (__file__, CALL_LINE)
    assert "dimension 0 changed 8 -> 16" in changed.reason and "drop_last=True" in changed.reason
    assert len([e for e in events if e.kind == "recompile"]) == 1
    assert autoopt.report(model)["compile"].status.value == "applied"


def test_a_ragged_last_batch_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="autoopt"):
        model = train([8, 8, 8, 5] * 3, verbose=True)
    printed = [r.getMessage() for r in caplog.records if "torch.compile:" in r.getMessage()]
    assert len(printed) == 1 and "changing shape" in printed[0], printed
    assert f"{__file__}:{CALL_LINE}" in printed[0] or f":{CALL_LINE}:" in printed[0]
    events = autoopt.report(model)["compile"].events
    assert [e.kind for e in events].count("changing shape") == 1
