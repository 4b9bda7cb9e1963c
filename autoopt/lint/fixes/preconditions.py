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

from autoopt.lint.calls import arg
from autoopt.lint.nodes import is_name, names_in, nodes_of_type
from autoopt.lint.rule import Rule
from autoopt.lint.torch_api import DATALOADER, torch_name

_AUTOGRAD_GRAD = ("torch.autograd.grad",)
# Wrappers a loop's iterable goes through that yield the loader's own batches.
_PASS_THROUGH = frozenset({"enumerate", "tqdm", "iter", "zip"})
_DEFAULT_COLLATE = (
    "torch.utils.data.default_collate",
    "torch.utils.data.dataloader.default_collate",
    "torch.utils.data._utils.collate.default_collate",
)


def double_backward(rule: Rule) -> str | None:
    """Why the file differentiates through a gradient (None if it does not): `torch.autograd.grad`
    (a gradient penalty) or a `.backward(create_graph=True)`."""
    for call in nodes_of_type(rule.context.module, cst.Call):
        if rule.refers_to(call.func, *_AUTOGRAD_GRAD):
            return "double backward (torch.autograd.grad, e.g. a gradient penalty)"
    for call in rule.facts.backward_calls:
        if any(
            a.keyword is not None
            and a.keyword.value == "create_graph"
            and not m.matches(a.value, m.Name("False"))
            for a in call.args
        ):
            return "double backward (create_graph=True)"
    return None


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
