"""The compile pass: skipped on CPU with "auto", lazy failure -> eager fallback, TorchScript."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.passes import compile as compile_pass

from .models import MLP, batches, mlp_data, train
from .plain_loop import assert_same_training, train_by_hand


def failing_backend(gm: Any, example_inputs: Any) -> Any:
    """A torch.compile backend that fails the way a real one does: lazily, at the first call."""
    raise RuntimeError("this backend cannot compile anything")


def fit(compile: object, **kwargs: Any) -> tuple[nn.Module, list[float]]:
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, compile=compile, verbose=False, **kwargs
    )
    x, y = mlp_data(96)
    return model, train(model, optimizer, batches(x, y, 32), epochs=4)


def by_hand(compiled: Any = None) -> list[float]:
    """`fit`'s loop in plain fp32 torch; `compiled(model)` is the compiled model to train."""
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    x, y = mlp_data(96)
    run = compiled(model) if compiled is not None else model
    return train_by_hand(run, optimizer, batches(x, y, 32), epochs=4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto compiles on CUDA")
def test_auto_skips_on_cpu_without_a_compile_cache_and_says_why() -> None:
    result = autoopt.report(autoopt.optimize(MLP(), compile_cache=False, verbose=False))
    assert result["compile"].status.value == "skipped"
    assert "no compile cache" in result["compile"].detail
    assert "tune=True" in result["compile"].detail


def test_compile_false_is_skipped() -> None:
    result = autoopt.report(autoopt.optimize(MLP(), compile=False, verbose=False))["compile"]
    assert result.status.value == "skipped" and result.detail == "compile=False"


def test_compile_failure_falls_back_to_eager_and_training_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compile_pass, "BACKEND", failing_backend)
    with pytest.warns(UserWarning, match="falling back to the eager forward"):
        model, losses = fit(True, amp=False)
    result = autoopt.report(model)["compile"]
    assert result.status.value == "failed"
    assert "cannot compile anything" in result.detail
    assert result.fallback == "eager forward"
    assert losses[-1] < 0.8 * losses[0]
    assert_same_training(losses, by_hand(), None)  # the eager loop, step for step
    assert list(model.state_dict()) == list(MLP().state_dict())


class Broken(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("a bug in the user's forward")


def test_an_error_eager_also_raises_is_the_users_and_compile_is_not_blamed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compile_pass, "BACKEND", failing_backend)
    model = autoopt.optimize(Broken(), compile=True, verbose=False)
    with pytest.raises(ValueError, match="a bug in the user's forward"):
        model(torch.randn(2, 16))
    assert autoopt.report(model)["compile"].status.value == "applied"


def test_torch_compile_trains_in_place_with_the_original_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # aot_eager runs dynamo and AOTAutograd for real, without inductor's slow C++ codegen.
    monkeypatch.setattr(compile_pass, "BACKEND", "aot_eager")
    model, losses = fit(True, amp=False)
    assert autoopt.report(model)["compile"].status.value == "applied"
    assert losses[-1] < 0.8 * losses[0]
    # torch.compile by hand, same backend: the same training.
    assert_same_training(losses, by_hand(lambda m: torch.compile(m, backend="aot_eager")), None)
    assert list(model.state_dict()) == list(MLP().state_dict())  # no "_orig_mod."
    assert type(model) is MLP


class KnowsScripting(MLP):
    """Adds 1 when it runs as TorchScript, so a test can tell the script ran."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) + (1.0 if torch.jit.is_scripting() else 0.0)


def test_jit_runs_the_script_which_shares_the_parameters() -> None:
    torch.manual_seed(0)
    reference = KnowsScripting()
    model = autoopt.optimize(copy.deepcopy(reference), compile="jit", amp=False, verbose=False)
    x = torch.randn(4, 16)
    torch.testing.assert_close(model(x), reference(x) + 1.0)
    assert autoopt.report(model)["compile"].status.value == "applied"
    model(x).sum().backward()  # gradients reach the module's own parameters
    assert all(p.grad is not None for p in model.parameters())
    with torch.no_grad():
        model.net[0].bias.add_(1.0)
        reference.net[0].bias.add_(1.0)
    torch.testing.assert_close(model(x), reference(x) + 1.0)


def test_jit_trains() -> None:
    model, losses = fit("jit", amp=False)
    assert autoopt.report(model)["compile"].status.value == "applied"
    assert losses[-1] < 0.8 * losses[0]
    assert_same_training(losses, by_hand(torch.jit.script), None)  # TorchScript by hand


class Untraceable(MLP):
    """`try` is not TorchScript, and a keyword call cannot be traced: both fail."""

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        try:
            return self.net(x) * scale
        except KeyError:
            return x


def test_jit_failure_falls_back_to_eager() -> None:
    torch.manual_seed(0)
    reference = Untraceable()
    model = autoopt.optimize(copy.deepcopy(reference), compile="jit", amp=False, verbose=False)
    x = torch.randn(4, 16)
    with pytest.warns(UserWarning, match="TorchScript failed"):
        out = model(x, scale=2.0)
    torch.testing.assert_close(out, reference(x, scale=2.0))
    result = autoopt.report(model)["compile"]
    assert result.status.value == "failed" and result.fallback == "eager forward"
    torch.testing.assert_close(model(x), reference(x))  # stays eager, no new warning needed


class LoopsOverTime(nn.Module):
    """Sums over the time axis with a generator (not TorchScript): a trace freezes the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(sum(x[:, t] for t in range(x.size(1))))


class ShapeFree(MLP):
    """Not TorchScript (a generator), but its trace holds for any batch size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(layer(x) for layer in [self.net])


def test_jit_never_uses_a_trace_that_froze_a_loop() -> None:
    torch.manual_seed(0)
    reference = LoopsOverTime()
    model = autoopt.optimize(copy.deepcopy(reference), compile="jit", amp=False, verbose=False)
    short, long = torch.randn(4, 5, 16), torch.randn(4, 7, 16)
    torch.testing.assert_close(model(short), reference(short))
    assert "eager until the trace matches" in autoopt.report(model)["compile"].detail
    torch.testing.assert_close(model(short), reference(short))  # same shape: still eager
    with pytest.warns(UserWarning, match="differs from eager"):
        torch.testing.assert_close(model(long), reference(long))
    assert autoopt.report(model)["compile"].status.value == "failed"
    torch.testing.assert_close(model(long), reference(long))


def test_jit_uses_a_trace_once_checked_on_another_shape() -> None:
    torch.manual_seed(0)
    reference = ShapeFree()
    model = autoopt.optimize(copy.deepcopy(reference), compile="jit", amp=False, verbose=False)
    for n in (4, 6, 5):
        x = torch.randn(n, 16)
        torch.testing.assert_close(model(x), reference(x))
    result = autoopt.report(model)["compile"]
    assert result.status.value == "applied" and "checked against eager" in result.detail
    jit = model.forward.chain
    while not isinstance(jit, compile_pass.JitForward):  # below the device layer
        jit = jit.forward
    assert jit.script is not None  # the trace runs from now on


def test_choose_is_pure_and_matches_what_run_applies() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert compile_pass.choose(False, cuda)[0] is None
    how, why = compile_pass.choose("auto", cpu)
    assert how is None and "not on CUDA" in why
    assert compile_pass.choose("auto", cuda)[0] == "torch.compile"
    assert compile_pass.choose(True, cpu)[0] == "torch.compile"
    assert compile_pass.choose("jit", cpu)[0] == "jit"
