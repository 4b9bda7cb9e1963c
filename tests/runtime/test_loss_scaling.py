"""fp16 dynamic loss scaling with the user's loop unchanged (tested on CPU with amp="fp16")."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.scaling import root_scaling
from autoopt.runtime.scaling.loss_scaling import LossScaler, scaler_of

from .models import MLP, mlp_data

loss_fn = nn.CrossEntropyLoss()


def fp16_model(
    seed: int = 0, lr: float = 0.1
) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer]:
    """(plain reference copy, optimized fp16 model, its SGD optimizer)."""
    torch.manual_seed(seed)
    reference = MLP()
    model = copy.deepcopy(reference)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, amp="fp16", compile=False, verbose=False
    )
    return reference, model, optimizer


def test_fp16_is_applied_with_a_scaler_at_gradscaler_defaults() -> None:
    _, model, _ = fp16_model()
    scaler = scaler_of(model)
    assert scaler.scale == 2.0**16
    assert scaler.growth_interval == 2000 and scaler.backoff_factor == 0.5
    assert "dynamic loss scaling" in autoopt.report(model)["amp"].detail
    with pytest.raises(ValueError, match="no loss scaler"):
        scaler_of(MLP())


def test_root_scaling_is_exact_over_accumulated_backwards() -> None:
    """Without autocast the only arithmetic the scaler adds is x2**16 then x2**-16: exact."""
    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    scaler = LossScaler(torch.device("cpu"))
    root_scaling.register(model, scaler=scaler)
    x, y = mlp_data(24)
    seen: list[torch.Tensor] = []
    model.net[0].weight.register_hook(lambda g: seen.append(g.abs().max()))  # before unscaling
    for chunk in range(3):
        xs, ys = x[chunk * 8 : chunk * 8 + 8], y[chunk * 8 : chunk * 8 + 8]
        loss_fn(model(xs), ys).backward()
        loss_fn(reference(xs), ys).backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    assert seen[0] > 1000 * reference.net[0].weight.grad.abs().max() / 3  # it did run scaled
    assert scaler.found_nonfinite(torch.optim.SGD(model.parameters(), lr=0.1)).item() == 0


def test_accumulation_over_backwards_equals_the_true_accumulated_gradient() -> None:
    reference, model, _ = fp16_model()
    fp16_reference = copy.deepcopy(reference)
    x, y = mlp_data(24)
    for chunk in range(3):
        xs, ys = x[chunk * 8 : chunk * 8 + 8], y[chunk * 8 : chunk * 8 + 8]
        loss_fn(model(xs), ys).backward()  # the user's code: no scaler anywhere
        loss_fn(reference(xs), ys).backward()
        with torch.autocast("cpu", dtype=torch.float16):
            out = fp16_reference(xs)
        loss_fn(out.float(), ys).backward()
    for p, q, r in zip(
        model.parameters(), fp16_reference.parameters(), reference.parameters(), strict=True
    ):
        # Same fp16 arithmetic, unscaled: equal up to fp16 underflow the scaled version avoids.
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-3, atol=1e-5)
        # And true scale (not 65536x): within fp16's precision of the fp32 gradient.
        assert ((p.grad - r.grad).norm() / r.grad.norm()).item() < 1e-2


def test_clip_grad_norm_after_backward_sees_true_gradients() -> None:
    reference, model, _ = fp16_model()
    x, y = mlp_data(16)
    loss_fn(model(x), y).backward()
    loss_fn(reference(x), y).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    ref_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1e9)
    assert abs(norm.item() - ref_norm.item()) / ref_norm.item() < 1e-2


def test_input_gradients_are_at_true_scale() -> None:
    reference, model, _ = fp16_model()
    x, y = mlp_data(8)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    loss_fn(model(xa), y).backward()
    loss_fn(reference(xb), y).backward()
    assert ((xa.grad - xb.grad).norm() / xb.grad.norm()).item() < 1e-2


def test_non_finite_gradients_skip_the_step_and_back_off_the_scale() -> None:
    _, model, optimizer = fp16_model()
    x, y = mlp_data(8)
    bad = x.clone()
    bad[0, 0] = float("inf")  # one poisoned sample: the loss and every gradient go non-finite
    before = [p.detach().clone() for p in model.parameters()]

    optimizer.zero_grad()
    loss_fn(model(bad), y).backward()
    optimizer.step()

    scaler = scaler_of(model)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert scaler.skipped_steps == 1 and scaler.steps == 0
    assert scaler.scale == 2.0**15

    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
    assert not all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert scaler.steps == 1 and scaler.scale == 2.0**15


def test_overflow_from_the_scale_itself_backs_off_until_steps_succeed() -> None:
    """A loss with huge gradients overflows fp16 at 2**16; the scale halves until it fits."""
    _, model, optimizer = fp16_model(lr=1e-6)
    x, y = mlp_data(8)
    for _ in range(20):
        optimizer.zero_grad()
        (model(x).sum() * 1000).backward()
        optimizer.step()
    scaler = scaler_of(model)
    assert scaler.skipped_steps >= 1
    assert scaler.steps >= 1
    assert scaler.scale < 2.0**16
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_the_scale_grows_after_growth_interval_clean_steps() -> None:
    _, model, optimizer = fp16_model()
    scaler = scaler_of(model)
    scaler.growth_interval = 2
    x, y = mlp_data(8)
    for _ in range(2):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    assert scaler.scale == 2.0**17
    state = scaler.state_dict()
    fresh = LossScaler(torch.device("cpu"))
    fresh.load_state_dict(state)
    assert fresh.scale == 2.0**17 and fresh.steps == 2


def test_the_unchanged_loop_trains_in_fp16() -> None:
    _, model, optimizer = fp16_model(lr=0.2)
    x, y = mlp_data(128)
    losses = []
    for _ in range(4):
        for i in range(0, 128, 32):
            optimizer.zero_grad()
            loss = loss_fn(model(x[i : i + 32]), y[i : i + 32])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
    assert sum(losses[-4:]) < 0.8 * sum(losses[:4])
    assert scaler_of(model).skipped_steps == 0


@pytest.mark.parametrize("group", [0, 1, 2])
def test_a_non_finite_gradient_in_any_param_group_skips_the_step(group: int) -> None:
    """Three param groups; an inf in one group's gradient only (an overflow confined to a layer)
    must skip the whole step and back off, whichever group holds it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
    model.append(nn.Linear(32, 4))
    layers = [model[0], model[2], model[4]]
    optimizer = torch.optim.SGD(
        [{"params": layer.parameters(), "lr": 0.1 * (i + 1)} for i, layer in enumerate(layers)],
        lr=0.1,
    )
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, amp="fp16", compile=False, verbose=False
    )
    x, y = mlp_data(8)
    before = [p.detach().clone() for p in model.parameters()]
    loss_fn(model(x), y).backward()
    with torch.no_grad():
        layers[group].weight.grad[0, 0] = float("inf")
    optimizer.step()
    scaler = scaler_of(model)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert scaler.skipped_steps == 1 and scaler.steps == 0
    assert scaler.scale == 2.0**15
