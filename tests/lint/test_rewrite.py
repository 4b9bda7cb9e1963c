"""The fix applier: one transform per pass, imports, fixed point, safety, and byte-exact output."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator, Sequence

import libcst as cst
import libcst.matchers as m
import pytest
from libcst.codemod.visitors import ImportItem
from pyflakes import checker as pyflakes_checker

from autoopt.lint.engine.rule import Finding, Fix, FixSafety, Rule
from autoopt.lint.rewrite.apply import RewriteError, fix_source


@pytest.fixture(autouse=True)
def _fixture_names_are_defined(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The fixture rules below write calls of `bar`, `seed` and `wrap`, which stand for
    functions a real script defines: tell pyflakes (which verifies every edit) they exist."""
    monkeypatch.setenv("PYFLAKES_BUILTINS", "bar,seed,wrap")
    # pyflakes reads the variable once per process (functools.cache): an earlier test in the
    # same worker may have read it already, so drop that answer now and after this test.
    pyflakes_checker._custom_builtins.cache_clear()
    yield
    pyflakes_checker._custom_builtins.cache_clear()


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


class RenameFoo(Rule):
    """Safe: `foo(...)` -> `bar(...)`."""

    code = "T001"
    name = "rename-foo"
    message = "use bar"
    fix_safety = FixSafety.SAFE

    def visit_Call(self, node: cst.Call) -> None:
        if m.matches(node.func, m.Name("foo")):
            new = node.with_changes(func=cst.Name("bar"))
            self.report(node, fix=Fix({node: new}, description="foo -> bar"))


class DropEmptyCache(Rule):
    """Unsafe: remove `torch.cuda.empty_cache()` statements."""

    code = "T002"
    name = "drop-empty-cache"
    message = "empty_cache in loop"
    fix_safety = FixSafety.UNSAFE
    triggers = ("empty_cache",)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        stmt = node.body[0]
        if isinstance(stmt, cst.Expr) and self.is_call_to(stmt.value, "torch.cuda.empty_cache"):
            self.report(node, fix=Fix({node: cst.RemoveFromParent()}))


class ZerosFromMake(Rule):
    """Safe, needs an import: `make()` -> `torch.zeros(1)`; drops `from lib import make`."""

    code = "T003"
    name = "make-zeros"
    message = "use torch.zeros"
    fix_safety = FixSafety.SAFE

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "lib.make"):
            new = cst.parse_expression("torch.zeros(1)")
            self.report(
                node,
                fix=Fix(
                    {node: new},
                    add_imports=[ImportItem("torch")],
                    remove_imports=[ImportItem("lib", "make")],
                ),
            )


class SeedBeforeLoop(Rule):
    """Safe, FlattenSentinel: insert `seed()` before each `for` statement at module level."""

    code = "T004"
    name = "seed-before-loop"
    message = "seed first"
    fix_safety = FixSafety.SAFE

    def visit_For(self, node: cst.For) -> None:
        if isinstance(self.parent(node), cst.Module) and not self._seeded(node):
            seed = cst.parse_statement("seed()\n")
            self.report(node, fix=Fix({node: cst.FlattenSentinel([seed, node])}))

    def _seeded(self, node: cst.For) -> bool:
        body = self.context.module.body
        i = next(i for i, s in enumerate(body) if s is node)
        return i > 0 and "seed()" in self.context.module.code_for_node(body[i - 1])


class WrapAssign(Rule):
    """Safe, replaces a whole statement that contains a `foo()` call (overlaps RenameFoo)."""

    code = "T005"
    name = "wrap-assign"
    message = "wrap"
    fix_safety = FixSafety.SAFE

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        stmt = node.body[0]
        if m.matches(stmt, m.Assign(targets=[m.AssignTarget(m.Name("y"))])) and not m.matches(
            stmt.value, m.Call(func=m.Name("wrap"))
        ):
            new_stmt = stmt.with_changes(value=cst.parse_expression(f"wrap({_code(stmt.value)})"))
            self.report(node, fix=Fix({node: node.with_changes(body=[new_stmt])}))


class Flip(Rule):
    """Oscillates: a -> b and b -> a."""

    code = "T006"
    name = "flip"
    message = "flip"
    fix_safety = FixSafety.SAFE

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in ("aa", "bb"):
            other = "bb" if node.value == "aa" else "aa"
            self.report(node, fix=Fix({node: node.with_changes(value=other)}))


class Grow(Rule):
    """Never converges: `x = [x]` forever."""

    code = "T007"
    name = "grow"
    message = "grow"
    fix_safety = FixSafety.SAFE

    def visit_List(self, node: cst.List) -> None:
        if isinstance(self.parent(node), cst.Assign):  # the outermost list only
            self.report(node, fix=Fix({node: cst.List([cst.Element(node)])}))


class ReportOnly(Rule):
    """Reports `nofix()` without a fix; the reason is in the message."""

    code = "T008"
    name = "report-only"
    message = "cannot fix"

    def visit_Call(self, node: cst.Call) -> None:
        if m.matches(node.func, m.Name("nofix")):
            self.report(node, "cannot fix: the reason")


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def test_safe_fix_keeps_comments_and_formatting_byte_for_byte() -> None:
    code = src(
        """
        # header comment
        import os   # odd  spacing kept


        def f( a ,b ):  # comment
            return foo(a,  b)   # trailing
        x = [1,
             2]  # more
        """
    )
    result = fix_source(code, [RenameFoo])
    assert result.source == code.replace("foo(a,  b)", "bar(a,  b)")
    assert [(a.code, a.description, a.line) for a in result.applied] == [("T001", "foo -> bar", 6)]
    assert result.changed


def test_all_non_overlapping_fixes_apply_in_one_pass() -> None:
    code = "foo()\nfoo(1)\nz = foo(foo(2))\n"
    result = fix_source(code, [RenameFoo])
    assert result.source == "bar()\nbar(1)\nz = bar(bar(2))\n"
    # the nested call overlaps its parent: it is fixed on the second pass
    assert len(result.applied) == 4
    assert result.passes == 3  # two passes that change, one that finds nothing


def test_unsafe_fix_only_with_unsafe() -> None:
    code = src(
        """
        import torch
        for _ in range(3):
            torch.cuda.empty_cache()
            step()
        """
    )
    safe = fix_source(code, [DropEmptyCache])
    assert safe.source == code
    assert [f.code for f in safe.unsafe_available] == ["T002"]
    unsafe = fix_source(code, [DropEmptyCache], unsafe=True)
    assert unsafe.source == "import torch\nfor _ in range(3):\n    step()\n"
    assert not unsafe.unsafe_available


def test_removal_of_the_only_statement_leaves_valid_code() -> None:
    code = "import torch\nif x:\n    torch.cuda.empty_cache()\n"
    result = fix_source(code, [DropEmptyCache], unsafe=True)
    cst.parse_module(result.source)
    assert result.source == "import torch\nif x:\n    pass\n"


def test_fix_adds_needed_import_and_removes_stale_one() -> None:
    code = src(
        '''
        """Doc."""
        from lib import make

        t = make()
        '''
    )
    result = fix_source(code, [ZerosFromMake])
    assert result.source == '"""Doc."""\nimport torch\n\nt = torch.zeros(1)\n'


def test_import_still_used_is_kept() -> None:
    code = "import torch\nfrom lib import make\n\nt = make()\nf = make\n"
    result = fix_source(code, [ZerosFromMake])
    assert result.source == "import torch\nfrom lib import make\n\nt = torch.zeros(1)\nf = make\n"


def test_flatten_sentinel_inserts_statements() -> None:
    code = "x = 1\nfor i in range(2):\n    pass\n"
    result = fix_source(code, [SeedBeforeLoop])
    assert result.source == "x = 1\nseed()\nfor i in range(2):\n    pass\n"


def test_overlapping_fixes_of_two_rules_both_land() -> None:
    code = "y = foo()\n"
    result = fix_source(code, [RenameFoo, WrapAssign])
    assert result.source == "y = wrap(bar())\n"
    assert sorted(a.code for a in result.applied) == ["T001", "T005"]


def test_oscillation_is_a_clear_error() -> None:
    with pytest.raises(RewriteError, match="oscillate"):
        fix_source("aa = 1\n", [Flip])


def test_runaway_is_a_clear_error() -> None:
    with pytest.raises(RewriteError, match="no fixed point"):
        fix_source("x = []\n", [Grow], max_passes=4)


def test_declined_findings_are_reported_and_code_untouched() -> None:
    code = "nofix()\nfoo()\n"
    result = fix_source(code, [ReportOnly, RenameFoo])
    assert result.source == "nofix()\nbar()\n"
    assert [(f.code, f.message, f.line) for f in result.declined] == [
        ("T008", "cannot fix: the reason", 1)
    ]


def test_finding_filter_drops_suppressed_fixes() -> None:
    code = "foo()  # keep\nfoo()\n"

    def no_keep(findings: Sequence[Finding], source: str) -> list[Finding]:
        lines = source.splitlines()
        return [f for f in findings if "# keep" not in lines[f.line - 1]]

    result = fix_source(code, [RenameFoo], finding_filter=no_keep)
    assert result.source == "foo()  # keep\nbar()\n"


def test_nothing_to_fix_returns_the_same_text() -> None:
    code = "x = 1  # c\n"
    result = fix_source(code, [RenameFoo, DropEmptyCache])
    assert result.source == code
    assert not result.changed and not result.applied and result.passes == 1


def test_unparsable_source_raises_parser_error() -> None:
    with pytest.raises(cst.ParserSyntaxError):
        fix_source("def (:\n", [RenameFoo])


def test_a_file_no_rule_can_match_is_not_parsed_by_libcst(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoopt.lint.engine import analysis as engine
    from autoopt.lint.engine.registry import load_registry

    parsed: list[str] = []
    real_parse = cst.parse_module

    def spy(source: str) -> cst.Module:
        parsed.append(source)
        return real_parse(source)

    monkeypatch.setattr(engine.cst, "parse_module", spy)
    rules = load_registry().all()
    plain = "def add(a, b):\n    return a + b\n"
    result = fix_source(plain, rules, unsafe=True)
    assert result.source == plain and not result.applied
    assert parsed == []  # the text pre-filter and a compile() were enough
    training = "import torch\nfor x, y in loader:\n    loss = model(x)\n    loss.backward()\n"
    fix_source(training, rules, unsafe=True)
    assert parsed, "a file a rule can match is parsed and analysed"
    with pytest.raises(cst.ParserSyntaxError):
        fix_source("def broken(:\n    pass\n", rules)  # still refused, as before
