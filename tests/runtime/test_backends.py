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
    assert result.status.value == "applied" and "timing fused, foreach, default" in result.detail


def test_fused_step_gives_the_same_training_as_the_default_step(fp32_auto: None) -> None:
    torch.manual_seed(0)
    reference = MLP()
    model = copy.deepcopy(reference)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    # amp="auto" in fp32: amp=False would leave the fused step out (it rounds apart).
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, device="cpu", compile=False, verbose=False
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
    assert "RMSprop step: timing foreach, default" in autoopt.report(model)["backends"].detail


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


class StepClock:
    """A fake clock: a step of the optimizer's current implementation takes COSTS[impl] s."""

    def __init__(self, optimizer: torch.optim.Optimizer, costs: dict[str, float]) -> None:
        self.optimizer = optimizer
        self.costs = costs
        self.now = 0.0

    def __call__(self) -> float:
        group = self.optimizer.param_groups[0]
        impl = "fused" if group["fused"] else "foreach" if group["foreach"] else "default"
        self.now += self.costs[impl]  # so the time between two reads is the second's cost
        return self.now


def _timed_optimize(
    monkeypatch: pytest.MonkeyPatch, costs: dict[str, float]
) -> tuple[torch.nn.Module, torch.optim.Optimizer, StepClock]:
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    clock = StepClock(optimizer, costs)
    monkeypatch.setattr(backends, "CLOCK", clock)
    # amp="auto" in fp32 (the tests' `fp32_auto`): amp=False would leave the fused step out.
    model, optimizer = autoopt.optimize(model, optimizer=optimizer, compile=False, verbose=False)
    return model, optimizer, clock


@pytest.mark.skipif(torch.cuda.is_available(), reason="the timing runs on CPU")
@pytest.mark.parametrize("winner", ["fused", "foreach", "default"])
def test_cpu_keeps_the_step_measured_fastest(
    monkeypatch: pytest.MonkeyPatch, fp32_auto: None, winner: str
) -> None:
    costs = {"fused": 0.0015, "foreach": 0.0016, "default": 0.0018, winner: 0.001}
    model, optimizer, _ = _timed_optimize(monkeypatch, costs)
    reference = MLP()
    reference.load_state_dict(autoopt.unwrap(model).state_dict())
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    x, y = mlp_data(160)
    train(model, optimizer, batches(x, y, 16), epochs=1)
    train(reference, ref_opt, batches(x, y, 16), epochs=1)
    result = autoopt.report(model)["backends"]
    detail = result.detail
    assert f"{winner} Adam step (" in detail, detail
    assert f"{winner} 1 ms ±0% ({backends.ROUNDS} steps)" in detail and "steps 2-10" in detail
    assert result.figures[f"{winner}_s"] == 0.001
    assert result.figures[f"{winner}_samples"] == backends.ROUNDS
    group = optimizer.param_groups[0]
    expected = {"fused": (True, False), "foreach": (False, True), "default": (None, None)}
    assert (group["fused"], group["foreach"]) == expected[winner]
    # Whatever ran on which step, the training is the user's optimizer's (fp32 rounding apart).
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    # A checkpoint holds the user's flags; loading one gives the winner's back.
    state = optimizer.state_dict()
    assert state["param_groups"][0]["fused"] is None
    optimizer.load_state_dict(state)
    assert (optimizer.param_groups[0]["fused"], optimizer.param_groups[0]["foreach"]) == (
        expected[winner]
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the timing runs on CPU")
def test_a_step_ahead_within_the_noise_leaves_the_users_own(
    monkeypatch: pytest.MonkeyPatch, fp32_auto: None
) -> None:
    """A 3% lead is within the noise band: the user's own step stays (the same choice on every
    run), and the line says why."""
    model, optimizer, _ = _timed_optimize(
        monkeypatch, {"fused": 0.00097, "foreach": 0.0011, "default": 0.001}
    )
    x, y = mlp_data(160)
    train(model, optimizer, batches(x, y, 16), epochs=1)
    result = autoopt.report(model)["backends"]
    assert "default Adam step" in result.detail, result.detail
    assert "fused 3% faster (within the noise: ±0%, 3 rounds)" in result.detail
    assert result.figures["lead"] == pytest.approx(0.0309, abs=1e-3)
    group = optimizer.param_groups[0]
    assert (group["fused"], group["foreach"]) == (None, None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the timing runs on CPU")
def test_a_step_twice_as_slow_drops_out_after_one_turn(
    monkeypatch: pytest.MonkeyPatch, fp32_auto: None
) -> None:
    model, optimizer, _ = _timed_optimize(
        monkeypatch, {"fused": 0.001, "foreach": 0.0011, "default": 0.01}
    )
    x, y = mlp_data(160)
    train(model, optimizer, batches(x, y, 16), epochs=1)
    detail = autoopt.report(model)["backends"].detail
    assert f"fused Adam step (fused 1 ms ±0% ({backends.ROUNDS} steps)" in detail, detail
    assert "default 10 ms (1 step)" in detail
