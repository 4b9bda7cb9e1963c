"""compile="auto" on CPU decides from the compile cache: measured once (the trials' "compile"
choice, timed on training steps), the outcome recorded; a model whose compiled steps won is
compiled at the next start without measuring, one whose compiled steps lost is not compiled."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

import autoopt
from autoopt.runtime import hardware
from autoopt.runtime.compiling import cache as compile_cache
from autoopt.runtime.passes import amp as amp_pass
from autoopt.runtime.passes import compile as compile_pass
from autoopt.runtime.trials import choices as trials

from .models import MLP, batches, mlp_data, train
from .plain_loop import assert_same_training, train_by_hand

# amp="auto" in fp32 (`fp32_auto`): amp=False keeps eager's kernels, so compile="auto" does not
# compile there.
pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(), reason="auto compiles on CUDA"),
    pytest.mark.usefixtures("fp32_auto"),
]

EPOCHS = 4  # of 3 steps


@pytest.fixture(autouse=True)
def aot_eager(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # dynamo and AOTAutograd for real, without inductor's C++ builds.
    monkeypatch.setattr(compile_pass, "BACKEND", "aot_eager")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def fit(cache: Path | bool, **kwargs: Any) -> tuple[torch.nn.Module, list[float]]:
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    options: dict[str, Any] = {"compile_cache": cache, "verbose": False}
    model, optimizer = autoopt.optimize(model, optimizer=optimizer, **{**options, **kwargs})
    x, y = mlp_data(96)
    # The trials take turns on the first training steps: a warm-up each, then rounds until
    # the outcome is settled (a tie: 3 rounds, 9 steps).
    return model, train(model, optimizer, batches(x, y, 32), epochs=EPOCHS)


def eager_losses() -> list[float]:
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    x, y = mlp_data(96)
    return train_by_hand(model, optimizer, batches(x, y, 32), epochs=EPOCHS)


def frames() -> int:
    return int(counters["stats"]["unique_graphs"])


def record_of(cache: Path) -> dict[str, str]:
    found = list(cache.glob("*.outcome.json"))
    assert len(found) == 1, found
    outcome = compile_cache.Outcome(cache, found[0].name.removesuffix(".outcome.json")).read()
    assert outcome is not None
    return outcome


class ClockFavouring:
    """A fake trials clock: a step of the compiled model takes `compiled_s`, an eager one 1 s."""

    def __init__(self, compiled_s: float) -> None:
        self.now = 0.0
        self.compiled_s = compiled_s
        self.auto: compile_pass.AutoCompile | None = None

    def __call__(self) -> float:
        self.now += self.compiled_s if self.auto is not None and self.auto.compiled else 1.0
        return self.now


def fit_timed(
    cache: Path, compiled_s: float, monkeypatch: pytest.MonkeyPatch
) -> tuple[torch.nn.Module, list[float]]:
    clock = ClockFavouring(compiled_s)
    made = compile_pass.AutoCompile.__init__

    def init(self: compile_pass.AutoCompile, *args: Any) -> None:
        made(self, *args)
        clock.auto = self

    monkeypatch.setattr(compile_pass.AutoCompile, "__init__", init)
    monkeypatch.setattr(trials, "CLOCK", clock)
    return fit(cache)


def test_without_a_record_it_measures_and_a_faster_compile_is_kept_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = frames()
    model, losses = fit_timed(tmp_path, 0.5, monkeypatch)
    result = autoopt.report(model)["compile"]
    assert result.status.value == "applied", result.detail
    assert result.detail.startswith("torch.compile: eager 2 s ±0% (2 steps), compiled 1 s")
    assert frames() > before  # the steps ran compiled
    assert_same_training(losses, eager_losses(), None)
    assert record_of(tmp_path)["winner"] == "compiled"


def test_a_compile_that_measures_no_faster_is_dropped_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, losses = fit_timed(tmp_path, 1.0, monkeypatch)  # a tie: eager (the baseline) stays
    result = autoopt.report(model)["compile"]
    assert result.status.value == "skipped", result.detail
    assert "not compiled again" in result.detail
    assert_same_training(losses, eager_losses(), None)
    assert record_of(tmp_path)["winner"] == "eager"


def test_a_record_decides_the_next_start_without_measuring(tmp_path: Path) -> None:
    with trials.forced_winners(compile="compiled"):
        fit(tmp_path)
    assert record_of(tmp_path)["winner"] == "compiled"
    torch._dynamo.reset()
    before = frames()
    with trials.forced_winners(compile="eager"):  # would be obeyed if it were measured again
        model, losses = fit(tmp_path)
    result = autoopt.report(model)["compile"]
    assert result.status.value == "applied", result.detail
    assert "measured faster than eager before" in result.detail
    assert frames() > before
    assert_same_training(losses, eager_losses(), None)


def test_a_model_whose_compiled_steps_lost_is_not_compiled_again(tmp_path: Path) -> None:
    with trials.forced_winners(compile="eager"):
        fit(tmp_path)
    assert record_of(tmp_path)["winner"] == "eager"
    torch._dynamo.reset()
    before = frames()
    with trials.forced_winners(compile="compiled"):
        model, _ = fit(tmp_path)
    result = autoopt.report(model)["compile"]
    assert result.status.value == "skipped", result.detail
    assert "no faster than eager before" in result.detail and "compile=True" in result.detail
    assert frames() == before  # not compiled at all


def test_another_choice_measures_the_eager_model_before_a_recorded_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a record, the amp trials still measure eager (as without one): the model compiles
    after them, once, when they are decided."""
    with trials.forced_winners(compile="compiled"):
        fit(tmp_path)
    torch._dynamo.reset()
    calls: list[bool] = []  # the trials decided?
    compiles: list[bool] = []

    def decided(layer: compile_pass.CompiledForward) -> bool:
        measured = trials.of_model(layer.model)
        return measured is None or measured.done

    real_call, real_compile = (
        compile_pass.CompiledForward.__call__,
        compile_pass.CompiledForward._compile,
    )

    def call(self: compile_pass.CompiledForward, *args: Any, **kwargs: Any) -> Any:
        calls.append(decided(self))
        return real_call(self, *args, **kwargs)

    def compile_(self: compile_pass.CompiledForward) -> Any:
        compiles.append(decided(self))
        return real_compile(self)

    monkeypatch.setattr(compile_pass.CompiledForward, "__call__", call)
    monkeypatch.setattr(compile_pass.CompiledForward, "_compile", compile_)
    ticks = iter(range(10**6)).__next__  # every step takes as long: a tie, settled in 3 rounds
    monkeypatch.setattr(trials, "CLOCK", ticks)
    monkeypatch.setattr(amp_pass, "CLOCK", ticks)
    # amp="auto" on CPU trials bf16 only where the CPU has native bf16: fake that answer, so the
    # amp trials run on any machine (CI's CPU has none).
    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: True)
    model, _ = fit(tmp_path, amp="auto")
    assert "amp, winners from step" in autoopt.report(model)["trials"].detail
    assert False in calls  # the amp trials went through the compile layer, eager
    assert compiles == [True]  # compiled once, after them


def test_a_compile_the_run_cannot_repay_is_not_tried_and_is_recorded_as_a_candidate(
    tmp_path: Path,
) -> None:
    """Trials that pay: 3 batches of a 4-module MLP (milliseconds a step) cannot repay a cold
    compile estimated at seconds, so no compile happens on this run; the report says why with
    the estimate, and the record leaves the next run to weigh it again."""
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    x, y = mlp_data(96)
    loader = batches(x, y, 32)
    before = frames()
    model, loader, optimizer = autoopt.optimize(
        model, loader, optimizer, compile_cache=tmp_path, verbose=False
    )
    losses = train(model, optimizer, loader, epochs=2)
    assert frames() == before  # nothing compiled
    result = autoopt.report(model)["compile"]
    assert result.status.value == "skipped", result.detail
    assert result.detail.startswith(f"eager kept: {trials.NOT_TRIED}: a cold compile ("), (
        result.detail
    )
    assert "the run has 3 steps as far as seen (3 batches x 1 epoch started)" in result.detail
    estimate, _ = compile_cache.CompileCosts(tmp_path).estimate("", compile_cache.model_size(MLP()))
    assert result.figures["one_off_estimate_s"] == pytest.approx(estimate, abs=1e-3)
    assert result.figures["run_steps"] == 3
    assert_same_training(losses, eager_losses()[: len(losses)], None)
    found = list(tmp_path.glob("*.outcome.json"))
    assert len(found) == 1 and '"untried"' in found[0].read_text()
    name = found[0].name.removesuffix(".outcome.json")
    assert compile_cache.Outcome(tmp_path, name).read() is None  # weighed again next run


def test_an_outcome_an_older_rule_recorded_is_weighed_again(tmp_path: Path) -> None:
    """A record from before the noise band (one timed step a side: 'eager 2.01 s (1 run),
    compiled 1.6 s (1 run)') kept the demo transformer compiled at 0.65x of eager's speed: it
    is no record now, and what this rule writes is read back."""
    old = compile_cache.Outcome(tmp_path, "model")
    old.path.write_text(
        '{"winner": "compiled", "measured": "eager 2.01 s (1 run), compiled 1.6 s (1 run)",'
        ' "torch": "2.13.0+cpu"}'
    )
    assert old.read() is None
    old.write("eager", "eager 1 s ±2% (6 steps), compiled 1.1 s ±3% (6 steps)")
    assert old.read() == {
        "winner": "eager",
        "measured": "eager 1 s ±2% (6 steps), compiled 1.1 s ±3% (6 steps)",
    }
