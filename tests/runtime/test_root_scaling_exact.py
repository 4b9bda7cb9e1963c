"""root_scaling's registry at the edges the loss-scaling tests did not reach (each test kills
mutants that survived `make mutation`; docs/benchmarks/mutation.md)."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from autoopt.runtime.scaling import root_scaling
from autoopt.runtime.scaling.loss_scaling import LossScaler

from .models import MLP


@pytest.fixture
def alone() -> Iterator[None]:
    """No other test's model registered meanwhile (models of earlier tests may still be alive
    in this process): the registry emptied for the test, then put back as it was."""
    saved = root_scaling._registered[:]
    installed = torch.autograd._engine_run_backward
    root_scaling._registered.clear()
    torch.autograd._engine_run_backward = root_scaling._original_engine_run_backward
    try:
        yield
    finally:
        root_scaling._registered[:] = saved
        torch.autograd._engine_run_backward = installed


def test_registering_again_keeps_what_the_first_registration_gave() -> None:
    model = MLP()
    scaler = LossScaler(torch.device("cpu"))
    first = root_scaling.register(model, scaler=scaler)
    again = root_scaling.register(model)  # e.g. the accumulate pass after the amp pass
    try:
        assert again is first and again.scaler is scaler
    finally:
        root_scaling.unregister(model)


def test_added_parameters_belong_to_their_model_only() -> None:
    model, other = MLP(), MLP()
    root_scaling.register(model, scaler=LossScaler(torch.device("cpu")))
    root_scaling.register(other, scaler=LossScaler(torch.device("cpu")))
    extra = torch.nn.Parameter(torch.ones(2))
    try:
        root_scaling.add_params(model, [extra])
        (owner,) = root_scaling.registration_of_params([extra])
        assert owner.model() is model
    finally:
        root_scaling.unregister(model)
        root_scaling.unregister(other)


@pytest.mark.usefixtures("alone")
def test_unregistering_the_last_model_restores_torchs_backward() -> None:
    keep, model = MLP(), MLP()
    root_scaling.register(keep, scaler=LossScaler(torch.device("cpu")))
    root_scaling.register(model, scaler=LossScaler(torch.device("cpu")))
    root_scaling.unregister(model)
    assert not root_scaling.registration_of_params(model.parameters())
    assert root_scaling.registration_of_params(keep.parameters())  # the other one stays
    root_scaling.unregister(keep)
    assert torch.autograd._engine_run_backward is root_scaling._original_engine_run_backward


@pytest.mark.usefixtures("alone")
def test_a_collected_model_restores_torchs_backward() -> None:
    model = MLP()
    root_scaling.register(model, scaler=LossScaler(torch.device("cpu")))
    assert torch.autograd._engine_run_backward is not root_scaling._original_engine_run_backward
    del model
    gc.collect()
    root_scaling.registration_of_params([])  # any lookup drops dead registrations
    assert torch.autograd._engine_run_backward is root_scaling._original_engine_run_backward
    torch.nn.Linear(2, 1)(torch.ones(1, 2)).sum().backward()  # and torch's backward still runs


def test_autograd_grad_hands_back_true_scale_results_and_none_for_unused() -> None:
    """The gradient-penalty path: `autograd.grad` results unscaled, an unused input's None kept,
    and nothing accumulated into `.grad` (autograd.grad never does)."""
    torch.manual_seed(0)
    model = MLP()
    reference = MLP()
    reference.load_state_dict(model.state_dict())
    unused = torch.nn.Parameter(torch.ones(3))
    root_scaling.register(model, scaler=LossScaler(torch.device("cpu")))
    try:
        x = torch.randn(8, 16)
        got = torch.autograd.grad(
            model(x).square().mean(), [model.net[0].weight, unused], allow_unused=True
        )
        (expected,) = torch.autograd.grad(reference(x).square().mean(), [reference.net[0].weight])
        assert torch.equal(got[0], expected) and got[1] is None  # x 2**16 then x 2**-16: exact
        assert all(p.grad is None for p in model.parameters())
    finally:
        root_scaling.unregister(model)


def test_autograd_grad_is_not_divided_by_the_accumulation_count() -> None:
    """A hand-written accumulating loop divides its loss, not an inner gradient: under
    `accumulate=4`, `autograd.grad` returns the plain gradient."""
    import autoopt  # here: the registration comes from optimize()'s accumulate pass

    torch.manual_seed(0)
    model = MLP()
    reference = MLP()
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, accumulate=4, amp=False, compile=False, verbose=False
    )
    x = torch.randn(8, 16)
    (got,) = torch.autograd.grad(model(x).square().mean(), [model.net[0].weight])
    (expected,) = torch.autograd.grad(reference(x).square().mean(), [reference.net[0].weight])
    assert torch.equal(got, expected)


def test_one_backward_through_models_with_different_accumulate_counts_is_refused() -> None:
    """Which 1/N would seed it? Neither is right for the other model: an error that says so."""
    import autoopt

    models = []
    for count in (2, 4, 4):
        model = MLP()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        models.append(
            autoopt.optimize(
                model,
                optimizer=optimizer,
                accumulate=count,
                amp=False,
                compile=False,
                verbose=False,
            )[0]
        )
    x = torch.randn(4, 16)
    with pytest.raises(RuntimeError) as error:
        sum(m(x).sum() for m in models).backward()
    assert str(error.value) == (
        "one backward reaches models optimized with different accumulate= values "
        "(seeds ['1/2', '1/4']); give every model of one loss the same accumulate="
    )
    (models[1](x).sum() + models[2](x).sum()).backward()  # the same count: one seed, fine


@pytest.mark.usefixtures("alone")
def test_a_backward_through_two_scaled_models_is_seeded_with_the_smaller_scale() -> None:
    """A GAN-like loss through two models whose scalers differ: the seed is the smaller scale
    (the larger one would overflow the fp16 activation the loss passes through), and every
    leaf divides by that same value, so `.grad` equals plain torch's."""
    torch.manual_seed(0)
    first, second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    plain = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)]
    for copy, model in zip(plain, (first, second), strict=True):
        copy.load_state_dict(model.state_dict())
    big, small = LossScaler(torch.device("cpu")), LossScaler(torch.device("cpu"))
    big._scale.fill_(2.0**24)  # x 2**24 is inf in fp16 (max 65504); x 4 is not
    small._scale.fill_(4.0)
    root_scaling.register(first, scaler=big)  # the larger first: not picked for being first
    root_scaling.register(second, scaler=small)
    x = torch.randn(3, 4)
    second(first(x)).half().float().sum().backward()
    plain[1](plain[0](x)).half().float().sum().backward()
    for got, want in zip((*first.parameters(), *second.parameters()), _params(plain), strict=True):
        assert torch.equal(got.grad, want.grad)


def _params(models: list[torch.nn.Module]) -> list[torch.Tensor]:
    return [p for m in models for p in m.parameters()]


@pytest.mark.usefixtures("alone")
def test_a_backward_from_a_gradient_edge_is_seeded_like_a_tensor_root() -> None:
    """`torch.autograd.backward` takes a GradientEdge for a root: under accumulate=4 its seed is
    divided by 4, as `(loss / 4).backward()` would be."""
    import autoopt

    torch.manual_seed(0)
    model, reference = MLP(), MLP()
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, accumulate=4, amp=False, compile=False, verbose=False
    )
    x = torch.randn(8, 16)
    loss = model(x).square().mean()
    edge = torch.autograd.graph.get_gradient_edge(loss)
    torch.autograd.backward([edge], grad_tensors=[torch.ones(())])
    (reference(x).square().mean() / 4).backward()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=1e-7)


@pytest.mark.usefixtures("alone")
def test_roots_that_do_not_require_grad_are_passed_over() -> None:
    """A graph lookup over a mix of tensors: one that does not require grad (and anything not a
    tensor) is no root, and does not raise as torch's gradient-edge lookup would on it."""
    model = MLP()
    root_scaling.register(model, scaler=LossScaler(torch.device("cpu")))
    loss = model(torch.randn(2, 16)).sum()
    (reg,) = root_scaling.registrations_of([torch.ones(2), None, loss])
    assert reg.model() is model
    assert root_scaling.registrations_of([torch.ones(2)]) == []


@pytest.mark.usefixtures("alone")
@pytest.mark.parametrize("share", [(2, 8), (3, 8)])
def test_a_micro_batch_backward_is_seeded_with_its_share(share: tuple[int, int]) -> None:
    """accumulate="auto": a part of 2 (or 3) rows of a batch of 8 seeds its backward with 2/8, as
    `(loss * 2 / 8).backward()` would."""
    from autoopt.runtime.accumulation.accumulator import Accumulator

    torch.manual_seed(0)
    model, reference = MLP(), MLP()
    reference.load_state_dict(model.state_dict())
    acc = Accumulator(4, auto=True)
    acc.part = share
    root_scaling.register(model, accumulator=acc)
    x = torch.randn(8, 16)
    model(x).square().mean().backward()
    (reference(x).square().mean() * share[0] / share[1]).backward()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-6, atol=0)


def test_reentrant_checkpointing_under_accumulation_alone_is_seeded_once() -> None:
    """accumulate=2 without fp16 and torch's reentrant checkpoint: the inner backward is not
    seeded again (1/2 once), as in the hand-written loop `(loss / 2).backward()`."""
    import autoopt

    class Checkpointed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp, self.block = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.inp(x))
            return torch.utils.checkpoint.checkpoint(self.block, h, use_reentrant=True)

    torch.manual_seed(0)
    model, reference = Checkpointed(), Checkpointed()
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, accumulate=2, amp=False, compile=False, verbose=False
    )
    x = torch.randn(8, 16)
    model(x).square().mean().backward()
    (reference(x).square().mean() / 2).backward()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-6, atol=0)


class Recompute(torch.autograd.Function):
    """A reentrant function written by hand: its backward recomputes `block` on its input and
    runs a backward of its own. `copy`: on a detached copy of the input (a leaf that is not a
    parameter: its gradient is handed back), else on the input as data (every inner leaf a
    parameter; `anchor`, a parameter too, puts the model in the outer backward)."""

    @staticmethod
    def forward(
        ctx: Any, block: torch.nn.Module, x: torch.Tensor, copy: bool, anchor: torch.Tensor
    ) -> torch.Tensor:
        ctx.block, ctx.copy = block, copy
        ctx.save_for_backward(x)
        with torch.no_grad():
            return block(x) + anchor

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(ctx.copy)
        with torch.enable_grad():
            torch.autograd.backward(ctx.block(x), grad)
        return None, x.grad, None, None


@pytest.mark.usefixtures("alone")
@pytest.mark.parametrize("copy", [False, True], ids=["parameters only", "a copy of the input"])
def test_another_reentrant_backward_stands_down_only_for_leaves_it_cannot_tell(copy: bool) -> None:
    """Inner leaves that are all parameters are unscaled like any (true-scale `.grad`, fp16 in
    charge); a leaf that is not one makes fp16 stand down with the reason."""
    torch.manual_seed(0)
    first, block = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)
    anchor = torch.nn.Parameter(torch.zeros(()))
    model = torch.nn.ModuleList([first, block])
    model.anchor = anchor
    reference = torch.nn.ModuleList([torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)])
    reference.load_state_dict({k: v for k, v in model.state_dict().items() if k != "anchor"})
    scaler = LossScaler(torch.device("cpu"))
    root_scaling.register(model, scaler=scaler)
    x = torch.randn(8, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Recompute.apply(block, first(x) if copy else x, copy, anchor).square().mean().backward()
    reference[1](reference[0](x) if copy else x).square().mean().backward()
    if not copy:
        assert scaler.user_amp.reason is None and not caught
        for got, want in zip(block.parameters(), reference[1].parameters(), strict=True):
            assert torch.equal(got.grad, want.grad)  # x 2**16, then x 2**-16: exact
        return
    assert scaler.user_amp.reason == (
        "a backward ran inside another backward (a reentrant autograd.Function other than "
        "torch.utils.checkpoint) with leaves that are not parameters: autoopt cannot tell "
        "whether their gradients are handed back (to stay scaled) or kept (to be unscaled); "
        "this step left them scaled"
    )
