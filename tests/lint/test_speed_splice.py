"""Speed shortcuts that must give exactly what the slow path gives: rewrite's spliced code
(`rewrite.fixed_code`) equals generating the fixed module, verification's parse of an edit
(`rewrite.parse_edited`) equals a parse of the whole text, the index's per-class child pushers
equal a descent through every field, and verification asks pyflakes about the original text
only when the edited one has an undefined name."""

from __future__ import annotations

import libcst as cst
import pytest

from autoopt.lint.engine import analysis as engine
from autoopt.lint.engine.rule import Fix, ImportItem
from autoopt.lint.rewrite import apply as rewrite
from autoopt.lint.rewrite import verify
from autoopt.lint.tree import metadata, nodes

SOURCE = """\
#!/usr/bin/env python
# header comment

import torch


# leading comment of main
def main(loader):
    model = torch.nn.Linear(2, 2).cuda()
    for x in loader:
        y = model(x.to("cuda"))

        # a comment at the end of the loop body
    # a dedented comment after it
    return [v for a in loader for v in a if v], {k: v for k, v in y}


if __name__ == "__main__":
    main([1, 2])
    x = (1 +
         2)
    s = '''two
lines'''
# footer comment
"""


def _calls(module: cst.Module, name: str) -> list[cst.Call]:
    return [
        c
        for c in nodes.nodes_of_type(module, cst.Call)
        if isinstance(c.func, cst.Attribute) and c.func.attr.value == name
    ]


def _indexed(source: str) -> cst.Module:
    module = cst.parse_module(source)
    nodes.index_tree(module)
    return module


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_spliced_code_equals_the_generated_module(newline: str) -> None:
    source = SOURCE.replace("\n", newline)
    module = _indexed(source)
    assert metadata.statement_offsets(module, source) is not None  # the splice path is taken
    to_call = _calls(module, "to")[0]
    inner = Fix({to_call: to_call.with_changes(args=[*to_call.args, cst.Arg(cst.Name("y"))])})
    guard = module.body[-1]
    assert isinstance(guard, cst.If)
    inserted = cst.parse_statement("print('after')\n")
    around = Fix({guard: cst.FlattenSentinel([guard, inserted])})
    removed = Fix({module.body[1]: cst.RemoveFromParent()})
    for fixes in ([inner], [around], [removed], [inner, around]):
        expected = rewrite.apply_fixes(module, fixes).code
        assert rewrite.fixed_code(module, fixes, source) == expected
        assert expected != source


def test_an_edit_is_parsed_as_the_whole_text_would_be() -> None:
    """Verification parses only the statements an edit generated (`parse_edited`), joined with
    the parsed original's other statements: the tree of a parse of the whole text."""
    module = _indexed(SOURCE)
    to_call = _calls(module, "to")[0]
    inner = Fix({to_call: to_call.with_changes(args=[*to_call.args, cst.Arg(cst.Name("y"))])})
    guard = module.body[-1]
    around = Fix({guard: cst.FlattenSentinel([guard, cst.parse_statement("print('after')\n")])})
    removed = Fix({module.body[1]: cst.RemoveFromParent()})
    for fixes in ([inner], [around], [removed], [inner, around]):
        text = rewrite.fixed_code(module, fixes, SOURCE)
        parsed = rewrite.parse_edited(text)
        assert parsed.deep_equals(cst.parse_module(text)) and parsed.code == text
        assert parsed.body[0] is module.body[0]  # spliced: the kept statements are reused
    assert rewrite.parse_edited(SOURCE).body[0] is not module.body[0]  # not the text made last


def test_an_edit_that_changes_the_inferred_indentation_is_parsed_whole() -> None:
    # The file's indentation is its first block's: removing the 2-space `if` makes it 4
    # spaces, which the kept `def` (recorded as indented otherwise) must not keep.
    source = "x = 1\nif x:\n  y = 2\ndef f():\n    z = 3\n"
    module = _indexed(source)
    text = rewrite.fixed_code(module, [Fix({module.body[1]: cst.RemoveFromParent()})], source)
    assert text == "x = 1\ndef f():\n    z = 3\n"
    assert rewrite.parse_edited(text).deep_equals(cst.parse_module(text))


def test_statement_offsets_place_every_statement() -> None:
    module = _indexed(SOURCE)
    offsets = metadata.statement_offsets(module, SOURCE)
    assert offsets is not None
    for i, statement in enumerate(module.body):
        assert SOURCE[offsets[i] : offsets[i + 1]] == module.code_for_node(statement)
    assert SOURCE[offsets[-1] :] == "# footer comment\n"


def test_splice_declines_what_it_cannot_place() -> None:
    no_newline = SOURCE.rstrip("\n")
    assert metadata.statement_offsets(_indexed(no_newline), no_newline) is None
    other = cst.parse_module(SOURCE)  # not the tree indexed last
    _indexed("x = 1\n")
    assert metadata.statement_offsets(other, SOURCE) is None
    # imports added by libcst: the whole module is generated, and still equal
    module = _indexed(SOURCE)
    call = _calls(module, "cuda")[0]
    fix = Fix({call: call.with_changes(args=[cst.Arg(cst.Name("dev"))])}, add_imports=[])
    fix_imports = Fix(
        {call: call.with_changes(args=[cst.Arg(cst.Name("dev"))])},
        add_imports=[ImportItem("os")],
    )
    for fixes in ([fix], [fix_imports]):
        assert rewrite.fixed_code(module, fixes, SOURCE) == rewrite.apply_fixes(module, fixes).code
    assert "import os" in rewrite.fixed_code(module, [fix_imports], SOURCE)


def test_index_pushers_equal_a_descent_through_every_field() -> None:
    module = cst.parse_module(
        SOURCE
        + "if a:\n    pass\nelif b:\n    pass\nelse:\n    pass\n"
        + "from . import (x as y, z)\nlambda *a, b=1, **k: (yield)\nf'{a!r:>{w}}'\n"
        + "try:\n    pass\nexcept* E as e:\n    pass\nfinally:\n    pass\n"
        + "match p:\n    case [1, *r] | {'k': v, **kw} if v:\n        pass\n"
        + "async def g():\n    async with a as (b, c):\n        await d\n"
    )
    assert nodes.Preorder(module).nodes == list(nodes._descend(module, True))


def test_pyflakes_on_the_original_only_when_the_edit_has_an_undefined_name() -> None:
    asked: list[str] = []

    def before_names() -> verify.Names | None:
        asked.append("before")
        return verify.unbound_names("import torch\nx = 1\n")

    clean = verify.verify_edit(
        "import torch\nx = 1\n", "import torch\nx = 2\n", rules=[], before_unbound=before_names
    )
    assert clean.ok and asked == []
    broken = verify.verify_edit(
        "import torch\nx = 1\n", "import torch\nx = y\n", rules=[], before_unbound=before_names
    )
    assert not broken.ok and asked == ["before"]


LARGE = """\
# header
import torch

x = 1
y = 2


# a comment before a decorated function
@decorator
def f(a):
    return a

    # an indented comment ending the block
z = 3
class C:
    pass
# a comment at column 0
w = [
    1,
]
"""


def test_parse_large_gives_the_tree_of_a_whole_parse() -> None:
    whole = cst.parse_module(LARGE)
    for chunk_lines in (1, 2, 3, 5):
        module = engine.parse_large(LARGE, chunk_lines)
        assert module is not None
        assert module.deep_equals(whole)
        assert module.code == LARGE
    assert engine.parse_large("x = (\n") is None  # syntax errors: parsed whole, as before
    assert engine.parse_large("x = 1\r\ny = 2\r\n", 1) is not None
    assert engine.parse_large("x = 1\ry = 2\r", 1) is None  # lines `ast` counts otherwise


def test_lint_of_a_large_file_in_chunks_equals_the_whole_parse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autoopt.lint.engine.registry import load_registry
    from autoopt.lint.engine.runner import lint_bytes

    source = (LARGE + "for b in loader:\n    b = b.cuda()\n    model(b).backward()\n") * 3
    rules = list(load_registry().rules.values())
    whole = lint_bytes(source.encode(), "t.py", rules)
    calls: list[int] = []
    real = engine.parse_large
    monkeypatch.setattr(engine, "LARGE_FILE_LINES", 10)
    monkeypatch.setattr(engine, "parse_large", lambda s: calls.append(1) or real(s, 4))
    chunked = lint_bytes(source.encode(), "t.py", rules)
    assert calls and chunked.diagnostics == whole.diagnostics and whole.diagnostics


def test_the_program_index_of_a_large_file_in_chunks_equals_the_whole_parse(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """The program model indexes a long module a run of top-level statements at a time (its
    whole `ast` is 180 MB for 50k lines): the same index, line numbers included, as one parse."""
    from autoopt.lint.program import index as program_index

    source = (
        LARGE
        + "class Net:\n    def forward(self, x):\n        return self.f(x)\n\n"
        + "def train(model, loader, opt):\n    for b in loader:\n        model(b).backward()\n"
        + "        opt.step()\n\n"
        + "import torch\nfor epoch in range(3):\n    train(model, loader, opt)\n"
    ) * 3
    path = tmp_path / "t.py"
    whole = program_index.index_source(path, source, program_index.parse_tree(source))
    monkeypatch.setattr(program_index, "LARGE_FILE_LINES", 10)
    monkeypatch.setattr(program_index, "CHUNK_LINES", 7)
    parsed: list[int] = []
    real = program_index.parse_tree
    monkeypatch.setattr(program_index, "parse_tree", lambda s: parsed.append(len(s)) or real(s))
    chunked = program_index.index_source(path, source)
    assert len(parsed) > 2 and max(parsed) < len(source)  # in runs, never whole
    assert chunked == whole
    assert chunked.functions["train"].calls[0].line == whole.functions["train"].calls[0].line
