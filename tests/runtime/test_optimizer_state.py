"""`optimizer.state_dict()` holds the user's own flags and contiguous state, and checkpoints
move between optimized and plain optimizers in both directions, resuming exactly."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.optimizer_state import repoint

from .models import SmallCNN, batches, cnn_data

STEPS = 4


def plain_pair() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = SmallCNN()
    return model, torch.optim.Adam(model.parameters(), lr=0.01, eps=1e-3)


def optimized_pair() -> tuple[nn.Module, torch.optim.Optimizer]:
    model, optimizer = plain_pair()
    # channels_last: NHWC state tensors for the conv weights; backends: fused (else foreach).
    return autoopt.optimize(
        model, optimizer=optimizer, amp=False, channels_last=True, verbose=False
    )


def train(model: nn.Module, optimizer: torch.optim.Optimizer, data: list[Any]) -> None:
    for x, y in data:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def saved(obj: Any) -> Any:
    """A round trip through torch.save/torch.load, as a checkpoint file makes."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer)


def test_the_state_dict_holds_the_users_flags_and_contiguous_state() -> None:
    model, optimizer = optimized_pair()
    x, y = cnn_data(16)
    train(model, optimizer, batches(x, y, 8))
    groups = optimizer.param_groups
    assert groups[0]["fused"] or groups[0]["foreach"]  # autoopt chose a faster step...
    state = optimizer.state_dict()
    assert state["param_groups"][0]["fused"] is None  # ...the checkpoint keeps the user's
    assert state["param_groups"][0]["foreach"] is None
    assert groups[0]["fused"] or groups[0]["foreach"]  # the live optimizer is untouched
    conv = model.features[0].weight
    live = optimizer.state[conv]["exp_avg"]
    assert live.is_contiguous(memory_format=torch.channels_last) and not live.is_contiguous()
    assert all(v.is_contiguous() for s in state["state"].values() for v in s.values() if v.dim())


@pytest.mark.parametrize("first,then", [("optimized", "plain"), ("plain", "optimized")])
def test_resume_across_plain_and_optimized_equals_an_uninterrupted_run(
    first: str, then: str
) -> None:
    pairs = {"plain": plain_pair, "optimized": optimized_pair}
    x, y = cnn_data(8 * 2 * STEPS)
    data = batches(x, y, 8)
    reference, reference_opt = plain_pair()
    train(reference, reference_opt, data)  # 8 steps, uninterrupted, eager

    model, optimizer = pairs[first]()
    train(model, optimizer, data[:STEPS])
    checkpoint = saved({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    resumed, resumed_opt = pairs[then]()
    resumed.load_state_dict(checkpoint["model"])
    resumed_opt.load_state_dict(copy.deepcopy(checkpoint["optimizer"]))
    if then == "optimized":  # autoopt's choice came back after loading a plain checkpoint
        assert resumed_opt.param_groups[0]["fused"] or resumed_opt.param_groups[0]["foreach"]
    train(resumed, resumed_opt, data[STEPS:])
    # Tolerance: fp32 noise of fused vs for-loop Adam and NHWC vs NCHW convolutions over 8
    # steps; a wrong flag or layout in the checkpoint moves parameters by ~1e-2.
    for mine, theirs in zip(resumed.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=2e-5)
    if then == "optimized":  # the state is laid out like the (channels-last) parameters
        state = resumed_opt.state[resumed.features[0].weight]["exp_avg"]
        assert state.stride() == resumed.features[0].weight.stride()


def test_repoint_moves_groups_and_state_to_the_replacement_parameters() -> None:
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    weight, bias = model.weight, model.bias
    moments = opt.state[weight]["exp_avg"].clone()
    new_weight = nn.Parameter(weight.detach().clone())
    converted = []

    def convert(old: torch.Tensor, new: torch.Tensor, value: Any) -> Any:
        converted.append((old is weight, new is new_weight))
        return value * 2 if isinstance(value, torch.Tensor) and value.dim() else value

    repoint(opt, {id(weight): new_weight}, convert)
    params = opt.param_groups[0]["params"]
    assert len(params) == 2 and params[0] is new_weight and params[1] is bias
    assert weight not in opt.state and bias in opt.state
    torch.testing.assert_close(opt.state[new_weight]["exp_avg"], moments * 2)
    assert converted and all(pair == (True, True) for pair in converted)
