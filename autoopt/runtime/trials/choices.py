"""One mechanism for the choices autoopt measures (the layout, amp, a first CPU compile): spread
over the first real training steps.

A pass that cannot know which of a few options is faster registers a `Choice` with the model's
`Trials` (`trials_of(ctx)`), an OUTER forward layer (and, with an optimizer, a step layer):

- Each of the first training steps runs in one candidate configuration (a value for every
  choice), and that step's time is the configuration's measurement: no step runs twice, no
  extra forward or backward happens, and every step's update is what the configuration it ran
  under computes (the user's optimizer, data and RNG see exactly the steps of the loop). The
  winners are put in force once every choice is decided, at the next training step.
- A step is a training forward (training mode, gradients on, outside `inference_mode`, not
  inside a `replay.trial_forwards` trial) and its backward; with an optimizer, every forward up
  to the next `optimizer.step()` (accumulation), so a configuration changes only between
  updates. A step's time is the time inside the model's forwards and their backwards (from
  the first gradient reaching an output to the end of that backward), read by the clock of the
  choice being measured (`default_clock`: CPU time with one thread, else wall time) for the
  decision, and by the wall clock for the cost: the user's own code between them (data, loss,
  logging, the optimizer step, timed by the backends pass on the same steps) is not counted.
- In a stated order: the choices one after another in registration order (the passes' order:
  layout, amp, compile), each option timed with the earlier choices at their winners and the
  later ones at their baselines (the options that change nothing: NCHW, fp32, eager), baseline
  first, so the first training step runs as eager's does. A configuration's first step is an
  untimed warm-up (a new layout or dtype builds its kernels, a compile compiles), then the
  options take turns, one timed step each per round, baseline included in every round so each
  round's samples are taken side by side.

Decisions with a noise band (`timing.compare`): after each round, every option is compared with
the baseline by their paired ratios (the lead, the noise of the ratios and the interval of the
lead). An option replaces the baseline only when it is ahead beyond the noise (the whole
interval above zero, and `timing.MIN_LEAD` at least); otherwise the baseline stays, so the same
script makes the same choice. Rounds go on until the outcome is settled (ahead, or even the
interval's top below MIN_LEAD) after at least `ROUNDS` rounds (2 when one option leads by
`DECISIVE`), at most `MAX_ROUNDS`; an option measured `timing.HOPELESS` times slower over two
rounds takes no more turns.

Trials that pay: a choice whose options have a one-off cost (a cold compile) says so with an
estimate made before it is paid (`Choice.one_off`); when the run as far as seen (`run_length`:
the loader's length times the epochs started) cannot repay it even at the choice's best gain
per step, the choice is not tried on this run: its baseline stays, the report says why, and
`Choice.deferred` records it as a candidate for a later run. What the trials cost is measured
(by the wall clock: the user waits for it, compiles included): the switches, the warm-up steps
and every trial step beyond the winner's median time; with the winner's gain per step over the
all-baseline configuration, the report says when that cost is paid back.

A trial is paid once: with a compile cache directory, the winners of the choices measured are
recorded there (`record.TrialRecord`, keyed by the model's structure, torch and the hardware),
and a later run takes them at its first training step without timing; the report says so.

The report: each choice's row says in one short line what it measured (median, noise and
samples of every option, the lead and the verdict), the `trials` row says the schedule once
(which steps ran what, the cost, the payback), and every number in them is a field of the row's
`figures`. A step that raises stops the trials: every choice takes its baseline, and the error
goes on to the caller (the layout pass's fallback handles its own).

`trial_scope` is the other half of the mechanism: work that must leave no trace (tune's
candidate plans on copies, the compile guard's probe) runs inside it, with the parameters,
buffers, train/eval modes and every RNG put back afterwards, and nothing measured nested in it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import statistics
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
from autoopt.runtime.report import PassResult, Report
from autoopt.runtime.trials import timing
from autoopt.runtime.trials.record import TrialRecord
from autoopt.runtime.trials.replay import in_trial, trial_forwards

EXTRA = "trials"  # the key of the model's Trials in `Context.extras`
NAME = "trials"  # its row in the report
ROUNDS = 3  # timed rounds before a decision (2 when an option leads by DECISIVE)
MAX_ROUNDS = 6  # timed rounds at most: an unsettled outcome keeps the baseline then
DECISIVE = 0.5  # a lead (50% faster) that settles a choice after 2 rounds
# Forwards without an optimizer step after which a step ends anyway (a loop that steps another
# optimizer than the one given to optimize()).
MAX_FORWARDS_PER_STEP = 64


def default_clock() -> float:
    """The trials' clock. With one intra-op thread, or on a machine busier than its cores (the
    load average when this process first asked), this process's CPU time: other processes'
    load inflates wall times at random (4x on the project's 2-core machine), not the CPU time
    of the work measured. Otherwise wall time: summed thread times would favour an option that
    parallelizes worse."""
    if torch.get_num_threads() == 1 or _busy():
        return time.process_time()
    return time.perf_counter()


@functools.cache
def _busy() -> bool:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        return os.getloadavg()[0] > cores
    except OSError:  # no load average here
        return False


# How the trials read the time (when a choice brings no clock of its own); a test injects a
# fake clock here.
CLOCK: Callable[[], float] = default_clock
# How the trials read the wall time their cost is counted in; a test injects a fake clock here.
WALL: Callable[[], float] = time.perf_counter

# Winners forced by name (`forced_winners`): the trials are not timed, so a test of a path that
# depends on the outcome (resume, fallback) is deterministic.
_FORCED: dict[str, str] = {}
_FORCED_NOTE = "not timed: winner forced (autoopt.runtime.trials.choices)"
NOT_TRIED = "not tried on this run"  # how the note of a choice that would not pay back starts
RECORDED = "taken from this machine's record of an earlier run"

# How long the run is as far as seen: (training steps, how that was counted), or None.
RunLength = Callable[[], "tuple[int, str] | None"]


@dataclass
class Choice:
    """A measured choice: its options, how to put one in force, and how to report the
    outcome."""

    name: str
    options: list[str]
    apply: Callable[[str], None]
    # (winner, what was measured: one short line) -> None: record the outcome in the report.
    decided: Callable[[str, str], None]
    # How this choice's trials read the time (a module-level function: the model pickles).
    clock: Callable[[], float] | None = None
    # The option that changes nothing (fp32, the user's layout, eager): it stays unless another
    # is ahead beyond the noise.
    baseline: str | None = None
    # The one-off cost of trying the other options (a cold compile), estimated before it is
    # paid: () -> (seconds, what it is and how it was estimated). None: no one-off cost.
    one_off: Callable[[], tuple[float, str]] | None = None
    # The largest share of a step the other options could save: bounds the payback of one_off.
    best_gain: float = 1.0
    # Called with the reason when the choice is not tried on this run (a candidate for a later
    # run, e.g. recorded in a cache).
    deferred: Callable[[str], None] | None = None


Config = tuple[str, ...]  # an option for every choice, in registration order


@dataclass
class _Step:
    """One training step under trial: its configuration and what it measured so far."""

    number: int  # 1-based, among the training steps the trials saw
    config: Config
    option: str  # the option of the choice being measured
    timed: bool  # False: the configuration's warm-up step
    clock: Callable[[], float]
    seconds: float = 0.0  # by `clock`, for the decision
    wall: float = 0.0  # by the wall clock, for the cost
    forwards: int = 0
    stepped: bool = False  # the optimizer stepped: the next forward starts a new step
    backward_from: tuple[float, float] | None = None  # (clock, wall) when a backward started


@dataclass
class Trials:
    """The model's measured choices, decided on its first training steps."""

    model: nn.Module
    report: Report | None = None
    choices: list[Choice] = field(default_factory=list)
    done: bool = False
    cost_s: float | None = None  # what the trials cost (wall seconds), once decided
    steps_optimizer: bool = False  # an optimizer step layer ends each step
    # How long the run is as far as seen (None: unknown); set by optimize() from the loader.
    run_length: RunLength | None = None
    # Winners of an earlier run here, taken without timing; set by optimize() from the cache.
    record: TrialRecord | None = None
    # (training step number, {choice: option}) of every step run under trial, in order.
    log: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    _winners: dict[str, str] = field(default_factory=dict)
    _notes: dict[str, str] = field(default_factory=dict)  # choice -> its short line
    _figures: dict[str, dict[str, float]] = field(default_factory=dict)  # choice -> fields
    _phases: list[tuple[str, int, int]] = field(default_factory=list)  # (choice, first, last)
    _phase: int = 0  # the choice being measured
    _running: list[str] | None = None  # its options still taking turns (None: not started)
    _samples: dict[str, list[float]] = field(default_factory=dict)  # its timed steps, by option
    _rounds: int = 0  # its timed rounds queued so far
    _probed: bool = False  # its baseline was timed alone, for the payback bound
    _pending: list[tuple[str, bool]] = field(default_factory=list)  # (option, timed) to run
    _step: _Step | None = None
    _steps: list[_Step] = field(default_factory=list)  # the steps run under trial, closed
    _walls: dict[Config, list[float]] = field(default_factory=dict)  # timed wall, by config
    _warmed: set[Config] = field(default_factory=set)
    _in_force: Config | None = None
    _switch_s: float = 0.0
    _steps_seen: int = 0
    _from_record: set[str] = field(default_factory=set)
    _measured: set[str] = field(default_factory=set)  # choices timed on this run

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

    def pending(self) -> PassResult:
        """The report row until the trials are decided."""
        names = ", ".join(c.name for c in self.choices)
        return PassResult.applied(
            NAME,
            f"{names}: measured on the first training steps, in turns, baseline first (as "
            "eager); the winners follow",
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
        start, wall = step.clock(), WALL()
        try:
            out = forward(*args, **kwargs)
        except Exception as err:
            self._abandon(err)
            raise
        step.seconds += step.clock() - start
        step.wall += WALL() - wall
        self._time_backward(step, out)
        return out

    def _step_ended(self) -> bool:
        step = self._step
        assert step is not None
        return not self.steps_optimizer or step.stepped or step.forwards >= MAX_FORWARDS_PER_STEP

    def _next_step(self) -> None:
        """Close the step under trial, then start the next one, or decide."""
        self._steps_seen += 1
        step = self._step
        if step is not None:
            self._steps.append(step)
            if step.timed:
                if step.option in self._samples:  # not the payback bound's probe
                    self._samples[step.option].append(step.seconds)
                self._walls.setdefault(step.config, []).append(step.wall)
        self._step = None
        if not self._queue():
            self._finish()
            return
        option, timed = self._pending.pop(0)
        choice = self.choices[self._phase]
        config = self._config(option)
        self._put_in_force(config)
        self._warmed.add(config)
        self._step = _Step(self._steps_seen, config, option, timed, choice.clock or _clock)
        self.log.append((self._steps_seen, self._named(config)))
        name, first, _ = self._phases[-1] if self._phases else ("", 0, 0)
        if name == choice.name:
            self._phases[-1] = (name, first, self._steps_seen)
        else:
            self._phases.append((choice.name, self._steps_seen, self._steps_seen))

    def _config(self, option: str) -> Config:
        current = self.choices[self._phase].name
        return tuple(option if c.name == current else self._winners[c.name] for c in self.choices)

    def _named(self, config: Config) -> dict[str, str]:
        return {c.name: option for c, option in zip(self.choices, config, strict=True)}

    def _queue(self) -> bool:
        """Queue the next steps to run; False once every choice is decided."""
        if not self._winners:  # the first training step: baselines, forced, recorded winners
            self._winners = {c.name: _unchanged(c) for c in self.choices}
            recorded = self.record.read() if self.record is not None else {}
            for c in self.choices:
                if c.name in _FORCED:
                    self._winners[c.name] = _FORCED[c.name]
                    self._notes[c.name] = _FORCED_NOTE
                elif c.name in recorded and recorded[c.name][0] in c.options:
                    self._winners[c.name], line = recorded[c.name]
                    self._notes[c.name] = f"{RECORDED} ({line})"
                    self._from_record.add(c.name)
        while not self._pending:
            if self._phase == len(self.choices):
                return False
            choice = self.choices[self._phase]
            if choice.name in _FORCED or choice.name in self._from_record:
                self._phase += 1
                continue
            if self._running is None:  # start measuring this choice
                base = _unchanged(choice)
                length = self.run_length() if self.run_length is not None else None
                if choice.one_off is not None and length is not None and not self._probed:
                    self._probed = True
                    if not self._walls.get(self._config(base)):
                        # The payback bound needs a step of the baseline: time one first.
                        self._samples = {}
                        warm = self._config(base) in self._warmed
                        self._pending = ([] if warm else [(base, False)]) + [(base, True)]
                        continue
                if self._not_worth_it(choice):
                    self._phase += 1
                    self._probed = False
                    continue
                # The baseline first: the first training step runs as eager's does.
                self._running = sorted(choice.options, key=lambda o: o != base)
                self._samples = {o: [] for o in self._running}
                self._rounds = 0
                fresh = [o for o in self._running if self._config(o) not in self._warmed]
                self._pending = [(o, False) for o in fresh]  # a warm-up step each
                continue
            winner = self._verdict(choice)
            if winner is not None:
                self._decide(choice, winner)
                self._phase += 1
                self._running = None
                self._probed = False
                continue
            self._rounds += 1
            self._pending = [(o, True) for o in self._running]
        return True

    def _verdict(self, choice: Choice) -> str | None:
        """The winner once the outcome is settled (None: another round); drops the options
        measured HOPELESS times slower than the baseline over two rounds."""
        if self._rounds == 0:
            return None
        base = _unchanged(choice)
        running = self._running
        assert running is not None
        if self._rounds >= 2:
            slow = -(1 - 1 / timing.HOPELESS)
            running[:] = [
                o
                for o in running
                if o == base or timing.compare(self._samples[base], self._samples[o]).lead > slow
            ]
        others = [o for o in running if o != base]
        if not others:
            return base
        versus = {o: timing.compare(self._samples[base], self._samples[o]) for o in others}
        best = max(others, key=lambda o: versus[o].lead)
        lead = versus[best]
        enough = self._rounds >= ROUNDS or (self._rounds >= 2 and lead.lead >= DECISIVE)
        if self._rounds >= MAX_ROUNDS or (enough and lead.settled()):
            return best if lead.ahead() else base
        return None

    def _decide(self, choice: Choice, winner: str) -> None:
        """Keep `winner`; the choice's short line and figures say what was measured."""
        self._winners[choice.name] = winner
        self._measured.add(choice.name)
        base = _unchanged(choice)
        times = {o: t for o, t in self._samples.items() if t}
        figures = timing.figures(times)
        line = timing.summary(times)
        others = [o for o in times if o != base]
        if others and times.get(base):
            best = max(others, key=lambda o: timing.compare(times[base], times[o]).lead)
            lead = timing.compare(times[base], times[best])
            figures.update(lead=round(lead.lead, 4), lead_noise=round(lead.noise, 4))
            figures["lead_band"] = round(math.expm1(lead.band), 4)
            line += f": {timing.verdict(best, lead)}"
        self._notes[choice.name] = line
        self._figures.setdefault(choice.name, {}).update(figures)  # beside the payback bound

    def _not_worth_it(self, choice: Choice) -> bool:
        """Whether `choice` cannot pay back its one-off cost within the run as far as seen:
        then its baseline stays, and `deferred` hears why."""
        if choice.one_off is None:
            return False
        estimate, what = choice.one_off()
        figures = {"one_off_estimate_s": round(estimate, 6)}
        self._figures[choice.name] = figures
        length = self.run_length() if self.run_length is not None else None
        walls = self._walls.get(self._config(_unchanged(choice)))
        if length is None or not walls or choice.best_gain <= 0:
            return False  # no bound on the payback: tried, the cost measured and reported
        steps, counted = length
        step_s = statistics.median(walls)
        needed = math.ceil(estimate / (step_s * choice.best_gain))
        left = steps - self._steps_seen + 1
        figures.update(payback_steps_needed=needed, run_steps=steps, step_s=round(step_s, 6))
        figures["best_gain"] = choice.best_gain
        if needed <= left:
            return False
        note = (
            f"{NOT_TRIED}: {what}, ~{timing.duration(estimate)}, would pay back after >= {needed} "
            f"steps at best ({timing.duration(step_s)} a step, {choice.best_gain:.0%} of it "
            f"saved); the run has {steps} steps as far as seen ({counted})"
        )
        self._notes[choice.name] = note
        if choice.deferred is not None:
            choice.deferred(note)
        return True

    def _put_in_force(self, config: Config) -> None:
        if config == self._in_force:
            return
        start = WALL()
        for c, option in zip(self.choices, config, strict=True):
            c.apply(option)
        self._in_force = config
        self._switch_s += WALL() - start

    def _finish(self) -> None:
        """Put the winners in force and report what was measured, on which steps, at what
        cost, and when it pays back."""
        self.done = True
        final = tuple(self._winners[c.name] for c in self.choices)
        self._put_in_force(final)
        walls = self._walls.get(final)
        winner_s = statistics.median(walls) if walls else None
        extra = sum(max(s.wall - winner_s, 0.0) for s in self._steps) if winner_s else 0.0
        self.cost_s = self._switch_s + extra
        base = self._walls.get(tuple(_unchanged(c) for c in self.choices))
        gain = statistics.median(base) - winner_s if base and winner_s is not None else 0.0
        for c in self.choices:
            self._tell(c, self._winners[c.name], self._notes.get(c.name, "not measured"))
        self._report_schedule(gain)
        if self.record is not None:  # a compile's outcome has its own record
            self.record.write(
                {
                    c.name: (self._winners[c.name], self._notes[c.name])
                    for c in self.choices
                    if c.name in self._measured and c.one_off is None
                }
            )

    def _tell(self, choice: Choice, winner: str, note: str) -> None:
        """The choice's decision, to its pass (the report line) and its figures to that row."""
        choice.decided(winner, note)
        figures = self._figures.get(choice.name)
        if figures and self.report is not None and choice.name in self.report:
            self.report[choice.name].figures.update(figures)

    def _report_schedule(self, gain: float) -> None:
        """The `trials` row: the schedule once, the cost and its payback."""
        if self.report is None:
            return
        last = self._steps[-1].number if self._steps else 0
        cost = self.cost_s or 0.0
        figures: dict[str, float] = {"steps": last, "cost_s": round(cost, 6)}
        figures["switch_s"] = round(self._switch_s, 6)
        phases = ", ".join(
            f"{first}-{end} {name}" if end > first else f"{first} {name}"
            for name, first, end in self._phases
        )
        if not self._steps and self._from_record and self.record is not None:
            result = PassResult.applied(
                NAME,
                f"none: {', '.join(sorted(self._from_record))} {RECORDED} ({self.record.path})",
            )
            result.figures.update(steps=0, cost_s=0.0)
            self.report.replace(result)
            return
        line = (
            f"training steps {phases or 'none'}, winners from step {last + 1}; cost "
            f"{timing.duration(cost)} (warm-ups and compiles included)"
        )
        if gain > 0:
            payback = last + math.ceil(cost / gain)
            figures.update(gain_s=round(gain, 6), payback_step=payback)
            line += f", paid back by step {payback} ({timing.duration(gain)} a step saved)"
        else:
            line += ", not paid back: the baselines stay"
        length = self.run_length() if self.run_length is not None else None
        if length is not None:
            figures["run_steps"] = length[0]
            line += f"; the run: {length[0]} steps as far as seen"
        result = PassResult.applied(NAME, line)
        result.figures.update(figures)
        self.report.replace(result)

    def _abandon(self, err: BaseException) -> None:
        """A step under trial raised: every choice takes its baseline (what changes nothing),
        the trials stop."""
        self.done = True
        self._step = None
        self._put_in_force(tuple(_unchanged(c) for c in self.choices))
        note = f"not measured: a step under trial failed ({error_summary(err)})"
        for c in self.choices:
            c.decided(_unchanged(c), note)
        if self.report is not None:
            self.report.replace(PassResult.skipped(NAME, note))

    def _time_backward(self, step: _Step, out: Any) -> None:
        """Count the backward through `out` in the step's time: from the first gradient that
        reaches an output to the end of that backward."""
        for t in tensors_in(out):
            if t.requires_grad:
                t.register_hook(functools.partial(self._backward_started, step))

    def _backward_started(self, step: _Step, grad: torch.Tensor) -> None:
        if step.backward_from is None and step is self._step:
            step.backward_from = (step.clock(), WALL())
            engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]
            engine.queue_callback(functools.partial(self._backward_ended, step))

    @staticmethod
    def _backward_ended(step: _Step) -> None:
        if step.backward_from is not None:
            clock, wall = step.backward_from
            step.seconds += step.clock() - clock
            step.wall += WALL() - wall
            step.backward_from = None


def _unchanged(choice: Choice) -> str:
    """The choice's option that changes nothing (its baseline), else its first option."""
    return choice.baseline if choice.baseline is not None else choice.options[0]


def _clock() -> float:
    return CLOCK()


class LoaderLength:
    """`RunLength` of a loader: its length times the epochs started (its `epoch`, at least 1);
    None for a loader without a length. Holds the loader weakly: a copy of the model does not
    copy the loader."""

    def __init__(self, loader: Any) -> None:
        self._loader = weakref.ref(loader)

    def __call__(self) -> tuple[int, str] | None:
        loader = self._loader()
        if loader is None:
            return None
        try:
            batches = len(loader)
        except TypeError:
            return None
        epochs = max(int(getattr(loader, "epoch", 1) or 1), 1)
        started = "epoch" if epochs == 1 else "epochs"
        return batches * epochs, f"{batches} batches x {epochs} {started} started"


# model -> its Trials (`of_model`), for the report's readers and tests.
_BY_MODEL: weakref.WeakKeyDictionary[nn.Module, Trials] = weakref.WeakKeyDictionary()


def trials_of(ctx: Context) -> Trials:
    """The model's `Trials`, created (and its OUTER forward layer, and with an optimizer its
    step layer, registered) at the first call."""
    found = ctx.extras.get(EXTRA)
    if found is None:
        found = ctx.extras[EXTRA] = _BY_MODEL[ctx.model] = Trials(ctx.model, ctx.report)
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
