"""Output formats of `autoopt lint`: text (Ruff's concise format), json, sarif, github.

Findings go to stdout; nothing here decides the exit code. Files that could not be linted are
reported in every format: text lines with `error:`, json entries with `"code": null` (as Ruff
does for syntax errors), SARIF tool execution notifications, and github `::error` annotations.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from autoopt.lint.engine.registry import rule_url
from autoopt.lint.engine.results import Diagnostic, FileError
from autoopt.lint.engine.rule import Rule
from autoopt.lint.engine.runner import LintReport

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/autoopt/autoopt"


def fixable(diag: Diagnostic, unsafe_fixes: bool = False) -> bool:
    """Whether `autoopt rewrite` (with `--unsafe-fixes` when asked) would fix it."""
    return diag.fix_safety == "safe" or (unsafe_fixes and diag.fix_safety == "unsafe")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _location(path: str, cell: int | None, line: int, column: int) -> str:
    where = f"{path}:cell {cell}:" if cell is not None else f"{path}:"
    return f"{where}{line}:{column}:"


# ----- text ------------------------------------------------------------------------------------


def render_text(
    report: LintReport,
    *,
    unsafe_fixes: bool = False,
    quiet: bool = False,
    statistics: bool = False,
) -> str:
    """Ruff's concise format plus a summary (styles are stripped by click off a terminal)."""
    lines: list[str] = []
    if statistics:
        lines.extend(_statistics_lines(report, unsafe_fixes))
    else:
        for result in report.results:  # sorted by path; within a file by position
            rows: list[tuple[tuple[int, int, int], str]] = []
            for error in result.errors:
                loc = _location(result.path, error.cell, error.line or 1, error.column or 1)
                label = click.style("error:", fg="red", bold=True)
                key = (error.cell or 0, error.line, error.column)
                rows.append((key, f"{click.style(loc, bold=True)} {label} {error.reason}"))
            for diag in result.diagnostics:
                loc = _location(result.path, diag.cell, diag.line, diag.column)
                code = click.style(diag.code, fg="red", bold=True)
                marker = f"{click.style('[*]', fg='cyan')} " if fixable(diag, unsafe_fixes) else ""
                key = (diag.cell or 0, diag.line, diag.column)
                rows.append((key, f"{click.style(loc, bold=True)} {code} {marker}{diag.message}"))
            lines.extend(text for _, text in sorted(rows, key=lambda row: row[0]))
    if not quiet:
        lines.extend(_summary_lines(report, unsafe_fixes))
    return "\n".join(lines) + ("\n" if lines else "")


def _summary_lines(report: LintReport, unsafe_fixes: bool) -> list[str]:
    diags = [d for _, d in report.diagnostics]
    n_errors = len({p for p, _ in report.errors})
    out: list[str] = []
    if not diags and not n_errors:
        checked = _plural(report.files_checked, "file")
        out.append(click.style(f"All checks passed! ({checked} checked)", fg="green"))
        return out
    if diags:
        n_files = len({p for p, _ in report.diagnostics})
        out.append(
            f"Found {_plural(len(diags), 'finding')} in {_plural(n_files, 'file')} "
            f"({_plural(report.files_checked, 'file')} checked)."
        )
        safe = sum(1 for d in diags if fixable(d, unsafe_fixes))
        hidden = sum(1 for d in diags if d.fix_safety == "unsafe") if not unsafe_fixes else 0
        if safe:
            command = "autoopt rewrite --unsafe-fixes" if unsafe_fixes else "autoopt rewrite"
            out.append(f"{click.style('[*]', fg='cyan')} {safe} fixable with `{command}`.")
        if hidden:
            out.append(
                f"({hidden} more fixable with `autoopt rewrite --unsafe-fixes`: "
                "those fixes may change behaviour.)"
            )
    if n_errors:
        # A rule's internal error costs only that rule's findings: the file was still linted.
        partial = {p for p, e in report.errors if e.kind == "internal"}
        failed = n_errors - len(partial)
        if failed:
            out.append(
                click.style(
                    f"{_plural(failed, 'file')} could not be linted (see the errors above).",
                    fg="red",
                )
            )
        if partial:
            out.append(
                click.style(
                    f"{_plural(len(partial), 'file')} linted without the rules that failed on "
                    "them (see the internal errors above).",
                    fg="red",
                )
            )
    return out


def _statistics_lines(report: LintReport, unsafe_fixes: bool) -> list[str]:
    rows = statistics(report, unsafe_fixes)
    if not rows:
        return []
    width = max(len(str(r["count"])) for r in rows)
    code_width = max(len(r["code"]) for r in rows)
    return [
        f"{r['count']:>{width}}\t{r['code']:<{code_width}}\t{'[*] ' if r['fixable'] else ''}"
        f"{r['name']}"
        for r in rows
    ]


def statistics(report: LintReport, unsafe_fixes: bool = False) -> list[dict[str, Any]]:
    """Counts per rule, most frequent first (then by code)."""
    counts = Counter(d.code for _, d in report.diagnostics)
    fix_counts = Counter(d.code for _, d in report.diagnostics if fixable(d, unsafe_fixes))
    names = {r.code: r.name for r in report.rules}
    return [
        {
            "code": code,
            "name": names.get(code, ""),
            "count": count,
            "fixable": fix_counts[code] > 0,
        }
        for code, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


# ----- json ------------------------------------------------------------------------------------


def _urls(rules: Sequence[type[Rule]]) -> dict[str, str]:
    return {r.code: rule_url(r) for r in rules}


def json_entries(report: LintReport) -> list[dict[str, Any]]:
    """Ruff's JSON fields, one object per finding (and per file error, with `code: null`)."""
    urls = _urls(report.rules)
    entries: list[dict[str, Any]] = []
    for path, error in report.errors:
        entries.append(
            {
                "cell": error.cell,
                "code": None,
                "end_location": {"column": error.column or 1, "row": error.line or 1},
                "filename": os.path.abspath(path),
                "fix": None,
                "location": {"column": error.column or 1, "row": error.line or 1},
                "message": f"{_error_title(error)}: {error.reason}",
                "noqa_row": None,
                "url": None,
            }
        )
    for path, diag in report.diagnostics:
        fix = None
        if diag.fix_safety in ("safe", "unsafe"):
            fix = {"applicability": diag.fix_safety, "message": diag.fix_message or None}
        entries.append(
            {
                "cell": diag.cell,
                "code": diag.code,
                "end_location": {"column": diag.end_column, "row": diag.end_line},
                "filename": os.path.abspath(path),
                "fix": fix,
                "location": {"column": diag.column, "row": diag.line},
                "message": diag.message,
                "noqa_row": diag.line,
                "url": urls.get(diag.code),
            }
        )
    return entries


def _error_title(error: FileError) -> str:
    return {
        "parse": "SyntaxError",
        "decode": "DecodeError",
        "read": "IOError",
        "internal": "InternalError",
    }.get(error.kind, "Error")


def render_json(report: LintReport, statistics_only: bool = False) -> str:
    data: Any = statistics(report) if statistics_only else json_entries(report)
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


# ----- sarif -----------------------------------------------------------------------------------


def _artifact(path: str, root: Path | None) -> dict[str, Any]:
    absolute = Path(os.path.abspath(path))
    if root is not None:
        try:
            rel = absolute.relative_to(root)
            return {"uri": rel.as_posix(), "uriBaseId": "%SRCROOT%"}
        except ValueError:
            pass
    return {"uri": absolute.as_uri()}


def _region(line: int, column: int, end_line: int | None = None, end_column: int | None = None):
    region: dict[str, Any] = {"startLine": max(line, 1), "startColumn": max(column, 1)}
    if end_line is not None:
        region["endLine"] = max(end_line, 1)
    if end_column is not None:
        region["endColumn"] = max(end_column, 1)
    return region


def sarif_log(report: LintReport, root: Path | None = None) -> dict[str, Any]:
    """A SARIF 2.1.0 log that GitHub code scanning accepts."""
    from autoopt import __version__

    root = Path(os.path.abspath(root)) if root is not None else None
    rules = sorted(report.rules, key=lambda r: r.code)
    index = {r.code: i for i, r in enumerate(rules)}
    driver_rules = []
    for rule in rules:
        docs = rule.documentation() or rule.message
        driver_rules.append(
            {
                "id": rule.code,
                "name": rule.name,
                "shortDescription": {"text": rule.message},
                "fullDescription": {"text": docs},
                "help": {"text": docs, "markdown": docs},
                "helpUri": rule_url(rule),
                "defaultConfiguration": {"level": "warning"},
                "properties": {"fix": rule.fix_safety.value, "tags": ["performance"]},
            }
        )
    results = []
    for path, diag in report.diagnostics:
        result: dict[str, Any] = {
            "ruleId": diag.code,
            "level": "warning",
            "message": {"text": diag.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": _artifact(path, root),
                        "region": _region(diag.line, diag.column, diag.end_line, diag.end_column),
                    }
                }
            ],
        }
        if diag.code in index:
            result["ruleIndex"] = index[diag.code]
        if diag.cell is not None:
            result["properties"] = {"cell": diag.cell}
        results.append(result)
    notifications = [
        {
            "level": "error",
            "message": {"text": f"{_error_title(error)}: {error.reason}"},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": _artifact(path, root),
                        "region": _region(error.line or 1, error.column or 1),
                    }
                }
            ],
        }
        for path, error in report.errors
    ]
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "autoopt",
                "version": __version__,
                "informationUri": INFORMATION_URI,
                "rules": driver_rules,
            }
        },
        "results": results,
        "invocations": [
            {
                "executionSuccessful": not notifications,
                "toolExecutionNotifications": notifications,
            }
        ],
    }
    if root is not None:
        run["originalUriBaseIds"] = {"%SRCROOT%": {"uri": root.as_uri().rstrip("/") + "/"}}
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def render_sarif(report: LintReport, root: Path | None = None) -> str:
    return json.dumps(sarif_log(report, root), indent=2) + "\n"


# ----- github ----------------------------------------------------------------------------------


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(report: LintReport) -> str:
    """GitHub Actions workflow commands: one annotation per finding or file error."""
    lines = []
    for path, error in report.errors:
        props = f"file={_escape_property(path)},line={error.line or 1},col={error.column or 1}"
        title = _escape_property(f"autoopt {_error_title(error)}")
        lines.append(f"::error {props},title={title}::{_escape_data(error.reason)}")
    for path, diag in report.diagnostics:
        title = diag.code if diag.cell is None else f"{diag.code} (cell {diag.cell})"
        props = (
            f"file={_escape_property(path)},line={diag.line},col={diag.column},"
            f"endLine={diag.end_line},endColumn={diag.end_column},title={_escape_property(title)}"
        )
        lines.append(f"::warning {props}::{_escape_data(diag.message)}")
    return "\n".join(lines) + ("\n" if lines else "")


# ----- dispatch --------------------------------------------------------------------------------


def render(
    report: LintReport,
    output_format: str,
    *,
    statistics: bool = False,
    quiet: bool = False,
    unsafe_fixes: bool = False,
    root: Path | None = None,
) -> str:
    """The report in `output_format` (text, json, sarif, github)."""
    if output_format == "text":
        return render_text(report, unsafe_fixes=unsafe_fixes, quiet=quiet, statistics=statistics)
    if output_format == "json":
        return render_json(report, statistics_only=statistics)
    if output_format == "sarif":
        return render_sarif(report, root)
    if output_format == "github":
        return render_github(report)
    raise ValueError(f"unknown output format {output_format!r}")
