"""One mechanism for the choices autoopt measures at the first training step (the layout, amp).

A pass that cannot know which of a few options is faster registers a `Choice` with the model's
`Trials` (`trials_of(ctx)`), the OUTER forward layer that decides them all at once:

- at the first forward in training mode with gradients enabled (not under `no_grad` or
  `inference_mode`: a first evaluation call defers the trials to the first training call, so
  nothing is converted inside the user's grad mode), and never inside another trial;
- on training steps: forward and backward (by `torch.autograd.grad`, so no `.grad` changes), in
  the module's own (training) mode, each on a copy of the call's non-tensor arguments (a cache
  object passed in, which a forward grows, is copied; tensors are shared, detached);
- in a stated order: the choices one after another in registration order (the passes' order:
  layout, then amp), each option timed with the earlier choices at their winners and the later
  ones at their defaults; a configuration already timed is not timed again;
- with everything restored afterwards (`replay.trial_forwards`): parameters, buffers, RNG
  states, train/eval modes; each choice then puts its winner in force (the layout pass moves the
  optimizer state along with the parameters).

An option that changes nothing (the choice's `baseline`: fp32, the user's layout) stays unless
another measures MARGIN faster: within the noise of a few steps a change does not pay. Times are
read by `default_clock` (CPU time with one thread, else wall time). Each option gets
one untimed warm-up (a new layout or dtype builds its kernels at its first call)
and up to ROUNDS timed runs; the trials stop early once one option leads by DECISIVE. The report
line of each choice says what was measured and what the trials cost in all. A trial that raises
stops the trials: every choice keeps its default, and the real forward meets the error (the
layout pass's fallback handles its own)."""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from autoopt.runtime.context import Context, Forward, ForwardLayer, Stage
from autoopt.runtime.errors import error_summary
from autoopt.runtime.loading.batch import tensors_in
from autoopt.runtime.trials import timing
from autoopt.runtime.trials.replay import in_trial, time_forwards

EXTRA = "trials"  # the key of the model's Trials in `Context.extras`
ROUNDS = 2  # timed runs per option at most (after one warm-up each)
MARGIN = 1.05  # how much faster than the baseline an option must measure to replace it


def default_clock() -> float:
    """The trials' clock. With one intra-op thread, this process's CPU time: on a machine shared
    with other processes their load inflates wall times at random (4x on the project's 2-core
    machine), not the CPU time of the work measured. With more threads, wall time: summed
    thread times would favour an option that parallelizes worse."""
    return time.process_time() if torch.get_num_threads() == 1 else time.perf_counter()


# How the trials read the time (when a choice brings no clock of its own); a test injects a
# fake clock here.
CLOCK: Callable[[], float] = default_clock

# Winners forced by name (`forced_winners`): the trials are not timed, so a test of a path that
# depends on the outcome (resume, fallback) is deterministic.
_FORCED: dict[str, str] = {}


@dataclass
class Choice:
    """A measured choice: its options (the first is the default, kept when the trials cannot
    run), how to put one in force, and how to report the outcome."""

    name: str
    options: list[str]
    apply: Callable[[str], None]
    # (winner, what was measured) -> None: record the outcome in the report.
    decided: Callable[[str, str], None]
    # How this choice's trials read the time (a module-level function: the model pickles).
    clock: Callable[[], float] | None = None
    # The option that changes nothing (fp32, the user's layout): it stays unless another is
    # faster by MARGIN, since a change within the noise of a few timed steps does not pay.
    baseline: str | None = None


@dataclass
class Trials:
    """The model's measured choices, decided together at its first training forward."""

    model: nn.Module
    choices: list[Choice] = field(default_factory=list)
    done: bool = False
    cost_s: float | None = None  # what the trials took, once run

    def add(self, choice: Choice) -> None:
        """Register a choice; it is measured after those registered before it."""
        self.choices.append(choice)

    def wrap(self, forward: Forward) -> Forward:
        """`ForwardLayer.wrap`."""
        return functools.partial(self.run, forward)

    def ready(self) -> bool:
        """Whether this call is the one to decide at: a training forward, outside any trial."""
        return (
            not self.done
            and bool(self.choices)
            and self.model.training
            and torch.is_grad_enabled()
            and not torch.is_inference_mode_enabled()
            and not in_trial()
        )

    def run(self, forward: Forward, *args: Any, **kwargs: Any) -> Any:
        """Decide at the first training forward, then run the call as decided."""
        if self.ready():
            self.done = True
            self.decide(forward, args, kwargs)
        return forward(*args, **kwargs)

    def decide(self, forward: Forward, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Measure every choice in order, put the winners in force and report them."""
        start = time.perf_counter()
        winners = {c.name: c.options[0] for c in self.choices}
        measured: dict[str, str] = {}
        try:
            if all(c.name in _FORCED for c in self.choices):
                for c in self.choices:
                    winners[c.name] = _FORCED[c.name]
                    measured[c.name] = "not timed: winner forced (autoopt.runtime.trials.choices)"
            else:
                self._measure(forward, args, kwargs, winners, measured)
        except Exception as err:  # noqa: BLE001 - the real forward meets (and handles) it
            winners = {c.name: c.options[0] for c in self.choices}
            note = f"not measured: a trial failed ({error_summary(err)})"
            measured = {c.name: note for c in self.choices}
        for c in self.choices:
            c.apply(winners[c.name])
        self.cost_s = time.perf_counter() - start
        cost = f"trials at the first training step took {timing.duration(self.cost_s)} in all"
        for c in self.choices:
            c.decided(winners[c.name], f"{measured[c.name]}; {cost}")

    def _measure(
        self,
        forward: Forward,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        winners: dict[str, str],
        measured: dict[str, str],
    ) -> None:
        seen: dict[tuple[str, ...], list[float]] = {}  # configuration -> its timed runs
        for choice in self.choices:
            if choice.name in _FORCED:
                winners[choice.name] = _FORCED[choice.name]
                measured[choice.name] = "not timed: winner forced (autoopt.runtime.trials.choices)"
                continue

            def config(option: str, name: str = choice.name) -> tuple[str, ...]:
                return tuple(option if c.name == name else winners[c.name] for c in self.choices)

            def in_config(option: str, name: str = choice.name) -> Callable[[], Any]:
                def trial() -> Any:
                    for c in self.choices:
                        c.apply(option if c.name == name else winners[c.name])
                    call_args, call_kwargs = trial_arguments(args, kwargs)
                    return forward(*call_args, **call_kwargs)

                return trial

            known = {o: seen[config(o)] for o in choice.options if config(o) in seen}
            fresh = {o: in_config(o) for o in choice.options if o not in known}
            clock = choice.clock or _clock
            times = time_forwards(self.model, fresh, ROUNDS, clock, known=known)
            for option, runs in times.items():
                seen[config(option)] = runs
            winner = timing.fastest(times)
            note = ""
            base = choice.baseline
            if (
                base in times
                and winner != base
                and times[base]
                and timing.median_ms(times[winner]) * MARGIN > timing.median_ms(times[base])
            ):
                winner = base
                note = f"; {base} kept: no option measured {MARGIN - 1:.0%} faster"
            winners[choice.name] = winner
            measured[choice.name] = (
                f"forward and backward at the first training step: {timing.summary(times)}{note}"
            )


def _clock() -> float:
    return CLOCK()


def trial_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A copy of a call's arguments for one trial: containers and other objects copied (a cache
    object the forward grows stays as the user passed it), tensors shared but detached (so no
    backward reaches the user's graph upstream)."""
    memo: dict[int, Any] = {}
    for t in tensors_in((args, kwargs)):
        memo[id(t)] = t.detach()
    try:
        return copy.deepcopy((args, kwargs), memo)
    except Exception as err:  # noqa: BLE001 - an argument that cannot be copied
        raise RuntimeError(f"cannot copy the forward's arguments ({error_summary(err)})") from err


def trials_of(ctx: Context) -> Trials:
    """The model's `Trials`, created (and its OUTER forward layer registered) at the first call."""
    found = ctx.extras.get(EXTRA)
    if found is None:
        found = ctx.extras[EXTRA] = Trials(ctx.model)
        ctx.forward_layers.append(ForwardLayer(EXTRA, Stage.OUTER, found.wrap))
    return found


@contextlib.contextmanager
def forced_winners(**winners: str) -> Iterator[None]:
    """For tests: choices named here take the given option without being timed, e.g.
    `forced_winners(channels_last="contiguous", amp="fp32")`."""
    saved = dict(_FORCED)
    _FORCED.update(winners)
    try:
        yield
    finally:
        _FORCED.clear()
        _FORCED.update(saved)
