"""Pass: channels_last. NHWC memory format for convolution-dominated models and their inputs.

Heuristic for "auto" (static, no input needed): estimate each layer's multiply-adds per sample as
its weight count times the output positions it is applied at. Conv2d weights are counted at 64
output positions (an 8x8 feature map: about the deepest stage of common CNNs on 32x32 to 224x224
images, so this undercounts convolutions); every other parameter is counted once (a Linear layer
applies each weight once per sample). The pass applies when Conv2d holds at least half of that
estimate. A transformer or MLP (no Conv2d) is skipped; a CNN with a big classifier head passes.
On CUDA that rule stands (NHWC is the layout cuDNN's convolutions prefer). On CPU whether NHWC
pays depends on the machine, the dtype and the model (with bf16 autocast on one CPU, not in fp32
on another; DeepLabV3's eval forward is faster in NHWC, its training step slower; figures in
docs/benchmarks/cpu.md), so "auto" is a measured choice (`autoopt.runtime.trials.choices`): both layouts
run some of the first real training steps (forward and backward timed), first of the measured
choices, and the faster stays from the next step on. Each switch moves the parameters, buffers
and the optimizer's state together, between optimizer steps. A compiled forward is not measured
(that would compile it twice more): the rule stands there, and `tune=True` measures the whole
step. "auto" stands down under `amp=False` (on any device: NHWC kernels round apart from
eager's NCHW ones, and amp=False asks for eager's fp32) and under `deterministic=True` where it
would be measured (`options.eager_numerics`); channels_last=True still applies.

Channels-last stays inside the model. The 4-D parameters and buffers change layout as
`module.to(memory_format=...)` would change them (`param.data` swapped, Parameter identity kept),
the 5-D weights of a Conv3d in the same model left as they are (`.to` raises on them); 4-D floating inputs are converted at the model's boundary, inside the patched
forward (INPUT stage, inside the compiled region, after the user's forward pre-hooks), never by
the loader: user code sees the batches it would see without autoopt. The optimizer's state follows
the parameters' layout whenever it changes (at optimize(), after the trials, on a fallback, on
loading a checkpoint: `optimizer_state`). A model that calls `x.view(n, -1)` after its
convolutions fails on NHWC activations: when a forward in channels_last raises a RuntimeError,
its side effects are undone (buffers, RNG), the model is converted back, inputs are no longer
converted, the report says so, and the call is retried; if it fails in NCHW too, the error is the
user's and goes up with the layout as it was. Every forward is guarded, not only the first: the
path that meets the `.view()` may be an eval-only head, a branch taken every k steps, or a
smaller last batch.
Layout changes happen outside inference mode, so a first call under `torch.inference_mode()`
leaves parameters that later training can save for backward.
Random numbers stay the user's (`layout.random_draws`): a dropout mask is drawn in memory order,
so `nn.Dropout` modules get their 4-D NHWC inputs in NCHW and draw the NCHW loop's masks; a draw
written in a forward (`F.dropout(x)`, `torch.rand_like(x)`) cannot be, and the report names
each such place, with a warning, whenever the layout is in force. A model the user put in
channels_last already keeps its own draws.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from autoopt.runtime import optimizer_state
from autoopt.runtime.context import Context, Forward, ForwardLayer, Stage
from autoopt.runtime.errors import error_summary
from autoopt.runtime.layout import random_draws
from autoopt.runtime.loading.batch import map_tensors
from autoopt.runtime.options import eager_numerics
from autoopt.runtime.passes import compile as compile_pass
from autoopt.runtime.report import Event, PassResult, Report
from autoopt.runtime.trials.choices import Choice, default_clock, trials_of
from autoopt.runtime.trials.replay import Replay

NAME = "channels_last"

CONV_POSITIONS = 64  # output positions a Conv2d weight is assumed to be applied at
MIN_CONV_SHARE = 0.5  # apply when Conv2d holds at least this share of the estimate


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


# How this pass's trials read the time (`trials.Choice.clock`); a test injects a fake clock here.
CLOCK: Callable[[], float] = default_clock


def _clock() -> float:
    return CLOCK()


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
    cause = eager_numerics(ctx.options, timed=measure)
    if ctx.options.channels_last == "auto" and cause is not None:
        return PassResult.skipped(
            NAME,
            f"{why}, but {cause}, and NHWC kernels round apart from NCHW ones; "
            "channels_last=True forces it",
        )
    if measure and ctx.dist is not None:
        # Ranks timing apart could keep different layouts: DDP reduces gradients as flat
        # buckets laid out like each rank's parameters, so every rank keeps the rule's choice.
        measure = False
        why += "; not measured under torchrun (every rank must make the same choice)"
    user_layout = _in_channels_last(ctx.model)
    state = _State(ctx.model, ctx.report, ctx.optimizer)
    if not user_layout:
        random_draws.draw_dropout_in_nchw(ctx.model)
        state.draws = random_draws.memory_order_draws(ctx.model)
    # Measured: NCHW until the trials put a layout in force (the first step runs in NCHW).
    state.set_layout(not measure)
    if ctx.optimizer is not None:
        optimizer_state.keep_state_contiguous(ctx.optimizer)
    ctx.forward_layers.append(ForwardLayer(NAME, Stage.INPUT, state.input_layer))
    ctx.forward_layers.append(ForwardLayer(NAME, Stage.OUTER, state.guard_layer))
    if measure:  # after the guard: the trials (OUTER, later) set the layout before it sees a call
        trials_of(ctx).add(
            Choice(
                NAME,
                ["channels_last", "contiguous"],
                state.apply,
                state.decided,
                _clock,
                "contiguous",
            )
        )
    ctx.extras["channels_last"] = state
    if measure:
        why += "; on CPU: kept only if training steps measure faster than in NCHW"
    state.result = PassResult.applied(NAME, why)
    state.result.figures["conv_share"] = round(conv_share(ctx.model), 4)  # shown as "~N%"
    if not measure:
        state.announce_draws(state.result)
    return state.result


def _in_channels_last(model: nn.Module) -> bool:
    """Whether the user put `model` in channels_last already (a 4-D weight in NHWC)."""
    return any(
        p.dim() == 4
        and not p.is_contiguous()
        and p.is_contiguous(memory_format=torch.channels_last)
        for p in model.parameters()
        if not is_lazy(p)
    )


class _State:
    """Whether channels-last is on, and the layers that convert inputs or fall back."""

    def __init__(
        self, model: nn.Module, report: Report, optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        self.model = model
        self.report = report
        self.optimizer = optimizer  # its state follows the parameters' layout
        self.active = True
        self.fallen_back = False  # NCHW for good: the trials' layout switches are ignored
        self.result: PassResult | None = None  # the APPLIED entry, restored if blame was wrong
        self.draws: list[Event] = []  # draws in the forwards that NHWC changes (random_draws)

    def convert(self) -> None:
        self.set_layout(True)

    def set_layout(self, channels_last: bool) -> None:
        """Parameters, buffers and the optimizer's state in this layout; outside inference
        mode (a layout set inside it would leave inference tensors no backward can save)."""
        self.active = channels_last
        fmt = torch.channels_last if channels_last else torch.contiguous_format

        def layout(t: torch.Tensor) -> torch.Tensor:
            # 4-D tensors only: `Module.to(memory_format=torch.channels_last)` also takes the
            # 5-D weights of a Conv3d, and raises on them (a 2-D + 3-D stereo or video model)
            return t.contiguous(memory_format=fmt) if t.dim() == 4 else t

        with torch.inference_mode(False), torch.no_grad():
            self.model._apply(layout)  # as `Module.to` does: same Parameters, new `.data`
            if self.optimizer is not None:
                optimizer_state.state_like_params(self.optimizer)

    def apply(self, option: str) -> None:
        """`Choice.apply`: put the layout named `option` in force (NCHW after a fallback)."""
        self.set_layout(option == "channels_last" and not self.fallen_back)

    def decided(self, winner: str, measured: str) -> None:
        """`Choice.decided`: report the layout the trials kept (a fallback's line stays)."""
        if self.fallen_back:
            return
        if measured.startswith("not measured"):
            self.report.replace(PassResult.skipped(NAME, f"NCHW kept ({measured})"))
        elif winner == "channels_last":
            self.result = PassResult.applied(
                NAME, f"model and 4-D inputs in channels_last: {measured}"
            )
            self.announce_draws(self.result)
            self.report.replace(self.result)
        else:
            self.report.replace(PassResult.skipped(NAME, f"NCHW kept: {measured}"))

    def announce_draws(self, result: PassResult) -> None:
        """The layout is in force: list the draws it changes on `result`, with a warning."""
        if not self.draws:
            return
        result.events.extend(self.draws)
        first = self.draws[0]
        more = f" (and {len(self.draws) - 1} more place(s), listed in the report)"
        warnings.warn(
            f"autoopt: channels_last: {first.reason}; at {first.filename}:{first.lineno}"
            + (more if len(self.draws) > 1 else ""),
            stacklevel=3,
        )

    def fall_back(self, err: BaseException) -> None:
        self.fallen_back = True
        self.set_layout(False)
        message = f"first forward failed in channels_last: {error_summary(err)}"
        self.report.replace(PassResult.failed(NAME, message, "contiguous (NCHW) model and inputs"))

    def _to_format(self, t: torch.Tensor) -> torch.Tensor:
        if t.dim() != 4 or not t.is_floating_point():
            return t
        return t.contiguous(memory_format=torch.channels_last)

    def input_layer(self, forward: Forward) -> Forward:
        return functools.partial(self.converted_forward, forward)

    def converted_forward(self, forward: Forward, *args: Any, **kwargs: Any) -> Any:
        if self.active:
            args, kwargs = map_tensors((args, kwargs), self._to_format)
        return forward(*args, **kwargs)

    def guard_layer(self, forward: Forward) -> Forward:
        return functools.partial(self.guarded_forward, forward)

    def guarded_forward(self, forward: Forward, *args: Any, **kwargs: Any) -> Any:
        """In channels_last: on failure, undo the forward's side effects (BatchNorm statistics,
        RNG draws) and rerun it in NCHW."""
        if not self.active:
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
                self.fallen_back = False
                self.convert()
                if self.result is not None:
                    self.report.replace(self.result)
                raise
        return out
