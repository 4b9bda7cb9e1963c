"""The compile pass guarded through the first backward: a backward that cannot compile, and a
double backward (gradient penalty) through the compiled model, fall back to eager exactly."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from functorch.compile import make_boxed_func
from torch import nn
from torch._dynamo.backends.common import aot_autograd

import autoopt
from autoopt.runtime.passes import compile as compile_pass


class Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _fails_backward(gm: Any, example_inputs: Any) -> Any:
    raise RuntimeError("this backend cannot compile a backward")


def boxed(gm: Any, example_inputs: Any) -> Any:
    return make_boxed_func(gm)


# AOTAutograd for real: the forward compiles, the backward fails lazily, at the first backward.
backward_failing = aot_autograd(fw_compiler=boxed, bw_compiler=_fails_backward)


def gradient_penalty_loop(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[float]:
    """WGAN-GP's critic step: the penalty on the input gradient, by autograd.grad(create_graph=True)."""
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(4):
        real = torch.randn(16, 8, generator=gen) + 1.0
        fake = torch.randn(16, 8, generator=gen)
        alpha = torch.rand(16, 1, generator=gen)
        mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
        (grad,) = torch.autograd.grad(model(mixed).sum(), mixed, create_graph=True)
        penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
        loss = model(fake).mean() - model(real).mean() + 10 * penalty
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def plain_loop(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[float]:
    gen = torch.Generator().manual_seed(2)
    losses = []
    for _ in range(3):
        x = torch.randn(16, 8, generator=gen)
        loss = (model(x) - 1).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def both(
    loop: Any, build: type[nn.Module] = Critic, **options: Any
) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer, list[float], list[float]]:
    torch.manual_seed(0)
    eager = build()
    model = copy.deepcopy(eager)
    eager_opt = torch.optim.Adam(eager.parameters(), lr=1e-2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer = autoopt.optimize(model, optimizer=optimizer, verbose=False, **options)
    eager_losses = loop(eager, eager_opt)
    losses = loop(model, optimizer)
    return eager, model, optimizer, eager_losses, losses


@pytest.mark.slow
def test_a_gradient_penalty_loop_trains_eager_as_eager_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compile_pass, "BACKEND", "aot_eager")  # AOTAutograd, no C++ codegen
    with pytest.warns(UserWarning, match="double backward"):
        eager, model, _, eager_losses, losses = both(gradient_penalty_loop, compile=True, amp=False)
    assert losses == eager_losses
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p, q)  # optimize() may pick another Adam kernel
    result = autoopt.report(model)["compile"]
    assert result.status.value == "failed" and result.fallback == "eager forward"
    (event,) = [e for e in result.events if e.kind == "double backward"]
    assert event.filename == __file__  # the user's autograd.grad call
    assert "create_graph" in result.detail


def test_a_backward_that_cannot_compile_falls_back_with_the_step_redone_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compile_pass, "BACKEND", backward_failing)
    with pytest.warns(UserWarning, match="cannot compile a backward"):
        eager, model, optimizer, eager_losses, losses = both(plain_loop, compile=True, amp=False)
    assert losses == eager_losses  # the probe left no .grad, no optimizer step, no RNG draw
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p, q)  # optimize() may pick another Adam kernel
    result = autoopt.report(model)["compile"]
    assert result.status.value == "failed" and "first backward" in result.detail


def test_a_model_that_compiles_runs_compiled_after_the_first_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []

    def counted(gm: Any, example_inputs: Any) -> Any:
        def run(*args: Any) -> Any:
            calls.append(1)
            return gm(*args)

        return make_boxed_func(run)

    monkeypatch.setattr(
        compile_pass, "BACKEND", aot_autograd(fw_compiler=counted, bw_compiler=boxed)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        _, model, _, eager_losses, losses = both(plain_loop, compile=True, amp=False)
    assert autoopt.report(model)["compile"].status.value == "applied"
    torch.testing.assert_close(losses, eager_losses)
    assert len(calls) == 3  # the probe, then steps 2 and 3 (step 1 ran eager)


class MaxNorm(Critic):
    """Writes its weights in place at every training forward (a max-norm constraint, as some
    GAN critics and embedding layers do)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.net[0].weight.mul_(0.9)
        return self.net(x)


def test_the_probe_leaves_no_in_place_write_to_the_parameters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first step's compiled forward and backward run as a probe, then the step runs eager:
    a forward that writes a parameter in place writes it once, as eager's does (red if the probe
    kept its write: the weights scaled twice at the first step)."""
    monkeypatch.setattr(compile_pass, "BACKEND", "aot_eager")
    eager, model, _, eager_losses, losses = both(plain_loop, MaxNorm, compile=True, amp=False)
    torch.testing.assert_close(losses, eager_losses)
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    assert autoopt.report(model)["compile"].status.value == "applied"
