"""Pass: compile. `torch.compile` of the forward stack, or TorchScript with `compile="jit"`.

The model is not wrapped (no `OptimizedModule`), so `state_dict` keys stay the user's. The
COMPILE layer compiles everything below it: autocast and the channels-last input conversion are
inside the graph; loss-scale hooks and device moves stay outside.

"auto" compiles on CUDA. On CPU whether compile pays depends on the model and its cold compile
costs seconds to minutes (figures in docs/benchmarks/cpu.md), so there it decides from the
compile cache (autoopt.runtime.compiling.cache): a model with no record yet is measured at its first
training step, compiled against eager (a trial choice after the layout and amp, so it compiles
once, cold; the cache keeps the compiled code for the next start), and the outcome is recorded;
a model with a record is compiled, without measuring, when its compiled steps won, and not at all
when they lost. The compile is a trial that must pay: its cost is estimated before it is paid
(`CompileCosts`: this model's last compile here, else the seconds per module of the compiles
recorded here, else defaults), and when the run as far as seen (the loader's length times the
epochs started) cannot repay it even if compiled steps were `BEST_GAIN` faster, it is not tried
on this run (eager stays; recorded as a candidate, and a later run weighs it again). Without a compile cache (compile_cache=False) a cold compile would be paid at
every start, so "auto" does not compile on CPU; under torchrun it is not measured (every rank
must decide alike). `compile=True` forces it, `tune=True` measures whole plans.
"auto" does not compile under `amp=False` (on any device: compiled kernels round apart from
eager's, and amp=False asks for eager's fp32) nor under `deterministic=True` on CPU (timing
would decide), `options.eager_numerics`; compile=True still compiles.

Regional compile: on CUDA, a model made of repeated blocks (an `nn.ModuleList`/`nn.Sequential` of
two or more modules of one class, each with submodules: transformer layers) gets
`block.compile()` on each block instead of one graph of the whole forward. The blocks share one
code object, so dynamo compiles the first and reuses it for the others; the glue around them
runs eager. On CPU the whole forward is compiled: there regional compile halved the cold
compile, but its steps were slower than whole-model compile's and no faster than eager's (the
glue runs eager, no fusion crosses a block boundary); figures in docs/benchmarks/compile.md.
`REGIONAL` forces either way.

What dynamo met (graph breaks, recompiles, compile errors, each at the user's file:line) goes into
this pass's report entry as events, read at the first call and at recompiles
(autoopt.runtime.compiling.log).

Changing shapes: a recompile because an input's size changed (a ragged last batch, a new
sequence length) is answered once: one "changing shape" event at the user's call with the fix
they can make (drop_last=True, padding to a multiple), printed instead of a line per recompile.
Torch's automatic dynamic shapes make the dimension dynamic at its first change; where it does
not (dynamic=False, or a second recompile all the same) the model is compiled with
dynamic=True, and past `SHAPE_RECOMPILE_CAP` shape recompiles it runs eager.

Restarts: with `compile_cache` on (the default, autoopt.runtime.compiling.cache) the model's
saved compile artifacts are loaded before its first compile and saved after its first compiled
step; the report's compile row says whether the cache hit and what the first step cost.

Failures: dynamo/inductor fail lazily, at the first forward (or a later recompile). The layer
catches the error, runs the eager forward instead and, when eager succeeds, stays eager for good
and records FAILED with the fallback in the report. When eager fails too, the error is the
user's (or another pass's), so the eager error is raised and compile is not blamed.

The first backward is guarded too (autoopt.runtime.compiling.guard): AOTAutograd
compiles the backward lazily, inside the user's `loss.backward()`, where no error can be caught
and undone. So the first forward with gradients on is a probe: the compiled forward and the
backward of its outputs' sum run as a trial (buffers, RNG put back; `autograd.grad`, so no
`.grad` or optimizer state is touched), which compiles both; a failure there means eager for
good. That step itself then runs eager, with hooks on its outputs that see whether a backward
through them builds a graph (`create_graph=True`: a gradient penalty), which AOTAutograd's
compiled backward cannot be differentiated through ("does not currently support double
backward"): then the model stays eager, with a warning and a report line, before any compiled
step met it. A double backward that starts only on a later step (a penalty every N steps) is
seen by the same hooks on the compiled steps; it fails that step, as torch.compile would, and
the model is eager from then on.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoopt.runtime import voice
from autoopt.runtime.compiling import cache as compile_cache
from autoopt.runtime.compiling import randomness
from autoopt.runtime.compiling.cache import CompileCache
from autoopt.runtime.compiling.guard import BackwardGuard
from autoopt.runtime.compiling.log import (
    CompileWatch,
    Where,
    code_origin,
    shape_change,
    user_call_site,
)
from autoopt.runtime.context import Context, Forward, ForwardLayer, Stage
from autoopt.runtime.errors import error_summary
from autoopt.runtime.loading.batch import map_tensors, tensor_shapes, tensors_in
from autoopt.runtime.options import COMPILE_MODES, eager_numerics
from autoopt.runtime.report import Event, PassResult, Report
from autoopt.runtime.trials.choices import NOT_TRIED, Choice, of_model, trials_of
from autoopt.runtime.trials.replay import Replay, in_trial

NAME = "compile"

# What `torch.compile` is called with; module-level so a user (or a test) can choose another
# backend or mode, e.g. `autoopt.runtime.passes.compile.BACKEND = "aot_eager"`.
BACKEND: str | Callable[..., Any] = "inductor"
COMPILE_OPTIONS: dict[str, Any] = {}
# Regional compile: None picks by the rule (repeated blocks on CUDA -> regional), True/False
# force it.
REGIONAL: bool | None = None
# Recompiles on changing input sizes: after the second one (a dimension took a third value) the
# model is compiled with dynamic=True; past the cap it runs eager.
SHAPE_RECOMPILES_BEFORE_DYNAMIC = 2
SHAPE_RECOMPILE_CAP = 8
# False: recompiles on changing shapes are left to torch and each one is listed (for measuring).
REACT_TO_SHAPES = True
# compile="reduce-overhead": the input sizes CUDA graphs are recorded for (a full batch and a
# ragged last one); a further size compiles the model in the default mode.
CUDA_GRAPH_SIZES = 2
# The largest share of a CPU training step compile="auto" expects compiling to save: bounds the
# payback of its cold compile (the best measured here: a small transformer 1.86x, 46% saved;
# docs/benchmarks/compile.md).
BEST_GAIN = 0.5


def _automatic_dynamic() -> bool:
    """Whether dynamo makes a dimension dynamic after it changed once (its default)."""
    return bool(torch._dynamo.config.automatic_dynamic_shapes)


def choose(
    option: str | bool,
    device: torch.device | None,
    cache_dir: Path | None = None,
    outcome: dict[str, str] | None = None,
) -> tuple[str | None, str]:
    """What to compile with: "torch.compile", "jit" (TorchScript), "measure" (torch.compile
    measured against eager on the first training steps) or None, and why. On CPU "auto" decides
    from the compile cache `cache_dir` and this model's recorded `outcome` there (None: none)."""
    if option is False:
        return None, "compile=False"
    device_type = device.type if device is not None else "cpu"
    if option == "auto" and device_type != "cuda":
        if cache_dir is None:
            return None, (
                f"not on CUDA ({device_type}) and no compile cache: a cold compile would be paid "
                "at every start; pass tune=True to measure it or compile=True to force it"
            )
        if outcome is None:
            return "measure", (
                f"{device_type}: no record for this model in the compile cache: measured against "
                "eager on the first training steps if the run can repay the compile"
            )
        if outcome["winner"] != "compiled":
            return None, (
                f"{device_type}: compiled steps of this model measured no faster than eager "
                f"before ({outcome['measured']}); not compiled again (compile=True forces it)"
            )
        return "torch.compile", (
            f"{device_type}: compiled steps of this model measured faster than eager before "
            f"({outcome['measured']})"
        )
    if option == "jit":
        return "jit", (
            "TorchScript (script, else a trace verified on a second batch of another shape)"
        )
    if option in COMPILE_MODES:
        return (
            "torch.compile",
            f"torch.compile (backend {_backend_name()!r}; {_mode_why(option, device_type)})",
        )
    why = "compile=True" if option is True else "CUDA"
    return "torch.compile", f"torch.compile (backend {_backend_name()!r}; {why})"


def _mode_why(mode: str, device_type: str) -> str:
    """The report's words for compile=`mode` on `device_type`."""
    if BACKEND != "inductor":
        return f"compile={mode!r}: a mode of Inductor's, not passed to this backend"
    if mode == "reduce-overhead" and device_type != "cuda":
        return (
            f"compile={mode!r}: CUDA graphs capture CUDA kernels only, so on {device_type} "
            "Inductor compiles as in its default mode"
        )
    if mode == "reduce-overhead":
        return (
            f"compile={mode!r}: CUDA graphs replay each step's kernels in one launch; the "
            f"default mode from an input size past the first {CUDA_GRAPH_SIZES}"
        )
    return f"compile={mode!r}: Inductor times its kernel variants while compiling"


def compile_mode(option: str | bool) -> str | None:
    """The `mode=` autoopt's torch.compile calls get for the option (None: the default)."""
    return option if option in COMPILE_MODES and BACKEND == "inductor" else None


def stand_down(cause: str) -> str:
    """The report line of compile="auto" standing down for `cause` (`eager_numerics`)."""
    return (
        f"not compiled: {cause}, and compiled kernels round apart from eager's (Inductor fuses "
        "and reorders reductions); compile=True compiles"
    )


def _backend_name() -> str:
    return BACKEND if isinstance(BACKEND, str) else getattr(BACKEND, "__name__", "custom")


def _left_to_the_user(model: nn.Module) -> PassResult:
    return PassResult.skipped(
        NAME,
        f"{compiled_in_place(model)} was compiled in place by the user (Module.compile()): left "
        "to its own compile",
    )


def compiled_in_place(model: nn.Module) -> str | None:
    """The name of the first module (outermost first) that `Module.compile()` compiled in place
    ("the model" for the model itself), else None. Compiling its forward again would nest one
    compile in another and trace autoopt's own layers."""
    for name, module in model.named_modules():
        if getattr(module, "_compiled_call_impl", None) is not None:
            return f"submodule {name!r}" if name else "the model"
    return None


def run(ctx: Context) -> PassResult:
    """Register the COMPILE layer (torch.compile) or the TorchScript base forward."""
    cache_dir = compile_cache.cache_dir(ctx.options.compile_cache)
    regions, regional_why = choose_regions(ctx.model, REGIONAL, ctx.device)
    auto: AutoCompile | None = None
    outcome = None
    on_cpu = ctx.device is None or ctx.device.type != "cuda"
    cause = eager_numerics(ctx.options, timed=on_cpu)
    if ctx.options.compile == "auto" and cause is not None:
        if compiled_in_place(ctx.model) is not None:
            return _left_to_the_user(ctx.model)  # the user's compile is theirs either way
        return PassResult.skipped(NAME, stand_down(cause))
    if ctx.options.compile == "auto" and on_cpu and cache_dir is not None:
        name = compile_cache.key(ctx.model, (), {}, _cache_extra(regions))
        auto = AutoCompile(ctx.report, compile_cache.Outcome(cache_dir, name))
        auto.costs = compile_cache.CompileCosts(cache_dir)
        auto.name, auto.size = name, compile_cache.model_size(ctx.model)
        outcome = auto.record.read()
    how, why = choose(ctx.options.compile, ctx.device, cache_dir, outcome)
    if how is not None and compiled_in_place(ctx.model) is not None:
        return _left_to_the_user(ctx.model)
    if how in ("measure", "torch.compile") and not randomness.draws_eager_random(BACKEND):
        if ctx.options.deterministic:
            return PassResult.skipped(
                NAME,
                f"backend {_backend_name()!r} may draw other random numbers than eager: "
                "deterministic=True keeps the eager forward",
            )
        why += f"; random ops: backend {_backend_name()!r}'s own numbers, not eager's"
    if how == "measure" and ctx.dist is not None:
        return PassResult.skipped(
            NAME, f"{why}; not measured under torchrun (every rank must make the same choice)"
        )
    if how is None:
        return PassResult.skipped(NAME, why)
    if how == "jit":
        ctx.base_forward = JitForward(ctx.model, ctx.report)
        return PassResult.applied(NAME, why)
    if auto is not None:
        auto.why = why
        if how == "measure":
            # eager stays unless compiled steps are ahead beyond the noise; the cold compile is
            # estimated first and not paid when the run cannot repay it.
            choice = Choice(NAME, ["eager", "compiled"], auto.apply, auto.decided)
            choice.baseline = "eager"
            choice.one_off, choice.best_gain = auto.one_off, BEST_GAIN
            choice.deferred = auto.deferred
            trials_of(ctx).add(choice)
        else:
            auto.from_record = True
    verbose = ctx.options.verbose and (ctx.dist is None or ctx.dist.rank == 0)
    entered = type(regions[0] if regions else ctx.model).forward
    layer = functools.partial(
        CompiledForward,
        report=ctx.report,
        model=ctx.model,
        cache_dir=cache_dir,
        regions=regions,
        origin=code_origin(entered),
        verbose=verbose,
        auto=auto,
        mode=compile_mode(ctx.options.compile),
    )
    ctx.forward_layers.append(ForwardLayer(NAME, Stage.COMPILE, layer))
    return PassResult.applied(NAME, f"{why}; {regional_why}")


def _cache_extra(regions: list[nn.Module], mode: str | None = None) -> str:
    """What, besides the model and its inputs, the compiled code depends on."""
    extra = f"{BACKEND!r} {COMPILE_OPTIONS!r} {[type(b).__name__ for b in regions]}"
    return extra if mode is None else f"{extra} mode={mode}"


class AutoCompile:
    """`compile="auto"` on CPU: whether the compiled forward is in force (`compiled`), set by the
    trials' "compile" choice (eager against compiled, measured on the first training steps, after
    the layout and amp) or, from a record of an earlier run, at the first call outside a trial
    (so other choices' trials measure the eager model, as without a record). The outcome of a
    measurement is recorded in the compile cache (`record`); the cost of the compile, estimated
    before it is paid (`one_off`, from `costs`), decides whether the run can repay it."""

    def __init__(self, report: Report, record: compile_cache.Outcome) -> None:
        self.report = report
        self.record = record
        self.costs: compile_cache.CompileCosts | None = None
        self.name = ""  # the model's name in the records (`Outcome`'s)
        self.size = 0  # its leaf modules
        self.why = ""
        self.compiled = False
        self.from_record = False
        self.failed = False  # the compiled forward failed (and fell back) during the trials

    def apply(self, option: str) -> None:
        """`Choice.apply`."""
        self.compiled = option == "compiled"

    def one_off(self) -> tuple[float, str]:
        """`Choice.one_off`: the compile's estimated cost and how it was estimated."""
        if self.costs is None:
            return 0.0, "a compile"
        return self.costs.estimate(self.name, self.size)

    def deferred(self, note: str) -> None:
        """`Choice.deferred`: not tried on this run; recorded as a candidate (a record that
        `read()` takes for none, so a later run weighs it again)."""
        self.record.write("untried", note)

    def decided(self, winner: str, measured: str) -> None:
        """`Choice.decided`: record the outcome (a failed compile counts as lost) and report it.
        A trial that failed elsewhere, or was not tried, measured nothing: no record then."""
        if self.failed:
            self.record.write("eager", "the compiled forward failed")
            return  # the failure is in the report already
        if measured.startswith(("not measured", NOT_TRIED)):
            result = PassResult.skipped(NAME, f"eager kept: {measured}")
            result.figures["modules"] = self.size  # what the estimate grew with
            self.report.replace(result)
            return
        self.record.write(winner, measured)
        if winner == "compiled":
            self.report.replace(PassResult.applied(NAME, f"torch.compile: {measured}"))
        else:
            self.report.replace(
                PassResult.skipped(
                    NAME, f"eager kept: {measured}; recorded, not compiled again (compile=True)"
                )
            )


def repeated_blocks(model: nn.Module) -> tuple[str, list[nn.Module]] | None:
    """The first container, outermost first, of two or more modules of one class that have
    submodules of their own (transformer layers), as (its name, its blocks); None if none."""
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList | nn.Sequential):
            continue
        blocks = list(module.children())
        if (
            len(blocks) >= 2
            and len({type(b) for b in blocks}) == 1
            and all(next(b.children(), None) is not None for b in blocks)
        ):
            return name or "(model)", blocks
    return None


def choose_regions(
    model: nn.Module, regional: bool | None, device: torch.device | None = None
) -> tuple[list[nn.Module], str]:
    """The blocks to compile one by one (empty: compile the whole forward), and why."""
    found = repeated_blocks(model)
    if regional is False:
        return [], "whole forward (REGIONAL=False)"
    if found is None:
        if regional:
            return [], "whole forward (REGIONAL=True, but no repeated blocks found)"
        return [], "whole forward (no repeated blocks)"
    name, blocks = found
    device_type = device.type if device is not None else "cpu"
    if regional is None and device_type != "cuda":
        return [], (
            f"whole forward on {device_type}: regional compile of the {len(blocks)} "
            f"{type(blocks[0]).__name__} blocks of {name} compiles faster but steps slower "
            "there (REGIONAL=True forces it)"
        )
    return blocks, (
        f"regional: each of the {len(blocks)} {type(blocks[0]).__name__} blocks of {name} "
        "compiled on its own, one shared graph; the rest runs eager"
    )


class CompiledForward:
    """`torch.compile` of the layers below (or of each repeated block, `regions`), compiled at
    the first call; eager for good after a compile failure. What dynamo met at the first call
    and at recompiles goes into the report. A copy (deepcopy, pickle) does not carry the
    compiled graphs, which belong to the original's objects (`nn.Module` drops a block's
    compiled call in copies too): it compiles its own at its first call."""

    def __init__(
        self,
        forward: Forward,
        report: Report,
        regions: list[nn.Module] | None = None,
        origin: Where = ("?", 0),
        verbose: bool = False,
        model: nn.Module | None = None,
        cache_dir: Path | None = None,
        auto: AutoCompile | None = None,
        mode: str | None = None,
    ) -> None:
        self.forward = forward
        self.mode = mode  # torch.compile's mode= (None: the default mode)
        self.sizes: set[tuple[Any, ...]] = set()  # input sizes met under CUDA graphs
        self.auto = auto  # compile="auto" on CPU: eager until decided
        self.report = report
        self.model = model  # the user's model: its trials (`of_model`)
        self.guard = BackwardGuard(model) if model is not None else None
        self.regions = regions or []
        self.origin = origin  # the user's forward the compiled region starts at
        self.verbose = verbose
        self.failed = False
        self.compiled: Forward | None = None
        self.watch: CompileWatch | None = None
        self.shape_recompiles = 0  # recompiles caused by an input size changing
        self.shape_event: Event | None = None  # reported once
        self.dynamic = False  # compiled with dynamic=True after changing shapes
        self.cache_dir = cache_dir  # torch's compile artifacts across restarts
        self.cache: CompileCache | None = None
        self.local: Path | None = None  # torch's local caches, when autoopt chose where
        self.started = 0.0  # when the first compile began

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "compiled": None, "watch": None}

    def _compile(self) -> Forward:
        if not self.regions:
            # Every forward stack enters dynamo through one code object of torch's
            # (`wrap_inline`): isolated, one model's compiles are not another's recompiles.
            options = {"isolate_recompiles": True, **COMPILE_OPTIONS, **self._per_model_options()}
            return torch.compile(self.forward, **randomness.compile_kwargs(BACKEND, options))
        for block in self.regions:
            options = {**COMPILE_OPTIONS, **self._per_model_options()}
            block.compile(**randomness.compile_kwargs(BACKEND, options))
        return self.forward  # the blocks run compiled inside it

    def _per_model_options(self) -> dict[str, Any]:
        """The per-model options: dynamic shapes once sizes changed, the mode asked for."""
        mode = {"mode": self.mode} if self.mode is not None else {}
        return {**mode, "dynamic": True} if self.dynamic else mode

    def _cache_extra(self) -> str:
        return _cache_extra(self.regions, self.mode)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.guard is not None and self.guard.double_backward and not self.failed:
            self._double_backward_seen(self.guard.double_backward)
        auto = self.auto
        if auto is not None and auto.from_record and not auto.compiled and self._trials_over():
            auto.compiled = True  # after the other choices' trials, which measured it eager
        if self.failed or auto is not None and not auto.compiled:
            return self.forward(*args, **kwargs)
        if self.compiled is None or self.watch is None:
            self._load_cache(args, kwargs)
            self.compiled = self._compile()
            self.watch = CompileWatch(self.origin)
        guard = self.guard
        if guard is not None and not guard.probed and torch.is_grad_enabled() and not in_trial():
            return self._first_backward(guard, args, kwargs)
        out = self._compiled_call(args, kwargs)
        if guard is not None and not self.failed:
            guard.watch(out)
        if not in_trial():  # a trial's backward has not compiled yet
            self._save_cache()
        return out

    def _trials_over(self) -> bool:
        """No trial runs now and the model's measured choices (layout, amp) are decided: they
        run on the first training steps, and measure the eager model."""
        measured = of_model(self.model) if self.model is not None else None
        return not in_trial() and (measured is None or measured.done)

    def _load_cache(self, args: Any, kwargs: dict[str, Any]) -> None:
        """Before the first compile: load this model's saved artifacts into torch's caches."""
        if self.cache is not None or self.cache_dir is None or self.guard is None:
            return
        name = compile_cache.key(self.guard.model, args, kwargs, self._cache_extra())
        self.cache = compile_cache.CompileCache(self.cache_dir, name)
        self.local = compile_cache.keep_local_caches(self.cache_dir)
        compile_cache.remember_isa_probes(self.cache_dir)
        self.cache.load()
        self.started = compile_cache.clock()

    def _save_cache(self) -> None:
        """After the first compiled step (forward and backward, by the probe): save the
        artifacts and say in the report whether the cache hit and what the first step cost."""
        if self.cache is None or self.cache.saved or self.failed:
            return
        seconds = compile_cache.clock() - self.started
        saved = self.cache.save()
        if self.guard is not None and self.cache_dir is not None:  # what compiling cost here
            model = self.guard.model
            name = compile_cache.key(model, (), {}, self._cache_extra())
            compile_cache.CompileCosts(self.cache_dir).write(
                name,
                compile_cache.model_size(model),
                seconds,
                self.cache.status == "hit",
                self.cache.path,
            )
        if NAME in self.report:
            result = self.report[NAME]
            result.figures["first_compiled_step_s"] = round(seconds, 3)
            result.figures["cache_kernels"] = self.cache.kernels
            written = f", saved to {self.cache.path}" if saved else ""
            if self.local is not None:
                written += f"; torch's local compile caches in {self.local}"
            result.detail += (
                f"; compile cache {self.cache.status}{written}: first step {seconds:.1f} s"
            )

    def _first_backward(self, guard: BackwardGuard, args: Any, kwargs: dict[str, Any]) -> Any:
        """The first forward with gradients on: probe the compiled forward and backward as a
        trial, then run this step eager and watch its backward for `create_graph=True`."""
        assert self.compiled is not None and self.watch is not None
        compiled = self.compiled
        self.watch.before()
        try:
            guard.probe(lambda: compiled(*args, **kwargs))
        except Exception as err:  # noqa: BLE001 - a forward or backward compile error: eager
            out = self._fall_back("torch.compile (forward or first backward)", err, args, kwargs)
            guard.probed = True
            return out
        events = self.watch.after()
        if events:
            self._note(events)
        guard.probed = True
        compiled_calls = [block._compiled_call_impl for block in self.regions]
        self._set_compiled_calls([None] * len(self.regions))
        try:
            out = self.forward(*args, **kwargs)  # this one step eager: see how it is used
        finally:
            self._set_compiled_calls(compiled_calls)
        guard.watch(out)
        self._save_cache()
        return out

    def _double_backward_seen(self, where: Where) -> None:
        self.failed = True
        self.compiled = self.watch = None
        self._set_compiled_calls([None] * len(self.regions))
        filename, lineno = where
        message = (
            f"double backward through the compiled model (autograd.grad(create_graph=True) "
            f"called at {filename}:{lineno}): torch.compile's AOTAutograd cannot differentiate "
            "its compiled backward"
        )
        seen = self.report[NAME].events if NAME in self.report else []
        self.report.replace(PassResult.failed(NAME, message, "eager forward"))
        self.report.note(NAME, [*seen, Event("double backward", filename, lineno, message)])
        warnings.warn(
            f"autoopt: {message}; the model runs eager from now on (compile=False keeps it "
            "eager from the start)",
            stacklevel=3,
        )

    def _fall_back(self, what: str, err: BaseException, args: Any, kwargs: dict[str, Any]) -> Any:
        """A compile error: redo this call eager and stay eager. If the eager call raises too,
        the error is the user's own: compile stays on and the error goes up."""
        assert self.watch is not None
        events = self.watch.after()
        compiled_calls = [block._compiled_call_impl for block in self.regions]
        self._set_compiled_calls([None] * len(self.regions))
        try:
            out = self.forward(*args, **kwargs)
        except BaseException:
            self._set_compiled_calls(compiled_calls)
            raise
        self.failed = True
        self.compiled = self.watch = None
        if self.auto is not None:
            self.auto.failed = True
        _record_failure(self.report, what, err, events)
        return out

    def _compiled_call(self, args: Any, kwargs: dict[str, Any]) -> Any:
        if self.mode == "reduce-overhead" and self._another_size(args, kwargs):
            self.compiled = self._compile()  # the default mode from this call on
            self.watch = CompileWatch(self.origin)
        assert self.compiled is not None and self.watch is not None
        self.watch.before()
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - any compile error means "run eager"
            return self._fall_back("torch.compile", err, args, kwargs)
        if self.mode == "reduce-overhead":
            out = own_outputs(out)
        events = self._shapes(self.watch.after())
        if events:
            self._note(events)
        return out

    def _another_size(self, args: Any, kwargs: dict[str, Any]) -> bool:
        """Under CUDA graphs: whether this call's inputs have a size past the first
        `CUDA_GRAPH_SIZES` seen, which ends CUDA graphs for the model (a graph and its memory
        are recorded per size: a full batch and a ragged last one are fine, changing sizes
        are not), with a report line."""
        sizes = tensor_shapes((args, kwargs))
        if sizes in self.sizes or len(self.sizes) < CUDA_GRAPH_SIZES:
            self.sizes.add(sizes)
            return False
        self.mode = None
        message = (
            f"inputs of a size past the first {CUDA_GRAPH_SIZES}: CUDA graphs record a graph "
            "and its memory per size, so the model is compiled in the default mode from here "
            "(compile='reduce-overhead' pays with inputs of one or two shapes)"
        )
        self._note([Event("CUDA graphs off", *user_call_site(), message)])
        return True

    def _shapes(self, events: list[Event]) -> list[Event]:
        """Recompiles caused by an input size changing, answered once: the first one and one
        "changing shape" event at the user's call with the fix they can make (the only one
        printed), the later ones counted, not listed;
        after `SHAPE_RECOMPILES_BEFORE_DYNAMIC` of them (a static compile, dynamic=False, or
        a dimension torch did not make dynamic) it is compiled with dynamic=True; past
        `SHAPE_RECOMPILE_CAP`, eager."""
        changes = [(event, shape_change(event)) for event in events]
        shaped = [(event, change) for event, change in changes if change is not None]
        if not shaped or not REACT_TO_SHAPES:
            return events
        self.shape_recompiles += len(shaped)
        rest = [event for event, change in changes if change is None]
        if self.shape_event is None:
            rest.append(shaped[0][0])  # the first one is recorded as it is; later ones counted
        static = COMPILE_OPTIONS.get("dynamic") is False or not _automatic_dynamic()
        if self.shape_event is None:
            event, (dim, old, new) = shaped[0]
            reaction = (
                "a static compile recompiles per size: at a third size autoopt compiles it "
                "with dynamic shapes, so further sizes reuse one graph"
                if static
                else "torch made that dimension dynamic, so further sizes reuse one graph"
            )
            fix = (
                "DataLoader(..., drop_last=True) for a ragged last batch, or equal batch sizes"
                if dim == 0
                else f"pad dimension {dim} to a multiple (e.g. tokenizer(pad_to_multiple_of=64))"
            )
            self.shape_event = Event(
                "changing shape",
                *user_call_site(),
                f"input dimension {dim} changed {old} -> {new} and torch.compile recompiled "
                f"({event.reason}); {reaction}; to avoid it: {fix}",
            )
            rest.append(self.shape_event)
        if not self.dynamic and self.shape_recompiles >= SHAPE_RECOMPILES_BEFORE_DYNAMIC:
            self.dynamic = True
            self.compiled = self.watch = None  # the next call compiles with dynamic=True
        elif self.shape_recompiles > SHAPE_RECOMPILE_CAP:
            self.failed = True
            self.compiled = self.watch = None
            self._set_compiled_calls([None] * len(self.regions))
            err = RuntimeError(
                f"{self.shape_recompiles} recompiles on changing input sizes, with dynamic "
                "shapes too"
            )
            _record_failure(self.report, "torch.compile", err, rest)
            return []
        return rest

    def _set_compiled_calls(self, calls: list[Any]) -> None:
        for block, call in zip(self.regions, calls, strict=True):
            block._compiled_call_impl = call  # what nn.Module.compile() sets; None: eager

    def _note(self, events: list[Event]) -> None:
        new = self.report.note(NAME, events)
        for event in new:
            if REACT_TO_SHAPES and shape_change(event) is not None:
                continue  # said by its "changing shape" event
            voice.say(f"autoopt: torch.compile: {event}", self.verbose)


def own_outputs(out: Any) -> Any:
    """The outputs of a CUDA-graph replay as tensors of their own: a replay writes its outputs
    into memory the next replay overwrites, and torch raises when a kept one (a logged loss, a
    list of predictions) is read after it. The copy is cheap where CUDA graphs pay: a
    launch-bound step has small tensors. CPU tensors are returned as they are."""
    return map_tensors(out, lambda t: t.clone() if t.is_cuda else t)


def _record_failure(
    report: Report, what: str, err: BaseException, events: list[Event] | None = None
) -> None:
    message = f"{what} failed: {error_summary(err)}"
    seen = report[NAME].events if NAME in report else []
    report.replace(PassResult.failed(NAME, message, "eager forward"))
    report.note(NAME, [*seen, *(events or [])])
    warnings.warn(f"autoopt: {message}; falling back to the eager forward", stacklevel=2)


class JitForward:
    """Stands in for the module's own forward with TorchScript, built at the first call.

    Scripting keeps Python control flow, so a script is used at once. Tracing records the path
    of one call: shapes and loops over them (`for i in range(x.size(1))`) are frozen into it.
    So a trace of the first batch is used only after it matched the eager forward on a later
    batch of another shape (run with the same RNG state and buffers, then put back); until
    then the forward runs eager, and the report says so. A mismatch means eager for good.
    Scripts and traces share the module's parameters and buffers, so training updates them.
    Tracing itself runs with autocast off: a trace under autocast bakes the casted weights in.
    Copies (deepcopy, pickle) drop the TorchScript, which holds the original's tensors, and
    build their own at their first call."""

    def __init__(self, model: nn.Module, report: Report) -> None:
        self.model = model
        self.report = report
        self.failed = False  # eager for good
        self.script: Any = None  # scripted, or traced and verified
        self.trace: Any = None  # traced, waiting for a batch of another shape
        self.trace_shapes: list[tuple[int, ...]] | None = None
        self.trace_training = True

    def __getstate__(self) -> dict[str, Any]:
        dropped = {"script": None, "trace": None, "trace_shapes": None}
        return {**self.__dict__, **dropped}

    def _eager(self, *args: Any, **kwargs: Any) -> Any:
        from autoopt.runtime.forward import original_forward

        return original_forward(self.model)(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.failed:
            return self._eager(*args, **kwargs)
        if self.script is not None:
            return self._run_script(args, kwargs)
        if self.trace is not None:
            return self._check_trace(args, kwargs)
        try:
            self.script = self._script()
        except Exception as script_err:  # noqa: BLE001 - try tracing next
            return self._start_trace(script_err, args, kwargs)
        return self._run_script(args, kwargs)

    def _run_script(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.trace_shapes is not None and self.model.training != self.trace_training:
            return self._eager(*args, **kwargs)  # a trace holds the mode it was traced in
        if self.script.training != self.model.training:  # follow model.train()/eval()
            self.script.train(self.model.training)
        try:
            return self.script(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            return self._fail(err, args, kwargs)

    def _fail(self, err: BaseException, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = self._eager(*args, **kwargs)  # the user's own error, if eager fails too
        self.failed = True
        self.script = self.trace = None
        _record_failure(self.report, "TorchScript", err)
        return out

    def _script(self) -> Any:
        with _unpatched(self.model), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "jit is deprecated": asked for
            return torch.jit.script(self.model)

    def _start_trace(
        self, script_err: BaseException, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if kwargs:
            err = RuntimeError(
                f"cannot script ({error_summary(script_err)}) nor trace a call with keyword arguments"
            )
            return self._fail(err, args, kwargs)
        try:
            self.trace = self._traced(args)
        except Exception as err:  # noqa: BLE001 - neither script nor trace: run eager
            return self._fail(err, args, kwargs)
        self.trace_shapes = _shapes(args)
        self.trace_training = self.model.training
        self.report.replace(
            PassResult.applied(
                NAME,
                f"cannot script ({error_summary(script_err)}); traced the first batch: eager "
                "until the trace matches eager on a batch of another shape",
            )
        )
        return self._eager(*args)

    def _traced(self, args: tuple[Any, ...]) -> Any:
        replay = Replay(self.model)  # tracing runs the forward: it must leave no trace
        device_type = args[0].device.type if args and torch.is_tensor(args[0]) else "cpu"
        try:
            with (
                _unpatched(self.model),
                torch.autocast(device_type, enabled=False),
                warnings.catch_warnings(),
            ):
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                warnings.simplefilter("ignore", DeprecationWarning)  # as for scripting
                return torch.jit.trace(self.model, args, check_trace=False)
        finally:
            replay.restore()

    def _check_trace(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if (
            kwargs
            or _shapes(args) == self.trace_shapes
            or self.model.training != self.trace_training
        ):
            return self._eager(*args, **kwargs)  # nothing new to check the trace against
        replay = Replay(self.model)
        try:
            with torch.no_grad():
                traced_out = self.trace(*args)
        except Exception as err:  # noqa: BLE001 - the frozen shapes do not fit this batch
            replay.restore()
            return self._fail(err, args, kwargs)
        replay.restore()
        out = self._eager(*args)
        try:
            torch.testing.assert_close(traced_out, map_tensors(out, torch.Tensor.detach))
        except (AssertionError, TypeError, ValueError) as err:  # values, dtypes or structure
            self.failed = True
            self.trace = None
            _record_failure(
                self.report,
                "TorchScript",
                RuntimeError(
                    f"the trace of the first batch differs from eager on another shape "
                    f"({error_summary(err)})"
                ),
            )
            return out
        self.script, self.trace = self.trace, None
        self.report.replace(
            PassResult.applied(NAME, "TorchScript trace, checked against eager on two shapes")
        )
        return out


def _shapes(args: tuple[Any, ...]) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for t in tensors_in(args)]


@contextlib.contextmanager
def _unpatched(model: nn.Module) -> Iterator[None]:
    """Scripting and tracing read `model.forward`: hide autoopt's patched forward meanwhile."""
    patched = model.__dict__.pop("forward", None)
    try:
        yield
    finally:
        if patched is not None:
            model.__dict__["forward"] = patched
