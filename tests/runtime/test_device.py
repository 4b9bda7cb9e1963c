"""The device pass: choice and reason, model and optimizer state moved, inputs moved."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import autoopt
from autoopt.runtime.context import Context
from autoopt.runtime.options import Options
from autoopt.runtime.passes import device as device_pass

from .models import MLP


def test_auto_picks_cpu_without_cuda_and_says_why() -> None:
    model = autoopt.optimize(MLP(), verbose=False)
    result = autoopt.report(model)["device"]
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert result.status.value == "applied"
    assert result.detail.startswith(expected)
    if expected == "cpu":
        assert "no CUDA device available" in result.detail


def test_device_set_by_the_distributed_pass_is_kept() -> None:
    ctx = Context(Options(), MLP(), None, None)
    ctx.device = torch.device("cpu")
    result = device_pass.run(ctx)
    assert ctx.device == torch.device("cpu")
    assert "set by the distributed pass" in result.detail


@dataclasses.dataclass
class Batch:
    image: torch.Tensor
    label: str


def test_inputs_of_any_nesting_are_moved_and_others_untouched() -> None:
    meta = torch.device("meta")  # a real second device on a CPU-only machine
    seen = {}

    def forward(*args: object, **kwargs: object) -> None:
        seen["args"], seen["kwargs"] = args, kwargs

    moved_forward = device_pass.InputMover(forward, meta)
    x = torch.randn(2, 3)
    moved_forward(x, [x, {"k": x}], Batch(x, "cat"), 7, scale=x, name="n")
    a, k = seen["args"], seen["kwargs"]
    assert a[0].device == meta and a[1][0].device == meta and a[1][1]["k"].device == meta
    assert a[2].image.device == meta and a[2].label == "cat"
    assert a[3] == 7 and k["scale"].device == meta and k["name"] == "n"


def test_inputs_already_on_the_device_pass_through_as_the_same_objects() -> None:
    seen = {}

    def forward(*args: object) -> None:
        seen["args"] = args

    x = torch.randn(2, 3)
    device_pass.InputMover(forward, torch.device("cpu"))(x, 3)
    assert seen["args"][0] is x


def test_existing_optimizer_state_follows_the_parameters() -> None:
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    assert device_pass.move_model(model, torch.device("meta"), optimizer)
    # to/from "meta" torch makes new Parameter objects: the optimizer now holds those.
    first = next(model.parameters())
    assert first.device.type == "meta"
    assert optimizer.param_groups[0]["params"][0] is first
    state = optimizer.state[first]
    assert state["exp_avg"].device.type == "meta"
    assert state["step"].device.type == "cpu"  # Adam keeps `step` on the host by design
    assert not device_pass.move_model(model, torch.device("meta"), optimizer)  # already there


def test_choose_follows_the_option_the_model_and_the_pinned_device() -> None:
    model = torch.nn.Linear(2, 2)
    assert device_pass.choose("cpu", model) == (torch.device("cpu"), "as requested")
    pinned = device_pass.choose("auto", model, torch.device("cpu"))
    assert pinned == (torch.device("cpu"), "set by the distributed pass")
    if not torch.cuda.is_available():
        assert device_pass.choose("auto", model)[0] == torch.device("cpu")
        with pytest.raises(ValueError, match="CUDA is not available"):
            device_pass.choose("cuda", model)
