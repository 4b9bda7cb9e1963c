"""`autoopt lint --fix`: apply the fixes (the engine of `autoopt rewrite`), then lint what remains.

Ruff's convention, which CI steps and pre-commit hooks rely on: the findings left after fixing
are printed like any others, and the exit code is 1 while any remains, so a `lint --fix` step
never passes a file that still has findings (`--exit-non-zero-on-fix` also fails the step when
something was fixed: the commit holds different code from what was checked). On standard input
the fixed source goes to standard output (an editor's fix-on-save), the findings to stderr.
"""

from __future__ import annotations

from dataclasses import dataclass

import click

from autoopt.cli.output import error_line
from autoopt.cli.rewrite import RewriteSummary, rewrite_bytes, rewrite_files
from autoopt.lint.engine.project import Project


@dataclass(frozen=True)
class Fixed:
    """What `--fix` did: how many fixes it applied, and whether one of its own steps failed
    (a fix that crashed, a file it could not write: problems the lint that follows cannot see)."""

    count: int
    failed: bool


def fix_files(project: Project) -> Fixed:
    """Apply the safe fixes (and the unsafe ones when the settings say so) to the project's files
    in place; say on stderr what could not be done."""
    summary = RewriteSummary()
    rewrite_files(project, wrap=False, diff=False, write=True, summary=summary)
    return _said(summary)


def fix_stdin(data: bytes, project: Project, filename: str | None) -> tuple[bytes, Fixed]:
    """The fixed source of `data` (standard input, reported as `filename`), and what was fixed."""
    shown = filename or "-"
    rules = project.rules_for(shown) if filename else project.rules
    summary = RewriteSummary()
    rewritten = rewrite_bytes(data, shown, rules, project.settings, wrap=False, summary=summary)
    if rewritten is not None:
        decoded, new = rewritten
        data = decoded.encode(new)
    return data, _said(summary)


def _said(summary: RewriteSummary) -> Fixed:
    """Print the problems only `--fix` meets (the lint that follows reports the files it cannot
    read or parse), and the fixes whose edit failed verification: why a finding remains."""
    failed = [(where, error) for where, error in summary.errors if error.kind == "internal"]
    for where, error in failed:
        click.echo(error_line(where, error), err=True)
    for where, what, reason in summary.rejected:
        click.echo(
            f"not applied: {where}: {what}: the edit failed verification: {reason}", err=True
        )
    return Fixed(sum(summary.applied.values()), bool(failed))
