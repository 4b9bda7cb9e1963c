"""Building edits: the statement that holds a node, new statement lines, inserting after imports.

`parent` arguments are a parent lookup (`rule.parent`, `facts.parent`): these helpers serve rules,
fixes and the `--wrap` codemod alike."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from autoopt.lint.tree.nodes import code_of, dotted, nodes_of_type

ParentOf = Callable[[cst.CSTNode], "cst.CSTNode | None"]


def enclosing_statement(node: cst.CSTNode, parent: ParentOf) -> cst.BaseStatement | None:
    """The innermost statement (simple line, or compound statement whose header holds `node`)
    that contains `node`."""
    cur: cst.CSTNode | None = node
    while cur is not None and not isinstance(cur, cst.BaseStatement):
        cur = parent(cur)
    return cur


def block_statement(node: cst.CSTNode, parent: ParentOf) -> cst.BaseStatement | None:
    """The statement that holds `node` directly in a block (module or indented body): the one
    new statements can be put before or after (an `elif` gives its whole `if`)."""
    cur: cst.CSTNode | None = node
    while cur is not None:
        up = parent(cur)
        if isinstance(cur, cst.BaseStatement) and isinstance(up, cst.Module | cst.IndentedBlock):
            return cur
        cur = up
    return None


def sole_expression_statement(call: cst.Call, parent: ParentOf) -> cst.SimpleStatementLine | None:
    """The line `call` stands alone on as an expression statement (`foo(...)`), if so."""
    expr = parent(call)
    line = parent(expr) if isinstance(expr, cst.Expr) else None
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return line
    return None


def statement_line(code: str) -> cst.SimpleStatementLine:
    """One simple statement line parsed from `code` (`x = 1`, `foo(x)`)."""
    stmt = cst.parse_statement(code)
    assert isinstance(stmt, cst.SimpleStatementLine)
    return stmt


def _is_import_line(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, cst.Import | cst.ImportFrom) for s in stmt.body
    )


def is_docstring(stmt: cst.CSTNode) -> bool:
    """`stmt` is a line holding only a string (a module's or function's docstring when first)."""
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


def _is_docstring_or_future(stmt: cst.CSTNode) -> bool:
    if is_docstring(stmt):
        return True
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    return isinstance(small, cst.ImportFrom) and dotted(small.module) == "__future__"


def _import_anchor(module: cst.Module) -> cst.SimpleStatementLine | None:
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


def _binds_by_import(stmt: cst.CSTNode, names: tuple[str, ...]) -> bool:
    """`stmt` (a top-level statement, maybe a `try`/`if` around imports) imports one of `names`
    (`import torch`, `import torch.nn`, `from x import torch`)."""
    for node in nodes_of_type(stmt, (cst.Import, cst.ImportFrom), into_scopes=False):
        if isinstance(node, cst.Import):
            bound = {
                (code_of(a.asname.name) if a.asname else code_of(a.name)).split(".")[0]
                for a in node.names
            }
        elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
            bound = {code_of(a.asname.name) if a.asname else code_of(a.name) for a in node.names}
        else:
            continue
        if bound & set(names):
            return True
    return False


def insert_after_imports(
    module: cst.Module, new: cst.SimpleStatementLine, needs: tuple[str, ...] = ()
) -> dict[cst.CSTNode, cst.FlattenSentinel[cst.BaseStatement]]:
    """A replacement that puts `new` right after the import header (or, with no imports, after
    the docstring and `__future__` imports), and in any case after the last top-level statement
    that imports one of the names in `needs` (`("torch",)` for a line that calls torch: an
    `import torch` below a function or inside `try:` is not part of the header)."""
    anchor: cst.BaseStatement | None = _import_anchor(module)
    if needs:
        binding = [s for s in module.body if _binds_by_import(s, needs)]
        if binding and (anchor is None or _index(module, binding[-1]) > _index(module, anchor)):
            at = _index(module, binding[-1])
            while at + 1 < len(module.body) and _is_import_line(module.body[at + 1]):
                at += 1  # ... and after the imports that follow it
            anchor = module.body[at]
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


def _index(module: cst.Module, stmt: cst.CSTNode) -> int:
    return next(i for i, s in enumerate(module.body) if s is stmt)


def remove_statement(
    line: cst.SimpleStatementLine, parent: ParentOf
) -> cst.BaseStatement | cst.RemovalSentinel:
    """The replacement that deletes `line`: removed, or `pass` where it is its block's only
    statement (a block cannot be empty)."""
    block = parent(line)
    if isinstance(block, cst.IndentedBlock) and len(block.body) == 1:
        return cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=line.leading_lines)
    return cst.RemoveFromParent()


def unwrap_with(node: cst.With) -> cst.FlattenSentinel[cst.BaseStatement] | None:
    """The statements of a `with` block in its place (its header removed), or None when the
    body is on the header's line (`with x: y`)."""
    if not isinstance(node.body, cst.IndentedBlock):
        return None
    body = list(node.body.body)
    first = body[0]
    body[0] = first.with_changes(leading_lines=[*node.leading_lines, *first.leading_lines])
    return cst.FlattenSentinel(body)


def wrap_in_with(
    statements: list[cst.BaseStatement], header: str
) -> dict[cst.CSTNode, cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel]:
    """Replacements that put consecutive `statements` of one block under `with <header>:`."""
    parsed = cst.parse_statement(f"with {header}:\n    pass\n")
    assert isinstance(parsed, cst.With)
    first, rest = statements[0], statements[1:]
    with_node = parsed.with_changes(
        body=cst.IndentedBlock(body=[first.with_changes(leading_lines=[]), *rest]),
        leading_lines=first.leading_lines,
    )
    replacements: dict[cst.CSTNode, cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel]
    replacements = {first: cst.FlattenSentinel([with_node])}
    replacements.update({s: cst.RemoveFromParent() for s in rest})
    return replacements
