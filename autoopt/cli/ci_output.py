"""The formats CI systems and tools read: json (Ruff's fields, with `fix.edits`), json-lines,
sarif (GitHub code scanning), github (Actions annotations), gitlab (Code Quality), junit, pylint,
azure (Pipelines logging commands) and rdjson (reviewdog).

Every format reports the files that could not be linted too: json entries with `"code": null` (as
Ruff does for syntax errors), SARIF tool execution notifications, `::error` annotations, junit
errors, gitlab issues of severity "critical". Nothing here decides the exit code.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

from autoopt.lint.engine.registry import rule_url
from autoopt.lint.engine.results import FileError
from autoopt.lint.engine.rule import Rule
from autoopt.lint.engine.runner import LintReport

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/autoopt/autoopt"

if TYPE_CHECKING:  # the edits are computed only for the formats that show them
    from autoopt.cli.fix_edits import Edit, EditKey

    Edits = Mapping[EditKey, list[Edit]]


def error_title(error: FileError) -> str:
    """What kind of problem kept a file from being linted, as a tool names it."""
    return {
        "parse": "SyntaxError",
        "legacy": "LegacySyntax",  # linted as older Python reads it (`async=`, mixed tabs)
        "decode": "DecodeError",
        "read": "IOError",
        "internal": "InternalError",
    }.get(error.kind, "Error")


# ----- json, json-lines ------------------------------------------------------------------------


def _urls(rules: Sequence[type[Rule]]) -> dict[str, str]:
    return {r.code: rule_url(r) for r in rules}


def json_entries(report: LintReport, edits: Edits | None = None) -> list[dict[str, Any]]:
    """Ruff's JSON fields, one object per finding (and per file error, with `code: null`); a
    fix carries its `edits` when they were computed (`autoopt.cli.fix_edits`)."""
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
                "message": f"{error_title(error)}: {error.reason}",
                "noqa_row": None,
                "url": None,
            }
        )
    for path, diag in report.diagnostics:
        fix = None
        if diag.fix_safety in ("safe", "unsafe"):
            fix = {
                "applicability": diag.fix_safety,
                "edits": (edits or {}).get((path, diag.line, diag.column, diag.code), []),
                "message": diag.fix_message or None,
            }
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


def render_json(report: LintReport, edits: Edits | None = None) -> str:
    return json.dumps(json_entries(report, edits), indent=2) + "\n"


def render_json_lines(report: LintReport, edits: Edits | None = None) -> str:
    """One JSON object per line: the entries of the json format, for tools that stream."""
    return "".join(json.dumps(entry) + "\n" for entry in json_entries(report, edits))


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
            "message": {"text": f"{error_title(error)}: {error.reason}"},
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
        title = _escape_property(f"autoopt {error_title(error)}")
        lines.append(f"::error {props},title={title}::{_escape_data(error.reason)}")
    for path, diag in report.diagnostics:
        title = diag.code if diag.cell is None else f"{diag.code} (cell {diag.cell})"
        props = (
            f"file={_escape_property(path)},line={diag.line},col={diag.column},"
            f"endLine={diag.end_line},endColumn={diag.end_column},title={_escape_property(title)}"
        )
        lines.append(f"::warning {props}::{_escape_data(diag.message)}")
    return "\n".join(lines) + ("\n" if lines else "")


# ----- gitlab ----------------------------------------------------------------------------------


def _relative(path: str, root: Path | None) -> str:
    """`path` relative to the project root (GitLab wants paths from the repository's top)."""
    base = os.environ.get("CI_PROJECT_DIR") or (str(root) if root is not None else os.getcwd())
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(base))
    return (os.path.abspath(path) if rel.startswith("..") else rel).replace(os.sep, "/")


def _issues(report: LintReport) -> Iterator[tuple[str, str, str, int, int, int, int, bool]]:
    """(path, check, text, line, column, end line, end column, is an error) of every problem."""
    for path, error in report.errors:
        line, column = error.line or 1, error.column or 1
        yield path, error_title(error), error.reason, line, column, line, column, True
    for path, d in report.diagnostics:
        yield path, d.code, d.message, d.line, d.column, d.end_line, d.end_column, False


def gitlab_issues(report: LintReport, root: Path | None = None) -> list[dict[str, Any]]:
    """GitLab Code Quality issues. A fingerprint hashes the path, the check and the message
    (not the line: an issue keeps its identity when code above it moves), with a counter for
    the same message twice in one file."""
    seen: dict[str, int] = {}
    issues = []
    for path, check, text, line, column, end_line, end_column, error in _issues(report):
        rel = _relative(path, root)
        key = f"{rel}\0{check}\0{text}"
        seen[key] = seen.get(key, 0) + 1
        fingerprint = hashlib.sha256(f"{key}\0{seen[key]}".encode()).hexdigest()[:32]
        issues.append(
            {
                "check_name": check,
                "description": f"{check}: {text}",
                "fingerprint": fingerprint,
                "severity": "critical" if error else "major",
                "location": {
                    "path": rel,
                    "positions": {
                        "begin": {"line": line, "column": column},
                        "end": {"line": end_line, "column": end_column},
                    },
                },
            }
        )
    return issues


def render_gitlab(report: LintReport, root: Path | None = None) -> str:
    return json.dumps(gitlab_issues(report, root), indent=2) + "\n"


# ----- junit -----------------------------------------------------------------------------------


def render_junit(report: LintReport) -> str:
    """JUnit XML, as Ruff writes it: a test suite per file with problems, a failing test case
    per finding (an error case per file that could not be linted); one passing case when
    there is nothing to report, so that CI shows the check ran."""
    by_file: dict[str, list[tuple[str, str, int, int, bool]]] = {}
    for path, check, text, line, column, _, _, error in _issues(report):
        by_file.setdefault(path, []).append((check, text, line, column, error))
    total = sum(len(v) for v in by_file.values())
    suites = ElementTree.Element(
        "testsuites", name="autoopt", tests=str(max(total, 1)), failures=str(total), errors="0"
    )
    if not by_file:
        suite = ElementTree.SubElement(
            suites, "testsuite", name="autoopt", tests="1", failures="0", errors="0"
        )
        ElementTree.SubElement(suite, "testcase", name="No findings")
    for path, cases in by_file.items():
        errors = sum(1 for *_, error in cases if error)
        suite = ElementTree.SubElement(
            suites,
            "testsuite",
            name=path,
            tests=str(len(cases)),
            disabled="0",
            errors=str(errors),
            failures=str(len(cases) - errors),
            package="autoopt",
        )
        for check, text, line, column, error in cases:
            case = ElementTree.SubElement(
                suite,
                "testcase",
                name=f"autoopt.{check}",
                classname=path,
                line=str(line),
                column=str(column),
            )
            failure = ElementTree.SubElement(case, "error" if error else "failure", message=text)
            failure.text = f"line {line}, col {column}, {text}"
    ElementTree.indent(suites)
    body = ElementTree.tostring(suites, encoding="unicode")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{body}\n'


# ----- pylint, azure ---------------------------------------------------------------------------


def render_pylint(report: LintReport) -> str:
    """Pylint's parseable format, `path:line: [CODE] message`, which many editors read."""
    lines = [f"{path}:{line}: [{check}] {text}" for path, check, text, line, *_ in _issues(report)]
    return "".join(line + "\n" for line in lines)


def render_azure(report: LintReport) -> str:
    """Azure Pipelines logging commands: one `##vso[task.logissue]` per problem."""
    out = []
    for path, check, text, line, column, _, _, error in _issues(report):
        kind = "error" if error else "warning"
        out.append(
            f"##vso[task.logissue type={kind};sourcepath={path};linenumber={line};"
            f"columnnumber={column};code={check};]{text}\n"
        )
    return "".join(out)


# ----- rdjson ----------------------------------------------------------------------------------


def _range(line: int, column: int, end_line: int, end_column: int) -> dict[str, Any]:
    return {
        "start": {"line": line, "column": column},
        "end": {"line": end_line, "column": end_column},
    }


def rdjson(report: LintReport, edits: Edits | None = None) -> dict[str, Any]:
    """reviewdog's diagnostic format: a fix's edits become its suggestions."""
    urls = _urls(report.rules)
    diagnostics = []
    for path, error in report.errors:
        line, column = error.line or 1, error.column or 1
        diagnostics.append(
            {
                "message": f"{error_title(error)}: {error.reason}",
                "location": {"path": path, "range": _range(line, column, line, column)},
                "severity": "ERROR",
            }
        )
    for path, d in report.diagnostics:
        entry: dict[str, Any] = {
            "message": d.message,
            "location": {"path": path, "range": _range(d.line, d.column, d.end_line, d.end_column)},
            "code": {"value": d.code, "url": urls.get(d.code, "")},
        }
        suggestions = [
            {
                "range": _range(
                    e["location"]["row"],
                    e["location"]["column"],
                    e["end_location"]["row"],
                    e["end_location"]["column"],
                ),
                "text": e["content"],
            }
            for e in (edits or {}).get((path, d.line, d.column, d.code), [])
        ]
        if suggestions:
            entry["suggestions"] = suggestions
        diagnostics.append(entry)
    return {
        "source": {"name": "autoopt", "url": INFORMATION_URI},
        "severity": "WARNING",
        "diagnostics": diagnostics,
    }


def render_rdjson(report: LintReport, edits: Edits | None = None) -> str:
    return json.dumps(rdjson(report, edits), indent=2) + "\n"
