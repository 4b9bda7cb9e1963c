"""Cheap measurements on the spot, and the rule every timed choice decides by.

A pass that cannot know which of a few candidates is faster on this machine times each on the
real work, in turns (a burst of load from other processes then falls on every candidate alike),
several times each. One sample is a guess: a step's time moves by 5-30% on a shared machine,
and a choice made on one sample flipped between two runs of the same script. So a choice is made
on repeated samples and states their noise, and a change is kept only when it is ahead beyond
that noise (`Comparison.ahead`); otherwise the simpler option (the one that changes nothing)
stays, so the same script on the same machine makes the same choice.

The rule (`compare`): the candidate and the reference are timed side by side, one sample each
per round, so load that came and went between rounds cancels in their ratio. The lead is the
geometric mean of the paired ratios, less one; the noise is the spread of their logarithms
(relative standard deviation); the band is the half-width of the one-sided 97.5% interval of the
lead (Student's t over the rounds: wide with few rounds, narrower with more). A candidate is
ahead when its lead is MIN_LEAD at least and the bottom of its interval half of that at least;
the outcome is settled when it is ahead, or when even the interval's top is below MIN_LEAD.
On a fake clock with +-10% noise on each forward and backward, a candidate 2% ahead replaced
the reference in 5% of 100 runs (the former rule, the faster median of two steps by 5%: 19%),
one 15% ahead in 96% (benchmarks/trial_noise.py; docs/benchmarks/trials.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# A candidate whose median so far is this many times the best one's is dropped from later turns:
# it cannot win, and every turn it takes costs the user real time.
HOPELESS = 2.0
# The least lead that replaces the simpler option, whatever the noise: below it a change does
# not pay for the steps spent measuring it (T5 ran 0.99x of eager when a trial kept bf16 for a
# 2% lead).
MIN_LEAD = 0.05
# Student's t, one-sided 97.5%, by degrees of freedom (rounds - 1); 1.96 beyond.
_T975 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14)


def median_ms(times_s: Sequence[float]) -> float:
    """The median of `times_s` (seconds), in milliseconds."""
    return statistics.median(times_s) * 1000


def noise(values: Sequence[float]) -> float:
    """The relative spread of `values`: the standard deviation of their logarithms (0 for
    fewer than two)."""
    logs = [math.log(v) for v in values if v > 0]
    return statistics.stdev(logs) if len(logs) >= 2 else 0.0


@dataclass(frozen=True)
class Comparison:
    """A candidate against a reference, from samples taken side by side: `lead` is how much
    faster the candidate is (0.2: the reference takes 1.2x its time; negative: slower), `noise`
    the relative spread of the paired ratios, `band` the half-width of the one-sided 97.5%
    interval of the lead (relative), `samples` how many pairs."""

    lead: float
    noise: float
    samples: int
    band: float

    @property
    def low(self) -> float:
        """The bottom of the lead's interval."""
        return (1 + self.lead) * math.exp(-self.band) - 1

    @property
    def high(self) -> float:
        """The top of the lead's interval."""
        return (1 + self.lead) * math.exp(self.band) - 1

    def ahead(self) -> bool:
        """Whether the candidate is ahead beyond the noise: its lead MIN_LEAD at least, the
        bottom of its interval half of that at least."""
        return self.samples >= 2 and self.low >= MIN_LEAD / 2 and self.lead >= MIN_LEAD

    def settled(self) -> bool:
        """Whether more samples would likely not change `ahead()`."""
        return self.ahead() or (self.samples >= 2 and self.high < MIN_LEAD)


def compare(reference: Sequence[float], candidate: Sequence[float]) -> Comparison:
    """`candidate` against `reference`, their i-th samples taken side by side (same round)."""
    pairs = min(len(reference), len(candidate))
    logs = [
        math.log(r / c)
        for r, c in zip(reference[:pairs], candidate[:pairs], strict=True)
        if r > 0 and c > 0
    ]
    if not logs:
        return Comparison(0.0, 0.0, 0, math.inf)
    spread = statistics.stdev(logs) if len(logs) >= 2 else math.inf
    t = _T975[len(logs) - 2] if 2 <= len(logs) < len(_T975) + 2 else 1.96
    band = t * spread / math.sqrt(len(logs))
    return Comparison(math.exp(statistics.fmean(logs)) - 1, spread, len(logs), band)


def fastest(times_s: dict[str, list[float]]) -> str:
    """The candidate with the lowest median time; on a tie, the one named first."""
    timed = {name: t for name, t in times_s.items() if t}
    return min(timed, key=lambda name: median_ms(timed[name]))


def still_in_the_running(times_s: dict[str, list[float]]) -> list[str]:
    """The candidates worth another turn: those not HOPELESS times slower than the best."""
    best = median_ms(times_s[fastest(times_s)])
    return [name for name, t in times_s.items() if t and median_ms(t) <= HOPELESS * best]


def choose(times_s: dict[str, list[float]], simplest: str) -> tuple[str, Comparison | None]:
    """The fastest candidate if it is ahead of `simplest` beyond the noise (their samples taken
    side by side), else `simplest`; and that comparison (None when `simplest` won outright or
    was not timed). A `simplest` out of the running (HOPELESS times slower, so timed less) is
    not kept: no noise explains that gap."""
    winner = fastest(times_s)
    if winner == simplest or not times_s.get(simplest):
        return winner, None
    versus = compare(times_s[simplest], times_s[winner])
    if simplest not in still_in_the_running(times_s):
        return winner, versus
    return (winner if versus.ahead() else simplest), versus


def verdict(candidate: str, versus: Comparison) -> str:
    """'bf16 2.5x faster (beyond the noise: ±4%, 3 rounds)', '... (within the noise: ...)'."""
    if versus.lead >= 0.5:
        lead = f"{versus.lead + 1:.2g}x faster"
    else:
        lead = f"{abs(versus.lead):.0%} {'faster' if versus.lead >= 0 else 'slower'}"
    if versus.samples < 2:
        return f"{candidate} {lead} (1 round)"
    where = "beyond" if versus.ahead() else "within"
    return f"{candidate} {lead} ({where} the noise: ±{_band(versus)}, {versus.samples} rounds)"


def _band(versus: Comparison) -> str:
    return f"{math.expm1(versus.band):.0%}" if math.isfinite(versus.band) else "?"


def duration(seconds: float) -> str:
    """A time as a person reads it: '0.663 ms', '36.3 ms', '1.05 s', '2 min 5 s'."""
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def summary(times_s: dict[str, list[float]]) -> str:
    """'fused 0.37 ms ±2% (3 steps), default 1.56 ms (1 step)': each candidate's median time,
    its noise and how many samples it rests on."""
    return ", ".join(
        f"{name} {duration(median_ms(t) / 1000)}{_noise(t)} ({_steps(len(t))})"
        for name, t in times_s.items()
        if t
    )


def figures(times_s: dict[str, list[float]]) -> dict[str, float]:
    """`summary` as fields: `<name>_s` (median), `<name>_noise`, `<name>_samples`."""
    found: dict[str, float] = {}
    for name, t in times_s.items():
        if t:
            found[f"{name}_s"] = round(statistics.median(t), 6)
            found[f"{name}_noise"] = round(noise(t), 4)
            found[f"{name}_samples"] = len(t)
    return found


def _noise(times: Sequence[float]) -> str:
    return f" ±{noise(times):.0%}" if len(times) > 1 else ""


def _steps(n: int) -> str:
    return "1 step" if n == 1 else f"{n} steps"
