"""Bind the model and the loader the loop really uses.

The model is whose `.parameters()` build each optimizer (the receiver of
`configure_optimizers`, or the model passed to a factory); several optimizers over several
models get one call each (a GAN); a model stepped by an optimizer over several models gets a
call without it, and then every call is fp32 (loss scaling needs the optimizer). The loader is
what the training loop iterates (`for`, or `next()` on `iter(loader)` or on a local generator
that re-iterates it), followed back to the function where the call goes; never a progress bar
or a range of step numbers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst

from autoopt.lint.program.library import OPTIMIZER_FACTORIES
from autoopt.lint.tree.nodes import code_of, dotted, is_name, names_in
from autoopt.lint.wrap import decline
from autoopt.lint.wrap.call import Pair
from autoopt.lint.wrap.codebase import CodeBase, Func, SourceFile, on_self
from autoopt.lint.wrap.decline import Decline
from autoopt.lint.wrap.loop import Use, loop_around_calls, runs_epochs
from autoopt.lint.wrap.options import wrapped_by_callers
from autoopt.lint.wrap.origins import Origin, elements, names_an_optimizer_class
from autoopt.lint.wrap.tree import (
    MODEL_WORDS,
    assignments_of,
    bound_name,
    bound_to,
    counts_steps,
    is_iter_wrapper,
    is_object,
    is_self,
    model_like,
    statement_of,
    unpacked_from,
    unwrap_iter,
)

_MAX_DEPTH = 6
Loader = tuple[str, list[cst.CSTNode]]  # the loader's expression in `home`, its assignments there


@dataclass
class Pairing:
    """One call per model: its optimizer, or none for a model stepped by an optimizer over
    several models; `forced` turns options off for the whole script, with the reason."""

    pairs: list[Pair]
    forced: dict[str, str] = field(default_factory=dict)


def pair_models(
    code: CodeBase, home: Func, optimizers: list[Origin], stepped: set[str]
) -> Pairing | Decline:
    """The model each optimizer is built over (`stepped`: expressions that name optimizers)."""
    pairs: list[Pair] = []
    shared: list[str] = []  # models stepped only by an optimizer over several models
    forced: dict[str, str] = {}
    for opt in optimizers:
        # one of a tuple a factory returns: the models that element's optimizer reads; else
        # the models its construction (or a factory handed them) reads
        models = {
            m
            for a in opt.assigns
            if (at := _position(a, opt.expr)) is not None
            for m in _factory_models(code, home, bound_to(a, opt.expr), at, _targets(a))
        } or {
            m
            for a in opt.assigns
            for value in (bound_to(a, opt.expr),)
            for m in (*models_of(home, value), *_factory_models(code, home, value))
        }
        if not models:
            models = models_beside(home, opt)
        models = {
            part
            for model in models
            for a in opt.assigns
            for part in _modules_of_holder(code, home, model, bound_to(a, opt.expr))
        } or models
        models -= stepped  # optimize() takes the module first, never an optimizer
        for model in sorted(models):
            if _module_list(home, model, opt):
                return decline.optimizer_over_module_list(opt.expr, model)
        models -= _aliases_of_others(home, models)
        if not models:
            return decline.unknown_model(opt.expr)
        if "self" in models:
            return decline.optimizer_inside_model(opt.expr)
        for model in sorted(models):
            if model not in home.params():
                continue
            # A model handed in: wrapped once only where the function runs once, and bare.
            if not code.callers(home) and not runs_epochs(code, home):
                return decline.model_from_outside(model, home.name)
            if (wrap := wrapped_by_callers(code, home)) is not None:
                return decline.parallel_before_optimizer(wrap)
            if (around := loop_around_calls(code, home)) is not None:
                caller, loop = around
                header = statement_of(caller.file, loop)
                return decline.created_per_call(opt.expr, home.name, header)
        if len(models) == 1 and (helper := _list_extended_by_call(home, opt)) is not None:
            # Deep-Metric-Learning-Baselines' `criterion, to_optim = losses.loss_select(opt.loss,
            # opt, to_optim)`: the helper may add other modules' parameters (a loss with its
            # own), which optimize() would refuse in its optimizer; the model gets its call
            # without it, the optimizer stays the script's
            shared += sorted(models)
            forced["amp"] = f"the optimizer also trains what {helper}() adds to its parameters"
        elif len(models) > 1:
            # a model whose parameters join only under a condition the optimizer is not under
            # may be no module on other runs (HashNeRF's `embed_fn`, a function unless
            # `--i_embed 1`): left to the script, unless it is None otherwise (nerf's
            # `model_fine`, whose call gets the `is not None` guard)
            shared += sorted(
                m
                for m in models
                if _not_none(home, m) or not _joined_under_a_condition(home, m, opt)
            )
            forced["amp"] = "an optimizer spans several models"
        else:
            pairs.append(Pair(models.pop(), opt.expr))
    if len({p.model for p in pairs}) != len(pairs):
        return decline.optimizers_over_one_model(len(pairs))
    paired = {p.model for p in pairs}
    pairs += [
        Pair(m, None, guard=_not_none(home, m)) for m in dict.fromkeys(shared) if m not in paired
    ]
    return Pairing(pairs, forced)


def _list_extended_by_call(home: Func, opt: Origin) -> str | None:
    """The call that a list of parameters the optimizer's construction reads is handed to and
    bound again from (`criterion, to_optim = losses.loss_select(opt.loss, opt, to_optim)`):
    what it returns may hold more than the model's parameters. Its name, or None."""
    for assign in opt.assigns:
        value = bound_to(assign, opt.expr)
        if (
            not isinstance(value, cst.Call)
            or id(value) not in home.file.order
            or not names_an_optimizer_class(home.file, value)  # not a factory's `(args, model)`
        ):
            continue
        # the parameters: the first argument or `params=` (not `lr=args.lr`, whose `args` a
        # helper may well hand back: `args = set_seed_logger(args)`)
        params = next(
            (a.value for a in value.args if a.keyword is None or a.keyword.value == "params"),
            None,
        )
        if params is None:
            continue
        for node in [params, *home.file.inside(params)]:
            if not (isinstance(node, cst.Name) and home.file.reads(node)):
                continue
            for bound in _values_of(home, node.value, value):
                if (
                    isinstance(bound, cst.Call)
                    and not model_like(home, node.value)
                    and any(is_name(a.value, node.value) for a in bound.args)
                ):
                    return dotted(bound.func) or code_of(bound.func)
    return None


def _aliases_of_others(home: Func, models: set[str]) -> set[str]:
    """The members among `models` that `home` binds to another of them (W2NER's Trainer:
    `self.model = model`, then groups over `self.model.bert` and `model.bert`): one model."""
    return {
        member
        for member in models
        if member.startswith("self.")
        and any(bound_name(a, member) in models for a in assignments_of(home, member))
    }


def _modules_of_holder(
    code: CodeBase, home: Func, model: str, value: cst.BaseExpression | None
) -> set[str]:
    """`model` itself, or, where it is `self.<name>` bound to a plain object of a local class
    (no base: no nn.Module) whose parts the optimizer reads (pointer_summarizer's
    `self.model.encoder.parameters()` + `self.model.decoder.parameters()` + ...), those parts:
    optimize() takes modules."""
    cls = home.cls
    if value is None or cls is None or not model.startswith("self.") or model.count(".") != 1:
        return {model}
    made = [
        made
        for method in code.class_methods(home.file, cls)
        for a in assignments_of(method, model)
        for made in code.classes_made(method.file, bound_to(a, model))
    ]
    if not made or any(code_of(b.value) != "object" for _, c in made for b in c.bases):
        return {model}
    read = [
        value
    ] + [  # `params = list(self.model.encoder.parameters()) + ...`, then `Adagrad(params)`
        bound
        for n in home.file.inside(value)
        if isinstance(n, cst.Name)
        for bound in _values_of(home, n.value, value)
        if bound is not None
    ]
    parts = {
        code_of(n.func.value)
        for expr in read
        for n in [expr, *home.file.inside(expr)]
        if isinstance(n, cst.Call)
        and isinstance(n.func, cst.Attribute)
        and n.func.attr.value in ("parameters", "named_parameters")
        and code_of(n.func.value).startswith(model + ".")
    }
    return parts or {model}


def _factory_models(
    code: CodeBase,
    home: Func,
    value: cst.BaseExpression | None,
    position: int | None = None,
    targets: list[str] | None = None,
) -> set[str]:
    """The names handed to a local optimizer factory for the parameters whose `.parameters()`
    it reads (ijepa's `init_opt(encoder=encoder, predictor=predictor, ...)`: both models); for
    element `position` of a tuple it returns, those the returned optimizer reads (SRGAN's
    `g_optimizer, d_optimizer = define_optimizer(g_model, d_model, config)`: g_model, then
    d_model), and, where it builds the model too and returns it beside the optimizer, the
    caller's name for that element of `targets` (Performance-RNN's `model, optimizer =
    load_session()`)."""
    if not isinstance(value, cst.Call) or (factory := code.resolve(home.file, value)) is None:
        return set()
    params = set(factory.params())
    nodes = factory.statements()
    if position is not None and (returned := _returned_at(factory, position)) is not None:
        binds = assignments_of(factory, returned)
        if binds:
            nodes = [n for b in binds for n in (b, *factory.file.inside(b))]
    read = {
        n.value.value
        for n in nodes
        if isinstance(n, cst.Attribute)
        and n.attr.value in ("parameters", "named_parameters")
        and isinstance(n.value, cst.Name)
    }
    if on_self(value) and factory.cls is not None:
        # a method of the same object: its `self.model` is the caller's (Autoformer's
        # `model_optim = self._select_optimizer()`, `Adam(self.model.parameters())`)
        found = {
            code_of(n.value)
            for n in nodes
            if isinstance(n, cst.Attribute)
            and n.attr.value in ("parameters", "named_parameters")
            and isinstance(n.value, cst.Attribute)
            and is_self(n.value.value)
        }
    else:
        found = set()
    for name in read:
        if name in params:
            arg = code.argument(value, factory, name)
            if isinstance(arg, cst.Name):
                found.add(arg.value)
        elif position is not None and targets:
            found.update(
                targets[at]
                for at in range(len(targets))
                if at != position and _returned_at(factory, at) == name
            )
    return found


def _targets(assign: cst.CSTNode) -> list[str]:
    """The names a tuple assignment binds, in order (`model, optimizer = load_session()`)."""
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
        target = assign.targets[0].target
        if isinstance(target, cst.Tuple):
            return [code_of(e.value) for e in target.elements]
    return []


def _position(assign: cst.CSTNode, expr: str) -> int | None:
    """Where `expr` sits in the tuple `assign` binds (`g_opt, d_opt = f(...)`: d_opt -> 1)."""
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
        target = assign.targets[0].target
        if isinstance(target, cst.Tuple):
            names = [code_of(e.value) for e in target.elements]
            return names.index(expr) if names.count(expr) == 1 else None
    return None


def _returned_at(factory: Func, position: int) -> str | None:
    """The name every `return` of `factory` hands back at `position` of its tuple (None when
    the returns differ or are no tuples of names)."""
    found = set()
    for node in factory.statements():
        if isinstance(node, cst.Return):
            value = node.value
            if not isinstance(value, cst.Tuple) or len(value.elements) <= position:
                return None
            element = value.elements[position].value
            if not isinstance(element, cst.Name):
                return None
            found.add(element.value)
    return found.pop() if len(found) == 1 else None


def _joined_under_a_condition(home: Func, model: str, opt: Origin) -> bool:
    """Every read of `model`'s parameters in `home` sits in an `if` that holds none of the
    optimizer's creations (HashNeRF's `if args.i_embed == 1: embedding_params =
    list(embed_fn.parameters())`, then the RAdam after the `if`)."""
    file = home.file
    reads = [
        n
        for n in home.statements()
        if isinstance(n, cst.Attribute)
        and n.attr.value in ("parameters", "named_parameters")
        and code_of(n.value) == model
    ]
    if not reads:
        return False
    for read in reads:
        branch = next((a for a in file.ancestors(read) if isinstance(a, cst.If)), None)
        if branch is None or any(
            a is branch for c in opt.assigns for a in file.ancestors(c) if id(c) in file.order
        ):
            return False
    return True


def _not_none(home: Func, model: str) -> str | None:
    """`model_fine is not None` where `home` binds `model_fine = None` (nerf's optional fine
    network, built under an `if`): optimize() must not be handed None."""
    for a in assignments_of(home, model):
        value = bound_to(a, model)
        if isinstance(value, cst.Name) and value.value == "None":
            return f"{model} is not None"
    return None


def models_of(home: Func, value: cst.BaseExpression | None) -> set[str]:
    """Model expressions whose parameters `value` (an optimizer's construction) takes."""
    return _either(home, value, 0)


def _either(home: Func, value: cst.BaseExpression | None, depth: int) -> set[str]:
    roots, factories = _models(home, value, depth)
    return roots or factories


def _models(home: Func, value: cst.BaseExpression | None, depth: int) -> tuple[set[str], set[str]]:
    """(models whose `.parameters()` it reads, model-like names handed to a factory)."""
    if value is None or depth > 3:
        return set(), set()
    roots: set[str] = set()
    factories: set[str] = set()
    for node in [value, *home.file.inside(value)]:
        if _parameter_list(home, node):  # `dict(params=model.params1, ...)` (GCNII)
            roots.add(code_of(node.value))  # type: ignore[attr-defined]
        if not isinstance(node, cst.Call):
            continue
        func = node.func
        if isinstance(func, cst.Attribute) and (
            func.attr.value in ("parameters", "named_parameters", "configure_optimizers")
            or _returns_params(home, func)
            or _model_factory_method(home, func)
        ):
            root = func.value
            while isinstance(root, cst.Attribute) and not is_self(root.value):
                if _holds_model(home, root):
                    break  # `benchmark.model.parameters()`: the model is the attribute
                root = root.value  # model.backbone.parameters() -> model
            if is_object(root):
                roots |= _held_by_module_list(home, root, value) or {code_of(root)}
        for arg in node.args:
            if (part := _part_of_model(home, node, arg.value)) is not None:
                roots.add(part)  # `get_parameters_conv(net.model, 'weight')`
            if isinstance(arg.value, cst.Name):
                name = arg.value.value
                if model_like(home, name):
                    factories.add(name)
                else:
                    for bound in _values_of(home, name, value):
                        factories |= _either(home, bound, depth + 1)
    if isinstance(value, cst.Name):
        for bound in _values_of(home, value.value, value):
            roots |= _either(home, bound, depth + 1)
    # Names the construction reads that were built from a model's parameters before it (BERT's
    # `param_optimizer = list(model.named_parameters())`, read by the comprehensions of the
    # parameter groups): those models.
    for node in home.file.inside(value):
        if isinstance(node, cst.Name) and home.file.reads(node):
            for bound in _values_of(home, node.value, value):
                roots |= _models(home, bound, depth + 1)[0]
    return roots, factories


def _part_of_model(home: Func, call: cst.Call, arg: cst.BaseExpression) -> str | None:
    """The model whose submodule `arg` is, when `call` is a helper named for the parameters it
    gathers (lightweight-human-pose's `get_parameters_conv(net.model, 'weight')`): `net`."""
    name = (dotted(call.func) or "").rsplit(".", 1)[-1].lower()
    if "param" not in name or not isinstance(arg, cst.Attribute):
        return None
    root: cst.BaseExpression = arg
    while isinstance(root, cst.Attribute):
        root = root.value
    if isinstance(root, cst.Name) and model_like(home, root.value):
        return root.value
    return None


def _module_list(home: Func, name: str, opt: Origin) -> bool:
    """`name` is bound to an `nn.ModuleList(...)` before the optimizer (one whose modules
    `_held_by_module_list` could not name: SimKD's `trainable_list`, filled with parts of
    other objects under conditions)."""
    before = opt.assigns[0] if opt.assigns else None
    if before is None or id(before) not in home.file.order:
        return False
    values = _values_of(home, name, before)
    return bool(values) and (
        isinstance(values[0], cst.Call)
        and (dotted(values[0].func) or "").rsplit(".", 1)[-1] in ("ModuleList", "ModuleDict")
    )


def _held_by_module_list(home: Func, root: cst.BaseExpression, before: cst.CSTNode) -> set[str]:
    """The models a container built only to gather parameters holds (ReviewKD's
    `trainable_parameters = nn.ModuleList()` + `.append(cnn)`, `nn.ModuleList([cnn, head])`):
    a ModuleList has no forward, so optimize() gets what it holds; empty for anything else."""
    if not isinstance(root, cst.Name):
        return set()
    values = _values_of(home, root.value, before)
    if not values or not isinstance(values[0], cst.Call):
        return set()
    call = values[0]
    if (dotted(call.func) or "").rsplit(".", 1)[-1] != "ModuleList" or len(call.args) > 1:
        return set()
    added = [*(a.value for a in call.args), *values[1:]]
    items: list[cst.BaseExpression] = []
    for value in added:
        if isinstance(value, cst.List | cst.Tuple):
            items += [e.value for e in value.elements]
        elif value is not None:
            items.append(value)
    if not items or not all(is_object(item) for item in items):
        return set()
    return {code_of(item) for item in items}


def _holds_model(home: Func, expr: cst.Attribute) -> bool:
    """`benchmark.model`: a model named as the attribute of a plain object that is no model
    itself (pytorch-maml's namedtuple): not `model.backbone`, whose head is the model."""
    return (
        isinstance(expr.value, cst.Name)
        and any(w in expr.attr.value.lower() for w in MODEL_WORDS)
        and not model_like(home, expr.value.value)
    )


def _values_of(home: Func, name: str, before: cst.CSTNode) -> list[cst.BaseExpression | None]:
    """What `name` is bound to in `home` before `before` (the optimizer's construction: not
    ijepa's `encoder, ..., target_encoder, optimizer = load_checkpoint(...)` after it), and
    what `name += ...`, `name.extend(...)` and `name.append(...)` add to it (nerf's
    `trainable_parameters += list(model_fine.parameters())`)."""
    file = home.file
    values = [bound_to(a, name) for a in assignments_of(home, name) if file.before(a, before)]
    if not values:
        return values
    for node in home.file.body_nodes(home.node):
        if not file.before(node, before):
            continue
        if isinstance(node, cst.AugAssign) and is_name(node.target, name):
            values.append(node.value)
            values += _loop_sources(file, node, node.value)
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in ("append", "extend")
            and is_name(node.func.value, name)
            and node.args
        ):
            values.append(_loop_source(file, node, node.args[0].value))
    return values


def _loop_source(
    file: SourceFile, at: cst.CSTNode, value: cst.BaseExpression
) -> cst.BaseExpression:
    """What `value` is drawn from when it is the target of a for loop around `at` (F3Net's
    `for name, param in net.named_parameters(): base.append(param)`: the named parameters);
    else `value` itself."""
    if isinstance(value, cst.Name):
        for loop in file.ancestors(at):
            if isinstance(loop, cst.For) and value.value in names_in(loop.target):
                return loop.iter
    return value


def _loop_sources(
    file: SourceFile, at: cst.CSTNode, value: cst.BaseExpression
) -> list[cst.BaseExpression]:
    """What the for loops around `at` iterate, where `value` reads their targets
    (faster-rcnn's `for key, value in dict(net.named_parameters()).items(): params +=
    [{'params': [value], ...}]`: the named parameters)."""
    read = {n.value for n in [value, *file.inside(value)] if isinstance(n, cst.Name)}
    return [
        loop.iter
        for loop in file.ancestors(at)
        if isinstance(loop, cst.For) and read & set(names_in(loop.target))
    ]


def _model_factory_method(home: Func, func: cst.Attribute) -> bool:
    """`model.get_optimizer(lr, wd)` (pytorch-book's BasicModule): an optimizer factory that is
    a method of a model of the script."""
    return (
        func.attr.value in OPTIMIZER_FACTORIES
        and isinstance(func.value, cst.Name)
        and model_like(home, func.value.value)
    )


def _parameter_list(home: Func, node: cst.CSTNode) -> bool:
    """`model.params1`: an attribute of a model of the script that holds a list of its
    parameters (read, not called), by its name."""
    if not isinstance(node, cst.Attribute) or not isinstance(node.value, cst.Name):
        return False
    holder = home.file.parent(node)
    if isinstance(holder, cst.Call) and holder.func is node:
        return False  # a method: `_returns_params` and `.parameters()` decide
    name = node.attr.value.lower().rstrip("0123456789_")
    return name.endswith(("params", "parameters")) and model_like(home, node.value.value)


def _returns_params(home: Func, func: cst.Attribute) -> bool:
    """`model.get_1x_lr_params()` (DeepLab), `model.get_parameter_groups()` (psa): a method of
    an object of the script, named for the parameters it returns; not a module's function
    (`C3D_model.get_1x_lr_params(m)`)."""
    name = func.attr.value.lower()
    head = func.value
    while isinstance(head, cst.Attribute):
        head = head.value
    local = isinstance(head, cst.Name) and head.value not in home.file.imports
    return local and name.endswith(("params", "parameters", "param_groups", "parameter_groups"))


def models_beside(home: Func, opt: Origin) -> set[str]:
    """For an optimizer from a factory returning several things: the model-like names passed
    with it into training (`Trainer(model, loader, optimizer)`)."""
    if not isinstance(opt.entry, cst.Call):
        return set()
    return {
        a.value.value
        for a in opt.entry.args
        if isinstance(a.value, cst.Name) and model_like(home, a.value.value)
    }


def loader_of(
    code: CodeBase, home: Func, trainers: list[Func], uses: Sequence[Use] = ()
) -> Loader | None:
    """The loader expression in `home` and the statements creating it there, if the loop
    iterates one that reaches `home`. Loops that step one of `uses` come first: a loop that
    only runs a backward (MART's PGD attack over the test loader, its own throwaway SGD over
    the input) feeds no training step."""
    loops = [(func, expr, loop) for func in trainers for expr, loop in iterated(code, func)]
    loops.sort(key=lambda t: not _steps_in(code, t[0], t[2], uses))
    for func, expr, _loop in loops:
        here = reaches(code, func, expr, home, 0)
        if here is not None:
            assigns = assignments_of(home, here)
            if _torchtext_iterators(code, home, here, assigns):
                return None  # batches of torchtext's own class: no loader for optimize()
            if _library_batcher(code, home, here, assigns):
                return None  # spodernet's StreamBatcher: no torch loader either
            return here, assigns
    return None


def _steps_in(code: CodeBase, func: Func, loop: cst.CSTNode, uses: Sequence[Use]) -> bool:
    """The body of `loop` (in `func`) steps one of `uses`, itself or through what it calls.
    An ignite `trainer.run(loader)` runs the script's own step on each batch: it steps."""
    if not isinstance(loop, cst.For | cst.While):
        return True
    if any(u.func == func and any(a is loop for a in func.file.ancestors(u.node)) for u in uses):
        return True
    stepping = {u.func for u in uses}
    return any(
        _reaches_step(code, target, stepping, 0)
        for call in func.file.calls(loop.body)
        for target in code.runs(func.file, call)
    )


def _reaches_step(code: CodeBase, func: Func, stepping: set[Func], depth: int) -> bool:
    if func in stepping:
        return True
    return depth < _MAX_DEPTH and any(
        _reaches_step(code, target, stepping, depth + 1)
        for call in func.calls()
        for target in code.runs(func.file, call)
    )


def _torchtext_iterators(code: CodeBase, home: Func, expr: str, assigns: list[cst.CSTNode]) -> bool:
    """`expr` is a torchtext iterator (`BucketIterator.splits(...)`), made here or by a local
    function that builds it (keon/seq2seq's `load_dataset()`): its batches are torchtext's
    `Batch` objects, not a DataLoader's."""
    for assign in assigns:
        value = getattr(assign, "value", None)
        if not isinstance(value, cst.Call):
            return False
        if home.file.qualname(value.func).startswith("torchtext."):
            continue
        target = code.resolve(home.file, value)
        if target is None or not any(
            target.file.qualname(c.func).startswith("torchtext.")
            for c in target.file.calls(target.node)
        ):
            return False
    return bool(assigns)


def _library_batcher(code: CodeBase, home: Func, expr: str, assigns: list[cst.CSTNode]) -> bool:
    """`expr` is built by a class of another library that is no torch loader (ConvE's
    `StreamBatcher(...)` of spodernet): optimize() takes a DataLoader, not such a batcher."""
    for assign in assigns:
        value = bound_to(assign, expr)
        if not isinstance(value, cst.Call) or code.resolve(home.file, value) is not None:
            return False
        qualified = home.file.qualname(value.func)
        head, _, leaf = qualified.rpartition(".")
        if not head or head.split(".")[0] in ("torch", "torchvision", "torchaudio"):
            return False
        if code_of(value.func).split(".")[0] not in home.file.imports:
            return False  # not an imported name: a local or built-in
        if leaf.endswith("Loader") or not leaf[:1].isupper():
            return False  # a library's DataLoader subclass (PyG), or a factory function
    return bool(assigns)


def _held(expr: cst.BaseExpression) -> bool:
    """`self.data_loader.train_loader`: a loader an object of the trainer holds, by its name
    (`self.clustering_machine.clusters` is a list of cluster ids, not a loader)."""
    return (
        isinstance(expr, cst.Attribute)
        and isinstance(expr.value, cst.Attribute)
        and is_object(expr.value)  # `self.data_loader`
        and "loader" in expr.attr.value.lower()
    )


def reaches(code: CodeBase, func: Func, expr: str, home: Func, depth: int) -> str | None:
    """What `expr` of `func` is called in `home`, if it comes from there."""
    if func == home:
        return expr
    if depth > _MAX_DEPTH:
        return None
    sources = {unpacked_from(a, expr) for a in assignments_of(func, expr)}
    if len(sources) == 1 and (source := sources.pop()) is not None:
        # `train_loader, eval_loader = loaders`: where the list handed in names it
        for owner, _node, item in elements(code, func, *source, None):
            if (found := reaches(code, owner, item, home, depth + 1)) is not None:
                return found
    if (
        home.node is home.file.module
        and func.file is home.file
        and "." not in expr
        and expr not in func.params()
        and not assignments_of(func, expr)
        and assignments_of(home, expr)
    ):
        return expr  # a global of the module the function reads (`for x in trainloader`)
    if expr.startswith("self.") and func.cls is not None:
        if home.cls is func.cls:
            return expr
        for method in code.class_methods(func.file, func.cls):
            for bind in assignments_of(method, expr):
                param = bound_name(bind, expr)
                if param in method.params():
                    return reaches(code, method, param, home, depth + 1)  # type: ignore[arg-type]
        return None
    if expr in func.params():
        for caller, call in code.callers(func):
            arg = code.argument(call, func, expr)
            if arg is not None and is_object(arg):
                found = reaches(code, caller, code_of(arg), home, depth + 1)
                if found is not None:
                    return found
    return None


def iterated(code: CodeBase, func: Func) -> list[tuple[str, cst.CSTNode]]:
    """(expression, loop) for what each training loop of `func` iterates, innermost first."""
    found = []
    for node in func.statements():
        if not isinstance(node, cst.For | cst.While):
            continue
        trains = any(code.trains(func, c) for c in func.file.calls(node.body))
        if not trains:
            continue
        exprs = [drawn_from(func, node.iter)] if isinstance(node, cst.For) else []
        # `data_iter = iter(loader)` ... `batch = next(data_iter)` (minGPT's Trainer): each
        # iter() of the loader optimize() returns starts a fresh pass, as the user's did.
        for call in func.file.calls(node.body):
            arg = _advanced(call)
            if isinstance(arg, cst.Name):
                for a in assignments_of(func, arg.value):
                    value = bound_to(a, arg.value)
                    if isinstance(value, cst.Call) and code_of(value.func) == "iter":
                        exprs.append(unwrap_iter(value))
                    elif isinstance(value, cst.Call) and regenerates(code, func, value):
                        # `looper = cycle(loader)`: a generator re-iterating the loader
                        exprs.append(value.args[0].value)
        depth = len(list(func.file.ancestors(node)))
        found += [(code_of(e), node, depth) for e in exprs if is_object(e) or _held(e)]
    found += [(code_of(e), n, 0) for e, n in _engine_runs(code, func) if is_object(e)]
    found.sort(key=lambda t: -t[2])
    return [(e, n) for e, n, _ in found]


def _advanced(call: cst.Call) -> cst.BaseExpression | None:
    """The iterator `call` advances: `next(it)`, or `it.next()` / `it.__next__()` (FixMatch's
    `labeled_iter.next()`, written for torch < 1.13's loader iterators)."""
    if code_of(call.func) == "next" and call.args:
        return call.args[0].value
    if (
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value in ("next", "__next__")
        and not call.args
    ):
        return call.func.value
    return None


def _engine_runs(code: CodeBase, func: Func) -> list[tuple[cst.BaseExpression, cst.CSTNode]]:
    """(loader, call) for each `trainer.run(loader, ...)` of `func` where the trainer is an
    ignite `Engine(step)` running a local step function (made here, or returned by a local
    function: `create_trainer(model, optimizer).run(loader)`): the engine iterates the loader
    and calls the script's own step on each batch."""
    found = []
    for call in func.calls():
        if (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "run"
            and call.args
            and call.args[0].keyword is None
            and _makes_engine(code, func, call.func.value, 0)
        ):
            found.append((call.args[0].value, call))
    return found


def _makes_engine(code: CodeBase, func: Func, expr: cst.BaseExpression, depth: int) -> bool:
    """`expr` (in `func`) is an ignite Engine running a local step function."""
    if isinstance(expr, cst.Name) and depth <= _MAX_DEPTH:
        return any(
            isinstance(value := bound_to(a, expr.value), cst.BaseExpression)
            and _makes_engine(code, func, value, depth + 1)
            for a in assignments_of(func, expr.value)
        )
    if not isinstance(expr, cst.Call):
        return False
    if code.engine_step(func.file, expr) is not None:
        return True
    maker = code.resolve(func.file, expr)
    return (
        maker is not None
        and depth <= _MAX_DEPTH
        and any(
            isinstance(n, cst.Return)
            and n.value is not None
            and _makes_engine(code, maker, n.value, depth + 1)
            for n in maker.statements()
        )
    )


def regenerates(code: CodeBase, func: Func, call: cst.Call) -> bool:
    """`call` runs a local generator function that iterates its first argument
    (`def cycle(dl): while True: yield from dl`)."""
    target = code.resolve(func.file, call)
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


def drawn_from(func: Func, iterated: cst.BaseExpression) -> cst.BaseExpression:
    """What a for loop over `iterated` draws from, through `enumerate`/`tqdm` wrappers."""
    expr = _one_source(iterated)
    if isinstance(expr, cst.Name) and expr.value not in func.params():
        # `pbar = tqdm(enumerate(loader))` then `for ... in pbar`: the last binding before the
        # loop (seq2seq-summarizer binds `prog_bar` to a range for training and to a loader's
        # batches for validation)
        name = expr.value
        for item in _with_items(func, name):
            # `with tqdm(dataloader) as tqdmDataLoader:` then `for x in tqdmDataLoader`
            if isinstance(item, cst.Call) and is_iter_wrapper(item.func):
                return _one_source(item)
        bindings = assignments_of(func, name)
        earlier = [a for a in bindings if func.file.before(a, iterated)]
        for a in reversed(earlier or bindings):
            value = bound_to(a, name)
            if isinstance(value, cst.Call) and counts_steps(value):
                return value  # `pbar = trange(n)`: step numbers, not batches
            if isinstance(value, cst.Call) and is_iter_wrapper(value.func):
                return _one_source(value)
    return expr


def _with_items(func: Func, name: str) -> list[cst.BaseExpression]:
    """What the `with` statements of `func` bind to `name` (`with X as name:`)."""
    return [
        item.item
        for node in func.statements()
        if isinstance(node, cst.With)
        for item in node.items
        if item.asname is not None and code_of(item.asname.name) == name
    ]


def _one_source(iterated: cst.BaseExpression) -> cst.BaseExpression:
    """`iterated` through `enumerate`/`tqdm` wrappers; a `zip` of several loaders stays the
    zip (no one loader): their batches meet in the step (revgrad's `torch.cat([source_x,
    target_x])` before `.to(device)`), and a loader that alone came back on the device would
    mix devices there."""
    expr = iterated
    while isinstance(expr, cst.Call) and expr.args and is_iter_wrapper(expr.func):
        if code_of(expr.func).split(".")[-1] == "zip" and len(expr.args) > 1:
            return expr
        expr = expr.args[0].value
    return expr
