"""The candidates tuning measures: `Plan` (values for the searched options of `optimize()`),
the default plan (what `optimize()` chooses without tuning) and the search space."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autoopt.runtime.options import COMPILE_MODES, Options, eager_numerics
from autoopt.runtime.passes import amp as amp_pass
from autoopt.runtime.passes import channels_last as channels_last_pass
from autoopt.runtime.passes import compile as compile_pass
from autoopt.runtime.passes import device as device_pass
from autoopt.runtime.tune import apply

# The options tuning searches; the others (checkpoint, device, ...) are not speed choices.
SEARCHED = ("amp", "compile", "channels_last")


@dataclass(frozen=True)
class Plan:
    """One candidate: values for the searched options of `optimize()` ("auto" lets optimize()
    decide).

    Subclass and override `apply` to try something `optimize()` cannot express (the candidate is
    still measured and checked against eager fp32 like any other)."""

    amp: str | bool = False
    compile: str | bool = False
    channels_last: str | bool = False

    @property
    def label(self) -> str:
        if "auto" in (self.amp, self.compile, self.channels_last):
            return "defaults"
        parts = [str(self.amp)] if self.amp else []
        if self.compile:
            parts.append("compile" if self.compile is True else f"compile={self.compile}")
        if self.channels_last:
            parts.append("channels_last")
        return "+".join(parts) or "fp32"

    def options(self) -> dict[str, Any]:
        return {"amp": self.amp, "compile": self.compile, "channels_last": self.channels_last}

    def apply(
        self, model: nn.Module, batches: list[Any], optimizer: Any, options: Options
    ) -> tuple[nn.Module, Any, Any]:
        """Apply the plan to copies: returns (model, batches on the device, optimizer)."""
        return apply.optimize_copy(model, batches, optimizer, options, self.options())


_AMP_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}

REFERENCE = Plan()  # eager fp32: the baseline every candidate is checked against


def default_plan(model: nn.Module, options: Options) -> Plan | None:
    """The plan `optimize()` makes for `model` without tuning: the passes' own `choose()`
    decisions, and their stand-downs where eager's kernels stay (`eager_numerics`: compile and
    the layout left on "auto" stay off); nothing runs, nothing is copied. None when the device
    asked for is not here."""
    try:
        device = target_device(options, model)
    except ValueError:
        return None
    dtype, _ = amp_pass.choose(model, device, options.amp)
    how, _ = compile_pass.choose(options.compile, device)
    layout, _ = channels_last_pass.choose(options.channels_last, model)
    if eager_numerics(options, timed=device.type == "cpu") is not None:
        how = None if options.compile == "auto" else how
        layout = False if options.channels_last == "auto" else layout
    # amp="script" is held as given (the script's precision), as `combinations` holds it.
    held = options.amp if options.amp == "script" else False
    compiled = {None: False, "torch.compile": True, "jit": "jit"}[how]
    if how is not None and options.compile in COMPILE_MODES:
        compiled = options.compile  # a mode asked for is held as given
    return Plan(
        amp=_AMP_NAMES[dtype] if dtype is not None else held,
        compile=compiled,
        channels_last=layout,
    )


def candidate_plans(model: nn.Module, options: Options, static: bool = False) -> list[Plan]:
    """What tuning measures: the default plan first (when there is one), then every other
    combination of the searched options left on "auto" that can pay on this machine; options
    the user set are held. `static`: the batches have one shape (see `combinations`)."""
    return with_default(combinations(model, options, static), default_plan(model, options))


def combinations(model: nn.Module, options: Options, static: bool = False) -> list[Plan]:
    """Every combination of the searched options left on "auto" that can pay on this machine.
    On CUDA compile's modes are candidates too: "max-autotune", and "reduce-overhead" (CUDA
    graphs) when the batches drawn are `static` (one shape: a graph is recorded per shape)."""
    amps: list[str | bool] = [False]
    if options.amp != "auto":
        amps = [options.amp]
    else:
        # What amp="auto" picks is the one that can pay (a CPU without native bf16 emulates it:
        # slower, so "auto" picks nothing there and neither is a candidate).
        try:
            device = target_device(options, model)
            dtype, _ = amp_pass.choose(model, device, "auto")
        except ValueError:
            device, dtype = None, None
        if dtype is not None:
            amps.append(_AMP_NAMES[dtype])
        if dtype is torch.bfloat16 and device is not None and device.type == "cuda":
            # a GPU with native bf16 runs fp16 on the same Tensor Cores: both are measured (fp16
            # with its loss scaling), as the precision is a speed choice there too
            amps.append("fp16")
    compiles: list[str | bool] = [False, True] if options.compile == "auto" else [options.compile]
    if options.compile == "auto" and _on_cuda(model, options):
        compiles += ["max-autotune", "reduce-overhead"] if static else ["max-autotune"]
    has_conv = any(isinstance(m, nn.Conv2d) for m in model.modules())
    if options.channels_last == "auto":
        layouts = [False, True] if has_conv else [False]
    else:
        layouts = [bool(options.channels_last)]
    return [Plan(a, c, cl) for a, c, cl in itertools.product(amps, compiles, layouts)]


def _on_cuda(model: nn.Module, options: Options) -> bool:
    try:
        return target_device(options, model).type == "cuda"
    except ValueError:
        return False


def with_default(plans: list[Plan], default: Plan | None) -> list[Plan]:
    """`plans` with `default` first (once)."""
    if default is None:
        return plans
    return [default] + [p for p in plans if p != default]


def target_device(options: Options, model: nn.Module) -> torch.device:
    """The device optimize() will train `model` on (the device pass's choice). Raises
    ValueError when the device asked for is not here."""
    return device_pass.choose(options.device, model)[0]


def with_plan(options: Options, plan: Plan) -> Options:
    """The user's options with each searched option that was "auto" set to the plan's value."""
    chosen = {k: v for k, v in plan.options().items() if getattr(options, k) == "auto"}
    return dataclasses.replace(options, **chosen)


def find(plans: list[Plan], label: str) -> Plan | None:
    """The plan with this label (how the cache names the chosen plan)."""
    return next((p for p in plans if p.label == label), None)


def complexity(plan: Plan) -> int:
    """How much a plan changes: compile counts double (warm-up time, failure modes), a compile
    mode once more (a longer compile; CUDA graphs' static memory)."""
    if type(plan) is not Plan:  # a custom plan: rank it by time alone
        return 0
    mode = plan.compile in COMPILE_MODES
    return bool(plan.amp) + 2 * bool(plan.compile) + mode + bool(plan.channels_last)
