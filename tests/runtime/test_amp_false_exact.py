"""amp=False asks for fp32 as the user's own eager loop computes it, so optimize() keeps eager's
kernels: compile="auto", channels_last="auto" and an optimizer step that updates apart from the
user's own stand down, whatever timing or the compile cache's record would choose, each with its
report line. The reference is the user's plain torch loop, same seed; the measured choices are
made to pick what rounds apart (a fake step clock, forced trial winners), so each check fails if
its stand-down is gone. An explicit option is still honoured."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.passes import backends
from autoopt.runtime.passes import compile as compile_pass
from autoopt.runtime.trials import choices as trials

from .models import batches, cnn_data, mlp_data

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the measured choices of CPU")

STEPS = 3  # epochs of 4 batches: past the step timing's turns (1 + 3 rounds of 3)


class DropoutCNN(nn.Module):
    """Conv + BatchNorm + Dropout: the channels-last path, with random numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class NormMLP(nn.Module):
    """Linear + LayerNorm + Dropout: reductions Inductor computes in another order."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(16, 64),
            nn.LayerNorm(64),
            nn.GELU(),
            nn.Dropout(0.2),
            nn.Linear(64, 4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def fit(
    make: Callable[[], nn.Module],
    data: tuple[torch.Tensor, torch.Tensor],
    options: dict[str, Any] | None,
) -> tuple[nn.Module, list[torch.Tensor]]:
    """The user's loop, AdamW, through optimize(**options) (None: plain torch): every loss,
    the parameters and the generator's state at the end."""
    torch.manual_seed(0)
    model = make()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if options is not None:
        model, optimizer = autoopt.optimize(model, optimizer=optimizer, verbose=False, **options)
    torch.manual_seed(1)
    losses = []
    for _ in range(STEPS):
        for xb, yb in batches(*data, 16):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
    return model, [*losses, *(p.detach() for p in model.parameters()), torch.get_rng_state()]


def assert_eager(got: list[torch.Tensor], eager: list[torch.Tensor], model: nn.Module) -> None:
    for ours, expected in zip(got, eager, strict=True):
        assert torch.equal(ours, expected), autoopt.report(model)


class FusedFirst:
    """A fake step clock: the fused step takes 1 ms, foreach 2 ms, the user's own 3 ms."""

    def __init__(self) -> None:
        self.now = 0.0
        self.optimizer: torch.optim.Optimizer | None = None

    def __call__(self) -> float:
        assert self.optimizer is not None
        group = self.optimizer.param_groups[0]
        self.now += 0.001 if group["fused"] else 0.002 if group["foreach"] else 0.003
        return self.now


@pytest.fixture
def fused_first(monkeypatch: pytest.MonkeyPatch) -> Iterator[FusedFirst]:
    """The step timing would keep the fused step (its updates round an ulp apart)."""
    clock = FusedFirst()
    made = backends.StepTiming.__post_init__

    def post_init(self: backends.StepTiming) -> None:
        made(self)
        clock.optimizer = self.optimizer

    monkeypatch.setattr(backends.StepTiming, "__post_init__", post_init)
    monkeypatch.setattr(backends, "CLOCK", clock)
    yield clock


@pytest.fixture
def inductor() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_cnn_with_batchnorm_and_dropout_trains_as_eager(
    tmp_path: Path, fused_first: FusedFirst
) -> None:
    """Timing would keep channels-last (NHWC kernels) and the fused AdamW step."""
    data = cnn_data(64)
    _, eager = fit(DropoutCNN, data, None)
    with trials.forced_winners(channels_last="channels_last", compile="eager"):
        model, ours = fit(DropoutCNN, data, {"amp": False, "compile_cache": tmp_path})
    assert_eager(ours, eager, model)
    report = autoopt.report(model)
    layout = report["channels_last"]
    assert layout.status.value == "skipped", layout.detail
    assert "amp=False keeps eager's fp32 kernels" in layout.detail
    assert "channels_last=True forces it" in layout.detail
    step = report["backends"].detail
    assert "fused step left out: amp=False keeps eager's fp32 kernels" in step, step
    assert "AdamW(..., fused=True) takes it" in step
    assert "foreach AdamW step (" in step  # timed against the user's own: the same updates
    assert report["compile"].status.value == "skipped"


def test_a_compile_auto_trains_as_eager_on_a_first_and_a_second_run(
    tmp_path: Path, fused_first: FusedFirst, inductor: None
) -> None:
    """With an empty compile cache, then with what the first run left there: compiled steps
    would win the trial (and be recorded), with Inductor's kernels."""
    assert compile_pass.BACKEND == "inductor"
    data = mlp_data(64)
    _, eager = fit(NormMLP, data, None)
    for _ in range(2):
        with trials.forced_winners(compile="compiled"):
            model, ours = fit(NormMLP, data, {"amp": False, "compile_cache": tmp_path})
        assert_eager(ours, eager, model)
        result = autoopt.report(model)["compile"]
        assert result.status.value == "skipped", result.detail
        assert result.detail == compile_pass.stand_down("amp=False keeps eager's fp32 kernels")
        assert "compile=True compiles" in result.detail
        torch._dynamo.reset()


def test_explicit_options_are_still_honoured_under_amp_false(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compile_pass, "BACKEND", "aot_eager")  # no C++ build: only whether
    torch._dynamo.reset()
    model = DropoutCNN()
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    model, optimizer = autoopt.optimize(
        model,
        optimizer=optimizer,
        amp=False,
        compile=True,
        channels_last=True,
        compile_cache=tmp_path,
        verbose=False,
    )
    report = autoopt.report(model)
    assert report["compile"].status.value == "applied", report["compile"].detail
    assert report["channels_last"].status.value == "applied", report["channels_last"].detail
    assert "AdamW sets fused/foreach explicitly: kept" in report["backends"].detail
    assert optimizer.param_groups[0]["fused"] is True
    torch._dynamo.reset()


def test_amp_auto_resolving_to_fp32_still_measures(fp32_auto: None, tmp_path: Path) -> None:
    """The user did not ask for fp32 there: the layout, compile and the fused step are still
    measured, as before amp=False stood them down."""
    model = DropoutCNN()
    optimizer = torch.optim.AdamW(model.parameters())
    model, _ = autoopt.optimize(model, optimizer=optimizer, compile_cache=tmp_path, verbose=False)
    report = autoopt.report(model)
    assert "amp=False" not in str(report)
    assert "kept only if training steps measure faster" in report["channels_last"].detail
    assert "measured against eager" in report["compile"].detail
    assert "timing fused, foreach, default" in report["backends"].detail


def _steps_alike(make: Callable[[Any], torch.optim.Optimizer], flags: dict[str, bool]) -> bool:
    """The oracle, written with torch alone on data of its own: 3 steps of the optimizer with
    `flags` leave the parameters bit for bit where the optimizer as the user builds it does."""
    generator = torch.Generator().manual_seed(1)
    shapes = ((5, 7), (33,), (40, 65))
    start = [torch.randn(s, generator=generator) for s in shapes]
    grads = [[torch.randn(s, generator=generator) for s in shapes] for _ in range(3)]

    def trained(extra: dict[str, bool]) -> list[torch.Tensor]:
        params = [p.clone().requires_grad_() for p in start]
        optimizer = make(params)
        for group in optimizer.param_groups:
            group.update(extra)
        for step in grads:
            for param, grad in zip(params, step, strict=True):
                param.grad = grad.clone()
            optimizer.step()
        return params

    return all(map(torch.equal, trained(flags), trained({})))


@pytest.mark.parametrize(
    ("make", "kept"),
    [
        (lambda p: torch.optim.AdamW(p, lr=1e-3), ["foreach"]),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), ["foreach"]),
        (lambda p: torch.optim.NAdam(p), []),
    ],
    ids=["AdamW", "SGD", "NAdam"],
)
def test_only_steps_that_update_as_the_users_own_are_kept(
    make: Callable[[Any], torch.optim.Optimizer], kept: list[str]
) -> None:
    """Probed on throwaway optimizers: foreach updates as the for-loop does for AdamW and SGD
    and not for NAdam; whether fused does depends on the CPU's kernels (an ulp apart on AMD
    EPYC, bit for bit on some Intel Xeons), so it is kept exactly where torch's own steps,
    compared here on other data, agree."""
    optimizer = make(nn.Linear(4, 3).parameters())
    cpu = torch.device("cpu")
    impls, _ = backends.step_candidates(optimizer, cpu)
    same, apart = backends.same_updates(optimizer, cpu, impls)
    expected = [name for name, impl in impls.items() if _steps_alike(make, impl.flags)]
    assert list(same) == expected
    assert [name for name in expected if name != "fused"] == kept
    assert sorted(apart) == sorted(set(impls) - set(expected))
    assert not optimizer.state  # the user's optimizer was not stepped
