"""Channels-last stays inside the model: user code (the loop, forward pre-hooks) sees the batches
it would see without autoopt, and the optimizer state follows the parameters' layout on every
path (loaded before optimize() or before the first forward, then the trials' choice, or the
fallback). Compared with the same loop in plain torch."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.trials.choices import forced_winners

from .models import SmallCNN, ViewCNN, batches, cnn_data

CL = torch.channels_last


def _loop(model: nn.Module, opt: torch.optim.Optimizer, loader) -> list[float]:
    """A loop that flattens the batch itself (`x.view(B, -1)`) for a penalty term."""
    losses = []
    for x, y in loader:
        flat = x.view(x.size(0), -1)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y) + 1e-3 * flat.pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _assert_same_weights(model: nn.Module, reference: nn.Module) -> None:
    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters(), strict=True):
        if name == "features.0.bias":
            # Followed by BatchNorm: its gradient is rounding noise around 0, which Adam
            # normalizes to steps of size lr either way; it says nothing about the layout.
            continue
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5, msg=name)


def _flatten_hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    module.seen_flat = args[0].view(args[0].size(0), -1).shape  # type: ignore[assignment]


@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
@pytest.mark.usefixtures("fp32_auto")
def test_the_loop_and_pre_hooks_see_the_users_batches(layout: str) -> None:
    # Bug: the loader handed channels-last batches to user code; `x.view(B, -1)` failed.
    torch.manual_seed(0)
    reference = SmallCNN()
    model = copy.deepcopy(reference)
    model.register_forward_pre_hook(_flatten_hook)
    reference.register_forward_pre_hook(_flatten_hook)
    x, y = cnn_data(32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    model, loader, opt = autoopt.optimize(
        model, batches(x, y, 8), opt, channels_last="auto", verbose=False
    )
    with forced_winners(channels_last=layout):
        losses = _loop(model, opt, loader)
    expected = _loop(reference, ref_opt, batches(x, y, 8))
    assert model.features[0].weight.is_contiguous(memory_format=CL) == (layout == "channels_last")
    torch.testing.assert_close(losses, expected, rtol=1e-4, atol=1e-5)
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


def _resume_pair(model_cls: type[nn.Module]) -> tuple[nn.Module, nn.Module, dict, dict, list]:
    """A model trained a few steps in plain torch with fused AdamW (whose CPU kernel reads
    the state's memory as laid out like the parameter), and its checkpoint."""
    torch.manual_seed(0)
    trained = model_cls()
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-2, fused=True)
    x, y = cnn_data(48)
    data = batches(x, y, 8)
    _loop(trained, opt, data[:3])
    return trained, copy.deepcopy(trained), trained.state_dict(), opt.state_dict(), data[3:]


@pytest.mark.parametrize("loaded", ["before optimize", "before the first forward"])
@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
@pytest.mark.usefixtures("fp32_auto")
def test_a_resumed_optimizer_state_follows_the_layout_the_trials_keep(
    loaded: str, layout: str
) -> None:
    # Bug: state loaded before the first forward was laid out channels-last; the trial then
    # picked NCHW for the parameters only, and fused AdamW (blind to strides) drifted 1.3e-2.
    _, reference, weights, state, data = _resume_pair(SmallCNN)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, fused=True)
    ref_opt.load_state_dict(copy.deepcopy(state))
    model = SmallCNN()
    model.load_state_dict(weights)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    if loaded == "before optimize":
        opt.load_state_dict(copy.deepcopy(state))
    model, opt = autoopt.optimize(model, optimizer=opt, verbose=False)
    if loaded == "before the first forward":
        opt.load_state_dict(copy.deepcopy(state))
    with forced_winners(channels_last=layout):
        losses = _loop(model, opt, data)
    expected = _loop(reference, ref_opt, data)
    torch.testing.assert_close(losses, expected, rtol=1e-4, atol=1e-5)
    _assert_same_weights(model, reference)
    for param in model.parameters():
        for value in opt.state[param].values():
            if value.shape == param.shape:
                assert value.stride() == param.stride()


@pytest.mark.usefixtures("fp32_auto")
def test_the_fallback_moves_a_resumed_optimizer_state_back_too() -> None:
    # ViewCNN's `.view` fails on channels-last activations: the layer falls back to NCHW, and
    # the optimizer state loaded before the first forward must follow.
    _, reference, weights, state, data = _resume_pair(ViewCNN)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, fused=True)
    ref_opt.load_state_dict(copy.deepcopy(state))
    model = ViewCNN()
    model.load_state_dict(weights)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    model, opt = autoopt.optimize(model, optimizer=opt, verbose=False)
    opt.load_state_dict(copy.deepcopy(state))
    losses = _loop(model, opt, data)
    expected = _loop(reference, ref_opt, data)
    assert autoopt.report(model)["channels_last"].status.value == "failed"
    torch.testing.assert_close(losses, expected, rtol=1e-4, atol=1e-5)
    _assert_same_weights(model, reference)
