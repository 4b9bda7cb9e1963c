"""Helpers shared by the distributed, device/backend, loop-hygiene, reproducibility and
deprecation rules (AO5xx-AO9xx).

Everything here is pure tree inspection on the module a rule is visiting: no rule state, no
imports of the code being read."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst
from libcst.codemod.visitors import ImportItem
from libcst.metadata import PositionProvider

from autoopt.static.facts import calls_in, walk
from autoopt.static.rule import Rule

# Layers whose presence makes a model "convolutional" (cuDNN kernels; NHWC-friendly).
CONV_LAYERS = frozenset(
    f"torch.nn.{kind}{dim}d{suffix}"
    for kind in ("Conv", "ConvTranspose", "LazyConv", "LazyConvTranspose")
    for dim in (1, 2, 3)
    for suffix in ("",)
) | frozenset(
    f"torch.nn.modules.conv.{kind}{dim}d" for kind in ("Conv", "ConvTranspose") for dim in (1, 2, 3)
)
CONV_FUNCTIONS = frozenset(
    f"torch.nn.functional.conv{name}"
    for name in ("1d", "2d", "3d", "_transpose1d", "_transpose2d", "_transpose3d")
)
# torchvision model builders that are convolutional networks (their forwards use flatten).
_CONV_ZOO = (
    "resnet",
    "resnext",
    "wide_resnet",
    "vgg",
    "densenet",
    "mobilenet",
    "efficientnet",
    "regnet",
    "convnext",
    "shufflenet",
    "squeezenet",
    "mnasnet",
    "googlenet",
    "inception",
    "alexnet",
)


def code_of(node: cst.CSTNode) -> str:
    """The source text of `node` (without its surrounding whitespace)."""
    return cst.Module(body=[]).code_for_node(node).strip()


def dotted(expr: cst.CSTNode | None) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        base = dotted(expr.value)
        return None if base is None else f"{base}.{expr.attr.value}"
    return None


def method_name(call: cst.Call) -> str | None:
    """`step` for `x.step(...)`."""
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else None


def is_true(expr: cst.BaseExpression | None) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "True"


def string_value(expr: cst.BaseExpression | None) -> str | None:
    """The value of a plain string literal."""
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None


def position(rule: Rule, node: cst.CSTNode) -> tuple[int, int]:
    pos = rule.get_metadata(PositionProvider, node)
    return pos.start.line, pos.start.column


def before(rule: Rule, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """`a` starts before `b` in the file."""
    return position(rule, a) < position(rule, b)


def statement_of(rule: Rule, node: cst.CSTNode) -> cst.BaseStatement | None:
    """The statement (simple line or compound) that holds `node` directly in a block."""
    cur: cst.CSTNode | None = node
    while cur is not None:
        parent = rule.parent(cur)
        if isinstance(cur, cst.BaseStatement) and isinstance(
            parent, cst.Module | cst.IndentedBlock
        ):
            return cur
        cur = parent
    return None


def line(code: str) -> cst.SimpleStatementLine:
    """One simple statement line parsed from `code`."""
    stmt = cst.parse_statement(code)
    assert isinstance(stmt, cst.SimpleStatementLine)
    return stmt


def _is_import_line(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, cst.Import | cst.ImportFrom) for s in stmt.body
    )


def _is_docstring_or_future(stmt: cst.CSTNode) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    if isinstance(small, cst.Expr) and isinstance(
        small.value, cst.SimpleString | cst.ConcatenatedString
    ):
        return True
    return isinstance(small, cst.ImportFrom) and dotted(small.module) == "__future__"


def import_anchor(module: cst.Module) -> cst.SimpleStatementLine | None:
    """The last top-level import of the file's header: imports before the first definition or
    block statement (a later `import` inside the script body does not move the header)."""
    anchor: cst.SimpleStatementLine | None = None
    for stmt in module.body:
        if isinstance(stmt, cst.BaseCompoundStatement) and not isinstance(stmt, cst.Try):
            break
        if _is_import_line(stmt):
            assert isinstance(stmt, cst.SimpleStatementLine)
            anchor = stmt
    return anchor


def insert_after_imports(
    module: cst.Module, new: cst.SimpleStatementLine
) -> dict[cst.CSTNode, cst.FlattenSentinel[cst.BaseStatement]]:
    """A replacement that puts `new` right after the import header (or, with no imports, after
    the docstring and `__future__` imports)."""
    anchor = import_anchor(module)
    if anchor is not None:
        return {anchor: cst.FlattenSentinel([anchor, new])}
    for stmt in module.body:
        if not _is_docstring_or_future(stmt):
            return {
                stmt: cst.FlattenSentinel(
                    [
                        new.with_changes(leading_lines=stmt.leading_lines),
                        stmt.with_changes(leading_lines=[]),
                    ]
                )
            }
    last = module.body[-1]
    return {last: cst.FlattenSentinel([last, new])}


CONV2D = frozenset(
    {
        "torch.nn.Conv2d",
        "torch.nn.ConvTranspose2d",
        "torch.nn.LazyConv2d",
        "torch.nn.LazyConvTranspose2d",
        "torch.nn.modules.conv.Conv2d",
        "torch.nn.modules.conv.ConvTranspose2d",
        "torch.nn.functional.conv2d",
        "torch.nn.functional.conv_transpose2d",
    }
)


def is_conv_call(
    rule: Rule, call: cst.Call, kinds: frozenset[str] = CONV_LAYERS | CONV_FUNCTIONS
) -> bool:
    """A torch convolution layer or functional convolution (of `kinds`)."""
    return bool(rule.qualified_names(call.func) & kinds)


def is_conv_zoo_model(rule: Rule, call: cst.Call) -> bool:
    """A torchvision convolutional model builder (`torchvision.models.resnet50(...)`)."""
    for name in rule.qualified_names(call.func):
        if name.startswith("torchvision.models."):
            leaf = name.rsplit(".", 1)[-1].lower()
            if leaf.startswith(_CONV_ZOO):
                return True
    return False


def conv_classes(
    rule: Rule, module: cst.Module, kinds: frozenset[str] = CONV_LAYERS | CONV_FUNCTIONS
) -> dict[str, cst.ClassDef]:
    """Top-level classes of the file built from convolution layers (of `kinds`), directly or
    through other such classes of the file (a `ResNet` made of `Block`s)."""
    classes = {s.name.value: s for s in module.body if isinstance(s, cst.ClassDef)}
    found: dict[str, cst.ClassDef] = {}
    for name, cls in classes.items():
        if any(is_conv_call(rule, c, kinds) for c in calls_in(cls)):
            found[name] = cls
    changed = True
    while changed:  # close over "uses a conv class"
        changed = False
        for name, cls in classes.items():
            if name in found:
                continue
            if any(isinstance(c.func, cst.Name) and c.func.value in found for c in calls_in(cls)):
                found[name] = cls
                changed = True
    return found


def assignments(node: cst.CSTNode) -> Iterator[tuple[str, cst.BaseExpression, cst.Assign]]:
    """`(target text, value, assign)` for every single-target-per-`=` assignment under `node`
    (not descending into nested functions/classes)."""
    for n in walk(node, into_scopes=False):
        if isinstance(n, cst.Assign):
            for target in n.targets:
                name = dotted(target.target)
                if name is not None:
                    yield name, n.value, n


def torch_imports(module: cst.Module) -> tuple[ImportItem, ...]:
    """What a fix that writes `torch.x` must import: nothing when the module already has a
    top-level `import torch`, else `import torch` (never emit `torch.` unbound)."""
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import) and any(
                dotted(a.name) == "torch" and a.asname is None for a in small.names
            ):
                return ()
    return (ImportItem("torch"),)
