"""Cheap stand-ins for libcst's PositionProvider, ParentNodeProvider and QualifiedNameProvider.

libcst computes each with a visitor pass over the whole tree, and QualifiedNameProvider adds a
scope analysis of every name: on a 975-line training script the three cost ten times the parse.
Here one walk over the nodes' fields gives every node's parent and source order and records
what each scope binds (imports, assignments, definitions, parameters); a qualified name is
resolved only when a rule asks for it, with libcst's own rules (see `QualifiedNames`);
positions come from one code-generation pass, run only when something asks for a position.

Each is a read-only mapping shaped like libcst's metadata, so `Rule.get_metadata(...)` and
`MetadataWrapper.resolve(...)` hand them out unchanged (`install`).
"""

from __future__ import annotations

import builtins
import contextlib
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.helpers import get_full_name_for_node
from libcst.metadata import (
    CodePosition,
    CodeRange,
    ImportAssignment,
    ParentNodeProvider,
    PositionProvider,
    QualifiedName,
    QualifiedNameProvider,
    QualifiedNameSource,
)

from autoopt.lint.tree.nodes import Preorder, index_tree, indexed_tree, walk

# Node classes as sets of exact types: `type(n) in S` is a hash lookup, while `isinstance`
# against libcst's classes (ABCs) is slow when it fails, and these checks run on every node.
# (No concrete libcst node class has subclasses.)
_COMPREHENSIONS = frozenset((cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp))
_FUNCTIONS = frozenset((cst.FunctionDef, cst.Lambda))
_NOT_IN_SCOPE = frozenset((cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal))
# Statements after which the names they bind are visible to later reads in the same scope.
_BINDERS = frozenset(
    (
        cst.Import,
        cst.ImportFrom,
        cst.Assign,
        cst.AnnAssign,
        cst.AugAssign,
        cst.NamedExpr,
        cst.For,
        cst.CompFor,
        cst.AsName,
        cst.FunctionDef,
        cst.ClassDef,
        cst.Param,
        cst.Global,
        cst.Nonlocal,
    )
)
_BINDER_CLASSES = tuple(_BINDERS)
_DECLARATIONS = frozenset((cst.Global, cst.Nonlocal))
_IMPORTS = frozenset((cst.Import, cst.ImportFrom))
_TARGET_BINDERS = frozenset((cst.AnnAssign, cst.AugAssign, cst.NamedExpr))


class ParentMap(Mapping[cst.CSTNode, cst.CSTNode]):
    """Every node's parent (the module has none), and every node in source order with its rank,
    from one walk of the tree (which also makes `nodes.walk` of this tree a slice)."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        tree = self.tree = index_tree(module)
        self.nodes = tree.nodes
        self.order = tree.rank  # id(node) -> rank in source order (not whitespace's)
        self.up = tree.up  # rank -> its parent's rank

    def __getitem__(self, node: cst.CSTNode) -> cst.CSTNode:
        parent = self.get(node)
        if parent is None:
            raise KeyError(node)
        return parent  # type: ignore[return-value]

    def get(self, node: cst.CSTNode, default: object = None) -> object:  # type: ignore[override]
        # rules ask this more than anything else: no call but the dict lookup
        rank = self.order.get(id(node))
        if rank is None:
            rank = self.tree.rank_of(node)
        return self.nodes[self.up[rank]] if rank else default

    def __contains__(self, node: object) -> bool:
        return bool(self.tree.rank_of(node))  # type: ignore[arg-type]  # the root (rank 0) has none

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return iter(self.nodes[1:])

    def __len__(self) -> int:
        return len(self.nodes) - 1

    def encloses(self, outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
        """`inner` is `outer` or lies inside it."""
        return inner is outer or self.tree.contains(outer, inner) is True


# ----- qualified names ----------------------------------------------------------------------------


@dataclass(eq=False)
class _Scope:
    """A module, function (or lambda), class or comprehension, with what it binds."""

    node: cst.CSTNode
    parent: _Scope | None  # None for the module
    prefix: str  # libcst's qualified-name prefix of names bound here ("f.<locals>")
    is_class: bool = False
    bindings: dict[str, list[_Binding]] = field(default_factory=dict)
    declared: dict[str, _Scope] = field(default_factory=dict)  # `global`/`nonlocal` names

    def visible_parent(self) -> _Scope | None:
        """The next enclosing scope whose names this one sees (class bodies are not seen)."""
        scope = self.parent
        while scope is not None and scope.is_class:
            scope = scope.parent
        return scope


@dataclass(eq=False)
class _Binding:
    """One way a scope binds a name: an import (`statement`), or anything else (`node`)."""

    scope: _Scope
    node: cst.CSTNode  # the bound Name / FunctionDef / ClassDef / Param, or the import statement
    # Reads after this node (and outside it) see the binding; None: every read of its scope
    # does. libcst visits a comprehension's element last: its inner `for`s bind for every
    # read of the comprehension outside them (`in_order` False), the first `for` for all.
    ready: cst.CSTNode | None
    is_import: bool = False
    in_order: bool = True

    def names_for(self, full_name: str) -> set[QualifiedName]:
        if self.is_import:
            imported = ImportAssignment(full_name, None, self.node, 0, self.node)  # type: ignore[arg-type]
            return imported.get_qualified_names_for(full_name)
        prefix = self.scope.prefix
        name = f"{prefix}.{full_name}" if prefix else full_name
        return {QualifiedName(name, QualifiedNameSource.LOCAL)}


# what a star-imported module conventionally binds (`from utils import *` over `import torch`)
_STAR_CONVENTIONS = {
    "torch": "torch",
    "nn": "torch.nn",
    "F": "torch.nn.functional",
    "optim": "torch.optim",
}


def _builtin(name: str) -> set[QualifiedName]:
    return {QualifiedName(f"builtins.{name}", QualifiedNameSource.BUILTIN)}


def _dotted_names(node: cst.BaseExpression) -> list[str]:
    """`a.b.c` -> ["a.b.c", "a.b", "a"] (the names `import a.b.c` binds)."""
    full = get_full_name_for_node(node) or ""
    parts = full.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _store_names(target: cst.BaseExpression) -> Iterator[cst.Name]:
    """The names an assignment target binds (`a`, `a, (b, *c)`; not `a.x` or `a[0]`)."""
    if isinstance(target, cst.Name):
        yield target
    elif isinstance(target, cst.Tuple | cst.List):
        for element in target.elements:
            yield from _store_names(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from _store_names(target.value)


class QualifiedNames(Mapping[cst.CSTNode, set[QualifiedName]]):
    """What libcst's QualifiedNameProvider gives, computed per node on demand.

    A node's name (`get_full_name_for_node`: `nn.Linear`, the function of a call) is looked up
    in the scope the node is in, longest dotted prefix first, through the enclosing functions
    (not class bodies) to the module and the builtins: an import gives the imported name
    (`from torch import nn` -> `torch.nn.Linear`), any other binding a local name
    (`compile = ...` -> `compile`, never `torch.compile`). A plain name that is read sees only
    the bindings of its own scope made before it (else the enclosing scope's), as in libcst."""

    def __init__(self, parents: ParentMap) -> None:
        self._parents = parents
        self._order = parents.order
        self._scopes: dict[cst.CSTNode, _Scope] = {}
        self._cache: dict[int, set[QualifiedName]] = {}  # by id(node)
        self._names: dict[int, frozenset[str]] = {}  # by id(node): the names as strings
        self._distinct: dict[frozenset[str], frozenset[str]] = {}
        self._bound_here: set[cst.CSTNode] = set()  # nodes that bind a name (not reads)
        self._bound = False  # the binding table is built on the first lookup
        self._star_imports = False  # the file has `from x import *`

    # -- Mapping
    def __getitem__(self, node: cst.CSTNode) -> set[QualifiedName]:
        found = self._cache.get(id(node))
        if found is None:
            found = self._cache[id(node)] = self._resolve_once(node)
        return found

    def _resolve_once(self, node: cst.CSTNode) -> set[QualifiedName]:
        """`_resolve(node)`, the binding table built first on the file's first question."""
        if not self._bound:
            parents = self._parents
            self._bind_all(parents.tree.of_type(parents.module, _BINDER_CLASSES))
            self._bound = True
        return self._resolve(node)

    def get(self, node: cst.CSTNode, default: object = None) -> object:  # type: ignore[override]
        return self[node]

    def names(self, node: cst.CSTNode) -> frozenset[str]:
        """`{q.name for q in self[node]}`, made once per node: what `Rule.qualified_names`
        asks, over and over for the same calls, from every rule."""
        found = self._names.get(id(node))
        if found is None:
            qualified = self._cache.get(id(node))
            if qualified is None:  # not kept twice: asked as strings, a node's names stay so
                qualified = self._resolve_once(node)
            found = frozenset(q.name for q in qualified)
            # one object per distinct answer (a 50k-line file asks 35k nodes, 12k answers)
            found = self._names[id(node)] = self._distinct.setdefault(found, found)
        return found

    def __contains__(self, node: object) -> bool:
        return isinstance(node, cst.CSTNode)

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return iter(self._parents.nodes)

    def __len__(self) -> int:
        return len(self._parents.nodes)

    # -- scopes
    def _scope_node(self, node: cst.CSTNode) -> _Scope:
        scope = self._scopes.get(node)
        if scope is not None:
            return scope
        if isinstance(node, cst.Module):
            scope = _Scope(node, None, "")
        else:
            parent = self._scope_of(node)
            assert parent is not None
            if isinstance(node, cst.ClassDef):
                prefix = ".".join(filter(None, [parent.prefix, node.name.value]))
                scope = _Scope(node, parent, prefix, is_class=True)
            elif type(node) in _FUNCTIONS:
                name = node.name.value if isinstance(node, cst.FunctionDef) else None
                scope = _Scope(
                    node, parent, ".".join(filter(None, [parent.prefix, name, "<locals>"]))
                )
            else:
                scope = _Scope(
                    node, parent, ".".join(filter(None, [parent.prefix, "<comprehension>"]))
                )
        self._scopes[node] = scope
        return scope

    def _scope_of(self, node: cst.CSTNode) -> _Scope | None:
        """The scope `node` is evaluated in; None where libcst gives none (the `attr` of an
        attribute, a keyword's name, the inside of an import or `global` statement)."""
        # Climbs by rank (`tree.up`): one lookup for `node`, none for its ancestors.
        tree = self._parents.tree
        nodes, up = tree.nodes, tree.up
        at = tree.rank.get(id(node))
        if at is None:
            at = tree.rank_of(node)
        at = -1 if at is None else up[at]  # the parent's rank; -1: none
        child, parent = node, nodes[at] if at >= 0 else None
        kind = type(parent)
        if kind is cst.Attribute and child is parent.attr:  # type: ignore[union-attr]
            return None
        if kind is cst.Arg and child is parent.keyword:  # type: ignore[union-attr]
            return None
        # Parameter defaults and annotations, and the first iterable of a comprehension, are
        # evaluated outside the function / comprehension they belong to.
        leave_function = leave_comprehension = False
        while parent is not None:
            kind = type(parent)
            if kind in _NOT_IN_SCOPE:
                return None
            if kind is cst.Param:
                if child is not parent.name:
                    leave_function = True
            elif kind is cst.CompFor:
                if child is parent.iter:
                    comp = nodes[up[at]] if at > 0 else None
                    leave_comprehension = (
                        type(comp) in _COMPREHENSIONS and comp.for_in is parent  # type: ignore[union-attr]
                    )
            elif kind in _FUNCTIONS:
                if child is parent.params or child is parent.body:
                    if not leave_function:
                        return self._scope_node(parent)
                    leave_function = False
            elif kind is cst.ClassDef:
                if child is parent.body:
                    return self._scope_node(parent)
            elif kind in _COMPREHENSIONS:
                if child is not parent.for_in or not leave_comprehension:
                    return self._scope_node(parent)
                leave_comprehension = False
            at = up[at]
            child, parent = parent, nodes[at] if at >= 0 else None
        return self._scope_node(self._parents.module)

    # -- bindings
    def _bind_all(self, binders: list[cst.CSTNode]) -> None:
        for node in binders:  # `global`/`nonlocal` first: they redirect the other bindings
            if type(node) in _DECLARATIONS:
                scope = self._scope_of_statement(node)
                target = scope
                while target.parent is not None:
                    target = target.parent
                if isinstance(node, cst.Nonlocal) and scope.parent is not None:
                    target = scope.parent
                for item in node.names:
                    scope.declared[item.name.value] = target
        for node in binders:
            kind = type(node)
            if kind in _IMPORTS:
                if isinstance(node.names, cst.ImportStar):
                    self._star_imports = True
                    continue
                scope = self._scope_of_statement(node)
                for alias in node.names:
                    bound = alias.asname.name if alias.asname else alias.name
                    for name in _dotted_names(bound):  # type: ignore[arg-type]
                        self._bind(scope, name, node, node, is_import=True)
            elif kind is cst.FunctionDef or kind is cst.ClassDef:
                self._bind(self._scope_of_statement(node), node.name.value, node, node)
                self._bound_here.add(node.name)
            elif kind is cst.Param:
                scope = self._scope_of(node.name)
                assert scope is not None
                ready = self._parents.get(node)  # the Parameters node
                self._bind(scope, node.name.value, node, ready or node)
                self._bound_here.add(node.name)
            elif kind is cst.For:
                self._bind_targets(node.target, node.target)
            elif kind is cst.CompFor:
                first = type(self._parents.get(node)) in _COMPREHENSIONS
                self._bind_targets(node.target, None if first else node, in_order=False)
            elif kind is cst.Assign:
                for target in node.targets:
                    self._bind_targets(target.target, node)
            elif kind in _TARGET_BINDERS:
                self._bind_targets(node.target, node)
            elif kind is cst.AsName and not isinstance(self._parents.get(node), cst.ImportAlias):
                self._bind_targets(node.name, node)  # type: ignore[arg-type]

    def _scope_of_statement(self, node: cst.CSTNode) -> _Scope:
        scope = self._scope_of(node)
        assert scope is not None
        return scope

    def _bind_targets(
        self, target: cst.BaseExpression, ready: cst.CSTNode | None, *, in_order: bool = True
    ) -> None:
        for name in _store_names(target):
            scope = self._scope_of(name)
            if scope is not None:
                self._bind(scope, name.value, name, ready, in_order=in_order)
                self._bound_here.add(name)

    def _bind(
        self,
        scope: _Scope,
        name: str,
        node: cst.CSTNode,
        ready: cst.CSTNode | None,
        *,
        is_import: bool = False,
        in_order: bool = True,
    ) -> None:
        while name in scope.declared and scope.declared[name] is not scope:
            scope = scope.declared[name]
        scope.bindings.setdefault(name, []).append(
            _Binding(scope, node, ready, is_import, in_order)
        )

    # -- lookup
    def _lookup(self, scope: _Scope, name: str) -> tuple[list[_Binding], bool]:
        """(the bindings of `name` seen from `scope`, whether it is a builtin)."""
        current: _Scope | None = scope
        while current is not None:
            declared = current.declared.get(name)
            if declared is not None and declared is not current:
                current = declared
                continue
            found = current.bindings.get(name)
            if found:
                return found, False
            current = current.visible_parent()
        return [], hasattr(builtins, name)

    def _resolve(self, node: cst.CSTNode) -> set[QualifiedName]:
        full_name = get_full_name_for_node(node)
        if full_name is None:
            return set()
        scope = self._scope_of(node)
        if scope is None:
            return set()
        if isinstance(node, cst.Name) and node not in self._bound_here:
            return self._resolve_read(node, scope)
        prefix: str | None = full_name
        while prefix:
            bindings, is_builtin = self._lookup(scope, prefix)
            if bindings:
                for binding in bindings:
                    if binding.node is node:
                        return binding.names_for(full_name)
                return {q for b in bindings for q in b.names_for(full_name)}
            if is_builtin:
                return _builtin(prefix)
            dot = prefix.rfind(".")
            prefix = prefix[:dot] if dot != -1 else None
        return self._star_imported(full_name)

    def _star_imported(self, full_name: str) -> set[QualifiedName]:
        """An unbound `torch.optim.Adam` (or `nn.`, `F.`, `optim.`) in a file that star-imports
        (`from utils import *`, TensoRF): torch's conventional names, which the star import
        brings in."""
        if not self._star_imports:
            return set()
        head, dot, rest = full_name.partition(".")
        module = _STAR_CONVENTIONS.get(head)
        if module is None:
            return set()
        return {QualifiedName(module + dot + rest, QualifiedNameSource.IMPORT)}

    def _resolve_read(self, node: cst.Name, scope: _Scope) -> set[QualifiedName]:
        """A name that is read: the bindings made before it in its own scope, or (if there are
        none yet) those of the enclosing scope."""
        name = node.value
        bindings, is_builtin = self._lookup(scope, name)
        if not bindings:
            return _builtin(name) if is_builtin else self._star_imported(name)
        seen = [b for b in bindings if b.scope is not scope or self._sees(b, node)]
        if not seen:
            if scope.parent is None:
                return _builtin(name) if hasattr(builtins, name) else set()
            bindings, is_builtin = self._lookup(scope.parent, name)
            if not bindings:
                return _builtin(name) if is_builtin else set()
            seen = bindings
        return {q for b in seen for q in b.names_for(name)}

    def _sees(self, binding: _Binding, node: cst.CSTNode) -> bool:
        """`binding` is complete when `node` runs (see `_Binding.ready`)."""
        ready = binding.ready
        if ready is None:
            return True
        if binding.in_order and self._order[id(ready)] > self._order[id(node)]:
            return False
        return not self._parents.encloses(ready, node)


# ----- positions ----------------------------------------------------------------------------------

_NEWLINE = re.compile(r"\r\n?|\n")


@dataclass
class _OffsetState(CodegenState):
    """Code generation that notes where each node starts and ends (character offsets), the
    way libcst's PositionProvider notes lines and columns, but without computing them."""

    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # by id(node)
    offset: int = 0
    popped: str = ""
    _starts: list[int] = field(default_factory=list)

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self.offset += len(value)

    def pop_trailing_newline(self) -> None:
        # PositionProvider keeps counting the module's last newline: so do we.
        if self.tokens:
            self.popped = self.tokens.pop()

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append(self.offset)

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._starts.pop()
        if id(node) not in self.spans:
            self.spans[id(node)] = (start, self.offset)

    def record_syntactic_position(
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> _SyntacticSpan:
        return _SyntacticSpan(self, node, start_node, end_node)


class _SyntacticSpan:
    """Notes `node`'s span around the code generated inside it (`start_node`/`end_node`:
    take the start/end of those nodes instead). A plain class: a generator-based context
    manager costs several times more, and code generation enters one per statement and
    expression."""

    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(
        self,
        state: _OffsetState,
        node: cst.CSTNode,
        start_node: cst.CSTNode | None,
        end_node: cst.CSTNode | None,
    ) -> None:
        self.state, self.node = state, node
        self.start_node, self.end_node = start_node, end_node
        self.start = 0

    def __enter__(self) -> None:
        self.start = self.state.offset

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:  # generation stopped early (`_HeaderState`): no end here
            return
        spans = self.state.spans
        start = self.start if self.start_node is None else spans[id(self.start_node)][0]
        end = self.state.offset if self.end_node is None else spans[id(self.end_node)][1]
        spans[id(self.node)] = (start, end)


# Leaves whose text may hold line breaks (strings; whitespace with a backslash continuation).
# Every other line break of a file is a `Newline` node.
_TEXT_WITH_BREAKS = (
    cst.SimpleString,
    cst.FormattedStringText,
    cst.TemplatedStringText,
    cst.SimpleWhitespace,
)


class _Stop(Exception):
    """Ends the generation of a statement at its body (`_HeaderState`)."""


@dataclass
class _HeaderState(_OffsetState):
    """`_OffsetState` that stops (raising `_Stop`) where the node with id `stop` would be
    generated, and keeps the syntactic spans it opened (their starts are known)."""

    stop: int | None = None
    opened: dict[int, _SyntacticSpan] = field(default_factory=dict)

    def before_codegen(self, node: cst.CSTNode) -> None:
        if id(node) == self.stop:
            raise _Stop
        super().before_codegen(node)

    def record_syntactic_position(
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> _SyntacticSpan:
        span = self.opened[id(node)] = _SyntacticSpan(self, node, start_node, end_node)
        return span


class Positions(Mapping[cst.CSTNode, CodeRange]):
    """libcst's PositionProvider ranges (1-based lines, 0-based columns), made on lookup.

    With the source text and the tree's index (`parents`), a lookup generates the code of the
    one statement that holds the node, starting at that statement's line: a statement of a
    block or of the module starts a line, and its line is one more than the line breaks before
    it (the `Newline` nodes and the breaks inside strings and continuations that come earlier
    in source order). The generated text must equal the source at that place, or the whole
    module is generated once, as without the source; so is it when the statements generated
    add up to more than the module. Files with findings ask for a few positions: this costs a
    fraction of generating the module's code, which costs about as much as parsing it."""

    def __init__(
        self, module: cst.Module, parents: ParentMap | None = None, source: str | None = None
    ) -> None:
        self._module = module
        self._parents = parents
        self._source = source
        self._spans: dict[int, tuple[int, int]] = {}  # by id(node); the module keeps every
        # node alive, so ids stay unique
        self._complete = False  # every node's span is in `_spans`
        self._line_starts: list[int] | None = None
        self._breaks: list[int] | None = None  # a rank per line break, in order
        self._generated = 0  # characters generated for single statements so far

    def _load(self) -> dict[int, tuple[int, int]]:
        """Every node's span, from code generation of the whole module."""
        if not self._complete:
            module = self._module
            state = _OffsetState(
                default_indent=module.default_indent, default_newline=module.default_newline
            )
            module._codegen(state)
            text = "".join(state.tokens) + state.popped
            self._line_starts = [0, *(m.end() for m in _NEWLINE.finditer(text))]
            self._spans = state.spans
            self._complete = True
        return self._spans

    def _span(self, node: cst.CSTNode) -> tuple[int, int] | None:
        span = self._spans.get(id(node))
        if span is None and not self._complete:
            if not self._from_statement(node):
                self._load()
            span = self._spans.get(id(node))
        return span

    def _from_statement(self, node: cst.CSTNode) -> bool:
        """Generate the statement holding `node` at its place; False when that cannot be
        done or checked (the caller then generates the module)."""
        tree = self._parents.tree if self._parents is not None else None
        source = self._source
        if tree is None or source is None or tree.rank_of(node) is None:
            return False
        statement, blocks = _line_statement(node, tree)
        if statement is None or self._generated > len(source):
            return False
        if self._line_starts is None:
            self._line_starts = [0, *(m.end() for m in _NEWLINE.finditer(source))]
            self._breaks = _break_ranks(tree)
            expected = len(self._line_starts) - 1 + (not self._module.has_trailing_newline)
            if len(self._breaks) != expected:  # a break the count does not know: never guess
                self._source = None
                return False
        assert self._breaks is not None
        line = bisect_left(self._breaks, tree.rank[id(statement)])
        if line >= len(self._line_starts):
            return False
        module = self._module
        offset = self._line_starts[line]
        state = _HeaderState(
            default_indent=module.default_indent,
            default_newline=module.default_newline,
            indent_tokens=[module.default_indent if b.indent is None else b.indent for b in blocks],
            offset=offset,
        )
        last = _last_small_statement(statement, tree) if node is statement else None
        body = getattr(statement, "body", None)
        if (
            last is not None
            and body is not None
            and _line_statement(last, tree)[0] is not statement
        ):
            # A compound statement asked for itself: its header, and its end from its last
            # small statement (where every block's syntactic end leads), not its whole body.
            state.stop = id(body)
        with contextlib.suppress(_Stop):
            statement._codegen(state)
        code = "".join(state.tokens)
        self._generated += len(code)
        if source[offset : offset + len(code)] != code:
            self._source = None
            return False
        for key, span in state.spans.items():
            self._spans.setdefault(key, span)
        if state.stop is not None:
            opened = state.opened.get(id(statement))
            if last is None or opened is None or opened.start_node is not None:
                return False
            end = self._span(last)
            if end is None:
                return False
            self._spans.setdefault(id(statement), (opened.start, end[1]))
        return True

    def _position(self, offset: int) -> CodePosition:
        assert self._line_starts is not None
        line = bisect_right(self._line_starts, offset)
        return CodePosition(line, offset - self._line_starts[line - 1])

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        span = self._span(node)
        if span is None:
            raise KeyError(node)
        return CodeRange(self._position(span[0]), self._position(span[1]))

    def get(self, node: cst.CSTNode, default: object = None) -> object:  # type: ignore[override]
        return self[node] if self._span(node) is not None else default

    def __contains__(self, node: object) -> bool:
        return isinstance(node, cst.CSTNode) and self._span(node) is not None

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return walk(self._module)

    def __len__(self) -> int:
        return len(self._load())


def _line_statement(
    node: cst.CSTNode, tree: Preorder
) -> tuple[cst.CSTNode | None, list[cst.IndentedBlock]]:
    """The innermost statement of a block or of the module that holds `node` (or is it), and
    the blocks around that statement, outermost first; (None, []) for a node outside any
    statement (the module, its header and footer lines)."""
    statement = None
    blocks: list[cst.IndentedBlock] = []
    current: cst.CSTNode | None = node
    ancestors = tree.ancestors(node)
    while current is not None:
        up = next(ancestors, None)
        kind = type(up)
        if kind is cst.IndentedBlock or kind is cst.Module:
            # (a header or footer line of a block is not a statement: its block's is)
            if statement is None and isinstance(current, cst.BaseStatement):
                statement = current
            if statement is not None and kind is cst.IndentedBlock:
                blocks.append(up)  # type: ignore[arg-type]
        current = up
    blocks.reverse()
    return statement, blocks


def _last_small_statement(statement: cst.CSTNode, tree: Preorder) -> cst.CSTNode | None:
    """The last small statement (`x = 1`, `pass`, a call...) inside a compound `statement`,
    in source order: the syntactic end of a compound statement is the end of its last block's
    last statement, down to a small one. None for a simple statement line."""
    if type(statement) is cst.SimpleStatementLine:
        return None
    start = tree.rank[id(statement)]
    nodes = tree.nodes
    for rank in range(tree.end[start] - 1, start, -1):
        if isinstance(nodes[rank], cst.BaseSmallStatement):
            return nodes[rank]
    return None


def _break_ranks(tree: Preorder) -> list[int]:
    """A rank per line break of the tree's code, in source order (a node's rank once for each
    break in its text)."""
    ranks = list(tree.ranks_of_type(cst.Newline))
    nodes = tree.nodes
    for rank in tree.ranks_of_type(_TEXT_WITH_BREAKS):
        value: str = nodes[rank].value  # type: ignore[attr-defined]
        if "\n" in value or "\r" in value:
            ranks.extend([rank] * len(_NEWLINE.findall(value)))
    ranks.sort()
    return ranks


def statement_offsets(module: cst.Module, source: str) -> list[int] | None:
    """Where each top-level statement's code (its leading blank and comment lines included)
    starts in `source`, the text `module` was parsed from, then where the footer starts: the
    line after the line breaks before it in source order, as for `Positions`. None when
    `module` is not the tree indexed last, or the line breaks counted differ from the text's.
    (libcst round-trips: each statement's code is then the text between two offsets.)"""
    tree = indexed_tree(module)
    if tree is None or not module.has_trailing_newline:
        return None
    line_starts = [0, *(m.end() for m in _NEWLINE.finditer(source))]
    breaks = _break_ranks(tree)
    if len(breaks) != len(line_starts) - 1:  # a break the count does not know: never guess
        return None
    rank = tree.rank
    lines = [bisect_left(breaks, rank[id(statement)]) for statement in module.body]
    lines.append(bisect_left(breaks, rank[id(module.footer[0])]) if module.footer else -1)
    offsets = [line_starts[line] if 0 <= line < len(line_starts) else -1 for line in lines]
    if not module.footer:
        offsets[-1] = len(source)
    if -1 in offsets or offsets != sorted(offsets):
        return None
    return offsets


# ----- wiring ---------------------------------------------------------------------------------------


def install(wrapper: cst.MetadataWrapper, source: str | None = None) -> ParentMap:
    """Put the cheap providers into `wrapper` in place of libcst's three (the walk for the
    parent map is made now; names and positions on first use) and return the parent map.
    `source`: the text the module was parsed from, when known (positions then generate only
    the statements asked about). A wrapper that has them already keeps them."""
    metadata = wrapper._metadata  # libcst has no public hook for supplying metadata
    parents = metadata.get(ParentNodeProvider)
    if isinstance(parents, ParentMap):
        return parents
    parents = ParentMap(wrapper.module)
    metadata[ParentNodeProvider] = parents
    metadata[QualifiedNameProvider] = QualifiedNames(parents)
    metadata[PositionProvider] = Positions(wrapper.module, parents, source)
    return parents
