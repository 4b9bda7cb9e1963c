"""Where a script builds its model and puts it on the device.

- *A move to the device*: `<x>.cuda()` or `<x>.to(<device>)`, the device a "cuda..." string,
  `torch.device(...)` or a name or attribute that is not one of torch's own (`torch.float16` is
  a dtype): `device_move`.
- *The placement of a model* built by `name = Net(...)`: that line when it moves the model itself
  (`Net().to(device)`), else the first later line of the same function that moves `name`
  (`name.to(device)`, `name = name.cuda()`), also inside `if`s however nested (the legacy
  `if cuda: generator.cuda()`) and after the `if`/`else` or `with` block the model is built in;
  for a trainer's `self.model`, the one line of another method of its class that places it:
  `model_placement`.
- *The statements that settle a model*: those that (re)bind it or place it, dtype casts included
  (`model.half()`), where a call on the finished model (`model.compile()`) may go:
  `binds_or_places`.
"""

from __future__ import annotations

from collections.abc import Collection

import libcst as cst

from autoopt.lint.engine.rule import Rule
from autoopt.lint.program.library import MODEL_WRAPPERS
from autoopt.lint.program.project_facts import local_definition
from autoopt.lint.program.trained_models import mentions
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.edits import block_statement
from autoopt.lint.tree.nodes import dotted, method_name, nodes_of_type, string_value

# Calls that build or place the model: a call on the finished model goes after the last of them.
_SETTLING = {"to", "cuda", "half", "float", "bfloat16", "double", "xpu", "to_empty", "type"}
# nn.Module methods that return the module itself (`model = model.train()` keeps the object).
RETURN_THE_MODULE = _SETTLING - {"type"} | {"train", "eval", "cpu", "requires_grad_", "apply"}


def device_move(rule: Rule, expr: cst.BaseExpression) -> cst.Call | None:
    """`expr` itself when it is `<x>.cuda()` or `<x>.to(<device>)` (see the module's docs)."""
    if not isinstance(expr, cst.Call) or not isinstance(expr.func, cst.Attribute):
        return None
    if expr.func.attr.value == "cuda":
        return expr
    if expr.func.attr.value != "to":
        return None
    dest = arg(expr, "device", 0)
    if dest is None:
        return None
    value = dest.value
    text = string_value(value)
    if text is not None:
        return expr if text.startswith("cuda") else None
    if isinstance(value, cst.Call):
        return expr if rule.is_call_to(value, "torch.device") else None
    names = rule.qualified_names(value)
    if any(q.startswith("torch.") for q in names):  # a dtype such as torch.float16
        return None
    return expr if isinstance(value, cst.Name | cst.Attribute) else None


def _holds_on_its_line(stmt: cst.BaseStatement | None, built: cst.Assign) -> bool:
    """`stmt` is an `if` (with its `else`) whose bodies are one-line suites, one of them
    `built`: the model is built and placed by the `if`, whichever branch runs."""
    if not isinstance(stmt, cst.If):
        return False
    suites = [stmt.body]
    if isinstance(stmt.orelse, cst.Else):
        suites.append(stmt.orelse.body)
    return all(isinstance(s, cst.SimpleStatementSuite) for s in suites) and any(
        built in s.body
        for s in suites  # type: ignore[union-attr]
    )


def without_placement(
    expr: cst.BaseExpression, methods: Collection[str] | None = ("to", "cuda")
) -> cst.BaseExpression:
    """`Net()` for `Net().to(device)` / `Net().cuda()`: the receiver under a chain of calls of
    `methods` (None: of any method, `model.to(device).half()` -> `model`)."""
    while (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and (methods is None or expr.func.attr.value in methods)
    ):
        expr = expr.func.value
    return expr


def model_placement(rule: Rule, name: str, built: cst.Assign) -> cst.BaseStatement | None:
    """The line that moves the model `name`, built by `built`, to the device (see the module's
    docs); None when there is none the search reaches (it leaves no loop, function or module)."""
    stmt = block_statement(built, rule.parent)
    moved = _moved_in_chain(rule, built.value)
    if moved and _holds_on_its_line(stmt, built):
        return stmt  # `if duel: self.q_net = DuelNet().to(dvc)` on one line: after that `if`
    if not isinstance(stmt, cst.SimpleStatementLine):
        return None
    if moved:
        return stmt
    current: cst.BaseStatement | None = stmt
    while current is not None:
        body = list(getattr(rule.parent(current), "body", ()))
        for other in body[next(i for i, s in enumerate(body) if s is current) + 1 :]:
            found = _placing_line(rule, other, name)
            if found is not None:
                return found
        current = _enclosing_if(rule, current)
    if _builds_on_a_device(rule, built.value):
        return stmt  # `net_g = define_G(..., gpu_id=device)`: the builder places it (pix2pix)
    if isinstance(built.value, cst.Call) and rule.context.program.returns_placed(built.value):
        return stmt  # `model = net_factory(...)` whose `return` is `net.cuda()`'d (SSL4MIS)
    return _placed_by_another_method(rule, name, built)


def _moved_in_chain(rule: Rule, value: cst.BaseExpression) -> bool:
    """`Net().to(device)`, also under methods that return the module itself
    (`ModelBuilder().cuda().train()`, pysot), not moved back by `.cpu()`, or inside the
    wrapper it is handed to (`DistributedDataParallel(XMem(config).cuda(), ...)`, XMem)."""
    inner = _unwrapped(value)
    if inner is not value:
        return _moved_in_chain(rule, inner)
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if device_move(rule, value) is not None:
            return True
        if value.func.attr.value not in RETURN_THE_MODULE - {"cpu"}:
            return False
        value = value.func.value
    return False


_DEVICE_KEYWORDS = frozenset({"device", "gpu_id", "gpu", "device_id"})


def _builds_on_a_device(rule: Rule, value: cst.BaseExpression) -> bool:
    """`define_G(..., gpu_id=device)`: a builder of the project (this file's or another
    module's, not a library's) handed the device by keyword, a name the script holds a device
    in (`device = torch.device(...)`) or a "cuda..." string."""
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
        return False
    name = value.func.value
    facts = rule.facts
    if name not in facts.defined_names and local_definition(rule, name) is None:
        return False
    for a in value.args:
        if a.keyword is None or a.keyword.value not in _DEVICE_KEYWORDS:
            continue
        text = string_value(a.value)
        if text is not None:
            return text.startswith("cuda")
        if isinstance(a.value, cst.Name | cst.Attribute) and "device" in (dotted(a.value) or ""):
            return True
    return False


def _placed_by_another_method(
    rule: Rule, name: str, built: cst.Assign
) -> cst.SimpleStatementLine | None:
    """`self.D = Discriminator()` in `__init__`, `self.D.cuda(self.cuda_index)` in the class's
    `check_cuda()` (pytorch-wgan): the first line of another method of the class that places
    it (a later `.cuda()` elsewhere keeps the memory format)."""
    if not name.startswith("self."):
        return None
    ancestors = list(rule.facts.ancestors(built))
    method = next((a for a in ancestors if isinstance(a, cst.FunctionDef)), None)
    cls = next((a for a in ancestors if isinstance(a, cst.ClassDef)), None)
    if method is None or cls is None:
        return None
    found = [
        line
        for other in cls.body.body
        if isinstance(other, cst.FunctionDef) and other is not method
        for line in (_placing_line(rule, other.body, name),)
        if line is not None
    ]
    return found[0] if found else None


def _placing_line(rule: Rule, stmt: cst.CSTNode, name: str) -> cst.SimpleStatementLine | None:
    """The first line of `stmt` (a line, or an `if` with its `elif`/`else` branches) that
    places `name` on the device."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return stmt if _places(rule, stmt, name) else None
    if isinstance(stmt, cst.Else):
        return _placing_line(rule, stmt.body, name)
    if isinstance(stmt, cst.IndentedBlock):
        for line in stmt.body:
            found = _placing_line(rule, line, name)
            if found is not None:
                return found
        return None
    if isinstance(stmt, cst.If):
        found = _placing_line(rule, stmt.body, name)
        if found is None and stmt.orelse is not None:
            found = _placing_line(rule, stmt.orelse, name)
        return found
    return None


def _enclosing_if(rule: Rule, stmt: cst.BaseStatement) -> cst.BaseStatement | None:
    """The whole `if` (or `with`) statement whose block holds `stmt` directly (None when
    `stmt` is in a loop, a function body or the module: the search does not leave those)."""
    owner = rule.parent(rule.parent(stmt))  # the block's owner
    if isinstance(owner, cst.Else):
        owner = rule.parent(owner)
    if not isinstance(owner, cst.If | cst.With):
        return None
    return block_statement(owner, rule.parent)


def _places(rule: Rule, line: cst.SimpleStatementLine, name: str) -> bool:
    """`name.to(device)`, `name.cuda()` or `name = name.to(device)`."""
    for small in line.body:
        value = None
        if isinstance(small, cst.Expr) or (
            isinstance(small, cst.Assign)
            and len(small.targets) == 1
            and dotted(small.targets[0].target) == name
        ):
            value = small.value
        call = device_move(rule, value) if value is not None else None
        if (
            call is not None
            and isinstance(call.func, cst.Attribute)
            and dotted(_unwrapped(call.func.value)) == name  # `model`, or `self.model`
        ):
            return True
    return False


def _unwrapped(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`model` for `nn.DataParallel(model)` (`model = DataParallel(model).cuda()` places
    the model it wraps), else `expr`."""
    if (
        isinstance(expr, cst.Call)
        and expr.args
        and not expr.args[0].keyword
        and (dotted(expr.func) or "").rsplit(".", 1)[-1] in MODEL_WRAPPERS
    ):
        return expr.args[0].value
    return expr


def _same_module_rebinds(stmt: cst.BaseStatement, model: str) -> set[int]:
    """The targets of `model = model.train()` (`.eval()`, `.to(...)`, `.cuda()`, ...) in
    `stmt`: nn.Module's methods that return the module itself."""
    kept = set()
    for assign in nodes_of_type(stmt, cst.Assign, into_scopes=False):
        value = without_placement(assign.value, RETURN_THE_MODULE)
        if value is not assign.value and dotted(value) == model:
            kept.update(id(t) for t in assign.targets if dotted(t.target) == model)
    return kept


def _rebound(target: cst.BaseExpression, model: str) -> bool:
    """The assignment target `target` binds `model` itself (also as an element of a tuple)."""
    if isinstance(target, cst.Tuple | cst.List):
        return any(_rebound(e.value, model) for e in target.elements)
    if isinstance(target, cst.StarredElement):
        return _rebound(target.value, model)
    return dotted(target) == model


def binds_or_places(stmt: cst.BaseStatement, model: str, rebinds: bool = False) -> bool:
    """`stmt` (re)binds `model` or places it (`model.to(...)`, `model.cuda()`, `model.half()`,
    ...); with `rebinds`, only a new binding counts."""
    kinds = (cst.AssignTarget, cst.For, cst.AsName, cst.NamedExpr, cst.AnnAssign, cst.AugAssign)
    kept = _same_module_rebinds(stmt, model) if rebinds else set()
    for n in nodes_of_type(stmt, (*kinds, cst.Call), into_scopes=False):
        if id(n) in kept:
            continue  # `model = model.train()`: the same module, not a swap
        if isinstance(n, cst.AssignTarget | cst.For | cst.AsName | cst.NamedExpr):
            target = n.target if not isinstance(n, cst.AsName) else n.name
            # with `rebinds`, `model.ss_prob = p` sets an attribute: the model stays
            if _rebound(target, model) if rebinds else mentions(target, model):
                return True
        if isinstance(n, cst.AnnAssign | cst.AugAssign) and (
            # with `rebinds`, `model.act_shift -= d` (DirectVoxGO) updates an attribute
            _rebound(n.target, model) if rebinds else mentions(n.target, model)
        ):
            return True
        if (
            not rebinds
            and isinstance(n, cst.Call)
            and method_name(n) in _SETTLING
            and isinstance(n.func, cst.Attribute)
            and isinstance(n.func.value, cst.Name | cst.Attribute)
            and dotted(n.func.value) == model
        ):
            return True
    return False
