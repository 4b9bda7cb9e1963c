"""The rewrite engine (`autoopt.lint.rewrite.apply.fix_source`) where test_rewrite.py does not look:
which edits verification keeps and why (suppressions, the target version, a finding the next
pass fixes, a finding no fix removes), a rejected fix never retried but its alternative tried,
fixes that break the syntax alone or only together, fixes that change nothing, and a file
CPython cannot parse that libcst can. Each test kills mutants of `autoopt/lint/rewrite/apply.py` the
others left alive (docs/benchmarks/mutation.md).

The fixture rules write calls of `bar`, `baz` and `f`, which every source here defines, so the
names verification checks are bound."""

from __future__ import annotations

import sys

import libcst as cst
import libcst.matchers as m
import pytest
from libcst.codemod.visitors import ImportItem

from autoopt.lint.engine.analysis import analyze
from autoopt.lint.engine.rule import Fix, FixSafety, Rule
from autoopt.lint.engine.suppress import filter_findings
from autoopt.lint.rewrite.apply import (
    AppliedFix,
    RejectedFix,
    RewriteError,
    SkippedFix,
    apply_fixes,
    fix_source,
)

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
    assert result.passes == 2  # the other fixes applied in the pass that skipped XR07


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


# --- imports, shared and empty fixes, the module itself ---------------------------------------


class ImportOnly(Rule):
    """At each `need_torch()`: a fix that only adds `import torch` (one Fix object for all)."""

    code = "XR12"
    name = "import-only"
    message = "needs torch"
    fix_safety = FixSafety.SAFE
    items: tuple = (ImportItem("torch"),)

    def visit_Module(self, node: cst.Module) -> None:
        self._fix = Fix({}, description="import", add_imports=list(self.items))
        # libcst adds a relative import again on every pass: the rule stops once one is there
        self._done = "import" in node.code

    def visit_Call(self, node: cst.Call) -> None:
        if _calls(node, "need_torch") and not self._done:
            self.report(node, fix=self._fix)


def test_an_import_only_fix_shared_by_two_findings_is_applied_once() -> None:
    code = "need_torch()\nneed_torch()\n"
    result = fix_source(code, [ImportOnly])
    assert result.source == "import torch\n\n" + code
    assert result.applied == [AppliedFix("XR12", "import", 1)]


@pytest.mark.parametrize(
    ("item", "line"),
    [
        (
            ImportItem("torch.amp", "GradScaler", "Scaler"),
            "from torch.amp import GradScaler as Scaler",
        ),
        (ImportItem("numpy", alias="np"), "import numpy as np"),
        (ImportItem("helpers", "seed", relative=1), "from .helpers import seed"),
    ],
)
def test_added_imports_are_written_as_asked(item: ImportItem, line: str) -> None:
    class Asked(ImportOnly):
        items = (item,)

    result = fix_source("need_torch()\n", [Asked])
    assert result.source == f"{line}\n\nneed_torch()\n"


class RemoveOnly(Rule):
    """At `mk()`: the statement removed, and with it the import of `make` as `mk`, now
    unused."""

    code = "XR13"
    name = "remove-only"
    message = "drop"
    fix_safety = FixSafety.SAFE

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        stmt = node.body[0]
        if isinstance(stmt, cst.Expr) and m.matches(stmt.value, m.Call(m.Name("mk"))):
            fix = Fix(
                {node: cst.RemoveFromParent()},
                remove_imports=[ImportItem("lib", "make", "mk")],
            )
            self.report(node, fix=fix)


def test_an_aliased_import_made_unused_is_removed() -> None:
    result = fix_source("from lib import make as mk\nmk()\nx = 1\n", [RemoveOnly])
    assert result.source == "x = 1\n"


class RemoveImportOnly(Rule):
    """A fix with no replacement that only removes `import os` (if unused)."""

    code = "XR14"
    name = "remove-import-only"
    message = "no os"
    fix_safety = FixSafety.SAFE

    def visit_Import(self, node: cst.Import) -> None:
        self.report(node, fix=Fix({}, remove_imports=[ImportItem("os")]))


def test_a_fix_that_only_removes_an_import_is_applied() -> None:
    result = fix_source("import os\nx = 1\n", [RemoveImportOnly])
    assert result.source == "x = 1\n"


class Empty(Rule):
    """A fix that does nothing at all (no replacement, no import) on `foo()`."""

    code = "XR00"  # sorts before XR01 on the same call
    name = "empty"
    message = "empty"
    fix_safety = FixSafety.SAFE

    def visit_Call(self, node: cst.Call) -> None:
        if _calls(node, "foo"):
            self.report(node, fix=Fix({}))


def test_an_empty_fix_is_passed_over_and_the_next_ones_applied() -> None:
    code = DEFS + "foo()\nfoo(1)\n"
    result = fix_source(code, [Empty, Rename])
    assert result.source == DEFS + "bar()\nbar(1)\n"
    assert result.passes == 2


class ReplaceModule(Rule):
    """A broken fix: the whole module replaced by an expression."""

    code = "XR15"
    name = "replace-module"
    message = "module"
    fix_safety = FixSafety.SAFE

    def visit_Module(self, node: cst.Module) -> None:
        if "replace_me" in node.code:
            self.report(node, fix=Fix({node: cst.Name("x")}))


def test_a_fix_that_replaces_the_module_is_skipped_with_the_reason() -> None:
    code = DEFS + "replace_me = 1\nfoo()\n"
    result = fix_source(code, [ReplaceModule, Rename])
    assert result.source == DEFS + "replace_me = 1\nbar()\n"
    assert result.skipped == [
        SkippedFix(
            "XR15",
            "its fix failed: RewriteError: a fix replaced the whole module with something else",
        )
    ]


# --- passes ------------------------------------------------------------------------------------


def test_max_passes_is_the_number_of_passes_allowed() -> None:
    """`foo(foo(foo(1)))` takes 3 passes that change and a 4th that finds nothing."""
    code = DEFS + "foo(foo(foo(1)))\n"
    assert fix_source(code, [Rename], max_passes=4).passes == 4
    with pytest.raises(RewriteError, match="^<string>: no fixed point after 3 passes of fixes$"):
        fix_source(code, [Rename], max_passes=3)


def test_fixes_after_an_overlap_are_applied_in_the_same_pass() -> None:
    code = DEFS + "z = foo(foo(2))\nfoo(3)\n"
    result = fix_source(code, [Rename])
    assert result.source == DEFS + "z = bar(bar(2))\nbar(3)\n"
    assert [a.line for a in result.applied] == [4, 5, 4]  # pass 1: line 4's outer call and 5


def test_a_rule_of_another_torch_version_does_not_cost_a_parse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the target version, no rule applies to the file: nothing is parsed with libcst and
    the version-gated rule's fix is not applied."""
    from autoopt.lint.engine import analysis as engine

    parsed: list[str] = []
    real = cst.parse_module
    monkeypatch.setattr(engine.cst, "parse_module", lambda s: parsed.append(s) or real(s))
    old_only = _bar_to_baz(FixSafety.SAFE, applies_to=(None, (2, 0)))
    code = DEFS + "bar()\n"
    assert fix_source(code, [old_only], target_version=(2, 1)).source == code
    assert parsed == []
    assert fix_source(code, [old_only, Rename], target_version=(2, 1)).source == code
    assert fix_source(code, [old_only], target_version=(1, 13)).source == DEFS + "baz()\n"


def test_errors_name_the_file_or_a_string() -> None:
    with pytest.raises(RewriteError, match=r"^<string>: fixes oscillate"):
        fix_source("aa = 1\n", [Flip])


class Flip(Rule):
    """Oscillates: aa -> bb -> aa."""

    code = "XR16"
    name = "flip"
    message = "flip"
    fix_safety = FixSafety.SAFE

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in ("aa", "bb"):
            other = "bb" if node.value == "aa" else "aa"
            self.report(node, fix=Fix({node: node.with_changes(value=other)}))


class UnsafeQux(Rule):
    """Unsafe: `qux()` -> `baz()`."""

    code = "XR17"
    name = "unsafe-qux"
    message = "qux"
    fix_safety = FixSafety.UNSAFE

    def visit_Call(self, node: cst.Call) -> None:
        if _calls(node, "qux"):
            self.report(node, fix=Fix({node: node.with_changes(func=cst.Name("baz"))}))


def test_after_a_rejection_the_unsafe_fixes_held_back_are_still_listed() -> None:
    code = DEFS + "def qux(): ...\nfoo()\nqux()\nbar()\n"
    result = fix_source(code, [Rename, NoBar, UnsafeQux])
    assert result.source == code
    assert [r.code for r in result.rejected] == ["XR01"]
    assert [f.code for f in result.unsafe_available] == ["XR17"]
    assert [(f.code, f.line) for f in result.declined] == [("XR04", 7)]


class Cycle(Rule):
    """aa -> bb -> cc -> bb: the third pass recreates the first pass's text."""

    code = "XR18"
    name = "cycle"
    message = "cycle"
    fix_safety = FixSafety.SAFE

    def visit_Name(self, node: cst.Name) -> None:
        other = {"aa": "bb", "bb": "cc", "cc": "bb"}.get(node.value)
        if other is not None:
            self.report(node, fix=Fix({node: node.with_changes(value=other)}))


def test_a_cycle_through_a_later_text_is_an_oscillation() -> None:
    with pytest.raises(RewriteError) as info:
        fix_source("aa = 1\n", [Cycle], path="loop.py")
    assert str(info.value) == (
        "loop.py: fixes oscillate (pass 3 recreated an earlier version; rules XR18)"
    )


class Flip2(Flip):
    """1 <-> 2, beside Flip's aa <-> bb."""

    code = "XR19"
    name = "flip2"

    def visit_Name(self, node: cst.Name) -> None:
        pass

    def visit_Integer(self, node: cst.Integer) -> None:
        other = {"1": "2", "2": "1"}.get(node.value)
        if other is not None:
            self.report(node, fix=Fix({node: node.with_changes(value=other)}))


def test_an_oscillation_names_every_rule_of_the_pass() -> None:
    with pytest.raises(RewriteError) as info:
        fix_source("aa = 1\n", [Flip, Flip2], path="two.py")
    assert str(info.value) == (
        "two.py: fixes oscillate (pass 2 recreated an earlier version; rules XR16, XR19)"
    )


@pytest.mark.parametrize("rule", [NoOp, Empty])
def test_with_unsafe_fixes_given_none_is_announced_as_needing_them(rule: type[Rule]) -> None:
    """An unsafe fix that does nothing (or has nothing to apply) is not listed as 'available
    with --unsafe-fixes' when the flag was given."""

    class Unsafe(rule):  # type: ignore[valid-type, misc]
        fix_safety = FixSafety.UNSAFE

    code = DEFS + "foo()\n"
    assert [f.code for f in fix_source(code, [Unsafe]).unsafe_available] == [Unsafe.code]
    result = fix_source(code, [Unsafe], unsafe=True)
    assert result.source == code and not result.unsafe_available


class Pair(Rule):
    """One fix with two replacements: `first()` -> `bar()` and `last(...)` -> `baz(...)`."""

    code = "XR20"
    name = "pair"
    message = "pair"
    fix_safety = FixSafety.SAFE

    def visit_Module(self, node: cst.Module) -> None:
        self._calls: dict[str, cst.Call] = {}

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value in ("first", "last"):
            self._calls[node.func.value] = node

    def leave_Module(self, original_node: cst.Module) -> None:
        first, last = self._calls.get("first"), self._calls.get("last")
        if first is not None and last is not None:
            fix = Fix(
                {
                    first: first.with_changes(func=cst.Name("bar")),
                    last: last.with_changes(func=cst.Name("baz")),
                }
            )
            self.report(first, fix=fix)


class Mid(Rule):
    """`mid()` -> `bar()`."""

    code = "XR21"
    name = "mid"
    message = "mid"
    fix_safety = FixSafety.SAFE

    def visit_Call(self, node: cst.Call) -> None:
        if _calls(node, "mid"):
            self.report(node, fix=Fix({node: node.with_changes(func=cst.Name("bar"))}))


def test_a_fix_inside_any_earlier_fix_of_the_pass_waits() -> None:
    """XR01's `foo(1)` lies inside the second replacement of XR20's fix, with XR21's fix
    between them: it waits for the next pass (applied once, not lost and counted twice)."""
    defs = DEFS + "def first(): ...\ndef mid(): ...\ndef last(*a): ...\n"
    code = defs + "first()\nmid()\nlast(foo(1))\n"
    result = fix_source(code, [Pair, Mid, Rename])
    assert result.source == defs + "bar()\nbar()\nbaz(bar(1))\n"
    assert [a.code for a in result.applied] == ["XR20", "XR21", "XR01"]


def test_apply_fixes_rebuilds_only_the_path_to_the_edit() -> None:
    """On the tree analysed last, statements the fix does not touch are kept as they are (the
    same objects): only the edited statement's ancestors are rebuilt."""
    code = DEFS + "foo()\nx = 1\n"
    analysis = analyze(code, "<string>", [Rename])
    (finding,) = analysis.findings
    assert finding.fix is not None
    new = apply_fixes(analysis.module, [finding.fix])
    assert new.code == DEFS + "bar()\nx = 1\n"
    old = analysis.module.body
    assert [a is b for a, b in zip(new.body, old, strict=True)] == [True, True, True, False, True]


class NoBarInTrain(Rule):
    """No fix: flags `bar(...)` in files named train.py only (a rule may read the path)."""

    code = "XR22"
    name = "no-bar-in-train"
    message = "no bar in train.py"

    def visit_Call(self, node: cst.Call) -> None:
        if _calls(node, "bar") and self.context.path.name == "train.py":
            self.report(node)


@pytest.mark.parametrize(("path", "fixed"), [("train.py", False), ("other.py", True)])
def test_verification_analyses_the_edit_as_the_file_it_is(path: str, fixed: bool) -> None:
    code = DEFS + "foo()\n"
    result = fix_source(code, [Rename, NoBarInTrain], path=path)
    assert result.source == (DEFS + "bar()\n" if fixed else code)


def test_each_text_is_analysed_and_name_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Verification reuses what the pass knows of the text before the edit (its findings and
    unbound names) and hands its analysis of the edited text to the next pass: no text is
    analysed, or checked for unbound names, twice (each costs about a parse)."""
    from autoopt.lint.rewrite import apply as rewrite
    from autoopt.lint.rewrite import verify

    analysed: list[str] = []
    checked: list[str] = []
    real_analyze, real_unbound = rewrite.analyze, verify.unbound_names

    def analyze_spy(source: str, *args: object, **kwargs: object) -> object:
        analysed.append(source)
        return real_analyze(source, *args, **kwargs)

    def unbound_spy(source: str) -> object:
        checked.append(source)
        return real_unbound(source)

    for module in (rewrite, verify):
        monkeypatch.setattr(module, "analyze", analyze_spy)
        monkeypatch.setattr(module, "unbound_names", unbound_spy)
    code = DEFS + "z = foo(foo(1))\n"
    result = fix_source(code, [Rename])
    assert result.source == DEFS + "z = bar(bar(1))\n" and result.passes == 3
    assert len(analysed) == len(set(analysed)) == 3  # the file, then each pass's edit
    # Unbound names are checked lazily (the text before an edit only when the edit has an
    # unbound name), so fewer than the analysed texts; never one twice.
    assert checked and len(checked) == len(set(checked)) and set(checked) <= set(analysed)
