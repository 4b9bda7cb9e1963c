"""Speed shortcuts of issue 30's stop 22 that must give exactly what the slow path gives: the
lint's parse (`tree.parsing`) builds libcst's tree and still raises libcst's errors; the
compact rank table of a very large tree (`nodes.SortedRanks`) answers as the dict does; an
index that copies the statements it shares with the tree indexed before (`nodes.Preorder`)
equals a fresh one."""

from __future__ import annotations

import libcst as cst
import pytest

from autoopt.lint.tree import nodes, parsing

SOURCE = """\
# a comment
import torch  # trailing comment


def train(model, loader):
    for x in loader:  \\
            # continued
        loss = model(x).sum()
        loss.backward()


class Net(torch.nn.Module):
    def forward(self, x):
        return x
"""


def test_parse_gives_libcsts_tree_and_errors() -> None:
    module = parsing.parse_module(SOURCE)
    assert module.deep_equals(cst.parse_module(SOURCE))
    assert module.code == SOURCE
    with pytest.raises(cst.ParserSyntaxError):
        parsing.parse_module("def broken(:\n")
    # outside the parse, the leaves are validated again
    with pytest.raises(cst.CSTValidationError):
        cst.SimpleWhitespace("x")
    with pytest.raises(cst.CSTValidationError):
        cst.Comment("no hash")


def test_sorted_ranks_answer_as_the_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    module = cst.parse_module(SOURCE)
    plain = nodes.Preorder(module)
    monkeypatch.setattr(nodes, "COMPACT_RANKS_FROM", 1)
    compact = nodes.Preorder(module)
    assert isinstance(compact.rank, nodes.SortedRanks)
    assert dict(compact.rank.items()) == plain.rank
    for node in plain.nodes:
        assert compact.rank_of(node) == plain.rank_of(node)
    assert compact.rank.get(0) is None and 0 not in compact.rank
    with pytest.raises(KeyError):
        compact.rank[0]


def test_index_copying_shared_statements_equals_a_fresh_one() -> None:
    before = cst.parse_module(SOURCE)
    old = nodes.Preorder(before)
    body = list(before.body)
    body[1] = body[1].deep_clone()  # rebuilt by a "fix"; the others are shared
    body.insert(0, cst.parse_statement("x = 1\n"))
    after = before.with_changes(body=body)
    fresh, copied = nodes.Preorder(after), nodes.Preorder(after, old)
    assert copied.nodes == fresh.nodes
    assert list(copied.up) == list(fresh.up)
    assert list(copied.end) == list(fresh.end)
    assert copied.rank == fresh.rank
