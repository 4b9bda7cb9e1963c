"""Reading and changing a call's arguments: one argument, every option it passes (including a
literal `**kwargs` dict defined in the same scope), adding a keyword."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import libcst as cst

from autoopt.lint.nodes import is_name, names_in, string_value, walk
from autoopt.lint.rule import Rule
from autoopt.lint.torch_api import DATALOADER_POSITIONS


# ----- one argument -------------------------------------------------------------------------
def arg(call: cst.Call, keyword: str, position: int | None = None) -> cst.Arg | None:
    """The argument passed as `keyword=` (or at `position`), if present."""
    for i, a in enumerate(call.args):
        if a.keyword is not None and a.keyword.value == keyword:
            return a
        if position is not None and a.keyword is None and a.star == "" and i == position:
            return a
    return None


def has_star_kwargs(call: cst.Call) -> bool:
    """True if the call passes `**kwargs` (which may hide any keyword)."""
    return any(a.star == "**" for a in call.args)


def with_keyword(call: cst.Call, keyword: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with `keyword=value` appended (or replaced), keeping the call's formatting."""
    args = list(call.args)
    for i, a in enumerate(args):
        if a.keyword is not None and a.keyword.value == keyword:
            args[i] = a.with_changes(value=value)
            return call.with_changes(args=args)
    new = cst.Arg(keyword=cst.Name(keyword), value=value, equal=_EQUAL)
    if args:
        last = args[-1]
        if last.comma is cst.MaybeSentinel.DEFAULT or isinstance(last.comma, cst.MaybeSentinel):
            args[-1] = last.with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
        else:
            # keep a trailing comma (multi-line calls) after the new argument too
            new = new.with_changes(comma=last.comma)
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=_trailing_ws(last.comma)))
    return call.with_changes(args=[*args, new])


_EQUAL = cst.AssignEqual(
    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
)


def _trailing_ws(comma: Any) -> cst.BaseParenthesizableWhitespace:
    return comma.whitespace_after if isinstance(comma, cst.Comma) else cst.SimpleWhitespace(" ")


# ----- every option of a call --------------------------------------------------------------
@dataclass
class CallOptions:
    """The options a call passes. `complete` is False when `*args`/`**kwargs` may hide one."""

    values: dict[str, cst.BaseExpression]
    complete: bool

    def known_missing(self, keyword: str) -> bool:
        return self.complete and keyword not in self.values


def call_options(
    rule: Rule, call: cst.Call, positions: Mapping[str, int] = DATALOADER_POSITIONS
) -> CallOptions:
    """Keywords (and known positional parameters) of `call`. `**name` is read when `name` is a
    dict literal or `dict(...)` call assigned once in the same scope and never mutated."""
    by_pos = {i: k for k, i in positions.items()}
    values: dict[str, cst.BaseExpression] = {}
    complete = True
    for i, a in enumerate(call.args):
        if a.star == "*":
            complete = False
        elif a.star == "**":
            resolved = _literal_dict(a.value)
            if resolved is None and isinstance(a.value, cst.Name):
                resolved = _resolve_literal_dict(rule, call, a.value.value)
            if resolved is None:
                complete = False
            else:
                values.update(resolved)
        elif a.keyword is not None:
            values[a.keyword.value] = a.value
        elif i in by_pos:
            values[by_pos[i]] = a.value
    return CallOptions(values, complete)


def _literal_dict(expr: cst.BaseExpression) -> dict[str, cst.BaseExpression] | None:
    if isinstance(expr, cst.Dict):
        out: dict[str, cst.BaseExpression] = {}
        for el in expr.elements:
            key = string_value(el.key) if isinstance(el, cst.DictElement) else None
            if key is None:  # `**other` or a computed key: not a literal we can read
                return None
            out[key] = el.value
        return out
    if isinstance(expr, cst.Call) and is_name(expr.func, "dict"):
        out = {}
        for a in expr.args:
            if a.keyword is None:
                return None
            out[a.keyword.value] = a.value
        return out
    return None


def _resolve_literal_dict(
    rule: Rule, at: cst.CSTNode, name: str
) -> dict[str, cst.BaseExpression] | None:
    """The literal dict bound to `name` in the scope of `at`, if it is assigned exactly once there
    and nothing can have changed it (no item assignment, method call, `|=`, rebinding)."""
    scope = rule.facts.enclosing_scope(at)
    if isinstance(scope, cst.FunctionDef) and name in {
        p.name.value for p in walk(scope.params) if isinstance(p, cst.Param)
    }:
        return None
    found: list[dict[str, cst.BaseExpression] | None] = []
    for node in walk(scope, into_scopes=False):
        if isinstance(node, cst.Assign):
            for t in node.targets:
                if is_name(t.target, name):
                    found.append(_literal_dict(node.value))
                elif _subscript_of(t.target, name) or name in names_in(t.target):
                    return None
        elif isinstance(node, cst.AugAssign | cst.AnnAssign) and (name in names_in(node.target)):
            if isinstance(node, cst.AnnAssign) and is_name(node.target, name) and node.value:
                found.append(_literal_dict(node.value))
            else:
                return None
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and is_name(node.func.value, name)
        ):
            return None  # kw.update(...), kw.pop(...), kw.setdefault(...)
        elif isinstance(node, cst.AsName) and name in names_in(node.name):
            return None  # `with ... as kw`, `except ... as kw`, `import x as kw`
        elif isinstance(node, cst.For | cst.NamedExpr | cst.Del) and name in names_in(node.target):
            return None
    if len(found) != 1:
        return None
    return found[0]


def _subscript_of(target: cst.BaseExpression, name: str) -> bool:
    return isinstance(target, cst.Subscript) and is_name(target.value, name)


def assigned_name(rule: Rule, call: cst.Call) -> str | None:
    """`x = call` -> "x" (a single plain-name target), else None."""
    parent = rule.parent(call)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        t = parent.targets[0].target
        if isinstance(t, cst.Name):
            return t.value
    return None
