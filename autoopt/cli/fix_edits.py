"""`fix.edits` in the JSON formats: each fix as the text edits it makes, in Ruff's shape, so an
editor or a review bot can apply one fix without running autoopt again.

A fix is a replacement of libcst nodes (and imports to add or remove); its edits are the spans of
the file that differ once that fix alone is applied (`fixed_code`, the rewrite engine's own
rendering), each cut to the characters that change. They are computed only for a format that
shows them, on a second analysis of the files with fixable findings (the lint's result may come
from the cache, which keeps no syntax tree). Rows and columns are 1-based, columns in characters.
"""

from __future__ import annotations

import bisect
import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import libcst as cst

from autoopt.lint.engine.analysis import analyze
from autoopt.lint.engine.project import Project
from autoopt.lint.engine.runner import LintReport
from autoopt.lint.engine.suppress import filter_findings
from autoopt.lint.rewrite.apply import fixed_code
from autoopt.lint.tree.encoding import SourceDecodeError, decode_source

Edit = dict[str, Any]  # {"content": str, "location": {row, column}, "end_location": {row, column}}
EditKey = tuple[str, int, int, str]  # (the path as reported, line, column, code)

# A line and its break, as Python breaks lines (str.splitlines also breaks at \f, \v, ...).
_LINE = re.compile(r".*?(?:\r\n|\r|\n)|.+", re.DOTALL)


def text_edits(before: str, after: str) -> list[Edit]:
    """The spans of `before` that `after` replaces, with their new text, in order: lines are
    matched first; a changed line that keeps its place is cut to the characters that change
    (`x.to(d)` -> `x.to(d, non_blocking=True)` is one insertion), other changed lines are one
    edit each run of them."""
    old, new = _LINE.findall(before), _LINE.findall(after)
    starts = [0]
    for line in old:
        starts.append(starts[-1] + len(line))

    def position(offset: int) -> dict[str, int]:
        row = bisect.bisect_right(starts, offset) - 1
        return {"row": row + 1, "column": offset - starts[row] + 1}

    spans: list[tuple[int, int, str]] = []  # (start, end) offsets into `before`, new text
    lines = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in lines.get_opcodes():
        if tag == "equal":
            continue
        if tag == "replace" and i2 - i1 == j2 - j1:  # the same lines, edited
            pairs = zip(range(i1, i2), range(j1, j2), strict=True)
            for i, j in pairs:
                chars = difflib.SequenceMatcher(None, old[i], new[j], autojunk=False)
                spans += [
                    (starts[i] + a1, starts[i] + a2, new[j][b1:b2])
                    for op, a1, a2, b1, b2 in chars.get_opcodes()
                    if op != "equal"
                ]
        else:
            spans.append((starts[i1], starts[i2], "".join(new[j1:j2])))
    return [
        {"content": text, "location": position(start), "end_location": position(end)}
        for start, end, text in spans
    ]


def fix_edits(
    report: LintReport, project: Project, stdin: Mapping[str, bytes] | None = None
) -> dict[EditKey, list[Edit]]:
    """The edits of every fixable finding of `report`, by (path, line, column, code). `stdin`:
    the content of a file read from standard input, by the name it is reported under."""
    out: dict[EditKey, list[Edit]] = {}
    for result in report.results:
        wanted = [d for d in result.diagnostics if d.fix_safety != "none"]
        if not wanted:
            continue
        try:
            data = (stdin or {}).get(result.path) or Path(result.path).read_bytes()
            text = decode_source(data).text
            rules = project.rules_for(result.path)
            analysis = analyze(text, result.path, rules, project.settings.target_version)
        except (OSError, SourceDecodeError, cst.ParserSyntaxError):
            continue  # changed since it was linted: its findings keep no edits
        findings = filter_findings(analysis.findings, text)
        by_place = {(f.code, f.line, f.column): f for f in findings if f.fix is not None}
        for diag in wanted:
            finding = by_place.get((diag.code, diag.line, diag.column))
            if finding is None or finding.fix is None:
                continue
            try:
                after = fixed_code(analysis.module, [finding.fix], text)
            except Exception:  # a fix that fails alone: rewrite reports it; no edits here
                continue
            out[(result.path, diag.line, diag.column, diag.code)] = text_edits(text, after)
    return out
