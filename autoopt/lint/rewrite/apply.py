"""Applying the rules' fixes to source text, to a fixed point.

One pass: analyze the source with the rules, keep the fixes that may be applied (safe ones, plus
unsafe ones when asked), drop those that overlap a fix already kept (they come back on the next
pass, re-derived from the new tree), swap every original node for its replacement in one
transform, then let libcst add the imports the fixes need and remove the ones they made unused.
Passes repeat until no fix applies; a cycle or a runaway is a `RewriteError`, not a hang.
A rule that crashes, or whose fix cannot be applied or breaks the syntax, is skipped for this
file (`FixResult.skipped`) and the other rules' fixes are still applied. Each pass's edit is
verified before it is kept (`autoopt.lint.rewrite.verify`: it parses, binds every name it uses, adds no
finding of any rule); a fix whose edit fails is dropped alone (`FixResult.rejected`).

Everything outside the replaced nodes keeps its bytes: libcst round-trips the rest of the tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

from autoopt.lint.engine.analysis import Analysis, active_rules, analyze
from autoopt.lint.engine.collector import collector_paused
from autoopt.lint.engine.rule import Finding, Fix, FixSafety, Rule
from autoopt.lint.engine.runner import check_syntax
from autoopt.lint.rewrite.verify import (
    FindingFilter,
    Names,
    Verdict,
    parse_python,
    unbound_names,
    verify_edit,
)
from autoopt.lint.tree.metadata import statement_offsets
from autoopt.lint.tree.nodes import code_of, indexed_tree, walk
from autoopt.lint.tree.parsing import parse_module

MAX_PASSES = 10  # a rule set needing more than this is broken (or oscillating)

Replacement = cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel


class RewriteError(RuntimeError):
    """The fixes did not reach a fixed point (they oscillate or keep growing the file)."""


@dataclass(frozen=True)
class AppliedFix:
    """One fix that was applied: its rule code, what it did, and where (line in that pass)."""

    code: str
    description: str
    line: int


@dataclass(frozen=True)
class RejectedFix:
    """A fix whose edit failed verification (`autoopt.lint.rewrite.verify`) and was not applied: the
    file keeps the other fixes. `reason` says what the edit would have broken."""

    code: str
    description: str
    line: int
    reason: str


@dataclass(frozen=True)
class SkippedFix:
    """A rule whose fixes were left out of this file: it crashed, or its fix could not be
    applied (or broke the file's syntax). The other rules' fixes were still applied."""

    code: str
    reason: str


@dataclass
class FixResult:
    """The outcome of `fix_source`."""

    source: str  # the new source (identical to the input if nothing applied)
    original: str
    applied: list[AppliedFix] = field(default_factory=list)
    # Findings of the final pass that have no fix (the rule declined; the message says why).
    declined: list[Finding] = field(default_factory=list)
    # Findings of the final pass whose fix is unsafe and was not applied (unsafe=False).
    unsafe_available: list[Finding] = field(default_factory=list)
    skipped: list[SkippedFix] = field(default_factory=list)
    rejected: list[RejectedFix] = field(default_factory=list)
    rejected_findings: list[Finding] = field(default_factory=list, repr=False)
    passes: int = 0

    @property
    def changed(self) -> bool:
        return self.source != self.original


@collector_paused()
def fix_source(
    source: str,
    rules: Sequence[type[Rule]],
    *,
    unsafe: bool = False,
    target_version: tuple[int, int] | None = None,
    path: Path | str = "<string>",
    finding_filter: FindingFilter | None = None,
    max_passes: int = MAX_PASSES,
) -> FixResult:
    """Apply the fixes of `rules` to `source` until nothing changes.

    `unsafe` also applies fixes labelled unsafe. `finding_filter(findings, source)` may drop
    findings before fixing (suppressions such as `# noqa`). Every pass's edit is verified
    (`autoopt.lint.rewrite.verify`) before it is kept; a fix whose edit fails is left out (the others
    are kept) and listed in `FixResult.rejected`. Raises `libcst.ParserSyntaxError` if the
    source cannot be parsed, `RewriteError` if the fixes do not converge.
    """
    result = FixResult(source=source, original=source)
    prefiltered: list[type[Rule]] | None = active_rules(rules, source, target_version, path)
    if not prefiltered and check_syntax(source, str(path)) is None:
        # No rule can fire and CPython compiles it: nothing to fix, and no libcst parse (most
        # files of a real repository; a compile is ~8x cheaper). A file CPython rejects still
        # goes to libcst below, which raises the ParserSyntaxError callers report.
        return result
    seen = {source}
    current = source
    active = list(rules)
    rejected: set[tuple[str, str]] = set()  # fixes that failed verification: never retried
    analysis: Analysis | None = None  # of `current`, when the last verification computed it
    unbound: Names | None = None
    for n_pass in range(1, max_passes + 1):
        result.passes = n_pass
        if analysis is None:
            # the first pass reads `source` with every rule: the pre-filter above answered that
            analysis = analyze(current, path, active, target_version, active=prefiltered)
        prefiltered = None
        _skip(result, active, [(c.code, c.describe()) for c in analysis.crashes])
        findings = list(analysis.findings)
        if finding_filter is not None:
            findings = list(finding_filter(findings, current))
        candidates = [f for f in findings if not rejected or _fix_key(f) not in rejected]
        chosen = _choose_fixes(candidates, unsafe)
        if not chosen:
            _record_leftovers(result, findings, unsafe, rejected)
            break
        new_source, chosen, failed = _apply_contained(analysis.module, chosen, current)
        _skip(result, active, failed)
        if failed and not chosen:
            analysis = None
            continue  # re-derive this pass's other fixes without the failed rules
        if new_source == current:
            # The fixes were no-ops: applying them again would loop forever.
            _record_leftovers(result, findings, unsafe, rejected)
            break
        check = _Check(
            current, findings, unbound, active, target_version, path, finding_filter, unsafe
        )
        verdict = check(new_source)
        if not verdict.ok:
            new_source, chosen, verdict = _keep_verified(analysis.module, chosen, check, result)
            rejected |= {_fix_key(r) for r in result.rejected_findings}
            unbound = check.unbound  # of `current`, if a check computed it
            if not chosen:
                continue  # the same analysis: the rejected fixes are left out next time
        if new_source in seen:
            codes = ", ".join(sorted({f.code for f, _ in chosen}))
            raise RewriteError(
                f"{path}: fixes oscillate (pass {n_pass} recreated an earlier version; rules {codes})"
            )
        seen.add(new_source)
        result.applied.extend(
            AppliedFix(f.code, fix.description or f.message, f.line) for f, fix in chosen
        )
        current = new_source
        analysis, unbound = verdict.analysis, verdict.unbound
    else:
        raise RewriteError(f"{path}: no fixed point after {max_passes} passes of fixes")
    _SPLICE.clear()  # its tree is of no use once the file is done
    result.source = current
    return result


@dataclass
class _Check:
    """`verify_edit` of one pass's text, with what the pass already knows about it."""

    before: str
    findings: list[Finding]
    unbound: Names | None
    rules: Sequence[type[Rule]]
    target_version: tuple[int, int] | None
    path: Path | str
    finding_filter: FindingFilter | None
    unsafe: bool

    def before_unbound(self) -> Names | None:
        """pyflakes' names of `before`, computed on the first asking (most edits never ask)."""
        if self.unbound is None:
            self.unbound = unbound_names(self.before)
        return self.unbound

    def __call__(self, after: str) -> Verdict:
        return verify_edit(
            self.before,
            after,
            rules=self.rules,
            before_findings=self.findings,
            before_unbound=self.before_unbound,
            target_version=self.target_version,
            path=self.path,
            finding_filter=self.finding_filter,
            fixed_later=lambda finding: _fix_allowed(finding, self.unsafe),
            parse=parse_edited,
        )


def _keep_verified(
    module: cst.Module, chosen: list[tuple[Finding, Fix]], check: _Check, result: FixResult
) -> tuple[str, list[tuple[Finding, Fix]], Verdict]:
    """The pass's edit failed verification: add its fixes one at a time, keeping each whose
    edit (with those kept before it) still verifies; the others go to `result.rejected`."""
    kept: list[tuple[Finding, Fix]] = []
    new_source, verdict = check.before, Verdict()
    for finding, fix in chosen:
        candidate = fixed_code(module, [f for _, f in kept] + [fix], check.before)
        attempt = check(candidate)
        if attempt.ok:
            kept.append((finding, fix))
            new_source, verdict = candidate, attempt
        else:
            result.rejected.append(
                RejectedFix(
                    finding.code,
                    fix.description or finding.message,
                    finding.line,
                    attempt.reason(),
                )
            )
            result.rejected_findings.append(finding)
    return new_source, kept, verdict


def _fix_key(finding: Finding) -> tuple[str, str]:
    """A fix, recognisable in a later pass (where its nodes and lines are new ones)."""
    fix = finding.fix
    node = code_of(finding.node) if finding.node is not None else str(finding.line)
    return finding.code, f"{fix.description if fix else ''}|{node}"


def _skip(result: FixResult, active: list[type[Rule]], failed: Sequence[tuple[str, str]]) -> None:
    """Record rules whose fixes are skipped and drop them from the remaining passes."""
    for code, reason in failed:
        result.skipped.append(SkippedFix(code, reason))
        active[:] = [r for r in active if r.code != code]


def _render(module: cst.Module, fixes: Sequence[Fix], source: str) -> str:
    new_source = fixed_code(module, fixes, source)
    try:
        parse_python(new_source)  # verification parses it next: remembered, not parsed twice
    except Exception:
        if _parses(source):  # only blame fixes for syntax CPython accepted before
            raise  # SyntaxError: a fix that breaks the file is a failed fix
    return new_source


def _apply_contained(
    module: cst.Module, chosen: list[tuple[Finding, Fix]], current: str
) -> tuple[str, list[tuple[Finding, Fix]], list[tuple[str, str]]]:
    """Apply the chosen fixes together; when that raises (or gives code that does not parse),
    find the fixes that fail alone and apply the others. Returns the new source, the fixes
    applied, and (code, reason) of the rules whose fix failed."""
    try:
        return _render(module, [fix for _, fix in chosen], current), chosen, []
    except Exception:  # find which fix it was below
        pass
    kept: list[tuple[Finding, Fix]] = []
    failed: list[tuple[str, str]] = []
    for finding, fix in chosen:
        try:
            _render(module, [fix], current)
        except Exception as exc:
            failed.append((finding.code, f"its fix failed: {type(exc).__name__}: {exc}"))
        else:
            kept.append((finding, fix))
    try:
        return _render(module, [fix for _, fix in kept], current), kept, failed
    except Exception as exc:  # fixes that fail only together: none of them this pass
        codes = sorted({f.code for f, _ in kept})
        reason = f"its fix failed together with {', '.join(codes)}: {type(exc).__name__}: {exc}"
        return current, [], failed + [(code, reason) for code in codes]


def _parses(source: str) -> bool:
    try:
        parse_python(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _fix_allowed(finding: Finding, unsafe: bool) -> bool:
    if finding.fix is None:
        return False
    if finding.fix_safety is FixSafety.SAFE:
        return True
    return finding.fix_safety is FixSafety.UNSAFE and unsafe


def _choose_fixes(findings: Sequence[Finding], unsafe: bool) -> list[tuple[Finding, Fix]]:
    """The applicable fixes of one pass that do not touch each other, in source order.

    Two fixes overlap when a node one replaces lies inside (or is) a node the other replaces;
    the later one waits for the next pass, where its rule sees the already-fixed tree."""
    chosen: list[tuple[Finding, Fix]] = []
    taken: set[int] = set()
    seen_fixes: set[int] = set()
    for finding in findings:
        fix = finding.fix
        if fix is None or not _fix_allowed(finding, unsafe) or id(fix) in seen_fixes:
            continue
        seen_fixes.add(id(fix))
        if not fix.replacements and not fix.add_imports and not fix.remove_imports:
            continue
        covered = {id(n) for key in fix.replacements for n in walk(key)}
        if covered & taken:
            continue
        taken |= covered
        chosen.append((finding, fix))
    return chosen


def _record_leftovers(
    result: FixResult,
    findings: Sequence[Finding],
    unsafe: bool,
    rejected: set[tuple[str, str]],
) -> None:
    for finding in findings:
        if finding.fix is not None and rejected and _fix_key(finding) in rejected:
            continue  # in `result.rejected`, with the reason its edit was not kept
        if finding.fix is None:
            result.declined.append(finding)
        elif finding.fix_safety is FixSafety.UNSAFE and not unsafe:
            result.unsafe_available.append(finding)


class _Replacer(cst.CSTTransformer):
    """Swaps original nodes (matched by identity) for their replacements. With `spine` (the ids
    of the replaced nodes' ancestors) it enters only those: every other subtree is kept as it
    is instead of being rebuilt node by node, which is what a transform of the whole module
    costs (about as much as parsing it)."""

    def __init__(self, replacements: dict[int, Replacement], spine: set[int] | None) -> None:
        super().__init__()
        self._replacements = replacements
        self._spine = spine

    def on_visit(self, node: cst.CSTNode) -> bool:
        # A replaced node's children are not visited: its replacement is final.
        if id(node) in self._replacements:
            return False
        return self._spine is None or id(node) in self._spine

    def on_leave(
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel:
        return self._replacements.get(id(original_node), updated_node)


def _spine(module: cst.Module, replaced: Sequence[cst.CSTNode]) -> set[int] | None:
    """The ids of every ancestor of the `replaced` nodes, from the index of `module`'s tree
    (None when `module` is not the tree indexed last, or a node is not in it)."""
    tree = indexed_tree(module)
    if tree is None or not all(id(node) in tree.rank for node in replaced):
        return None
    return {id(up) for node in replaced for up in tree.ancestors(node)}


def fixed_code(module: cst.Module, fixes: Sequence[Fix], source: str) -> str:
    """`apply_fixes(module, fixes).code`, where `module` was parsed from `source`: the code of
    the top-level statements a fix rebuilt is generated, every other statement keeps its text
    from `source` (libcst round-trips it: the same characters as generating it, which costs
    about as much as parsing). Fixes that add or remove imports get the whole module
    generated, as does a module whose statements cannot be placed in `source`."""
    new_module = apply_fixes(module, fixes)
    if any(fix.add_imports or fix.remove_imports for fix in fixes):
        return new_module.code
    offsets = statement_offsets(module, source) if new_module.body else None
    if (
        offsets is None
        or not new_module.has_trailing_newline
        or (new_module.default_indent, new_module.default_newline)
        != (module.default_indent, module.default_newline)
        or not _same_nodes(new_module.header, module.header)
        or not _same_nodes(new_module.footer, module.footer)
    ):
        return new_module.code
    where = {id(statement): i for i, statement in enumerate(module.body)}
    parts = [source[: offsets[0]]]
    body: list[cst.BaseStatement | str] = []
    for statement in new_module.body:
        i = where.get(id(statement))
        if i is None:  # rebuilt by a fix: generated at the top level, as the module would
            code = new_module.code_for_node(statement)
            parts.append(code)
            body.append(code)
        else:
            parts.append(source[offsets[i] : offsets[i + 1]])
            body.append(statement)
    parts.append(source[offsets[-1] :])
    text = "".join(parts)
    _SPLICE[:] = [_Splice(text, module, body)]
    return text


# ----- parsing an edit's text ------------------------------------------------------------------
@dataclass(frozen=True)
class _Splice:
    """How `fixed_code` made its last text: each top-level statement of the edited module is
    a statement it kept from `module` (the tree the old text was parsed from) or the code it
    generated for it."""

    text: str
    module: cst.Module
    body: list[cst.BaseStatement | str]


_SPLICE: list[_Splice] = []  # the last one, until verification parses the text it made


def parse_edited(source: str) -> cst.Module:
    """`libcst.parse_module(source)` for the text `fixed_code` made last: only the statements
    it generated are parsed (verification's parse of an edit then costs the edit's share of
    the file), joined with the statements it kept from the parsed original. Top-level
    statements parse alike alone and in their file (what `engine.parse_large` relies on);
    where the file-wide settings a parse infers (indentation, line break) could differ, or
    `source` is another text, the whole text is parsed."""
    splice = _SPLICE.pop() if _SPLICE else None
    if splice is not None and splice.text == source:
        module = _spliced(splice)
        if module is not None:
            return module
    return parse_module(source)


def _spliced(splice: _Splice) -> cst.Module | None:
    module, body = splice.module, splice.body
    if not body or isinstance(body[0], str):
        return None  # the header and a first statement's leading lines: left to the parser
    settings = (module.default_indent, module.default_newline)
    statements: list[cst.BaseStatement] = []
    i = 0
    while i < len(body):
        piece = body[i]
        if not isinstance(piece, str):
            statements.append(piece)
            i += 1
            continue
        j = i
        while j < len(body) and isinstance(body[j], str):
            j += 1
        try:
            chunk = parse_module("".join(body[i:j]))  # type: ignore[arg-type]
        except Exception:
            return None  # the whole text's parse gives the error
        if (chunk.default_indent, chunk.default_newline) != settings or chunk.footer:
            return None
        part = list(chunk.body)
        if len(part) != j - i:
            return None
        if chunk.header:  # the chunk's leading lines are its first statement's in the file
            part[0] = part[0].with_changes(leading_lines=[*chunk.header, *part[0].leading_lines])
        statements.extend(part)
        i = j
    # The file's indentation is inferred from its first indented block: it must be one whose
    # indentation is the module's (a block indented otherwise records its own).
    first = next(filter(None, map(_first_block, statements)), None)
    if first is not None and first.indent is not None:
        return None
    if first is None and module.default_indent != "    ":  # libcst's default, with no block
        return None
    if len({id(s) for s in statements}) != len(statements):
        return None  # a kept statement twice: the index needs each node once
    return module.with_changes(body=statements)


def _first_block(statement: cst.CSTNode) -> cst.IndentedBlock | None:
    return next((n for n in walk(statement) if type(n) is cst.IndentedBlock), None)


def _same_nodes(a: Sequence[cst.CSTNode], b: Sequence[cst.CSTNode]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def apply_fixes(module: cst.Module, fixes: Sequence[Fix]) -> cst.Module:
    """`module` with every fix's replacements, added imports and stale imports removed. The
    fixes' replacement keys must be nodes of `module` and must not overlap."""
    replacements: dict[int, Replacement] = {}
    replaced: list[cst.CSTNode] = []
    for fix in fixes:
        for node, new in fix.replacements.items():
            replacements[id(node)] = new
            replaced.append(node)
    if replacements:
        new_module = module.visit(_Replacer(replacements, _spine(module, replaced)))
    else:
        new_module = module
    if not isinstance(new_module, cst.Module):  # pragma: no cover - a fix replaced the module
        raise RewriteError("a fix replaced the whole module with something else")
    adds = [item for fix in fixes for item in fix.add_imports]
    removes = [item for fix in fixes for item in fix.remove_imports]
    if not adds and not removes:
        return new_module
    context = CodemodContext()
    for item in adds:
        AddImportsVisitor.add_needed_import(
            context, item.module_name, item.obj_name, item.alias, item.relative
        )
    for item in removes:
        RemoveImportsVisitor.remove_unused_import(
            context, item.module_name, item.obj_name, item.alias
        )
    if adds:
        new_module = AddImportsVisitor(context).transform_module(new_module)
    if removes:
        # Only removes an import that nothing in the (already fixed) module still uses.
        new_module = RemoveImportsVisitor(context).transform_module(new_module)
    return new_module
