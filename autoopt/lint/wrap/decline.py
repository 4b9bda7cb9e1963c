"""Why `--wrap` leaves a file alone, and what to change: one constructor per reason, so every
decline is worded in one place. `reason` is the short category for the run's summary, `detail`
the true reason with the script's own names, `change` the edit that lets `--wrap` insert a call
that runs (or why there is nothing to insert)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_AGAIN = "and run --wrap again"


@dataclass
class Decline:
    """Why a file is left alone: `reason` for the summary, `detail` and `change` for the file's
    line."""

    reason: str
    detail: str
    change: str
    # the one file where the optimizer is created, when that is the reason (its own --wrap
    # outcome is told with this one's: `plan.plan_wrap`)
    elsewhere: Path | None = None

    @property
    def message(self) -> str:
        """The file's line: the reason, then the change to make."""
        return f"{self.detail}; {self.change}"


@dataclass(frozen=True)
class ParallelWrap:
    """A data-parallel wrap of the model that runs before the optimizer exists: the statement,
    the wrapper's name, the local function that does it (if the statement calls one:
    `model = make_data_parallel(model, ...)`), and the statement holding it beside the
    optimizer's creation when it sits in a branch (`if device == "cuda":`)."""

    statement: str
    wrapper: str
    helper: str | None = None
    block: str | None = None  # the statement holding it where the optimizer is created (an `if`)
    handed_to: str | None = None  # the function the wrapped model is then handed to


# ----- what the script already does ---------------------------------------------------------
def accelerate() -> Decline:
    return Decline(
        "already uses Accelerate",
        "the script already runs Hugging Face Accelerate (accelerator.prepare/backward), "
        "which owns the device, mixed precision and distribution",
        "nothing to insert: set mixed precision and compile through Accelerate itself "
        "(Accelerator(mixed_precision=..., dynamo_backend=...))",
    )


def lightning() -> Decline:
    return Decline(
        "already uses Lightning",
        "training runs inside a Lightning Trainer",
        "nothing to insert: set precision and compile through Lightning itself "
        "(Trainer(precision=...), torch.compile on the LightningModule)",
    )


def meta_learning(wrapper: str, library: str = "learn2learn") -> Decline:
    """`wrapper`: what the script uses of the meta-learning `library`."""
    if library == "torchmeta":
        what = (
            f"the script meta-learns with torchmeta (`{wrapper}`): its MetaModules are called "
            "with `params=` adapted through differentiable inner steps, on batches of tasks"
        )
    else:
        what = (
            f"the model is wrapped in `{wrapper}` (learn2learn), whose learners are cloned per "
            "task and adapted through differentiable inner steps (second order by default)"
        )
    return Decline(
        "meta-learning wrapper",
        what,
        "nothing to insert: optimize() compiles and wraps the module it is handed, and the "
        "meta-learner's clones must stay differentiable through it; keep this loop as it is",
    )


def hf_trainer() -> Decline:
    return Decline(
        "already uses the transformers Trainer",
        "training runs inside the Hugging Face transformers Trainer (its own loop)",
        "nothing to insert: set precision and compile through TrainingArguments "
        "(--bf16/--fp16, --tf32, --torch_compile)",
    )


def ignite() -> Decline:
    # `create_supervised_trainer(...)`: the library builds the step and drives the loop
    return Decline(
        "already uses ignite",
        "training runs inside an ignite Engine (the library drives the loop)",
        "nothing to insert: --wrap needs the script's own loop (forward, backward, step)",
    )


def ignite_distributed(call: str) -> Decline:
    return Decline(
        "already uses ignite",
        f"ignite.distributed wraps the model or optimizer itself (`{call}`: DDP, DataParallel "
        "or Horovod, chosen at run time) before the script's own step trains them",
        "hand optimize() the bare model and optimizer before that wrap by hand, or keep the "
        "script as it is",
    )


def rpc() -> Decline:
    return Decline(
        "RPC training",
        "training runs over torch.distributed.rpc (remote modules, distributed autograd)",
        "nothing to insert: optimize() does not run remote modules",
    )


def hogwild() -> Decline:
    return Decline(
        "Hogwild",
        "Hogwild training (a model in shared memory stepped by several processes)",
        "nothing to insert: optimize() moves, compiles and casts one process's model, which "
        "would break the shared memory",
    )


def own_precision(why: str) -> Decline:
    return Decline(
        "another mixed-precision system",
        f"the script already runs its own reduced precision: {why}; optimize()'s AMP "
        "would stack a second one on it",
        f"remove it (optimize() picks bf16, or fp16 with its own loss scaling) {_AGAIN}, or "
        "keep the script as it is",
    )


def own_precision_late(why: str, statement: str) -> Decline:
    return Decline(
        "another mixed-precision system",
        f"the script runs its own mixed precision ({why}) on the model and optimizer before "
        f"the call could go (`{statement}` comes before the loader exists)",
        f"create the loader before `{statement}` {_AGAIN}: the call then goes before it, "
        'with amp="script"',
    )


def loss_scaler(callee: str, func: str) -> Decline:
    return Decline(
        "another mixed-precision system",
        f"the script already runs its own mixed precision: its loss scaler "
        f"does the backward and steps the optimizer (`{callee}(...)` in "
        f"{func}()), out of --wrap's sight; optimize()'s AMP would stack a second one on it",
        f"call `loss.backward()` and `optimizer.step()` in {func}() instead of the scaler "
        f"{_AGAIN}, or keep the script as it is",
    )


# ----- finding the loop and its optimizers ------------------------------------------------------
def no_training_loop() -> Decline:
    return Decline(
        "no training loop",
        "no .backward() is reached from this file (nor from the local modules it imports "
        "that --wrap can read)",
        "run --wrap on the file whose training loop calls .backward() and steps the optimizer",
    )


def trained_in_unread_code(callee: str, optimizer: str) -> Decline:
    return Decline(
        "training loop in code --wrap cannot read",
        f"`{optimizer}` is handed to `{callee}(...)`, whose training loop --wrap cannot follow "
        "from this file (no .backward() is reached)",
        f"run --wrap on the module that defines `{callee}` if it builds the optimizer there, or "
        f"insert `model, {optimizer} = autoopt.optimize(model, optimizer={optimizer})` by hand "
        f"before `{callee}(...)`",
    )


def dataset_changed_between_epochs(call: str) -> Decline:
    return Decline(
        "dataset changed between epochs",
        f"the loop changes the loader's dataset in place (`{call}`): optimize() rebuilds the "
        "loader with persistent workers, which would keep serving the dataset as it was when "
        "they started",
        "hand optimize() the model and optimizer without the loader by hand (`model, optimizer "
        "= autoopt.optimize(model, optimizer=optimizer)`), or keep the script as it is",
    )


def no_optimizer(where: list[str] | None = None) -> Decline:
    """`where`: each function that calls `.backward()` in another file than the script, as
    "Engine.train() of protonets/engine.py" (the user's next place to look)."""
    at = f" ({', '.join(_first_listed(where, 'function', 'functions'))})" if where else ""
    return Decline(
        "no optimizer",
        f"no optimizer is stepped where .backward() runs{at}",
        "--wrap needs `optimizer.step()` (or `scaler.step(optimizer)`) in the loop or a helper "
        "it calls",
    )


def steps_inside_forward(cls: str, expr: str) -> Decline:
    return Decline(
        "optimizer stepped inside a model's forward",
        f"{cls}.forward() steps `{expr}` itself (a meta-learner such as MAML: the training "
        f"step is a call of the {cls} module): optimize() would run that whole step as one "
        "forward, under autocast and compile, with its backward inside",
        f"move the optimizer step out of {cls}.forward() into the loop that calls it, or hand "
        f"optimize() the inner network and its optimizer by hand where {cls} creates them",
    )


def optimizers_in_collection(expr: str) -> Decline:
    return Decline(
        "optimizers kept in a collection",
        f"the optimizers stepped through `{expr}` are not named where it is "
        "built: no optimizer to hand to optimize()",
        f"bind each optimizer to a name and build `{expr}` from those names {_AGAIN}",
    )


def handed_in(expr: str, kind: str, param: str, callee: str) -> Decline:
    return Decline(
        "optimizer created in another module",
        f"`{expr}` comes in as the {kind} `{param}` of {callee}, which nothing here calls: "
        "it is created in another module",
        f"run --wrap on the script that creates it and calls {callee}",
    )


def optimizer_not_found(expr: str, func: str) -> Decline:
    return Decline(
        "optimizer not created in this file",
        f"cannot find where `{expr}` (stepped in {func}()) is created",
        f"bind it to a name where the model is built (`{expr} = torch.optim.AdamW("
        f"model.parameters())`) {_AGAIN}",
    )


def optimizers_in_several_functions(where: list[str]) -> Decline:
    return Decline(
        "optimizers created in several functions",
        f"several optimizers are created in different functions ({', '.join(where)}): no"
        " single place for the call",
        f"create them in one function, where the models are built, {_AGAIN}",
    )


def optimizer_over_tensors(expr: str) -> Decline:
    return Decline(
        "optimizer over tensors, not a model",
        f"`{expr}` steps a list of tensors (an input or a perturbation being optimised), not a"
        " model's parameters: optimize() has no model to take",
        "keep the script as it is",
    )


_LISTED = 4


def _first_listed(where: list[str], one: str, many: str) -> list[str]:
    """The first `_LISTED` places and how many others (a registry's dozen model classes: the
    first few name the place)."""
    if len(where) <= _LISTED:
        return where
    more = len(where) - _LISTED
    return [*where[:_LISTED], f"{more} other {one if more == 1 else many}"]


def optimizer_in_module(
    where: list[str], unreached: bool = False, path: Path | None = None
) -> Decline:
    """`where`: each creation as "Class.method() of path"; `unreached`: the script reaches no
    `.backward()` of its own (the training is in those classes too); `path`: the file, where
    there is one."""
    after = "; no .backward() is reached from this script itself" if unreached else ""
    where = _first_listed(where, "class", "classes")
    if len(where) == 1:
        return Decline(
            "optimizer created in another module",
            f"the optimizer is created in {where[0]}, which this script runs{after}",
            "run --wrap on that file",
            path,
        )
    return Decline(
        "optimizer created in another module",
        f"the optimizers are created in {', '.join(where)}, which this script runs{after}",
        "run --wrap on those files",
        path,
    )


def optimizer_elsewhere_in_project(where: list[str]) -> Decline:
    """`where`: each function of the project's training modules that creates an optimizer,
    as "Class.method() of path"; no call --wrap can follow from the script reaches them."""
    where = _first_listed(where, "function", "functions")
    return Decline(
        "training loop in code --wrap cannot read",
        "no .backward() is reached from this file by a call --wrap can follow (the training "
        "may run through a class a config names or a module imported by name at run time); "
        f"the project's training modules create their optimizers in {', '.join(where)}",
        "run --wrap on the file that creates the optimizer the script trains with, or insert "
        "`model, optimizer = autoopt.optimize(model, optimizer=optimizer)` by hand there",
    )


def optimizers_held_in_module(expr: str, where: list[str]) -> Decline:
    """`where`: each function that gathers the collection, as "Class.method() of path"."""
    return Decline(
        "optimizer created in another module",
        f"the loop steps the optimizers of `{expr}`, gathered by {', '.join(where)} from what "
        "its object holds: they belong to that class, which this script runs",
        "run --wrap on that file",
    )


def created_per_call(expr: str, func: str, loop: str) -> Decline:
    return Decline(
        "optimizer created inside the loop",
        f"`{expr}` is created inside {func}(), which `{loop}` calls on every pass: "
        "optimize() would wrap the same model again each time",
        f"create `{expr}` once, before `{loop}`, pass it to {func}(), and run --wrap again",
    )


# ----- binding the model ---------------------------------------------------------------------
def parallel_before_optimizer(wrap: ParallelWrap) -> Decline:
    where = f" (in `{wrap.block}`)" if wrap.block else ""
    by = f", through {wrap.helper}()" if wrap.helper else ""
    above = f"`{wrap.block}`" if wrap.block else "that line"
    torchrun = (
        "; or remove the DataParallel wrap and launch with torchrun, where optimize() runs "
        "DDP itself"
        if wrap.wrapper.endswith("DataParallel") and "Distributed" not in wrap.wrapper
        else ""
    )
    if wrap.handed_to:
        detail = (
            f"`{wrap.statement}`{where} wraps the model in {wrap.wrapper}{by} before it is "
            f"handed to {wrap.handed_to}(), which creates the optimizer; optimize() must get the "
            "bare model, with the wrap after it"
        )
        change = (
            f"move the wrap into {wrap.handed_to}(), below the optimizer ({wrap.wrapper} trains "
            f"the model's own parameters: the same optimizer), {_AGAIN}: the call then goes "
            f"between them, with distributed=False{torchrun}"
        )
    else:
        detail = (
            f"`{wrap.statement}`{where} wraps the model in {wrap.wrapper}{by} before the "
            "optimizer exists; optimize() must get the bare model, with the wrap after it"
        )
        change = (
            f"create the optimizer above {above}, once the model is on its device "
            f"({wrap.wrapper} trains the model's own parameters: the same optimizer), {_AGAIN}: "
            f"the call then goes between them, with distributed=False{torchrun}"
        )
    return Decline("model wrapped in DDP/FSDP before the optimizer", detail, change)


def optimizer_wrapper(expr: str, wrapper: str, methods: set[str]) -> Decline:
    return Decline(
        "optimizer wrapped in a class",
        f"`{expr}` is an instance of {wrapper}, a wrapper class that steps the torch optimizer "
        "it holds in "
        f"{'/'.join(f'{m}()' for m in sorted(methods))}: optimize() needs the "
        "optimizer itself (AMP's loss scaling lives in its step) and --wrap cannot reach "
        "it there",
        _BY_HAND.format(wrapper=wrapper),
    )


def optimizer_wrapper_unseen(expr: str, method: str) -> Decline:
    return Decline(
        "optimizer wrapped in a class",
        f"the loop steps `{expr}` through `{method}()`, a method of a wrapper class in a module "
        "--wrap cannot read: optimize() needs the torch optimizer it holds (AMP's loss scaling "
        "lives in its step)",
        _BY_HAND.format(wrapper="the wrapper"),
    )


def optimizer_rewrapped(expr: str, statement: str) -> Decline:
    wrapper = statement.split("=", 1)[-1].strip().split("(", 1)[0]
    return Decline(
        "optimizer wrapped in a class",
        f"`{statement}` wraps the torch optimizer the loop steps: optimize() needs the "
        "optimizer itself (AMP's loss scaling lives in its step), before it is wrapped",
        _BY_HAND.format(wrapper=wrapper),
    )


# optimize() patches the optimizer in place: a wrapper built afterwards steps the patched one.
_BY_HAND = (
    "hand optimize() the torch optimizer by hand before {wrapper} wraps it (`model, "
    "optimizer = autoopt.optimize(model, optimizer=optimizer)` right after "
    "`optimizer = torch.optim....`): it patches the optimizer in place, so {wrapper} steps the "
    "patched one"
)


def unknown_model(expr: str) -> Decline:
    return Decline(
        "cannot tell the model",
        f"cannot tell which model's .parameters() feed `{expr}`",
        f"build `{expr}` from the model's parameters where it is created "
        f"(`torch.optim.AdamW(model.parameters())`) {_AGAIN}",
    )


def optimizer_over_module_list(expr: str, holder: str) -> Decline:
    return Decline(
        "cannot tell the model",
        f"`{expr}` is built over `{holder}`, an nn.ModuleList the script fills with modules "
        "--wrap cannot name (parts of other objects, or added under conditions); a "
        "ModuleList has no forward, so optimize() cannot take it",
        f"hand optimize() each module of `{holder}` by hand, or build `{expr}` over the "
        f"model's own parameters {_AGAIN}",
    )


def optimizer_inside_model(expr: str) -> Decline:
    return Decline(
        "optimizer inside the model",
        f"`{expr}` is built over self.parameters() inside the model's own class",
        f"create the optimizer outside the class, over `model.parameters()`, {_AGAIN}",
    )


def model_from_outside(model: str, func: str) -> Decline:
    return Decline(
        "model built outside this file",
        f"the model `{model}` is a parameter of {func}(), which nothing here calls and which "
        "runs one pass over the data (it may run once per epoch)",
        f"run --wrap on the script that builds the model and calls {func}()",
    )


def optimizers_over_one_model(count: int) -> Decline:
    return Decline(
        "several optimizers over one model",
        f"{count} optimizers step the same model; optimize() takes one per model",
        f"merge them into one optimizer with a parameter group each {_AGAIN}",
    )


# ----- the insertion point -------------------------------------------------------------------
def unrelated_blocks() -> Decline:
    return Decline(
        "placement",
        "the optimizer and the loop are in unrelated blocks",
        f"create the optimizer in the block that starts training {_AGAIN}",
    )


def created_in_loop() -> Decline:
    return Decline(
        "optimizer created inside the loop",
        "training starts before the optimizer and loader exist (or creates them)",
        f"create the optimizer (and the loader) once, before the training loop, {_AGAIN}",
    )


def optimizer_in_training_loop(expr: str, loop: str) -> Decline:
    return Decline(
        "optimizer created inside the loop",
        f"`{expr}` is created inside the loop `{loop}`, which trains, and re-created on "
        "its passes (for a learning-rate drop, or for parameters that exist only after a "
        "first forward), while optimize() takes one optimizer, created once before training",
        f"create `{expr}` once before `{loop}` (a torch.optim.lr_scheduler such as "
        "MultiStepLR makes learning-rate drops; lazily built parameters need one forward "
        f"before it) {_AGAIN}",
    )


def model_unbound(model: str) -> Decline:
    return Decline(
        "model not bound at the call",
        f"the model `{model}` is not bound on every path where the call goes",
        f"bind `{model}` on every path before the optimizer is created (an `else` that binds "
        f"it or raises) {_AGAIN}",
    )


def trained_through(model: str, target: str) -> Decline:
    return Decline(
        "model trained through another object",
        f"the loop trains `{model}` through `{target}`, built from it before "
        "the optimizer exists: optimize() would not reach the model it calls",
        f"build `{target}` after the optimizer {_AGAIN}: the call then goes before it",
    )


def trained_as_global(model: str, member: str, func: str) -> Decline:
    return Decline(
        "model trained as a global",
        f"{func}() keeps `{model}` as `{member}`, but the loop runs the module's global "
        f"`{model}`, which a call here cannot rebind: optimize() would not reach the model "
        "the loop calls",
        f"run `{model}` as `{member}` in the loop {_AGAIN}",
    )


def moved_after_call(model: str, statement: str, inside: str | None = None) -> Decline:
    """`inside`: the function (and file) the model is handed to that runs `statement`."""
    where = f" (in {inside}, which gets the model after the call)" if inside else ""
    return Decline(
        "model moved after the call",
        f"`{statement}`{where} places `{model}` after the optimizer exists, where the call "
        "would go, on a device the call cannot name there: optimize() would keep moving the "
        "inputs to the device it chose",
        f"put `{model}` on its device before the optimizer is created {_AGAIN}",
    )
