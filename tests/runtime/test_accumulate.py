"""accumulate=N: the unchanged loop takes one optimizer step per N micro-batches, on their mean
gradient, for both orders of zero_grad in the loop."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.context import Context
from autoopt.runtime.options import Options
from autoopt.runtime.passes import accumulate
from autoopt.runtime.report import Status

OFF = {"amp": False, "compile": False, "channels_last": False, "checkpoint": False}


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _batches(count: int, size: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [
        (torch.randn(size, 4, generator=gen), torch.randn(size, 1, generator=gen))
        for _ in range(count)
    ]


def _reference(model: nn.Module, batches: list, n: int, make_opt) -> nn.Module:
    """One plain step per N micro-batches on the mean of their losses."""
    opt = make_opt(model)
    for start in range(0, len(batches) - len(batches) % n, n):
        opt.zero_grad()
        group = batches[start : start + n]
        loss = sum(nn.functional.mse_loss(model(x), y) for x, y in group) / n
        loss.backward()
        opt.step()
    return model


def _adam(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=0.05)


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


@pytest.mark.parametrize("zero_grad_first", [True, False])
@pytest.mark.parametrize("make_opt", [_sgd, _adam])
def test_unchanged_loop_equals_one_step_on_the_mean_gradient(
    zero_grad_first: bool, make_opt
) -> None:
    n = 3
    batches = _batches(2 * n)
    plain = _net()
    expected = _reference(copy.deepcopy(plain), batches, n, make_opt)
    model = plain
    opt = make_opt(model)
    model, loader, opt = autoopt.optimize(model, batches, opt, accumulate=n, verbose=False, **OFF)
    assert autoopt.report(model)["accumulate"].status is Status.APPLIED
    before = [p.detach().clone() for p in model.parameters()]
    for i, (x, y) in enumerate(loader):
        if zero_grad_first:
            opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 100.0)  # keeps working, no effect
        opt.step()
        if not zero_grad_first:
            opt.zero_grad()
        if i < n - 1:  # no step yet: parameters untouched, gradients accumulating
            assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
            assert all(p.grad is not None for p in model.parameters())
    for got, want in zip(model.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    if make_opt is _adam:
        assert all(int(s["step"]) == 2 for s in opt.state.values())


def test_model_zero_grad_follows_the_cycle() -> None:
    n = 2
    batches = _batches(2 * n)
    plain = _net()
    expected = _reference(copy.deepcopy(plain), batches, n, _sgd)
    opt = _sgd(plain)
    model, opt = autoopt.optimize(plain, optimizer=opt, accumulate=n, verbose=False, **OFF)
    for x, y in batches:
        model.zero_grad()  # the seed's spelling
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    for got, want in zip(model.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_counting_of_step_and_zero_grad_calls() -> None:
    acc = accumulate.Accumulator(3)
    calls: list[str] = []
    step = acc.wrap_step(lambda: calls.append("step"))
    zero = acc.wrap_zero_grad(lambda: calls.append("zero"))
    for _ in range(6):
        zero()
        assert acc.at_last_micro_step == (acc.step_calls % 3 == 2)
        step()
    assert calls == ["zero", "step", "zero", "step"]
    assert acc.step_calls == 6 and acc.optimizer_steps == 2


def test_only_backwards_that_reach_the_model_are_seeded_with_one_over_n() -> None:
    """Replaces the old output-hook test: the 1/N now sits at the root of each backward."""
    model = _net()
    opt = _sgd(model)
    model, opt = autoopt.optimize(model, optimizer=opt, accumulate=4, verbose=False, **OFF)
    x = torch.ones(3, requires_grad=True)
    (x * 2).sum().backward()  # touches no parameter of the model: untouched
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    w = next(model.parameters())
    (w.sum() * 2).backward()  # a term built from a parameter, not from the outputs
    torch.testing.assert_close(w.grad, torch.full_like(w, 0.5))


def test_accumulate_one_and_missing_optimizer_are_skipped() -> None:
    for options, optimizer, reason in (
        (Options(accumulate=1), torch.optim.SGD(_net().parameters(), lr=0.1), "accumulate=1"),
        (Options(accumulate=2), None, "needs the optimizer"),
    ):
        ctx = Context(options=options, model=_net(), loader=None, optimizer=optimizer)
        result = accumulate.run(ctx)
        assert result.status is Status.SKIPPED and reason in result.detail
        assert not ctx.step_layers and not ctx.forward_layers
