"""Pass: amp. Autocast the forward in bf16 or fp16; floating outputs come back as fp32.

"auto" picks bf16 where the hardware computes it natively (CUDA compute capability >= 8.0, or a
CPU with AVX512-BF16/AMX; figures in docs/benchmarks/cpu.md), else fp16 on CUDA, else nothing:
fp16 autocast on a CPU without native half math is slower than fp32. On CPU native bf16 is not
enough: for a small model the casts cost more than the bf16 math saves (a 2-layer transformer
LM here ran 0.8x of eager under bf16 autocast), so there "auto" is a measured choice
(`autoopt.runtime.trials.choices`): bf16 and fp32 each run some of the first real training steps
(forward and backward timed), after the layout (in the layout the trials kept), and the faster
stays from the next step on. Until then a step runs in bf16 or fp32 as the trials' log says,
each computing what torch's autocast (or plain fp32) computes; pass amp='bf16' or amp=False to
fix it from the first step. With `compile=True` the trials run through the compiled forward, so
bf16 is measured *with* compile (one more compile: Llama and T5 were 0.81x/0.84x of eager
compiled in bf16, where compile in fp32 is faster than eager). Not measured under torchrun (DDP/FSDP: ranks could choose differently),
and the report says so.
Explicit "bf16"/"fp16" are honoured on any device autocast supports (fp16 on CPU is how the
fp16 path is tested without a GPU). fp16 adds dynamic loss scaling at the root of every backward
(`loss_scaling`, `root_scaling`). A loop with its own autocast or GradScaler makes both step aside
(`user_amp`); `amp="script"` says so up front: no autocast and no loss scaling from autoopt,
the precision is the script's (`SCRIPT`), while compile, the layout and the optimizer step are
chosen as usual (unlike `amp=False`, which keeps eager's fp32 kernels). Under FSDP2 the dtype goes to FSDP's own mixed-precision policy instead of
autocast, and fp16 stands down (`_under_fsdp`). The layers are objects of module-level classes, so the model deep-copies and
pickles with them (an EMA copy computes with its own weights). A copy is not registered with
`root_scaling`: its backward is unscaled, because no step of its own skips non-finite gradients
(a copy is for evaluation/EMA; training one needs `optimize()` on a plain model).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from autoopt.runtime import hardware
from autoopt.runtime.context import Context, Forward, ForwardLayer, Stage, StepLayer
from autoopt.runtime.loading.batch import map_tensors
from autoopt.runtime.options import eager_numerics
from autoopt.runtime.report import PassResult, Report
from autoopt.runtime.scaling import later_optimizers, loss_scaling, root_scaling
from autoopt.runtime.scaling.grad_scalers import unwatch_grad_scalers, watch_grad_scalers
from autoopt.runtime.scaling.user_amp import UserAmp
from autoopt.runtime.trials.choices import Choice, default_clock, trials_of

NAME = "amp"

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
UNMEASURED_UNDER_TORCHRUN = (
    "not measured under torchrun (every rank must make the same choice); pass amp=False for fp32"
)
SCRIPT = (
    "amp='script': the precision is the script's own (its autocast/GradScaler, or fp32): autoopt "
    "adds no autocast and no loss scaling; compile, the layout and the optimizer step are chosen "
    "as usual"
)
# How this pass's trials read the time (`trials.Choice.clock`); a test injects a fake clock here.
CLOCK: Callable[[], float] = default_clock


def _clock() -> float:
    return CLOCK()


def choose(
    model: torch.nn.Module, device: torch.device, requested: str | bool
) -> tuple[torch.dtype | None, str]:
    """The autocast dtype for `model` on `device` given the user's `amp=` (None: no autocast),
    and why. Pure: `tune` and `doctor` reuse it."""
    if requested is False:
        return None, "amp=False"
    if requested == "script":
        return None, SCRIPT
    if requested == "auto":
        return _auto(model, device)
    if not torch.amp.is_autocast_available(device.type):
        return None, f"autocast is not available on {device.type}"
    return _DTYPES[requested], f"amp={requested!r}"


def run(ctx: Context) -> PassResult:
    """Register the autocast layer and, for fp16, loss scaling at the root of each backward."""
    device = ctx.device if ctx.device is not None else hardware.module_device(ctx.model)
    dtype, why = choose(ctx.model, device, ctx.options.amp)
    if dtype is None:
        return PassResult.skipped(NAME, why)
    cause = eager_numerics(ctx.options, timed=device.type == "cpu")
    if ctx.options.amp == "auto" and cause is not None:  # amp=False chose no dtype above
        return PassResult.skipped(
            NAME, f"{why}, but {cause} (whether bf16 stays); amp='bf16' forces it"
        )
    if ctx.dist is not None and ctx.dist.strategy == "fsdp":
        return _under_fsdp(ctx, dtype, why)
    ctx.amp_dtype = dtype
    if watch_grad_scalers():
        ctx.undo.append(unwatch_grad_scalers)
    users = UserAmp(ctx.report, NAME)
    layer = AutocastLayer(device.type, dtype, users)
    ctx.forward_layers.append(ForwardLayer(NAME, Stage.INNER, layer.wrap))
    name = "bf16" if dtype is torch.bfloat16 else "fp16"
    if dtype is not torch.float16:
        result = PassResult.applied(NAME, f"{name} autocast: {why}")
        if ctx.options.amp == "auto" and device.type == "cpu":
            if ctx.dist is not None:
                return PassResult.applied(NAME, f"{result.detail}; {UNMEASURED_UNDER_TORCHRUN}")
            result = PassResult.applied(
                NAME,
                f"{result.detail}; on CPU: kept only if training steps measure faster than in "
                "fp32 (bf16 and fp32 take turns on the first steps until then; fp32 before "
                "any training step)",
            )
            # Nothing that changes the numbers runs unmeasured: an inference-only model (no
            # training step ever measures bf16) stays fp32.
            layer.enabled = False
            trial = AmpChoice(layer, ctx.report, result)
            trials_of(ctx).add(
                Choice(NAME, ["bf16", "fp32"], trial.apply, trial.decided, _clock, "fp32")
            )
        return result
    scaler = loss_scaling.LossScaler(device, user_amp=users)
    root_scaling.register(ctx.model, scaler=scaler)
    ctx.undo.append(functools.partial(root_scaling.unregister, ctx.model))
    loss_scaling.install(ctx.model, scaler)
    later_optimizers.watch()  # an optimizer built later skips non-finite steps too
    ctx.extras["loss_scaler"] = scaler
    if ctx.optimizer is not None:
        ctx.step_layers.append(StepLayer(NAME, ScaledStep(ctx.optimizer, scaler).wrap))
        step_note = "optimizer.step() skips non-finite steps, as does any optimizer built later"
    else:
        step_note = "every optimizer.step() over its parameters skips non-finite steps"
    return PassResult.applied(
        NAME,
        f"fp16 autocast: {why}; dynamic loss scaling at the root of every backward (init "
        f"{scaler.scale:g}; {step_note})",
    )


def _under_fsdp(ctx: Context, dtype: torch.dtype, why: str) -> PassResult:
    """FSDP2 applies the precision itself (`MixedPrecisionPolicy`, set by the distributed
    pass's finalizer from `ctx.amp_dtype`); an autocast layer as well would cast twice. fp16
    stands down: its non-finite check would see only this rank's gradient shard, so ranks could
    disagree on skipping a step."""
    if dtype is torch.float16:
        reason = (
            "fp16 loss scaling is not supported under FSDP2 (each rank sees only its gradient "
            "shard when checking for inf/nan); training in fp32, pass amp='bf16' for bf16"
        )
        warnings.warn(f"autoopt: {reason}", stacklevel=2)
        return PassResult.skipped(NAME, reason)
    ctx.amp_dtype = dtype
    cpu_auto = ctx.options.amp == "auto" and (ctx.device is None or ctx.device.type == "cpu")
    unmeasured = f"; {UNMEASURED_UNDER_TORCHRUN}" if cpu_auto else ""
    return PassResult.applied(
        NAME,
        f"bf16 through FSDP2's MixedPrecisionPolicy (bf16 compute, fp32 gradient reduction and "
        f"outputs) instead of autocast: {why}{unmeasured}",
    )


def _auto(model: torch.nn.Module, device: torch.device) -> tuple[torch.dtype | None, str]:
    floating = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if floating and floating != {torch.float32}:
        shown = ", ".join(sorted(str(d).removeprefix("torch.") for d in floating))
        return None, f"the model's parameters are already {shown}, not float32"
    if device.type == "cuda":
        if hardware.cuda_supports_bf16(device):
            return torch.bfloat16, f"{torch.cuda.get_device_name(device)} has native bf16"
        return torch.float16, "this GPU has no native bf16 (compute capability < 8.0)"
    if device.type == "cpu":
        if hardware.cpu_supports_bf16():
            feats = hardware.cpu_features()
            has = "AMX" if feats.get("amx_tile") else "AVX512-BF16"
            return torch.bfloat16, f"CPU has {has}"
        return None, (
            "CPU has no native bf16 (AVX512-BF16/AMX) and fp16 autocast on CPU is slower than "
            "fp32; pass amp='bf16' to force it"
        )
    return None, f"no automatic choice for device type {device.type!r}; pass amp='bf16'/'fp16'"


@dataclass
class AutocastLayer:
    """The forward under autocast, floating outputs back in fp32; steps aside (for good) when the
    user's own autocast is already active at the forward. Plain state only: copies and pickles."""

    device_type: str
    dtype: torch.dtype
    user_amp: UserAmp
    enabled: bool = True  # False: fp32 measured faster (`AmpChoice`)

    def wrap(self, forward: Forward) -> Forward:
        """`ForwardLayer.wrap`: `forward` under this layer."""
        return functools.partial(self.run, forward)

    def run(self, forward: Forward, *args: Any, **kwargs: Any) -> Any:
        """Call `forward` under autocast, unless the user's AMP is in charge or fp32 measured
        faster."""
        if self.user_amp.reason is None and torch.is_autocast_enabled(self.device_type):
            self.user_amp.stand_down("autocast was already active at the model's forward")
        if self.user_amp.reason is not None:
            return forward(*args, **kwargs)
        if not self.enabled:
            return forward(*args, **kwargs)
        return self.autocast(forward, *args, **kwargs)

    def autocast(self, forward: Forward, *args: Any, **kwargs: Any) -> Any:
        """`forward` under autocast, floating outputs back in fp32."""
        with torch.autocast(self.device_type, dtype=self.dtype):
            out = forward(*args, **kwargs)
        if isinstance(out, torch.Tensor):  # the common case, without a container walk
            return self._to_fp32(out)
        return map_tensors(out, self._to_fp32)

    def _to_fp32(self, t: torch.Tensor) -> torch.Tensor:
        return t.float() if t.dtype == self.dtype else t


@dataclass
class AmpChoice:
    """bf16 autocast or fp32, as a measured choice (`trials.Choice`). The forward alone
    misleads: a small LM's forward was faster in bf16 while its training step was 0.75x of
    fp32's; the trials time forward and backward."""

    layer: AutocastLayer
    report: Report
    result: PassResult  # the APPLIED entry, extended with what was measured

    def apply(self, option: str) -> None:
        """`Choice.apply`: autocast on for "bf16", off for "fp32"."""
        self.layer.enabled = option == "bf16"

    def decided(self, winner: str, measured: str) -> None:
        """`Choice.decided`: report what the trials kept (unless the user's own AMP took over
        meanwhile: its stand-down line stays)."""
        if self.layer.user_amp.reason is not None:
            return
        if winner == "bf16":
            self.report.replace(PassResult.applied(NAME, f"bf16 autocast: {measured}"))
            return
        if measured.startswith("not measured"):
            self.report.replace(PassResult.skipped(NAME, f"fp32 kept ({measured})"))
            return
        self.report.replace(
            PassResult.skipped(NAME, f"fp32 kept: {measured}; amp='bf16' forces it")
        )


@dataclass
class ScaledStep:
    """`optimizer.step()` that skips non-finite steps and updates the scale."""

    optimizer: torch.optim.Optimizer
    scaler: loss_scaling.LossScaler

    def wrap(self, step: Any) -> Any:
        """`StepLayer.wrap_step`."""
        return functools.partial(self.run, step)

    def run(self, step: Any, *args: Any, **kwargs: Any) -> Any:
        """The step, gated by the inf/nan check."""
        if args or kwargs:
            # A closure re-runs backward inside step(): the inf check cannot run first.
            return step(*args, **kwargs)
        return self.scaler.step(self.optimizer, step)
