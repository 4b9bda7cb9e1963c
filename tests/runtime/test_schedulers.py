"""LR schedulers created before or after `optimize()` behave as in eager: same lr sequence, no
warnings (`optimizer.step` stays a bound method a scheduler can wrap)."""

from __future__ import annotations

import copy
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as sched

import autoopt

from .models import MLP, mlp_data

STEPS = 8

SCHEDULERS: dict[str, Callable[[torch.optim.Optimizer], Any]] = {
    "StepLR": lambda opt: sched.StepLR(opt, step_size=2, gamma=0.5),
    "OneCycleLR": lambda opt: sched.OneCycleLR(opt, max_lr=0.2, total_steps=STEPS),
    "LambdaLR": lambda opt: sched.LambdaLR(opt, lambda i: 0.8**i),
    "ReduceLROnPlateau": lambda opt: sched.ReduceLROnPlateau(opt, patience=1, factor=0.5),
    "CosineAnnealingWarmRestarts": lambda opt: sched.CosineAnnealingWarmRestarts(opt, T_0=3),
    "SequentialLR": lambda opt: sched.SequentialLR(
        opt,
        [sched.LinearLR(opt, start_factor=0.5, total_iters=2), sched.ExponentialLR(opt, 0.9)],
        milestones=[3],
    ),
}

# Options that put layers on optimizer.step (the loss scaler's inf check, accumulation's gate).
OPTIONS = {"fp16": {"amp": "fp16"}, "accumulate=2": {"amp": False, "accumulate": 2}}


def lr_sequence(name: str, options: dict[str, Any] | None, when: str) -> list[float]:
    """The lr after each step of a short training loop, with every warning an error."""
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = mlp_data(STEPS * 4)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if when == "before":
            scheduler = SCHEDULERS[name](optimizer)
        if options is not None:
            model, optimizer = autoopt.optimize(
                model, optimizer=optimizer, verbose=False, **options
            )
        if when == "after":
            scheduler = SCHEDULERS[name](optimizer)
        for i in range(STEPS):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x[i * 4 : i * 4 + 4]), y[i * 4 : i * 4 + 4])
            loss.backward()
            optimizer.step()
            if isinstance(scheduler, sched.ReduceLROnPlateau):
                scheduler.step(1.0)  # a metric that never improves: lr halves every 2 steps
            else:
                scheduler.step()
            seen.append(optimizer.param_groups[0]["lr"])
    return seen


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("name", SCHEDULERS)
def test_same_lr_sequence_as_eager_and_no_warning(name: str, option: str, when: str) -> None:
    eager = lr_sequence(name, None, when)
    assert len(set(eager)) > 1  # the schedule does change the lr
    assert lr_sequence(name, OPTIONS[option], when) == eager  # exact: the same float arithmetic


def test_step_is_a_bound_method_running_the_layers() -> None:
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, amp=False, accumulate=2, verbose=False
    )
    assert optimizer.step.__self__ is optimizer
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()  # the first of 2 micro-batches: gated
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    optimizer.step()
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_copies_of_the_optimizer_are_plain() -> None:
    """torch's Optimizer pickles its state only, so a copy steps with the class's own step."""
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, amp=False, accumulate=2, verbose=False
    )
    for twin in (copy.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))):
        assert "step" not in twin.__dict__
