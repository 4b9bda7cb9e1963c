"""Which models a file trains, and the names it holds them under.

A model is trained where an optimizer is built over its parameters:
`torch.optim.X(model.parameters())` (also `self.G.parameters()` in a trainer/solver class),
`torch.optim.X(groups)` with `groups = param_groups(model, ...)` in the same function, the
project's own optimizer builder (`smart_optimizer(model, ...)`, read from the local module), or
the model's own `model.configure_optimizers(...)` (nanoGPT/minGPT/Lightning). A model may be held under another
name (`raw_model = model.module if ddp else model`): `aliases` follows such bindings, and a
model compiled under any of its names is compiled (`is_compiled`).
"""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Rule
from autoopt.lint.program.library import MODEL_WRAPPERS, OPTIMIZER_CLASSES, OPTIMIZER_FACTORIES
from autoopt.lint.program.project_facts import local_definition, module_attribute_definition
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.nodes import (
    assignments,
    dotted,
    is_name,
    method_name,
    names_in,
    nodes_of_type,
    walk,
)


def trained_models(rule: Rule) -> list[tuple[cst.Call, str]]:
    """(call that builds the optimizer, model) for every optimizer over a model's
    parameters: `torch.optim.X(model.parameters())`, `torch.optim.X(groups)` with
    `groups = param_groups(model, ...)` in the same function, or the model's own
    `model.configure_optimizers(...)` (the nanoGPT/minGPT/Lightning idiom); then (call that
    trains it, model) for every model handed to a call that trains it elsewhere in the project
    (`train_one_epoch(model, ...)`, `Solver(model, ...).train()`: the program model's
    `trained_models`)."""
    found = _optimized_models(rule)
    if rule.facts.training_calls:
        for model, calls in rule.context.program.trained_models().items():
            found.append((calls[0], model))
    return found


def _optimized_models(rule: Rule) -> list[tuple[cst.Call, str]]:
    found = []
    stepped = _stepped_names(rule)
    steps_only = _stepped_names(rule, ("step",))
    for n in nodes_of_type(rule.context.module, cst.Call):
        if method_name(n) == "configure_optimizers" and isinstance(n.func, cst.Attribute):
            if isinstance(n.func.value, cst.Name):
                found.append((n, n.func.value.value))
            continue
        if _model_builds_its_optimizer(rule, n, stepped):
            found.append((n, n.func.value.value))  # type: ignore[attr-defined]
            continue
        # `build_optimizer(config, model)`: a builder of the project says which argument it
        # reads the parameters of
        model = _handed_to_optimizer_builder(rule, n)
        owners = [model] if model is not None else []
        params = arg(n, "params", 0)
        if not owners and params is not None and _builds_optimizer(rule, n, stepped, steps_only):
            owners = _parameters_owners(rule, n, params.value) or _handed_model(rule, n, params)
        found.extend((n, owner) for owner in owners)
    return found


def _model_builds_its_optimizer(rule: Rule, call: cst.Call, stepped: set[str]) -> bool:
    """`optimizer = model.get_optimizer(lr, wd)` (pytorch-book's BasicModule): a factory method
    of an object the file runs or places as a model, whose result the file steps."""
    if method_name(call) not in OPTIMIZER_FACTORIES or not isinstance(call.func, cst.Attribute):
        return False
    owner = call.func.value
    holder = rule.parent(call)
    if not (
        isinstance(owner, cst.Name)
        and isinstance(holder, cst.Assign)
        and len(holder.targets) == 1
        and dotted(holder.targets[0].target) in stepped
    ):
        return False
    return any(  # `model(x)`, `model.to(device)`, `model.cuda()`, `model.train()`
        (isinstance(c.func, cst.Name) and c.func.value == owner.value)
        or (
            isinstance(c.func, cst.Attribute)
            and c.func.attr.value in ("to", "cuda", "train")
            and isinstance(c.func.value, cst.Name)
            and c.func.value.value == owner.value
        )
        for c in nodes_of_type(rule.context.module, cst.Call)
    )


def _builds_optimizer(rule: Rule, call: cst.Call, stepped: set[str], steps_only: set[str]) -> bool:
    """A torch.optim optimizer (also through a local alias, `optim_name = optim.SGD`), an
    optimizer class of another library (transformers' AdamW, apex's FusedAdam), or a call
    whose result the file steps (`optimizer = optimizer_cls(model.parameters())` with the class
    picked from a config, `getattr(optim, args.optim)(model.parameters())`)."""
    qualified = rule.qualified_names(call.func)
    if any(_is_optimizer(q) for q in qualified):
        return True
    if any(q.startswith("torch.optim.") for q in qualified):
        return False  # an LR scheduler over the optimizer (`scheduler.step()` is stepped too)
    name = dotted(call.func)
    if name is not None and name.rsplit(".", 1)[-1] in OPTIMIZER_CLASSES:
        return True
    if isinstance(call.func, cst.Name):  # the project's own `class SAM(torch.optim.Optimizer)`
        found = local_definition(rule, call.func.value)
        if found is not None and found.optimizer:
            return True
    scope = rule.facts.enclosing_scope(call)
    for value, _ in rule.facts.assigned_in(scope).get(name, ()) if name else ():
        if any(_is_optimizer(q) for q in rule.qualified_names(value)):
            return True
    holder = rule.parent(call)
    if name is not None and name.rsplit(".", 1)[-1] in MODEL_WRAPPERS:
        return False  # `model = nn.DataParallel(model)` of a model the file zeroes
    return (
        isinstance(holder, cst.Assign)
        and len(holder.targets) == 1
        and _binds_stepped(holder.targets[0].target, name, stepped)
        # `lr_scheduler = build_lr_scheduler(optimizer, ...)` (pysot) is stepped too: a call
        # handed something the file calls `.step()` on (`steps_only`) wraps that optimizer, it
        # is not one over a model (a model is zeroed, `base_model.zero_grad()`, never stepped)
        and not any(dotted(a.value) in steps_only for a in call.args)
    )


def _binds_stepped(target: cst.BaseExpression, callee: str | None, stepped: set[str]) -> bool:
    """The assignment binds a name the file steps: `optimizer = make(...)`, or, from a call
    that names an optimizer, one of a tuple (GPT2's `optimizer, scheduler =
    self.spec.create_optimizer(model.parameters())`)."""
    if dotted(target) in stepped:
        return True
    return (
        isinstance(target, cst.Tuple)
        and "optim" in (callee or "").rsplit(".", 1)[-1].lower()
        and any(dotted(e.value) in stepped for e in target.elements)
    )


def _stepped_names(rule: Rule, methods: tuple[str, ...] = ("step", "zero_grad")) -> set[str]:
    """Names the file calls `.step()` or `.zero_grad()` on (those of `methods`)."""
    return {
        name
        for c in nodes_of_type(rule.context.module, cst.Call)
        if method_name(c) in methods and isinstance(c.func, cst.Attribute)
        for name in (dotted(c.func.value),)
        if name is not None
    }


def _parameters_owners(
    rule: Rule, opt_call: cst.Call, expr: cst.BaseExpression, depth: int = 0
) -> list[str]:
    """The models whose parameters an optimizer's `params` hold: `model.parameters()`,
    parameter groups (`[{"params": model.backbone.parameters()}, ...]`), comprehensions and
    `filter(...)` over them, a model's own group helper (`model.get_optim_policies()`,
    `C3D.get_1x_lr_params(model)`), and names bound to any of those above the optimizer in
    its function (`param_optimizer = list(model.named_parameters())`,
    `groups = get_params_groups(model)`)."""
    owners: list[str] = []

    def add(found: str | None) -> None:
        if found is not None and found not in owners:
            owners.append(found)

    for node in walk(expr):
        if isinstance(node, cst.Call):
            found = _parameters_of(node)
            if found is None and isinstance(node.func, cst.Attribute):
                method = node.func.attr.value
                first = node.args[0].value if node.args else None
                if "param" in method and isinstance(first, cst.Name):
                    found = first.value  # `C3D_model.get_1x_lr_params(model)`
                elif "param" in method or "polic" in method:
                    found = _model_reference(node.func.value)  # `model.get_optim_policies()`
            elif found is None and isinstance(node.func, cst.Name):
                found = _group_helper_model(rule, opt_call, node)
            add(found)
        elif isinstance(node, cst.Name) and depth < 3:
            # `groups = helper(model)` counts only for the params themselves, not for a name
            # read inside them (`lr=get_lr(cfg)`)
            for owner in _bound_owners(rule, opt_call, node.value, depth, node is expr):
                add(owner)
    return owners


def _group_helper_model(rule: Rule, opt_call: cst.Call, call: cst.Call) -> str | None:
    """`get_params(model.module, key="1x")` (deeplab), `separate_bn_paras(self.model)`
    (InsightFace): a function named for parameters handed a model first (or a part of it),
    where the function builds or runs that name as a model."""
    helper = call.func.value.lower()  # type: ignore[attr-defined]
    if not ("param" in helper or "paras" in helper) or not call.args:
        return None
    first = call.args[0].value
    while isinstance(first, cst.Attribute) and not is_name(first.value, "self"):
        first = first.value  # `model.module` -> `model`
    model = _model_reference(first)  # `model` or `self.model`
    if model is None:
        return None
    program = rule.context.program
    func = program.function_of(opt_call)
    # built as a model, or run as one there (`model.train()` after a factory function)
    runs = func is not None and {"called", "train_mode"} <= func.uses.get(
        tuple(model.split(".")), set()
    )
    return model if runs or program.builds_model(func, model) else None


def _bound_owners(rule: Rule, opt_call: cst.Call, name: str, depth: int, whole: bool) -> list[str]:
    """The owners of what `name` holds, bound above `opt_call` in its function: the
    parameters of a group list, or the model a helper makes groups of (`groups =
    get_params_groups(model)`)."""
    scope = rule.facts.enclosing_scope(opt_call)
    values = [
        value
        for value, _ in rule.facts.assigned_in(scope).get(name, ())
        if rule.facts.before(value, opt_call)
    ]
    last = values[-1] if values else None
    if last is None:
        # `paras_only_bn, paras_wo_bn = separate_bn_paras(self.model)` (InsightFace): one of
        # the groups a helper returns
        last = next(
            (
                assign.value
                for assign in reversed(nodes_of_type(scope, cst.Assign, into_scopes=False))
                if isinstance(assign.value, cst.Call)
                and any(
                    isinstance(t.target, cst.Tuple) and name in names_in(t.target)
                    for t in assign.targets
                )
                and rule.facts.before(assign, opt_call)
            ),
            None,
        )
    if last is None:
        # `for key, value in dict(model.named_parameters()).items(): params += [{"params":
        # [value], ...}]` (faster-rcnn): what the loop that binds the name iterates
        return [
            owner
            for loop in nodes_of_type(scope, cst.For)
            if name in names_in(loop.target) and rule.facts.before(loop, opt_call)
            for owner in _parameters_owners(rule, opt_call, loop.iter, depth + 1)
        ][:1]
    owners = _parameters_owners(rule, opt_call, last, depth + 1)
    for grown in _grown_by(rule, scope, name, opt_call):  # `groups.append({"params": ...})`
        owners += [
            o for o in _parameters_owners(rule, opt_call, grown, depth + 1) if o not in owners
        ]
    if (
        whole
        and not owners
        and isinstance(last, cst.Call)
        and last.args
        and not last.args[0].keyword
        and method_name(last) not in ("to", "cuda")  # `Net().to(device)`: not a group helper
        # `model = build_model(cfg)` (TimeSformer): a model, not groups made of `cfg`
        and not rule.context.program.builds_model(rule.context.program.function_of(opt_call), name)
    ):
        first = last.args[0].value
        if isinstance(first, cst.Name):
            return [first.value]
    return owners


def _grown_by(
    rule: Rule, scope: cst.CSTNode, name: str, opt_call: cst.Call
) -> list[cst.BaseExpression]:
    """What `name.append(x)` / `name.extend(x)` add to the list `name` in `scope` before
    `opt_call` (parameter groups gathered one by one: `params_list.append({"params": ...})`),
    and what `name += [...]` adds (pysot's `trainable_params += [{"params": ...}]`)."""
    appended = [
        call.args[0].value
        for call in nodes_of_type(scope, cst.Call)
        if method_name(call) in ("append", "extend")
        and isinstance(call.func, cst.Attribute)
        and is_name(call.func.value, name)
        and call.args
        and rule.facts.before(call, opt_call)
    ]
    added = [
        aug.value
        for aug in nodes_of_type(scope, cst.AugAssign)
        if isinstance(aug.operator, cst.AddAssign)
        and is_name(aug.target, name)
        and rule.facts.before(aug, opt_call)
    ]
    return appended + added


def _model_reference(expr: cst.BaseExpression) -> str | None:
    """`model` or `self.G` (what `_parameters_of` accepts as an owner)."""
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute) and is_name(expr.value, "self"):
        return f"self.{expr.attr.value}"
    return None


def _handed_model(rule: Rule, call: cst.Call, params: cst.Arg) -> list[str]:
    """`optimizer = create_optimizer(model, ...)` of a library: the model itself handed first
    (a name the caller built as a model, `Net().to(device)`)."""
    value = params.value
    program = rule.context.program
    if isinstance(value, cst.Name) and program.builds_model(program.function_of(call), value.value):
        return [value.value]
    return []


def _handed_to_optimizer_builder(rule: Rule, call: cst.Call) -> str | None:
    """`smart_optimizer(model, ...)`, `build_optimizer(config, model)`: the argument a function
    of the project that builds a torch.optim optimizer reads the parameters of (the program
    model's roles: not the config handed first)."""
    if not isinstance(rule.parent(call), cst.Assign):
        return None
    if isinstance(call.func, cst.Name):
        found = local_definition(rule, call.func.value)
        if (found is None or not found.optimizer) and not _builds_optimizer_here(
            rule, call.func.value
        ):
            return None
    else:  # `lib.make_optimizer(model, ...)` of the project's `lib` package (TabR)
        found = module_attribute_definition(rule, call.func)
        if found is None or not found.optimizer:
            return None
    program = rule.context.program
    models = [
        arg.value.value
        for arg, roles in program.argument_roles(call)
        if "module" in roles and isinstance(arg.value, cst.Name)
    ]
    if not models:  # `get_optimizer(self.config, model.parameters())` (ddim), parameter
        # groups (`lib.make_optimizer(name, [{"params": with_wd}, ...], lr)`, tabular-dl)
        models = list(
            dict.fromkeys(o for a in call.args for o in _parameters_owners(rule, call, a.value))
        )
    return models[0] if len(models) == 1 else None


def _builds_optimizer_here(rule: Rule, name: str) -> bool:
    """`name` is a module-level function of the linted file that builds a torch.optim
    optimizer (RAFT's `fetch_optimizer(args, model)`, returning it with its scheduler)."""
    return any(
        isinstance(d, cst.FunctionDef)
        and d.name.value == name
        and any(
            _is_optimizer(q)
            for c in nodes_of_type(d, cst.Call)
            for q in rule.qualified_names(c.func)
        )
        for d in rule.context.module.body
    )


def _is_optimizer(qualified: str) -> bool:
    """`torch.optim.AdamW` and the like; not an LR scheduler or SWA helper (they take the
    optimizer, not parameters)."""
    return qualified.startswith("torch.optim.") and not qualified.startswith(
        ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")
    )


def _parameters_of(expr: cst.BaseExpression) -> str | None:
    """`model.parameters()` / `model.named_parameters()` -> "model" (a plain name), and
    `self.G.parameters()` -> "self.G" (a model held by a trainer/solver class);
    `model.backbone.parameters()` -> "model" (a part of the model: the model is trained)."""
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value in ("parameters", "named_parameters")
    ):
        owner = expr.func.value
        while (
            isinstance(owner, cst.Attribute)
            and isinstance(owner.value, cst.Attribute | cst.Name)
            and not is_name(owner.value, "self")
        ):
            owner = owner.value  # `model.backbone` -> `model`
        return _model_reference(owner)
    return None


def aliases(module: cst.Module, model: str) -> set[str]:
    """`model` and the names it is an alias of: `raw_model = model.module if ddp else model`
    makes `model` (compiled behind a switch, or not) the module `raw_model` trains."""
    found = {model}
    pending = [model]
    while pending:
        name = pending.pop()
        for target, value, _ in _assignments_everywhere(module):
            if target != name:
                continue
            for source in _alias_sources(value):
                if source not in found:
                    found.add(source)
                    pending.append(source)
    return found


def _alias_sources(value: cst.BaseExpression) -> list[str]:
    """`model`, `model.module`, `model._orig_mod` -> "model"; both sides of an `x if c else y`."""
    if isinstance(value, cst.IfExp):
        return _alias_sources(value.body) + _alias_sources(value.orelse)
    if isinstance(value, cst.Attribute) and value.attr.value in ("module", "_orig_mod"):
        value = value.value
    return [value.value] if isinstance(value, cst.Name) else []


def _assignments_everywhere(module: cst.Module) -> list[tuple[str, cst.BaseExpression, cst.Assign]]:
    """`assignments` of the module and of every function in it."""
    scopes: list[cst.CSTNode] = [
        module,
        *nodes_of_type(module, cst.FunctionDef),
    ]
    return [a for scope in scopes for a in assignments(scope)]


def mentions(node: cst.CSTNode, model: str) -> bool:
    """`node` names `model`: a plain name anywhere in it, or the attribute `self.G` itself."""
    if "." not in model:
        return model in names_in(node)
    return any(isinstance(n, cst.Attribute) and dotted(n) == model for n in walk(node))


def is_compiled(rule: Rule, model: str) -> bool:
    """`model`, a name it is an alias of, or a name bound to it (or to its `.module`), is
    compiled anywhere in the file: `m.compile()`, `torch.compile(... m ...)` or `m =
    torch.compile(...)`."""
    module = rule.context.module
    names = aliases(module, model) | _aliased_by(module, model)
    return any(_compiled(rule, module, m) for m in names)


def _aliased_by(module: cst.Module, model: str) -> set[str]:
    """The names bound to `model` or to its `.module` (YOLOS's `model_without_ddp = model`,
    then `model.module` once wrapped in DDP): compiling one compiles the module `model` runs."""
    return {
        target
        for target, value, _ in _assignments_everywhere(module)
        if target != model and model in _alias_sources(value)
    }


def _compiled(rule: Rule, module: cst.Module, model: str) -> bool:
    for n in nodes_of_type(module, (cst.Assign, cst.Call)):
        if (
            isinstance(n, cst.Assign)
            and isinstance(n.value, cst.Call)
            and rule.refers_to(n.value.func, "torch.compile")
            and any(mentions(t.target, model) for t in n.targets)
        ):
            return True
        if not isinstance(n, cst.Call):
            continue
        if (
            method_name(n) == "compile"
            and isinstance(n.func, cst.Attribute)
            and dotted(n.func.value) == model
        ):
            return True
        if rule.refers_to(n.func, "torch.compile") and any(
            mentions(a.value, model) for a in n.args
        ):
            return True
    return False
