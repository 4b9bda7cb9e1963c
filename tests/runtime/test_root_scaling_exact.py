"""root_scaling's registry at the edges the loss-scaling tests did not reach (each test kills
mutants that survived `make mutation`; docs/benchmarks/mutation.md)."""

from __future__ import annotations

import gc

import torch

from autoopt.runtime import root_scaling
from autoopt.runtime.loss_scaling import LossScaler

from .models import MLP


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


def test_unregistering_the_last_model_restores_torchs_backward() -> None:
    keep, model = MLP(), MLP()
    root_scaling.register(keep, scaler=LossScaler(torch.device("cpu")))
    root_scaling.register(model, scaler=LossScaler(torch.device("cpu")))
    root_scaling.unregister(model)
    assert not root_scaling.registration_of_params(model.parameters())
    assert root_scaling.registration_of_params(keep.parameters())  # the other one stays
    root_scaling.unregister(keep)
    assert torch.autograd._engine_run_backward is root_scaling._original_engine_run_backward


def test_a_collected_model_restores_torchs_backward() -> None:
    model = MLP()
    root_scaling.register(model, scaler=LossScaler(torch.device("cpu")))
    assert torch.autograd._engine_run_backward is not root_scaling._original_engine_run_backward
    del model
    gc.collect()
    root_scaling.registration_of_params([])  # any lookup drops dead registrations
    assert torch.autograd._engine_run_backward is root_scaling._original_engine_run_backward
    torch.nn.Linear(2, 1)(torch.ones(1, 2)).sum().backward()  # and torch's backward still runs
