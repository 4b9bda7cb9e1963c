"""AO001: a `# noqa` code that names no rule, or suppresses nothing on its line."""

from __future__ import annotations

import functools
import tokenize
from collections.abc import Sequence

from autoopt.lint.engine.rule import Finding, Invalid, Rule, Valid
from autoopt.lint.engine.suppress import ALL, line_suppressions, matches


@functools.cache
def _builtin_codes() -> frozenset[str]:
    from autoopt.lint.engine.registry import load_registry

    return frozenset(rule.code for rule in load_registry().all())


class UnusedNoqa(Rule):
    """
    ## What it does
    Flags autoopt codes in a `# noqa: ...` comment that name no rule (`AO999`, a typo), or that
    suppress nothing on their line: no rule that ran reported that code there. Ruff's RUF100.

    ## Why is this bad?
    A misspelt code suppresses nothing, so the finding it was meant for is still reported (or
    was fixed long ago and the comment stayed). Stale suppressions hide the next real finding
    on the same line.

    ## Example
    `loader = DataLoader(ds)  # noqa: AO10` when AO101 no longer fires on that line.

    ## Use instead
    Remove the comment, or name the code the line really needs.

    ## Fix safety
    No fix: which suppression is stale is for a person to decide.

    ## When not to
    - Other linters' codes (`F401`, `E501`) are never reported, nor a bare `# noqa`.
    - A code of a rule that did not run on the file (not selected, or it cannot match the text)
      is not called unused: only codes of rules that ran and reported nothing there are.
    """

    code = "AO001"
    name = "unused-noqa"
    message = "`# noqa` code suppresses nothing here"
    triggers = ("noqa",)
    runs_after_other_rules = True

    VALID = [
        Valid("x = 1  # noqa\n"),
        Valid("import os  # noqa: F401\n"),
        Valid("x = 1  # noqa: AO201\n"),  # AO201 did not run here: not called unused
    ]
    INVALID = [
        Invalid("x = 1  # noqa: AO999\n", line=1, message_contains="`AO999` names no rule"),
        Invalid("x = 1  # noqa: AO0011\n", line=1, message_contains="names no rule"),
    ]

    def _noqa_comments(self) -> list[tuple[int, int, str]]:
        """(line, column, text) of each comment holding `noqa` (tokens: not inside strings)."""
        found = []
        lines = iter(self.context.source.splitlines(keepends=True))
        try:
            for token in tokenize.generate_tokens(lambda: next(lines, "")):
                if token.type == tokenize.COMMENT and "noqa" in token.string.lower():
                    found.append((token.start[0], token.start[1] + 1, token.string))
        except (tokenize.TokenError, SyntaxError):
            pass  # the file parsed with libcst; a tokenizer quirk only costs this check
        return found

    def _flag(self, line: int, column: int, text: str, message: str) -> None:
        self.findings.append(
            Finding(
                code=self.code,
                message=message,
                path=str(self.context.path),
                line=line,
                column=column,
                end_line=line,
                end_column=column + len(text),
            )
        )

    def after_other_rules(self, findings: Sequence[Finding], ran: Sequence[str]) -> None:
        """Called once the other rules have reported, with their raw (unsuppressed) findings and
        the codes of the rules that ran."""
        known = _builtin_codes() | set(ran)
        by_line: dict[int, set[str]] = {}
        for finding in findings:
            by_line.setdefault(finding.line, set()).add(finding.code)
        for line, column, text in self._noqa_comments():
            codes = line_suppressions(text)
            if not codes or codes is ALL:
                continue
            reported = by_line.get(line, set())
            for code in sorted(c for c in codes if c.startswith("AO")):
                if not any(k.startswith(code) for k in known):
                    message = f"`{code}` names no rule: this `# noqa` suppresses nothing"
                    self._flag(line, column, text, message)
                elif any(r.startswith(code) for r in ran if r != self.code) and not any(
                    matches(r, frozenset({code})) for r in reported
                ):
                    message = f"`# noqa: {code}` suppresses nothing on this line"
                    self._flag(line, column, text, message)
