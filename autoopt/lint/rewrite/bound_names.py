"""Which reads of a name may find it unbound: a definite-assignment analysis on Python's `ast`.

pyflakes reports a name bound nowhere, or used above its only binding; it does not report a
name bound on some paths only:

    if args.use_sgd:
        optimizer = torch.optim.SGD(...)
    ...
    optimizer.zero_grad()      # NameError when the flag is off

`maybe_unbound(tree)` answers, for every read of a plain name in a scope (the module body, each
function body, each class body), whether the name is bound on every path that reaches it. It
follows if/elif/else, for/while (and their `else`; `while True:` leaves only by `break`),
try/except/else/finally, with, match, return/raise/break/continue and `sys.exit()` ending a
path, `del`, `except E as e` (unbound after its handler), global/nonlocal, imports,
comprehensions, lambdas and the walrus.

Where it cannot be sure it says "bound" (the verifier must not reject good edits):
- a read in a function of a name the function does not bind (a global, a closure's name, a
  builtin) is bound: the function runs later, when the module has bound it;
- the back edge of a loop is not followed (a `del` in a loop body is not seen by the next
  iteration), a `with` is taken to run its body to the end, a star import binds everything;
- a test repeated verbatim is taken to be as true as the first time: the names bound under
  `if args.amp:` are bound under a later `if args.amp:` (or in the `else` of `if not args.amp:`);
- a name declared `global`/`nonlocal` anywhere in the file is never reported;
- `if "x" not in locals(): x = ...` binds `x` on both paths.

Past a read, a name is bound on that path (had it not been, the read would have raised), so
only the first read on a path is reported: an edit that reads `optimizer` again after the
script's own unguarded read of it adds no maybe-unbound read.

One pass over the tree: each node is visited once; which names a scope binds (so whether a
read is of a local) is settled when the pass is over.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# A test's text and the truth value under which some names are bound: (ast.dump(test), True).
_GuardKey = tuple[str, bool]
_STAR = "*"  # in a state's bound names: a star import ran, every name may be bound
_DEAD = "<unreachable>"  # with _STAR: code no path reaches (its reads are moot)


@dataclass(frozen=True)
class UnboundRead:
    """A read of `name` (at `line`, `col`) that some path reaches with the name unbound."""

    name: str
    line: int
    col: int


@dataclass
class _State:
    """What is known at one point of a scope: the names bound on every path reaching it, and
    names bound whenever a test seen before holds (`guarded`)."""

    bound: set[str]
    guarded: dict[_GuardKey, frozenset[str]] = field(default_factory=dict)

    def copy(self) -> _State:
        return _State(set(self.bound), dict(self.guarded))

    def has(self, name: str) -> bool:
        return name in self.bound or _STAR in self.bound


def _join(a: _State | None, b: _State | None) -> _State | None:
    """The state where two paths meet (None: a path that ended, by return, raise, break...)."""
    if a is None or _DEAD in a.bound:
        return b
    if b is None or _DEAD in b.bound:
        return a
    bound = a.bound & b.bound
    guarded: dict[_GuardKey, frozenset[str]] = {}
    for key in a.guarded.keys() & b.guarded.keys() if a.guarded and b.guarded else ():
        names = (a.guarded[key] | a.bound) & (b.guarded[key] | b.bound)
        if names - bound:
            guarded[key] = frozenset(names - bound)
    for one, other in ((a, b), (b, a)):
        # A test only one path has seen: its names hold there; on the other path the names
        # bound on it hold whatever the test.
        for key in one.guarded.keys() - other.guarded.keys():
            names = (one.guarded[key] | one.bound) & other.bound
            if names - bound:
                guarded[key] = frozenset(names - bound)
    return _State(bound, guarded)


def _unreachable() -> _State:
    return _State({_STAR, _DEAD})


def _join_all(states: list[_State | None]) -> _State | None:
    out: _State | None = None
    for state in states:
        out = _join(out, state)
    return out


class _Scope:
    """One scope: the names it binds anywhere, its candidate reads, its kind."""

    def __init__(self, kind: str, parent: _Scope | None) -> None:
        self.kind = kind  # "module", "function" or "class"
        self.parent = parent
        self.binds: set[str] = set()
        self.reads: list[tuple[str, ast.Name]] = []  # reads not bound on every path


@dataclass
class _Loop:
    breaks: list[_State] = field(default_factory=list)
    continues: list[_State] = field(default_factory=list)


def _guard_key(test: ast.expr) -> _GuardKey:
    truth = True
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, truth = test.operand, not truth
    return ast.dump(test), truth


def _constant_truth(test: ast.expr) -> bool | None:
    if isinstance(test, ast.Constant):
        return bool(test.value)
    return None


def _ends_path(call: ast.expr) -> bool:
    """`sys.exit()`, `exit()`, `quit()`, `os._exit()`, `parser.error()`: no path goes on."""
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in ("exit", "quit")
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        owner, attr = func.value.id, func.attr
        return (
            (owner == "sys" and attr == "exit")
            or (owner == "os" and attr in ("_exit", "abort"))
            or (attr == "error" and "parser" in owner)
        )
    return False


def _asks_if_bound(test: ast.expr) -> tuple[str | None, bool]:
    """`"x" in locals()` (or globals(), vars(), dir()): ("x", True); `not in`: ("x", False)."""
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.In | ast.NotIn)
        and isinstance(test.left, ast.Constant)
        and isinstance(test.left.value, str)
    ):
        return None, False
    scope = test.comparators[0]
    if (
        isinstance(scope, ast.Call)
        and isinstance(scope.func, ast.Name)
        and scope.func.id in ("locals", "globals", "vars", "dir")
        and not scope.args
    ):
        return test.left.value, isinstance(test.ops[0], ast.In)
    return None, False


def _pattern_names(pattern: ast.pattern, out: list[str]) -> None:
    for node in ast.walk(pattern):
        if isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            out.append(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            out.append(node.rest)


def _irrefutable(case: ast.match_case) -> bool:
    pattern = case.pattern
    if case.guard is not None:
        return False
    if isinstance(pattern, ast.MatchOr):
        return any(isinstance(p, ast.MatchAs) and p.pattern is None for p in pattern.patterns)
    return isinstance(pattern, ast.MatchAs) and pattern.pattern is None


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class _Analysis:
    """The single pass: statements change the state, expressions read (and walrus-bind)."""

    def __init__(self) -> None:
        self.scopes: list[_Scope] = []
        self.declared: set[str] = set()  # global/nonlocal anywhere: never reported
        self.scope = self._new_scope("module", None)
        self.loops: list[_Loop] = []

    def _new_scope(self, kind: str, parent: _Scope | None) -> _Scope:
        scope = _Scope(kind, parent)
        self.scopes.append(scope)
        return scope

    # ----- the result
    def result(self) -> list[UnboundRead]:
        out: list[UnboundRead] = []
        for scope in self.scopes:
            for name, node in scope.reads:
                if name in self.declared or name not in scope.binds:
                    continue  # not a local: a global, a closure's, a builtin (bound later)
                if scope.kind == "class" and self._outer_binds(scope, name):
                    continue  # a class body falls back to the names around it
                out.append(UnboundRead(name, node.lineno, node.col_offset))
        out.sort(key=lambda r: (r.line, r.col, r.name))
        return out

    @staticmethod
    def _outer_binds(scope: _Scope, name: str) -> bool:
        outer = scope.parent
        while outer is not None:
            if name in outer.binds:
                return True
            outer = outer.parent
        return False

    # ----- names
    def read(self, node: ast.Name, state: _State) -> None:
        if not state.has(node.id):
            self.scope.reads.append((node.id, node))
            # A path goes on past a read only if the name was bound: the read raised otherwise.
            state.bound.add(node.id)

    def bind(self, name: str, state: _State | None) -> None:
        self.scope.binds.add(name)
        if state is not None:
            state.bound.add(name)

    def bind_target(self, target: ast.expr, state: _State, local: bool = True) -> None:
        """Bind an assignment's target (reading what a subscript or attribute target reads).
        `local=False`: a comprehension's own variable, bound in `state` only."""
        if isinstance(target, ast.Name):
            if local:
                self.bind(target.id, state)
            else:
                state.bound.add(target.id)
        elif isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                self.bind_target(elt, state, local)
        elif isinstance(target, ast.Starred):
            self.bind_target(target.value, state, local)
        else:
            self.expr(target, state)

    # ----- statements
    def body(self, stmts: list[ast.stmt], state: _State | None) -> _State | None:
        for i, stmt in enumerate(stmts):
            if state is None:
                self.dead(stmts[i:])
                return None
            state = self.stmt(stmt, state)
        return state

    def dead(self, stmts: list[ast.stmt]) -> None:
        """Code no path reaches: walked like the rest (a name it binds is still local, its
        functions are still scopes), in a state where every name is bound."""
        self.body(stmts, _unreachable())

    def stmt(self, node: ast.stmt, state: _State) -> _State | None:  # noqa: C901, PLR0911, PLR0912
        if isinstance(node, ast.Expr):
            self.expr(node.value, state)
            return None if _ends_path(node.value) else state
        if isinstance(node, ast.Assign):
            self.expr(node.value, state)
            for target in node.targets:
                self.bind_target(target, state)
            return state
        if isinstance(node, ast.AugAssign):
            self.expr(node.value, state)
            if isinstance(node.target, ast.Name):
                self.read(node.target, state)
                self.bind(node.target.id, state)
            else:
                self.expr(node.target, state)
            return state
        if isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.expr(node.value, state)
                self.bind_target(node.target, state)
            elif not isinstance(node.target, ast.Name):
                self.expr(node.target, state)
            return state
        if isinstance(node, ast.If):
            return self.if_(node, state)
        if isinstance(node, ast.For | ast.AsyncFor):
            return self.for_(node, state)
        if isinstance(node, ast.While):
            return self.while_(node, state)
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            return self.try_(node, state)  # type: ignore[arg-type]
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                self.expr(item.context_expr, state)
                if item.optional_vars is not None:
                    self.bind_target(item.optional_vars, state)
            return self.body(node.body, state)
        if isinstance(node, ast.Return):
            if node.value is not None:
                self.expr(node.value, state)
            return None
        if isinstance(node, ast.Raise):
            if node.exc is not None:
                self.expr(node.exc, state)
            if node.cause is not None:
                self.expr(node.cause, state)
            return None
        if isinstance(node, ast.Break | ast.Continue):
            if self.loops and _DEAD not in state.bound:
                loop = self.loops[-1]
                (loop.breaks if isinstance(node, ast.Break) else loop.continues).append(state)
            return None
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    state.bound.add(_STAR)
                else:
                    self.bind((alias.asname or alias.name).split(".")[0], state)
            return state
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            self.function(node, state)
            return state
        if isinstance(node, ast.ClassDef):
            self.class_(node, state)
            return state
        if isinstance(node, ast.Delete):
            for target in node.targets:
                self.delete(target, state)
            return state
        if isinstance(node, ast.Global | ast.Nonlocal):
            self.declared.update(node.names)
            return state
        if isinstance(node, ast.Match):
            return self.match(node, state)
        if isinstance(node, ast.Assert) and _constant_truth(node.test) is False:
            return None  # `assert False, "unreachable"`: no path goes on
        # assert, pass, type aliases...: their expressions are reads
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child, state)
        return state

    def delete(self, target: ast.expr, state: _State) -> None:
        if isinstance(target, ast.Name):
            self.read(target, state)
            self.scope.binds.add(target.id)
            state.bound.discard(target.id)
            state.guarded = {
                k: v - {target.id} for k, v in state.guarded.items() if v - {target.id}
            }
        elif isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                self.delete(elt, state)
        else:
            self.expr(target, state)

    def if_(self, node: ast.If, state: _State) -> _State | None:
        self.expr(node.test, state)
        truth = _constant_truth(node.test)
        key: _GuardKey | None = None  # the test's text: taken only when a guard needs it
        body_in, else_in = state.copy(), state
        if truth is None and state.guarded:
            key = _guard_key(node.test)
            body_in.bound |= state.guarded.get(key, frozenset())
            else_in = state.copy()
            else_in.bound |= state.guarded.get((key[0], not key[1]), frozenset())
            if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And):
                # `if args.amp and step % k == 0:` holds only where `args.amp` does
                for part in node.test.values:
                    body_in.bound |= state.guarded.get(_guard_key(part), frozenset())
        asked, bound_if = _asks_if_bound(node.test)
        if asked is not None:  # `if "x" not in locals(): x = ...`: bound after, either way
            if else_in is state:
                else_in = state.copy()
            (body_in if bound_if else else_in).bound.add(asked)
        if truth is False:
            self.dead(node.body)
            return self.body(node.orelse, else_in)
        body_out = self.body(node.body, body_in)
        if truth is True:
            self.dead(node.orelse)
            return body_out
        else_out = self.body(node.orelse, else_in)
        out = _join(body_out, else_out)
        if out is None or body_out is None or else_out is None:
            return out
        # What one branch bound holds under a later test of the same text.
        for branch, positive in ((body_out, True), (else_out, False)):
            if branch.bound <= out.bound and not branch.guarded:
                continue
            key = key or _guard_key(node.test)
            when = (key[0], key[1] if positive else not key[1])
            names = (branch.bound | branch.guarded.get(when, frozenset())) - out.bound
            if names:
                out.guarded[when] = frozenset(names)
        return out

    def loop_body(self, stmts: list[ast.stmt], state: _State) -> tuple[_State | None, _Loop]:
        loop = _Loop()
        self.loops.append(loop)
        try:
            end = self.body(stmts, state)
        finally:
            self.loops.pop()
        return end, loop

    def for_(self, node: ast.For | ast.AsyncFor, state: _State) -> _State | None:
        self.expr(node.iter, state)
        body_in = state.copy()
        self.bind_target(node.target, body_in)
        end, loop = self.loop_body(node.body, body_in)
        # The loop may run no time: its `else` starts from the state before it too.
        else_in = _join_all([state, end, *loop.continues])
        else_out = self.body(node.orelse, else_in.copy() if else_in is not None else None)
        return _join_all([else_out, *loop.breaks])

    def while_(self, node: ast.While, state: _State) -> _State | None:
        self.expr(node.test, state)
        forever = _constant_truth(node.test)
        if forever is False:
            self.dead(node.body)
            return self.body(node.orelse, state)
        end, loop = self.loop_body(node.body, state.copy())
        if forever:  # `while True:` leaves by `break` only; its `else` never runs
            self.dead(node.orelse)
            return _join_all(list(loop.breaks))
        else_in = _join_all([state, end, *loop.continues])
        else_out = self.body(node.orelse, else_in.copy() if else_in is not None else None)
        return _join_all([else_out, *loop.breaks])

    def try_(self, node: ast.Try, state: _State) -> _State | None:
        body_out = self.body(node.body, state.copy())
        # A handler may start anywhere in the body: from what was bound before it.
        ends: list[_State | None] = []
        for handler in node.handlers:
            handler_in = state.copy()
            if handler.type is not None:
                self.expr(handler.type, handler_in)
            if handler.name:
                self.bind(handler.name, handler_in)
            handler_out = self.body(handler.body, handler_in)
            if handler_out is not None and handler.name:
                handler_out.bound.discard(handler.name)  # `except E as e` deletes `e`
            ends.append(handler_out)
        else_out = self.body(node.orelse, body_out)
        out = _join_all([else_out, *ends])
        if not node.finalbody:
            return out
        final_out = self.body(node.finalbody, state.copy())
        if out is None or final_out is None:
            return None
        out.bound |= final_out.bound - state.bound
        return out

    def match(self, node: ast.Match, state: _State) -> _State | None:
        self.expr(node.subject, state)
        ends: list[_State | None] = []
        exhaustive = False
        for case in node.cases:
            case_in = state.copy()
            for sub in ast.walk(case.pattern):
                if isinstance(sub, ast.MatchValue):
                    self.expr(sub.value, case_in)
                elif isinstance(sub, ast.MatchClass):
                    self.expr(sub.cls, case_in)
            names: list[str] = []
            _pattern_names(case.pattern, names)
            for name in names:
                self.bind(name, case_in)
            if case.guard is not None:
                self.expr(case.guard, case_in)
            ends.append(self.body(case.body, case_in))
            exhaustive = exhaustive or _irrefutable(case)
        if not exhaustive:
            ends.append(state)
        return _join_all(ends)

    # ----- definitions: a new scope
    def arguments_now(self, args: ast.arguments, state: _State) -> None:
        for default in [*args.defaults, *args.kw_defaults]:
            if default is not None:
                self.expr(default, state)

    def function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, state: _State) -> None:
        for decorator in node.decorator_list:
            self.expr(decorator, state)
        self.arguments_now(node.args, state)
        self.bind(node.name, state)
        self.run_scope("function", node.body, self.parameters(node.args))

    @staticmethod
    def parameters(args: ast.arguments) -> set[str]:
        names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        for extra in (args.vararg, args.kwarg):
            if extra is not None:
                names.add(extra.arg)
        return names

    def class_(self, node: ast.ClassDef, state: _State) -> None:
        for decorator in node.decorator_list:
            self.expr(decorator, state)
        for base in node.bases:
            self.expr(base, state)
        for keyword in node.keywords:
            self.expr(keyword.value, state)
        self.run_scope("class", node.body, set())
        self.bind(node.name, state)

    def run_scope(self, kind: str, stmts: list[ast.stmt], bound: set[str]) -> None:
        outer, loops = self.scope, self.loops
        self.scope, self.loops = self._new_scope(kind, outer), []
        self.scope.binds |= bound
        try:
            self.body(stmts, _State(set(bound)))
        finally:
            self.scope, self.loops = outer, loops

    # ----- expressions
    def expr(self, node: ast.expr, state: _State) -> None:  # noqa: C901, PLR0912
        """Check the reads of `node`, in evaluation order; a walrus binds into `state`."""
        stack: list[ast.AST] = [node]
        pop, push, extend = stack.pop, stack.append, stack.extend
        while stack:
            sub: Any = pop()  # an ast node, told apart by its exact type below
            kind = type(sub)
            # The common nodes first, by identity (this loop is the pass's cost).
            if kind is ast.Name:
                if type(sub.ctx) is ast.Load and not state.has(sub.id):
                    self.read(sub, state)
            elif kind is ast.Attribute:
                push(sub.value)
            elif kind is ast.Constant:
                continue
            elif kind is ast.Call:
                extend(reversed([kw.value for kw in sub.keywords]))
                extend(reversed(sub.args))
                push(sub.func)
            elif kind is ast.Subscript:
                push(sub.slice)
                push(sub.value)
            elif kind is ast.BinOp:
                push(sub.right)
                push(sub.left)
            elif kind is ast.NamedExpr:
                self.expr(sub.value, state)
                self.bind_target(sub.target, state)
            elif kind is ast.BoolOp:
                # Only the first operand always runs: later ones bind nothing for sure.
                self.expr(sub.values[0], state)
                rest = state.copy()
                for value in sub.values[1:]:
                    self.expr(value, rest)
            elif kind is ast.IfExp:
                self.expr(sub.test, state)
                body, orelse = state.copy(), state.copy()
                self.expr(sub.body, body)
                self.expr(sub.orelse, orelse)
                joined = _join(body, orelse)
                assert joined is not None
                state.bound, state.guarded = joined.bound, joined.guarded
            elif kind is ast.Lambda:
                self.arguments_now(sub.args, state)  # the body runs later, in its own scope
            elif kind in _COMPREHENSIONS:
                self.comprehension(sub, state)
            else:
                children = list(ast.iter_child_nodes(sub))
                children.reverse()
                extend(children)

    def comprehension(
        self, node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp, state: _State
    ) -> None:
        """The first iterable is read here; the rest in the comprehension's own scope, where its
        variables are bound. A walrus inside binds in this scope, but only if it runs."""
        generators = node.generators
        self.expr(generators[0].iter, state)
        inner = state.copy()
        for i, generator in enumerate(generators):
            if i:
                self.expr(generator.iter, inner)
            self.bind_target(generator.target, inner, local=False)
            for condition in generator.ifs:
                self.expr(condition, inner)
        if isinstance(node, ast.DictComp):
            self.expr(node.key, inner)
            self.expr(node.value, inner)
        else:
            self.expr(node.elt, inner)


def maybe_unbound(tree: ast.Module) -> list[UnboundRead]:
    """The reads of plain names in `tree` that some path reaches with the name unbound (see
    the module doc), in source order. A tree too deep to walk gives no answer (an empty
    list): the analysis says "bound" when it cannot tell."""
    analysis = _Analysis()
    try:
        analysis.body(tree.body, _State(set()))
    except RecursionError:
        return []
    return analysis.result()


def maybe_unbound_counts(tree: ast.Module) -> Counter[str]:
    """`maybe_unbound(tree)` counted by name (lines shift under an edit; names do not)."""
    return Counter(read.name for read in maybe_unbound(tree))
