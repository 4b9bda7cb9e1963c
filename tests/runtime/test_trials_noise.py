"""Decisions with a noise band and trials that pay (`autoopt.runtime.trials.choices`): the
mechanism alone, on a fake clock, so what it decides follows from the costs given to it."""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable

import pytest
import torch

from autoopt.runtime.report import PassResult, Report
from autoopt.runtime.trials import choices, timing
from autoopt.runtime.trials.choices import Choice, Trials
from benchmarks.trial_noise import Costly  # charges the clock it is given, this one too


class Clock:
    """Time as the model's forward and backward spend it (`charge`): each charge is the cost of
    the option in force, times a random factor in [1 - noise, 1 + noise] (a seeded stream) or
    the next of `factors`; the first charge of an option adds `first[option]` (a compile in
    its warm-up step). Reading it does not advance it."""

    def __init__(
        self,
        costs: dict[str, float],
        noise: float = 0.0,
        seed: int = 0,
        factors: list[float] | None = None,
    ) -> None:
        self.costs = costs
        self.noise = noise
        self.rng = random.Random(seed)
        self.factors = itertools.cycle(factors) if factors else None
        self.option = "base"
        self.now = 0.0
        self.first: dict[str, float] = {}

    def apply(self, option: str) -> None:
        self.option = option

    def charge(self) -> None:
        if self.factors is not None:
            factor = next(self.factors)
        else:
            factor = 1 + self.rng.uniform(-self.noise, self.noise)
        self.now += self.costs[self.option] * factor + self.first.pop(self.option, 0.0)

    def __call__(self) -> float:
        return self.now


def measure(
    clock: Clock,
    steps: int,
    one_off: Callable[[], tuple[float, str]] | None = None,
    run_length: tuple[int, str] | None = None,
    deferred: list[str] | None = None,
) -> tuple[Trials, Report, list[str]]:
    """`steps` training steps (forward and backward, no optimizer) of a model whose trials
    measure one choice, "base" (the baseline) against "other", on `clock` (the wall clock too)."""
    model = Costly(clock)
    report = Report()
    applied: list[str] = []

    def apply(option: str) -> None:
        applied.append(option)
        clock.apply(option)

    def decided(winner: str, measured: str) -> None:
        report.replace(PassResult.applied("thing", f"{winner}: {measured}"))

    trials = Trials(model, report)
    choice = Choice("thing", ["other", "base"], apply, decided, clock, "base")
    if one_off is not None:
        choice.one_off, choice.best_gain = one_off, 0.5
        choice.deferred = deferred.append if deferred is not None else None
    trials.add(choice)
    if run_length is not None:
        trials.run_length = lambda: run_length
    report.add(PassResult.applied("thing", "pending"))
    report.add(trials.pending())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(choices, "WALL", clock)
        for _ in range(steps):
            trials.run(model, torch.randn(2, 4)).sum().backward()
    return trials, report, applied


def winner_of(trials: Trials) -> str:
    assert trials.done
    return trials.winners["thing"]


def test_a_lead_within_the_noise_keeps_the_baseline_and_one_beyond_it_wins() -> None:
    # A 4% lead on a quiet clock is below the least lead (5%); 12% with +-3% noise per read is
    # beyond the noise; 12% with +-30% is within it: the baseline stays.
    quiet, report, _ = measure(Clock({"base": 1.0, "other": 1 / 1.04}), 30)
    assert winner_of(quiet) == "base", report["thing"].detail
    clear, report, _ = measure(Clock({"base": 1.0, "other": 1 / 1.12}, noise=0.03), 30)
    assert winner_of(clear) == "other"
    line = report["thing"].detail
    assert re.search(r"other 1[1-3]% faster \(beyond the noise: ±\d+%, [2-6] rounds\)", line), line
    noisy, report, _ = measure(Clock({"base": 1.0, "other": 1 / 1.12}, noise=0.3, seed=3), 30)
    assert winner_of(noisy) == "base", report["thing"].detail
    assert "(within the noise: ±" in report["thing"].detail
    figures = report["thing"].figures
    assert figures["lead"] - figures["lead_band"] < timing.MIN_LEAD / 2


@pytest.mark.parametrize(("lead", "expected"), [(0.02, "base"), (0.25, "other")])
def test_the_same_choice_in_repeated_runs_on_a_noisy_clock(lead: float, expected: str) -> None:
    """Ten runs, each with its own +-10% noise per forward and per backward: the same choice in
    9 of 10 at least (the issue's goal). The former rule (the faster median of two samples by a
    5% margin) switched to "other" for the 2% lead in 19% of 100 such runs, this one in 5%
    (benchmarks/trial_noise.py)."""
    winners = [
        winner_of(measure(Clock({"base": 1.0, "other": 1 / (1 + lead)}, 0.1, seed), 30)[0])
        for seed in range(10)
    ]
    assert winners.count(expected) >= 9, winners


def test_rounds_go_on_until_the_outcome_is_settled_and_stop_at_the_most() -> None:
    decisive, _, _ = measure(Clock({"base": 1.0, "other": 0.5}), 30)
    # A warm-up each and two rounds: a 2x lead settles early.
    assert len(decisive.log) == 2 + 2 * 2
    # Rounds alternately 8% and 0% ahead: a 4% lead whose interval straddles 5% is never
    # settled; after MAX_ROUNDS the baseline stays. (Two charges a step: forward, backward.)
    steps = [1.0, 1.0] + [1.0, 1 / 1.08, 1.0, 1.0] * choices.MAX_ROUNDS
    factors = [f for f in steps for _ in range(2)]
    unsettled, report, _ = measure(Clock({"base": 1.0, "other": 1.0}, factors=factors), 40)
    assert len(unsettled.log) == 2 + 2 * choices.MAX_ROUNDS, report["thing"].detail
    assert winner_of(unsettled) == "base"
    figures = report["thing"].figures
    assert figures["base_samples"] == figures["other_samples"] == choices.MAX_ROUNDS


def test_what_the_trials_cost_and_when_it_pays_back() -> None:
    """The cost is every trial step's wall time beyond the winner's median, warm-ups (a
    compile) included; the gain per step is the baseline's median less the winner's."""
    clock = Clock({"base": 1.0, "other": 0.5})
    clock.first["other"] = 20.0  # its warm-up compiles
    trials, report, _ = measure(clock, 12)
    assert winner_of(trials) == "other"
    row = report["trials"]
    # Each step reads the wall clock twice (forward, backward), each read the option's cost:
    # a base step 2 s, an other step 1 s, the other's warm-up 21 s.
    configs = [config["thing"] for _, config in trials.log]
    expected = sum(1.0 for c in configs if c == "base") + 20.0
    assert row.figures["cost_s"] == pytest.approx(expected)
    assert row.figures["gain_s"] == pytest.approx(1.0)
    assert row.figures["payback_step"] == len(trials.log) + expected
    assert f"paid back by step {len(trials.log) + int(expected)}" in row.detail, row.detail
    assert f"cost {timing.duration(expected)} (warm-ups and compiles included)" in row.detail


def test_a_trial_that_cannot_pay_back_within_the_run_is_not_tried() -> None:
    """A one-off cost of 100 s at best halves a 2 s step: 100 steps to pay back, and the run is
    20 steps as far as seen. The other option is never put in force; the choice is deferred
    (a candidate for a later run) and the report says why, with the figures."""
    clock = Clock({"base": 1.0, "other": 0.5})
    deferred: list[str] = []
    trials, report, applied = measure(
        clock, 10, lambda: (100.0, "a cold compile"), (20, "10 batches x 2 epochs"), deferred
    )
    assert winner_of(trials) == "base" and "other" not in applied
    assert len(trials.log) == 2  # the baseline's warm-up and one timed step, for the bound
    line = report["thing"].detail
    assert line.startswith(f"base: {choices.NOT_TRIED}: a cold compile, ~1 min 40 s,"), line
    assert ">= 100 steps at best" in line and "20 steps as far as seen" in line
    assert deferred == [line.removeprefix("base: ")]
    figures = report["thing"].figures
    assert figures["one_off_estimate_s"] == 100 and figures["payback_steps_needed"] == 100
    # A run long enough to repay it: tried.
    trials, _, applied = measure(
        Clock({"base": 1.0, "other": 0.5}), 12, lambda: (100.0, "a cold compile"), (1000, "")
    )
    assert winner_of(trials) == "other" and "other" in applied


def test_every_number_the_trials_lines_show_is_a_figure() -> None:
    trials, report, _ = measure(Clock({"base": 1.0, "other": 0.8}, 0.02), 30)
    assert trials.done
    for name in ("thing", "trials"):
        row = report[name]
        values = list(row.figures.values())
        shown = re.findall(r"(\d+(?:\.\d+)?) ?(ms|s|%)\b", row.detail)
        assert shown, row.detail
        for number, unit in shown:
            scale = {"ms": 1e-3, "s": 1.0, "%": 1e-2}[unit]
            value = float(number) * scale
            close = [v for v in values if v and abs(abs(v) - value) <= 0.051 * max(value, 1e-9)]
            assert close or value == 0, f"{number}{unit} of {name!r} is no figure: {row.figures}"
