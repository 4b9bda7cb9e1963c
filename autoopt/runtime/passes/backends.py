"""Pass: backends. cuDNN/TF32 flags on CUDA, and the fused (else foreach) optimizer step.

CUDA: `cudnn.benchmark=True` and TF32 matmul/convolutions (Ampere+), unless `deterministic=True`,
which sets `cudnn.deterministic=True, benchmark=False` instead, or `amp=False`, which sets none
(they change how fp32 rounds; the user's flags stay).

Optimizer: on CUDA the fused step (one kernel for the whole update) is faster than foreach
(a few kernels) and the default step, on every GPU: it is chosen there, else foreach. On CPU it
depends on the machine and the parameters (the fused kernel won 4x on one CPU and lost to the
default loop on the channels-last CNN of another; figures in docs/benchmarks/optimizer-step.md),
so the candidates (fused, foreach, the default step) are timed on the real optimizer: after the
first step (which creates the state), each runs real steps in turn (ROUNDS turns; a candidate
twice as slow as the best drops out), and the fastest by median stays if it is ahead of the
user's own (default) step beyond the noise of their side-by-side samples (`timing.choose`),
else the user's own stays; the report says what was measured. They compute the same update up to fp32 rounding, so the training is the same
whichever runs. Under torchrun every rank must make the same choice, so there the rule stands.
Support is probed by building and stepping a throwaway optimizer of the same class, which covers
every version- and device-specific check torch makes. The user's param groups and their options
stay as they are; only `fused`/`foreach` change. An explicit `fused=`/`foreach=` is respected.
Under `amp=False`, and `deterministic=True` on CPU (`options.eager_numerics`), a candidate must
also update bit for bit as the user's optimizer as constructed does (`same_updates`); the others
are left out, and the report line says so.
`optimizer.state_dict()` still holds the user's own flags (see `optimizer_state`).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from autoopt.runtime import hardware, optimizer_state
from autoopt.runtime.context import Context, StepLayer
from autoopt.runtime.options import eager_numerics
from autoopt.runtime.report import PassResult, Report
from autoopt.runtime.trials import timing
from autoopt.runtime.trials.choices import default_clock

NAME = "backends"

# How the CPU step timing reads the time (the trials' clock: CPU time with one intra-op
# thread, else wall time); a test injects a fake clock here.
CLOCK: Callable[[], float] = default_clock
ROUNDS = 3  # timed steps each candidate step implementation gets, at most
DEFAULT = "default"  # the user's own step: it stays unless another is ahead beyond the noise


@dataclass
class OptimizerImpl:
    """The step implementation chosen for an optimizer: the flags its param groups get, and the
    attributes a fused optimizer sets in `__init__` that its `step()` reads."""

    flags: dict[str, bool]
    attrs: dict[str, Any] = field(default_factory=dict)


def choose_flags(
    device: torch.device, deterministic: bool, eager: str | None = None
) -> tuple[dict[str, Any], str]:
    """The torch backend settings to make (name -> value), and why. `eager`: why eager's fp32
    kernels stay (`options.eager_numerics`): then no speed flag is set."""
    if deterministic:
        return {"cudnn.deterministic": True, "cudnn.benchmark": False}, (
            "deterministic=True: cudnn.deterministic=True, cudnn.benchmark=False, no TF32"
        )
    if device.type != "cuda":
        return {}, f"no cuDNN/TF32 flags on {device.type}"
    if eager is not None:
        return {}, (
            f"no cudnn.benchmark or TF32: {eager}, and both change how fp32 rounds (TF32 "
            "matmuls, convolution algorithms chosen by timing); torch's flags stay as they are"
        )
    if not hardware.cuda_supports_tf32(device):
        return {
            "cudnn.benchmark": True
        }, "cudnn.benchmark=True (no TF32 before compute capability 8.0)"
    settings = {
        "cudnn.benchmark": True,
        "matmul.allow_tf32": True,
        "cudnn.allow_tf32": True,
        "float32_matmul_precision": "high",
    }
    return settings, "cudnn.benchmark=True, TF32 matmul and convolutions"


# The optimizers whose fused kernel has a DTensor sharding rule (torch's
# distributed/tensor/_ops/_pointwise_ops.py); any other fused step fails on FSDP2's parameters.
_FUSED_ON_DTENSOR = (torch.optim.Adam, torch.optim.AdamW)


def choose_optimizer(
    optimizer: torch.optim.Optimizer, device: torch.device, sharded: bool = False
) -> tuple[OptimizerImpl | None, str]:
    """Fused, else foreach, else the optimizer as it is (None), and why: the rule, which the
    measurement on CPU (see `StepTiming`) starts from. `sharded`: the parameters become FSDP2
    DTensors, whose fused step exists for `_FUSED_ON_DTENSOR` only."""
    impls, why = step_candidates(optimizer, device, sharded)
    return _rule(impls, why, type(optimizer).__name__, sharded)


def _rule(
    impls: dict[str, OptimizerImpl], why: str, cls: str, sharded: bool
) -> tuple[OptimizerImpl | None, str]:
    """`choose_optimizer` from the candidates `step_candidates` found (`why`: none found)."""
    if not impls:
        return None, why
    name, impl = next(iter(impls.items()))
    if name == "fused":
        return impl, f"fused {cls} step"
    reason = (
        "its fused step has no DTensor rule for FSDP2" if sharded else "no fused kernel for it here"
    )
    return impl, f"{name} {cls} step ({reason})"


def step_candidates(
    optimizer: torch.optim.Optimizer, device: torch.device, sharded: bool = False
) -> tuple[dict[str, OptimizerImpl], str]:
    """The faster step implementations this torch has for the optimizer on `device`, preferred
    first ("fused", "foreach"); empty with the reason when there are none or the user chose."""
    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    groups = optimizer.param_groups
    if any(g.get("fused") is not None or g.get("foreach") is not None for g in groups):
        return {}, f"{cls.__name__} sets fused/foreach explicitly: kept"
    if any(g.get("differentiable") for g in groups):
        return {}, f"{cls.__name__} is differentiable: kept the default step"
    params = [p for g in groups for p in g["params"]]
    same_place = all(p.is_floating_point() and p.device == device for p in params)
    impls: dict[str, OptimizerImpl] = {}
    if (
        "fused" in accepted
        and device.type in _get_fused_kernels_supported_devices()
        and same_place
        and (not sharded or cls in _FUSED_ON_DTENSOR)
        and not optimizer.state  # fused wants its `step` state on the device; none exists yet
        and (attrs := _probe(optimizer, device, fused=True, foreach=False)) is not None
    ):
        impls["fused"] = OptimizerImpl({"fused": True, "foreach": False}, attrs)
    # Not limited to `_get_foreach_kernels_supported_devices()`: on CPU the foreach ops run as a
    # per-tensor fallback, a candidate like the others.
    if (
        "foreach" in accepted
        and same_place
        and (attrs := _probe(optimizer, device, foreach=True)) is not None
    ):
        impls["foreach"] = OptimizerImpl({"foreach": True, "fused": False}, attrs)
    return impls, f"{cls.__name__}: no fused or foreach step available here"


def run(ctx: Context) -> PassResult:
    """Set the backend flags and pick the optimizer implementation (on CPU: start timing it)."""
    device = ctx.device if ctx.device is not None else torch.device("cpu")
    eager = eager_numerics(ctx.options, timed=device.type == "cpu")
    settings, flags_note = choose_flags(device, ctx.options.deterministic, eager)
    _apply_flags(ctx, settings)
    if ctx.optimizer is None:
        detail = f"{flags_note}; no optimizer given"
        return PassResult.applied(NAME, detail) if settings else PassResult.skipped(NAME, detail)
    sharded = ctx.dist is not None and ctx.dist.strategy == "fsdp"
    impls, why = step_candidates(ctx.optimizer, device, sharded)
    apart: list[str] = []
    if eager is not None:
        # Only a step that updates as the user's own does bit for bit: timing then picks among
        # steps that compute the same numbers (foreach, on CPU as on CUDA, for most optimizers).
        impls, apart = same_updates(ctx.optimizer, device, impls)
    cls = type(ctx.optimizer).__name__
    if apart:
        one = len(apart) == 1
        steps, its = " and ".join(apart) + (" step" if one else " steps"), "its" if one else "their"
        flags_note += (
            f"; {steps} left out: {eager}, and {its} updates round apart from {cls}'s own "
            f"step ({cls}(..., {apart[0]}=True) takes it)"
        )
        why = f"{cls}'s own step"
    impl, note = _rule(impls, why, cls, sharded)
    if apart and impls:  # the rule's reason for foreach ("no fused kernel") would be wrong
        note = f"{next(iter(impls))} {cls} step (updates as {cls}'s own step does)"
    if impl is None:
        detail = f"{flags_note}; {note}"
        return PassResult.applied(NAME, detail) if settings else PassResult.skipped(NAME, detail)
    user = {key: ctx.optimizer.defaults.get(key) for key in ("fused", "foreach")}
    ours = dict(impl.flags)  # the flags a loaded checkpoint gets: the choice in force
    optimizer_state.hide_flags(ctx.optimizer, user, ours)
    if device.type == "cpu" and ctx.dist is None:
        timing = StepTiming(
            ctx.optimizer,
            {**impls, DEFAULT: OptimizerImpl(user)},
            _original_attrs(ctx.optimizer, impls),
            ours,
            ctx.report,
            flags_note,
            clock=CLOCK,
        )
        timing.install(next(iter(impls)))
        ctx.step_layers.append(StepLayer(NAME, timing.wrap))
        return PassResult.applied(NAME, f"{flags_note}; {timing.pending()}")
    _install(ctx.optimizer, impl, {}, ours)
    return PassResult.applied(NAME, f"{flags_note}; {note}")


@dataclass
class StepTiming:
    """`StepLayer.wrap_step` that times the candidate step implementations on the optimizer's
    real steps and keeps the fastest. The first step (it creates the state) is not timed; a call
    with arguments (a closure, GradScaler's fused path) runs as it is, untimed."""

    optimizer: torch.optim.Optimizer
    impls: dict[str, OptimizerImpl]  # preferred first
    original_attrs: dict[str, Any]  # the optimizer's own values of the attrs impls set
    ours: dict[str, Any]  # the flags a loaded checkpoint gets (shared with the load hook)
    report: Report
    flags_note: str
    clock: Callable[[], float] = default_clock
    times: dict[str, list[float]] = field(default_factory=dict)
    turns: list[str] = field(default_factory=list)  # who runs the next timed steps
    rounds_left: int = ROUNDS
    steps_seen: int = 0
    chosen: str | None = None

    def __post_init__(self) -> None:
        self.times = {name: [] for name in self.impls}

    def install(self, name: str) -> None:
        """Make `name` the optimizer's step implementation."""
        names = frozenset(a for impl in self.impls.values() for a in impl.attrs)
        _install(self.optimizer, self.impls[name], self.original_attrs, self.ours, names)

    def pending(self) -> str:
        """The report line while the timing is under way."""
        cls = type(self.optimizer).__name__
        return (
            f"{cls} step: timing {', '.join(self.impls)} on the first training steps "
            f"({next(iter(self.impls))} until then); the fastest stays if ahead of {DEFAULT} beyond the noise"
        )

    def wrap(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """`StepLayer.wrap_step`."""
        return functools.partial(self.run, step)

    def run(self, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One step: the next candidate's turn, timed, while the timing is under way."""
        if self.chosen is not None or args or kwargs or hasattr(self.optimizer, "grad_scale"):
            return step(*args, **kwargs)
        self.steps_seen += 1
        if self.steps_seen == 1:
            return step()
        if not self.turns:  # a new round: every candidate still worth timing, preferred first
            timed = any(self.times.values())
            self.turns = timing.still_in_the_running(self.times) if timed else list(self.impls)
        name = self.turns.pop(0)
        self.install(name)
        start = self.clock()
        out = step()
        self.times[name].append(self.clock() - start)
        if not self.turns:
            self.rounds_left -= 1
            if self.rounds_left == 0 or len(timing.still_in_the_running(self.times)) == 1:
                self.decide()
        return out

    def decide(self) -> None:
        """Keep the fastest if it is ahead of the user's own step beyond the noise, else the
        user's own; the report says what was measured."""
        self.chosen, versus = timing.choose(self.times, DEFAULT)
        self.install(self.chosen)
        cls = type(self.optimizer).__name__
        line = f"{self.chosen} {cls} step ({timing.summary(self.times)}, training steps 2-"
        line += f"{self.steps_seen})"
        figures = timing.figures(self.times)
        if versus is not None:
            line += f": {timing.verdict(timing.fastest(self.times), versus)}"
            figures.update(lead=round(versus.lead, 4), lead_noise=round(versus.noise, 4))
            figures["lead_band"] = round(math.expm1(versus.band), 4)
        result = PassResult.applied(NAME, f"{self.flags_note}; {line}")
        result.figures.update(figures)
        self.report.replace(result)


_SETTINGS = {
    "cudnn.deterministic": (torch.backends.cudnn, "deterministic"),
    "cudnn.benchmark": (torch.backends.cudnn, "benchmark"),
    "cudnn.allow_tf32": (torch.backends.cudnn, "allow_tf32"),
    "matmul.allow_tf32": (torch.backends.cuda.matmul, "allow_tf32"),
}


def _apply_flags(ctx: Context, settings: dict[str, Any]) -> None:
    """Make the settings; the previous values come back if optimize() fails later."""
    # Every previous value is read before any is set: torch ties `matmul.allow_tf32` to the
    # float32 matmul precision (setting one sets the other), so a value read after its partner
    # was set is autoopt's, and putting that back leaves torch's two APIs disagreeing
    # (`torch.get_float32_matmul_precision()` then raises).
    previous = {name: _get_flag(name) for name in settings}
    for name, value in settings.items():
        ctx.undo.append(functools.partial(_set_flag, name, previous[name]))
        _set_flag(name, value)


def _get_flag(name: str) -> Any:
    if name == "float32_matmul_precision":
        return torch.get_float32_matmul_precision()
    owner, attr = _SETTINGS[name]
    return getattr(owner, attr)


def _set_flag(name: str, value: Any) -> None:
    if name == "float32_matmul_precision":
        torch.set_float32_matmul_precision(value)
        return
    owner, attr = _SETTINGS[name]
    setattr(owner, attr, value)


def _original_attrs(
    optimizer: torch.optim.Optimizer, impls: dict[str, OptimizerImpl]
) -> dict[str, Any]:
    """The optimizer's own values of the attributes an implementation sets (those it has)."""
    names = {a for impl in impls.values() for a in impl.attrs}
    return {a: getattr(optimizer, a) for a in names if hasattr(optimizer, a)}


def _install(
    optimizer: torch.optim.Optimizer,
    impl: OptimizerImpl,
    original_attrs: dict[str, Any],
    ours: dict[str, Any],
    names: frozenset[str] = frozenset(),
) -> None:
    """Give every param group the implementation's flags and the optimizer its attributes; the
    other `names` go back to the user's optimizer's own (GradScaler reads them)."""
    optimizer.defaults.update(impl.flags)
    for group in optimizer.param_groups:
        group.update(impl.flags)
    for attr in names - impl.attrs.keys():
        if attr in original_attrs:
            setattr(optimizer, attr, original_attrs[attr])
        else:
            optimizer.__dict__.pop(attr, None)
    for attr, value in impl.attrs.items():
        setattr(optimizer, attr, value)
    ours.update(impl.flags)


def same_updates(
    optimizer: torch.optim.Optimizer, device: torch.device, impls: dict[str, OptimizerImpl]
) -> tuple[dict[str, OptimizerImpl], list[str]]:
    """The candidates whose steps update parameters bit for bit as the user's optimizer as
    constructed does, and the names of the others. Probed like support (`_probe`): throwaway
    optimizers of the same class and options take 3 steps from the same random parameters and
    gradients, of shapes that leave vector tails. Measured on CPU with torch 2.13: foreach
    matches for Adam, AdamW, SGD, RMSprop, Adagrad, Adamax and Adadelta, not for NAdam, RAdam
    and ASGD; fused differs by an ulp for Adam, AdamW and SGD with momentum."""
    dtype = next((p.dtype for g in optimizer.param_groups for p in g["params"]), torch.float32)
    accepted = inspect.signature(type(optimizer).__init__).parameters
    options = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    generator = torch.Generator().manual_seed(0)  # the global generator is the user's

    def draw() -> list[torch.Tensor]:
        shapes = ((3, 5), (17,), (64, 33))
        return [torch.randn(s, generator=generator).to(device, dtype) for s in shapes]

    start, grads = draw(), [draw() for _ in range(3)]

    def trained(flags: dict[str, bool]) -> list[torch.Tensor] | None:
        params = [p.clone().requires_grad_() for p in start]
        try:
            probe = type(optimizer)(params, **{**options, **flags})
            for step in grads:
                for param, grad in zip(params, step, strict=True):
                    param.grad = grad.clone()
                probe.step()
        except Exception:  # noqa: BLE001 - a step that cannot run here is not the same
            return None
        return params

    own = trained({})
    same: dict[str, OptimizerImpl] = {}
    apart: list[str] = []
    for name, impl in impls.items():
        got = trained(impl.flags) if own is not None else None
        if got is not None and own is not None and all(map(torch.equal, got, own)):
            same[name] = impl
        else:
            apart.append(name)
    return same, apart


def _probe(
    optimizer: torch.optim.Optimizer, device: torch.device, **flags: Any
) -> dict[str, Any] | None:
    """Can this optimizer class, with the user's defaults, build and step with `flags`? The
    attributes a fused optimizer sets in `__init__` and its `step()` reads, or None."""
    dtype = next((p.dtype for g in optimizer.param_groups for p in g["params"]), torch.float32)
    accepted = inspect.signature(type(optimizer).__init__).parameters
    options = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    options.update(flags)
    param = torch.zeros(2, device=device, dtype=dtype, requires_grad=True)
    param.grad = torch.ones_like(param)
    try:
        probe = type(optimizer)([param], **options)
        attrs = {  # read before stepping
            a: getattr(probe, a)
            for a in ("_step_supports_amp_scaling", "_need_device_dtype_check_for_fused")
            if hasattr(probe, a)
        }
        probe.step()
    except Exception:  # noqa: BLE001 - any refusal means "not supported here"
        return None
    return attrs
