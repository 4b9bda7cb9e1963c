"""`accumulate="auto"`: the user's batch stays the effective batch; when one step of it does not
fit `memory_budget` even with every block checkpointed, each batch is split into the fewest
near-equal micro-batches that fit, and one optimizer step covers one batch.

How, on the first batch (no extra pass over the data):

1. `MicroBatchLoader` yields the first 2 rows of the first batch alone (1 for a batch of 2): the
   probe part.
2. At the training forward on it, `DecideOnFirstForward` (outside compile) measures the bytes the
   forward saves for backward on its inputs cut or repeated to 1 and 2 rows, with every block of
   a `checkpoint="auto"` stack checkpointed (`Planner.saved_when_all_checkpointed`), else as it
   runs: saved(n) = fixed + per_row * n. `choose_parts` (pure) takes the fewest parts whose
   largest part fits the budget next to the parameters, gradients and optimizer state. Under DDP
   the ranks agree on the smallest part size. The checkpoint plan is then made for a micro-batch
   (the fewest blocks that fit it), not for the probe.
3. The loader yields the rest of the first batch and every later batch in near-equal parts of at
   most that many rows (an uneven last batch too). For each batch it sets the `Accumulator`'s
   cycle to its number of parts and each part's share (rows / batch rows) as the seed of its
   backward: the shares of mean-reduced part losses add up to the full batch's mean gradient.
   `optimizer.step()`, `zero_grad()` and LR schedulers act once per batch (`passes.accumulate`);
   DDP all-reduces in the last part's backward only.

Assumed, and said in the report: the loss is a mean over the batch's samples (mean-reduced
`cross_entropy`, `mse_loss`, ...; per-token means with equal lengths too). A sum, or a mean over
a count that differs between samples (padding-masked tokens), is not what the shares rebuild;
autoopt does not see the loss and cannot check it.

Stands down (a warning and a report line; batches whole, the loop as without autoopt) where it
cannot keep the loop's semantics: BatchNorm (batch statistics depend on the micro-batch size),
no budget (None, or "auto" off CUDA), no loader or optimizer, FSDP2, a first batch it cannot split
(anything but tensors with one first dimension, and None), model inputs without that dimension, a
measurement that fails, or no training forward on the probe part.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from autoopt.runtime.batch import any_tensor, batch_rows, map_tensors, split_rows
from autoopt.runtime.checkpoint_plan import PLANNER_ATTR, Planner, measure_saved
from autoopt.runtime.context import DistState, Forward
from autoopt.runtime.device_loader import LoaderProxy
from autoopt.runtime.hardware import module_device
from autoopt.runtime.memory import StepMemory, format_bytes, resident_bytes, resolve_budget
from autoopt.runtime.report import PassResult, Report

if TYPE_CHECKING:
    from autoopt.runtime.passes.accumulate import Accumulator

NAME = "accumulate"
PROBE_ROWS = 2  # rows of the first part, on which the decision is measured
_ASSUMPTION = (
    "each part's backward is seeded with its share of the batch, so gradients equal the full "
    "batch's for a loss that is a mean over the batch's samples"
)


@dataclass(frozen=True)
class MicroBatchChoice:
    """The decision: how many parts a batch of `rows` is split into, and why."""

    rows: int  # rows of the measured (first) batch
    parts: int
    part_rows: int  # rows of the largest part
    state: int  # parameters + gradients + optimizer state
    fixed: int  # saved activations that do not grow with the rows
    per_row: int  # saved activations per row
    budget: int

    @property
    def step_bytes(self) -> int:
        """What one step of the largest part holds, by the fit."""
        return self.state + self.fixed + self.per_row * self.part_rows

    @property
    def excess(self) -> int:
        """Bytes by which even that step exceeds the budget (0 when it fits)."""
        return max(0, self.step_bytes - self.budget)

    def render(self) -> str:
        """The report line's figures."""
        line = (
            f"step {format_bytes(self.step_bytes)} for a budget of {format_bytes(self.budget)} "
            f"(state {format_bytes(self.state)} + saved activations {format_bytes(self.fixed)} "
            f"+ {format_bytes(self.per_row)} per sample)"
        )
        if self.excess:
            line += f"; still exceeds the budget by {format_bytes(self.excess)} at 1 sample"
        return line


def choose_parts(
    rows: int, state: int, saved_one: int, saved_two: int, budget: int
) -> MicroBatchChoice:
    """The fewest near-equal parts of a batch of `rows` whose largest fits `budget`, from the
    saved bytes measured on 1 and 2 rows (fit: fixed + per_row * n, both clamped at 0, which
    only overestimates). One row per part when even that does not fit."""
    per_row = max(saved_two - saved_one, 0)
    fixed = max(saved_one - per_row, 0)
    room = budget - state - fixed
    # Rows that fit in one part: all of them, else as many as the room allows (at least 1).
    fitting = rows if per_row == 0 or room >= per_row * rows else max(1, room // per_row)
    parts = math.ceil(rows / fitting)
    return MicroBatchChoice(rows, parts, math.ceil(rows / parts), state, fixed, per_row, budget)


def part_sizes(rows: int, part_rows: int) -> list[int]:
    """`rows` in the fewest near-equal parts of at most `part_rows` (larger parts first)."""
    parts = math.ceil(rows / part_rows)
    small, extra = divmod(rows, parts)
    return [small + 1] * extra + [small] * (parts - extra)


class MicroBatcher:
    """One model's `accumulate="auto"`: the pending decision, then the splitting of every batch.
    Shared by its loader (`MicroBatchLoader`) and its forward layer (`DecideOnFirstForward`)."""

    def __init__(
        self,
        root: nn.Module,
        acc: Accumulator,
        budget_option: int | str | None,
        state: StepMemory,
        report: Report,
        dist: DistState | None,
    ) -> None:
        self.root = root
        self.acc = acc
        self.budget_option = budget_option
        self.state = state
        self.report = report
        self.dist = dist
        self.part_rows: int | None = None  # decided: the most rows of a micro-batch
        self.probe: int | None = None  # rows of the probe part, while it is being trained on
        self.rows = 0  # rows of the first batch
        self.stood_down = False

    @property
    def pending(self) -> bool:
        """The probe part is out and nothing is decided yet."""
        return self.probe is not None and self.part_rows is None and not self.stood_down

    def parts(self, batch: Any) -> Iterator[Any]:
        """The micro-batches of one batch of the user's loader, setting the accumulator's cycle."""
        rows = batch_rows(batch)
        if rows is None and not self.stood_down:
            if self.part_rows is None:
                self.stand_down(
                    f"the first batch ({type(batch).__name__}) is not tensors with one first "
                    "dimension, so it cannot be split without guessing"
                )
            else:
                warnings.warn(
                    "autoopt accumulate='auto': a batch that cannot be split runs whole",
                    stacklevel=3,
                )
        if rows is None or self.stood_down:
            yield from self._whole(batch)
        elif self.part_rows is None:
            yield from self._first(batch, rows)
        else:
            yield from self._split(batch, rows, part_sizes(rows, self.part_rows))

    def _whole(self, batch: Any) -> Iterator[Any]:
        self.acc.begin_cycle(1)
        self.acc.part = None  # the backward is not seeded
        yield batch

    def _split(self, batch: Any, rows: int, sizes: list[int]) -> Iterator[Any]:
        if len(sizes) == 1:
            yield from self._whole(batch)
            return
        self.acc.begin_cycle(len(sizes))
        for size, part in zip(sizes, split_rows(batch, sizes), strict=True):
            self.acc.part = (size, rows)
            yield part

    def _first(self, batch: Any, rows: int) -> Iterator[Any]:
        """The probe part, the decision made at its forward, then the rest of the batch."""
        if rows == 1:
            self.stand_down("batches of 1 sample: nothing to split")
            yield from self._whole(batch)
            return
        probe = min(PROBE_ROWS, rows - 1)
        self.probe, self.rows = probe, rows
        head, rest = split_rows(batch, [probe, rows - probe])
        self.acc.begin_cycle(2)  # the probe is never the last part
        self.acc.part = (probe, rows)
        yield head
        if self.pending:
            self.stand_down("no training forward of the model ran on the first micro-batch")
        self.probe = None
        # Stood down: the rest in one part, still seeded with its share (exact).
        sizes = (
            [rows - probe] if self.part_rows is None else part_sizes(rows - probe, self.part_rows)
        )
        self.acc.steps = 1 + len(sizes)
        for size, part in zip(sizes, split_rows(rest, sizes), strict=True):
            self.acc.part = (size, rows)
            yield part

    def decide(self, forward: Forward, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Measure the forward on the probe's inputs at 1 and 2 rows and choose the parts."""
        probe = self.probe
        assert probe is not None
        if not any_tensor((args, kwargs), lambda t: t.dim() > 0 and t.shape[0] == probe):
            self.stand_down(
                f"the model's inputs have no dimension of the first micro-batch's {probe} rows"
            )
            return
        device = module_device(self.root)
        budget = resolve_budget(
            self.budget_option, device, held=resident_bytes(self.root, None, device)
        )
        if budget is None:
            self.stand_down(f"memory_budget={self.budget_option!r} sets no limit on {device}")
            return
        planner: Planner | None = getattr(self.root, PLANNER_ATTR, None)
        planning = planner is not None and not planner.decided

        def saved(rows: int) -> int:
            a, k = with_rows((args, kwargs), probe, rows)
            if planner is not None and planning:
                return planner.saved_when_all_checkpointed(forward, a, k)
            return measure_saved(self.root, forward, a, k)

        try:
            one, two = saved(1), saved(2)
        except Exception as err:  # an op that cannot take 1 row, ...
            self.stand_down(f"could not measure the forward ({type(err).__name__}: {err})")
            return
        choice = choose_parts(self.rows, self.state.state, one, two, budget)
        if self.dist is not None:
            choice = self._agree(choice, device)
        self.part_rows = choice.part_rows
        if planner is not None and planning:
            planner.decide(forward, *with_rows((args, kwargs), probe, choice.part_rows))
        self._record(choice, checkpointed=planner is not None and planning)

    def _agree(self, choice: MicroBatchChoice, device: torch.device) -> MicroBatchChoice:
        """Every rank splits as the one with the smallest parts: DDP all-reduces once per batch,
        so all ranks need the same number of parts."""
        smallest = torch.tensor([choice.part_rows], device=device)
        torch.distributed.all_reduce(smallest, op=torch.distributed.ReduceOp.MIN)
        part_rows = int(smallest.item())
        if part_rows == choice.part_rows:
            return choice
        parts = math.ceil(choice.rows / part_rows)
        return replace(choice, parts=parts, part_rows=math.ceil(choice.rows / parts))

    def _record(self, choice: MicroBatchChoice, checkpointed: bool) -> None:
        how = "with every block checkpointed, " if checkpointed else ""
        measured = f"measured {how}on 1 and 2 samples of the first batch"
        if choice.parts == 1:
            self.report.replace(
                PassResult.skipped(
                    NAME,
                    f"auto: a batch of {choice.rows} samples fits, batches stay whole: "
                    f"{choice.render()}, {measured}",
                )
            )
            return
        line = (
            f"auto: {choice.parts} micro-batches of <= {choice.part_rows} samples per batch of "
            f"{choice.rows} (fewer for a smaller last batch; the first batch starts with a "
            f"probe of {self.probe}): {choice.render()}, {measured}; optimizer.step(), "
            f"zero_grad() and LR schedulers act once per batch; {_ASSUMPTION}"
        )
        if self.dist is not None:
            line += "; DDP all-reduces on the last micro-batch only"
        self.report.replace(PassResult.applied(NAME, line))

    def stand_down(self, reason: str) -> None:
        """Keep batches whole from now on, with a warning and the reason in the report."""
        self.stood_down = True
        warn_stand_down(reason)
        self.report.replace(PassResult.skipped(NAME, stand_down_line(reason)))


def warn_stand_down(reason: str) -> None:
    """The warning of every stand-down of `accumulate="auto"`."""
    warnings.warn(
        f"autoopt accumulate='auto' stands down: {reason}; batches stay whole", stacklevel=4
    )


def stand_down_line(reason: str) -> str:
    """The report line of a stand-down."""
    return f"auto stood down: {reason}; batches stay whole"


def with_rows(obj: Any, rows: int, wanted: int) -> Any:
    """`obj` with each tensor whose first dimension is `rows` cut or repeated to `wanted` rows."""

    def resize(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0 or t.shape[0] != rows:
            return t
        if wanted <= rows:
            return t[:wanted]
        return t[torch.arange(wanted, device=t.device) % rows]

    return map_tensors(obj, resize)


class DecideOnFirstForward:
    """The root's forward layer: decide at the training forward on the probe part."""

    def __init__(self, forward: Forward, batcher: MicroBatcher) -> None:
        self.forward = forward
        self.batcher = batcher

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        batcher = self.batcher
        if batcher.pending and torch.is_grad_enabled() and batcher.root.training:
            batcher.decide(self.forward, args, kwargs)
        return self.forward(*args, **kwargs)


class MicroBatchLoader(LoaderProxy):
    """What `optimize()` returns as the loader under `accumulate="auto"`: the micro-batches of
    each batch of the loader it wraps. `len()` counts batches (optimizer steps), as the user's
    loader does; other attributes fall through to the wrapped loader."""

    def __init__(self, loader: Any, batcher: MicroBatcher) -> None:
        self._loader = loader
        self._batcher = batcher

    def __iter__(self) -> Iterator[Any]:
        for batch in self._loader:
            yield from self._batcher.parts(batch)

    def __repr__(self) -> str:
        return f"MicroBatchLoader({self._loader!r})"
