"""`autoopt rewrite [PATH...]`: apply the rules' fixes to files (or `--wrap` them).

Files are edited in place through a temp file in the same folder and `os.replace`, keeping the
file's permissions, so a crash never leaves a half-written script. `--diff` prints a unified diff
and writes nothing; `--check` writes nothing; both exit 1 if anything would change (Ruff). A file that
cannot be read or parsed is reported and left alone while the others are processed (exit 2); a
rule that crashes (or whose fix fails) on a file is skipped there, the file still gets the other
rules' fixes, and the summary names it (exit 2). Every edit, `--wrap`'s too, is verified before
it is written (`autoopt.lint.rewrite.verify`); one that fails is left out and the summary names the fix,
the file and why ("not applied: ..."). A file is read with its PEP 263 cookie or BOM
and written back in the same encoding.
`-` reads the source from standard input and writes the rewritten source (or its diff) to
standard output, as an editor's fix-on-save wants it. Bad input is refused as `autoopt lint`
refuses it, in the same words (a missing path, a file that is not Python, a syntax error at its
line and column): exit 2.
The summary (files rewritten, fixes per code, declined fixes with their reasons, unsafe fixes
available) goes to stderr; diffs go to stdout.
"""

from __future__ import annotations

import difflib
import os
import stat
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click
import libcst as cst

from autoopt.cli.options import (
    build_options,
    open_project,
    reads_stdin,
    refuse_non_python,
    say_settings,
    selection_options,
    stdin_filename_option,
    verbose_option,
    warn_no_files,
)
from autoopt.cli.output import error_line
from autoopt.lint.engine.config import Settings
from autoopt.lint.engine.discovery import display_path, is_notebook
from autoopt.lint.engine.project import Project
from autoopt.lint.engine.results import FileError
from autoopt.lint.engine.rule import Finding, FixSafety, Rule
from autoopt.lint.engine.runner import read_error, syntax_error, unreadable_source
from autoopt.lint.engine.suppress import filter_findings
from autoopt.lint.rewrite.apply import RewriteError, fix_source
from autoopt.lint.rewrite.verify import verify_edit
from autoopt.lint.tree.encoding import SourceDecodeError, SourceText, decode_source
from autoopt.lint.tree.notebook import NotebookError, notebook_source
from autoopt.lint.wrap.insert import WrapResult, WrapTally, wrap_source

WRAP_UNVERIFIED = "the inserted call failed verification"


@dataclass
class RewriteSummary:
    """What a run did, for the stderr report and the exit code."""

    changed: list[str] = field(default_factory=list)
    applied: Counter[str] = field(default_factory=Counter)
    declined: list[tuple[str, Finding | str]] = field(default_factory=list)
    unsafe: Counter[str] = field(default_factory=Counter)
    # Files (or fixes) that could not be handled, said as `lint` says them: (path, error).
    errors: list[tuple[str, FileError]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    # Edits that failed verification and were not written: (file[:line], what, why).
    rejected: list[tuple[str, str, str]] = field(default_factory=list)
    wrap: WrapTally = field(default_factory=WrapTally)

    def error(self, where: str, reason: str) -> None:
        """A problem at no particular place of the file (a fix skipped, a write that failed)."""
        self.errors.append((where, FileError(reason, kind="internal")))

    def exit_code(self, *, would_change: bool) -> int:
        """2 when something could not be rewritten; else (`--check`, `--diff`: Ruff's
        convention) 1 when something would change; else 0."""
        if self.errors:
            return 2
        return 1 if would_change and self.changed else 0


@click.command("rewrite")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--diff",
    is_flag=True,
    help="Print a unified diff of the changes; write nothing; exit 1 if any.",
)
@click.option(
    "--check", is_flag=True, help="Write nothing; exit 1 if any file would change (for CI)."
)
@click.option(
    "--unsafe-fixes/--no-unsafe-fixes",
    default=None,
    help="Also apply fixes that may change behaviour (see `autoopt explain CODE`).",
)
@click.option(
    "--wrap",
    is_flag=True,
    help="Instead of inline fixes, insert `model, loader, optimizer = autoopt.optimize(...)`.",
)
@stdin_filename_option
@verbose_option
@selection_options
def rewrite(
    paths: tuple[Path, ...],
    diff: bool,
    check: bool,
    unsafe_fixes: bool | None,
    wrap: bool,
    stdin_filename: str | None,
    verbose: bool,
    **selection: Any,
) -> None:
    """Rewrite training scripts to adopt the tricks (edits files in place; `-` reads standard
    input and writes the result to standard output)."""
    from_stdin = reads_stdin(paths)
    refuse_non_python(paths)
    options = build_options(**selection, unsafe_fixes=unsafe_fixes)
    project = open_project(paths, options, stdin_filename)
    if verbose:
        say_settings(project)
    summary = RewriteSummary()
    if from_stdin:
        shown = stdin_filename or "-"
        rules = project.rules_for(shown) if stdin_filename else project.rules
        new = rewrite_bytes(
            sys.stdin.buffer.read(), shown, rules, project.settings, wrap=wrap, summary=summary
        )
        if new is not None:
            _show_stdin_result(new, shown, diff=diff, check=check)
    else:
        warn_no_files(project, paths, quiet=False)
        rewrite_files(project, wrap=wrap, diff=diff, write=not (diff or check), summary=summary)
    print_summary(summary, wrap=wrap, write=not (diff or check))
    raise SystemExit(summary.exit_code(would_change=check or diff))


def _show_stdin_result(new: tuple[SourceText, str], shown: str, *, diff: bool, check: bool) -> None:
    """Standard input's rewrite on standard output: the new source (an editor's fix-on-save),
    or its diff."""
    decoded, fixed = new
    if diff:
        click.echo(unified_diff(decoded.text, fixed, shown), nl=False)
    elif not check:
        sys.stdout.buffer.write(decoded.encode(fixed))
        sys.stdout.flush()


def rewrite_files(
    project: Project, *, wrap: bool, diff: bool, write: bool, summary: RewriteSummary
) -> None:
    """Rewrite (or diff) every file of `project`; fills `summary`."""
    summary.errors.extend(project.discovered.errors)
    for path in project.files:
        rewrite_path(
            path,
            display_path(path),
            project.rules_for(path),
            project.settings,
            wrap=wrap,
            diff=diff,
            write=write,
            summary=summary,
        )


def rewrite_path(
    path: Path,
    shown: str,
    rules: Sequence[type[Rule]],
    settings: Settings,
    *,
    wrap: bool,
    diff: bool,
    write: bool,
    summary: RewriteSummary,
) -> None:
    """Rewrite one file (or say why not); fills `summary`."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        summary.errors.append((shown, read_error(exc)))
        return
    if is_notebook(path):
        try:
            notebook_source(decode_source(data).text)
        except (SourceDecodeError, NotebookError) as exc:
            summary.errors.append((shown, unreadable_source(exc)))
        else:
            summary.skipped.append((shown, "notebooks are not rewritten (lint reports them)"))
        return
    rewritten = rewrite_bytes(data, shown, rules, settings, wrap=wrap, summary=summary)
    if rewritten is None:
        return
    decoded, new = rewritten
    if new == decoded.text:
        return
    if diff:
        click.echo(unified_diff(decoded.text, new, shown), nl=False)
    if write:
        try:
            atomic_write(path, decoded.encode(new))
        except UnicodeEncodeError as exc:
            summary.changed.remove(shown)
            summary.error(
                shown,
                f"not written: the fixes add {exc.object[exc.start]!r}, which "
                f"{decoded.encoding} cannot encode",
            )
        except OSError as exc:
            summary.changed.remove(shown)
            summary.error(shown, f"cannot write: {exc.strerror or exc}")


def rewrite_bytes(
    data: bytes,
    shown: str,
    rules: Sequence[type[Rule]],
    settings: Settings,
    *,
    wrap: bool,
    summary: RewriteSummary,
) -> tuple[SourceText, str] | None:
    """(the decoded source, the rewritten text) of one file's bytes, or None when they cannot
    be rewritten (the reason goes to `summary.errors`, worded as `lint` words it). A changed
    file is counted in `summary.changed`."""
    try:
        decoded = decode_source(data)
    except SourceDecodeError as exc:
        summary.errors.append((shown, unreadable_source(exc)))
        return None
    source = decoded.text
    try:
        if wrap:
            wrapped = _verified_wrap(source, Path(shown), shown, rules, settings, summary)
            new = wrapped.source
            summary.wrap.add(wrapped)
            if wrapped.declined:
                summary.declined.append((shown, wrapped.message))
        else:
            result = fix_source(
                source,
                rules,
                unsafe=settings.unsafe_fixes,
                target_version=settings.target_version,
                path=shown,
                finding_filter=filter_findings,
            )
            new = result.source
            summary.applied.update(a.code for a in result.applied)
            # Report-only rules (no fix at all) are lint's business; here: fixes that declined.
            fixable = {r.code for r in rules if r.fix_safety is not FixSafety.NONE}
            summary.declined.extend((shown, f) for f in result.declined if f.code in fixable)
            summary.unsafe.update(f.code for f in result.unsafe_available)
            summary.rejected.extend(
                (f"{shown}:{r.line}", f"{r.code} {r.description}", r.reason)
                for r in result.rejected
            )
            # A rule that crashed or whose fix failed: the file gets the other fixes; exit 2.
            for skipped in result.skipped:
                summary.error(shown, f"{skipped.code} fix skipped: {skipped.reason}")
    except cst.ParserSyntaxError as exc:
        summary.errors.append((shown, syntax_error(source, exc)))
        return None
    except (RecursionError, RewriteError) as exc:
        summary.error(shown, str(exc) or type(exc).__name__)
        return None
    except Exception as exc:  # a bug outside any rule (the engine, --wrap): this file only
        what = "--wrap" if wrap else "the rewrite engine"
        summary.error(shown, f"internal error in {what}: {type(exc).__name__}: {exc}")
        return None
    if new != source:
        summary.changed.append(shown)
    return decoded, new


def unified_diff(source: str, new: str, shown: str) -> str:
    """The change as `git diff` shows it (a/ and b/ prefixes)."""
    return "".join(
        difflib.unified_diff(
            source.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{shown}",
            tofile=f"b/{shown}",
        )
    )


def _verified_wrap(
    source: str,
    path: Path,
    shown: str,
    rules: Sequence[type[Rule]],
    settings: Settings,
    summary: RewriteSummary,
) -> WrapResult:
    """`wrap_source`, with its edit verified as every fix's is (`autoopt.lint.rewrite.verify`): an
    insertion that would break the script is not written and counts as declined, with why."""
    wrapped = wrap_source(source, path=path)
    if not wrapped.changed:
        return wrapped
    verdict = verify_edit(
        source,
        wrapped.source,
        rules=rules,
        target_version=settings.target_version,
        path=shown,
        finding_filter=filter_findings,
        # A new finding without a fix is advice that the runtime now makes relevant (AO610's
        # tensor-core sizes once optimize() runs AMP), not a break of the script.
        fixed_later=lambda finding: finding.fix is None,
    )
    if verdict.ok:
        return wrapped
    summary.rejected.append((shown, "--wrap " + "; ".join(wrapped.inserted), verdict.reason()))
    return replace(
        wrapped,
        source=source,
        declined=True,
        reason=WRAP_UNVERIFIED,
        message=f"--wrap declined: the inserted call failed verification ({verdict.reason()})",
        inserted=(),
    )


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path`'s content with `data` via a temp file in the same folder and `os.replace`
    (never half-written), keeping its permission bits. A symlink's target is the file written."""
    target = Path(os.path.realpath(path))
    mode = stat.S_IMODE(target.stat().st_mode)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{code} ×{n}" for code, n in sorted(counter.items()))


def print_summary(summary: RewriteSummary, *, wrap: bool, write: bool) -> None:
    """The run's report on stderr: errors, skips, rejected and declined fixes, then the tally."""

    def err(line: str) -> None:
        click.echo(line, err=True)

    for where, error in summary.errors:
        err(error_line(where, error))
    for where, reason in summary.skipped:
        err(f"skipped: {where}: {reason}")
    for where, what, reason in summary.rejected:
        err(f"not applied: {where}: {what}: the edit failed verification: {reason}")
    for where, item in summary.declined:
        if isinstance(item, str):
            err(f"declined: {where}: {item}")
        else:
            err(f"declined: {where}:{item.line}:{item.column}: {item.code} {item.message}")
    verb = "Rewrote" if write else "Would rewrite"
    n = len(summary.changed)
    line = f"{verb} {n} file{'s' if n != 1 else ''}"
    if summary.applied:
        line += f" ({sum(summary.applied.values())} fixes: {_counts(summary.applied)})"
    elif wrap:
        line += f" ({summary.wrap.line()})"
    err(line + ".")
    if summary.unsafe:
        total = sum(summary.unsafe.values())
        err(
            f"{total} unsafe fix{'es' if total != 1 else ''} available with --unsafe-fixes "
            f"({_counts(summary.unsafe)})."
        )


COMMANDS: list[click.Command] = [rewrite]
