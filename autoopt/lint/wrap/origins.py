"""Bind each stepped optimizer to the statement that creates it: followed back through
parameters, callers and `self.` attributes (also a `**kwargs` keyword, a closure's free variable
or a module global) to the function that builds it, where the call will go. Assignments of one
name in `if/elif` branches are one optimizer."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoopt.lint.program.library import OPTIMIZER_CLASSES, OPTIMIZER_FACTORIES
from autoopt.lint.tree.nodes import code_of, is_name, walk
from autoopt.lint.wrap import decline
from autoopt.lint.wrap.codebase import CodeBase, Func, SourceFile
from autoopt.lint.wrap.decline import Decline
from autoopt.lint.wrap.loop import Training
from autoopt.lint.wrap.options import is_apex_initialize, wrapped_by_callers
from autoopt.lint.wrap.tree import (
    assign_targets,
    assignments_of,
    bound_kwarg,
    bound_name,
    bound_to,
    element_at,
    is_object,
    rebinds,
    statement_of,
    unpacked_from,
)

_MAX_DEPTH = 6


@dataclass
class Origin:
    """Where an object used in training is created: `assigns` in `func` bind `expr`; `entry` is
    the node of `func` through which it reaches training (None when another method of the class
    trains, later)."""

    func: Func
    expr: str
    assigns: list[cst.CSTNode]
    entry: cst.CSTNode | None


@dataclass
class Bound:
    """The optimizers the loop steps, where they are created (in source order, all in `home`),
    and every expression that names an optimizer (never a model)."""

    home: Func
    optimizers: list[Origin]
    stepped: set[str]


class Tracer:
    """Follows one object back to where it is created; remembers the parameters it reached of
    functions nothing here calls (for the decline's reason)."""

    def __init__(self, code: CodeBase) -> None:
        self.code = code
        # (function, parameter) an object was followed to, where nothing here calls the function
        self.outside: list[tuple[Func, str]] = []
        self.elements: list[str] = []  # the names a collection of optimizers holds

    def origins(self, func: Func, expr: str, entry: cst.CSTNode | None, depth: int) -> list[Origin]:
        """Where the object `expr` (used in `func` at `entry`) is created."""
        if depth > _MAX_DEPTH:
            return []
        assigns = assignments_of(func, expr)
        if assigns:
            sources = {unpacked_from(a, expr) for a in assigns}
            if len(sources) == 1 and (source := sources.pop()) is not None:
                # `optim_g, optim_d = optims`: where the list handed in names it
                found = [
                    origin
                    for owner, node, item in elements(self.code, func, *source, entry)
                    for origin in self.origins(owner, item, node, depth + 1)
                ]
                if found:
                    return found
            if (inner := self._built_inside(func, expr, assigns)) is not None:
                factory, name = inner
                return self.origins(factory, name, None, depth + 1)
            return [Origin(func, expr, assigns, entry)]
        found: list[Origin] = []
        if expr.count(".") == 2 and expr.startswith("self.") and func.cls is not None:
            return self._through_member(func, expr, depth)
        if expr.count(".") == 1 and not expr.startswith(("self.", "cls.")):
            return self._through_object(func, expr, depth)
        if expr.startswith("self.") and func.cls is not None:
            binding = [
                (m, b)
                for m in self.code.class_methods(func.file, func.cls)
                if (b := assignments_of(m, expr))
            ]
            if any(not placeholder(b, expr) for _, b in binding):
                # `self.optimizer = None` in `__init__`: a placeholder, not a second optimizer
                binding = [(m, b) for m, b in binding if not placeholder(b, expr)]
            for method, binds in binding:
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
                    found.append(Origin(method, expr, binds, here))
            return found
        if expr in func.params():
            return self._through_callers(func, expr, depth)
        outer = func.file.scope_of(func.node)
        if isinstance(func.node, cst.FunctionDef) and isinstance(outer, cst.FunctionDef):
            # a closure's free variable (`def _backward(loss): optimizer.step()` inside
            # train_one_epoch): bound by the enclosing function
            return self.origins(Func(func.file, outer), expr, None, depth + 1)
        if isinstance(func.node, cst.FunctionDef):  # a global of the module
            top = self.code.top(func.file)
            if assignments_of(top, expr):
                return self.origins(top, expr, None, depth + 1)
        return []

    def _built_inside(
        self, func: Func, expr: str, assigns: list[cst.CSTNode]
    ) -> tuple[Func, str] | None:
        """The local function and its name for the optimizer, where `expr` is only what that
        function returns and the function builds the optimizer over models it keeps to itself
        (nerf's `..., optimizer = create_nerf(args)`: `create_nerf` builds `model`,
        `model_fine` and the Adam over their `grad_vars`, and returns render settings, not the
        models): the models exist only there, so the call goes there. Not where it returns a
        model beside it (`model, optimizer = load_session()`: the caller holds both)."""
        if len(assigns) != 1:
            return None
        call = getattr(assigns[0], "value", None)
        targets = [code_of(t) for t in assign_targets(assigns[0])]
        if not isinstance(call, cst.Call) or expr not in targets:
            return None
        factory = self.code.resolve(func.file, call)
        if factory is None or factory.cls is not None or factory.file is not func.file:
            return None
        index = targets.index(expr) if len(targets) > 1 else None
        names = set()
        for ret in (n for n in factory.statements() if isinstance(n, cst.Return)):
            got = ret.value if index is None else element_at(ret.value, index)
            if not isinstance(got, cst.Name):
                return None
            names.add(got.value)
        if len(names) != 1:
            return None
        name = names.pop()
        creations = [bound_to(a, name) for a in assignments_of(factory, name)]
        if not creations or not all(
            isinstance(c, cst.Call) and names_an_optimizer_class(factory.file, c) for c in creations
        ):
            return None
        models = {
            code_of(n.value)
            for n in factory.statements()
            if isinstance(n, cst.Attribute)
            and n.attr.value in ("parameters", "named_parameters")
            and isinstance(n.value, cst.Name)
        }
        returned = {
            code_of(n)
            for ret in factory.statements()
            if isinstance(ret, cst.Return) and ret.value is not None
            for n in walk(ret.value)
            if isinstance(n, cst.Name)
        }
        if not models or models & (returned | set(factory.params())):
            return None
        return factory, name

    def _through_member(self, func: Func, expr: str, depth: int) -> list[Origin]:
        """`self.GAN.G_opt`: where the class of `self.GAN` (a local class the methods of
        `func`'s class instantiate) binds `self.G_opt`."""
        member, _, attr = expr.rpartition(".")
        assert func.cls is not None
        found: list[Origin] = []
        for method in self.code.class_methods(func.file, func.cls):
            for bind in assignments_of(method, member):
                found += self._bound_by_its_class(method, bound_to(bind, member), attr, depth)
        return found

    def _bound_by_its_class(
        self, func: Func, value: cst.BaseExpression | None, attr: str, depth: int
    ) -> list[Origin]:
        """Where the local class `value` (in `func`) builds binds `self.<attr>`."""
        owner = (
            self.code.called_class(func.file, value.func) if isinstance(value, cst.Call) else None
        )
        methods = self.code.class_methods(*owner) if owner else []
        return self.origins(methods[0], f"self.{attr}", None, depth + 1) if methods else []

    def _through_object(self, func: Func, expr: str, depth: int) -> list[Origin]:
        """`trainer_module.optimizer_d`: where the local class of `trainer_module` (`trainer =
        Trainer(config)`, then `trainer_module = trainer.module` or `= trainer`) binds
        `self.optimizer_d` (generative-inpainting)."""
        name, _, attr = expr.partition(".")
        found: list[Origin] = []
        for bind in assignments_of(func, name):
            value = bound_to(bind, name)
            while isinstance(value, cst.Attribute) and value.attr.value == "module":
                value = value.value  # the module inside a DataParallel wrap
            if isinstance(value, cst.Name) and value.value != name and depth < _MAX_DEPTH:
                found += self._through_object(func, f"{value.value}.{attr}", depth + 1)
            else:
                found += self._bound_by_its_class(func, value, attr, depth)
        return found

    def _through_callers(self, func: Func, param: str, depth: int) -> list[Origin]:
        if not self.code.callers(func):
            # Handed in from code this analysis does not see (`SimCLR(optimizer=...)` in the
            # script that imports this module): remembered for the decline's reason.
            self.outside.append((func, param))
            return []
        found: list[Origin] = []
        for caller, call in self.code.callers(func):
            arg = self.code.argument(call, func, param)
            if arg is not None and is_object(arg):
                found += self.origins(caller, code_of(arg), call, depth + 1)
        return found

    def members(self, found: list[Origin]) -> list[Origin]:
        """The optimizers a collection holds (`optimizers = [opt_g, opt_d]`), each followed to
        where it is created; [] when any element is not a plain name there."""
        out: list[Origin] = []
        for origin in found:
            for assign in origin.assigns:
                value = bound_to(assign, origin.expr)
                if not isinstance(value, cst.List | cst.Tuple) or not value.elements:
                    return []
                for element in value.elements:
                    if not is_object(element.value):
                        return []
                    expr = code_of(element.value)
                    members = self.origins(origin.func, expr, origin.entry, 1)
                    if not members:
                        return []
                    self.elements.append(expr)
                    out += members
        return out

    def handed_in(self, expr: str) -> Decline | None:
        """Why `expr` is created elsewhere, when it was followed to a parameter (or a `**kwargs`
        keyword) of a function nothing here calls."""
        if not self.outside:
            return None
        func, param = self.outside[-1]
        callee = (
            f"{func.cls.name.value}()" if func.name == "__init__" and func.cls else f"{func.name}()"
        )
        kind = "parameter" if param in func.params() else "keyword argument"
        return decline.handed_in(expr, kind, param, callee)


def elements(
    code: CodeBase, func: Func, name: str, index: int, entry: cst.CSTNode | None
) -> list[tuple[Func, cst.CSTNode | None, str]]:
    """(function, node, element) for each list or tuple display `name` (a parameter of `func`,
    or a local) is built from, with its `index`-th element there: the caller's
    `train(..., [optim_g, optim_d])` gives `optim_d` for index 1."""
    found: list[tuple[Func, cst.CSTNode | None, str]] = []
    if name in func.params():
        for caller, call in code.callers(func):
            item = element_at(code.argument(call, func, name), index)
            if item is not None and is_object(item):
                found.append((caller, call, code_of(item)))
        return found
    for assign in assignments_of(func, name):
        item = element_at(bound_to(assign, name), index)
        if item is not None and is_object(item):
            found.append((func, entry, code_of(item)))
    return found


def placeholder(binds: list[cst.CSTNode], expr: str) -> bool:
    """Every one of `binds` gives `expr` the value None (a slot filled elsewhere)."""
    return all(is_name(bound_to(b, expr), "None") for b in binds)


def creates_optimizer(file: SourceFile, call: cst.Call) -> bool:
    """`torch.optim.X(...)` or another library's optimizer class (`names_an_optimizer_class`),
    one picked by name from `torch.optim` (Continual-Learning-Benchmark's
    `torch.optim.__dict__[config["optimizer"]](**args)`, `getattr(torch.optim, name)(...)`), a
    project's optimizer builder (`get_optimizer(cfg, model)`), by name, or a factory handed the
    `torch.optim` module (`config.init_obj("optimizer", torch.optim, params)`)."""
    func = call.func
    if isinstance(func, cst.Subscript) and file.qualname(func.value) == "torch.optim.__dict__":
        return True
    if (
        isinstance(func, cst.Call)
        and is_name(func.func, "getattr")
        and func.args
        and file.qualname(func.args[0].value) == "torch.optim"
    ):
        return True
    if names_an_optimizer_class(file, call):
        return True
    if file.qualname(call.func).rsplit(".", 1)[-1] in OPTIMIZER_FACTORIES:
        return True
    if is_name(func, "getattr"):  # `getattr(optim, name)` uncalled: the class, handed on
        return False  # (prototypical-networks' `engine.train(optim_method=getattr(...))`)
    return any(file.qualname(a.value) == "torch.optim" for a in call.args)


def names_an_optimizer_class(file: SourceFile, call: cst.Call) -> bool:
    """`torch.optim.Adam(...)` (a class, not `optimizer.step()` on `from torch.optim import
    optimizer`, nor a scheduler), or an optimizer class of another library by its name
    (transformers' AdamW, RAdam)."""
    qualified = file.qualname(call.func)
    leaf = qualified.rsplit(".", 1)[-1]
    if (
        qualified.startswith("torch.optim.")
        and leaf[:1].isupper()
        and not any(f".{m}." in qualified for m in ("lr_scheduler", "swa_utils"))
    ):
        return True
    return leaf in OPTIMIZER_CLASSES


def where_created(func: Func) -> str:
    """How a decline names a function (one that creates an optimizer, or runs a backward):
    "BCQ.__init__() of BCQ.py"."""
    return f"{_qualified(func)}() of {func.file.path}"


def _creations(code: CodeBase, origin: Origin) -> list[cst.CSTNode] | Decline:
    """The statements that create the optimizer, without those that re-bind the same object:
    a local helper that restores and returns it (`optimizer = restore(optimizer)`) or apex's
    `amp.initialize` (the options leave precision to it); both may come after the call. Any
    other wrap of the optimizer the loop steps (`optimizer = LARC(optimizer=optimizer)`) is
    declined: the loop would step the wrapper."""
    file, expr = origin.func.file, origin.expr
    kept: list[cst.CSTNode] = []
    for assign in origin.assigns:
        value = bound_to(assign, expr)
        if not rebinds(file, assign, expr) or not isinstance(value, cst.Call):
            kept.append(assign)
        elif is_apex_initialize(file, value) or _returns_it(code, file, assign, expr):
            continue
        elif code.resolve(file, value) is None and _is_class(value):
            return decline.optimizer_rewrapped(expr, statement_of(file, assign))
        else:
            kept.append(assign)  # a helper that builds a new one from it, or restores it
    return kept or origin.assigns


def _built_over_a_parameter(origin: Origin) -> bool:
    """The optimizer is built from something handed in (`def train(model, ...): optim =
    Adamax(model.parameters())`), not from what the function's own object holds."""
    params = set(origin.func.params())
    return any(
        isinstance(n, cst.Name) and n.value in params
        for a in origin.assigns
        for n in origin.func.file.inside(a)
    )


def _qualified(func: Func) -> str:
    """`SimGNNTrainer.fit`, or `train` for a function outside any class."""
    owner = func.cls
    return f"{owner.name.value}.{func.name}" if owner is not None else func.name


def _shown(file: SourceFile) -> str:
    """A module of the project as the decline names it."""
    return file.path.name if file.path is not None else "another module"


def _over_tensors(origin: Origin) -> bool:
    """Every creation of the optimizer steps a list of tensors (`SGD([delta], lr=...)`: an
    adversarial perturbation, an image being optimised; `Adam([self.log_alpha])`: SAC's
    temperature), not a model's parameters."""
    values = [bound_to(a, origin.expr) for a in origin.assigns]
    return bool(values) and all(isinstance(v, cst.Call) and steps_tensors(v) for v in values)


def steps_tensors(creation: cst.Call) -> bool:
    """The optimizer `creation` builds steps a list of tensors (`SGD([delta])`; also a list
    grown by `+`: stylegan2's projector, `Adam([w_opt] + list(noise_bufs.values()))`)."""
    if not creation.args or creation.args[0].keyword:
        return False
    first = creation.args[0].value
    while isinstance(first, cst.BinaryOperation) and isinstance(first.operator, cst.Add):
        first = first.left
    return (
        isinstance(first, cst.List | cst.Tuple)
        and bool(first.elements)
        and all(isinstance(e.value, cst.Name | cst.Attribute) for e in first.elements)
    )


def _no_optimizer(code: CodeBase, origin: Origin) -> bool:
    """Every creation builds an object of a class of the project that is no optimizer: not a
    subclass of one, and never reading a gradient (MixMatch's `WeightEMA(model, ema_model)`,
    whose `step()` averages the weights after the optimizer's)."""
    file = origin.func.file
    values = [bound_to(a, origin.expr) for a in origin.assigns]
    if not values:
        return False
    for value in values:
        if not isinstance(value, cst.Call):
            return False
        init = code.resolve(file, value)
        owner = init.cls if init is not None and init.name == "__init__" else None
        if owner is None or any("Optimizer" in code_of(b.value) for b in owner.bases):
            return False
        if any(isinstance(n, cst.Attribute) and n.attr.value == "grad" for n in walk(owner)):
            return False
    return True


def _is_class(call: cst.Call) -> bool:
    """`LARC(...)`, `hvd.DistributedOptimizer(...)`: an instance of a class is made (by its
    capitalised name), not a function's result."""
    name = code_of(call.func).rsplit(".", 1)[-1]
    return name[:1].isupper()


def _returns_it(code: CodeBase, file: SourceFile, assign: cst.CSTNode, expr: str) -> bool:
    """`assign` binds `expr` to what a local function returns of the same argument:
    `model, optimizer, lr, it = load_checkpoint(path, model, optimizer)` whose `return model,
    optimizer, lr, it` hands back the parameter it got `optimizer` in."""
    value = bound_to(assign, expr)
    targets = [code_of(t) for t in assign_targets(assign)]
    call = value if isinstance(value, cst.Call) else getattr(assign, "value", None)
    if not isinstance(call, cst.Call) or (callee := code.resolve(file, call)) is None:
        return False
    param = next(
        (
            p
            for p in callee.params()
            if (a := code.argument(call, callee, p)) is not None and code_of(a) == expr
        ),
        None,
    )
    returns = [n for n in callee.statements() if isinstance(n, cst.Return) and n.value]
    if param is None or not returns:
        return False
    index = targets.index(expr) if len(targets) > 1 else None
    for ret in returns:
        got = ret.value if index is None else element_at(ret.value, index)
        if got is None or code_of(got) != param:
            return False
    return True


def _evaluation_probe(function: str) -> bool:
    """A function named for evaluation and not for training (`node_classification_evaluation`,
    `linear_probe`): an optimizer it creates trains a probe to score the model, not the model."""
    name = function.lower()
    return any(w in name for w in ("eval", "valid", "probe")) and "train" not in name


def bind_optimizers(code: CodeBase, training: Training) -> Bound | Decline:
    """Each optimizer the loop steps, followed to where it is created; all of them must be
    created in one function of the script."""
    stepped = set(training.stepped)
    origins: dict[tuple[int, str], Origin] = {}
    for use in training.uses:
        tracer = Tracer(code)
        found = tracer.origins(use.func, use.expr, use.node, 0)
        if found and use.expr in training.collections:
            held = found
            found = tracer.members(found)
            if not found and all(o.func.file is not code.script for o in held):
                # XLM: `for optimizer in optimizers` in the Trainer of xlm/trainer.py, which
                # builds and holds them: that class is where --wrap could go
                where = {where_created(o.func): None for o in held}
                return decline.optimizers_held_in_module(use.expr, list(where))
            if not found:
                return decline.optimizers_in_collection(use.expr)
            stepped.update(tracer.elements)
        if not found and (outside := tracer.handed_in(use.expr)):
            return outside
        if not found:
            return decline.optimizer_not_found(use.expr, use.func.name)
        for origin in found:
            key = (id(origin.func.node), origin.expr)
            if key in origins:
                origins[key].assigns.extend(
                    a for a in origin.assigns if all(a is not b for b in origins[key].assigns)
                )
            else:
                origins[key] = origin
    for origin in origins.values():
        kept = _creations(code, origin)
        if isinstance(kept, Decline):
            return kept
        origin.assigns = kept
    tensors = {key for key, o in origins.items() if _over_tensors(o)}
    if tensors and len(tensors) == len(origins):
        return decline.optimizer_over_tensors(next(iter(origins.values())).expr)
    for key in tensors:  # an attack's perturbation stepped beside the model (TRADES)
        del origins[key]
    averages = {key for key, o in origins.items() if _no_optimizer(code, o)}
    if averages and len(averages) < len(origins):
        for key in averages:  # MixMatch's `ema_optimizer = WeightEMA(model, ema_model)`
            del origins[key]
    if origins and all(o.func.file is not code.script for o in origins.values()):
        for origin in origins.values():
            if _built_over_a_parameter(origin) and (wrap := wrapped_by_callers(code, origin.func)):
                # bottom-up-attention-vqa's `model = nn.DataParallel(model).cuda()` before
                # `train(model, ...)` builds the optimizer: no file holds the bare model there
                return decline.parallel_before_optimizer(wrap)
        # an object of a local module creates and steps them (BCQ's agent, SimGNN's trainer)
        where = {where_created(o.func): None for o in origins.values()}
        # the first creation's file, in the program's order (a set's first Path would vary
        # with the hash seed, and with it the decline's second sentence)
        first = next(iter(origins.values())).func.file.path
        return decline.optimizer_in_module(list(where), path=first)
    probes = {key for key, o in origins.items() if _evaluation_probe(o.func.name)}
    if probes and len(probes) < len(origins):
        for key in probes:  # a linear probe's optimizer, trained to evaluate (GraphMAE)
            del origins[key]
    homes = {id(o.func.node) for o in origins.values()}
    if len(homes) > 1:
        where = {
            f"`{o.expr}` in {o.func.name}()"
            + ("" if o.func.file is code.script else f" of {_shown(o.func.file)}"): None
            for o in origins.values()
        }
        return decline.optimizers_in_several_functions(list(where))
    optimizers = sorted(
        origins.values(), key=lambda o: min(o.func.file.order[id(a)] for a in o.assigns)
    )
    home = optimizers[0].func
    if home.file is not code.script:
        return decline.optimizer_in_module([where_created(home)], path=home.file.path)
    return Bound(home, optimizers, stepped)
