"""Speed shortcuts of issue 30's stop 23 that must give exactly what the slow path gives: the
index's answers by node class grouped in one pass (`nodes.Preorder.ranks_of_type`); the first
rewrite pass reusing the pre-filter's rules (`analyze(active=...)`); the program model's parse
of a file serving as its text's parse for the rewrite's verification (`index.share_file_tree`),
and only where Python reads the file's bytes as that text."""

from __future__ import annotations

import ast
from array import array
from itertools import compress
from pathlib import Path

import libcst as cst
import pytest
from autoopt.rules.zero_grad_set_to_none import ZeroGradSetToNone

from autoopt.lint.engine import analysis
from autoopt.lint.program import index as program_index
from autoopt.lint.program import view
from autoopt.lint.rewrite import apply
from autoopt.lint.rewrite.verify import parse_python
from autoopt.lint.tree import nodes

SOURCE = """\
import torch


def train(model, loader, opt):
    for x in loader:
        opt.zero_grad(set_to_none=False)
        loss = model(x).sum()
        loss.backward()
        opt.step()
    while False:
        pass
    return [y for y in loader]


class Net(torch.nn.Module):
    def forward(self, x):
        return (lambda z: z)(x)
"""

QUESTIONS = [
    cst.Call,
    cst.Name,
    cst.Global,  # a class the tree lacks
    cst.SimpleWhitespace,
    (cst.For, cst.While),
    (cst.FunctionDef, cst.ClassDef, cst.Lambda),
    (cst.Call, cst.Call, cst.Attribute),  # a class named twice
    (cst.Import, cst.Nonlocal),
]


def _one_pass_each(tree: nodes.Preorder, kind: type | tuple[type, ...]) -> array:
    kinds = frozenset(kind if isinstance(kind, tuple) else (kind,))
    return array("i", compress(range(len(tree.nodes)), (type(n) in kinds for n in tree.nodes)))


@pytest.mark.parametrize("compact_from", [10**9, 1])
def test_ranks_by_class_equal_a_pass_per_question(
    monkeypatch: pytest.MonkeyPatch, compact_from: int
) -> None:
    monkeypatch.setattr(nodes, "COMPACT_RANKS_FROM", compact_from)
    tree = nodes.Preorder(cst.parse_module(SOURCE))
    for kind in QUESTIONS:
        assert tree.ranks_of_type(kind) == _one_pass_each(tree, kind), kind
        assert tree.ranks_of_type(kind) is tree.ranks_of_type(kind)  # asked once
    grouped = compact_from > 1
    assert (tree._ranks_by_type is not None) is grouped


def test_first_rewrite_pass_reuses_the_prefilters_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = analysis.active_rules

    def counted(rules, source, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(source)
        return real(rules, source, *args, **kwargs)

    monkeypatch.setattr(analysis, "active_rules", counted)
    monkeypatch.setattr(apply, "active_rules", counted)
    result = apply.fix_source(SOURCE, [ZeroGradSetToNone])
    assert result.changed and result.passes == 2
    # the pre-filter of the original, then the verification's analysis of the edited text:
    # not a third time for the first pass's analysis of the original
    assert calls == [SOURCE, result.source]


def test_a_given_active_list_is_the_one_run() -> None:
    found = analysis.analyze(SOURCE, "<string>", [ZeroGradSetToNone])
    assert [f.code for f in found.findings] == [ZeroGradSetToNone.code]
    assert analysis.analyze(SOURCE, "<string>", [ZeroGradSetToNone], active=[]).findings == []


def _index_file(tmp_path: Path, name: str, data: bytes) -> tuple[str, str]:
    path = tmp_path / name
    path.write_bytes(data)
    text = data.decode("utf-8")
    program_index.TEXT_TREES.clear()
    view._file_index.cache_clear()
    view._file_index(str(path), text)
    return str(path), text


def test_the_files_parse_serves_its_text(tmp_path: Path) -> None:
    path, text = _index_file(tmp_path, "train.py", ("# é\n" + SOURCE).encode("utf-8"))
    tree = program_index.TEXT_TREES.get(text)
    assert tree is not None, "the program model's parse of the file was not shared"
    assert parse_python(text) is tree  # the verification asks for it: no second parse
    assert ast.dump(tree, include_attributes=True) == ast.dump(
        ast.parse(text), include_attributes=True
    )


@pytest.mark.parametrize(
    "data",
    [
        b"\xef\xbb\xbf" + SOURCE.encode(),  # a BOM: Python drops it, the text keeps it
        b"# -*- coding: latin-1 -*-\ns = '\xc3\xa9'\n",  # bytes Python decodes otherwise
    ],
)
def test_a_file_python_reads_otherwise_is_not_shared(tmp_path: Path, data: bytes) -> None:
    _, text = _index_file(tmp_path, "other.py", data)
    assert text not in program_index.TEXT_TREES


def test_text_trees_keep_the_last_few() -> None:
    program_index.TEXT_TREES.clear()
    texts = [f"x = {i}\n" for i in range(program_index._TEXT_TREES_KEPT + 2)]
    for text in texts:
        parse_python(text)
    assert list(program_index.TEXT_TREES) == texts[-program_index._TEXT_TREES_KEPT :]
