"""Where `--wrap` inserts `autoopt.optimize(...)`, with which names and options, or why it won't.

The analysis starts from what training does, not from where things are written:

1. An optimizer is whatever the training code steps: `X.step()` next to `X.zero_grad()`, or
   `scaler.step(X)`, in a function that (itself or through its helpers, also in local modules)
   calls `.backward()`, or in a helper such a function calls (`self._apply_gradients()`). So
   factories (`model.configure_optimizers()`, `smart_optimizer()`) count, and so do
   `for opt in optimizers: opt.step()` (each optimizer the list names) and a plain class wrapping
   an optimizer (`optimizer.step_and_update_lr()`): that script is declined, naming the wrapper
   (optimize() cannot reach the optimizer inside it, and AMP's loss scaling lives in its step).
   optimize() is never handed an optimizer as a model.
2. From each use, the object is followed back through parameters, callers and `self.` attributes
   to the statement that creates it: the function holding that statement is where the call goes
   (`main()` that builds the optimizer and calls `train()` later). Assignments of one name in
   `if/elif` branches are one optimizer.
3. The model is whose `.parameters()` build each optimizer (the receiver of
   `configure_optimizers`, or the model passed to a factory); several optimizers over several
   models get one call each (a GAN). A model stepped by an optimizer over several models gets a
   call without it, and then every call is fp32 (`amp=False`: loss scaling needs the optimizer).
   The loader is what the training loop iterates (`for`, or `next()` on `iter(loader)` or on a
   local generator that re-iterates it), followed the same way; never a progress bar or range of
   step numbers. A loader not bound where the call goes, or already kept by something built
   before it (`looper = cycle(loader)`), is left out: none means a call without loader.
4. The call goes after the optimizer, the model and the loader exist, before the statement that
   starts training, with `device=` where the script itself puts the model (`model.to(device)`),
   when that expression is defined there; under a flag (`if args.gpu: model.cuda()`) the flag's
   own choice (`device="cuda" if args.gpu else "cpu"`), also when a local factory builds and
   places the model (`net = get_network(args)`) or a class it is handed to places it
   (`Trainer(model)` moving it to `self.gpu_id`), translated into the script's names; a script
   with no GPU path at all gets `device="cpu"`. What the script already does itself turns the
   overlapping option off with a comment (its own autocast/GradScaler, torch.compile, DDP wrap);
   Accelerate, Lightning, ignite and Hogwild scripts are declined, so are scripts running another
   mixed-precision system (`precision.other_precision_system`: apex amp, a half model, loss scaling
   by hand), a model the loop trains through an object built from it before the optimizer, and
   anything the analysis cannot prove.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from autoopt.lint.program.device import device_facts
from autoopt.lint.program.precision import other_precision_system
from autoopt.lint.tree.nodes import code_of
from autoopt.lint.wrap.codebase import CodeBase, Func, SourceFile
from autoopt.lint.wrap.tree import (
    NOT_PLACED,
    assign_targets,
    assignments_of,
    blocks_holding,
    bound_kwarg,
    bound_name,
    bound_to,
    child_of,
    common_block,
    counts_steps,
    device_of,
    guard_of,
    if_block,
    is_iter_wrapper,
    is_object,
    is_plain_class,
    is_self,
    keeps,
    loop_source,
    methods_of,
    model_like,
    read_before,
    read_names,
    runs_by,
    stepping_methods,
    unwrap_iter,
)

_OPTIMIZE = {"autoopt.optimize", "autoopt.runtime.optimize", "autoopt.runtime.optimize.optimize"}
_AMP = ("autocast", "GradScaler")
_COMPILE = {"torch.compile"}
# The user's own data/model parallel wraps (DDP, DataParallel, FSDP 1 and 2, tensor parallel).
_PARALLEL = {
    "DistributedDataParallel",
    "DataParallel",
    "FullyShardedDataParallel",
    "fully_shard",
    "parallelize_module",
}
_MAX_DEPTH = 6
# How many calls below a function that does the backward a helper may step the optimizer
# (`train_step()` -> `self._apply_gradients()` -> `self.optimizer.step()`).
_STEP_HELPER_DEPTH = 2


@dataclass
class Decline:
    """Why a file is left alone: `reason` for the summary, `detail` for the file's line."""

    reason: str
    detail: str = ""


@dataclass
class Pair:
    """One `autoopt.optimize` call: the model expression, and the optimizer (None for a model
    stepped by an optimizer over several models), loader and device where the script has them."""

    model: str
    optimizer: str | None
    loader: str | None = None
    device: str | None = None  # where the script itself puts the model (`model.to(device)`)


@dataclass
class Plan:
    """The calls to insert after `anchor` (a statement of `file`), and their shared options."""

    anchor: cst.CSTNode
    pairs: list[Pair]
    options: dict[str, str] = field(default_factory=dict)  # option -> why (for the comment)

    def lines(self) -> list[str]:
        """The statements to insert, in order."""
        opts = "".join(f", {name}=False" for name in self.options)
        why = ", ".join(f"{name}=False ({reason})" for name, reason in self.options.items())
        comment = f"  # autoopt: {why}" if why else ""
        out = []
        for p in self.pairs:
            device = f", device={p.device}" if p.device else ""
            given = [p.model, *([p.loader] if p.loader else [])]
            args = list(given)
            if p.optimizer:
                given.append(p.optimizer)
                args.append(p.optimizer if p.loader else f"optimizer={p.optimizer}")
            out.append(
                f"{', '.join(given)} = autoopt.optimize({', '.join(args)}{device}{opts}){comment}"
            )
        return out


@dataclass
class _Origin:
    """Where an object used in training is created: `assigns` in `func` bind `expr`; `entry` is
    the node of `func` through which it reaches training (None when another method of the class
    trains, later)."""

    func: Func
    expr: str
    assigns: list[cst.CSTNode]
    entry: cst.CSTNode | None


def plan_wrap(module: cst.Module, path: Path | None) -> Plan | Decline | None:
    """The insertion for `module` (the file at `path`), why there is none, or None when the
    script already calls autoopt.optimize()."""
    code = CodeBase(module, path)
    if any(code.script.qualname(c.func) in _OPTIMIZE for c in code.script.calls()):
        return None
    return _Planner(code).plan()


class _Planner:
    def __init__(self, code: CodeBase) -> None:
        self.code = code
        self.script = code.script
        self._collections: set[str] = set()  # stepped as `for opt in <expr>: opt.step()`
        self._optimizers: set[str] = set()  # every expression found stepped
        self._stepping_cache: dict[int, set[str]] = {}
        # (function, parameter) an object was followed to, where nothing here calls the function
        self._outside: list[tuple[Func, str]] = []

    # ----- the whole analysis -----------------------------------------------------------------
    def plan(self) -> Plan | Decline:
        conflict = self._conflict(self.script)
        if conflict:
            return conflict
        trainers = self._training_functions()
        if not trainers:
            return Decline("no training loop", "no .backward() is reached from this file")
        for func in trainers:
            if func.file is not self.script and (conflict := self._conflict(func.file)):
                return conflict
        steppers = self._stepping(trainers)
        uses = [use for func in steppers for use in self._optimizer_uses(func)]
        if not uses:
            return Decline("no optimizer", "no optimizer is stepped where .backward() runs")
        # Only a script that trains and steps an optimizer is declined for its own precision
        # scheme (an export or validation script that casts a model to half has no loop).
        stepping = {id(self.script): self.script} | {id(f.file): f.file for f, _, _ in uses}
        for file in stepping.values():
            if conflict := self._own_precision(file):
                return conflict
        if conflict := self._scaler_steps(steppers):
            return conflict
        origins: dict[tuple[int, str], _Origin] = {}
        for func, expr, node in uses:
            self._outside = []
            found = self._origins(func, expr, node, 0)
            if found and expr in self._collections:
                found = self._members(found)
                if not found:
                    return Decline(
                        "optimizers kept in a collection",
                        f"the optimizers stepped through `{expr}` are not named where it is "
                        "built: no optimizer to hand to optimize()",
                    )
            if not found and (outside := self._handed_in(expr)):
                return Decline("optimizer created in another module", outside)
            if not found:
                return Decline(
                    "optimizer not created in this file",
                    f"cannot find where `{expr}` (stepped in {func.name}()) is created",
                )
            for origin in found:
                key = (id(origin.func.node), origin.expr)
                if key in origins:
                    origins[key].assigns.extend(
                        a for a in origin.assigns if all(a is not b for b in origins[key].assigns)
                    )
                else:
                    origins[key] = origin
        homes = {id(o.func.node) for o in origins.values()}
        if len(homes) > 1:
            return Decline(
                "optimizers created in several functions",
                "the optimizers are created in different functions: no single place for the call",
            )
        optimizers = sorted(
            origins.values(), key=lambda o: min(o.func.file.order[id(a)] for a in o.assigns)
        )
        home = optimizers[0].func
        if home.file is not self.script:
            return Decline(
                "optimizer created in another module",
                f"the optimizer is created in {home.file.path}: wrap that file instead",
            )
        return self._place(home, optimizers, trainers)

    # ----- conflicts ---------------------------------------------------------------------------
    @staticmethod
    def _conflict(file: SourceFile) -> Decline | None:
        dotted = set(file.imports.values())
        source = file.module.code
        if any(d == "accelerate" or d.startswith("accelerate.") for d in dotted):
            return Decline(
                "already uses Accelerate",
                "the script already runs Hugging Face Accelerate (accelerator.prepare/backward)",
            )
        if any(d.split(".")[0] in ("lightning", "pytorch_lightning") for d in dotted):
            return Decline("already uses Lightning", "training runs inside a Lightning Trainer")
        if any(d.startswith("ignite.engine") for d in dotted):
            # `Engine(train_step)` / `create_supervised_trainer`: the library drives the loop
            return Decline(
                "already uses ignite",
                "training runs inside an ignite Engine (the library drives the loop)",
            )
        if any(
            d.startswith(("torch.distributed.rpc", "torch.distributed.autograd")) for d in dotted
        ):
            return Decline(
                "RPC training",
                "training runs over torch.distributed.rpc (remote modules, distributed autograd)",
            )
        if ".share_memory()" in source and ".Process(" in source:
            return Decline(
                "Hogwild",
                "Hogwild training (a model in shared memory stepped by several processes)",
            )
        return None

    @staticmethod
    def _own_precision(file: SourceFile) -> Decline | None:
        """A decline when `file` (the script, or where its optimizer is stepped) already runs
        another mixed-precision system (apex amp, a half model, loss scaling by hand)."""
        if why := other_precision_system(file.module, file.module.code):
            return Decline(
                "another mixed-precision system",
                f"the script already runs its own reduced precision: {why}; optimize()'s AMP "
                "would stack a second one on it",
            )
        return None

    def _scaler_steps(self, steppers: list[Func]) -> Decline | None:
        """A decline when the optimizer is handed to a loss scaler object that does the
        backward and the step itself (timm's and MAE's `loss_scaler(loss, optimizer, ...)`):
        a mixed-precision system optimize() cannot see into. torch's GradScaler is stepped as
        `scaler.step(optimizer)` and is not this."""
        for func in steppers:
            for call in func.calls():
                callee = code_of(call.func)
                if "scaler" not in callee.rsplit(".", 1)[-1].lower():
                    continue
                if any(code_of(a.value) in self._optimizers for a in call.args):
                    return Decline(
                        "another mixed-precision system",
                        f"the script already runs its own mixed precision: its loss scaler "
                        f"does the backward and steps the optimizer (`{callee}(...)` in "
                        f"{func.name}()); optimize()'s AMP would stack a second one on it",
                    )
        return None

    def _options(self, trainers: list[Func]) -> dict[str, str]:
        """The options the script's own code already covers, each with the reason."""
        files = {id(self.script): self.script} | {id(f.file): f.file for f in trainers}
        calls = [(f, c) for f in files.values() for c in f.calls()]
        options: dict[str, str] = {}
        if any(f.qualname(c.func).split(".")[-1] in _AMP for f, c in calls):
            options["amp"] = "own autocast/GradScaler"
        if any(f.qualname(c.func) in _COMPILE for f, c in calls):
            options["compile"] = "own torch.compile"
        if any(self._is_ddp(f, c) for f, c in calls):
            options["distributed"] = "own DDP/FSDP/DataParallel wrap"
        return options

    @staticmethod
    def _is_ddp(file: SourceFile, call: cst.Call) -> bool:
        name = file.qualname(call.func).split(".")[-1]
        return name in _PARALLEL

    # ----- training code ---------------------------------------------------------------------
    def _training_functions(self) -> list[Func]:
        """Functions (and module code) of the script that do a backward, themselves or through
        their helpers, and those helpers (in local modules too)."""
        todo = [self.code.top(self.script), *(Func(self.script, f) for f in self._defs())]
        found: dict[Func, None] = {}
        while todo:
            func = todo.pop()
            if func in found or not self.code.does_backward(func):
                continue
            found[func] = None
            todo += [t for c in func.calls() if (t := self.code.resolve(func.file, c))]
        return list(found)

    def _stepping(self, trainers: list[Func]) -> list[Func]:
        """The training functions and the helpers they call, where an optimizer may be stepped
        apart from the backward (`self._apply_gradients()` after `loss.backward()`)."""
        found: dict[Func, None] = dict.fromkeys(trainers)
        layer = list(trainers)
        for _ in range(_STEP_HELPER_DEPTH):
            layer = [
                t
                for f in layer
                for c in f.calls()
                if (t := self.code.resolve(f.file, c)) is not None and t not in found
            ]
            found.update(dict.fromkeys(layer))
        return list(found)

    def _defs(self) -> list[cst.FunctionDef]:
        """The script's functions and methods (not nested ones)."""
        out = list(self.script.functions.values())
        for cls in self.script.classes.values():
            out += [s for s in cls.body.body if isinstance(s, cst.FunctionDef)]
        return out

    def _optimizer_uses(self, func: Func) -> list[tuple[Func, str, cst.CSTNode]]:
        """(function, expression, node) for each optimizer stepped in `func`."""
        stepped: dict[str, cst.CSTNode] = {}
        zeroed: set[str] = set()
        scaled: set[str] = set()
        for call in func.calls():
            if not isinstance(call.func, cst.Attribute):
                continue
            attr, receiver = call.func.attr.value, call.func.value
            if isinstance(receiver, cst.Name) and (source := loop_source(func, receiver, call)):
                receiver = source  # `for opt in optimizers: opt.step()`
                self._collections.add(code_of(source))
            if attr != "step" and is_object(receiver) and self._wrapper_of(call):
                # `optimizer.step_and_update_lr()` of a class wrapping the optimizer
                stepped.setdefault(code_of(receiver), call)
            elif attr == "step" and not call.args and is_object(receiver):
                stepped.setdefault(code_of(receiver), call)
            elif attr == "zero_grad" and is_object(receiver):
                zeroed.add(code_of(receiver))
            elif (
                attr == "step"
                and call.args
                and "scaler" in code_of(receiver).lower()
                and is_object(call.args[0].value)
            ):
                expr = code_of(call.args[0].value)  # scaler.step(optimizer)
                scaled.add(expr)
                stepped.setdefault(expr, call)
        uses = []
        for expr, node in stepped.items():
            word = expr.lower()
            if "sched" in word or "scaler" in word or "ema" in word.split("."):
                continue
            if expr in zeroed or expr in scaled or "opt" in word:
                uses.append((func, expr, node))
                self._optimizers.add(expr)
        return uses

    def _wrapper_of(self, call: cst.Call) -> str | None:
        """The local class with a method of `call`'s name that steps an optimizer the class
        holds (ScheduledOptim's `step_and_update_lr()` -> `self._optimizer.step()`)."""
        func = call.func
        assert isinstance(func, cst.Attribute)
        name = func.attr.value
        for file in self.code.files():
            for cls in file.classes.values():
                if name in self._steppers(file, cls):
                    return cls.name.value
        return None

    def _steppers(self, file: SourceFile, cls: cst.ClassDef) -> set[str]:
        """The stepping methods of `cls` when it is a plain class wrapping an optimizer."""
        if id(cls) not in self._stepping_cache:
            wraps = is_plain_class(file, cls)
            self._stepping_cache[id(cls)] = stepping_methods(file, cls) if wraps else set()
        return self._stepping_cache[id(cls)]

    def _wrapper_class(self, home: Func, opt: _Origin) -> tuple[str, set[str]] | None:
        """The local class `opt` is an instance of and its stepping methods, when it wraps an
        optimizer (then it is no optimizer optimize() can take)."""
        for assign in opt.assigns:
            value = bound_to(assign, opt.expr)
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
                found = self.code.local_class(home.file, value.func.value)
                if found is not None and (methods := self._steppers(*found)):
                    return value.func.value, methods
        return None

    def _members(self, found: list[_Origin]) -> list[_Origin]:
        """The optimizers a collection holds (`optimizers = [opt_g, opt_d]`), each followed to
        where it is created; [] when any element is not a plain name there."""
        out: list[_Origin] = []
        for origin in found:
            for assign in origin.assigns:
                value = bound_to(assign, origin.expr)
                if not isinstance(value, cst.List | cst.Tuple) or not value.elements:
                    return []
                for element in value.elements:
                    if not is_object(element.value):
                        return []
                    expr = code_of(element.value)
                    members = self._origins(origin.func, expr, origin.entry, 1)
                    if not members:
                        return []
                    self._optimizers.add(expr)
                    out += members
        return out

    def _handed_in(self, expr: str) -> str | None:
        """Why `expr` is created elsewhere, when it was followed to a parameter (or a `**kwargs`
        keyword) of a function nothing here calls."""
        if not self._outside:
            return None
        func, param = self._outside[-1]
        callee = (
            f"{func.cls.name.value}()" if func.name == "__init__" and func.cls else f"{func.name}()"
        )
        kind = "parameter" if param in func.params() else "keyword argument"
        return (
            f"`{expr}` comes in as the {kind} `{param}` of {callee}, which nothing here calls: "
            "it is created in another module; wrap the script that builds it"
        )

    # ----- following objects back to where they are created -------------------------------
    def _origins(
        self, func: Func, expr: str, entry: cst.CSTNode | None, depth: int
    ) -> list[_Origin]:
        """Where the object `expr` (used in `func` at `entry`) is created."""
        if depth > _MAX_DEPTH:
            return []
        assigns = assignments_of(func, expr)
        if assigns:
            return [_Origin(func, expr, assigns, entry)]
        found: list[_Origin] = []
        if expr.startswith("self.") and func.cls is not None:
            for method in methods_of(func.file, func.cls):
                binds = assignments_of(method, expr)
                if not binds:
                    continue
                sources = {bound_name(b, expr) for b in binds}
                param = next(iter(sources)) if len(sources) == 1 else None
                # `self.optimizer = kwargs["optimizer"]`: the callers' `optimizer=` keyword
                keys = {bound_kwarg(b, expr, method.star_kwargs()) for b in binds}
                key = next(iter(keys)) if len(keys) == 1 else None
                if param in method.params():
                    found += self._through_callers(method, param, depth)  # type: ignore[arg-type]
                elif key is not None:
                    found += self._through_callers(method, key, depth)
                else:
                    here = entry if method == func else None
                    found.append(_Origin(method, expr, binds, here))
            return found
        if expr in func.params():
            return self._through_callers(func, expr, depth)
        outer = func.file.scope_of(func.node)
        if isinstance(func.node, cst.FunctionDef) and isinstance(outer, cst.FunctionDef):
            # a closure's free variable (`def _backward(loss): optimizer.step()` inside
            # train_one_epoch): bound by the enclosing function
            return self._origins(Func(func.file, outer), expr, None, depth + 1)
        if isinstance(func.node, cst.FunctionDef):  # a global of the module
            top = self.code.top(func.file)
            if assignments_of(top, expr):
                return self._origins(top, expr, None, depth + 1)
        return []

    def _through_callers(self, func: Func, param: str, depth: int) -> list[_Origin]:
        if not self.code.callers(func):
            # Handed in from code this analysis does not see (`SimCLR(optimizer=...)` in the
            # script that imports this module): remembered for the decline's reason.
            self._outside.append((func, param))
            return []
        found: list[_Origin] = []
        for caller, call in self.code.callers(func):
            arg = self.code.argument(call, func, param)
            if arg is not None and is_object(arg):
                found += self._origins(caller, code_of(arg), call, depth + 1)
        return found

    # ----- model, loader, placement -------------------------------------------------------
    def _place(self, home: Func, optimizers: list[_Origin], trainers: list[Func]) -> Plan | Decline:
        # A model wrapped in DDP/FSDP before the optimizer is created rules out every place for
        # the call, whatever the optimizer is built over: say so first (parameter groups
        # gathered in a loop would otherwise be "cannot tell the model").
        first = min(
            (a for o in optimizers for a in o.assigns), key=lambda a: home.file.order[id(a)]
        )
        if early := self._wrapped_before(home, first):
            return Decline("model wrapped in DDP/FSDP before the optimizer", early)
        for opt in optimizers:
            if wrapped := self._wrapper_class(home, opt):
                wrapper, methods = wrapped
                return Decline(
                    "optimizer wrapped in a class",
                    f"`{opt.expr}` is a {wrapper}, which steps the torch optimizer it holds in "
                    f"{'/'.join(f'{m}()' for m in sorted(methods))}: optimize() needs the "
                    "optimizer itself (AMP's loss scaling lives in its step) and cannot reach "
                    "it there",
                )
        pairs: list[Pair] = []
        shared: list[str] = []  # models stepped only by an optimizer over several models
        forced: dict[str, str] = {}
        for opt in optimizers:
            models = {m for a in opt.assigns for m in self._models(home, bound_to(a, opt.expr))}
            if not models:
                models = self._models_beside(home, opt)
            models -= self._optimizers  # optimize() takes the module first, never an optimizer
            if not models:
                return Decline(
                    "cannot tell the model",
                    f"cannot tell which model's .parameters() feed `{opt.expr}`",
                )
            if "self" in models:
                return Decline(
                    "optimizer inside the model",
                    f"`{opt.expr}` is built over self.parameters() inside the model's own class",
                )
            for model in sorted(models):
                if model in home.params() and not self.code.callers(home):
                    return Decline(
                        "model built outside this file",
                        f"the model `{model}` is a parameter of {home.name}(), which nothing "
                        "here calls: wrap the script that builds the model",
                    )
            if len(models) > 1:
                shared += sorted(models)
                forced["amp"] = "an optimizer spans several models"
            else:
                pairs.append(Pair(models.pop(), opt.expr))
        if len({p.model for p in pairs}) != len(pairs):
            return Decline(
                "several optimizers over one model",
                f"{len(pairs)} optimizers step the same model; optimize() takes one per model",
            )
        paired = {p.model for p in pairs}
        pairs += [Pair(m, None) for m in dict.fromkeys(shared) if m not in paired]
        # optimize() only accepts an optimizer over its own model's parameters, and fp16 loss
        # scaling lives in the optimizer's step: without the optimizer, mixed precision would
        # step on unscaled (or non-finite) gradients. So every call of such a script is fp32.
        loader = self._loader(home, trainers)
        placed = self._anchor(home, optimizers, loader, pairs, trainers, forced)
        if isinstance(placed, Decline) and loader is not None:
            # e.g. the loader is built after the user's own DataParallel wrap: a call without
            # the loader, right after the optimizer, still comes before that wrap.
            pairs[0].loader = None
            placed = self._anchor(home, optimizers, None, pairs, trainers, forced)
        if isinstance(placed, Plan) and pairs[0].loader and not self._intact(home, placed):
            # The loader is not bound where the call goes on every path, or something built
            # before it (`looper = cycle(loader)`) keeps the original: the call goes without it.
            pairs[0].loader = None
            placed = self._anchor(home, optimizers, None, pairs, trainers, forced)
        if not isinstance(placed, Plan):
            return placed
        for pair in pairs:
            if not self._defined(home, pair.model, placed.anchor):
                return Decline(
                    "model not bound at the call",
                    f"the model `{pair.model}` is not bound on every path where the call goes",
                )
            for target, alias in self._captures(home, pair.model, placed.anchor):
                if alias and target.startswith("self."):
                    pair.model = target  # `self.model = model`: the loop trains self.model
                elif self._called_in(trainers, target):
                    return Decline(
                        "model trained through another object",
                        f"the loop trains `{pair.model}` through `{target}`, built from it before "
                        "the optimizer exists: optimize() would not reach the model it calls",
                    )
            pair.device = self._device(home, pair.model, placed.anchor)
            if pair.optimizer and self._only_under_a_flag(home, pair.optimizer, placed.anchor):
                # `if args.use_optimizer: optimizer = AdamW(...)`: passing it would raise a
                # NameError on the other path. The model alone, in fp32 (fp16 loss scaling lives
                # in the optimizer's step); the optimizer keeps the model's own parameters.
                why = f"`{pair.optimizer}` exists only on some paths"
                pair.optimizer = None
                amp = placed.options.get("amp")
                placed.options["amp"] = f"{amp}; {why}" if amp else why
        return placed

    @staticmethod
    def _only_under_a_flag(home: Func, expr: str, anchor: cst.CSTNode) -> bool:
        """Every binding of `expr` in `home` sits under an `if` (or `if/elif` chain) with no
        `else` that does not also hold the call: `if args.use_optimizer: optimizer = ...`,
        unbound when the flag is off. (A chain whose `else` raises, or binds it too, leaves it
        bound wherever the code goes on; an `if __name__ == "__main__":` holding the call too
        runs both.)"""
        binds = assignments_of(home, expr)
        if not binds:
            return False
        around_call = {id(a) for a in home.file.ancestors(anchor)}
        for bind in binds:
            flagged = False
            for anc in home.file.ancestors(bind):
                if anc is home.node:
                    break
                if isinstance(anc, cst.If) and id(anc) not in around_call:
                    chain: cst.If | cst.Else | None = anc
                    while isinstance(chain, cst.If):
                        chain = chain.orelse
                    flagged = chain is None
                    break
            if not flagged:
                return False
        return True

    def _intact(self, home: Func, plan: Plan) -> bool:
        """The plan's loader is bound where the call goes, and nothing built before it from the
        loader (a generator, an iterator) would keep iterating the original."""
        loader = plan.pairs[0].loader
        assert loader is not None
        if not self._defined(home, loader, plan.anchor):
            return False
        return not self._captures(home, loader, plan.anchor)

    def _captures(self, home: Func, expr: str, anchor: cst.CSTNode) -> list[tuple[str, bool]]:
        """(target, is a plain alias) for each statement of `home` before `anchor` that keeps
        the object `expr` in another name: `looper = cycle(loader)`, `self.model = model`,
        `trainer = Diffusion(model)`. Reads that keep nothing (`len(loader)`, `model.parameters()`)
        and a re-binding of `expr` itself do not count."""
        file = home.file
        found: list[tuple[str, bool]] = []
        for node in home.statements():
            if not isinstance(node, cst.Assign) or not runs_by(file, node, anchor):
                continue
            targets = [code_of(t) for t in assign_targets(node)]
            if expr in targets:
                continue
            alias = code_of(node.value) == expr
            if alias or keeps(node.value, expr):
                found += [(t, alias) for t in targets]
        return found

    @staticmethod
    def _called_in(trainers: list[Func], target: str) -> bool:
        """`target(...)` is called in a training function (the forward the loop runs)."""
        return any(code_of(c.func) == target for f in trainers for c in f.calls())

    def _anchor(
        self,
        home: Func,
        optimizers: list[_Origin],
        loader: tuple[str, list[cst.CSTNode]] | None,
        pairs: list[Pair],
        trainers: list[Func],
        forced: dict[str, str],
    ) -> Plan | Decline:
        """The plan with the statement to insert after, once the objects all exist."""
        file = home.file
        relevant = [a for o in optimizers for a in o.assigns]
        entries = [o.entry for o in optimizers if o.entry is not None]
        if not entries:  # a global stepped by functions: the first call in `home` that trains
            entries = [c for c in home.calls() if self.code.trains(home, c)][:1]
        if loader is not None:
            pairs[0].loader = loader[0]
            relevant += loader[1]
        block = common_block(file, relevant + entries)
        if block is None:
            return Decline("placement", "the optimizer and the loop are in unrelated blocks")
        tops = [child_of(file, block, n) for n in relevant]
        anchor = max(tops, key=lambda n: file.order[id(n)])
        late = any(not file.before(anchor, child_of(file, block, e)) for e in entries)
        if late or self._in_training_loop(home, anchor):
            return Decline(
                "optimizer created inside the loop",
                "training starts before the optimizer and loader exist (or creates them)",
            )
        options = self._options(trainers)
        if "amp" in forced and "amp" in options:
            options["amp"] += "; " + forced["amp"]
        options = forced | options
        if "distributed" in options and (late := self._wrapped_before(home, anchor)):
            return Decline("model wrapped in DDP/FSDP before the optimizer", late)
        return Plan(anchor, pairs, options)

    def _device(self, home: Func, model: str, anchor: cst.CSTNode) -> str | None:
        """Where the script puts `model` (`model.to(device)`, `Net().to(args.device)`, `.cuda()`)
        as an expression valid after `anchor`; None (optimize() picks) when it never does, or
        only conditionally, or with a device not yet defined there. A model placed by the
        factory that builds it (`net = get_network(args)`) or by the function it is handed to
        (`Trainer(model, ...)` moving it to `self.gpu_id`) gets that placement, written with
        this function's names."""
        placed, device = self._placement(home, model, anchor)
        if not placed:
            device = self._placed_elsewhere(home, model, anchor)
            if device is None and not any(
                device_facts(f.module, f.parent).gpu_path for f in self.code.files()
            ):
                return '"cpu"'  # a CPU-only script: its own code expects CPU tensors
        if device is None or not self._defined(home, device, anchor):
            return None
        return device

    def _placement(self, func: Func, model: str, anchor: cst.CSTNode) -> tuple[bool, str | None]:
        """(whether `func` places `model` at all, the device it leaves it on when the call after
        `anchor` runs, as code of `func`, or None when that cannot be told)."""
        file = func.file
        found: list[str | None] = []
        guarded: list[str | None] = []  # `if args.gpu: model.cuda()`, as the script's choice
        # Placements in branches of an if/else (`model = A(...).to(device)` / `B(...).to(device)`,
        # word_language_model and yolov5 pick the architecture so): one device for all of them
        # is the script's choice.
        branches: list[str | None] = []
        guarded_to: set[str | None] = set()  # where the guarded placements move it
        placed = False
        for call in func.calls():
            callee = call.func
            if not (isinstance(callee, cst.Attribute) and callee.attr.value in ("to", "cuda")):
                continue
            holder = file.parent(call)
            assigned = isinstance(holder, cst.Assign) and any(
                code_of(t) == model and holder.value is call for t in assign_targets(holder)
            )
            if code_of(callee.value) != model and not assigned:
                continue
            if (device := device_of(call)) is NOT_PLACED:
                continue
            placed = True
            # A placement that runs whenever the inserted call does is where the model stays;
            # one under `if <flag>:` (no else) is the flag's choice, else the CPU.
            flag = guard_of(file, call, anchor)
            if flag is not None:
                guarded.append(f'{device} if {flag} else "cpu"' if device is not None else None)
                guarded_to.add(device)
            elif any(b is common_block(file, [call]) for b in blocks_holding(file, anchor)):
                found.append(device)
            else:
                branches.append(device)
        if found:
            return placed, found[-1]  # the last placement is where the model stays
        if guarded and branches:
            # yolov5: `.to(device)` in both branches, then `if cuda and RANK != -1:` converts
            # to SyncBatchNorm and places it on the same device again: still that device.
            same = len(set(branches)) == 1 and guarded_to == set(branches)
            return placed, branches[0] if same else None
        if len(set(guarded)) == 1:
            return placed, guarded[0]
        if len(set(branches)) == 1:
            return placed, branches[0]
        return placed, None

    def _placed_elsewhere(self, home: Func, model: str, anchor: cst.CSTNode) -> str | None:
        """The device `model` is put on by the local function that returns it
        (`net = get_network(args)`, whose `if args.gpu: net = net.cuda()` gives
        `"cuda" if args.gpu else "cpu"`) or by the one it is handed to (`Trainer(model, ...)`
        whose `__init__` does `model.to(self.gpu_id)`), translated into `home`'s names."""
        file = home.file
        binds = assignments_of(home, model)
        if len(binds) == 1 and isinstance(value := bound_to(binds[0], model), cst.Call):
            factory = self.code.resolve(file, value)
            if factory is not None and factory.name != "__init__":
                returns = [
                    n
                    for n in factory.statements()
                    if isinstance(n, cst.Return) and isinstance(n.value, cst.Name)
                ]
                names = {r.value.value for r in returns}  # type: ignore[union-attr]
                if len(names) == 1 and len(returns) == 1:
                    placed, device = self._placement(factory, names.pop(), returns[0])
                    if placed:
                        return self._translate(device, factory, value) if device else None
        # Only what runs before training starts: a helper called later may move the model for
        # saving or export (`model.to("cpu")`), which is no choice of the training device.
        trains = [c for c in home.calls() if self.code.trains(home, c)]
        for call in home.calls():
            target = self.code.resolve(file, call)
            if target is None or target == home or any(not file.before(call, t) for t in trains):
                continue
            for param in target.params():
                arg = self.code.argument(call, target, param)
                if arg is None or code_of(arg) != model:
                    continue
                # Only a placement the callee always runs (no branch of its own around it).
                moves = [
                    c
                    for c in target.calls()
                    if isinstance(c.func, cst.Attribute)
                    and c.func.attr.value in ("to", "cuda")
                    and code_of(c.func.value) == param
                    and device_of(c) is not NOT_PLACED
                ]
                if len(moves) != 1 or self._branched(target, moves[0]):
                    continue
                device = device_of(moves[0])
                return self._translate(device, target, call) if device else None
        return None

    @staticmethod
    def _branched(func: Func, node: cst.CSTNode) -> bool:
        """`node` sits under a branch or loop of `func` (it may not run)."""
        for anc in func.file.ancestors(node):
            if anc is func.node:
                return False
            if isinstance(anc, cst.If | cst.For | cst.While | cst.Try | cst.With | cst.IfExp):
                return True
        return False

    def _translate(self, expr: str, callee: Func, call: cst.Call, depth: int = 0) -> str | None:
        """`expr` (code of `callee`) as the caller of `call` writes it: the callee's parameters
        become the arguments passed, `self.x` the value `callee` gives it, imports and builtins
        stay when the caller has them too; None when any name cannot be carried over."""
        caller = self.code.scope(self.code.script, call)
        for file in self.code.files():
            if any(c is call for c in file.calls()):
                caller = self.code.scope(file, call)
                break
        tree = cst.parse_expression(expr)
        replace: dict[str, str] = {}
        planner = self

        class Carry(cst.CSTTransformer):
            failed = False

            def leave_Attribute(
                self, original: cst.Attribute, updated: cst.Attribute
            ) -> cst.BaseExpression:
                if not is_self(original.value):
                    return updated
                binds = assignments_of(callee, code_of(original))
                value = bound_to(binds[0], code_of(original)) if len(binds) == 1 else None
                text = (
                    planner._translate(code_of(value), callee, call, depth + 1)
                    if value is not None and depth < 2
                    else None
                )
                if text is None:
                    self.failed = True
                    return updated
                return cst.parse_expression(f"({text})")

        for name in read_names(tree):
            word = name.value
            if word == "self":
                continue  # `self.x`: carried by its value (below)
            if word in callee.params():
                arg = self.code.argument(call, callee, word)
                if arg is None or not is_object(arg):
                    return None
                replace[word] = code_of(arg)
            elif word in callee.file.imports:
                if caller.file.imports.get(word) != callee.file.imports[word]:
                    return None
            elif not hasattr(builtins, word):
                return None

        class Rename(cst.CSTTransformer):
            def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
                if any(original is n for n in names):
                    return cst.parse_expression(replace[original.value])
                return updated

        names = [n for n in read_names(tree) if n.value in replace]
        carry = Carry()
        out = tree.visit(Rename()).visit(carry)
        if carry.failed:
            return None
        text = code_of(out)
        # `(int(...))` from a carried attribute: drop the parentheses around the whole
        return text[1:-1] if isinstance(out, cst.BaseExpression) and out.lpar else text

    def _defined(self, home: Func, expr: str, anchor: cst.CSTNode) -> bool:
        """Every name `expr` reads is bound when the statement after `anchor` runs: a
        parameter, an import, a builtin, a global of the module, or a name assigned before
        `anchor` in a block that holds it (not a later loop's variable)."""
        file = home.file
        tree = cst.parse_expression(expr)
        reads = [n.value for n in read_names(tree)]
        blocks = blocks_holding(file, anchor)
        top = self.code.top(file)
        given = {*home.params(), *(("self", "cls") if home.cls is not None else ())}
        for name in reads:
            if name in given or name in file.imports or hasattr(builtins, name):
                continue
            if name not in file.bound_names:
                continue  # bound nowhere in the file: it comes from elsewhere (`import *`)
            if read_before(home, name, anchor, blocks):
                continue  # read on every path before the call: bound there, or it had failed
            if any(
                runs_by(file, a, anchor)
                and any(
                    b is common_block(file, [a]) or b is if_block(file, a, name) for b in blocks
                )
                for a in assignments_of(home, name)
            ):
                continue
            if home != top and any(
                isinstance(file.parent(a), cst.SimpleStatementLine)
                and file.parent(file.parent(a)) is file.module
                for a in assignments_of(top, name)
            ):
                continue  # a module global, set before any function runs
            return False
        return True

    def _in_training_loop(self, home: Func, node: cst.CSTNode) -> bool:
        for anc in home.file.ancestors(node):
            if anc is home.node:
                return False
            if isinstance(anc, cst.For | cst.While) and any(
                self.code.trains(home, c) for c in home.file.calls(anc)
            ):
                return True
        return False

    def _models(self, home: Func, value: cst.BaseExpression | None, depth: int = 0) -> set[str]:
        """Model expressions whose parameters `value` (an optimizer's construction) takes."""
        if value is None or depth > 3:
            return set()
        roots: set[str] = set()
        factories: set[str] = set()
        for node in [value, *home.file.inside(value)]:
            if not isinstance(node, cst.Call):
                continue
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in (
                "parameters",
                "named_parameters",
                "configure_optimizers",
            ):
                root = func.value
                while isinstance(root, cst.Attribute) and not is_self(root.value):
                    root = root.value  # model.backbone.parameters() -> model
                if is_object(root):
                    roots.add(code_of(root))
            for arg in node.args:
                if isinstance(arg.value, cst.Name):
                    name = arg.value.value
                    if model_like(home, name):
                        factories.add(name)
                    elif assigns := assignments_of(home, name):
                        for a in assigns:
                            factories |= self._models(home, bound_to(a, name), depth + 1)
        if isinstance(value, cst.Name) and (assigns := assignments_of(home, value.value)):
            for a in assigns:
                roots |= self._models(home, bound_to(a, value.value), depth + 1)
        return roots or factories

    def _models_beside(self, home: Func, opt: _Origin) -> set[str]:
        """For an optimizer from a factory returning several things: the model-like names passed
        with it into training (`Trainer(model, loader, optimizer)`)."""
        if not isinstance(opt.entry, cst.Call):
            return set()
        return {
            a.value.value
            for a in opt.entry.args
            if isinstance(a.value, cst.Name) and model_like(home, a.value.value)
        }

    def _loader(self, home: Func, trainers: list[Func]) -> tuple[str, list[cst.CSTNode]] | None:
        """The loader expression in `home` and the statements creating it there, if the loop
        iterates one that reaches `home`."""
        for func in trainers:
            for expr, _loop in self._iterated(func):
                here = self._reaches(func, expr, home, 0)
                if here is not None:
                    return here, assignments_of(home, here)
        return None

    def _reaches(self, func: Func, expr: str, home: Func, depth: int) -> str | None:
        """What `expr` of `func` is called in `home`, if it comes from there."""
        if func == home:
            return expr
        if depth > _MAX_DEPTH:
            return None
        if expr.startswith("self.") and func.cls is not None:
            if home.cls is func.cls:
                return expr
            for method in methods_of(func.file, func.cls):
                for bind in assignments_of(method, expr):
                    param = bound_name(bind, expr)
                    if param in method.params():
                        return self._reaches(method, param, home, depth + 1)  # type: ignore[arg-type]
            return None
        if expr in func.params():
            for caller, call in self.code.callers(func):
                arg = self.code.argument(call, func, expr)
                if arg is not None and is_object(arg):
                    found = self._reaches(caller, code_of(arg), home, depth + 1)
                    if found is not None:
                        return found
        return None

    def _iterated(self, func: Func) -> list[tuple[str, cst.CSTNode]]:
        """(expression, loop) for what each training loop of `func` iterates, innermost first."""
        found = []
        for node in func.statements():
            if not isinstance(node, cst.For | cst.While):
                continue
            trains = any(self.code.trains(func, c) for c in func.file.calls(node.body))
            if not trains:
                continue
            exprs = [self._drawn_from(func, node.iter)] if isinstance(node, cst.For) else []
            # `data_iter = iter(loader)` ... `batch = next(data_iter)` (minGPT's Trainer): each
            # iter() of the loader optimize() returns starts a fresh pass, as the user's did.
            for call in func.file.calls(node.body):
                if code_of(call.func) == "next" and call.args:
                    arg = call.args[0].value
                    if isinstance(arg, cst.Name):
                        for a in assignments_of(func, arg.value):
                            value = bound_to(a, arg.value)
                            if isinstance(value, cst.Call) and code_of(value.func) == "iter":
                                exprs.append(unwrap_iter(value))
                            elif isinstance(value, cst.Call) and self._regenerates(func, value):
                                # `looper = cycle(loader)`: a generator re-iterating the loader
                                exprs.append(value.args[0].value)
            depth = len(list(func.file.ancestors(node)))
            found += [(code_of(e), node, depth) for e in exprs if is_object(e)]
        found.sort(key=lambda t: -t[2])
        return [(e, n) for e, n, _ in found]

    def _regenerates(self, func: Func, call: cst.Call) -> bool:
        """`call` runs a local generator function that iterates its first argument
        (`def cycle(dl): while True: yield from dl`)."""
        target = self.code.resolve(func.file, call)
        if target is None or not call.args or call.args[0].keyword is not None:
            return False
        params = target.params()
        if not params:
            return False
        first = params[0]
        iterates = False
        for node in target.statements():
            if isinstance(node, cst.For) and code_of(unwrap_iter(node.iter)) == first:
                iterates = True
            elif isinstance(node, cst.From) and code_of(unwrap_iter(node.item)) == first:
                iterates = True  # `yield from dl`
        return iterates and any(isinstance(n, cst.Yield) for n in target.statements())

    def _drawn_from(self, func: Func, iterated: cst.BaseExpression) -> cst.BaseExpression:
        """What a for loop over `iterated` draws from, through `enumerate`/`tqdm` wrappers."""
        expr = unwrap_iter(iterated)
        if isinstance(expr, cst.Name) and expr.value not in func.params():
            # `pbar = tqdm(enumerate(loader))` then `for ... in pbar`
            for a in assignments_of(func, expr.value):
                value = bound_to(a, expr.value)
                if isinstance(value, cst.Call) and is_iter_wrapper(value.func):
                    expr = unwrap_iter(value)
                elif isinstance(value, cst.Call) and counts_steps(value):
                    return value  # `pbar = trange(n)`: step numbers, not batches
        return expr

    def _wrapped_before(self, home: Func, anchor: cst.CSTNode) -> str | None:
        """Why the model is already DDP-wrapped when the call would run, if it is."""
        file = home.file
        for call in home.calls():
            if self._is_ddp(file, call) and file.before(call, anchor):
                return (
                    "the model is wrapped in DDP/FSDP/DataParallel before the optimizer exists; "
                    "optimize() must get the bare model"
                )
            target = self.code.resolve(file, call)
            if (
                target is not None
                and file.before(call, anchor)
                and any(self._is_ddp(target.file, c) for c in target.calls())
            ):
                return f"{target.name}() wraps the model in DDP before the optimizer exists"
        return None
