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
The summary (files rewritten, fixes per code, declined fixes with their reasons, unsafe fixes
available) goes to stderr; diffs go to stdout.
"""

from __future__ import annotations

import difflib
import os
import stat
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import click
import libcst as cst

from autoopt.cli.options import (
    build_options,
    fail,
    selection_options,
    warn_skipped_rules,
)
from autoopt.lint.engine.config import ConfigError, Settings
from autoopt.lint.engine.discovery import display_path, is_notebook
from autoopt.lint.engine.project import load_project
from autoopt.lint.engine.registry import RuleError
from autoopt.lint.engine.rule import Finding, FixSafety, Rule
from autoopt.lint.engine.suppress import filter_findings
from autoopt.lint.rewrite.apply import RewriteError, fix_source
from autoopt.lint.rewrite.verify import verify_edit
from autoopt.lint.tree.encoding import SourceDecodeError, decode_source
from autoopt.lint.wrap.insert import WrapResult, WrapTally, wrap_source

WRAP_UNVERIFIED = "the inserted call failed verification"


@dataclass
class _Summary:
    """What a run did, for the stderr report and the exit code."""

    changed: list[str] = field(default_factory=list)
    applied: Counter[str] = field(default_factory=Counter)
    declined: list[tuple[str, Finding | str]] = field(default_factory=list)
    unsafe: Counter[str] = field(default_factory=Counter)
    errors: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    # Edits that failed verification and were not written: (file[:line], what, why).
    rejected: list[tuple[str, str, str]] = field(default_factory=list)
    wrap: WrapTally = field(default_factory=WrapTally)


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
@selection_options
def rewrite(
    paths: tuple[Path, ...],
    diff: bool,
    check: bool,
    unsafe_fixes: bool | None,
    wrap: bool,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    extend_select: tuple[str, ...],
    target_version: str | None,
    config_file: Path | None,
    force_exclude: bool | None,
    allow_project_rules: bool | None,
) -> None:
    """Rewrite training scripts to adopt the tricks (edits files in place)."""
    options = build_options(
        select,
        ignore,
        extend_select,
        target_version,
        config_file,
        force_exclude,
        allow_project_rules,
        unsafe_fixes=unsafe_fixes,
    )
    try:
        project = load_project(list(paths) or ["."], options)
    except (ConfigError, RuleError) as exc:
        fail(str(exc))
        return
    warn_skipped_rules(project.settings)

    summary = _Summary()
    summary.errors.extend((where, error.message) for where, error in project.discovered.errors)
    write = not (diff or check)
    for path in project.files:
        shown = display_path(path)
        if is_notebook(path):
            summary.skipped.append((shown, "notebooks are not rewritten (lint reports them)"))
            continue
        rules = project.rules_for(path)
        _rewrite_file(path, shown, rules, project.settings, wrap, diff, write, summary)

    _print_summary(summary, wrap=wrap, write=write)
    if summary.errors:
        raise SystemExit(2)
    if (check or diff) and summary.changed:  # Ruff's convention: 1 when it would change
        raise SystemExit(1)


def _rewrite_file(
    path: Path,
    shown: str,
    rules: Sequence[type[Rule]],
    settings: Settings,
    wrap: bool,
    diff: bool,
    write: bool,
    summary: _Summary,
) -> None:
    """Rewrite one file (or say why not); fills `summary`."""
    try:
        decoded = decode_source(path.read_bytes())
    except SourceDecodeError as exc:
        summary.errors.append((shown, f"{exc.reason} (line {exc.line})"))
        return
    except OSError as exc:
        summary.errors.append((shown, f"cannot read: {exc.strerror or exc}"))
        return
    source = decoded.text
    try:
        if wrap:
            wrapped = _verified_wrap(source, path, shown, rules, settings, summary)
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
            summary.errors.extend(
                (shown, f"{s.code} fix skipped: {s.reason}") for s in result.skipped
            )
    except cst.ParserSyntaxError as exc:
        summary.errors.append((shown, f"cannot parse: {exc.message}"))
        return
    except (RecursionError, RewriteError) as exc:
        summary.errors.append((shown, str(exc) or type(exc).__name__))
        return
    except Exception as exc:  # a bug outside any rule (the engine, --wrap): this file only
        what = "--wrap" if wrap else "the rewrite engine"
        summary.errors.append((shown, f"internal error in {what}: {type(exc).__name__}: {exc}"))
        return
    if new == source:
        return
    summary.changed.append(shown)
    if diff:
        click.echo(
            "".join(
                difflib.unified_diff(
                    source.splitlines(keepends=True),
                    new.splitlines(keepends=True),
                    fromfile=f"a/{shown}",
                    tofile=f"b/{shown}",
                )
            ),
            nl=False,
        )
    if write:
        try:
            atomic_write(path, decoded.encode(new))
        except UnicodeEncodeError as exc:
            summary.changed.remove(shown)
            summary.errors.append(
                (
                    shown,
                    f"not written: the fixes add {exc.object[exc.start]!r}, which "
                    f"{decoded.encoding} cannot encode",
                )
            )
        except OSError as exc:
            summary.changed.remove(shown)
            summary.errors.append((shown, f"cannot write: {exc.strerror or exc}"))


def _verified_wrap(
    source: str,
    path: Path,
    shown: str,
    rules: Sequence[type[Rule]],
    settings: Settings,
    summary: _Summary,
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


def _print_summary(summary: _Summary, *, wrap: bool, write: bool) -> None:
    def err(line: str) -> None:
        click.echo(line, err=True)

    for where, reason in summary.errors:
        err(f"error: {where}: {reason}")
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
