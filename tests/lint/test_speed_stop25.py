"""Speed shortcuts of issue 30's stop 25 that must give exactly what the slow path gives: the
list-building `ast` walks of the program model (`tree.ast_walk`, against `ast.walk` and
`ast.iter_child_nodes`) and the collector paused for one file's work (`engine.collector`)."""

from __future__ import annotations

import ast
import gc

from autoopt.lint.engine.collector import collector_paused
from autoopt.lint.tree.ast_walk import child_nodes, walk

SOURCE = """\
import torch
from torch import nn as tnn


@dec(1)
class M(tnn.Module, metaclass=Meta):
    x: int = 1 < 2 <= 3 is not 4 not in 5

    def f(self, x, /, y=3, *, z, **kw):
        return [v for v in x if v] + {k: v for k, v in y} @ x[1:2, ...]


async def g(a, b=lambda q: q(1)):
    async with torch.no_grad() as q:
        await h(*a, **b)
    for i in range(3):
        try:
            a.cuda(b)
        except ValueError as e:
            raise e from None
    else:
        b += 1; print(f"{a!r:>{b}}")
    match a:
        case {"k": [1, *rest]} | Point(x=0) if rest:
            del rest
    global z
    return (yield from x)
"""


def test_walks_give_ast_nodes_in_ast_order() -> None:
    tree = ast.parse(SOURCE)
    assert [id(n) for n in walk(tree)] == [id(n) for n in ast.walk(tree)]
    for node in ast.walk(tree):
        assert [id(n) for n in walk(node)] == [id(n) for n in ast.walk(node)]
        assert [id(n) for n in child_nodes(node)] == [id(n) for n in ast.iter_child_nodes(node)]


def test_collector_paused_inside_and_restored() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # a file's work inside another's
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_collector_restored_after_an_error() -> None:
    try:
        with collector_paused():
            raise ValueError
    except ValueError:
        pass
    assert gc.isenabled()


def test_collector_left_off_where_the_caller_turned_it_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
