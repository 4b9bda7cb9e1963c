"""Positions made per statement (autoopt/lint/tree/metadata.py `Positions` with the source) equal
libcst's PositionProvider, and are made without generating the whole module."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import PositionProvider

from autoopt.lint.tree import metadata

# Line breaks that are no `Newline` node (strings, continuations), blocks in blocks, decorators
# with comments, elif chains, semicolons, a comment-only footer, tabs.
SOURCE = '''\
"""Module docstring
over three
lines."""
import torch  # comment
x = 1; y = 2 \\
    + 3
s = f"""{x}
{y!r:>{3}}
"""

@decorator  # on the decorator
# between
@other(
    1,
)
def train(model, loader):
    r"""Docstring with \\
    a continuation."""
    for batch in loader:
        if batch:
            model(batch.cuda())
        elif x:
            pass
        else:
            t = ("a"
                 "b\\
c")
    # a comment after the loop
    return model


class A:
\tdef f(self):
\t\treturn [1,
\t\t\t2]
  # footer comment at another indent
value = train(torch.nn.Linear(2, 2), [1])
'''


def _check_nodes(source: str, every: int = 1) -> int:
    """Every `every`th node's position, each asked of fresh positions (so each is made from its
    own statement), against libcst's; returns how many were made without the whole module."""
    module = cst.parse_module(source)
    expected = cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    parents = metadata.ParentMap(module)
    partial = 0
    for node in parents.nodes[::every]:
        positions = metadata.Positions(module, parents, source)
        got = positions[node]
        assert got == expected[node], (type(node).__name__, cst.Module([]).code_for_node(node))
        partial += not positions._complete
    return partial


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_statement_positions_equal_libcsts(newline: str) -> None:
    module = cst.parse_module(SOURCE)
    in_statements = sum(1 for s in module.body for _ in metadata.walk(s))
    # every node inside a statement of the module is placed from its own statement
    assert _check_nodes(SOURCE.replace("\n", newline)) == in_statements


def test_a_position_generates_only_its_statement() -> None:
    module = cst.parse_module(SOURCE)
    expected = cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    parents = metadata.ParentMap(module)
    positions = metadata.Positions(module, parents, SOURCE)
    call = next(
        n
        for n in parents.nodes
        if type(n) is cst.Call and type(n.func) is cst.Name and n.func.value == "model"
    )
    assert positions[call] == expected[call]
    assert positions[call].start.line == 21
    assert not positions._complete  # the module was not generated
    assert positions._generated < len(SOURCE) // 10  # only `model(batch.cuda())`'s line
    # A loop asked for itself: its header and its last statement, not its body.
    loop = next(n for n in parents.nodes if type(n) is cst.For)
    fresh = metadata.Positions(module, parents, SOURCE)
    assert fresh[loop] == expected[loop] and not fresh._complete
    assert id(call) not in fresh._spans  # the body's first statement was not generated


def test_without_the_source_or_for_the_module_the_whole_module_is_generated() -> None:
    module = cst.parse_module(SOURCE)
    expected = cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    parents = metadata.ParentMap(module)
    positions = metadata.Positions(module, parents, None)
    name = next(n for n in parents.nodes if type(n) is cst.Name)
    assert positions[name] == expected[name] and positions._complete
    whole = metadata.Positions(module, parents, SOURCE)
    assert whole[module] == expected[module] and whole._complete


def test_a_source_that_is_not_the_trees_falls_back_to_generating_the_module() -> None:
    # The count of line breaks agrees but the text does not: never a guessed position.
    source = "a = 1\nb = 2\n"
    module = cst.parse_module(source)
    parents = metadata.ParentMap(module)
    positions = metadata.Positions(module, parents, "a = 1\nc = 3\n")
    second = module.body[1]
    assert positions[second].start.line == 2 and positions._complete


def test_no_trailing_newline() -> None:
    # the last statement's newline is not in the source: that one is generated with the module
    source = "import torch\nx = torch.zeros(1)\nif x:\n    y = 2"
    assert _check_nodes(source) == sum(
        1 for s in cst.parse_module(source).body[:2] for _ in metadata.walk(s)
    )


CORPUS = Path(__file__).resolve().parents[2] / "benchmarks" / "corpus" / "_repos_test"


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_dir(), reason="corpus not fetched (benchmarks/corpus/fetch.py)")
def test_statement_positions_on_real_files() -> None:
    """Nodes spread over every 40th file of the test split."""
    checked = 0
    for path in sorted(CORPUS.rglob("*.py"))[::40]:
        source = path.read_bytes().decode("utf-8", errors="replace")
        try:
            cst.parse_module(source)
        except cst.ParserSyntaxError:
            continue
        _check_nodes(source, every=max(1, len(source) // 150))
        checked += 1
    assert checked >= 6
