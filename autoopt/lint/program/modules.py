"""`nn.Module` classes as the lint sees them: the layers `__init__` builds
(`self.conv = nn.Conv2d(...)`) and how `forward` chains them (`self.bn(self.conv(x))`)."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.tree.nodes import assignments, dotted, is_name, walk


def methods(cls: cst.ClassDef) -> dict[str, cst.FunctionDef]:
    """The functions defined directly in the class body, by name."""
    return {s.name.value: s for s in cls.body.body if isinstance(s, cst.FunctionDef)}


def init_layers(cls: cst.ClassDef) -> dict[str, cst.Call]:
    """`self.<attr> = <call>` assignments of `__init__`: attr -> the call."""
    init = methods(cls).get("__init__")
    if init is None:
        return {}
    return {
        target[5:]: value
        for target, value, _ in assignments(init)
        if target.startswith("self.") and isinstance(value, cst.Call)
    }


def self_call(expr: cst.BaseExpression | None) -> str | None:
    """`self.name(...)` -> "name"."""
    if isinstance(expr, cst.Call):
        name = dotted(expr.func)
        if name is not None and name.startswith("self.") and name.count(".") == 1:
            return name[5:]
    return None


def chained_layers(forward: cst.FunctionDef) -> list[tuple[str, str]]:
    """(first, second) layer pairs where `forward` feeds `self.first(...)` straight into
    `self.second(...)` and nowhere else: nested, or `h = self.first(x)` then `h = self.second(h)`."""
    pairs = []
    for node in walk(forward):
        second = self_call(node)
        if second is not None and len(node.args) == 1:
            first = self_call(node.args[0].value)
            if first is not None:
                pairs.append((first, second))
        if isinstance(node, cst.IndentedBlock):
            stmts = node.body
            for stmt, following in zip(stmts, stmts[1:], strict=False):
                pair = _statement_pair(forward, stmt, following)
                if pair is not None:
                    pairs.append(pair)
    return pairs


def _statement_pair(
    forward: cst.FunctionDef, stmt: cst.BaseStatement, following: cst.BaseStatement
) -> tuple[str, str] | None:
    """`h = self.first(x)` followed by `h = self.second(h)` (or `return self.second(h)`, or
    another target when `h` is read nowhere else)."""
    one, two = _single(stmt), _single(following)
    if not isinstance(one, cst.Assign) or len(one.targets) != 1:
        return None
    hidden = one.targets[0].target
    first = self_call(one.value)
    if not isinstance(hidden, cst.Name) or first is None:
        return None
    value = two.value if isinstance(two, cst.Assign | cst.Return) else None
    second = self_call(value)
    if second is None or len(value.args) != 1 or not is_name(value.args[0].value, hidden.value):
        return None
    rebinds = isinstance(two, cst.Assign) and any(
        is_name(t.target, hidden.value) for t in two.targets
    )
    reads = sum(1 for n in walk(forward) if is_name(n, hidden.value))
    if rebinds or isinstance(two, cst.Return) or reads == 2:
        return first, second
    return None


def _single(stmt: cst.BaseStatement) -> cst.BaseSmallStatement | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        return stmt.body[0]
    return None


def attribute_uses(module: cst.Module, attr: str) -> int:
    """How many `<anything>.attr` nodes the file has (writes and reads)."""
    return sum(1 for n in walk(module) if isinstance(n, cst.Attribute) and n.attr.value == attr)
