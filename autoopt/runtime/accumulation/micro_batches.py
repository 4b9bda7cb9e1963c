"""`accumulate="auto"`: the user's batch stays the effective batch; when one step of it does not
fit `memory_budget` even with every block checkpointed, each batch is split into the fewest
near-equal micro-batches that fit, and one optimizer step covers one batch.

How, on the first batch (no extra pass over the data):

1. `MicroBatchLoader` first yields 2 neighbouring rows of the first batch as a probe. Every probe
   trains with its parameters' gradients zeroed (`.grad` is left exactly as it was) and its
   forward in eval mode (no dropout); the RNG states and buffers it changed are put back before
   the batch itself comes (`Replay`), so the probes leave no trace on the first step.
2. At the training forward of the first probe, `DecideOnFirstForward` (outside compile) measures
   the bytes the forward saves for backward on its inputs cut or repeated to 1 and 2 rows, with
   every block of a `checkpoint="auto"` stack checkpointed (`Planner.saved_with_every_block`),
   else as it runs: saved(n) = fixed + per_row * n. `choose_parts` (pure) takes the fewest parts
   whose largest part fits the budget next to the parameters, gradients and optimizer state.
   Under DDP the ranks agree on the smallest part size. The checkpoint plan is then made for a
   micro-batch (the fewest blocks that fit it), not for the probe. The report's memory section
   shows the user's whole batch in eager (the same fit, measured with blocks plain) before, the
   micro-batch after.
3. Batches that fit whole stay whole: the first batch comes whole, unperturbed.
4. Split batches: each part's backward is seeded with its share of the loss's normaliser, so the
   parts rebuild the full batch's gradient (`autoopt.runtime.accumulation.loss_shares`): the samples (a
   per-sample mean), a sum, or a count of labelled tokens (`labels != -100`, shifted by one for
   causal LMs as HF shifts inside the model; `cross_entropy(..., ignore_index=-100)`). Which one
   the loss divides by is measured: the two probe rows are trained on alone too, and the ratio of
   the gradients reaching the per-sample outputs of the model and of its modules, alone and
   together, is what each normaliser predicts for one of them only. None, or several weighting
   the batch's parts differently: it stands down. Those left undistinguished (a first batch
   without padding weighs its rows by samples and by tokens alike) are kept: a later batch they
   would weight differently is probed the same way before it is split (under DDP every rank
   probes it, so all yield as many micro-batches). A part that counts no token is left out (its loss is 0/0; the
   full batch leaves those rows out). The loader then yields the first batch and every later
   batch in near-equal parts of at most the chosen rows; `optimizer.step()`, `zero_grad()` and
   LR schedulers act once per batch (`passes.accumulate`); DDP all-reduces in the last part's
   backward only.

Stands down (a warning and a report line; batches whole, the loop as without autoopt) where it
cannot keep the loop's semantics: BatchNorm (batch statistics depend on the micro-batch size),
no budget (None, or "auto" off CUDA), no loader or optimizer, FSDP2, a first batch it cannot split
(anything but tensors with one first dimension, and None), model inputs without that dimension, a
measurement that fails, no training forward on the probe, a loss whose normaliser it cannot
measure or rebuild (one that mixes rows, or divides by something it does not count).
A parameter the probes reach and the batch does not keeps its `.grad` as it was too; a probe's
loss is what the loop logs for that iteration.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import warnings
from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from autoopt.runtime.accumulation import loss_shares
from autoopt.runtime.accumulation.loss_shares import Normaliser
from autoopt.runtime.checkpointing.block_checkpoint import Mode, checkpointed_in_eval
from autoopt.runtime.checkpointing.checkpoint_plan import PLANNER_ATTR, Planner, measure_saved
from autoopt.runtime.context import DistState, Forward
from autoopt.runtime.hardware import module_device
from autoopt.runtime.loading.batch import (
    any_tensor,
    batch_rows,
    map_tensors,
    split_rows,
    tensors_in,
)
from autoopt.runtime.loading.device_loader import LoaderProxy
from autoopt.runtime.memory import (
    StepMemory,
    format_bytes,
    resident_bytes,
    resolve_budget,
)
from autoopt.runtime.report import PassResult, Report, record_plan
from autoopt.runtime.trials.replay import Replay

if TYPE_CHECKING:
    from autoopt.runtime.accumulation.accumulator import Accumulator

NAME = "accumulate"
PROBE_ROWS = 2  # rows of the first part, on which the decision is measured


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
    fixed, per_row = saved_fit(saved_one, saved_two)
    room = budget - state - fixed
    # Rows that fit in one part: all of them, else as many as the room allows (at least 1).
    fitting = rows if per_row == 0 or room >= per_row * rows else max(1, room // per_row)
    parts = math.ceil(rows / fitting)
    return MicroBatchChoice(rows, parts, math.ceil(rows / parts), state, fixed, per_row, budget)


def saved_fit(saved_one: int, saved_two: int) -> tuple[int, int]:
    """(fixed, per_row) bytes from the saved bytes on 1 and 2 rows, both clamped at 0."""
    per_row = max(saved_two - saved_one, 0)
    return max(saved_one - per_row, 0), per_row


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
        self.probe: int | None = None  # rows of the probe out now (its training forward decides)
        self.rows = 0  # rows of the first batch
        self.stood_down = False
        self.captures: list[dict[Any, torch.Tensor]] = []  # projected gradients, per probe
        self.shares: Normaliser | None = None  # how parts are weighted, once split
        self.matched: list[Normaliser] = []  # every normaliser the probes could not tell apart
        self._line = ""  # the report line of a split, before the normaliser is known

    @property
    def pending(self) -> bool:
        """The first probe is out and nothing is decided yet."""
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
            yield from self._later(batch, rows, part_sizes(rows, self.part_rows))

    def _later(self, batch: Any, rows: int, sizes: list[int]) -> Iterator[Any]:
        """A batch after the first: in parts; probed first when the loss's normaliser was never
        measured (the first batches stayed whole) or when the normalisers the probes so far
        could not tell apart weight its parts differently."""
        if len(sizes) == 1:
            yield from self._split(batch, rows, sizes)
            return
        if self.shares is None and not self.matched:  # never measured: every candidate
            cands = loss_shares.candidates(batch, rows)
            if not self._line:
                self._line = (
                    f"auto: batches of more than {self.part_rows} samples in micro-batches of "
                    f"<= {self.part_rows} (a first batch fitted whole; the first larger one is "
                    "probed on 2 samples, then on each alone, their gradients zeroed); "
                    "optimizer.step(), zero_grad() and LR schedulers act once per batch"
                )
        elif not self._undecided(batch, sizes):
            yield from self._split(batch, rows, sizes)
            return
        else:
            cands = self.matched
        a, b = loss_shares.pick_pair(cands, batch, rows)
        probes = yield from self._probes(batch, a, b, first=False)
        self._choose_shares(cands, batch, a, b, sizes)
        self.captures = []
        sizes = sizes if not self.stood_down else [rows]
        yield from self._split(batch, rows, sizes, probes=probes)

    def _undecided(self, batch: Any, sizes: list[int]) -> bool:
        """Whether the normalisers still matched weight this batch's parts differently (under
        DDP: on some rank, so that every rank probes again)."""
        undecided = len(self.matched) > 1 and not loss_shares.agree(self.matched, batch, sizes)
        if self.dist is None:
            return undecided
        flag = torch.tensor([int(undecided)], device=module_device(self.root))
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def _whole(self, batch: Any) -> Iterator[Any]:
        self.acc.begin_cycle(1)
        self.acc.part = None  # the backward is not seeded
        yield batch

    def _split(self, batch: Any, rows: int, sizes: list[int], probes: int = 0) -> Iterator[Any]:
        """`batch` in parts of `sizes` rows, each seeded with its share (after `probes` probes
        of this cycle when it is the first batch)."""
        if len(sizes) == 1 and not probes:
            yield from self._whole(batch)
            return
        parts = list(zip(self._shares(batch, sizes), split_rows(batch, sizes), strict=True))
        # A part that counts nothing (all its labels ignored) carries none of the loss: its own
        # loss would be 0/0, so it is left out, as the full batch leaves those rows out.
        if any(share[0] for share, _ in parts):
            parts = [(share, part) for share, part in parts if share[0]]
        if probes:
            self.acc.steps = probes + len(parts)
        else:
            self.acc.begin_cycle(len(parts))
        for share, part in parts:
            self.acc.part = share
            yield part

    def _shares(self, batch: Any, sizes: list[int]) -> list[tuple[int, int]]:
        """Each part's seed: its share of the normaliser the probes found (the samples before
        any)."""
        norm = self.shares if self.shares is not None else Normaliser("samples")
        return norm.shares(batch, sizes)

    def _first(self, batch: Any, rows: int) -> Iterator[Any]:
        """Probes (trained on with zero gradients, then undone), the decision made at the first
        probe's forward, then the first batch itself, whole or in parts."""
        if rows == 1:
            self.stand_down("batches of 1 sample: nothing to split")
            yield from self._whole(batch)
            return
        cands = loss_shares.candidates(batch, rows)
        a, b = loss_shares.pick_pair(cands, batch, rows)
        self.rows = rows
        probes = yield from self._probes(batch, a, b, first=True)
        if self.part_rows is not None and self.part_rows < rows:  # split (maybe stood down since)
            self._choose_shares(cands, batch, a, b, part_sizes(rows, self.part_rows))
        self.captures = []
        sizes = part_sizes(rows, self.part_rows) if self._splits(rows) else [rows]
        yield from self._split(batch, rows, sizes, probes=probes)

    def _probes(self, batch: Any, a: int, b: int, first: bool) -> Generator[Any, None, int]:
        """Yield rows a and b (= a + 1) of `batch` together, then each alone, with their
        gradients zeroed and their RNG draws and buffer updates undone afterwards; the number
        yielded. On the first batch the pair's forward decides the parts, and the single rows
        follow only when batches are split."""
        replay = Replay(self.root)
        probes = 0
        with _zero_parameter_gradients(self.root):
            self.acc.begin_cycle(4)  # a probe is never the last part
            self.acc.part = (1, 1)
            for start, size in ((a, 2), (a, 1), (b, 1)):
                if probes and (self.stood_down or (first and not self._splits(self.rows))):
                    break  # batches stay whole: no normaliser needed
                self.probe = size
                probes += 1
                yield split_rows(batch, [start, size])[1]
                if self.pending:
                    self.stand_down("no training forward of the model ran on the probe")
                if len(self.captures) != probes and not self.stood_down:
                    self.stand_down("the loop did not run one training forward per micro-batch")
            self.probe = None
        replay.restore()
        return probes

    def _splits(self, rows: int) -> bool:
        """Whether a batch of `rows` is split as decided so far."""
        return not self.stood_down and self.part_rows is not None and self.part_rows < rows

    def _choose_shares(
        self, cands: list[Normaliser], batch: Any, a: int, b: int, sizes: list[int]
    ) -> None:
        """Which normaliser the loss divides by, from the probes' output gradients; stands down
        when none, or several that weight the parts of `sizes` of this batch differently,
        reproduce them. Those that weight them alike stay `matched` for later batches."""
        if self.stood_down:  # during the probes: under DDP the other ranks still agree with it
            if self.dist is not None:
                self._agree_reason("stood down")
            return
        pair, alone_a, alone_b = self.captures
        keys = [k for k in pair if k in alone_a and k in alone_b]
        reason = None
        if not keys:
            reason = "the loss's gradient reached no per-sample output of the model"
            matched: list[Normaliser] = []
        else:
            ratio_a = loss_shares.fit_ratio(
                torch.cat([pair[k][0].flatten() for k in keys]),
                torch.cat([alone_a[k][0].flatten() for k in keys]),
            )
            ratio_b = loss_shares.fit_ratio(
                torch.cat([pair[k][1].flatten() for k in keys]),
                torch.cat([alone_b[k][0].flatten() for k in keys]),
            )
            measured = None if ratio_a is None or ratio_b is None else (ratio_a, ratio_b)
            matched = [] if measured is None else loss_shares.matching(cands, batch, a, b, measured)
            if not matched:
                reason = (
                    "the loss is not a sum over samples divided by the samples, the labelled "
                    "tokens (entries != -100) or a mask's count (measured on two samples of "
                    "the first batch), so no weighting of the parts rebuilds its gradient"
                )
            elif not loss_shares.agree(matched, batch, sizes):
                names = ", ".join(n.describe() for n in matched)
                reason = (
                    f"two neighbouring samples of a batch cannot tell the loss's normaliser "
                    f"apart between {names}, which weight its parts differently"
                )
        if self.dist is not None:
            reason = self._agree_reason(reason)
        if reason is not None:
            self.stand_down(reason)
            return
        self.matched = matched
        self.shares = matched[0]
        self.report.replace(
            PassResult.applied(
                NAME,
                f"{self._line}; each part's backward is seeded with its share of "
                f"{self.shares.describe()}, the normaliser the loss was measured to divide by "
                "(gradients at the outputs of two samples alone and together), so gradients "
                "equal the full batch's",
            )
        )

    def _agree_reason(self, reason: str | None) -> str | None:
        """Under DDP every rank stands down when one does (all yield as many parts)."""
        device = module_device(self.root)
        flag = torch.tensor([0 if reason is not None else 1], device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        if reason is None and int(flag.item()) == 0:
            return "another rank could not tell the loss's normaliser (see its warning)"
        return reason

    def run_probe(self, forward: Forward, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The probe's forward, in eval mode (no dropout: the rows' outputs are the same alone
        and in the pair). The gradients reaching each per-sample tensor it outputs, and each its
        modules output (the loss may be computed from an inner one: HF computes it from logits
        before autocast's outputs are cast), are kept per row, projected (`_projected`)."""
        capture: dict[Any, torch.Tensor] = {}
        self.captures.append(capture)
        calls = itertools.count()

        def keep(key: Any, out: Any) -> None:
            for i, t in enumerate(tensors_in(out)):
                per_row = t.dim() and t.shape[0] == self.probe and t.is_floating_point()
                if per_row and t.requires_grad:
                    row = t[0].numel()
                    t.register_hook(functools.partial(_keep_grad, capture, (key, i, row)))

        modes = [(m, m.training) for m in self.root.modules()]
        handles = [
            m.register_forward_hook(lambda _m, _i, out: keep(next(calls), out))
            for m in self.root.modules()
        ]
        self.root.eval()
        try:
            with checkpointed_in_eval():
                out = forward(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
            for m, training in modes:
                m.training = training
        keep("output", out)
        return out

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

        def saved(rows: int, mode: Mode = Mode.FULL) -> int:
            a, k = with_rows((args, kwargs), probe, rows)
            if planner is not None and planning:
                return planner.saved_with_every_block(mode, forward, a, k)
            return measure_saved(self.root, forward, a, k)

        try:
            one, two = saved(1), saved(2)
            eager = (saved(1, Mode.PLAIN), saved(2, Mode.PLAIN)) if planning else (one, two)
        except Exception as err:  # an op that cannot take 1 row, ...
            self.stand_down(f"could not measure the forward ({type(err).__name__}: {err})")
            return
        choice = choose_parts(self.rows, self.state.state, one, two, budget)
        if self.dist is not None:
            choice = self._agree(choice, device)
        self.part_rows = choice.part_rows
        if planner is not None and planning:
            planner.decide(forward, *with_rows((args, kwargs), probe, choice.part_rows))
        self._record_memory(choice, eager)
        self._record(choice, checkpointed=planner is not None and planning)

    def _record_memory(self, choice: MicroBatchChoice, eager: tuple[int, int]) -> None:
        """The report's memory section: before is the user's whole batch in eager (fit on 1
        and 2 rows), after the largest micro-batch (with its checkpoint plan, when one was
        made)."""
        fixed, per_row = saved_fit(*eager)
        before = self.state.with_activations(fixed + per_row * choice.rows)
        memory = self.report.memory
        if memory is None:
            part = self.state.with_activations(choice.fixed + choice.per_row * choice.part_rows)
            record_plan(self.report, before, part, choice.budget)
        else:
            self.report.memory = replace(memory, before=before)

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
                    f"auto: a batch of {choice.rows} samples fits, batches stay whole (after "
                    f"a probe of 2 samples whose gradients are zeroed): {choice.render()}, "
                    f"{measured}",
                )
            )
            return
        self._line = (
            f"auto: {choice.parts} micro-batches of <= {choice.part_rows} samples per batch of "
            f"{choice.rows} (fewer for a smaller last batch; the first batch is probed first on "
            f"2 samples, then on each alone, their gradients zeroed): {choice.render()}, "
            f"{measured}; optimizer.step(), zero_grad() and LR schedulers act once per batch"
        )
        if self.dist is not None:
            self._line += "; DDP all-reduces on the last micro-batch only"
        self.report.replace(PassResult.applied(NAME, self._line))

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


def _keep_grad(capture: dict[Any, torch.Tensor], key: Any, grad: torch.Tensor) -> None:
    capture[key] = _projected(grad)


_PROJECTIONS = 4  # numbers kept per row of each captured gradient


def _projected(grad: torch.Tensor) -> torch.Tensor:
    """Each row of `grad` as its sum and a few fixed cosine projections (float64, CPU): a row
    alone and in the pair give proportional projections exactly when the gradients are."""
    flat = grad.detach().reshape(grad.shape[0], -1).double()
    index = torch.arange(flat.shape[1], dtype=torch.float64, device=flat.device)
    basis = torch.stack([torch.cos(index * j * 0.6180339887) for j in range(_PROJECTIONS)], 1)
    return (flat @ basis).cpu()


@contextlib.contextmanager
def _zero_parameter_gradients(root: nn.Module) -> Iterator[None]:
    """Backward passes inside leave every parameter's `.grad` exactly as it was: the gradient
    reaching a parameter is replaced by zeros (added in place, values unchanged), and a `.grad`
    that was None is put back to None once the zeros land."""
    fresh: set[int] = set()

    def zeros(p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        if p.grad is None:
            fresh.add(id(p))
        return torch.zeros_like(grad)

    def unset(p: torch.Tensor) -> None:
        if id(p) in fresh:
            fresh.discard(id(p))
            p.grad = None

    params = [p for p in root.parameters() if p.requires_grad]
    handles = [p.register_hook(functools.partial(zeros, p)) for p in params]
    handles += [p.register_post_accumulate_grad_hook(unset) for p in params]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class DecideOnFirstForward:
    """The root's forward layer: decide at the training forward on the probe part."""

    def __init__(self, forward: Forward, batcher: MicroBatcher) -> None:
        self.forward = forward
        self.batcher = batcher

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        batcher = self.batcher
        if batcher.probe is None or not (torch.is_grad_enabled() and batcher.root.training):
            return self.forward(*args, **kwargs)
        if batcher.pending:
            batcher.decide(self.forward, args, kwargs)
        # In eval mode even when it stood down: a checkpoint plan is then made at the first
        # batch's forward, not on the probe's rows.
        return batcher.run_probe(self.forward, args, kwargs)


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
