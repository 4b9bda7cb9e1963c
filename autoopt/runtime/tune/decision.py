"""`choose()`: measure the candidates (or read the cached decision) and pick the winner."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoopt.runtime.options import Options
from autoopt.runtime.report import PassResult
from autoopt.runtime.trials import timing
from autoopt.runtime.tune import cache as disk_cache
from autoopt.runtime.tune.batches import draw, one_shape
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
# The least lead over the default plan, or a simpler one, that replaces it, whatever the noise
# (`timing.MIN_LEAD`); beyond it the lead must also clear the noise of the steps timed side by
# side (`ahead`): a choice made on noise is cached for good.
NOISE_MARGIN = timing.MIN_LEAD


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
    if candidates is not None and not candidates:
        return Decision(options, PassResult.skipped(NAME, "no candidate plans"))
    drawn, why_not = draw(loader, batches)
    if not drawn:
        if loader is not None:
            warnings.warn(f"autoopt: tune=True stands down: {why_not}", stacklevel=3)
        return Decision(options, PassResult.skipped(NAME, why_not))
    default = None
    if candidates is None:
        default = default_plan(model, options)
        plans = with_default(combinations(model, options, one_shape(drawn)), default)
    else:
        plans = list(candidates)

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
            result = PassResult.applied(NAME, detail)
            result.figures.update(plan_figures(measurements))
            return Decision(
                with_plan(options, plan),
                result,
                plan,
                measurements,
                cache_hit=True,
                cache_path=path,
            )

    started = time.perf_counter()
    measurements, accepted = measure_all(
        model, optimizer, options, plans, drawn, loss_fn, warmup, steps, rtol, default
    )
    cost_s = time.perf_counter() - started
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
    payback, figures = cost_line(measurements, chosen, cost_s)
    detail = (
        f"{chosen[0].label}{speedup}; measured {len(plans)} plan(s) on {len(drawn)} batch(es), "
        f"1 compared + {warmup} warm-up + {steps} timed step(s) each; {payback}\n"
        + table(measurements, chosen[0])
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
    result = PassResult.applied(NAME, detail)
    result.figures.update(figures)
    return Decision(with_plan(options, chosen[0]), result, chosen[0], measurements, cache_path=path)


def cost_line(
    measurements: list[Measurement], chosen: tuple[Plan, Measurement], cost_s: float
) -> tuple[str, dict[str, float]]:
    """What tuning cost (every candidate's copies, warm-ups, compiles and timed steps, by the
    wall clock) and when the chosen plan repays it against the default plan; with the figures
    of every plan."""
    figures = plan_figures(measurements)
    figures["tune_cost_s"] = round(cost_s, 6)
    line = f"tuning took {timing.duration(cost_s)} (compiles included)"
    default = next((m for m in measurements if m.default and m.ok), None)
    mine = chosen[1]
    if default is None or default is mine or not (default.ms_per_step and mine.ms_per_step):
        return f"{line}; the default plan kept: not repaid by a faster step", figures
    gain = (default.ms_per_step - mine.ms_per_step) / 1000
    lead = versus(mine, default)
    figures.update(gain_s=round(gain, 6), lead=round(lead.lead, 4))
    figures["lead_band"] = round(math.expm1(lead.band), 4) if math.isfinite(lead.band) else -1
    if gain <= 0:
        return f"{line}; not faster than the default plan by the median", figures
    payback = math.ceil(figures["tune_cost_s"] / figures["gain_s"])  # as the figures say
    figures["payback_steps"] = payback
    return (
        f"{line}; {timing.verdict(mine.plan, lead)} than the default plan, {timing.duration(gain)} "
        f"a step: repaid after {payback} steps",
        figures,
    )


def plan_figures(measurements: list[Measurement]) -> dict[str, float]:
    """Each measured plan's median step (`<plan>_s`), its noise and its samples."""
    return timing.figures(
        {m.plan: [t / 1000 for t in m.steps_ms] for m in measurements if m.steps_ms}
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
    """The plan to run: the default plan (else the simplest accepted one) unless another is
    ahead of it beyond the noise (`ahead`); among those ahead, the simplest, replaced by a
    faster one only when that one is ahead of it beyond the noise too. So the plan picked is
    never one measured slower than the default, and a lead within the noise of a few steps
    keeps the simpler plan."""
    if not accepted:
        return None
    current = next(((p, m) for p, m in accepted if p == default), None)
    if current is None:
        current = min(accepted, key=_simple_first)
    base = current
    for pm in sorted((pm for pm in accepted if pm is not base), key=_simple_first):
        if ahead(pm[1], base[1]) and ahead(pm[1], current[1]):
            current = pm
    return current


def _simple_first(pm: tuple[Plan, Measurement]) -> tuple[int, float]:
    return complexity(pm[0]), pm[1].ms_per_step or math.inf


def ahead(candidate: Measurement, reference: Measurement) -> bool:
    """Whether `candidate` is faster than `reference` beyond the noise (`timing.compare`: the
    paired ratios of their i-th timed steps, run side by side in interleaved rounds); for
    measurements without steps (an old cache entry), by their medians and MIN_LEAD alone."""
    mine, theirs = candidate.steps_ms, reference.steps_ms
    if mine and len(mine) == len(theirs):
        return versus(candidate, reference).ahead()
    lead = (reference.ms_per_step or math.inf) / (candidate.ms_per_step or math.inf) - 1
    return lead >= NOISE_MARGIN


def versus(candidate: Measurement, reference: Measurement) -> timing.Comparison:
    """`candidate` against `reference` by their side-by-side timed steps."""
    return timing.compare(reference.steps_ms, candidate.steps_ms)


def table(measurements: list[Measurement], chosen: Plan) -> str:
    """The measurements as an aligned text table, the chosen and the default plan marked."""
    rows = [("plan", "ms/step", "noise", "warm-up s", "rel. err", "status")]
    for m in measurements:
        err = max((e for e in (m.output_error, m.loss_error) if e is not None), default=None)
        mark = "  <- chosen" if m.plan == chosen.label and m.ok else ""
        rows.append(
            (
                m.plan + (" (default)" if m.default else ""),
                f"{m.ms_per_step:.2f}" if m.ms_per_step is not None else "-",
                f"±{timing.noise(m.steps_ms):.0%}" if len(m.steps_ms) > 1 else "-",
                f"{m.warmup_s:.2f}" if m.warmup_s is not None else "-",
                f"{err:.2g}" if err is not None else "-",
                m.status + mark,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r[:5], widths, strict=True))
        )
        + "  "
        + r[5]
        for r in rows
    )
