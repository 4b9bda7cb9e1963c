"""What fixes assume, checked: a fix is applied as safe only where the analysis proves its
assumption, else it is offered as unsafe (or declined) with the reason from here.

- `double_backward`: a `create_graph=True` backward or `torch.autograd.grad` (a gradient
  penalty) runs through the models: torch.compile (AO301) and autocast (AO201) cannot take it.
- `batch_of_tensors`: the loop's batch comes from a torch `DataLoader` of this file with the
  default collate, so what is unpacked from it is a tensor (or a container of them), never the
  project's own batch class, whose `.to()` may not take `non_blocking` (AO103).
- `device_is_cuda` / `runtime_cuda_test`: how the script itself decides CUDA at run time, for
  fixes whose value depends on the device (AO102's `pin_memory`: torch warns on every CPU run
  when a loader pins without an accelerator).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import ImportItem

from autoopt.lint.engine.rule import Rule
from autoopt.lint.program.facts import local_callee
from autoopt.lint.program.torch_api import DATALOADER, torch_name
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.nodes import assignments, dotted, is_name, names_in, nodes_of_type

_AUTOGRAD_GRAD = ("torch.autograd.grad",)
# Second-order meta-learning wrappers: their `adapt()` differentiates through the inner step
# unless `first_order=True` (learn2learn's default is second order).
_META_LEARNERS = (
    "learn2learn.algorithms.MAML",
    "learn2learn.algorithms.MetaSGD",
    "learn2learn.algorithms.maml.MAML",
    "learn2learn.algorithms.meta_sgd.MetaSGD",
)
# Wrappers a loop's iterable goes through that yield the loader's own batches.
_PASS_THROUGH = frozenset({"enumerate", "tqdm", "iter", "zip"})
_DEFAULT_COLLATE = (
    "torch.utils.data.default_collate",
    "torch.utils.data.dataloader.default_collate",
    "torch.utils.data._utils.collate.default_collate",
)


def double_backward(rule: Rule) -> str | None:
    """Why the file differentiates through a gradient (None if it does not): `torch.autograd.grad`
    (a gradient penalty), or any call passing `create_graph=True` (`.backward(...)`, a `grad`
    imported under another name, the repository's own wrapper of it)."""
    sites = double_backward_sites(rule)
    if not sites:
        return None
    if any(rule.refers_to(call.func, *_AUTOGRAD_GRAD) for call in sites):
        return "double backward (torch.autograd.grad, e.g. a gradient penalty)"
    if any(_second_order_learner(rule, call) for call in sites):
        return "double backward (second-order MAML: learn2learn's adapt() without first_order)"
    return "double backward (create_graph=True)"


def double_backward_sites(rule: Rule) -> list[cst.Call]:
    """The calls that differentiate through a gradient: `torch.autograd.grad(...)` and every
    call with `create_graph=True` (or a value that is not the literal False)."""
    return [
        call
        for call in nodes_of_type(rule.context.module, cst.Call)
        if rule.refers_to(call.func, *_AUTOGRAD_GRAD)
        or _creates_graph(call)
        or _second_order_learner(rule, call)
    ]


def double_backward_only_behind_flags(rule: Rule) -> bool:
    """Every double backward of the file is a `create_graph=<flag>` that is not the literal
    True (`create_graph=is_second_order` of timm's loss scalers): it may run, not must."""
    sites = double_backward_sites(rule)
    return bool(sites) and not any(
        rule.refers_to(call.func, *_AUTOGRAD_GRAD)
        or _second_order_learner(rule, call)
        or any(
            a.keyword is not None
            and a.keyword.value == "create_graph"
            and m.matches(a.value, m.Name("True"))
            for a in call.args
        )
        for call in sites
    )


def _second_order_learner(rule: Rule, call: cst.Call) -> bool:
    """`l2l.algorithms.MAML(model, lr=...)` (first_order False by default)."""
    if not rule.refers_to(call.func, *_META_LEARNERS):
        return False
    first_order = arg(call, "first_order", 2)
    return first_order is None or not m.matches(first_order.value, m.Name("True"))


def _creates_graph(call: cst.Call) -> bool:
    return any(
        a.keyword is not None
        and a.keyword.value == "create_graph"
        and not m.matches(a.value, m.Name("False"))
        for a in call.args
    )


def twice_differentiated_models(rule: Rule) -> set[str] | None:
    """The modules a double backward of the file differentiates through (`D` for
    `out = D(x_hat); torch.autograd.grad(out.sum(), x_hat, create_graph=True)`, also when `D`
    is a parameter of the penalty's function and every call of it in the file passes a named
    model), an empty set when the file has no double backward, and None when some double
    backward's modules cannot be traced (its outputs come from the caller, a call of unknown
    origin): then every module may be the one."""
    models: set[str] = set()
    for site in double_backward_sites(rule):
        traced = _models_behind(rule, site)
        if traced is None:
            return None
        models |= traced
    return models


def _models_behind(rule: Rule, site: cst.Call) -> set[str] | None:
    """The callees whose outputs are the differentiated outputs of `site`, traced back through
    the assignments of its function and stopping at the first call of a module (None when they
    cannot all be named). A meta-learning wrapper: the model it wraps and the wrapper."""
    if _second_order_learner(rule, site):
        wrapped = arg(site, "model", 0)
        names = {dotted(wrapped.value)} if wrapped is not None else set()
        parent = rule.parent(site)
        if isinstance(parent, cst.Assign):
            names |= {dotted(t.target) for t in parent.targets}
        return {n for n in names if n is not None} or None
    if isinstance(site.func, cst.Attribute) and site.func.attr.value == "backward":
        outputs: cst.BaseExpression | None = site.func.value
    else:
        given = arg(site, "outputs", 0)
        outputs = given.value if given is not None else None
    if outputs is None:
        return None
    scope = rule.facts.enclosing_scope(site)
    values = {name: value for name, value, _ in assignments(scope)}
    params = _params(scope)
    callees: set[str] = set()
    seen: set[str] = set()
    pending = [outputs]
    while pending:
        expr = pending.pop()
        called = _module_calls(rule, expr)
        if called:
            callees |= called  # `D(x_hat)`, `D(x_hat).mean()`: the module is found, stop here
            continue
        for name in _data_names(expr) - seen:
            seen.add(name)
            if name in params:
                return None  # the outputs come from the caller: their module is not in sight
            if name in values:
                pending.append(values[name])
    if not callees:
        return None
    models: set[str] = set()
    for callee in callees:
        if callee in params:  # `def penalty(D, real, fake)`: the models its callers pass
            passed = _passed_for(rule, scope, callee)
            if passed is None:
                return None
            models |= passed
        else:
            models.add(callee)
    return models


def _module_calls(rule: Rule, expr: cst.BaseExpression) -> set[str]:
    """Callees in `expr` that may be modules: `D(...)`, `self.D(...)`; not a method of a value
    (`out.sum()`, `D(x).mean()`) nor a torch function (`softplus(...)` imported from torch)."""
    found = set()
    for call in nodes_of_type(expr, cst.Call):
        func = call.func
        if isinstance(func, cst.Name):
            name = func.value
        elif isinstance(func, cst.Attribute) and is_name(func.value, "self"):
            name = f"self.{func.attr.value}"
        else:
            continue  # `torch.sigmoid(...)`, `F.relu(...)`, `out.sum()`: not a module of the file
        if not any(q.startswith("torch.") for q in rule.qualified_names(func)):
            found.add(name)
    return found


def _data_names(expr: cst.BaseExpression) -> set[str]:
    """The plain names `expr` reads as values (not attribute or keyword names)."""
    skip = {id(n.attr) for n in nodes_of_type(expr, cst.Attribute)}
    skip |= {id(a.keyword) for a in nodes_of_type(expr, cst.Arg) if a.keyword is not None}
    return {n.value for n in nodes_of_type(expr, cst.Name) if id(n) not in skip}


def _params(scope: cst.CSTNode) -> list[str]:
    if not isinstance(scope, cst.FunctionDef):
        return []
    return [p.name.value for p in (*scope.params.posonly_params, *scope.params.params)]


def _passed_for(rule: Rule, func: cst.CSTNode, param: str) -> set[str] | None:
    """What the file's calls of `func` pass for its parameter `param` (None when a call does
    not pass a plain name, or there is no call in sight)."""
    assert isinstance(func, cst.FunctionDef)
    params = _params(func)
    index = params.index(param) - (1 if params[:1] in (["self"], ["cls"]) else 0)
    passed: set[str] = set()
    for call in nodes_of_type(rule.context.module, cst.Call):
        if local_callee(call) != func.name.value:
            continue
        given = arg(call, param, index)
        name = dotted(given.value) if given is not None else None
        if name is None:
            return None
        passed.add(name)
    return passed or None


def trains_twice(rule: Rule, model: str) -> bool:
    """`model` may be differentiated twice: a double backward runs through it, or through a
    module that cannot be traced (then any model may be the one)."""
    models = twice_differentiated_models(rule)
    if models is None:
        return True
    leaf = model.rsplit(".", 1)[-1]
    return any(m == model or m.rsplit(".", 1)[-1] == leaf for m in models)


def batch_of_tensors(rule: Rule, loop: cst.For | cst.While) -> bool:
    """The loop iterates a torch `DataLoader` built in this file with the default collate (no
    `collate_fn`, or torch's own): its batches hold tensors."""
    if not isinstance(loop, cst.For):
        return False
    source = _iterated_name(loop.iter)
    if source is None:
        return False
    built = _loader_calls(rule).get(source)
    return bool(built) and all(_default_collate(rule, call) for call in built)


def _iterated_name(expr: cst.BaseExpression) -> str | None:
    """`loader` for `loader`, `enumerate(loader)`, `tqdm(loader, ...)`, `iter(loader)`."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name | cst.Attribute):
        func = expr.func.value if isinstance(expr.func, cst.Name) else expr.func.attr.value
        if func not in _PASS_THROUGH or not expr.args:
            return None
        expr = expr.args[0].value
    return expr.value if isinstance(expr, cst.Name) else None


def _loader_calls(rule: Rule) -> dict[str, list[cst.Call]]:
    """name -> the `DataLoader(...)` calls bound to it; a name bound to anything else too is
    not a known loader (empty list)."""
    found: dict[str, list[cst.Call]] = {}
    other: set[str] = set()
    for node in nodes_of_type(rule.context.module, cst.Assign):
        for target in node.targets:
            for name in names_in(target.target):
                if isinstance(target.target, cst.Name) and rule.is_call_to(node.value, *DATALOADER):
                    assert isinstance(node.value, cst.Call)
                    found.setdefault(name, []).append(node.value)
                else:
                    other.add(name)
    return {name: calls for name, calls in found.items() if name not in other}


def _default_collate(rule: Rule, call: cst.Call) -> bool:
    if any(a.star for a in call.args):
        return False  # `**kwargs` may hold a collate_fn
    given = arg(call, "collate_fn", 6)
    return (
        given is None
        or is_name(given.value, "None")
        or rule.refers_to(given.value, *_DEFAULT_COLLATE)
    )


def device_is_cuda(rule: Rule, at: cst.CSTNode) -> tuple[str, tuple[ImportItem, ...]] | None:
    """The script's own test of "this run is on CUDA", usable at `at`: `device.type == "cuda"`
    where a `device` is bound before `at` in its function or at module level, else
    `runtime_cuda_test`; None when the script always uses CUDA."""
    test = runtime_cuda_test(rule)
    if test is None or "accelerator" in test[0]:
        return test  # torch.accelerator scripts: the device may be mps/xpu, not only cuda
    facts = rule.facts
    scope = facts.enclosing_scope(at)
    for node in nodes_of_type(rule.context.module, cst.Assign):
        if facts.enclosing_scope(node) not in (scope, facts.module) or not facts.before(node, at):
            continue
        if any(is_name(t.target, "device") for t in node.targets):
            if isinstance(node.value, cst.Call) and rule.refers_to(node.value.func, "torch.device"):
                return 'device.type == "cuda"', ()
            torch, imports = torch_name(rule)
            return f'{torch}.device(device).type == "cuda"', imports
    return test


def runtime_cuda_test(rule: Rule) -> tuple[str, tuple[ImportItem, ...]] | None:
    """The expression that says at run time whether this script trains on CUDA, when the script
    decides that at run time (`torch.cuda.is_available()` or a device flag anywhere in it), with
    the imports it needs; None when the script always uses CUDA where it moves batches (no
    availability test, no CPU branch)."""
    source = rule.facts.source
    runtime_choice = (
        "is_available(" in source
        or '"cpu"' in source
        or "'cpu'" in source
        or not rule.facts.uses_cuda  # a device flag, parameter or torch.accelerator decides
    )
    if not runtime_choice:
        return None
    torch, imports = torch_name(rule)
    if "torch.accelerator" in source:
        return f"{torch}.accelerator.is_available()", imports
    return f"{torch}.cuda.is_available()", imports
