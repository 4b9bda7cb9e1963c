"""Output formats of `autoopt lint`: the ones a person reads (text, concise, full, grouped) and
the dispatch to every format (the ones CI systems read are in `autoopt.cli.ci_output`).

Findings go to stdout; nothing here decides the exit code. Files that could not be linted are
reported in every format; in the text formats as `path:line:col: error: reason` lines, the same
line `autoopt rewrite` prints for them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from autoopt.cli import ci_output
from autoopt.cli.options import plural
from autoopt.lint.engine.config import OUTPUT_FORMATS
from autoopt.lint.engine.results import Diagnostic, FileError, FileResult
from autoopt.lint.engine.runner import LintReport
from autoopt.lint.tree.encoding import SourceDecodeError, decode_source

if TYPE_CHECKING:  # the edits are computed only for the formats that show them
    from autoopt.cli.fix_edits import Edit, EditKey

# The formats a person reads: `text` is Ruff's concise format (autoopt's default).
TEXT_FORMATS = ("text", "concise", "full", "grouped")
# The formats whose fixes carry their edits (computed only for them: `autoopt.cli.fix_edits`).
EDIT_FORMATS = ("json", "json-lines", "rdjson")


def fixable(diag: Diagnostic, unsafe_fixes: bool = False) -> bool:
    """Whether `autoopt rewrite` (with `--unsafe-fixes` when asked) would fix it."""
    return diag.fix_safety == "safe" or (unsafe_fixes and diag.fix_safety == "unsafe")


def _place(cell: int | None, line: int, column: int) -> str:
    """`14:22`, or `cell 3:2:5` in a notebook."""
    return f"cell {cell}:{line}:{column}" if cell is not None else f"{line}:{column}"


def _location(path: str, cell: int | None, line: int, column: int) -> str:
    return f"{path}:{_place(cell, line, column)}:"


# ----- text ------------------------------------------------------------------------------------


def error_line(path: str, error: FileError) -> str:
    """`path:line:col: error: reason`: a file `lint` or `rewrite` could not handle, said alike."""
    loc = _location(path, error.cell, error.line or 1, error.column or 1)
    return (
        f"{click.style(loc, bold=True)} {click.style('error:', fg='red', bold=True)} {error.reason}"
    )


def render_text(
    report: LintReport,
    *,
    style: str = "concise",
    unsafe_fixes: bool = False,
    quiet: bool = False,
    statistics: bool = False,
    fixed: int | None = None,
    sources: Mapping[str, bytes] | None = None,
) -> str:
    """Findings as a person reads them, then a summary (styles are stripped by click off a
    terminal). `style`: "concise" (Ruff's: one line each), "full" (each with the code it points
    at and its fix), "grouped" (by file). `fixed`: how many fixes `--fix` applied before this
    report (None: no `--fix`). `sources`: the content of files not on disk (standard input)."""
    lines: list[str] = []
    if statistics:
        lines.extend(_statistics_lines(report, unsafe_fixes))
    else:
        for result in report.results:  # sorted by path; within a file by position
            rows = _rows(result, unsafe_fixes, grouped=style == "grouped")
            if style == "grouped":
                if rows:
                    lines += [click.style(f"{result.path}:", bold=True)]
                    lines += [text for text, _ in rows] + [""]
            elif style == "full":
                lines += _full(rows, _source_lines(result.path, sources))
            else:
                lines += [text for text, _ in rows]
    if not quiet:
        lines.extend(_summary_lines(report, unsafe_fixes, fixed))
    return "\n".join(lines) + ("\n" if lines else "")


def _rows(
    result: FileResult, unsafe_fixes: bool, grouped: bool
) -> list[tuple[str, Diagnostic | None]]:
    """One line per finding and per error of a file, in order of position, each with its
    finding (None for an error)."""
    rows: list[tuple[tuple[int, int, int], str, Diagnostic | None]] = []
    for error in result.errors:
        key = (error.cell or 0, error.line, error.column)
        text = error_line(result.path, error)
        if grouped:
            where = _place(error.cell, error.line or 1, error.column or 1)
            text = f"  {where} {click.style('error:', fg='red', bold=True)} {error.reason}"
        rows.append((key, text, None))
    for diag in result.diagnostics:
        loc = _location(result.path, diag.cell, diag.line, diag.column)
        if grouped:
            loc = "  " + _place(diag.cell, diag.line, diag.column)
        code = click.style(diag.code, fg="red", bold=True)
        marker = f"{click.style('[*]', fg='cyan')} " if fixable(diag, unsafe_fixes) else ""
        key = (diag.cell or 0, diag.line, diag.column)
        rows.append((key, f"{click.style(loc, bold=True)} {code} {marker}{diag.message}", diag))
    return [(text, diag) for _, text, diag in sorted(rows, key=lambda row: row[0])]


def _source_lines(path: str, sources: Mapping[str, bytes] | None) -> list[str] | None:
    """The lines of a reported file (None when it cannot be read back)."""
    try:
        data = (sources or {}).get(path) or Path(path).read_bytes()
        return decode_source(data).text.splitlines()
    except (OSError, SourceDecodeError):
        return None


def _full(rows: list[tuple[str, Diagnostic | None]], lines: list[str] | None) -> list[str]:
    """Ruff's full format: each finding's line, the code it points at (a line of context
    around it) with the span underlined, and its fix."""
    out: list[str] = []
    for row, diag in rows:
        out.append(row)
        if diag is None or lines is None or diag.cell is not None:
            continue  # an error, or a notebook (its lines are per cell: the line says where)
        if not 0 < diag.line <= len(lines):
            continue  # the file changed since it was linted
        first, last = max(1, diag.line - 1), min(len(lines), diag.line + 1)
        width = len(str(last))
        gutter = " " * width + " |"
        out.append(gutter)
        for number in range(first, last + 1):
            out.append(f"{number:>{width}} | {lines[number - 1]}".rstrip())
            if number == diag.line:
                end = diag.end_column if diag.end_line == diag.line else len(lines[number - 1]) + 1
                carets = "^" * max(1, end - diag.column)
                out.append(
                    f"{gutter} {' ' * (diag.column - 1)}{click.style(carets, fg='red')} {diag.code}"
                )
        out.append(gutter)
        if diag.fix_message:
            out.append(f"{' ' * width} = help: {diag.fix_message}")
        out.append("")
    return out


def _summary_lines(report: LintReport, unsafe_fixes: bool, fixed: int | None) -> list[str]:
    diags = [d for _, d in report.diagnostics]
    n_errors = len({p for p, _ in report.errors})
    out: list[str] = []
    if fixed:  # Ruff's line after --fix: what was found, fixed, and what remains
        total = plural(len(diags) + fixed, "finding")
        out.append(f"Found {total} ({fixed} fixed, {len(diags)} remaining).")
    if not diags and not n_errors:
        if fixed:
            return out
        checked = plural(report.files_checked, "file")
        out.append(click.style(f"All checks passed! ({checked} checked)", fg="green"))
        return out
    if diags:
        n_files = len({p for p, _ in report.diagnostics})
        if not fixed:
            out.append(
                f"Found {plural(len(diags), 'finding')} in {plural(n_files, 'file')} "
                f"({plural(report.files_checked, 'file')} checked)."
            )
        safe = sum(1 for d in diags if fixable(d, unsafe_fixes))
        hidden = sum(1 for d in diags if d.fix_safety == "unsafe") if not unsafe_fixes else 0
        command = "autoopt rewrite" if fixed is None else "autoopt lint --fix"
        if safe:
            flag = " --unsafe-fixes" if unsafe_fixes else ""
            out.append(f"{click.style('[*]', fg='cyan')} {safe} fixable with `{command}{flag}`.")
        if hidden:
            out.append(
                f"({hidden} more fixable with `{command} --unsafe-fixes`: "
                "those fixes may change behaviour.)"
            )
    if n_errors:
        # A rule's internal error costs only that rule's findings: the file was still linted.
        partial = {p for p, e in report.errors if e.kind == "internal"}
        legacy = {p for p, e in report.errors if e.kind == "legacy"} - partial
        failed = n_errors - len(partial | legacy)
        if failed:
            out.append(
                click.style(
                    f"{plural(failed, 'file')} could not be linted (see the errors above).",
                    fg="red",
                )
            )
        if legacy:
            out.append(
                click.style(
                    f"{plural(len(legacy), 'file')} parsed only as older Python reads it "
                    "(`async=` or tabs mixed into indentation): linted as if rewritten, no "
                    "fixes (see the errors above).",
                    fg="red",
                )
            )
        if partial:
            out.append(
                click.style(
                    f"{plural(len(partial), 'file')} linted without the rules that failed on "
                    "them (see the internal errors above).",
                    fg="red",
                )
            )
    return out


def _statistics_lines(report: LintReport, unsafe_fixes: bool) -> list[str]:
    rows = rule_statistics(report, unsafe_fixes)
    if not rows:
        return []
    width = max(len(str(r["count"])) for r in rows)
    code_width = max(len(r["code"]) for r in rows)
    return [
        f"{r['count']:>{width}}\t{r['code']:<{code_width}}\t{'[*] ' if r['fixable'] else ''}"
        f"{r['name']}"
        for r in rows
    ]


def rule_statistics(report: LintReport, unsafe_fixes: bool = False) -> list[dict[str, Any]]:
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


# ----- dispatch --------------------------------------------------------------------------------


def render(
    report: LintReport,
    output_format: str,
    *,
    statistics: bool = False,
    quiet: bool = False,
    unsafe_fixes: bool = False,
    root: Path | None = None,
    fixed: int | None = None,
    edits: Mapping[EditKey, list[Edit]] | None = None,
    sources: Mapping[str, bytes] | None = None,
) -> str:
    """The report in `output_format` (one of `OUTPUT_FORMATS`). `fixed`: see `render_text`;
    `edits`: the fixes' edits for the json formats (`fix_edits`); `root`: where sarif and gitlab
    paths are relative to; `sources`: see `render_text`."""
    if output_format in TEXT_FORMATS:
        style = "concise" if output_format == "text" else output_format
        return render_text(
            report,
            style=style,
            unsafe_fixes=unsafe_fixes,
            quiet=quiet,
            statistics=statistics,
            fixed=fixed,
            sources=sources,
        )
    if statistics:  # --statistics with a machine format: the counts as JSON
        return json.dumps(rule_statistics(report, unsafe_fixes), indent=2) + "\n"
    machine: dict[str, Callable[[], str]] = {
        "json": lambda: ci_output.render_json(report, edits),
        "json-lines": lambda: ci_output.render_json_lines(report, edits),
        "rdjson": lambda: ci_output.render_rdjson(report, edits),
        "sarif": lambda: ci_output.render_sarif(report, root),
        "github": lambda: ci_output.render_github(report),
        "gitlab": lambda: ci_output.render_gitlab(report, root),
        "junit": lambda: ci_output.render_junit(report),
        "pylint": lambda: ci_output.render_pylint(report),
        "azure": lambda: ci_output.render_azure(report),
    }
    assert set(machine) | set(TEXT_FORMATS) == set(OUTPUT_FORMATS), "a format without a renderer"
    if output_format not in machine:
        raise ValueError(f"unknown output format {output_format!r}")
    return machine[output_format]()
