"""The rewrite engine (`autoopt.lint.rewrite.fix_source`) where test_rewrite.py does not look:
which edits verification keeps and why (suppressions, the target version, a finding the next
pass fixes, a finding no fix removes), a rejected fix never retried but its alternative tried,
fixes that break the syntax alone or only together, fixes that change nothing, and a file
CPython cannot parse that libcst can. Each test kills mutants of `autoopt/lint/rewrite.py` the
others left alive (docs/benchmarks/mutation.md).

The fixture rules write calls of `bar`, `baz` and `f`, which every source here defines, so the
names verification checks are bound."""

from __future__ import annotations

import sys

import libcst as cst
import libcst.matchers as m
import pytest

from autoopt.lint.rewrite import AppliedFix, RejectedFix, RewriteError, SkippedFix, fix_source
from autoopt.lint.rule import Fix, FixSafety, Rule
from autoopt.lint.suppress import filter_findings

DEFS = "def foo(*a): ...\ndef bar(*a): ...\ndef baz(*a): ...\n"


def _calls(node: cst.Call, name: str) -> bool:
    return m.matches(node.func, m.Name(name))


class Rename(Rule):
    """Safe: `foo(...)` -> `bar(...)`."""

    code = "XR01"
    name = "rename"
    message = "use bar"
    fix_safety = FixSafety.SAFE

    def visit_Call(self, node: cst.Call) -> None:
        if _calls(node, "foo"):
            new = node.with_changes(func=cst.Name("bar"))
            self.report(node, fix=Fix({node: new}, description="foo -> bar"))


class NoBarOfFoo(Rule):
    """No fix: flags `bar(foo(...))`."""

    code = "XR02"
    name = "no-bar-of-foo"
    message = "bar of foo"

    def visit_Call(self, node: cst.Call) -> None:
        inner = node.args[0].value if node.args else None
        if _calls(node, "bar") and isinstance(inner, cst.Call) and _calls(inner, "foo"):
            self.report(node)


class Alternatives(Rule):
    """Two fixes for one `foo()`: `bar()` (no description) and `baz()`."""

    code = "XR03"
    name = "alternatives"
    message = "pick one"
    fix_safety = FixSafety.SAFE

    def visit_Call(self, node: cst.Call) -> None:
        if _calls(node, "foo"):
            self.report(node, fix=Fix({node: node.with_changes(func=cst.Name("bar"))}))
            new = node.with_changes(func=cst.Name("baz"))
            self.report(node, fix=Fix({node: new}, description="to baz"))


class NoBar(Rule):
    """No fix: flags every `bar(...)`."""

    code = "XR04"
    name = "no-bar"
    message = "no bar"

    def visit_Call(self, node: cst.Call) -> None:
        if _calls(node, "bar"):
            self.report(node)


def _bar_to_baz(safety: FixSafety, applies_to: tuple = (None, None)) -> type[Rule]:
    class BarToBaz(Rule):
        """`bar(...)` -> `baz(...)`, with the given safety."""

        code = "XR05"
        name = "bar-to-baz"
        message = "use baz"
        fix_safety = safety
        applies_to_versions = applies_to

        def visit_Call(self, node: cst.Call) -> None:
            if _calls(node, "bar"):
                new = node.with_changes(func=cst.Name("baz"))
                self.report(node, fix=Fix({node: new}, description="bar -> baz"))

    return BarToBaz


class NoBarBeforeTorch2(Rule):
    """No fix: flags `bar(...)` in code for torch < 2.0 only."""

    code = "XR06"
    name = "no-bar-before-2"
    message = "no bar before torch 2"
    applies_to_versions = (None, (2, 0))

    def visit_Call(self, node: cst.Call) -> None:
        if _calls(node, "bar"):
            self.report(node)


class AssignToCall(Rule):
    """A broken fix: `x = 1` -> `f() = 1` (libcst writes it, CPython rejects it)."""

    code = "XR07"
    name = "assign-to-call"
    message = "broken"
    fix_safety = FixSafety.SAFE

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        stmt = node.body[0]
        if m.matches(stmt, m.Assign(targets=[m.AssignTarget(m.Name("x"))])):
            target = cst.AssignTarget(cst.parse_expression("f()"))
            new = node.with_changes(body=[stmt.with_changes(targets=[target])])  # type: ignore[union-attr]
            self.report(node, fix=Fix({node: new}))


class Positional(Rule):
    """`f(a, k=b)`: `k=b` -> `b` (fine alone)."""

    code = "XR08"
    name = "positional"
    message = "positional"
    fix_safety = FixSafety.SAFE

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None and node.keyword.value == "k":
            self.report(
                node,
                fix=Fix({node: node.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)}),
            )


class Keyword(Rule):
    """`f(a, k=b)`: `a` -> `j=a` (fine alone; with XR08's fix a positional follows a keyword)."""

    code = "XR09"
    name = "keyword"
    message = "keyword"
    fix_safety = FixSafety.SAFE

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is None and m.matches(node.value, m.Name("a")):
            self.report(node, fix=Fix({node: node.with_changes(keyword=cst.Name("j"))}))


class NoOp(Rule):
    """A fix that writes the same text: `foo()` -> `foo()`."""

    code = "XR10"
    name = "no-op"
    message = "same"
    fix_safety = FixSafety.SAFE

    def visit_Call(self, node: cst.Call) -> None:
        if _calls(node, "foo"):
            self.report(node, fix=Fix({node: node.deep_clone()}))


# --- verification: which edits are kept ------------------------------------------------------


def test_a_rejected_fix_is_not_retried_but_the_one_it_hid_is() -> None:
    """`foo(foo(2))`: the outer rename overlaps the inner one, which waits for the next pass.
    The outer one writes what XR02 flags and is rejected; the inner one is then applied (in a
    later pass the outer call reads `foo(bar(2))`, a new edit, and passes)."""
    code = DEFS + "z = foo(foo(2))\n"
    result = fix_source(code, [Rename, NoBarOfFoo])
    assert result.source == DEFS + "z = bar(bar(2))\n"
    assert result.rejected == [
        RejectedFix(
            "XR01", "foo -> bar", 4, "the result would be flagged XR02 at line 4 (bar of foo)"
        )
    ]
    assert [(a.code, a.line) for a in result.applied] == [("XR01", 4), ("XR01", 4)]


def test_of_two_fixes_for_one_finding_the_one_that_verifies_is_kept() -> None:
    code = DEFS + "foo()\n"
    result = fix_source(code, [Alternatives, NoBar])
    assert result.source == DEFS + "baz()\n"
    # No description: the rejection names the finding's message.
    assert result.rejected == [
        RejectedFix("XR03", "pick one", 4, "the result would be flagged XR04 at line 4 (no bar)")
    ]
    assert result.applied == [AppliedFix("XR03", "to baz", 4)]
    assert not result.declined and not result.unsafe_available  # XR03 is listed as rejected


def test_a_new_finding_that_is_suppressed_does_not_reject_the_edit() -> None:
    code = DEFS + "foo()  # noqa: XR04\nfoo()\n"
    result = fix_source(code, [Rename, NoBar], finding_filter=filter_findings)
    assert result.source == DEFS + "bar()  # noqa: XR04\nfoo()\n"
    assert [(r.code, r.line) for r in result.rejected] == [("XR01", 5)]


@pytest.mark.parametrize(
    ("safety", "unsafe", "fixed"),
    [
        (FixSafety.SAFE, False, True),
        (FixSafety.UNSAFE, True, True),
        (FixSafety.UNSAFE, False, False),
    ],
)
def test_a_new_finding_the_next_pass_fixes_does_not_reject_the_edit(
    safety: FixSafety, unsafe: bool, fixed: bool
) -> None:
    """foo -> bar makes XR05 fire; XR05's fix (bar -> baz) counts only where it may apply."""
    code = DEFS + "foo()\n"
    result = fix_source(code, [Rename, _bar_to_baz(safety)], unsafe=unsafe)
    if fixed:
        assert result.source == DEFS + "baz()\n"
        assert [a.code for a in result.applied] == ["XR01", "XR05"]
        assert not result.rejected
    else:
        assert result.source == code
        assert result.rejected == [
            RejectedFix(
                "XR01", "foo -> bar", 4, "the result would be flagged XR05 at line 4 (use baz)"
            )
        ]


@pytest.mark.parametrize(("version", "fixed"), [((2, 1), True), ((1, 13), False), (None, False)])
def test_verification_checks_the_rules_of_the_target_version(
    version: tuple[int, int] | None, fixed: bool
) -> None:
    code = DEFS + "foo()\n"
    result = fix_source(code, [Rename, NoBarBeforeTorch2], target_version=version)
    assert result.source == (DEFS + "bar()\n" if fixed else code)
    assert bool(result.rejected) is not fixed


# --- fixes that fail -------------------------------------------------------------------------


def test_a_fix_that_breaks_the_syntax_is_skipped_and_the_others_applied() -> None:
    code = DEFS + "x = 1\nfoo()\n"
    result = fix_source(code, [AssignToCall, Rename])
    assert result.source == DEFS + "x = 1\nbar()\n"
    (skipped,) = result.skipped
    assert skipped.code == "XR07"
    assert skipped.reason.startswith("its fix failed: SyntaxError: cannot assign to function call")
    assert not result.rejected
    assert result.applied == [AppliedFix("XR01", "foo -> bar", 5)]


def test_fixes_that_break_the_syntax_only_together_are_all_left_out() -> None:
    """Each fix alone is fine; together a positional argument follows a keyword one (libcst
    refuses to build the call). Neither is applied, and both are named with the error (the
    rules are dropped for this file)."""
    code = "def f(*a, **k): ...\na = b = 1\nf(a, k=b)\n"
    result = fix_source(code, [Positional, Keyword])
    assert result.source == code and not result.applied
    reason = (
        "its fix failed together with XR08, XR09: CSTValidationError: Cannot have positional "
        "argument after keyword argument."
    )
    assert result.skipped == [SkippedFix("XR08", reason), SkippedFix("XR09", reason)]
    assert result.passes == 2  # the pass that failed, then one without the two rules


def test_a_fix_that_changes_nothing_ends_the_rewrite() -> None:
    code = DEFS + "foo()\n"
    result = fix_source(code, [NoOp])
    assert result.source == code and not result.applied and result.passes == 1


def test_a_fix_that_changes_nothing_does_not_hide_the_others_findings() -> None:
    code = DEFS + "foo()\nbar()\n"
    result = fix_source(code, [NoOp, NoBar, _bar_to_baz(FixSafety.UNSAFE)])
    assert result.source == code
    assert [f.code for f in result.declined] == ["XR04"]
    assert [f.code for f in result.unsafe_available] == ["XR05"]


@pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="needs a text libcst parses and this CPython does not"
)
def test_a_file_this_cpython_cannot_parse_is_still_fixed() -> None:
    """PEP 695 syntax (Python 3.12) under an older CPython: libcst reads it, `ast` does not.
    Fixes are not blamed for a syntax error that was there before, and are applied."""
    code = DEFS + "type Vector = list[float]\nfoo()\n"
    result = fix_source(code, [Rename])
    assert result.source == DEFS + "type Vector = list[float]\nbar()\n"
    assert not result.skipped and not result.rejected
    assert [a.code for a in result.applied] == ["XR01"]


def test_oscillation_names_the_rules_and_the_pass() -> None:
    class Back(Rule):
        code = "XR11"
        name = "back"
        message = "back"
        fix_safety = FixSafety.SAFE

        def visit_Call(self, node: cst.Call) -> None:
            if _calls(node, "bar"):
                self.report(node, fix=Fix({node: node.with_changes(func=cst.Name("foo"))}))

    with pytest.raises(RewriteError) as info:
        fix_source(DEFS + "foo()\n", [Rename, Back], path="train.py")
    assert str(info.value) == (
        "train.py: fixes oscillate (pass 2 recreated an earlier version; rules XR11)"
    )


def test_skipped_rules_stay_out_of_later_passes() -> None:
    """XR07's fix is skipped once: its rule is dropped for the file, not retried each pass."""
    code = DEFS + "x = 1\nz = foo(foo(1))\n"
    result = fix_source(code, [AssignToCall, Rename])
    assert result.source == DEFS + "x = 1\nz = bar(bar(1))\n"
    assert [s.code for s in result.skipped] == ["XR07"]
    assert isinstance(result.skipped[0], SkippedFix)
