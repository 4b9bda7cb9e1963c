"""How often a timed choice switches away from its baseline, by true lead and noise: the trials'
rule (`autoopt.runtime.trials.timing`, run through the real `Trials` mechanism) against the
former rule (the faster median of two timed steps, kept when 5% faster), on a fake clock.

A step of the baseline costs 1, the other option 1 / (1 + lead); each forward and each backward
costs that times a random factor in [1 - noise, 1 + noise] (a seeded stream per run). A rule
that makes the same choice in most runs at a given lead is stable there; the goal of issue 31
is the same plan in >= 9 of 10 runs, so a switch rate <= 10% or >= 90%.

    python -m benchmarks.trial_noise --runs 100
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch
from torch import nn

from autoopt.runtime.report import PassResult, Report
from autoopt.runtime.trials import choices
from autoopt.runtime.trials.choices import Choice, Trials

LEADS = (0.0, 0.02, 0.04, 0.07, 0.10, 0.15, 0.30)
NOISES = (0.05, 0.10, 0.20)


class Clock:
    """Time spent by the model's forward and backward (`charge`), read without advancing."""

    def __init__(self, lead: float, noise: float, seed: int) -> None:
        self.costs = {"base": 1.0, "other": 1 / (1 + lead)}
        self.noise = noise
        self.rng = random.Random(seed)
        self.option = "base"
        self.now = 0.0

    def charge(self) -> None:
        self.now += self.costs[self.option] * (1 + self.rng.uniform(-self.noise, self.noise))

    def __call__(self) -> float:
        return self.now


class Charged(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, clock: Clock) -> torch.Tensor:  # type: ignore[override]
        ctx.clock = clock
        clock.charge()
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        ctx.clock.charge()
        return grad, None


class Costly(nn.Module):
    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.clock = clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Charged.apply(self.lin(x), self.clock)


def trials_rule(lead: float, noise: float, seed: int) -> tuple[bool, int]:
    """(switched, steps the trials took) under autoopt's Trials."""
    clock = Clock(lead, noise, seed)
    model = Costly(clock)
    report = Report()
    trials = Trials(model, report)

    def apply(option: str) -> None:
        clock.option = option

    def decided(winner: str, measured: str) -> None:
        report.replace(PassResult.applied("thing", measured))

    trials.add(Choice("thing", ["other", "base"], apply, decided, clock, "base"))
    report.add(PassResult.applied("thing", "pending"))
    previous, choices.WALL = choices.WALL, clock
    try:
        while not trials.done:
            trials.run(model, torch.randn(2, 4)).sum().backward()
    finally:
        choices.WALL = previous
    return trials.winners["thing"] == "other", len(trials.log)


def former_rule(lead: float, noise: float, seed: int) -> tuple[bool, int]:
    """The rule before issue 31: a warm-up each, up to 2 timed rounds (stopping after one when
    a median leads by 10%), the other option kept when its median is 5% faster."""
    rng = random.Random(seed)
    cost = {"base": 1.0, "other": 1 / (1 + lead)}

    def step(option: str) -> float:
        return sum(cost[option] * (1 + rng.uniform(-noise, noise)) for _ in range(2))

    step("base"), step("other")  # warm-ups
    times: dict[str, list[float]] = {"base": [], "other": []}
    for _ in range(2):
        for option in times:
            times[option].append(step(option))
        base, other = (statistics.median(t) for t in times.values())
        if max(base, other) >= 1.1 * min(base, other):
            break
    rounds = len(times["base"])
    return statistics.median(times["base"]) > 1.05 * statistics.median(
        times["other"]
    ), 2 + 2 * rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    print("| lead | noise | trials: switched | trials: steps | former: switched | former: steps |")
    print("|---:|---:|---:|---:|---:|---:|")
    for lead in LEADS:
        for noise in NOISES:
            ours = [trials_rule(lead, noise, 1000 + s) for s in range(args.runs)]
            theirs = [former_rule(lead, noise, 1000 + s) for s in range(args.runs)]
            print(
                f"| {lead:.0%} | ±{noise:.0%} | {statistics.fmean(o[0] for o in ours):.0%} | "
                f"{statistics.fmean(o[1] for o in ours):.1f} | "
                f"{statistics.fmean(t[0] for t in theirs):.0%} | "
                f"{statistics.fmean(t[1] for t in theirs):.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
