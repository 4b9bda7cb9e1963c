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
from autoopt.lint.program.project_facts import local_definition
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
    for n in nodes_of_type(rule.context.module, cst.Call):
        if method_name(n) == "configure_optimizers" and isinstance(n.func, cst.Attribute):
            if isinstance(n.func.value, cst.Name):
                found.append((n, n.func.value.value))
            continue
        if not any(_is_optimizer(q) for q in rule.qualified_names(n.func)):
            model = _handed_to_optimizer_builder(rule, n)
            if model is not None:
                found.append((n, model))
            continue
        params = arg(n, "params", 0)
        model = _parameters_owner(rule, n, params.value) if params is not None else None
        if model is not None:
            found.append((n, model))
    return found


def _handed_to_optimizer_builder(rule: Rule, call: cst.Call) -> str | None:
    """`smart_optimizer(model, ...)`, `build_optimizer(config, model)`: the argument a function
    of the project that builds a torch.optim optimizer reads the parameters of (the program
    model's roles: not the config handed first)."""
    if not isinstance(call.func, cst.Name) or not isinstance(rule.parent(call), cst.Assign):
        return None
    found = local_definition(rule, call.func.value)
    if found is None or not found.optimizer:
        return None
    models = [
        arg.value.value
        for arg, roles in rule.context.program.argument_roles(call)
        if "module" in roles and isinstance(arg.value, cst.Name)
    ]
    return models[0] if len(models) == 1 else None


def _parameters_owner(rule: Rule, opt_call: cst.Call, expr: cst.BaseExpression) -> str | None:
    """`model.parameters()` -> "model" (a plain name only); a name bound in the optimizer's
    function to a helper over the model (`groups = get_params_groups(model)`) -> "model"."""
    owner = _parameters_of(expr)
    if owner is not None or not isinstance(expr, cst.Name):
        return owner
    scope = rule.facts.enclosing_scope(opt_call)
    values = [
        value
        for target, value, _ in assignments(scope)
        if target == expr.value and rule.facts.before(value, opt_call)
    ]
    last = values[-1] if values else None
    if isinstance(last, cst.Call) and last.args and not last.args[0].keyword:
        first = last.args[0].value
        return first.value if isinstance(first, cst.Name) else _parameters_of(first)
    return None


def _is_optimizer(qualified: str) -> bool:
    """`torch.optim.AdamW` and the like; not an LR scheduler or SWA helper (they take the
    optimizer, not parameters)."""
    return qualified.startswith("torch.optim.") and not qualified.startswith(
        ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")
    )


def _parameters_of(expr: cst.BaseExpression) -> str | None:
    """`model.parameters()` / `model.named_parameters()` -> "model" (a plain name), and
    `self.G.parameters()` -> "self.G" (a model held by a trainer/solver class)."""
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value in ("parameters", "named_parameters")
    ):
        owner = expr.func.value
        if isinstance(owner, cst.Name):
            return owner.value
        if isinstance(owner, cst.Attribute) and is_name(owner.value, "self"):
            return f"self.{owner.attr.value}"
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
    """`model`, or a name it is an alias of, is compiled anywhere in the file: `m.compile()`,
    `torch.compile(... m ...)` or `m = torch.compile(...)`."""
    module = rule.context.module
    return any(_compiled(rule, module, m) for m in aliases(module, model))


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
