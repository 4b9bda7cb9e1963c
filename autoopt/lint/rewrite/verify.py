"""Verifying an edit before it is written: every fix and every `--wrap` insertion goes through here.

An edited source is accepted only if
- it parses (CPython's `ast`, when the original did);
- it binds every name it uses at least as well as the original did: pyflakes runs on both, and a
  new "undefined name" or "referenced before assignment" is a broken edit (`torch.device(...)`
  written into a script that never imports torch, a line inserted above the import it needs).
  Messages are compared by kind and name, never by line: an edit shifts every line below it;
- it reads no name where some path leaves it unbound more often than the original did
  (`autoopt.lint.rewrite.bound_names`: a name bound only under an `if`, in a loop's body, in a `try`
  body, or deleted; pyflakes does not see these). Reads are counted by name, as above;
- no rule reports more findings of its code on it than on the original (a fix must not write
  what another rule flags: fixes and lint reach one fixed point), unless the rewrite fixes the
  new one in its next pass. Findings are counted per code, so a finding whose text or line the
  edit changed is not taken for a new one.

Cost: pyflakes, the bound-names pass and one analysis of the edited text, only for files an edit
changed (on the original too, each only when the edited text has a name of its kind: pyflakes
when it has an undefined name, the bound-names pass when it has a maybe-unbound read).
`fix_source` hands the analysis and names of the accepted text to its next pass, so the lint
half costs nothing extra.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import libcst as cst
from pyflakes import checker as _pyflakes
from pyflakes import messages as _flake_messages

from autoopt.lint.engine.analysis import Analysis, analyze
from autoopt.lint.engine.rule import Finding, Rule
from autoopt.lint.program.index import TEXT_TREES, keep_text_tree
from autoopt.lint.rewrite.bound_names import maybe_unbound_counts

# pyflakes' messages about a name used where nothing binds it.
_UNBOUND = (_flake_messages.UndefinedName, _flake_messages.UndefinedLocal)

FindingFilter = Callable[[Sequence[Finding], str], Sequence[Finding]]
UnboundKey = tuple[str, str]  # (pyflakes message kind, name)


@dataclass
class Verdict:
    """The outcome of `verify_edit`: `problems` is empty when the edit may be written.
    `analysis`/`findings` are the rules' view of the edited text (reusable by the caller)."""

    problems: list[str] = field(default_factory=list)
    analysis: Analysis | None = None
    findings: list[Finding] = field(default_factory=list)
    unbound: Names | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def reason(self) -> str:
        return "; ".join(self.problems)


class Names:
    """The names of one source an edit could leave unbound, each taken from its tree when first
    asked (the original's only when the edited text has some of that kind):
    - `unbound`: pyflakes' undefined-name and use-before-assignment messages, counted by
      (kind, name);
    - `bound`: every name the source binds somewhere;
    - `maybe_unbound`: the reads of names that some path reaches unbound
      (`autoopt.lint.rewrite.bound_names`), counted by name."""

    def __init__(self, tree: ast.Module) -> None:
        self._tree = tree

    @cached_property
    def unbound(self) -> Counter[UnboundKey]:
        found: Counter[UnboundKey] = Counter()
        for message in _pyflakes.Checker(self._tree, filename="<edit>").messages:
            if isinstance(message, _UNBOUND):
                found[(type(message).__name__, str(message.message_args[0]))] += 1
        return found

    @cached_property
    def bound(self) -> frozenset[str]:
        return frozenset(_bound(self._tree))

    @cached_property
    def maybe_unbound(self) -> Counter[str]:
        return maybe_unbound_counts(self._tree)

    def broken_by(self, after: Names) -> list[UnboundKey]:
        """The messages `after` has beyond these: a kind and name never reported here, or one
        more use of a name this source binds somewhere (so the new use is at a place it does
        not reach). A name bound nowhere (a free name of a fragment, a star import's) may be
        used once more: the edit does not make it less defined."""
        if not after.unbound:
            return []
        grown = after.unbound - self.unbound
        return sorted(k for k in grown if k not in self.unbound or k[1] in self.bound)

    def maybe_unbound_in(self, after: Names) -> list[str]:
        """The names `after` reads more often than this source where some path leaves them
        unbound (bound only under an `if`, in a loop's body, in a `try` body, or deleted)."""
        if not after.maybe_unbound:
            return []
        return sorted(after.maybe_unbound - self.maybe_unbound)


def parse_python(source: str) -> ast.Module:
    """`ast.parse(source)` (raising as it does), remembered for the last few texts (a rewrite
    pass checks each text's syntax and then its names, and the program model indexes it; the
    original text's parse is the program model's of the file: `TEXT_TREES`)."""
    tree = TEXT_TREES.get(source)
    if tree is None:
        tree = ast.parse(source)
        keep_text_tree(source, tree)
    return tree


def unbound_names(source: str) -> Names | None:
    """The `Names` of `source`; None when CPython cannot parse it."""
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return Names(tree)


def _bound(tree: ast.AST) -> set[str]:
    """Every name `tree` binds anywhere (assignments, loop and `with` targets, definitions,
    parameters, imports)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            out.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
    return out


def _describe_maybe_unbound(name: str) -> str:
    return f"{name!r} may be unbound where the edit uses it (bound on some paths only)"


def _describe_unbound(key: UnboundKey) -> str:
    kind, name = key
    if kind == "UndefinedLocal":
        return f"uses {name!r} before it is assigned"
    return f"uses {name!r}, which is not defined there"


def new_findings(before: Sequence[Finding], after: Sequence[Finding]) -> list[Finding]:
    """The findings of `after` beyond what `before` had, per rule code (lines and texts shift
    under an edit, so only a code whose count grew has new findings: its findings at places
    `before` did not report are named)."""
    grown = Counter(f.code for f in after) - Counter(f.code for f in before)
    if not grown:
        return []
    old = Counter((f.code, f.message) for f in before)
    out: list[Finding] = []
    for finding in after:
        if grown[finding.code] <= 0:
            continue
        key = (finding.code, finding.message)
        if old[key] > 0:
            old[key] -= 1
            continue
        out.append(finding)
        grown[finding.code] -= 1
    return out


def verify_edit(
    before: str,
    after: str,
    *,
    rules: Sequence[type[Rule]],
    before_findings: Sequence[Finding] | None = None,
    before_unbound: Names | Callable[[], Names | None] | None = None,
    target_version: tuple[int, int] | None = None,
    path: Path | str = "<string>",
    finding_filter: FindingFilter | None = None,
    fixed_later: Callable[[Finding], bool] | None = None,
    parse: Callable[[str], cst.Module] | None = None,
) -> Verdict:
    """Check the edit `before` -> `after` (see the module doc). `before_findings` and
    `before_unbound`, when the caller has them, save re-deriving them from `before`
    (`before_unbound` may be a function that computes them, called only when needed). A new
    finding for which `fixed_later` is true does not fail the edit: the rewrite's next pass
    fixes it (AO101's workers make AO104's `persistent_workers` apply), and that fix is
    verified in turn. `parse` parses `after` for the rules (rewrite's parses only what its
    edit generated; the tree must be `libcst.parse_module`'s)."""
    verdict = Verdict()
    new_unbound = verdict.unbound = unbound_names(after)
    # `before`'s names only when their answer matters: an edited text with no undefined or
    # maybe-unbound name at all cannot have a new one, whatever `before` had (and each kind
    # of `before`'s names is taken only if the edited text has some of that kind).
    if new_unbound is None or new_unbound.unbound or new_unbound.maybe_unbound:
        if callable(before_unbound):
            old_unbound = before_unbound()
        elif before_unbound is not None:
            old_unbound = before_unbound
        else:
            old_unbound = unbound_names(before)
        if new_unbound is None:
            if old_unbound is not None:
                verdict.problems.append("the edited file does not parse")
                return verdict
        elif old_unbound is not None:
            broken = old_unbound.broken_by(new_unbound)
            verdict.problems.extend(_describe_unbound(k) for k in broken)
            undefined = {name for _, name in broken}  # named once, by pyflakes' message
            verdict.problems.extend(
                _describe_maybe_unbound(name)
                for name in old_unbound.maybe_unbound_in(new_unbound)
                if name not in undefined
            )
    try:
        verdict.analysis = analyze(after, path, rules, target_version, parse)
    except Exception as exc:  # libcst rejects the edited text
        verdict.problems.append(f"the edited file does not parse: {type(exc).__name__}")
        return verdict
    findings = list(verdict.analysis.findings)
    if finding_filter is not None:
        findings = list(finding_filter(findings, after))
    verdict.findings = findings
    if before_findings is None:
        old = analyze(before, path, rules, target_version).findings
        before_findings = list(finding_filter(old, before)) if finding_filter else old
    for finding in new_findings(before_findings, findings):
        if fixed_later is not None and fixed_later(finding):
            continue
        verdict.problems.append(
            f"the result would be flagged {finding.code} at line {finding.line} ({finding.message})"
        )
    return verdict
