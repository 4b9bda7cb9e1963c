"""`choose()`: measure the candidates (or read the cached decision) and pick the winner."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoopt.runtime.options import Options
from autoopt.runtime.report import PassResult
from autoopt.runtime.tune import cache as disk_cache
from autoopt.runtime.tune.batches import draw
from autoopt.runtime.tune.loss import LossFn
from autoopt.runtime.tune.measure import DIFFERS, Measurement, measure_all
from autoopt.runtime.tune.plans import (
    REFERENCE,
    Plan,
    combinations,
    complexity,
    default_plan,
    find,
    with_default,
    with_plan,
)

NAME = "tune"
# A plan must beat the default plan, or a simpler one, by more than this to be chosen:
# differences below it are within the run-to-run noise of a few timed steps, and a choice made on
# noise is cached for good.
NOISE_MARGIN = 0.03


@dataclass
class Decision:
    """The outcome of `choose()`: the options to run with and the report entry saying why."""

    options: Options
    result: PassResult
    plan: Plan | None = None
    measurements: list[Measurement] = field(default_factory=list)
    cache_hit: bool = False
    cache_path: Path | None = None


def choose(
    model: nn.Module,
    loader: Any,
    optimizer: torch.optim.Optimizer | None,
    options: Options,
    *,
    candidates: Sequence[Plan] | None = None,
    loss_fn: LossFn | None = None,
    batches: int = 4,
    warmup: int = 2,
    steps: int = 5,
    rtol: float = 0.05,
    cache: bool = True,
) -> Decision:
    """Measure candidate plans on copies and return the options `optimize()` should use.

    `options` are the user's; the returned `Decision.options` equal them with each searched
    "auto" option replaced by the chosen plan's value. Never raises because a candidate failed:
    when nothing can be measured, the user's options come back unchanged with a skipped or failed
    report entry. `loss_fn(outputs, target)` replaces the inferred loss; `candidates` replaces
    the search space, default plan included (eager fp32 is always measured first as the
    reference)."""
    if steps < 1 or warmup < 0 or batches < 1:
        raise ValueError("tune needs steps >= 1, warmup >= 0 and batches >= 1")
    default = None
    if candidates is None:
        default = default_plan(model, options)
        plans = with_default(combinations(model, options), default)
    else:
        plans = list(candidates)
    if not plans:
        return Decision(options, PassResult.skipped(NAME, "no candidate plans"))
    drawn, why_not = draw(loader, batches)
    if not drawn:
        if loader is not None:
            warnings.warn(f"autoopt: tune=True stands down: {why_not}", stacklevel=3)
        return Decision(options, PassResult.skipped(NAME, why_not))

    path = disk_cache.cache_path() if cache else None
    key = disk_cache.decision_key(model, optimizer, drawn[0], options, plans)
    if path is not None:
        entry = disk_cache.read(path).get(key)
        plan = find(plans, entry["plan"]) if entry else None
        if entry and plan is not None:
            measurements = [Measurement(**m) for m in entry["measurements"]]
            detail = (
                f"{plan.label} (cached {entry['created']} in {path}; delete it to re-measure)\n"
                + table(measurements, plan)
            )
            return Decision(
                with_plan(options, plan),
                PassResult.applied(NAME, detail),
                plan,
                measurements,
                cache_hit=True,
                cache_path=path,
            )

    measurements, accepted = measure_all(
        model, optimizer, options, plans, drawn, loss_fn, warmup, steps, rtol, default
    )
    chosen = pick(accepted, default)
    disagreement = all_disagree(measurements)
    if disagreement:
        warnings.warn(f"autoopt: {disagreement}", stacklevel=3)
    if chosen is None:
        errors = "; ".join(f"{m.plan}: {m.status}" for m in measurements)
        return Decision(
            options,
            PassResult.failed(
                NAME,
                f"no candidate could be measured ({errors})"
                + (f"\n{disagreement}" if disagreement else ""),
                "the defaults",
            ),
            measurements=measurements,
        )
    eager = next((m for m in measurements if m.plan == REFERENCE.label and m.ok), None)
    speedup = ""
    if eager is not None and eager.ms_per_step and chosen[1].ms_per_step:
        speedup = f", {eager.ms_per_step / chosen[1].ms_per_step:.2f}x vs fp32 eager"
    detail = (
        f"{chosen[0].label}{speedup}; measured {len(plans)} plan(s) on {len(drawn)} batch(es), "
        f"{warmup} warm-up + {steps} timed step(s) each\n" + table(measurements, chosen[0])
    )
    if disagreement:
        detail += f"\n{disagreement}"
    if path is not None:
        disk_cache.write(
            path,
            key,
            {
                "plan": chosen[0].label,
                "created": _dt.datetime.now().isoformat(timespec="seconds"),
                "measurements": [dataclasses.asdict(m) for m in measurements],
            },
        )
    return Decision(
        with_plan(options, chosen[0]),
        PassResult.applied(NAME, detail),
        chosen[0],
        measurements,
        cache_path=path,
    )


def all_disagree(measurements: list[Measurement]) -> str:
    """The sentence to warn with when every candidate other than eager fp32 was rejected for
    results that differ from it (naming the largest difference), else ""."""
    others = [m for m in measurements if m.plan != REFERENCE.label]
    if not others or not all(m.status.startswith(DIFFERS) for m in others):
        return ""
    worst = max(others, key=lambda m: max(m.output_error or 0.0, m.loss_error or 0.0))
    error = max(worst.output_error or 0.0, worst.loss_error or 0.0)
    return (
        f"tune rejected every plan because its results differ from fp32 eager on the same batch "
        f"(largest: {worst.plan} by {error:.3g}); dropout was off and every candidate started "
        "from the same RNG state, so either the plans change this model's results beyond the "
        "tolerance or its forward is not repeatable (randomness outside torch's RNG, state that "
        "changes at each call); no plan other than fp32 eager could be verified"
    )


def pick(
    accepted: list[tuple[Plan, Measurement]], default: Plan | None = None
) -> tuple[Plan, Measurement] | None:
    """The fastest plan, unless the default plan or a simpler one is within NOISE_MARGIN of it
    (the default first). Another plan replaces an accepted default only when it also beat it
    step for step: the median of their paired step-time ratios is below 1 - NOISE_MARGIN. So
    the plan picked is never one measured slower than the default."""
    base = next((m for p, m in accepted if p == default), None)
    if base is not None:
        accepted = [(p, m) for p, m in accepted if p == default or beats(m, base)]
    if not accepted:
        return None
    fastest = min(m.ms_per_step or math.inf for _, m in accepted)
    close = [
        (p, m) for p, m in accepted if (m.ms_per_step or math.inf) <= fastest * (1 + NOISE_MARGIN)
    ]
    return min(
        close,
        key=lambda pm: (pm[0] != default, complexity(pm[0]), pm[1].ms_per_step or math.inf),
    )


def beats(candidate: Measurement, default: Measurement) -> bool:
    """Whether `candidate` was faster than `default` by more than NOISE_MARGIN: by the median
    of the ratios of their i-th timed steps (side by side when the rounds were interleaved),
    else, for measurements without steps (an old cache entry), by their medians."""
    mine, theirs = candidate.steps_ms, default.steps_ms
    if mine and len(mine) == len(theirs) and all(theirs):
        ratio = statistics.median(c / d for c, d in zip(mine, theirs, strict=True))
    else:
        ratio = (candidate.ms_per_step or math.inf) / (default.ms_per_step or math.inf)
    return ratio < 1 - NOISE_MARGIN


def table(measurements: list[Measurement], chosen: Plan) -> str:
    """The measurements as an aligned text table, the chosen and the default plan marked."""
    rows = [("plan", "ms/step", "warm-up s", "rel. err", "status")]
    for m in measurements:
        err = max((e for e in (m.output_error, m.loss_error) if e is not None), default=None)
        mark = "  <- chosen" if m.plan == chosen.label and m.ok else ""
        rows.append(
            (
                m.plan + (" (default)" if m.default else ""),
                f"{m.ms_per_step:.2f}" if m.ms_per_step is not None else "-",
                f"{m.warmup_s:.2f}" if m.warmup_s is not None else "-",
                f"{err:.2g}" if err is not None else "-",
                m.status + mark,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r[:4], widths, strict=True))
        )
        + "  "
        + r[4]
        for r in rows
    )
