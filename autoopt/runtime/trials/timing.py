"""Cheap measurements on the spot: a pass that cannot know which of a few candidates is faster on
this machine times each on the real work, a few times in turn, and keeps the fastest by median.
Taking turns spreads a burst of load from other processes over every candidate alike."""

from __future__ import annotations

import statistics

# A candidate whose median so far is this many times the best one's is dropped from later turns:
# it cannot win, and every turn it takes costs the user real time.
HOPELESS = 2.0


def median_ms(times_s: list[float]) -> float:
    """The median of `times_s` (seconds), in milliseconds."""
    return statistics.median(times_s) * 1000


def fastest(times_s: dict[str, list[float]]) -> str:
    """The candidate with the lowest median time; on a tie, the one named first."""
    timed = {name: t for name, t in times_s.items() if t}
    return min(timed, key=lambda name: median_ms(timed[name]))


def still_in_the_running(times_s: dict[str, list[float]]) -> list[str]:
    """The candidates worth another turn: those not HOPELESS times slower than the best."""
    best = median_ms(times_s[fastest(times_s)])
    return [name for name, t in times_s.items() if t and median_ms(t) <= HOPELESS * best]


def duration(seconds: float) -> str:
    """A time as a person reads it: '0.663 ms', '36.3 ms', '1.05 s', '2 min 5 s'."""
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def summary(times_s: dict[str, list[float]]) -> str:
    """'fused 0.37 ms (median of 3), default 1.56 ms (1 run)': each candidate's median time and
    how many runs it rests on."""
    return ", ".join(
        f"{name} {duration(median_ms(t) / 1000)} ({_runs(len(t))})"
        for name, t in times_s.items()
        if t
    )


def _runs(n: int) -> str:
    return "1 run" if n == 1 else f"median of {n}"
