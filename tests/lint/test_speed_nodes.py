"""The index's shortcuts (autoopt/lint/tree/nodes.py `Preorder`) give what a descent of the tree gives:
walks outside scopes as slices, nodes of a class outside scopes, and containment by rank."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.tree import metadata, nodes

# Scopes in scopes, lambdas in default values, comprehensions, a class in a function.
SOURCE = """\
import torch

def outer(a, b=lambda x: x.cuda()):
    def inner(c):
        class Local:
            def method(self):
                return torch.zeros(1)
        return Local().method()
    f = lambda: inner(a)
    return [g(x) for x in range(3)], f()

class Model(torch.nn.Module):
    def forward(self, x):
        return self.net(x)

model = Model().cuda()
for batch in loader:
    loss = model(batch)
    loss.backward()
"""


def _descent(node: cst.CSTNode, into_scopes: bool) -> list[cst.CSTNode]:
    return list(nodes._descend(node, into_scopes))


def test_indexed_walks_and_lookups_equal_a_descent() -> None:
    module = cst.parse_module(SOURCE)
    tree = metadata.ParentMap(module).tree  # indexes the module: walks read the index
    assert nodes.indexed_tree(module) is tree
    every = tree.nodes
    for node in every:
        for into_scopes in (True, False):
            expected = _descent(node, into_scopes)
            assert [id(n) for n in nodes.walk(node, into_scopes=into_scopes)] == [
                id(n) for n in expected
            ]
            calls = [id(n) for n in expected if type(n) is cst.Call]
            got = nodes.calls_in(node, into_scopes=into_scopes)
            assert [id(n) for n in got] == calls
            kinds = (cst.Name, cst.FunctionDef)
            assert [id(n) for n in nodes.nodes_of_type(node, kinds, into_scopes=into_scopes)] == [
                id(n) for n in expected if type(n) in kinds
            ]
        inside = {id(n) for n in _descent(node, True)}
        for other in every[::7]:
            assert nodes.contains(node, other) is (id(other) in inside)


def test_outside_scopes_skips_bodies_but_keeps_the_scope_node() -> None:
    module = cst.parse_module(SOURCE)
    metadata.ParentMap(module)
    outer = module.body[1]
    names = [n.value for n in nodes.walk(outer, into_scopes=False) if type(n) is cst.Name]
    # the def of `inner` and the two lambdas are seen, nothing inside them (not even their
    # names); the comprehension is no scope here
    assert "Local" not in names and "inner" not in names and "cuda" not in names
    assert "g" in names and "range" in names
    kinds = [type(n) for n in nodes.walk(outer, into_scopes=False)]
    assert kinds.count(cst.Lambda) == 2 and kinds.count(cst.FunctionDef) == 2  # outer, inner
