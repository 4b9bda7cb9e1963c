"""One mechanism for the choices autoopt measures (the layout, amp): spread over the first real
training steps.

A pass that cannot know which of a few options is faster registers a `Choice` with the model's
`Trials` (`trials_of(ctx)`), an OUTER forward layer (and, with an optimizer, a step layer):

- Each of the first training steps runs in one candidate configuration (a value for every
  choice), and that step's time is the configuration's measurement: no step runs twice, no
  extra forward or backward happens, and every step's update is what the configuration it ran
  under computes (the user's optimizer, data and RNG see exactly the steps of the loop). The
  winners are put in force once every candidate has been seen, at the next training step.
- A step is a training forward (training mode, gradients on, outside `inference_mode`, not
  inside a `replay.trial_forwards` trial) and its backward; with an optimizer, every forward up
  to the next `optimizer.step()` (accumulation), so a configuration changes only between
  updates. A step's time is the time inside the model's forwards and their backwards (from
  the first gradient reaching an output to the end of that backward), read by the clock of the
  choice being measured (`default_clock`: CPU time with one thread, else wall time): the
  user's own code between them (data, loss, logging, the optimizer step, timed by the backends
  pass on the same steps) is not counted.
- In a stated order: the choices one after another in registration order (the passes' order:
  layout, then amp), each option timed with the earlier choices at their winners and the later
  ones at their baselines (the options that change nothing: NCHW, fp32), baseline first, so
  the first training step runs as eager's does (the layout in fp32, then bf16 in the layout
  kept); a configuration already timed is not timed again. A configuration's first step is an
  untimed warm-up (a new layout or dtype builds its kernels at its first call), then up to
  ROUNDS timed steps each, in turns; a choice is decided early once one option leads by
  DECISIVE.
- A switch of configuration puts every choice's option in force (the layout pass moves the
  parameters and the optimizer state together; the fp16 loss scaler is not touched).

An option that changes nothing (the choice's `baseline`: fp32, the user's layout) stays unless
another measures MARGIN faster: within the noise of a few steps a change does not pay. The
report line of each choice says what was measured, which steps ran under which configuration
and what the trials cost (the time of switching, plus what the steps run in configurations not
kept took beyond the winner's median). A step that raises stops the trials: every choice takes
its baseline, and the error goes on to the caller (the layout pass's fallback handles its
own).

`trial_scope` is the other half of the mechanism: work that must leave no trace (tune's
candidate plans on copies, the compile guard's probe) runs inside it, with the parameters,
buffers, train/eval modes and every RNG put back afterwards, and nothing measured nested in it.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from autoopt.runtime.context import Context, Forward, ForwardLayer, Stage, StepLayer
from autoopt.runtime.errors import error_summary
from autoopt.runtime.loading.batch import tensors_in
from autoopt.runtime.trials import timing
from autoopt.runtime.trials.replay import in_trial, trial_forwards

EXTRA = "trials"  # the key of the model's Trials in `Context.extras`
ROUNDS = 2  # timed steps per configuration at most (after one warm-up step each)
MARGIN = 1.05  # how much faster than the baseline an option must measure to replace it
DECISIVE = 1.1  # a choice is decided early once its leader's median is this much faster
# Forwards without an optimizer step after which a step ends anyway (a loop that steps another
# optimizer than the one given to optimize()).
MAX_FORWARDS_PER_STEP = 64


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
_FORCED_NOTE = "not timed: winner forced (autoopt.runtime.trials.choices)"


@dataclass
class Choice:
    """A measured choice: its options, how to put one in force, and how to report the
    outcome."""

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


Config = tuple[str, ...]  # an option for every choice, in registration order


@dataclass
class _Step:
    """One training step under trial: its configuration and what it measured so far."""

    number: int  # 1-based, among the training steps the trials saw
    config: Config
    timed: bool  # False: the configuration's warm-up step
    clock: Callable[[], float]
    seconds: float = 0.0
    forwards: int = 0
    stepped: bool = False  # the optimizer stepped: the next forward starts a new step
    backward_from: float | None = None  # the clock when a backward through it started


@dataclass
class Trials:
    """The model's measured choices, decided on its first training steps."""

    model: nn.Module
    choices: list[Choice] = field(default_factory=list)
    done: bool = False
    cost_s: float | None = None  # what the trials cost, once decided
    steps_optimizer: bool = False  # an optimizer step layer ends each step
    # (training step number, {choice: option}) of every step run under trial, in order.
    log: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    _winners: dict[str, str] = field(default_factory=dict)
    _measured: dict[str, str] = field(default_factory=dict)
    _times: dict[Config, list[float]] = field(default_factory=dict)
    _phase: int = 0  # the choice being measured
    _fresh: list[str] | None = None  # its options not timed before (None: phase not started)
    _rounds: int = 0  # its timed rounds queued so far
    _pending: list[tuple[str, bool]] = field(default_factory=list)  # (option, timed) to run
    _step: _Step | None = None
    _in_force: Config | None = None
    _switch_s: float = 0.0
    _steps_seen: int = 0

    def add(self, choice: Choice) -> None:
        """Register a choice; it is measured after those registered before it."""
        self.choices.append(choice)

    def wrap(self, forward: Forward) -> Forward:
        """`ForwardLayer.wrap`."""
        return functools.partial(self.run, forward)

    def wrap_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """`StepLayer.wrap_step`: an optimizer step ends the step under trial."""
        return functools.partial(self.optimizer_step, step)

    def optimizer_step(self, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The user's `optimizer.step()`; the next training forward starts a new step."""
        out = step(*args, **kwargs)
        if self._step is not None:
            self._step.stepped = True
        return out

    @property
    def winners(self) -> dict[str, str]:
        """The option each choice kept (before the trials end: baselines and forced ones)."""
        return dict(self._winners) or {c.name: _unchanged(c) for c in self.choices}

    def ready(self) -> bool:
        """Whether this call is a training step the trials measure: a training forward,
        outside any trial, while choices are undecided."""
        return (
            not self.done
            and bool(self.choices)
            and self.model.training
            and torch.is_grad_enabled()
            and not torch.is_inference_mode_enabled()
            and not in_trial()
        )

    def run(self, forward: Forward, *args: Any, **kwargs: Any) -> Any:
        """The call, in the configuration of the step under trial (timed), or as decided."""
        if not self.ready():
            return forward(*args, **kwargs)
        if self._step is None or self._step_ended():
            self._next_step()
            if self.done:
                return forward(*args, **kwargs)
        step = self._step
        assert step is not None
        step.forwards += 1
        start = step.clock()
        try:
            out = forward(*args, **kwargs)
        except Exception as err:
            self._abandon(err)
            raise
        step.seconds += step.clock() - start
        self._time_backward(step, out)
        return out

    def _step_ended(self) -> bool:
        step = self._step
        assert step is not None
        return not self.steps_optimizer or step.stepped or step.forwards >= MAX_FORWARDS_PER_STEP

    def _next_step(self) -> None:
        """Close the step under trial, then start the next one, or decide."""
        self._steps_seen += 1
        if self._step is not None and self._step.timed:
            self._times[self._step.config].append(self._step.seconds)
        self._step = None
        if not self._queue():
            self._finish()
            return
        option, timed = self._pending.pop(0)
        choice = self.choices[self._phase]
        config = self._config(option)
        self._put_in_force(config)
        self._step = _Step(self._steps_seen, config, timed, choice.clock or _clock)
        self.log.append((self._steps_seen, self._named(config)))

    def _config(self, option: str) -> Config:
        current = self.choices[self._phase].name
        return tuple(option if c.name == current else self._winners[c.name] for c in self.choices)

    def _named(self, config: Config) -> dict[str, str]:
        return {c.name: option for c, option in zip(self.choices, config, strict=True)}

    def _queue(self) -> bool:
        """Queue the next steps to run; False once every choice is decided."""
        if not self._winners:  # the first training step: baselines, forced winners
            self._winners = {c.name: _unchanged(c) for c in self.choices}
            for c in self.choices:
                if c.name in _FORCED:
                    self._winners[c.name] = _FORCED[c.name]
                    self._measured[c.name] = _FORCED_NOTE
        while not self._pending:
            if self._phase == len(self.choices):
                return False
            choice = self.choices[self._phase]
            if choice.name in _FORCED:
                self._phase += 1
                continue
            if self._fresh is None:  # start measuring this choice: a warm-up step each
                # The baseline first: the first training step runs as eager's does.
                options = sorted(choice.options, key=lambda o: o != choice.baseline)
                self._fresh = [o for o in options if self._config(o) not in self._times]
                for option in self._fresh:
                    self._times[self._config(option)] = []
                self._pending = [(o, False) for o in self._fresh]
                self._rounds = 0
                continue
            times = self._phase_times()
            if not self._fresh or (self._rounds and (self._rounds == ROUNDS or _decisive(times))):
                self._decide(choice, times)
                self._phase += 1
                self._fresh = None
                continue
            self._rounds += 1
            self._pending = [(o, True) for o in self._fresh]
        return True

    def _phase_times(self) -> dict[str, list[float]]:
        choice = self.choices[self._phase]
        return {o: self._times[self._config(o)] for o in choice.options}

    def _decide(self, choice: Choice, times: dict[str, list[float]]) -> None:
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
        self._winners[choice.name] = winner
        self._measured[choice.name] = (
            f"forward and backward on the first training steps: {timing.summary(times)}{note}"
        )

    def _put_in_force(self, config: Config) -> None:
        if config == self._in_force:
            return
        start = time.perf_counter()
        for c, option in zip(self.choices, config, strict=True):
            c.apply(option)
        self._in_force = config
        self._switch_s += time.perf_counter() - start

    def _finish(self) -> None:
        """Put the winners in force and report what was measured, on which steps, at what
        cost."""
        self.done = True
        final = tuple(self._winners[c.name] for c in self.choices)
        self._put_in_force(final)
        extra = 0.0  # what the timed steps in other configurations took beyond the winner's
        if self._times.get(final):
            best = timing.median_ms(self._times[final]) / 1000
            extra = sum(
                max(t - best, 0.0) for cfg, ts in self._times.items() if cfg != final for t in ts
            )
        self.cost_s = self._switch_s + extra
        for c in self.choices:
            c.decided(self._winners[c.name], f"{self._measured[c.name]}; {self.summary()}")

    def summary(self) -> str:
        """Which steps ran under which configuration and what the trials cost."""
        if not self.log:
            return "no training step ran under trial"
        runs: list[str] = []
        for number, config in self.log:
            label = "+".join(config.values())
            if runs and runs[-1].endswith(f" {label}"):
                first = runs[-1].split(" ", 1)[0].split("-")[0]
                runs[-1] = f"{first}-{number} {label}"
            else:
                runs.append(f"{number} {label}")
        cost = timing.duration(self.cost_s or 0.0)
        return (
            f"trials on training steps 1-{self.log[-1][0]} ({', '.join(runs)}), the winners "
            f"from step {self.log[-1][0] + 1}; the trials cost {cost} (switching, and the "
            f"steps in the configurations not kept beyond the winner's time)"
        )

    def _abandon(self, err: BaseException) -> None:
        """A step under trial raised: every choice takes its baseline (what changes nothing),
        the trials stop."""
        self.done = True
        self._step = None
        self._put_in_force(tuple(_unchanged(c) for c in self.choices))
        note = f"not measured: a step under trial failed ({error_summary(err)})"
        for c in self.choices:
            c.decided(_unchanged(c), note)

    def _time_backward(self, step: _Step, out: Any) -> None:
        """Count the backward through `out` in the step's time: from the first gradient that
        reaches an output to the end of that backward."""
        for t in tensors_in(out):
            if t.requires_grad:
                t.register_hook(functools.partial(self._backward_started, step))

    def _backward_started(self, step: _Step, grad: torch.Tensor) -> None:
        if step.backward_from is None and step is self._step:
            step.backward_from = step.clock()
            engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]
            engine.queue_callback(functools.partial(self._backward_ended, step))

    @staticmethod
    def _backward_ended(step: _Step) -> None:
        if step.backward_from is not None:
            step.seconds += step.clock() - step.backward_from
            step.backward_from = None


def _unchanged(choice: Choice) -> str:
    """The choice's option that changes nothing (its baseline), else its first option."""
    return choice.baseline if choice.baseline is not None else choice.options[0]


def _decisive(times: dict[str, list[float]]) -> bool:
    medians = sorted(timing.median_ms(t) for t in times.values() if t)
    return len(medians) < 2 or medians[1] >= DECISIVE * medians[0]


def _clock() -> float:
    return CLOCK()


# model -> its Trials (`of_model`), for the report's readers and tests.
_BY_MODEL: weakref.WeakKeyDictionary[nn.Module, Trials] = weakref.WeakKeyDictionary()


def trials_of(ctx: Context) -> Trials:
    """The model's `Trials`, created (and its OUTER forward layer, and with an optimizer its
    step layer, registered) at the first call."""
    found = ctx.extras.get(EXTRA)
    if found is None:
        found = ctx.extras[EXTRA] = _BY_MODEL[ctx.model] = Trials(ctx.model)
        ctx.forward_layers.append(ForwardLayer(EXTRA, Stage.OUTER, found.wrap))
        if ctx.optimizer is not None:
            found.steps_optimizer = True
            ctx.step_layers.append(StepLayer(EXTRA, found.wrap_step))
    return found


def of_model(model: nn.Module) -> Trials | None:
    """The `Trials` of a model `optimize()` returned (None: it measures nothing): its `log`
    says which training steps ran under which configuration."""
    return _BY_MODEL.get(model)


@contextlib.contextmanager
def rng_preserved(generators: Sequence[torch.Generator] = ()) -> Iterator[None]:
    """Leave torch's (CPU and CUDA), Python's and numpy's RNGs and `generators` as they were."""
    py_state = random.getstate()
    try:
        import numpy as np

        np_state: Any = np.random.get_state()
    except ImportError:
        np, np_state = None, None
    gen_states = [(g, g.get_state()) for g in generators]
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py_state)
            if np is not None:
                np.random.set_state(np_state)
            for gen, state in gen_states:
                gen.set_state(state)


@contextlib.contextmanager
def trial_scope(model: nn.Module, generators: Sequence[torch.Generator] = ()) -> Iterator[None]:
    """Work inside leaves no trace on `model` or the process: its parameters, buffers and
    train/eval modes, torch's (CPU and CUDA), Python's and numpy's RNGs and `generators` are put
    back afterwards; it runs with gradients on, outside inference mode, and counts as a trial
    (`replay.in_trial`), so nothing that measures on a first real step (these trials, the
    checkpoint planner, the compile guard's probe) runs nested in it. Tune measures its plans
    on copies inside it."""
    with rng_preserved(generators), trial_forwards(model, backward=True):
        yield


@contextlib.contextmanager
def forced_winners(**winners: str) -> Iterator[None]:
    """For tests: choices named here take the given option without being timed, e.g.
    `forced_winners(channels_last="contiguous", amp="fp32")`; they are read at the first
    training step, so the context must be open then."""
    saved = dict(_FORCED)
    _FORCED.update(winners)
    try:
        yield
    finally:
        _FORCED.clear()
        _FORCED.update(saved)
