"""Plain, picklable, JSON-able results of linting: what crosses process and cache boundaries.

`rule.Finding` carries libcst nodes and fixes (heavy, tied to one parse); a `Diagnostic` is the
part of it that output formats need, so workers and the cache never hold a syntax tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoopt.lint.engine.rule import Finding, FixSafety


@dataclass(frozen=True)
class Diagnostic:
    """One finding, as reported. Lines and columns are 1-based; in a notebook `line` is the line
    within cell number `cell` (1-based, counting every cell of the notebook)."""

    code: str
    message: str
    line: int
    column: int
    end_line: int
    end_column: int
    fix_safety: str = FixSafety.NONE.value  # "none" | "safe" | "unsafe"
    fix_message: str = ""
    cell: int | None = None

    @classmethod
    def from_finding(cls, finding: Finding) -> Diagnostic:
        fix_message = ""
        if finding.fix is not None:
            fix_message = finding.fix.description or finding.message
        return cls(
            code=finding.code,
            message=finding.message,
            line=finding.line,
            column=finding.column,
            end_line=finding.end_line,
            end_column=finding.end_column,
            fix_safety=FixSafety(finding.fix_safety).value if finding.fix else "none",
            fix_message=fix_message,
            cell=finding.cell,
        )

    def to_list(self) -> list[Any]:
        """Compact form for the cache."""
        return [
            self.code,
            self.message,
            self.line,
            self.column,
            self.end_line,
            self.end_column,
            self.fix_safety,
            self.fix_message,
            self.cell,
        ]

    @classmethod
    def from_list(cls, data: list[Any]) -> Diagnostic:
        return cls(*data)


@dataclass(frozen=True)
class FileError:
    """A file that could not be read, decoded, parsed or analysed. `line`/`column` are 1-based
    where known (0 when the problem is not at a place in the file)."""

    reason: str
    line: int = 0
    column: int = 0
    cell: int | None = None
    # "read" | "decode" | "parse" | "internal" | "error"; "legacy": a file that parses only as
    # Python < 3.7 (`async=`), linted as if renamed (`tree.legacy_async`)
    kind: str = "error"

    def to_list(self) -> list[Any]:
        return [self.reason, self.line, self.column, self.cell, self.kind]

    @classmethod
    def from_list(cls, data: list[Any]) -> FileError:
        return cls(*data)


@dataclass
class FileResult:
    """Everything about one file. `digest` is the content hash the result was computed from
    (empty when the file could not be read, which is never cached)."""

    path: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    digest: str = ""
    parsed: bool = False  # whether libcst parsed the file (False: pre-filter skipped it)
    cached: bool = False  # served from the cache
    # Other files of the project the result depends on (a local module a rule looked into,
    # see autoopt.lint.program.project_facts): path -> content hash when it was read.
    depends: dict[str, str] = field(default_factory=dict)

    def to_cache(self) -> list[Any]:
        return [
            self.digest,
            [d.to_list() for d in self.diagnostics],
            [e.to_list() for e in self.errors],
            self.depends,
        ]

    @classmethod
    def from_cache(cls, path: str, data: list[Any]) -> FileResult:
        digest, diags, errors, depends = data
        return cls(
            path=path,
            diagnostics=[Diagnostic.from_list(d) for d in diags],
            errors=[FileError.from_list(e) for e in errors],
            digest=digest,
            cached=True,
            depends=dict(depends),
        )
