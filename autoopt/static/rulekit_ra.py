"""Shared helpers for the data-loading, precision, compile and memory rules (AO1xx-AO4xx).

Every module in `rules/` defines exactly one rule, so what several of those rules need lives here:
reading a call's options (including a literal `**kwargs` dict defined in the same scope), finding
the names a batch is bound to inside a loop, ordering nodes by position, and building statements
that refer to torch under the name the script already imports it as.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst
from libcst.codemod.visitors import ImportItem
from libcst.metadata import PositionProvider

from autoopt.static.facts import calls_in, contains, walk
from autoopt.static.rule import Rule, arg

DATALOADER = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")

# DataLoader's positional parameters after `dataset` (torch 1.7 .. 2.x); the later ones
# (prefetch_factor, persistent_workers, ...) are keyword-only.
DATALOADER_POSITIONS: Mapping[str, int] = {
    "batch_size": 1,
    "shuffle": 2,
    "sampler": 3,
    "batch_sampler": 4,
    "num_workers": 5,
    "collate_fn": 6,
    "pin_memory": 7,
    "drop_last": 8,
    "timeout": 9,
    "worker_init_fn": 10,
    "multiprocessing_context": 11,
    "generator": 12,
}


def names_in(node: cst.CSTNode) -> set[str]:
    """Every plain name read or written in `node`."""
    return {n.value for n in walk(node) if isinstance(n, cst.Name)}


def method_name(call: cst.Call) -> str | None:
    """`x.foo(...)` -> "foo"."""
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else None


def start(rule: Rule, node: cst.CSTNode) -> tuple[int, int]:
    """(line, column) where `node` starts, for ordering nodes in source order."""
    pos = rule.get_metadata(PositionProvider, node)
    return (pos.start.line, pos.start.column)


def before(rule: Rule, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return start(rule, a) < start(rule, b)


def code_of(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


# ----- literals -----------------------------------------------------------------------------------
def int_literal(expr: cst.BaseExpression | None) -> int | None:
    if isinstance(expr, cst.Integer):
        return int(expr.value, 0)
    return None


def is_name(expr: cst.CSTNode | None, value: str) -> bool:
    return isinstance(expr, cst.Name) and expr.value == value


def string_value(expr: cst.BaseExpression | None) -> str | None:
    if isinstance(expr, cst.SimpleString):
        v = expr.evaluated_value
        return v if isinstance(v, str) else None
    return None


# ----- call options, including a literal **kwargs dict -------------------------------------------
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
                resolved = resolve_literal_dict(rule, call, a.value.value)
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


def resolve_literal_dict(
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
        elif isinstance(node, cst.For | cst.AsName | cst.NamedExpr | cst.Del) and name in names_in(
            node.target
        ):
            return None
    if len(found) != 1:
        return None
    return found[0]


def _subscript_of(target: cst.BaseExpression, name: str) -> bool:
    return isinstance(target, cst.Subscript) and is_name(target.value, name)


# ----- loaders and batches -------------------------------------------------------------------------
def loader_names(rule: Rule) -> set[str]:
    """Names bound to a `torch.utils.data.DataLoader(...)` anywhere in the file."""
    out: set[str] = set()
    for node in walk(rule.context.module):
        if isinstance(node, cst.Assign) and rule.is_call_to(node.value, *DATALOADER):
            for t in node.targets:
                if isinstance(t.target, cst.Name):
                    out.add(t.target.value)
    return out


def assigned_name(rule: Rule, call: cst.Call) -> str | None:
    """`x = call` -> "x" (a single plain-name target), else None."""
    parent = rule.parent(call)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        t = parent.targets[0].target
        if isinstance(t, cst.Name):
            return t.value
    return None


def batch_names(loop: cst.For) -> set[str]:
    """Names that hold (parts of) the batch in `loop`: the loop's targets, and names unpacked or
    indexed from them in the loop body (`inputs, labels = data`, `x = batch["x"]`)."""
    names = names_in(loop.target)
    changed = True
    while changed:  # a few rounds: `data = batch; x, y = data`
        changed = False
        for node in walk(loop.body, into_scopes=False):
            if not isinstance(node, cst.Assign) or not _is_batch_expr(node.value, names):
                continue
            for t in node.targets:
                new = names_in(t.target) - names
                if new:
                    names |= new
                    changed = True
    return names


def _is_batch_expr(expr: cst.BaseExpression, names: set[str]) -> bool:
    if isinstance(expr, cst.Name):
        return expr.value in names
    if isinstance(expr, cst.Subscript | cst.Attribute):
        return _is_batch_expr(expr.value, names)
    if isinstance(expr, cst.Tuple | cst.List):
        return bool(expr.elements) and all(_is_batch_expr(e.value, names) for e in expr.elements)
    return False


def root_name(expr: cst.BaseExpression) -> str | None:
    """`batch["x"][0].foo` -> "batch"."""
    while isinstance(expr, cst.Subscript | cst.Attribute):
        expr = expr.value
    return expr.value if isinstance(expr, cst.Name) else None


def loop_body_contains_name(loop: cst.For | cst.While, child: cst.CSTNode) -> bool:
    """True if `child` (a descendant of `loop`) is in the loop's body, not its header."""
    return contains(loop.body, child) or (loop.orelse is not None and contains(loop.orelse, child))


# ----- statements ----------------------------------------------------------------------------------
def statement_of(rule: Rule, node: cst.CSTNode) -> cst.BaseStatement | None:
    """The statement line (or compound statement) that contains `node`."""
    cur: cst.CSTNode | None = node
    while cur is not None and not isinstance(cur, cst.BaseStatement):
        cur = rule.parent(cur)
    return cur


def sole_expression_statement(rule: Rule, call: cst.Call) -> cst.SimpleStatementLine | None:
    """The line `call` stands alone on as an expression statement (`foo(...)`), if so."""
    expr = rule.parent(call)
    line = rule.parent(expr) if isinstance(expr, cst.Expr) else None
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return line
    return None


def expression_line(code: str) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine(body=[cst.Expr(cst.parse_expression(code))])


def torch_name(rule: Rule) -> tuple[str, tuple[ImportItem, ...]]:
    """How to spell `torch` in this file: its existing alias (`import torch as th` -> "th"),
    else "torch" together with the import to add."""
    for stmt in rule.context.module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if not isinstance(small, cst.Import):
                continue
            for alias in small.names:
                dotted = code_of(alias.name)
                if alias.asname is None and (dotted == "torch" or dotted.startswith("torch.")):
                    return "torch", ()  # `import torch.nn` binds `torch` too
                if dotted == "torch" and alias.asname and isinstance(alias.asname.name, cst.Name):
                    return alias.asname.name.value, ()
    return "torch", (ImportItem("torch"),)


# ----- per-batch device transfers ------------------------------------------------------------------
_DTYPE_PREFIXES = ("torch.float", "torch.bfloat", "torch.half", "torch.double", "torch.int")
_DTYPES = {
    "torch.bool",
    "torch.long",
    "torch.short",
    "torch.uint8",
    "torch.int8",
    "torch.cfloat",
    "torch.cdouble",
    "torch.complex64",
    "torch.complex128",
}


def is_dtype(rule: Rule, expr: cst.BaseExpression) -> bool:
    """`torch.float16`, `torch.long`, ... (by qualified name)."""
    names = rule.qualified_names(expr) if isinstance(expr, cst.Name | cst.Attribute) else set()
    return any(n in _DTYPES or n.startswith(_DTYPE_PREFIXES) for n in names)


def to_destination(rule: Rule, call: cst.Call) -> str | None:
    """What a `.to(...)` call moves to: "cpu", "device" (anything else that names a device), or
    None (a dtype, another tensor's properties via `**kwargs`, nothing)."""
    if any(a.star for a in call.args):
        return None
    dest = arg(call, "device", 0)
    if dest is None:
        return None
    value = dest.value
    if is_dtype(rule, value):
        return None
    text = string_value(value)
    if isinstance(value, cst.Call) and rule.refers_to(value.func, "torch.device") and value.args:
        text = string_value(value.args[0].value) or text
    if text is not None:
        return "cpu" if text.startswith("cpu") else "device"
    if isinstance(value, cst.Name | cst.Attribute | cst.Call | cst.Subscript):
        return "device"
    return None


def data_loops(rule: Rule) -> list[cst.For]:
    """`for` loops that iterate batches: training loops, evaluation loops, and loops over a name
    bound to a DataLoader."""
    loaders = loader_names(rule)
    facts = rule.facts
    out = []
    for node in walk(rule.context.module):
        if isinstance(node, cst.For) and (
            facts.is_training_loop(node)
            or facts.is_eval_loop(node)
            or bool(names_in(node.iter) & loaders)
        ):
            out.append(node)
    return out


def batch_transfers(rule: Rule, loop: cst.For) -> list[cst.Call]:
    """`<batch>.to(<device>)` and `<batch>.cuda()` calls in `loop` whose receiver comes from the
    batch the loop iterates (not a module, not a dtype cast)."""
    names = batch_names(loop)
    out = []
    for call in calls_in(loop.body, into_scopes=False):
        method = method_name(call)
        if method not in ("to", "cuda"):
            continue
        assert isinstance(call.func, cst.Attribute)
        if root_name(call.func.value) not in names:
            continue
        if method == "cuda" or to_destination(rule, call) == "device":
            out.append(call)
    return out


def loops_over(rule: Rule, name: str) -> list[cst.For]:
    """`for` loops whose iterable mentions `name` (`loader`, `enumerate(loader)`, `tqdm(loader)`)."""
    return [
        n for n in walk(rule.context.module) if isinstance(n, cst.For) and name in names_in(n.iter)
    ]


# ----- gradient mode -------------------------------------------------------------------------------
