"""The forward and optimizer-step chains (`autoopt.runtime.forward`) at the edges the suite did
not reach: arguments pass through every layer, the user's own patches stay at the bottom, and
the user's objects look as they did where nothing wraps them. Each test kills mutants that
survived `make mutation` (docs/benchmarks/mutation.md)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from autoopt.runtime.context import ForwardLayer, Stage, StepLayer
from autoopt.runtime.forward import compose_forward, compose_step, original_forward


def _same(f: Any) -> Any:
    return f


class Scaled(nn.Module):
    """A forward with a keyword argument."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """Scaled output."""
        return self.lin(x) * scale


def test_a_patched_forward_passes_keywords_and_looks_like_the_users() -> None:
    model = Scaled()
    x = torch.ones(1, 2)
    want = model(x, scale=3.0)
    compose_forward(model, [ForwardLayer("same", Stage.OUTER, _same)])
    assert torch.equal(model(x, scale=3.0), want)
    assert model.forward.__name__ == "forward"
    assert model.forward.__doc__ == "Scaled output."


def test_the_users_own_forward_stays_at_the_bottom_with_its_name() -> None:
    model = Scaled()

    def doubled(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """Twice."""
        return 2 * Scaled.forward(model, x, scale)

    model.forward = doubled
    compose_forward(model, [ForwardLayer("same", Stage.OUTER, _same)])
    x = torch.ones(1, 2)
    assert torch.equal(model(x, scale=3.0), 2 * Scaled.forward(model, x, 3.0))
    assert (model.forward.__name__, model.forward.__doc__) == ("doubled", "Twice.")
    assert original_forward(model) is doubled
    compose_forward(model, [ForwardLayer("same", Stage.OUTER, _same)])  # again: still the user's
    assert original_forward(model) is doubled


def test_a_nameless_forward_is_called_forward() -> None:
    model = Scaled()
    model.forward = functools.partial(Scaled.forward, model)  # no __name__
    compose_forward(model, [ForwardLayer("same", Stage.OUTER, _same)])
    assert model.forward.__name__ == "forward"


def _optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_step_and_zero_grad_pass_their_arguments_through() -> None:
    """`step(closure)` and `zero_grad(set_to_none)`, positional and by keyword, as torch's."""
    model, opt = _optimizer()
    compose_step(opt, [StepLayer("same", _same, _same)])
    calls = []

    def closure() -> torch.Tensor:
        calls.append(1)
        return torch.tensor(7.0)

    assert opt.step(closure) == 7.0 and opt.step(closure=closure) == 7.0 and len(calls) == 2
    opt.zero_grad(False)
    assert model.weight.grad is not None and not model.weight.grad.any()
    model(torch.ones(1, 2)).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert model.weight.grad is not None and not model.weight.grad.any()


def test_where_no_layer_wraps_zero_grad_the_optimizer_keeps_its_own() -> None:
    _, opt = _optimizer()
    compose_step(opt, [StepLayer("step only", _same)])
    assert "zero_grad" not in opt.__dict__
    assert not hasattr(opt.step, "_wrapped_by_lr_sched")  # no scheduler wrapped step before
    opt.step()
    assert not hasattr(opt, "_opt_called")


def test_the_users_own_patches_stay_at_the_bottom() -> None:
    """A `step` the user wrapped (functools.wraps keeps the class's step as `__wrapped__`) and
    a `zero_grad` of their own: both still run under the layers."""
    model, opt = _optimizer()
    seen = []

    @functools.wraps(type(opt).step)
    def step(*args: Any, **kwargs: Any) -> Any:
        seen.append("step")
        return type(opt).step(opt, *args, **kwargs)

    def zero_grad(set_to_none: bool = True) -> None:
        seen.append("zero_grad")

    opt.step, opt.zero_grad = step, zero_grad
    compose_step(opt, [StepLayer("same", _same, _same)])
    opt.step()
    opt.zero_grad()
    assert seen == ["step", "zero_grad"]
    assert model.weight.grad is not None  # the user's zero_grad, not torch's, ran


def test_a_scheduler_made_before_keeps_its_mark_and_the_step_runs_once() -> None:
    model, opt = _optimizer()
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    compose_step(opt, [StepLayer("same", _same)])
    before = model.weight.detach().clone()
    assert opt.step(closure=lambda: torch.tensor(1.0)) == 1.0  # keywords pass through
    assert hasattr(opt.step, "_wrapped_by_lr_sched") and opt._opt_called
    torch.testing.assert_close(model.weight, before - 0.1 * model.weight.grad)  # once
    assert opt.step(lambda: torch.tensor(2.0)) == 2.0  # and positional arguments
    scheduler.step()
