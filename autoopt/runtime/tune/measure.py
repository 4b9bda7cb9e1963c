"""Timing candidates: each on its own copies of the model and optimizer, its first forward judged
against eager fp32 on the same batch, then warm-up and timed steps."""

from __future__ import annotations

import copy
import functools
import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from autoopt.runtime import hardware
from autoopt.runtime.errors import error_summary
from autoopt.runtime.loading.batch import tensors_in
from autoopt.runtime.options import Options
from autoopt.runtime.trials.choices import trial_scope
from autoopt.runtime.tune import apply
from autoopt.runtime.tune.loss import LossFn, floating_tensors, infer_loss, model_inputs, target_of
from autoopt.runtime.tune.plans import REFERENCE, Plan

DIFFERS = "rejected: differs from fp32 eager"  # the status of a plan whose results disagree
# The torch seed every candidate's compared first step starts from.
COMPARE_SEED = 0


@dataclass
class Measurement:
    """What one candidate did: its median step time, or why it was rejected."""

    plan: str
    ms_per_step: float | None = None
    warmup_s: float | None = None
    output_error: float | None = None
    loss_error: float | None = None
    status: str = "ok"  # "ok" | "rejected: <why>" | "failed: <error>"
    default: bool = False  # the plan optimize() makes without tuning
    # Each timed step, in order: in interleaved rounds the i-th steps of two plans ran side by
    # side, so their ratio is free of the load that came and went between rounds.
    steps_ms: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def measure_all(
    model: nn.Module,
    optimizer: Any,
    options: Options,
    plans: list[Plan],
    batches: list[Any],
    loss_fn: LossFn | None,
    warmup: int,
    steps: int,
    rtol: float,
    default: Plan | None = None,
) -> tuple[list[Measurement], list[tuple[Plan, Measurement]]]:
    """Reference first, then every plan; returns all measurements and the accepted plans.

    When the copies fit in memory together, the timed steps run in interleaved rounds (one step
    of each candidate in turn), so a burst of load from other processes slows every candidate
    alike instead of penalising whichever happened to run then."""
    loss_fn = loss_fn or infer_loss
    todo = [REFERENCE] + [p for p in plans if p != REFERENCE]  # a Plan subclass never equals
    interleave = fits_together(model, len(todo))
    trials: list[_Trial] = []
    # The trial mechanism's scope: the user's model, modes and every RNG as they were after,
    # and nothing that measures at a first step (trials, checkpoint planner) nested in it.
    with trial_scope(model):
        for plan in todo:
            trial = _Trial(plan, loss_fn)
            trial.start(model, optimizer, options, batches, warmup)
            if not interleave:
                trial.time(steps)
                trial.close()
            trials.append(trial)
            if plan is REFERENCE and not trial.result.ok:
                trial.close()
                return [trial.result], []  # fp32 eager cannot run on copies: nothing to compare
        if interleave:
            for _ in range(steps):
                for trial in trials:
                    trial.time(1)
            for trial in trials:
                trial.close()
    reference = trials[0]
    measurements: list[Measurement] = []
    accepted: list[tuple[Plan, Measurement]] = []
    for trial in trials:
        trial.judge(reference, rtol)
        m = trial.result
        m.default = default is not None and trial.plan == default
        if trial.plan is not REFERENCE or REFERENCE in plans:
            measurements.append(m)
        if m.ok and m.ms_per_step is not None and trial.plan in plans:
            accepted.append((trial.plan, m))
    if REFERENCE not in plans:
        measurements.insert(0, reference.result)  # shown for comparison, not a candidate
    return measurements, accepted


class _Trial:
    """One candidate on its own copies of the model and optimizer."""

    def __init__(self, plan: Plan, loss_fn: LossFn) -> None:
        self.plan = plan
        self.loss_fn = loss_fn
        self.result = Measurement(plan.label)
        self.model: nn.Module | None = None
        self.optimizer: Any = None
        self.batches: Iterator[Any] = iter(())
        self.sync_on: Any = None
        self.outputs: list[torch.Tensor] = []  # of the first forward, as fp32 on the CPU
        self.losses: list[float] = []
        self.times: list[float] = []
        self.failed_passes = ""

    def start(
        self, model: nn.Module, optimizer: Any, options: Options, batches: list[Any], warmup: int
    ) -> None:
        """Copy, apply the plan, run the first step (kept for comparison) and the warm-up."""
        try:
            self.model, self.optimizer = copy.deepcopy((model, optimizer))
        except Exception as err:  # a module holding an uncopyable object (a lock, a file, ...)
            self._fail(f"model/optimizer cannot be deep-copied ({error_summary(err)})")
            return
        dropout_on = disable_dropout(self.model)
        try:
            start = time.perf_counter()
            self.model, device_batches, self.optimizer = self.plan.apply(
                self.model, batches, self.optimizer, options
            )
            self.model.train()
            self.sync_on = device_batches[0]
            self.batches = itertools.cycle(device_batches)
            # The first step's forward (before any update) is the one compared with fp32 eager,
            # every candidate from the same RNG state: randomness left on (a dropout that is not
            # a module or a float attribute) draws the same numbers in eager candidates.
            torch.manual_seed(COMPARE_SEED)
            self._step(keep=True)
            # The rest is timed as the loop will run: with the model's dropout (GPT-2's compiled
            # steps timed without it measured 1.18x of eager; the loop ran 0.94x). A compiled
            # plan recompiles for it in the warm-up.
            dropout_on()
            for _ in range(warmup):
                self._step()
            self.result.warmup_s = round(time.perf_counter() - start, 3)
        except Exception as err:
            self._fail(error_summary(err))

    def time(self, steps: int) -> None:
        if self.model is None:
            return
        try:
            for _ in range(steps):
                t0 = time.perf_counter()
                self._step()
                self.times.append(time.perf_counter() - t0)
        except Exception as err:
            self._fail(error_summary(err))

    def close(self) -> None:
        """Read what the passes reported, then free the copies."""
        if self.model is not None:
            self.failed_passes = apply.failed_passes(self.model)
        self.model = self.optimizer = self.sync_on = None
        self.batches = iter(())

    def judge(self, reference: _Trial, rtol: float) -> None:
        """Set the status: ok, or rejected with the reason (a failure is already set)."""
        m = self.result
        if m.status != "ok":
            return
        m.ms_per_step = round(statistics.median(self.times) * 1000, 3) if self.times else None
        m.steps_ms = [round(t * 1000, 3) for t in self.times]
        if self.failed_passes:
            m.status = f"rejected: {self.failed_passes}"
        elif not all(math.isfinite(x) for x in self.losses):
            m.status = "rejected: non-finite loss"
        elif reference is not self:
            m.output_error = relative_error(self.outputs, reference.outputs)
            ref_loss = reference.losses[0]
            m.loss_error = round(abs(self.losses[0] - ref_loss) / max(abs(ref_loss), 1e-6), 6)
            worst = max(m.output_error, m.loss_error)
            if not math.isfinite(worst) or worst > rtol:
                m.status = f"{DIFFERS} by {worst:.3g} > {rtol:g}"

    def _step(self, keep: bool = False) -> None:
        loss = train_step(
            self.model,
            self.optimizer,
            next(self.batches),
            self.loss_fn,
            self.outputs if keep else None,
        )
        _sync(self.sync_on)
        self.losses.append(loss)

    def _fail(self, why: str) -> None:
        self.result.status = f"failed: {why}"
        self.close()


def fits_together(model: nn.Module, copies: int) -> bool:
    """Whether `copies` copies of the model with gradients and Adam-like state (4x the
    parameters) fit in a third of the memory available on its device."""
    size = sum(
        t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers())
    )
    device = next(model.parameters(), torch.empty(0)).device
    if device.type == "cuda" or (device.type == "cpu" and torch.cuda.is_available()):
        try:
            available = torch.cuda.mem_get_info()[0]
        except RuntimeError:
            return False
    else:
        available = hardware.available_host_memory()  # 0 when unknown: one at a time
    return copies * 4 * size < available / 3


def train_step(
    model: nn.Module,
    optimizer: Any,
    batch: Any,
    loss_fn: LossFn,
    keep_outputs: list[torch.Tensor] | None = None,
) -> float:
    """One training step; the forward's floating outputs go to `keep_outputs` (as fp32, CPU)."""
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
    args, kwargs = model_inputs(batch)
    outputs = model(*args, **kwargs)
    if keep_outputs is not None:
        keep_outputs.extend(t.detach().float().cpu() for t in floating_tensors(outputs))
    loss = loss_fn(outputs, target_of(batch))
    del outputs
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    return float(loss.detach())


def relative_error(outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """Worst relative L2 error over the output tensors (inf when their shapes differ)."""
    if len(outputs) != len(reference):
        return math.inf
    worst = 0.0
    for out, ref in zip(outputs, reference, strict=True):
        if out.shape != ref.shape:
            return math.inf
        err = (out - ref).norm() / ref.norm().clamp_min(1e-12)
        worst = max(worst, float(err))
    return round(worst, 6)


def disable_dropout(model: nn.Module) -> Callable[[], None]:
    """Switch off dropout of every kind that training mode turns on: dropout modules, and the
    float probabilities modules hand to a functional op at each call (`nn.MultiheadAttention`'s
    `dropout`, transformers' T5 `self.dropout`, Llama's `attention_dropout`, a `drop_prob` of
    stochastic depth, a `layerdrop`): any float attribute named `*drop*` between 0 and 1.
    Returns what switches them back on."""
    changed: list[tuple[nn.Module, str, float]] = []
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            changed.append((module, "p", module.p))
            module.p = 0.0
            continue
        for name, value in list(vars(module).items()):
            if "drop" in name.lower() and type(value) is float and 0.0 < value <= 1.0:
                changed.append((module, name, value))
                setattr(module, name, 0.0)
    return functools.partial(_set_attributes, changed)


def _set_attributes(values: list[tuple[nn.Module, str, float]]) -> None:
    for module, name, value in values:
        setattr(module, name, value)


def _sync(batch: Any) -> None:
    devices = {t.device for t in tensors_in(batch)}
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
