"""Pass: channels_last. NHWC memory format for convolution-dominated models and their inputs.

Heuristic for "auto" (static, no input needed): estimate each layer's multiply-adds per sample as
its weight count times the output positions it is applied at. Conv2d weights are counted at 64
output positions (an 8x8 feature map: about the deepest stage of common CNNs on 32x32 to 224x224
images, so this undercounts convolutions); every other parameter is counted once (a Linear layer
applies each weight once per sample). The pass applies when Conv2d holds at least half of that
estimate. A transformer or MLP (no Conv2d) is skipped; a CNN with a big classifier head passes.
On CUDA that rule stands (NHWC is the layout cuDNN's convolutions prefer). On CPU whether NHWC
pays depends on the machine and the dtype (with bf16 autocast on one CPU, not in fp32 on another;
figures in docs/benchmarks/cpu.md), so "auto" measures it at the first forward: the forward runs
on that batch without gradients in eval mode, in both layouts in turn (one warm-up and ROUNDS
timed runs each), and the faster layout stays; buffers and RNG states are put back first, so the
training is as if it had not run. A compiled forward is not measured (that would compile it
twice more): the rule stands there, and `tune=True` measures the whole step.

`module.to(memory_format=...)` swaps `param.data` and keeps Parameter identity. 4-D floating
inputs are converted inside the forward (INPUT stage, inside the compiled region) and by the
loader (a batch transform). A model that calls `x.view(n, -1)` after its convolutions fails on
NHWC activations: when the first forward raises a RuntimeError, the model is converted back,
inputs are no longer converted, the report says so, and the call is retried.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from autoopt.runtime import optimizer_state, timing
from autoopt.runtime.batch import map_tensors
from autoopt.runtime.context import Context, Forward, ForwardLayer, Stage
from autoopt.runtime.errors import error_summary
from autoopt.runtime.passes import compile as compile_pass
from autoopt.runtime.replay import Replay, time_forwards
from autoopt.runtime.report import PassResult, Report

NAME = "channels_last"

CONV_POSITIONS = 64  # output positions a Conv2d weight is assumed to be applied at
MIN_CONV_SHARE = 0.5  # apply when Conv2d holds at least this share of the estimate
ROUNDS = 2  # timed forwards per layout when measuring on CPU (after one warm-up each)
# How the CPU measurement reads the time; a test injects a fake clock here.
CLOCK: Callable[[], float] = time.perf_counter


def conv_share(model: nn.Module) -> float:
    """The estimated share of per-sample multiply-adds spent in Conv2d layers (0..1).
    Lazy parameters not materialized yet have no size: they are not counted."""
    conv = other = 0
    conv_params: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            if not is_lazy(module.weight):
                conv += module.weight.numel() * CONV_POSITIONS
            conv_params.update(id(p) for p in module.parameters(recurse=False))
    for param in model.parameters():
        if id(param) not in conv_params and not is_lazy(param):
            other += param.numel()
    total = conv + other
    return conv / total if total else 0.0


def choose(option: str | bool, model: nn.Module) -> tuple[bool, str]:
    """Whether to put `model` in channels_last, and why."""
    if option is False:
        return False, "channels_last=False"
    if any(is_lazy(p) for p in model.parameters()):
        # Neither the layout of an uninitialized parameter nor the compute share can be set.
        return False, (
            "the model has lazy parameters not materialized yet; run one forward before "
            "optimize() to let channels_last decide"
        )
    share = conv_share(model)
    if option == "auto":
        if not any(isinstance(m, nn.Conv2d) for m in model.modules()):
            return False, "the model has no Conv2d layers"
        if share < MIN_CONV_SHARE:
            return False, (
                f"Conv2d holds ~{share:.0%} of the estimated compute (< {MIN_CONV_SHARE:.0%})"
            )
    why = "channels_last=True" if option is True else "convolution-dominated"
    return True, f"model and 4-D inputs in channels_last ({why}; Conv2d ~{share:.0%} of compute)"


def run(ctx: Context) -> PassResult:
    """Convert a convolution-dominated model and register the input conversion."""
    apply, why = choose(ctx.options.channels_last, ctx.model)
    if not apply:
        return PassResult.skipped(NAME, why)
    device = ctx.device if ctx.device is not None else torch.device("cpu")
    compiled, _ = compile_pass.choose(ctx.options.compile, device)
    measure = ctx.options.channels_last == "auto" and device.type == "cpu" and compiled is None
    state = _State(ctx.model, ctx.report, measure=measure, clock=CLOCK)
    state.convert()
    if ctx.optimizer is not None:
        optimizer_state.keep_state_contiguous(ctx.optimizer)
    ctx.forward_layers.append(ForwardLayer(NAME, Stage.INPUT, state.input_layer))
    ctx.forward_layers.append(ForwardLayer(NAME, Stage.OUTER, state.guard_layer))
    ctx.batch_transforms.append(state.transform_batch)
    ctx.extras["channels_last"] = state
    if measure:
        why += "; on CPU: kept only if measured faster than NCHW at the first forward"
    state.result = PassResult.applied(NAME, why)
    return state.result


class _State:
    """Whether channels-last is on, and the layers that convert inputs or fall back."""

    def __init__(
        self,
        model: nn.Module,
        report: Report,
        measure: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.model = model
        self.report = report
        self.measure = measure  # time both layouts at the first forward, keep the faster
        self.clock = clock
        self.active = True
        self.verified = False  # a forward has succeeded: later errors are not ours
        self.result: PassResult | None = None  # the APPLIED entry, restored if blame was wrong

    def convert(self) -> None:
        self.model.to(memory_format=torch.channels_last)

    def set_layout(self, channels_last: bool) -> None:
        self.active = channels_last
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        self.model.to(memory_format=fmt)

    def choose_layout(self, forward: Forward, *args: Any, **kwargs: Any) -> None:
        """Time the forward on this batch in both layouts (no gradients, eval mode) and keep the
        faster; everything the runs changed (buffers, RNG states, train/eval) is put back."""
        self.measure = False

        def in_layout(channels_last: bool) -> Callable[[], Any]:
            def run() -> Any:
                self.set_layout(channels_last)
                return forward(*args, **kwargs)

            return run

        candidates = {"channels_last": in_layout(True), "contiguous": in_layout(False)}
        try:
            times = time_forwards(self.model, candidates, ROUNDS, self.clock)
        except Exception:  # noqa: BLE001 - the real forward below meets (and handles) it
            self.set_layout(True)
            return
        winner = timing.fastest(times)
        measured = f"measured at the first forward: {timing.summary(times)}"
        self.set_layout(winner == "channels_last")
        if winner == "channels_last":
            assert self.result is not None
            self.result = PassResult.applied(NAME, f"{self.result.detail}; {measured}")
            self.report.replace(self.result)
        else:
            self.report.replace(PassResult.skipped(NAME, f"NCHW is faster here ({measured})"))

    def fall_back(self, err: BaseException) -> None:
        self.active = False
        self.model.to(memory_format=torch.contiguous_format)
        message = f"first forward failed in channels_last: {error_summary(err)}"
        self.report.replace(PassResult.failed(NAME, message, "contiguous (NCHW) model and inputs"))

    def _to_format(self, t: torch.Tensor) -> torch.Tensor:
        if t.dim() != 4 or not t.is_floating_point():
            return t
        if self.active:
            return t.contiguous(memory_format=torch.channels_last)
        # After a fallback, undo conversions the loader made before it (batches in flight).
        return t if t.is_contiguous() else t.contiguous()

    def transform_batch(self, batch: Any) -> Any:
        """Loader-side conversion (runs before the batch reaches the forward)."""
        return map_tensors(batch, self._to_format) if self.active else batch

    def input_layer(self, forward: Forward) -> Forward:
        return functools.partial(self.converted_forward, forward)

    def converted_forward(self, forward: Forward, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = map_tensors((args, kwargs), self._to_format)
        return forward(*args, **kwargs)

    def guard_layer(self, forward: Forward) -> Forward:
        return functools.partial(self.guarded_forward, forward)

    def guarded_forward(self, forward: Forward, *args: Any, **kwargs: Any) -> Any:
        """Until a forward succeeded: on failure, undo its side effects (BatchNorm statistics,
        RNG draws) and rerun it in NCHW."""
        if self.measure:
            self.choose_layout(forward, *args, **kwargs)
        if self.verified or not self.active:
            return forward(*args, **kwargs)
        replay = Replay(self.model)
        try:
            out = forward(*args, **kwargs)
        except RuntimeError as err:
            self.fall_back(err)
            replay.restore()
            try:
                out = forward(*args, **kwargs)
            except Exception:
                # Fails in NCHW too: the error is not channels-last's. Restore and re-raise.
                self.active = True
                self.convert()
                if self.result is not None:
                    self.report.replace(self.result)
                raise
        self.verified = True
        return out
