"""Reading libcst nodes: walking a tree, the text of a node, names, literals and source order.

Pure functions of the nodes they are given (position/before read the rule's position metadata);
rules, facts and fixes all share these instead of keeping their own copies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import PositionProvider

if TYPE_CHECKING:
    from autoopt.lint.rule import Rule

# Nodes whose bodies run at another time than the code around them.
SCOPE_NODES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


# ----- walking --------------------------------------------------------------------------------
def walk(node: cst.CSTNode, *, into_scopes: bool = True) -> Iterator[cst.CSTNode]:
    """`node` and its descendants, in source order. `into_scopes=False` does not enter nested
    functions, classes or lambdas (their bodies run at another time)."""
    stack = [node]
    while stack:
        cur = stack.pop()
        yield cur
        if not into_scopes and cur is not node and isinstance(cur, SCOPE_NODES):
            continue
        stack.extend(reversed(cur.children))


def calls_in(node: cst.CSTNode, *, into_scopes: bool = True) -> Iterator[cst.Call]:
    """Every call under `node` (see `walk`)."""
    return (n for n in walk(node, into_scopes=into_scopes) if isinstance(n, cst.Call))


def contains(outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
    """`inner` is `outer` or one of its descendants (by identity)."""
    return any(n is inner for n in walk(outer))


def position(rule: Rule, node: cst.CSTNode) -> tuple[int, int]:
    """(line, column) where `node` starts, for ordering nodes in source order."""
    pos = rule.get_metadata(PositionProvider, node)
    return pos.start.line, pos.start.column


def before(rule: Rule, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """`a` starts before `b` in the file."""
    return position(rule, a) < position(rule, b)


# ----- text and names -------------------------------------------------------------------------
def code_of(node: cst.CSTNode) -> str:
    """The source text of `node`."""
    return cst.Module(body=[]).code_for_node(node)


def dotted(expr: cst.CSTNode | None) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        base = dotted(expr.value)
        return None if base is None else f"{base}.{expr.attr.value}"
    return None


def names_in(node: cst.CSTNode) -> set[str]:
    """Every plain name read or written in `node`."""
    return {n.value for n in walk(node) if isinstance(n, cst.Name)}


def root_name(expr: cst.BaseExpression) -> str | None:
    """`batch["x"][0].foo` -> "batch"."""
    while isinstance(expr, cst.Subscript | cst.Attribute):
        expr = expr.value
    return expr.value if isinstance(expr, cst.Name) else None


def method_name(call: cst.Call) -> str | None:
    """`x.foo(...)` -> "foo"."""
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else None


def is_name(expr: cst.CSTNode | None, value: str) -> bool:
    """`expr` is the plain name `value`."""
    return isinstance(expr, cst.Name) and expr.value == value


def assignments(node: cst.CSTNode) -> Iterator[tuple[str, cst.BaseExpression, cst.Assign]]:
    """`(target text, value, assign)` for every single-target-per-`=` assignment under `node`
    (not descending into nested functions/classes)."""
    for n in walk(node, into_scopes=False):
        if isinstance(n, cst.Assign):
            for target in n.targets:
                name = dotted(target.target)
                if name is not None:
                    yield name, n.value, n


# ----- literals -------------------------------------------------------------------------------
def is_true(expr: cst.BaseExpression | None) -> bool:
    """`expr` is the literal `True`."""
    return is_name(expr, "True")


def int_literal(expr: cst.BaseExpression | None) -> int | None:
    """The value of an integer literal."""
    if isinstance(expr, cst.Integer):
        return int(expr.value, 0)
    return None


def string_value(expr: cst.BaseExpression | None) -> str | None:
    """The value of a plain string literal."""
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None


def int_constants(module: cst.Module) -> dict[str, tuple[int, cst.BaseExpression]]:
    """Names bound once, at module or class level, to an integer literal (`VOCAB = 50257`,
    `vocab_size: int = 50257`): name -> (value, the literal node)."""
    found: dict[str, list[cst.BaseExpression]] = {}
    for stmt in walk(module, into_scopes=False):
        if isinstance(stmt, cst.ClassDef):
            for inner in walk(stmt.body, into_scopes=False):
                _collect_binding(inner, found)
        else:
            _collect_binding(stmt, found)
    out: dict[str, tuple[int, cst.BaseExpression]] = {}
    for name, values in found.items():
        value = int_literal(values[0]) if len(values) == 1 else None
        if value is not None:
            out[name] = (value, values[0])
    return out


def _collect_binding(node: cst.CSTNode, found: dict[str, list[cst.BaseExpression]]) -> None:
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        target, value = node.targets[0].target, node.value
    elif isinstance(node, cst.AnnAssign) and node.value is not None:
        target, value = node.target, node.value
    else:
        return
    if isinstance(target, cst.Name):
        found.setdefault(target.value, []).append(value)
