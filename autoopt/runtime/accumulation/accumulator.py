"""The shared counter of one gradient accumulation: which micro-batch of the cycle this is, and
the optimizer `step()` and `zero_grad()` that act only at its ends. The accumulate pass makes
one; root scaling seeds each backward with its share, the micro-batch loader sets its cycles."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Accumulator:
    """The shared counter of one accumulation: `steps` micro-batches per optimizer step.

    With `accumulate=N`, `steps` is N for every cycle and each backward is seeded with 1/N. With
    `accumulate="auto"` the loader drives it (`autoopt.runtime.accumulation.micro_batches`): it sets `steps`
    to the number of parts of each batch it splits (`begin_cycle`) and `part` to the part's
    share of the batch's loss normaliser (rows, or labelled tokens), its backward's seed."""

    steps: int
    auto: bool = False
    step_calls: int = 0  # calls of optimizer.step() by the user's loop
    optimizer_steps: int = 0  # of which reached the real optimizer
    micro_step: int = 0  # calls of step() in the current cycle so far
    part: tuple[int, int] | None = None  # the part's (count, its batch's count) of the normaliser

    @property
    def option(self) -> int | str:
        """The `accumulate=` value this accumulator serves, for messages."""
        return "auto" if self.auto else self.steps

    @property
    def at_cycle_start(self) -> bool:
        """No micro-batch of the current cycle has stepped yet: zero_grad may act."""
        return self.micro_step == 0

    @property
    def at_last_micro_step(self) -> bool:
        """The next backward completes a cycle (the step after it will act)."""
        return self.micro_step == self.steps - 1

    @property
    def seed_fraction(self) -> tuple[int, int]:
        """(numerator, denominator) every backward's seed is multiplied by: 1/N for a fixed N,
        the part's share of its batch for split batches."""
        return self.part if self.part is not None else (1, self.steps)

    def begin_cycle(self, steps: int) -> None:
        """The loader starts a batch of `steps` micro-batches. A cycle left open (the loop did
        not call step() after the previous batch's last part) is closed with a warning."""
        if self.micro_step:
            warnings.warn(
                "autoopt accumulate='auto': optimizer.step() was not called after the last "
                "micro-batch of a batch; accumulate='auto' needs a loop that steps once per batch",
                stacklevel=3,
            )
            self.micro_step = 0
        self.steps = steps

    def wrap_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(step)
        def accumulating_step(*args: Any, **kwargs: Any) -> Any:
            self.step_calls += 1
            self.micro_step += 1
            if self.micro_step < self.steps:
                return None
            self.micro_step = 0
            self.optimizer_steps += 1
            return step(*args, **kwargs)

        return accumulating_step

    def wrap_zero_grad(self, zero_grad: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(zero_grad)
        def accumulating_zero_grad(*args: Any, **kwargs: Any) -> Any:
            if self.at_cycle_start:
                return zero_grad(*args, **kwargs)
            return None

        return accumulating_zero_grad
