"""`autoopt lint --add-noqa`: a `# noqa: CODES` comment on every line with a finding, as Ruff's
`--add-noqa` writes it, so that a large code base can adopt autoopt at once and fix its findings
later. Files are rewritten atomically in their own encoding; notebooks are left alone (autoopt
does not edit them), and so is a line that cannot end in a comment (inside a string, after a
backslash), which is named on stderr.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import click

from autoopt.cli.output import error_line
from autoopt.cli.rewrite import atomic_write
from autoopt.lint.engine.discovery import is_notebook
from autoopt.lint.engine.runner import LintReport
from autoopt.lint.engine.suppress import add_noqa
from autoopt.lint.tree.encoding import SourceDecodeError, decode_source


def add_noqa_comments(report: LintReport) -> int:
    """Add the comments for `report`'s findings to their files; say how many on stderr (and
    the files that could not be linted, which got none). Returns the number of lines changed."""
    for path, error in report.errors:
        click.echo(error_line(path, error), err=True)
    total = 0
    for result in report.results:
        if not result.diagnostics or is_notebook(result.path):
            continue
        codes: defaultdict[int, set[str]] = defaultdict(set)
        for diag in result.diagnostics:
            codes[diag.line].add(diag.code)
        path = Path(result.path)
        try:
            decoded = decode_source(path.read_bytes())
            new, changed, refused = add_noqa(decoded.text, codes)
            if changed:
                atomic_write(path, decoded.encode(new))
        except (OSError, SourceDecodeError, UnicodeEncodeError) as exc:
            click.echo(f"autoopt: error: {result.path}: no noqa added: {exc}", err=True)
            continue
        total += changed
        for line in refused:
            click.echo(
                f"autoopt: warning: {result.path}:{line}: no noqa added (the line ends inside "
                "a string or a backslash continuation)",
                err=True,
            )
    click.echo(f"Added {total} noqa directive{'' if total == 1 else 's'}.", err=True)
    return total
