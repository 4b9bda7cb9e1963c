"""`ast.walk` and `ast.iter_child_nodes` as lists: the same nodes in the same order, without
their two layers of generators per node (`ast.iter_fields` inside `iter_child_nodes` inside
`walk`). The program model walks every expression of every module of a project this way (the
index's calls, the summaries' layers): the generators were most of that walk's cost."""

from __future__ import annotations

import ast


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """`list(ast.iter_child_nodes(node))`: the node fields and the nodes of list fields, in
    field order."""
    found: list[ast.AST] = []
    for name in node._fields:
        value = getattr(node, name, None)  # a field not set is skipped, as `iter_fields` does
        if isinstance(value, ast.AST):
            found.append(value)
        elif isinstance(value, list):
            found.extend([item for item in value if isinstance(item, ast.AST)])
    return found


def walk(node: ast.AST) -> list[ast.AST]:
    """`list(ast.walk(node))`: `node` and every node under it, breadth first."""
    found = [node]
    for current in found:  # the list grows while it is read: the queue of `ast.walk`
        for name in current._fields:
            value = getattr(current, name, None)
            if isinstance(value, ast.AST):
                found.append(value)
            elif isinstance(value, list):
                found.extend([item for item in value if isinstance(item, ast.AST)])
    return found
