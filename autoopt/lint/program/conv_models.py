"""Which calls of a file build convolutions, which models it builds from 2-D convolutions, and
which of those flatten with `.view()`.

A call *builds a convolution* (cuDNN's work, of any dimension) when it is a torch convolution
layer or function, a convolutional model of a zoo, or a convolutional class or function of
another module of the project: `builds_convolution`.

A *conv model* is a name bound to a call that builds one (`model = Net(...)`, also with
`.to(device)`/`.cuda()` on it):

- a class of the file made of `Conv2d` layers (directly, through other such classes, or around
  a torchvision/timm CNN built inside it: a backbone), see `torch_api.conv_classes`;
- a class or function of another module of the project (`from models import Net`), read without
  importing it (`project_facts.local_definition`);
- a convolutional model of a zoo (`torchvision.models.resnet50()`, `timm.create_model(...)`) or
  an `nn.Sequential` holding a `Conv2d`;
- a model built around one of those passed in (`DDPM(eps_model=UNet())`, or a name bound to one
  above).

A model *flattens* when a part of it merges dimensions with `.view(...)` (`x.view(n, -1)`):
NHWC (channels_last) activations are not contiguous in NCHW order, so such a view raises.
"""

from __future__ import annotations

from typing import NamedTuple

import libcst as cst

from autoopt.lint.engine.rule import Rule
from autoopt.lint.program.placement import RETURN_THE_MODULE, without_placement
from autoopt.lint.program.project_facts import (
    LocalDefinition,
    any_of,
    definition_at,
    evaluated_path_definition,
    local_definition,
    module_argument_definition,
    module_table_definition,
    registered_models_definition,
)
from autoopt.lint.program.torch_api import (
    CONV2D,
    TIMM_CREATE_MODEL,
    conv_classes,
    is_conv_call,
    is_conv_zoo_model,
)
from autoopt.lint.tree.nodes import (
    assignments,
    bound_once_at_top,
    calls_in,
    dotted,
    method_name,
    nodes_of_type,
    string_value,
)

_SEQUENTIAL = ("torch.nn.Sequential", "torch.nn.modules.container.Sequential")


class ConvModel(NamedTuple):
    """A conv model bound to `name` by `built`; `flattens`: it flattens with `.view()`;
    `inner`: the conv model named above that it is built around (`trainer = Trainer(model)`)."""

    name: str
    built: cst.Assign
    flattens: bool
    inner: str | None = None


def builds_convolution(rule: Rule, call: cst.Call) -> bool:
    """`nn.Conv1d/2d/3d(...)` (transposed too), `F.conv2d(...)`, `torchvision.models.resnet50()`,
    or a convolutional model of the project (`Net()` after `from models import Net`)."""
    return (
        is_conv_call(rule, call)
        or is_conv_zoo_model(rule, call)
        or _project_conv(rule, call)
        or _project_table_conv(rule, call)
    )


def _project_table_conv(rule: Rule, call: cst.Call) -> bool:
    """`getattr(models, opt.model)()` / `models.__dict__[arch]()` over a module of the
    project whose definitions are convolutional networks, or `MODELS[arch]()` over a table
    of such networks imported from the project."""
    func = call.func
    if not isinstance(func, cst.Call | cst.Subscript):
        return False
    table = _table_definition(rule, func)
    return table is not None and table.conv


def _table_definition(rule: Rule, func: cst.Call | cst.Subscript) -> LocalDefinition | None:
    """What a table of the project's definitions builds: `resnet.__dict__[arch]` of a project
    module, `MODELS[args.model]` of `from models import MODELS` (the dict's entries weighed
    together), or a dict of the linted file itself whose entries are the project's
    (pytorch-gan-collections' `net_G_models = {'cnn32': models.Generator32}`)."""
    table = module_table_definition(rule, func)
    if table is None and isinstance(func, cst.Subscript) and isinstance(func.value, cst.Name):
        table = local_definition(rule, func.value.value) or _file_table(
            rule, func.value.value, func
        )
    return table


def _file_table(rule: Rule, name: str, at: cst.CSTNode) -> LocalDefinition | None:
    """The entries of `name = {...}`, bound once at the linted file's top level or in the
    function that reads it (CurricularFace's `BACKBONE_DICT = {'IR_101': IR_101, ...}` in
    `main_worker`), when every entry is a definition of the project: convolutional when all
    are."""
    table = bound_once_at_top(rule.context.module, name)
    scope = rule.facts.enclosing_scope(at)
    if table is None and isinstance(scope, cst.FunctionDef):
        values = [value for bound, value, _ in assignments(scope) if bound == name]
        table = values[0] if len(values) == 1 else None
    if not isinstance(table, cst.Dict) or not table.elements:
        return None
    entries = []
    for element in table.elements:
        value = element.value if isinstance(element, cst.DictElement) else None
        if not isinstance(value, cst.Name | cst.Attribute):
            return None
        found = picked_definition(rule, cst.Call(func=value))
        if found is None:
            return None
        entries.append(found)
    return any_of(name, entries)


def _project_conv(rule: Rule, call: cst.Call) -> bool:
    """A convolutional model imported from the user's project (`from models import Net`,
    `model.resnet50(...)` of `from retinanet import model`), also picked by name from a
    module or package of the project (`eval("models." + name + ".get_net")(cfg)`,
    `config.init_obj("arch", module_arch)`)."""
    found = picked_definition(rule, call)
    return found is not None and found.conv


def picked_definition(rule: Rule, call: cst.Call) -> LocalDefinition | None:
    """What `call` builds when it is a definition of the project, or one picked by name from
    a module, a package or timm's registry of the project (`eval("models." + name +
    ".get_net")(cfg)`, `config.init_obj("arch", module_arch)`, `timm.create_model(args.model)`
    beside `import models.convnext`)."""
    found = (
        project_definition(rule, call)
        or evaluated_path_definition(rule, call)
        or module_argument_definition(rule, call)
    )
    if found is None and _creates_by_name(rule, call):
        found = registered_models_definition(rule)
    if found is None:
        found = _handed_class(rule, call)
    return found


def _handed_class(rule: Rule, call: cst.Call) -> LocalDefinition | None:
    """`Network(cfg)` where `Network` is a parameter of the enclosing function and every call
    of that function in this file hands it the same class of the project (F3Net's `train(dataset,
    F3Net)` under `if __name__ == "__main__":`)."""
    if not isinstance(call.func, cst.Name):
        return None
    name = call.func.value
    scope = rule.facts.enclosing_scope(call)
    if not isinstance(scope, cst.FunctionDef) or name not in {
        p.name.value for p in (*scope.params.params, *scope.params.kwonly_params)
    }:
        return None
    if rule.facts.enclosing_scope(scope) is not rule.context.module:
        return None  # a module-level function, called by its name
    positional = [p.name.value for p in scope.params.params]
    position = positional.index(name) if name in positional else None
    index = rule.context.program.index
    names: set[str] = set()
    for func in index.functions.values():
        for site in func.calls:
            if site.callee != (scope.name.value,):
                continue
            passed = dict(site.keywords).get(name)
            if passed is None and position is not None and position < len(site.args):
                passed = site.args[position]
            if passed is None or len(passed) != 1:
                return None
            names.add(passed[0])
    return local_definition(rule, names.pop()) if len(names) == 1 else None


def _creates_by_name(rule: Rule, call: cst.Call) -> bool:
    """`timm.create_model(name)` with a name that is not written out."""
    if not call.args or call.args[0].keyword is not None or string_value(call.args[0].value):
        return False
    return any(q in TIMM_CREATE_MODEL for q in rule.qualified_names(call.func))


def project_definition(rule: Rule, call: cst.Call) -> LocalDefinition | None:
    """What the project's class or function `call` runs is: through the linted file's imports
    (`from models import Net`), else as the program model resolves the call (a module's
    attribute, an import found on the project's own PYTHONPATH). Only calls of a name the
    file imports get that far (`x.view(...)`, `len(...)` never reach the program model)."""
    if isinstance(call.func, cst.Name):
        found = local_definition(rule, call.func.value)  # star imports included
        if found is not None:
            return found
    name = dotted(call.func)
    head = name.split(".")[0] if name is not None else None
    facts = rule.facts
    if head is None or (head not in facts.imported_names and head not in facts.defined_names):
        return None
    program = rule.context.program
    for target in program.program.resolve(
        program.index, program.function_of(call), tuple(name.split("."))
    ):
        # a method (`ModelBuilder.build_encoder(...)`): its class's definitions weighed together
        found = definition_at(target.path, target.qualname.split(".")[0])
        if found is not None:
            return found
    return None


def conv2d_models(rule: Rule) -> list[ConvModel]:
    """Every `name = <conv model>(...)[.to(...)|.cuda()]` of the file, in source order."""
    module = rule.context.module
    fit, flattening = _conv2d_classes(rule, module)
    found: list[ConvModel] = []
    for n in nodes_of_type(module, cst.Assign):
        if len(n.targets) != 1:
            continue
        target = dotted(n.targets[0].target) or _model_in_tuple(n.targets[0].target)
        # `model = Net()`, or an attribute of the trainer object (`self.model = gwnet(...)`)
        if target is None or (target.count(".") and not target.startswith("self.")):
            continue
        if target.count(".") > 1:
            continue
        base = without_placement(n.value, RETURN_THE_MODULE)  # `Net().cuda().train()` too
        if isinstance(base, cst.IfExp):
            found += _either_conv_model(rule, n, target, base, fit, flattening)
            continue
        kind = _conv_model(rule, base, fit, flattening) if isinstance(base, cst.Call) else None
        inner = None
        if kind is None and isinstance(base, cst.Call):
            others = [f for f in found if f.name != target]  # not `model = DDP(model)`
            kind = _wrapped_conv_model(rule, base, fit, flattening, others)
            names = {f.name for f in others}
            inner = next((a for a in names_in_args(base) if a in names), None)
        if kind is not None:
            found.append(ConvModel(target, n, kind == "flattens", inner))
    return found


def _either_conv_model(
    rule: Rule,
    built: cst.Assign,
    target: str,
    choice: cst.IfExp,
    fit: set[str],
    flattening: set[str],
) -> list[ConvModel]:
    """`model = resnet18(...) if resize else ResNet18(...)` (MedMNIST): a Conv2d model when
    every branch builds one; it flattens when one of them does."""
    branches: list[cst.BaseExpression] = []
    todo: list[cst.BaseExpression] = [choice]
    while todo:
        value = without_placement(todo.pop(), RETURN_THE_MODULE)
        if isinstance(value, cst.IfExp):
            todo += [value.body, value.orelse]
        else:
            branches.append(value)
    kinds = [
        _conv_model(rule, b, fit, flattening) if isinstance(b, cst.Call) else None for b in branches
    ]
    if None in kinds:
        return []
    return [ConvModel(target, built, "flattens" in kinds, None)]


def names_in_args(call: cst.Call) -> list[str]:
    """The plain names handed to `call` (placed or not: `Trainer(model.cuda())`)."""
    found = []
    for a in call.args:
        value = without_placement(a.value)
        if isinstance(value, cst.Name):
            found.append(value.value)
    return found


def _model_in_tuple(target: cst.BaseAssignTargetExpression) -> str | None:
    """`model, diffusion = create_model_and_diffusion(...)`, `model, criterion, post =
    build_model(args)`: the element a factory's tuple names as the model (the factory is
    weighed as a whole, as for `model = build(...)`)."""
    if not isinstance(target, cst.Tuple):
        return None
    names = [e.value.value for e in target.elements if isinstance(e.value, cst.Name)]
    models = [n for n in names if n in ("model", "net", "network") or n.endswith("_model")]
    return models[0] if len(models) == 1 else None


def _conv2d_classes(rule: Rule, module: cst.Module) -> tuple[set[str], set[str]]:
    """Conv2d classes of the file none of whose parts flattens with `.view()`, and those that
    do (a class made of a flattening class flattens)."""
    convs = conv_classes(rule, module, CONV2D)
    classes = {s.name.value: s for s in module.body if isinstance(s, cst.ClassDef)}
    unfit = {
        name for name, cls in classes.items() if any(_flattening_view(c) for c in calls_in(cls))
    }
    changed = True
    while changed:  # a class made of an unfit class is unfit
        changed = False
        for name, cls in classes.items():
            if name not in unfit and any(
                isinstance(c.func, cst.Name) and c.func.value in unfit for c in calls_in(cls)
            ):
                unfit.add(name)
                changed = True
    # an alias (`Net = AtariNet`) is unfit where its class is
    unfit |= {name for name, cls in convs.items() if cls.name.value in unfit}
    return set(convs) - unfit, set(convs) & unfit


def _wrapped_conv_model(
    rule: Rule,
    call: cst.Call,
    fit: set[str],
    flattening: set[str],
    found: list[ConvModel],
) -> str | None:
    """A model built around a conv model passed in (`DDPM(eps_model=UNet(...))`, a name bound
    to one above, or a zoo's builder: `MoCo(models.__dict__[arch], ...)`): what the inner
    model is."""
    named = {m.name: "flattens" if m.flattens else "fit" for m in found}
    for a in call.args:
        value = without_placement(a.value)
        if isinstance(value, cst.Name) and value.value in named:
            return named[value.value]
        if isinstance(value, cst.Call) and rule.is_call_to(value, "functools.partial"):
            # the builder handed in (`MoCo_ResNet(partial(models.__dict__[arch], ...))`)
            kind = _conv_table(rule, value.args[0].value) if value.args else None
            if kind is not None:
                return kind
        elif isinstance(value, cst.Call):
            kind = _conv_model(rule, value, fit, flattening)
            if kind is not None:
                return kind
        elif isinstance(value, cst.Subscript):
            # the builder itself handed in (`MoCo(models.__dict__[args.arch], ...)`, moco)
            kind = _conv_table(rule, value)
            if kind is not None:
                return kind
    return None


def _conv_table(rule: Rule, func: cst.BaseExpression) -> str | None:
    """`models.__dict__[arch]` of torchvision ("fit"), or of (or `getattr(models, arch)` over) a
    module of the project whose
    definitions are 2-D convolutional networks by weight ("fit", or "flattens")."""
    if not isinstance(func, cst.Subscript | cst.Call):
        return None
    if isinstance(func, cst.Subscript) and is_conv_zoo_model(rule, cst.Call(func=func)):
        return "fit"  # torchvision's table: no metadata needed
    table = _table_definition(rule, func)
    if table is None or not table.conv2d:
        return None
    return "flattens" if table.views else "fit"


def _conv_model(rule: Rule, call: cst.Call, fit: set[str], flattening: set[str]) -> str | None:
    """ "fit" for a Conv2d model, "flattens" for one that flattens with `.view()`."""
    if isinstance(call.func, cst.Name):
        if call.func.value in fit:
            return "fit"
        if call.func.value in flattening:
            return "flattens"
        if (classes := _class_chosen(rule, call.func)) is not None:
            # `model_cls = F if args.uncond else CCF; f = model_cls(...)` (JEM): a Conv2d
            # model when every class it may be builds one; it flattens when one does
            kinds = [_conv_model(rule, call.with_changes(func=c), fit, flattening) for c in classes]
            return None if None in kinds else "flattens" if "flattens" in kinds else "fit"
    table = _conv_table(rule, call.func)  # `resnet.__dict__[args.arch](...)`
    if table is not None:
        return table
    local = picked_definition(rule, call)  # `from models import Net`, `model.resnet50()`
    if local is not None:
        if not local.conv2d:
            return None
        return "flattens" if local.views else "fit"
    if is_conv_zoo_model(rule, call):
        return "fit"
    if rule.is_call_to(call, *_SEQUENTIAL) and any(
        is_conv_call(rule, c, CONV2D) for c in calls_in(call)
    ):
        return "fit"
    return None


def _class_chosen(rule: Rule, name: cst.Name) -> list[cst.BaseExpression] | None:
    """The classes a name bound once in its scope to a choice of them names (`model_cls = F
    if args.uncond else CCF` -> [F, CCF]); None for anything else."""
    facts = rule.facts
    binds = facts.assigned_in(facts.enclosing_scope(name)).get(name.value, [])
    if len(binds) != 1 or not isinstance(binds[0][0], cst.IfExp):
        return None
    options: list[cst.BaseExpression] = []
    todo: list[cst.BaseExpression] = [binds[0][0]]
    while todo:
        value = todo.pop()
        if isinstance(value, cst.IfExp):
            todo += [value.body, value.orelse]
        elif isinstance(value, cst.Attribute) or (
            isinstance(value, cst.Name) and value.value != name.value
        ):
            options.append(value)
        else:
            return None
    return options


def _flattening_view(call: cst.Call) -> bool:
    """`x.view(n, -1)`, `x.view(b, c, h * w)`: a view that merges dimensions, which fails on
    NHWC activations. `out.view(n, 128, s, s)` (a linear layer's output made 4-D for the
    convolutions after it) merges nothing. (`project_facts` applies the same test to the
    `ast` of the project's other modules.)"""
    if method_name(call) != "view":
        return False
    values = [a.value for a in call.args]
    minus_one = any(
        isinstance(v, cst.UnaryOperation) and isinstance(v.operator, cst.Minus) for v in values
    )
    return minus_one or len(values) < 4 or any(a.star for a in call.args)
