"""Reading and changing a call's arguments: one argument, every option it passes (including a
literal `**kwargs` dict defined in the same scope), adding a keyword."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import libcst as cst

from autoopt.lint.engine.rule import Rule
from autoopt.lint.program.torch_api import DATALOADER_POSITIONS
from autoopt.lint.tree.nodes import is_name, names_in, string_value, walk


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
    # keys a `**kwargs` dict sets on some paths only, or to values that differ by path
    # (`{"num_workers": 4} if cuda else {}`, an `update` under an `if`)
    conditional: frozenset[str] = frozenset()

    def known_missing(self, keyword: str) -> bool:
        return self.complete and keyword not in self.values


def call_options(
    rule: Rule, call: cst.Call, positions: Mapping[str, int] = DATALOADER_POSITIONS
) -> CallOptions:
    """Keywords (and known positional parameters) of `call`. `**name` is read when `name` is a
    dict literal or `dict(...)` call assigned once in the same scope and never mutated."""
    by_pos = {i: k for k, i in positions.items()}
    values: dict[str, cst.BaseExpression] = {}
    conditional: set[str] = set()
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
                values.update(resolved.values)
                conditional |= resolved.conditional
        elif a.keyword is not None:
            values[a.keyword.value] = a.value
        elif i in by_pos:
            values[by_pos[i]] = a.value
    return CallOptions(values, complete, frozenset(conditional))


@dataclass
class _Keys:
    """What a literal `**` dict passes, and which of its keys depend on the path taken."""

    values: dict[str, cst.BaseExpression]
    conditional: frozenset[str] = frozenset()


def _literal_dict(expr: cst.BaseExpression) -> _Keys | None:
    """`{"k": v}`, `dict(k=v)`, or `{...} if cond else {...}` (the keys of both branches: a key
    set on either branch counts as set, and is conditional unless both set it alike)."""
    if isinstance(expr, cst.IfExp):
        body, orelse = _literal_dict(expr.body), _literal_dict(expr.orelse)
        if body is None or orelse is None:
            return None
        differ = {
            k
            for k in body.values.keys() | orelse.values.keys()
            if k not in body.values
            or k not in orelse.values
            or not body.values[k].deep_equals(orelse.values[k])
        }
        return _Keys(
            {**orelse.values, **body.values},
            frozenset(differ | body.conditional | orelse.conditional),
        )
    if isinstance(expr, cst.Dict):
        out: dict[str, cst.BaseExpression] = {}
        for el in expr.elements:
            key = string_value(el.key) if isinstance(el, cst.DictElement) else None
            if key is None:  # `**other` or a computed key: not a literal we can read
                return None
            out[key] = el.value
        return _Keys(out)
    if isinstance(expr, cst.Call) and is_name(expr.func, "dict"):
        out = {}
        for a in expr.args:
            if a.keyword is None:
                return None
            out[a.keyword.value] = a.value
        return _Keys(out)
    return None


_MAX_DICT_DEPTH = 4  # `a.update(b)` where b is built from c...: followed this deep


def _resolve_literal_dict(rule: Rule, at: cst.CSTNode, name: str, depth: int = 0) -> _Keys | None:
    """The keys `**name` passes when `name` is built in the scope of `at` from literal dicts:
    assigned once, then only grown by `name.update(<literal or such a name>)` (as in
    pytorch/examples: `train_kwargs.update(cuda_kwargs)`, possibly under an `if`) and
    `name["key"] = value`. A key set on some path counts as set. None when anything else may
    change it (another method call, `|=`, rebinding, a parameter of the function). Keys added
    under an `if`, a loop or a `try` are conditional."""
    scope = rule.facts.enclosing_scope(at)
    if depth > _MAX_DICT_DEPTH or (
        isinstance(scope, cst.FunctionDef)
        and name in {p.name.value for p in walk(scope.params) if isinstance(p, cst.Param)}
    ):
        return None
    found: list[_Keys | None] = []
    grown: dict[str, cst.BaseExpression] = {}
    conditional: set[str] = set()
    for node in walk(scope, into_scopes=False):
        kind = type(node)  # exact types: this runs for every node of the scope
        if kind is cst.Assign:
            for t in node.targets:
                if is_name(t.target, name):
                    found.append(_literal_dict(node.value))
                elif _subscript_of(t.target, name):
                    key = _subscript_key(t.target)
                    if key is None:
                        return None
                    grown[key] = node.value
                    if _on_some_paths(rule, node, scope):
                        conditional.add(key)
                elif name in names_in(t.target):
                    return None
        elif (kind is cst.AugAssign or kind is cst.AnnAssign) and name in names_in(node.target):
            if isinstance(node, cst.AnnAssign) and is_name(node.target, name) and node.value:
                found.append(_literal_dict(node.value))
            else:
                return None
        elif (
            kind is cst.Call
            and isinstance(node.func, cst.Attribute)
            and is_name(node.func.value, name)
        ):
            added = (
                _update_argument(rule, node, depth) if node.func.attr.value == "update" else None
            )
            if added is None:
                return None  # kw.pop(...), kw.setdefault(...), an update we cannot read
            grown.update(added.values)
            conditional |= (
                added.values.keys() if _on_some_paths(rule, node, scope) else added.conditional
            )
        elif (target := _bound_target(node)) is not None and name in names_in(target):
            return None  # `with ... as kw`, `for kw in`, `(kw := ...)`, `del kw`
    if len(found) != 1 or found[0] is None:
        return None
    return _Keys({**found[0].values, **grown}, found[0].conditional | conditional)


_BRANCHING = (cst.If, cst.For, cst.While, cst.Try, cst.Match, cst.IfExp, cst.BooleanOperation)


def _on_some_paths(rule: Rule, node: cst.CSTNode, scope: cst.CSTNode) -> bool:
    """`node` runs only on some paths through `scope` (inside a branch, loop or `try`)."""
    for anc in rule.facts.ancestors(node):
        if anc is scope:
            return False
        if isinstance(anc, _BRANCHING):
            return True
    return False


_TARGET_BINDERS = frozenset((cst.For, cst.NamedExpr, cst.Del))


def _bound_target(node: cst.CSTNode) -> cst.CSTNode | None:
    """What a `with ... as`, `for`, walrus or `del` binds (None for anything else)."""
    kind = type(node)
    if kind is cst.AsName:
        return node.name  # type: ignore[attr-defined]
    if kind in _TARGET_BINDERS:
        return node.target  # type: ignore[attr-defined]
    return None


def _update_argument(rule: Rule, call: cst.Call, depth: int) -> _Keys | None:
    """What `kw.update(...)` adds: a literal dict, keywords, or a name built from literals."""
    if not call.args:
        return _Keys({})
    if all(a.keyword is not None for a in call.args):
        return _Keys({a.keyword.value: a.value for a in call.args if a.keyword is not None})
    if len(call.args) != 1 or call.args[0].star:
        return None
    value = call.args[0].value
    literal = _literal_dict(value)
    if literal is None and isinstance(value, cst.Name):
        literal = _resolve_literal_dict(rule, call, value.value, depth + 1)
    return literal


def _subscript_key(target: cst.Subscript) -> str | None:
    """`kw["key"]` -> "key"."""
    if len(target.slice) != 1 or not isinstance(target.slice[0].slice, cst.Index):
        return None
    return string_value(target.slice[0].slice.value)


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


# The containers whose values `holder_name` sees through (their elements' wrappers too).
_CONTAINERS = (
    cst.Dict,
    cst.DictComp,
    cst.List,
    cst.ListComp,
    cst.Tuple,
    cst.DictElement,
    cst.Element,
)


def holder_name(rule: Rule, call: cst.Call) -> str | None:
    """`x = call`, and `x = {split: call for split in ...}` / `x = [call, ...]` -> "x": the
    name that holds what `call` makes, alone or as a value of a container built in place
    (egnn's `dataloaders = {split: DataLoader(...) for ...}`); else None."""
    node: cst.CSTNode = call
    parent = rule.parent(node)
    while isinstance(parent, _CONTAINERS):
        if isinstance(parent, cst.DictElement) and parent.key is node:
            return None  # a key, not a value
        if isinstance(parent, cst.DictComp) and parent.value is not node:
            return None  # the key or the iterable
        if isinstance(parent, cst.ListComp) and parent.elt is not node:
            return None
        node, parent = parent, rule.parent(parent)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        t = parent.targets[0].target
        if isinstance(t, cst.Name):
            return t.value
    return None
