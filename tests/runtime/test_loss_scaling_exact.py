"""The loss scaler checked exactly: against torch's own autocast + GradScaler loop, and at the
edges its unit tests did not reach (found by mutation testing, docs/benchmarks/mutation.md)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.scaling.loss_scaling import LossScaler, scaler_of
from autoopt.runtime.scaling.user_amp import UserAmp

from .models import MLP, mlp_data

loss_fn = nn.CrossEntropyLoss()
CPU = torch.device("cpu")


def _optimizer_with(grads: list[torch.Tensor | None]) -> torch.optim.Optimizer:
    """An SGD over one parameter per gradient given (None: a parameter without a gradient)."""
    params = []
    for grad in grads:
        p = nn.Parameter(torch.zeros(3, dtype=grad.dtype if grad is not None else None))
        p.grad = grad
        params.append(p)
    return torch.optim.SGD(params, lr=0.1)


def test_matches_torch_autocast_and_gradscaler_step_for_step() -> None:
    """The unchanged loop under optimize(amp="fp16") against the loop torch documents, with an
    overflow in the middle: same losses, same skipped step, same scale, same parameters."""
    torch.manual_seed(0)
    reference = MLP()
    model = copy.deepcopy(reference)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = autoopt.optimize(model, optimizer=opt, amp="fp16", compile=False, verbose=False)
    gradscaler = torch.amp.GradScaler("cpu")
    x, y = mlp_data(64)
    ours, theirs, scales = [], [], []
    for step in range(6):
        xs, ys = x[step * 8 : step * 8 + 8].clone(), y[step * 8 : step * 8 + 8]
        if step == 2:
            xs[0, 0] = float("inf")  # an overflow: both skip this step and halve the scale
        opt.zero_grad()
        loss = loss_fn(model(xs), ys)
        loss.backward()
        opt.step()
        ours.append(loss.item())

        opt_ref.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):  # torch's recipe: the loss inside too
            loss_ref = loss_fn(reference(xs), ys)
        gradscaler.scale(loss_ref).backward()
        gradscaler.step(opt_ref)
        gradscaler.update()
        theirs.append(loss_ref.item())
        scales.append((scaler_of(model).scale, gradscaler.get_scale()))

    assert all(a == b for a, b in scales), scales
    assert scales[-1][0] == 2.0**15
    assert scaler_of(model).skipped_steps == 1 and scaler_of(model).steps == 5
    finite = [i for i in range(6) if i != 2]
    # fp16 forward in both; the gradients differ only in where the exact 2**-16 is applied.
    torch.testing.assert_close(
        [ours[i] for i in finite], [theirs[i] for i in finite], rtol=1e-3, atol=1e-4
    )
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("given", [True, False])
def test_an_optimizer_built_later_skips_non_finite_steps_like_gradscaler(given: bool) -> None:
    """A second phase with a new AdamW (built after optimize(); `given`: whether the first
    phase's optimizer went to optimize() at all), an overflow in each phase, against torch's
    recipe with one GradScaler: the same skipped steps, scale and parameters, no NaN."""
    torch.manual_seed(0)
    reference = MLP()
    model = copy.deepcopy(reference)
    first = torch.optim.SGD(model.parameters(), lr=0.1)
    if given:
        model, first = autoopt.optimize(
            model, optimizer=first, amp="fp16", compile=False, verbose=False
        )
    else:
        model = autoopt.optimize(model, amp="fp16", compile=False, verbose=False)
    gradscaler = torch.amp.GradScaler("cpu")
    first_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    x, y = mlp_data(96)
    for step in range(12):
        if step == 6:  # phase two: a new optimizer, as a user builds one
            second = torch.optim.AdamW(model.parameters(), lr=1e-2)
            second_ref = torch.optim.AdamW(reference.parameters(), lr=1e-2)
        opt, opt_ref = (first, first_ref) if step < 6 else (second, second_ref)
        xs, ys = x[step * 8 : step * 8 + 8].clone(), y[step * 8 : step * 8 + 8]
        if step in (2, 8):
            xs[0, 0] = float("inf")  # an overflow: the step is skipped, the scale halved
        opt.zero_grad()
        loss_fn(model(xs), ys).backward()
        opt.step()
        opt_ref.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss_ref = loss_fn(reference(xs), ys)
        gradscaler.scale(loss_ref).backward()
        gradscaler.step(opt_ref)
        gradscaler.update()
        assert scaler_of(model).scale == gradscaler.get_scale(), step
        assert (~model.net[0].weight.grad.isfinite()).any() == (step in (2, 8))  # put back
    assert scaler_of(model).skipped_steps == 2 and scaler_of(model).steps == 10
    assert second.state_dict()["state"][0]["step"] == second_ref.state_dict()["state"][0]["step"]
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert p.isfinite().all()
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)


def test_state_lives_on_its_device_in_float32_whatever_torch_defaults_are() -> None:
    """A loop that sets torch's default dtype or device must not move or widen the scaler's
    state (GradScaler's own kernels insist on float32 on the gradients' device)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.device("meta"):
            scaler = LossScaler(CPU)
        assert scaler.device == CPU
        assert scaler._scale.device == CPU and scaler._scale.dtype == torch.float32
        assert scaler._growth_tracker.device == CPU
        optimizer = _optimizer_with([torch.tensor([1.0, float("inf"), 0.0])])
        with torch.device("meta"):
            found = scaler.found_nonfinite(optimizer)
        assert found.device == CPU and found.dtype == torch.float32
        assert found.item() == 1.0
    finally:
        torch.set_default_dtype(previous)


def test_a_parameter_without_gradient_does_not_hide_the_next_ones() -> None:
    scaler = LossScaler(CPU)
    optimizer = _optimizer_with([None, torch.tensor([1.0, float("nan"), 0.0])])
    assert scaler.found_nonfinite(optimizer).item() == 1.0


def test_every_param_group_is_checked() -> None:
    scaler = LossScaler(CPU)
    optimizer = _optimizer_with([torch.ones(3)])
    bad = nn.Parameter(torch.zeros(3))
    bad.grad = torch.tensor([0.0, float("inf"), 0.0])
    optimizer.add_param_group({"params": [bad]})
    assert scaler.found_nonfinite(optimizer).item() == 1.0


def test_sparse_gradients_are_checked() -> None:
    scaler = LossScaler(CPU)
    embedding = nn.Embedding(5, 3, sparse=True)
    embedding(torch.tensor([1, 2])).sum().backward()
    optimizer = torch.optim.SGD(embedding.parameters(), lr=0.1)
    assert embedding.weight.grad.is_sparse
    assert scaler.found_nonfinite(optimizer).item() == 0.0
    embedding.weight.grad._values()[0, 0] = float("inf")
    assert scaler.found_nonfinite(optimizer).item() == 1.0


def test_gradients_on_another_device_are_checked_and_added() -> None:
    """The path for gradients on another device than the scaler's (cuda:1 next to cuda:0),
    taken on CPU by giving the scaler the device 'cpu:0', which differs from 'cpu'."""
    scaler = LossScaler(torch.device("cpu", 0))
    fine = _optimizer_with([torch.ones(3), torch.ones(3, dtype=torch.float16)])
    assert scaler.found_nonfinite(fine).item() == 0.0
    # inf in the first (device, dtype) group only: a later clean group must not overwrite it
    bad = _optimizer_with([torch.tensor([float("inf"), 0.0, 0.0]), torch.ones(3, dtype=torch.half)])
    found = scaler.found_nonfinite(bad)
    assert found.shape == (1,) and found.item() > 0
    assert scaler._one  # one "1.0" per device, kept for the next step


def test_skipped_steps_are_counted_and_return_none() -> None:
    scaler = LossScaler(CPU)
    optimizer = _optimizer_with([torch.tensor([float("inf"), 0.0, 0.0])])
    calls = []
    for _ in range(3):
        assert scaler.step(optimizer, lambda: calls.append(1) or "stepped") is None
    assert calls == [] and scaler.skipped_steps == 3 and scaler.steps == 0
    assert scaler.scale == 2.0**13


def test_a_loop_with_its_own_gradscaler_is_left_to_it() -> None:
    users = UserAmp()
    scaler = LossScaler(CPU, user_amp=users)
    assert scaler.user_amp is users
    users.stand_down("the loop scales its loss with its own GradScaler")
    optimizer = _optimizer_with([torch.tensor([float("inf"), 0.0, 0.0])])
    assert scaler.step(optimizer, lambda: "stepped") == "stepped"
    assert scaler.scale == 2.0**16 and scaler.skipped_steps == 0


def test_state_dict_round_trip_and_old_checkpoints() -> None:
    scaler = LossScaler(CPU)
    scaler.steps, scaler.skipped_steps = 7, 3
    scaler.update(torch.ones(1))  # a back-off
    state = scaler.state_dict()
    assert state == {"scale": 2.0**15, "growth_tracker": 0, "steps": 7, "skipped_steps": 3}
    fresh = LossScaler(CPU)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    # A checkpoint written before the counters existed restores them at zero.
    older = LossScaler(CPU)
    older.steps, older.skipped_steps = 5, 5
    older.load_state_dict({"scale": 4.0, "growth_tracker": 1})
    assert (older.scale, older.steps, older.skipped_steps) == (4.0, 0, 0)
    assert older._growth_tracker.item() == 1


def test_scaler_of_sees_through_data_parallel_and_says_what_to_do() -> None:
    model = autoopt.optimize(MLP(), amp="fp16", compile=False, verbose=False)
    assert scaler_of(nn.DataParallel(model)) is scaler_of(model)
    with pytest.raises(ValueError) as error:
        scaler_of(MLP())
    message = str(error.value)
    assert message.startswith("this model has no loss scaler: it was not returned by optimize()")
    assert message.endswith("or amp is not fp16 (see autoopt.report(model))")
