"""The backends pass: flags and the fused/foreach optimizer step, keeping the user's groups."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch

import autoopt
from autoopt.runtime.passes import backends

from .models import MLP, batches, mlp_data, train


@pytest.fixture
def restore_cudnn_flags() -> Iterator[None]:
    saved = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


def test_fused_adamw_keeps_the_users_param_groups() -> None:
    model = MLP()
    optimizer = torch.optim.AdamW(
        [
            {"params": model.net[0].parameters(), "lr": 1e-3, "weight_decay": 0.1},
            {"params": model.net[2].parameters(), "lr": 5e-4},
        ],
        weight_decay=0.01,
    )
    model, optimizer = autoopt.optimize(model, optimizer=optimizer, verbose=False)
    groups = optimizer.param_groups
    assert [g["lr"] for g in groups] == [1e-3, 5e-4]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.01]
    assert all(g["fused"] is True for g in groups) and optimizer.defaults["fused"] is True
    result = autoopt.report(model)["backends"]
    assert result.status.value == "applied" and "fused AdamW" in result.detail


def test_fused_step_gives_the_same_training_as_the_default_step() -> None:
    torch.manual_seed(0)
    reference = MLP()
    model = copy.deepcopy(reference)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, amp=False, compile=False, verbose=False
    )
    assert optimizer.param_groups[0]["fused"] is True
    x, y = mlp_data(64)
    train(model, optimizer, batches(x, y, 16), epochs=2)
    train(reference, ref_opt, batches(x, y, 16), epochs=2)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_explicit_choice_is_respected() -> None:
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    model, optimizer = autoopt.optimize(model, optimizer=optimizer, verbose=False)
    assert optimizer.param_groups[0]["foreach"] is False
    assert not optimizer.param_groups[0]["fused"]
    assert "explicitly" in autoopt.report(model)["backends"].detail


def test_no_fused_kernel_means_foreach() -> None:
    model = MLP()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=0.01)
    model, optimizer = autoopt.optimize(model, optimizer=optimizer, verbose=False)
    assert optimizer.param_groups[0]["foreach"] is True
    assert "foreach RMSprop" in autoopt.report(model)["backends"].detail


def test_optimizer_with_state_is_not_switched_to_fused() -> None:
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()
    model, optimizer = autoopt.optimize(model, optimizer=optimizer, verbose=False)
    assert not optimizer.param_groups[0]["fused"]
    assert optimizer.param_groups[0]["foreach"] is True
    optimizer.step()  # the existing state works with the foreach step


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only expectations")
def test_cpu_without_optimizer_is_skipped_with_reason() -> None:
    result = autoopt.report(autoopt.optimize(MLP(), verbose=False))["backends"]
    assert result.status.value == "skipped"
    assert "no cuDNN/TF32 flags on cpu" in result.detail and "no optimizer" in result.detail


def test_deterministic_sets_consistent_cudnn_flags(restore_cudnn_flags: None) -> None:
    torch.backends.cudnn.benchmark = True
    model = autoopt.optimize(MLP(), deterministic=True, verbose=False)
    assert torch.backends.cudnn.deterministic is True
    assert torch.backends.cudnn.benchmark is False
    assert "deterministic=True" in autoopt.report(model)["backends"].detail


def test_choose_optimizer_decides_without_changing_the_optimizer() -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    impl, why = backends.choose_optimizer(optimizer, torch.device("cpu"))
    assert impl is not None and impl.flags in ({"fused": True, "foreach": False}, {"foreach": True})
    assert (
        optimizer.param_groups[0]["fused"] is None and optimizer.param_groups[0]["foreach"] is None
    )
    assert "step" in why
    settings, why = backends.choose_flags(torch.device("cpu"), deterministic=True)
    assert settings == {"cudnn.deterministic": True, "cudnn.benchmark": False}
