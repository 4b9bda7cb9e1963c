"""accumulate=N: the unchanged loop takes one optimizer step per N micro-batches, on their mean
gradient, for both orders of zero_grad in the loop."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.accumulation.accumulator import Accumulator
from autoopt.runtime.context import Context
from autoopt.runtime.options import Options
from autoopt.runtime.passes import accumulate
from autoopt.runtime.report import Status
from autoopt.runtime.scaling import root_scaling

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
    acc = Accumulator(3)
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
    """The 1/N sits at the root of each backward that reaches the model, and nowhere else."""
    model = _net()
    opt = _sgd(model)
    model, opt = autoopt.optimize(model, optimizer=opt, accumulate=4, verbose=False, **OFF)
    x = torch.ones(3, requires_grad=True)
    (x * 2).sum().backward()  # touches no parameter of the model: untouched
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    w = next(model.parameters())
    (w.sum() * 2).backward()  # a term built from a parameter, not from the outputs
    torch.testing.assert_close(w.grad, torch.full_like(w, 0.5))


def test_a_tensor_at_a_dead_parameters_address_is_not_the_models() -> None:
    """A registration remembers tensors it was told are the model's (FSDP2's all-gathered
    copies are added later). Once one is freed, a new leaf CPython puts at the same address
    must not be taken for it (it was: the next model trained under FSDP got the 1/N seed)."""
    model = _net()
    opt = _sgd(model)
    model, opt = autoopt.optimize(model, optimizer=opt, accumulate=4, verbose=False, **OFF)
    transient = torch.zeros(3, requires_grad=True)
    root_scaling.add_params(model, [transient])
    address = id(transient)
    del transient
    reused = None
    for _ in range(1000):  # CPython reuses a freed object's address for the next of its size
        leaf = torch.zeros(3, requires_grad=True)
        if id(leaf) == address:
            reused = leaf
            break
    if reused is None:
        pytest.skip("no tensor landed at the freed address")
    (reused * 2).sum().backward()
    torch.testing.assert_close(reused.grad, torch.full((3,), 2.0))  # not 2/4


def test_accumulate_one_and_missing_optimizer_are_skipped() -> None:
    for options, optimizer, reason in (
        (Options(accumulate=1), torch.optim.SGD(_net().parameters(), lr=0.1), "accumulate=1"),
        (Options(accumulate=2), None, "needs the optimizer"),
    ):
        ctx = Context(options=options, model=_net(), loader=None, optimizer=optimizer)
        result = accumulate.run(ctx)
        assert result.status is Status.SKIPPED and reason in result.detail
        assert not ctx.step_layers and not ctx.forward_layers


def _loss_with_param_term(model: nn.Module, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, y) + 1e-2 * sum(p.pow(2).sum() for p in model.parameters())


@pytest.mark.parametrize("amp", [False, "fp16"])
def test_accumulate_equals_hand_written_accumulation_with_clipping(amp: str | bool) -> None:
    """The hand-written loop: (loss / 4).backward() every micro-batch, one clip_grad_norm_ and one
    step every 4, zero_grad after. Ours: the unchanged loop with a param-built loss term and a clip
    at every micro-batch. Tolerance: 1e-6 in fp32 (same arithmetic, summation order aside); with
    fp16 the hand-written side is autocast + GradScaler (unscale_ before the clip), rtol 1e-4."""
    n = 4
    batches = _batches(3 * n)
    plain = _net()
    hand = copy.deepcopy(plain)
    start = copy.deepcopy(plain)
    opt = _sgd(plain)
    options = {**OFF, "amp": amp}
    model, opt = autoopt.optimize(plain, optimizer=opt, accumulate=n, verbose=False, **options)
    norms = []
    for x, y in batches:
        loss = _loss_with_param_term(model, model(x), y)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05))
        opt.step()
        opt.zero_grad()

    hand_opt = _sgd(hand)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, enabled=bool(amp))
    hand_norms = []
    for i, (x, y) in enumerate(batches):
        with torch.autocast("cpu", dtype=torch.float16, enabled=bool(amp)):
            out = hand(x)
        scaler.scale(_loss_with_param_term(hand, out.float(), y) / n).backward()
        if (i + 1) % n == 0:
            scaler.unscale_(hand_opt)
            hand_norms.append(torch.nn.utils.clip_grad_norm_(hand.parameters(), 0.05))
            scaler.step(hand_opt)
            scaler.update()
            hand_opt.zero_grad()
    tol = {"rtol": 1e-4, "atol": 1e-6} if amp else {"rtol": 0, "atol": 1e-6}
    for p, q, r in zip(model.parameters(), hand.parameters(), start.parameters(), strict=True):
        torch.testing.assert_close(p, q, **tol)
        assert not torch.equal(p, r)
    # The norms returned at the acting micro-batches are the ones the hand-written loop clipped.
    torch.testing.assert_close(torch.stack(norms[n - 1 :: n]), torch.stack(hand_norms), **tol)
    assert min(hand_norms) > 0.05  # the clip did clip


def test_from_import_of_clip_grad_norm_is_gated_too() -> None:
    from torch.nn.utils import clip_grad_norm_  # noqa: PLC0415 (the point of the test)

    model = _net()
    opt = _sgd(model)
    model, opt = autoopt.optimize(model, optimizer=opt, accumulate=2, verbose=False, **OFF)
    x, y = _batches(1)[0]
    nn.functional.mse_loss(model(x), y).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    clip_grad_norm_(model.parameters(), 1e-6)  # mid-cycle: partial sums stay as they are
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    opt.step()
    nn.functional.mse_loss(model(x), y).backward()
    clip_grad_norm_(model.parameters(), 1e-6)  # last micro-batch: clips
    total = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert total.item() < 2e-6


def test_a_grad_scaler_in_an_accumulating_loop_is_refused() -> None:
    model = _net()
    opt = _sgd(model)
    model, opt = autoopt.optimize(model, optimizer=opt, accumulate=2, verbose=False, **OFF)
    x, y = _batches(1)[0]
    scaler = torch.amp.GradScaler("cpu")
    with pytest.raises(RuntimeError, match="cannot be combined with a GradScaler"):
        scaler.scale(nn.functional.mse_loss(model(x), y))
