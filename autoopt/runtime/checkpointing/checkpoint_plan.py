"""`checkpoint="auto"` under a memory budget: measure what each block saves for backward on the
first training batch, then checkpoint the fewest blocks that bring the step under the budget.

Measuring (`Planner.decide`, once, before the first training forward runs): one extra forward of
the model in which every block is measured in isolation on its real inputs, three ways, and then
run fully checkpointed:

* plain: the bytes the block saves for backward (`saved_tensor_bytes`);
* selective: the inputs a checkpoint keeps plus the matmul/attention outputs `KeepMatmuls` keeps;
* full: the inputs a checkpoint keeps;
* transient: what its plain backward holds at once beyond the saved bytes (gradients and their
  temporaries, less the saved tensors it has freed; `backward_transient_bytes`).

Each isolated run frees its graph before the next block, so the measuring forward holds at most
what the all-checkpointed model saves plus one block's activations: never more than any plan.
The RNG state and batch-norm statistics are put back afterwards, so the real first step sees
what it would have seen without the measurement.

Deciding (`choose_modes`, pure): the activations of a plan are those of the all-checkpointed
model plus, for every block not fully checkpointed, what it saves beyond its inputs. This is
exact when neighbouring blocks do not both save the storage that passes between them (a
residual stream ends in an add, which saves nothing); otherwise it overcounts, never
undercounts. The fewest blocks (largest savings first) are fully checkpointed until the step
fits; then, last first, each chosen block that still fits with selective checkpointing (less
recompute) is switched to it. If checkpointing every block is not enough, every block that saves
something is checkpointed (one that saves nothing stays plain) and the report says by how much the
step still exceeds the budget. The plan's `peak` adds the backward's transient buffers at its
worst block (`backward_peak`); the budget is compared with the saved bytes, not the peak.

Gradients: the first plan holds them all step long (a loop that keeps them, or accumulates).
At each training forward after it (`Planner.grads_seen`) the parameters' `.grad` are looked at:
one found means they are held, and the plan stands; none found at a forward after an optimizer
step (a parameter's version moved), and none at every forward before, means the loop frees
them before its forward (`zero_grad(set_to_none=True)`, torch's default). The plan is then made
again from the measured costs (nothing is measured again): the forward's end holds no
gradients, and the backward makes them as it goes (the head's from its start, each block's
once its backward ran), so the step keeps more activations for the same peak. The report line
says so and gives that peak.

The plan goes into the report's checkpoint row and its memory section (`report.record_plan`), and is
logged (`voice`) when it is made.

Transformers blocks take the model's KV cache (`use_cache=True` by default): the isolated runs
and every checkpointed block run without it (`block_checkpoint.without_cache`), so measuring does
not grow it and recomputation does not write it twice; a cache the user passes to the model is
copied for the measuring forward.

What is counted is what `model.forward` saves; a loss computed outside it saves its own inputs
(logits) on top.
"""

from __future__ import annotations

import copy
import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import groupby
from typing import Any

import torch
from torch import nn

from autoopt.runtime import voice
from autoopt.runtime.checkpointing.block_checkpoint import (
    BlockState,
    Mode,
    is_kv_cache,
    run_block,
    without_cache,
)
from autoopt.runtime.context import Forward
from autoopt.runtime.hardware import module_device
from autoopt.runtime.loading.batch import map_tensors, tensors_in
from autoopt.runtime.memory import (
    StepMemory,
    backward_transient_bytes,
    format_bytes,
    not_counted,
    resident_bytes,
    resolve_budget,
    saved_tensor_bytes,
)
from autoopt.runtime.report import PassResult, Report, record_plan
from autoopt.runtime.trials.choices import Trials, default_clock, of_model
from autoopt.runtime.trials.replay import Replay, in_trial
from autoopt.runtime.trials.timing import duration

NAME = "checkpoint"
PLANNER_ATTR = "_autoopt_checkpoint_planner"  # the Planner, on the root module
EXPECTED = "recompute expected"  # how the line's expected cost begins


@dataclass(frozen=True)
class BlockCost:
    """Bytes one block keeps for backward on the measured batch, per way of running it, and
    the seconds a step spends on it beyond its plain forward and backward (the recomputation
    and the checkpoint's own work), measured on that batch. Unmeasured seconds (None) are
    taken as a third of what a full recomputation costs for selective (its pointwise ops),
    one for full: the plan then still prefers selective and fewer checkpointed blocks."""

    plain: int
    selective: int
    full: int
    transient: int = 0  # what its plain backward holds at once beyond the saved bytes
    selective_s: float | None = None
    full_s: float | None = None
    grads: int = 0  # the bytes of the gradients its parameters get (made by its backward)

    def extra_s(self, mode: Mode) -> float:
        """The seconds `mode` adds to a step, or their stand-in when unmeasured."""
        if mode is Mode.PLAIN:
            return 0.0
        full = self.full_s if self.full_s is not None else 1.0
        if mode is Mode.FULL:
            return full
        return self.selective_s if self.selective_s is not None else full / 3


@dataclass(frozen=True)
class CheckpointPlan:
    """The decision: each block's mode, and the step's memory before and after."""

    budget: int
    before: StepMemory
    after: StepMemory
    modes: dict[str, Mode]  # block name -> mode, in module order
    costs: dict[str, BlockCost]  # block name -> what it saves, for the blocks measured
    peak: int = 0  # the step's most bytes at once: `after` plus the worst block's backward
    expected_s: float = 0.0  # the seconds a step spends recomputing, by the measured costs
    # The training loop frees the gradients before each forward (`zero_grad(set_to_none=True)`,
    # seen at its second step): they are not held with the forward's activations, and the
    # backward makes them block by block (`backward_peak`'s `growing`).
    grads_freed: bool = False

    @property
    def held(self) -> int:
        """What the step holds at the forward's end: the state and the saved activations (the
        gradients left out when the loop frees them before the forward)."""
        return self.after.total - (self.after.gradients if self.grads_freed else 0)

    @property
    def excess(self) -> int:
        """Bytes by which the step still exceeds the budget (0 when it fits)."""
        return max(0, self.held - self.budget)

    def blocks(self) -> str:
        """The checkpointed blocks as ranges: 'blocks.0-7 (full), blocks.8-9 (selective)'."""
        return describe_blocks(self.modes)

    def render(self) -> str:
        """The report line."""
        before = self.before.activations or 0
        after = self.after.activations or 0
        checkpointed = self.blocks() or "no block"
        line = (
            f"{checkpointed}: saved activations {format_bytes(before)} -> "
            f"{format_bytes(after)}; step {format_bytes(self.held)} for a budget of "
            f"{format_bytes(self.budget)}"
        )
        if self.grads_freed:
            line += (
                f" (without the gradients, {format_bytes(self.after.gradients)}: the loop frees "
                f"them before each forward, zero_grad(set_to_none=True), seen after its first "
                f"step; peak {format_bytes(self.peak)} as the backward makes them)"
            )
        if self.excess:
            line += f"; still exceeds the budget by {format_bytes(self.excess)}"
        return line

    def figures(self) -> dict[str, float]:
        """The report row's figures: bytes, and the expected recompute seconds a step."""
        return {
            "activations_before_bytes": self.before.activations or 0,
            "activations_after_bytes": self.after.activations or 0,
            "step_bytes": self.held,
            "budget_bytes": self.budget,
            "peak_bytes": self.peak,
            "excess_bytes": self.excess,
            "expected_recompute_s": round(self.expected_s, 6),
            "grads_freed": float(self.grads_freed),
            "gradients_bytes": self.after.gradients or 0,
        }


def describe_blocks(modes: dict[str, Mode]) -> str:
    """Runs of consecutive blocks of one stack in one mode, plain blocks left out."""
    parts = []
    keyed = [(*name.rpartition("."), mode) for name, mode in modes.items()]
    for (stack, mode), run in groupby(keyed, key=lambda k: (k[0], k[3])):
        if mode is Mode.PLAIN:
            continue
        indices = [int(k[2]) for k in run]
        for _, span in groupby(enumerate(indices), key=lambda p: p[1] - p[0]):
            ids = [i for _, i in span]
            rng = str(ids[0]) if len(ids) == 1 else f"{ids[0]}-{ids[-1]}"
            parts.append((f"{stack}.{rng}" if stack else rng, mode))
    return ", ".join(f"{name} ({mode.value})" for name, mode in parts)


def applied_modes(modes: Sequence[Mode]) -> bool:
    """Whether some block is checkpointed."""
    return any(m is not Mode.PLAIN for m in modes)


def backward_peak(
    costs: Sequence[BlockCost], modes: Sequence[Mode], growing: int | None = None
) -> int:
    """Bytes the backward adds, at its worst block, to the activations a plan keeps: the
    backward runs the blocks last first, each freeing what it kept; block i, when it runs, holds
    what the blocks before it keep (the ones after it are freed), its recomputed activations (a
    checkpointed block saves its plain bytes again) and its backward's transient buffers.

    `growing`: None when the gradients are held all along (counted in the state); else the
    loop freed them before the forward and the backward makes them: the `growing` bytes of the
    gradients made before the blocks' (the head's, counted from the start) and, at block i, the
    `grads` of every block after it."""
    kept = {Mode.PLAIN: lambda c: c.plain, Mode.SELECTIVE: lambda c: c.selective}
    worst = freed = 0
    made = growing or 0
    for cost, mode in reversed(list(zip(costs, modes, strict=True))):
        keeps = kept.get(mode, lambda c: c.full)(cost)
        worst = max(worst, cost.plain - keeps + cost.transient - freed + made)
        freed += keeps
        if growing is not None:
            made += cost.grads
    return worst


def choose_modes(costs: Sequence[BlockCost], base: int, budget: int) -> list[Mode]:
    """Each block's mode: the plan that costs the fewest seconds of recomputation (`extra_s`)
    among those that bring `base` (state bytes plus the activations with every block fully
    checkpointed) plus each block's extra over full under `budget`: selective checkpointing
    recomputes only the cheap ops, so several selective blocks often cost less than one full
    one. When nothing fits, every block that saves something is checkpointed fully (a block that
    saves nothing stays plain: checkpointing it only adds recomputation).

    A multiple-choice knapsack, solved exactly over the allowance cut into `STEPS` units (each
    block's bytes rounded up, so a plan found always fits)."""
    extra = [
        {Mode.PLAIN: c.plain - c.full, Mode.SELECTIVE: c.selective - c.full, Mode.FULL: 0}
        for c in costs
    ]
    allowance = budget - base
    if sum(e[Mode.PLAIN] for e in extra) <= allowance:
        return [Mode.PLAIN] * len(costs)
    if allowance < 0:
        return [Mode.FULL if e[Mode.PLAIN] > 0 else Mode.PLAIN for e in extra]
    unit = max(allowance / STEPS, 1.0)
    capacity = int(allowance // unit)
    # best[w]: (seconds, modes so far) of the cheapest plan of the blocks so far in w units.
    best: list[tuple[float, tuple[Mode, ...]] | None] = [(0.0, ())] + [None] * capacity
    for cost, sizes in zip(costs, extra, strict=True):
        options = [
            (mode, math.ceil(sizes[mode] / unit), cost.extra_s(mode) + _TIE[mode])
            for mode in Mode
            if mode is not Mode.SELECTIVE or sizes[mode] < sizes[Mode.PLAIN]
        ]
        if sizes[Mode.PLAIN] <= 0:  # saves nothing: plain
            options = [(Mode.PLAIN, 0, 0.0)]
        nxt: list[tuple[float, tuple[Mode, ...]] | None] = [None] * (capacity + 1)
        for used, found in enumerate(best):
            if found is None:
                continue
            for mode, size, seconds in options:
                total = used + size
                if total > capacity:
                    continue
                candidate = (found[0] + seconds, (*found[1], mode))
                if nxt[total] is None or candidate[0] < nxt[total][0]:  # type: ignore[index]
                    nxt[total] = candidate
        best = nxt
    plans = [found for found in best if found is not None]
    if not plans:  # every block full does not fit the rounded allowance
        return [Mode.FULL if e[Mode.PLAIN] > 0 else Mode.PLAIN for e in extra]
    return list(min(plans, key=lambda found: found[0])[1])


def fit_peak(
    costs: Sequence[BlockCost], base: int, budget: int, growing: int | None = None
) -> list[Mode]:
    """`choose_modes` for the step's peak: the saved bytes plus what the backward adds at its
    worst block (`backward_peak`: a checkpointed block's recomputed activations and its
    gradients) under `budget`. The saved bytes' allowance is searched (halving, PEAK_TRIES
    times) for the largest whose plan's peak fits; when even every block full peaks over the
    budget, the plan for the saved bytes alone. `growing`: see `backward_peak` (`base` then
    leaves the gradients out)."""

    def peak(modes: list[Mode]) -> int:
        return plan_peak(costs, base, modes, growing)

    saved = choose_modes(costs, base, budget)
    if peak(saved) <= budget:
        return saved
    low, high = base, budget  # a target whose plan fits; one whose plan does not
    fits = choose_modes(costs, base, low)
    if peak(fits) > budget:
        return saved
    for _ in range(PEAK_TRIES):
        middle = (low + high) // 2
        modes = choose_modes(costs, base, middle)
        if peak(modes) <= budget:
            low, fits = middle, modes
        else:
            high = middle
    return fits


PEAK_TRIES = 10


def plan_peak(
    costs: Sequence[BlockCost], base: int, modes: Sequence[Mode], growing: int | None = None
) -> int:
    """The step's most bytes at once under `modes`: `base`, what the blocks keep beyond their
    inputs, and the backward's worst block (`backward_peak`)."""
    kept = sum(_kept(c, m) - c.full for c, m in zip(costs, modes, strict=True))
    return base + kept + backward_peak(costs, modes, growing)


def _kept(cost: BlockCost, mode: Mode) -> int:
    return {Mode.PLAIN: cost.plain, Mode.SELECTIVE: cost.selective, Mode.FULL: cost.full}[mode]


STEPS = 2048  # units the allowance is cut into by `choose_modes`
# Ties (unmeasured or equal seconds) go to fewer recomputed ops: plain, then selective.
_TIE = {Mode.PLAIN: 0.0, Mode.SELECTIVE: 1e-9, Mode.FULL: 2e-9}


ROUNDS = 2  # timed runs of each mode, per kind of block; the fastest counts


def mode_seconds(
    forward: Forward, block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[float, float]:
    """Seconds selective and full checkpointing add to `block`'s forward and backward on these
    inputs, over its plain run: each mode run ROUNDS times in turns, the fastest run of each."""
    times: dict[Mode, list[float]] = {mode: [] for mode in Mode}
    for _ in range(ROUNDS):
        for mode in Mode:
            times[mode].append(_forward_backward_seconds(forward, block, mode, args, kwargs))
    plain = min(times[Mode.PLAIN])
    return max(min(times[Mode.SELECTIVE]) - plain, 0.0), max(min(times[Mode.FULL]) - plain, 0.0)


def _forward_backward_seconds(
    forward: Forward, block: nn.Module, mode: Mode, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> float:
    """Seconds (the trials' clock: CPU time with one thread, else wall time) of the block's
    forward in `mode` and the backward of its outputs' sum to its inputs and parameters
    (`autograd.grad`: no `.grad` is touched)."""
    wrt = [t for t in tensors_in((args, kwargs)) if t.requires_grad]
    wrt += [p for p in block.parameters() if p.requires_grad]
    cuda = [t.device for t in wrt if t.device.type == "cuda"]
    start = default_clock()
    out = run_block(forward, block, mode, args, kwargs)
    outs = [t for t in tensors_in(out) if t.requires_grad and t.is_floating_point()]
    if outs and wrt:
        torch.autograd.grad(sum(t.float().sum() for t in outs), wrt, allow_unused=True)
    if cuda:
        torch.cuda.synchronize(cuda[0])
    return default_clock() - start


@dataclass
class RecomputeClock:
    """The measured cost of a plan: the seconds its checkpointed blocks spend recomputing in
    backward (`block_checkpoint.run_block` adds them), over the training steps after the one
    that made the plan (`STEPS_MEASURED` of them), and those steps' own seconds."""

    seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)
    started: float | None = None  # when the step under measurement began
    armed: bool = False  # a plan checkpoints something: measure from the next step

    def add(self, seconds: float) -> None:
        if self.started is not None:
            self.seconds += seconds

    def step(self) -> bool:
        """A training step begins; True once STEPS_MEASURED steps are measured."""
        now = default_clock()
        if self.started is not None:
            self.step_seconds.append(now - self.started)
        self.started = now
        return len(self.step_seconds) >= STEPS_MEASURED


STEPS_MEASURED = 5


class Planner:
    """The pending "auto" decision of one model, made once at its first training forward (or
    when `plan()` is called first); kept on the root module as `_autoopt_checkpoint_planner`."""

    def __init__(
        self,
        root: nn.Module,
        blocks: list[tuple[nn.Module, BlockState]],
        budget_option: int | str | None,
        state: StepMemory,
        report: Report,
        verbose: bool = False,
    ) -> None:
        self.root = root
        self.blocks = blocks
        self.budget_option = budget_option
        self.state = state  # parameters, gradients and optimizer state when optimize() ran
        self.report = report
        self.verbose = verbose  # log the memory section at INFO (else DEBUG) when it is made
        self.measuring = False
        self.plan: CheckpointPlan | None = None
        self.decided = False
        self._costs: dict[str, BlockCost] = {}
        self.cache_left_out = False  # a checkpointed block ran without the model's KV cache
        self.backward_unmeasured: list[str] = []  # blocks whose backward could not be measured
        self._timed: dict[Any, tuple[float | None, float | None]] = {}  # by kind of block
        self.recompute = RecomputeClock()  # the seconds spent recomputing, measured
        self.trials: Trials | None = None  # undecided trials the plan was made during
        self.planned_under: dict[str, str] = {}  # their options in force then
        # Whether the loop frees the gradients before each forward (`grads_seen`): None until
        # a forward after an optimizer step tells; the plan holds them until then.
        self.grads_freed: bool | None = None
        self._versions: list[int] | None = None  # the parameters' versions when planned
        self._measured: list[tuple[BlockState, BlockCost]] = []
        self._budget = 0
        self._all_full = 0

    def decide(self, forward: Forward, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Measure on this batch, set every block's mode and record the plan in the report.
        While the model's trials (layout, amp) are undecided, the plan is for the step as it
        runs now (their baselines) and is made again once they are decided, if a winner
        changes what a step keeps (bf16 halves the activations)."""
        self.decided = True
        self._timed = {}  # what the modes cost under the configuration in force now
        self.recompute = RecomputeClock()
        measured = of_model(self.root)
        self.trials = measured if measured is not None and not measured.done else None
        self.planned_under = measured.winners if measured is not None else {}
        device = module_device(self.root)
        held = resident_bytes(self.root, None, device)
        budget = resolve_budget(self.budget_option, device, held=held)
        if budget is None:
            self._record(PassResult.skipped(NAME, "no memory budget to plan for"))
            return
        try:
            all_full = self._measure(forward, args, kwargs)
        except Exception as err:  # an op checkpointing cannot replay, ...
            for _, state in self.blocks:
                state.mode = Mode.PLAIN
            message = f"could not measure the blocks ({type(err).__name__}: {err})"
            warnings.warn(f"autoopt checkpoint: {message}; running without it", stacklevel=2)
            self._record(PassResult.failed(NAME, message, "no checkpointing"))
            return
        self._measured = [
            (state, self._costs[state.name])
            for _, state in self.blocks
            if state.name in self._costs
        ]
        self._budget, self._all_full = budget, all_full
        self._watch_grads()
        self._choose(announce=True)

    def _watch_grads(self) -> None:
        """Note the parameters' versions, so `grads_seen` can tell an optimizer step."""
        if self.grads_freed is None:
            self._versions = [p._version for p in self._trainable()]

    def _trainable(self) -> list[nn.Parameter]:
        return [p for p in self.root.parameters() if p.requires_grad]

    def grads_seen(self) -> bool:
        """At a training forward after the plan: whether the loop frees the gradients before
        its forwards. Kept (the plan stands) as soon as one such forward finds a gradient (a
        loop that keeps them, or accumulates); freed once a forward after an optimizer step (a
        parameter's version moved) finds none, and every one before it found none too. True
        when that makes the plan again (with the measured costs: nothing is measured)."""
        if self.grads_freed is not None or self._versions is None:
            return False
        params = self._trainable()
        if any(p.grad is not None for p in params):
            self.grads_freed = False
            return False
        if [p._version for p in params] == self._versions:
            return False  # no optimizer step yet (plan() made it before the loop began)
        self.grads_freed = True
        if self.plan is None or not self._measured:
            return False
        before = [state.mode for state, _ in self._measured]
        self._choose(announce=False)
        if [state.mode for state, _ in self._measured] != before:
            # Another plan: its cost is measured from here (the steps so far ran the old one).
            fresh = RecomputeClock(armed=self.recompute.armed)
            for state, _ in self._measured:
                if state.recomputed is not None:
                    state.recomputed = fresh.add
            self.recompute = fresh
        return True

    def _choose(self, announce: bool) -> None:
        """Each block's mode from the measured costs, the plan and its report row; the memory
        section is said when `announce`."""
        measured, budget, all_full = self._measured, self._budget, self._all_full
        costs = [cost for _, cost in measured]
        step = self._state()
        growing: int | None = None
        base = step.state + all_full
        if self.grads_freed:
            # Made by the backward: the blocks' as each block's runs, the rest's from its start.
            made = sum(c.grads for c in costs)
            share = min(1.0, step.gradients / made) if made else 0.0
            costs = [replace(c, grads=int(c.grads * share)) for c in costs]
            growing = max(0, step.gradients - sum(c.grads for c in costs))
            base -= step.gradients
        modes = fit_peak(costs, base, budget, growing)
        for (block, _cost), mode in zip(measured, modes, strict=True):
            block.mode = mode
            block.recomputed = self.recompute.add if mode is not Mode.PLAIN else None
        timed = all(
            c.full_s is not None for c, m in zip(costs, modes, strict=True) if m is not Mode.PLAIN
        )
        expected = sum(c.extra_s(m) for c, m in zip(costs, modes, strict=True)) if timed else None
        extra = {Mode.PLAIN: lambda c: c.plain, Mode.SELECTIVE: lambda c: c.selective}
        before = all_full + sum(c.plain - c.full for c in costs)
        after = all_full + sum(
            extra[m](c) - c.full for c, m in zip(costs, modes, strict=True) if m is not Mode.FULL
        )
        self.plan = CheckpointPlan(
            budget,
            step.with_activations(before),
            step.with_activations(after),
            {block.name: block.mode for _, block in self.blocks},
            {block.name: cost for (block, _), cost in zip(measured, costs, strict=True)},
            plan_peak(costs, base, modes, growing),
            expected or 0.0,
            bool(self.grads_freed),
        )
        record_plan(self.report, self.plan.before, self.plan.after, budget)
        line = self.plan.render() + " (measured one block at a time on the first training batch)"
        if self.cache_left_out and applied_modes(modes):
            line += (
                "; checkpointed blocks run without the KV cache in training (use_cache=False, "
                "as transformers' gradient checkpointing)"
            )
        unmeasured = len(self.blocks) - len(measured)
        if unmeasured:
            line += f"; {unmeasured} block(s) did not run in that forward and stay plain"
        if self.backward_unmeasured:
            line += (
                f"; the peak leaves out the backward buffers of {len(self.backward_unmeasured)} "
                "block(s) whose backward could not be measured"
            )
            if announce:
                warnings.warn(
                    "autoopt checkpoint: could not measure the backward of "
                    f"{', '.join(self.backward_unmeasured)}; the planned peak leaves their "
                    "buffers out",
                    stacklevel=2,
                )
        applied = applied_modes(modes)
        if expected is not None and applied:
            line += f"; {EXPECTED} {duration(expected)} a step"
        result = PassResult.applied(NAME, line) if applied else PassResult.skipped(NAME, line)
        result.figures.update(self.plan.figures())
        self._record(result)
        self.recompute.armed = applied
        if announce and self.report.memory is not None and self.report.published:
            # the decision's line is said by report.replace; the memory section follows it
            voice.say("\n".join(self.report.memory.render()), self.verbose)

    def _state(self) -> StepMemory:
        """Parameter, gradient and optimizer-state bytes of a step, as the passes after this one
        left them: FSDP shards after `optimize()`'s checkpoint pass and records its per-rank
        bytes in the report (not counted here: inside this forward the root's parameters are
        all-gathered)."""
        if self.report.memory is not None:
            return self.report.memory.after
        return self.state

    def _measure(self, forward: Forward, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        """Bytes saved by the forward with every block fully checkpointed; fills `_costs`."""
        self._costs = {}
        self.backward_unmeasured = []
        self.measuring = True
        try:
            return measure_saved(self.root, forward, args, kwargs)
        finally:
            self.measuring = False

    def saved_with_every_block(
        self,
        mode: Mode,
        forward: Forward,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> int:
        """Bytes the forward saves with every block in `mode`: FULL gives the least any plan
        keeps, PLAIN what eager keeps. For `accumulate="auto"`, which sizes micro-batches before
        the plan is made (the plan is then made for the micro-batch). `forward` may be the
        root's planning layer: it runs through while this measures."""
        modes = [state.mode for _, state in self.blocks]
        decided, self.decided = self.decided, True
        for _, state in self.blocks:
            state.mode = mode
        try:
            return measure_saved(self.root, forward, args, kwargs)
        finally:
            self.decided = decided
            for (_, state), mode in zip(self.blocks, modes, strict=True):
                state.mode = mode

    def measure(
        self,
        state: BlockState,
        forward: Forward,
        block: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """One block inside the measuring forward: its three costs, then its output, checkpointed."""
        uncached = without_cache(block, args, kwargs)
        if uncached is None:  # its layer of the KV cache is filled: it runs plainly (run_block)
            self._costs[state.name] = BlockCost(0, 0, 0)  # its bytes are in the forward's
            return forward(*args, **kwargs)
        self.cache_left_out |= uncached[0] is not args or uncached[1] is not kwargs
        # The isolated runs see no KV cache, so they write none (it would grow on every run).
        fresh_args, fresh_kwargs = map_tensors(uncached, _fresh)
        # Inputs that need no grad (masks, data) are the caller's, counted once outside the block.
        outside = [t for t in tensors_in((args, kwargs)) if not t.requires_grad]

        def cost(mode: Mode) -> int:
            return saved_tensor_bytes(
                lambda: run_block(forward, block, mode, fresh_args, fresh_kwargs), exclude=outside
            )

        try:
            with not_counted():  # one more isolated plain run, its backward measured
                transient = backward_transient_bytes(
                    lambda: run_block(forward, block, Mode.PLAIN, fresh_args, fresh_kwargs),
                    block.parameters(),
                )
        except Exception as err:  # the peak only reports: the plan stands without this term
            self.backward_unmeasured.append(f"{state.name} ({type(err).__name__}: {err})")
            transient = 0
        selective_s, full_s = self._seconds(forward, block, fresh_args, fresh_kwargs)
        self._costs[state.name] = BlockCost(
            grads=sum(p.numel() * p.element_size() for p in block.parameters() if p.requires_grad),
            plain=cost(Mode.PLAIN),
            selective=cost(Mode.SELECTIVE),
            full=cost(Mode.FULL),
            transient=transient,
            selective_s=selective_s,
            full_s=full_s,
        )
        return run_block(forward, block, Mode.FULL, args, kwargs)

    def _seconds(
        self, forward: Forward, block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[float | None, float | None]:
        """What selective and full checkpointing add to the block's forward and backward, in
        seconds: measured on the first block of each kind (class, parameter and input shapes;
        the blocks of a stack are alike), reused for the others; (None, None) when the
        backward cannot run here."""
        kind = (
            type(block),
            tuple(tuple(p.shape) for p in block.parameters()),
            tuple(tuple(t.shape) for t in tensors_in((args, kwargs))),
        )
        if kind not in self._timed:
            try:
                with not_counted():  # the timed runs are not what the forward keeps
                    self._timed[kind] = mode_seconds(forward, block, args, kwargs)
            except Exception:  # noqa: BLE001 - the plan stands on bytes, ties to fewer ops
                self._timed[kind] = (None, None)
        return self._timed[kind]

    def measured(self) -> None:
        """The plan's cost as measured on the steps after it: the recompute seconds a step and
        their share of a step, added to the report row (quietly: the decision was said)."""
        clock = self.recompute
        clock.armed = False
        clock.started = None
        for _, state in self.blocks:
            state.recomputed = None  # nothing more to time
        steps = len(clock.step_seconds)
        if not steps or self.plan is None or NAME not in self.report:
            return
        per_step = clock.seconds / steps
        step_s = statistics.median(clock.step_seconds)
        result = self.report[NAME]
        result.detail += (
            f"; measured {duration(per_step)} a step ({per_step / step_s:.0%} of a "
            f"{duration(step_s)} step, over {steps} steps)"
        )
        result.figures.update(
            measured_recompute_s=round(per_step, 6),
            step_s=round(step_s, 6),
            measured_share=round(per_step / step_s, 4),
            measured_steps=steps,
        )

    def _record(self, result: PassResult) -> None:
        self.report.replace(result)


class PlanOnFirstForward:
    """The root's forward layer: decide at the first training forward, then run as decided."""

    def __init__(self, forward: Forward, planner: Planner) -> None:
        self.forward = forward
        self.planner = planner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        planner = self.planner
        training = torch.is_grad_enabled() and planner.root.training and not in_trial()
        if training and planner.decided:
            planner.grads_seen()
        if training and planner.recompute.armed and planner.recompute.step():
            planner.measured()
        if not planner.decided and training:
            planner.decide(self.forward, args, kwargs)
        elif training and planner.trials is not None and planner.trials.done:
            # The trials were undecided when the plan was made: again, for their winners.
            changed = planner.trials.winners != planner.planned_under
            planner.trials = None
            if changed:
                planner.decide(self.forward, args, kwargs)
        return self.forward(*args, **kwargs)


def plan(model: nn.Module, *args: Any, **kwargs: Any) -> CheckpointPlan | None:
    """Make the pending `checkpoint="auto"` decision of an optimized model on this batch (the
    arguments of its forward) now, if its first training forward has not made it yet, and
    return it. The blocks are patched as decided when this returns. None when optimize() planned
    nothing (checkpoint not "auto", no block stack, no budget) or the measurement failed."""
    root = getattr(model, "module", model)  # through a DDP wrapper
    planner: Planner | None = getattr(root, PLANNER_ATTR, None)
    if planner is None:
        return None
    if not planner.decided:
        planner.decide(root, args, kwargs)
    return planner.plan


def memory_plan(model: nn.Module) -> CheckpointPlan | None:
    """The plan `checkpoint="auto"` made for this optimized model, once decided."""
    planner = getattr(getattr(model, "module", model), PLANNER_ATTR, None)
    return planner.plan if planner is not None else None


def measure_saved(
    root: nn.Module, forward: Forward, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> int:
    """`saved_tensor_bytes` of `forward(*args, **kwargs)` as a side trip: the RNG states and the
    buffers of `root` (batch-norm statistics) are put back afterwards, the graph is freed."""
    replay = Replay(root)
    args, kwargs = _copied_caches(args, kwargs)
    try:
        return saved_tensor_bytes(lambda: forward(*args, **kwargs))
    finally:
        replay.restore()


def _copied_caches(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments with each KV cache among them copied: a side trip must not write into the
    cache the real forward reads."""
    return (
        tuple(copy.deepcopy(a) if is_kv_cache(a) else a for a in args),
        {k: copy.deepcopy(v) if is_kv_cache(v) else v for k, v in kwargs.items()},
    )


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """A copy of an input that needs grad, as a non-leaf like the activation it stands for."""
    if not t.requires_grad:
        return t
    return t.detach().requires_grad_(True).clone()
