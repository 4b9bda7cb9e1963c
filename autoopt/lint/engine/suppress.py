"""Suppression comments: `# noqa`, `# noqa: AO201, AO3` on a finding's line, and the file-level
`# autoopt: noqa` (all rules) or `# autoopt: noqa: AO201` (those rules) on a line of its own;
and `add_noqa`, which writes the line comments for `autoopt lint --add-noqa`.

Codes may be prefixes (`AO2` suppresses every AO2xx). Other linters' codes in the same comment
(`# noqa: F401, AO201`) are fine: only the ones that match a finding matter. flake8's file-level
`# flake8: noqa` is deliberately *not* honoured: it is aimed at flake8 and is common in code that
autoopt should still check.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

# Ruff's shape: a "noqa" comment, optionally followed by ":" and codes separated by commas/whitespace.
_LINE_NOQA = re.compile(
    r"(?i:#\s*noqa)(?::\s?(?P<codes>[A-Z]+[0-9]*(?:(?:,\s*|\s+)[A-Z]+[0-9]*)*))?"
)
_FILE_NOQA = re.compile(
    r"^[ \t]*#[ \t]*autoopt:[ \t]*noqa(?:[ \t]*:[ \t]*(?P<codes>[A-Za-z0-9 \t,]*))?[ \t]*$",
    re.IGNORECASE | re.MULTILINE,
)
_CODE = re.compile(r"[A-Z]+[0-9]*")
# Python's own line breaks (str.splitlines also splits on \f, \v, ... which Python does not).
_NEWLINE = re.compile(r"\r\n|\r|\n")
_LINE_WITH_BREAK = re.compile(r".*?(?:\r\n|\r|\n)|.+", re.DOTALL)

ALL: frozenset[str] = frozenset({"*"})  # marker: every code is suppressed


class _HasCodeAndLine(Protocol):
    code: str
    line: int


T = TypeVar("T", bound=_HasCodeAndLine)


def _codes(text: str | None) -> frozenset[str]:
    if not text:
        return ALL
    found = frozenset(_CODE.findall(text.upper()))
    return found or ALL


def matches(code: str, suppressed: frozenset[str]) -> bool:
    """Whether `code` is covered by a set of suppressed codes/prefixes (or ALL)."""
    if suppressed is ALL or "*" in suppressed:
        return True
    return any(code.startswith(prefix) for prefix in suppressed)


def file_suppressions(source: str) -> frozenset[str] | None:
    """Codes suppressed for the whole file by `# autoopt: noqa[: CODES]` (ALL for a bare one),
    or None when the file has no such comment."""
    if "autoopt" not in source:  # cheap: most files never mention it
        return None
    found: set[str] = set()
    for match in _FILE_NOQA.finditer(source):
        codes = _codes(match.group("codes"))
        if codes is ALL:
            return ALL
        found |= codes
    return frozenset(found) if found else None


def line_suppressions(line_text: str) -> frozenset[str] | None:
    """Codes suppressed on one line by `# noqa[: CODES]` (ALL for a bare one), or None."""
    if "noqa" not in line_text.lower():
        return None
    match = _LINE_NOQA.search(line_text)
    if match is None:
        return None
    return _codes(match.group("codes"))


def filter_findings(findings: Sequence[T], source: str) -> list[T]:
    """`findings` (anything with `.code` and 1-based `.line` into `source`) minus those
    suppressed by a file-level or same-line noqa comment. Usable as `rewrite.fix_source`'s
    `finding_filter`."""
    if not findings:
        return []
    file_level = file_suppressions(source)
    if file_level is ALL:
        return []
    lines: list[str] | None = None
    cache: dict[int, frozenset[str] | None] = {}
    kept: list[T] = []
    for finding in findings:
        if file_level is not None and matches(finding.code, file_level):
            continue
        if "noqa" in source:  # only split the text when a noqa can be there at all
            if lines is None:
                lines = _NEWLINE.split(source)
            if finding.line not in cache:
                text = lines[finding.line - 1] if 0 < finding.line <= len(lines) else ""
                cache[finding.line] = line_suppressions(text)
            on_line = cache[finding.line]
            if on_line is not None and matches(finding.code, on_line):
                continue
        kept.append(finding)
    return kept


def suppressed_rules(codes: Iterable[str], file_level: frozenset[str] | None) -> set[str]:
    """Which of `codes` a file-level suppression turns off (so they need not even run)."""
    if file_level is None:
        return set()
    return {c for c in codes if matches(c, file_level)}


def add_noqa(source: str, codes_by_line: Mapping[int, Iterable[str]]) -> tuple[str, int, list[int]]:
    """`--add-noqa`: `source` with `# noqa: CODES` at the end of each line of `codes_by_line`
    (1-based), merged into a `# noqa: ...` already there; (new source, lines changed, lines
    where no comment can go: a line that ends inside a string or with a backslash).

    A comment can end a line where tokenize sees the line end (NEWLINE or NL); the codes go
    after any comment the line has, as Ruff puts them."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return source, 0, sorted(codes_by_line)
    ends = {t.start[0] for t in tokens if t.type in (tokenize.NEWLINE, tokenize.NL)}
    lines = _LINE_WITH_BREAK.findall(source)
    changed, refused = 0, []
    for number, codes in sorted(codes_by_line.items()):
        if number not in ends or not 0 < number <= len(lines):
            refused.append(number)
            continue
        text = lines[number - 1]
        body = text.rstrip("\r\n")
        brk = text[len(body) :]
        new = _with_noqa(body, sorted(set(codes)))
        if new != body:
            lines[number - 1] = new + brk
            changed += 1
    return "".join(lines), changed, refused


def _with_noqa(line: str, codes: Sequence[str]) -> str:
    """One line with `codes` added to its noqa comment (a new one if it has none)."""
    match = _LINE_NOQA.search(line)
    if match is None:
        return f"{line.rstrip()}  # noqa: {', '.join(codes)}"
    present = match.group("codes")
    if present is None:  # a bare noqa comment suppresses everything already
        return line
    known = _CODE.findall(present.upper())
    merged = known + [c for c in codes if c not in known]
    return line[: match.start("codes")] + ", ".join(merged) + line[match.end("codes") :]
