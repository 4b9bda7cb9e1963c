"""`autoopt lint`, `autoopt rules`, `autoopt explain`.

Exit codes of `lint` (Ruff's): 0 no findings, 1 findings, 2 usage, configuration or internal
error, or a file that could not be read/decoded/parsed (unless `--exit-zero`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from autoopt.cli.options import (
    build_options,
    fail,
    open_project,
    plural,
    reads_stdin,
    refuse_non_python,
    say_settings,
    selection_options,
    stdin_filename_option,
    verbose_option,
    warn_no_files,
)
from autoopt.cli.output import EDIT_FORMATS, render
from autoopt.lint.engine.config import OUTPUT_FORMATS
from autoopt.lint.engine.discovery import is_notebook
from autoopt.lint.engine.project import Project
from autoopt.lint.engine.runner import LintReport, Progress, lint_bytes, run_lint

if TYPE_CHECKING:
    from autoopt.cli.fix import Fixed

PROGRESS_MIN_FILES = 100  # below this a progress bar is noise


def color_setting(color: str) -> bool | None:
    """Whether to colour the findings: `--color always|never`, else NO_COLOR (which wins, as
    no-color.org asks), else FORCE_COLOR, else None: click colours only a terminal."""
    if color != "auto":
        return color == "always"
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR", "") not in ("", "0"):
        return True
    return None


@contextlib.contextmanager
def progress_bar(n_files: int, quiet: bool) -> Iterator[Progress | None]:
    """A progress bar on stderr for long runs on a terminal; None otherwise."""
    if quiet or n_files < PROGRESS_MIN_FILES or not sys.stderr.isatty():
        yield None
        return
    with click.progressbar(length=n_files, label="Linting", file=sys.stderr) as bar:
        yield bar.update


@click.command("lint")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@selection_options
@click.option("--no-cache", is_flag=True, help="Neither read nor write .autoopt_cache.")
@click.option(
    "--output-format",
    type=click.Choice(OUTPUT_FORMATS),
    default=None,
    help="How findings are printed (default: text, Ruff's concise). full: with the code and "
    "the fix; grouped: by file; the others are read by CI systems and tools.",
)
@click.option("--statistics", is_flag=True, help="Print the number of findings per rule.")
@click.option("--exit-zero", is_flag=True, default=None, help="Exit 0 even with findings/errors.")
@click.option(
    "--unsafe-fixes",
    is_flag=True,
    default=None,
    help="Count fixes that may change behaviour as fixable ([*]).",
)
@click.option("-q", "--quiet", is_flag=True, help="Print findings only: no summary, no progress.")
@verbose_option
@click.option(
    "--color",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Colour the findings (auto: on a terminal, unless NO_COLOR is set or FORCE_COLOR is).",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes (default: one per CPU).",
)
@click.option(
    "--fix",
    is_flag=True,
    help="Apply the fixes (the engine of `autoopt rewrite`), then report what remains (exit 1 "
    "if anything does). With `-`: the fixed source on stdout, the findings on stderr.",
)
@click.option(
    "--exit-non-zero-on-fix",
    is_flag=True,
    help="With --fix: exit 1 when something was fixed, even if nothing remains.",
)
@click.option(
    "--diff", is_flag=True, help="Print the fixes as a diff; write nothing; exit 1 if any."
)
@click.option(
    "--show-fixes", is_flag=True, help="After the findings, list the fixes by rule and safety."
)
@click.option(
    "--add-noqa",
    is_flag=True,
    help="Add `# noqa: CODES` to every line with a finding (to adopt autoopt on a large code "
    "base and fix the findings later).",
)
@click.option(
    "--extend-exclude",
    multiple=True,
    metavar="PATTERNS",
    help="More gitignore-style patterns to exclude, on top of the configured ones.",
)
@click.option(
    "--output-file",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the findings to this file instead of standard output.",
)
@click.option(
    "--no-follow",
    is_flag=True,
    help="Check only the files named, not the modules holding the training they run (a "
    "driver's `Solver` or `engine.py`: followed by default, as mypy follows imports).",
)
@stdin_filename_option
@click.pass_context
def lint(
    ctx: click.Context,
    paths: tuple[Path, ...],
    no_cache: bool,
    output_format: str | None,
    statistics: bool,
    exit_zero: bool | None,
    unsafe_fixes: bool | None,
    quiet: bool,
    verbose: bool,
    color: str,
    jobs: int | None,
    fix: bool,
    exit_non_zero_on_fix: bool,
    diff: bool,
    show_fixes: bool,
    add_noqa: bool,
    extend_exclude: tuple[str, ...],
    output_file: Path | None,
    no_follow: bool,
    stdin_filename: str | None,
    **selection: Any,
) -> None:
    """Find missing PyTorch optimizations in PATHS (files or folders; default: .; `-` reads
    standard input)."""
    from_stdin = reads_stdin(paths)
    if diff:  # with or without --fix, as Ruff: show the fixes, write nothing
        from autoopt.cli.rewrite import rewrite

        ctx.invoke(
            rewrite,
            paths=paths,
            diff=True,
            check=False,
            unsafe_fixes=unsafe_fixes,
            wrap=False,
            stdin_filename=stdin_filename,
            verbose=verbose,
            **selection,
        )
        return
    if add_noqa and (fix or from_stdin):
        fail("--add-noqa edits files: it takes neither --fix nor standard input")
    refuse_non_python(paths)
    options = build_options(
        **selection,
        no_cache=no_cache,
        output_format=output_format,
        exit_zero=exit_zero,
        unsafe_fixes=unsafe_fixes,
        extend_exclude=extend_exclude,
    )
    # --add-noqa edits the files it reports on: only those named
    project = open_project(paths, options, stdin_filename, follow=not (no_follow or add_noqa))
    if verbose:
        say_settings(project)
    if not quiet:
        say_followed(project)
    settings = project.settings
    fixed: Fixed | None = None
    stdin: dict[str, bytes] = {}
    if fix:  # the rewrite engine, loaded only when it is used
        from autoopt.cli.fix import fix_files, fix_stdin
    if from_stdin:
        data = sys.stdin.buffer.read()
        if fix:
            data, fixed = fix_stdin(data, project, stdin_filename)
            sys.stdout.buffer.write(data)  # the fixed source; the findings go to stderr
            sys.stdout.flush()
        stdin[stdin_filename or "-"] = data
        report = lint_stdin(project, stdin_filename, data)
    else:
        warn_no_files(project, paths, quiet)
        if fix:
            fixed = fix_files(project)
        with progress_bar(len(project.files), quiet) as progress:
            report = run_lint(project, jobs=jobs, progress=progress)
    if verbose:
        click.echo(
            f"autoopt: checked {plural(report.files_checked, 'file')} in {report.elapsed:.2f} s "
            f"({report.cached} from the cache, {report.parsed} parsed)",
            err=True,
        )
    if add_noqa:
        from autoopt.cli.noqa import add_noqa_comments

        add_noqa_comments(report)
        sys.exit(2 if report.errors and not settings.exit_zero else 0)
    edits = None
    if settings.output_format in EDIT_FORMATS:
        from autoopt.cli.fix_edits import fix_edits

        edits = fix_edits(report, project, stdin)
    text = render(
        report,
        settings.output_format,
        statistics=statistics,
        quiet=quiet,
        unsafe_fixes=settings.unsafe_fixes,
        root=settings.project_root,
        fixed=None if fixed is None else fixed.count,
        edits=edits,
        sources=stdin,
    )
    if show_fixes:
        text += fixes_summary(report)
    if output_file is not None:
        try:
            output_file.write_text(click.unstyle(text), encoding="utf-8")
        except OSError as exc:
            fail(f"cannot write {output_file}: {exc.strerror or exc}")
    else:
        click.echo(text, nl=False, color=color_setting(color), err=from_stdin and fix)
    sys.exit(exit_code(report, fixed, settings.exit_zero, exit_non_zero_on_fix))


def say_followed(project: Project) -> None:
    """On stderr, the modules checked although not named, and why (`--fix` leaves them)."""
    from autoopt.lint.program.followed import (
        EVALUATION_RULES,
        FORWARD_RULES,
        LOADER_RULES,
        MODEL_RULES,
        OPTIMIZER_RULES,
        OPTIONS_RULES,
        STEP_RULES,
    )

    for module, named in project.discovered.followed:
        if module in project.discovered.loader_option_builders:
            where = (
                f"which builds the loader {named.as_posix()} iterates (the loader rules "
                f"{', '.join(LOADER_RULES)} only)"
            )
        elif module in project.discovered.loader_builders:
            where = f"which builds the loader the training of {named.as_posix()} iterates"
        elif module in project.discovered.model_definers:
            where = (
                f"which defines a module {named.as_posix()} runs (the model rules "
                f"{', '.join(MODEL_RULES)} only, and {', '.join(FORWARD_RULES)} in what its "
                "forwards run)"
            )
        elif module in project.discovered.optimizer_builders:
            where = f"which builds the optimizer {named.as_posix()} steps (the optimizer rule {', '.join(OPTIMIZER_RULES)} only)"
        elif module in project.discovered.evaluators:
            where = f"which evaluates a model {named.as_posix()} trains (the evaluation rule {', '.join(EVALUATION_RULES)} only)"
        elif module in project.discovered.option_parsers:
            where = f"which declares the options of {named.as_posix()} (the launcher rule {', '.join(OPTIONS_RULES)} only)"
        elif module in project.discovered.step_helpers:
            where = (
                f"whose functions the training step of {named.as_posix()} runs on its model "
                f"(the step rules {', '.join(STEP_RULES)} only)"
            )
        else:
            where = f"where the training of {named.as_posix()} runs"
        click.echo(
            f"autoopt: also checking {module.as_posix()}, {where} (--no-follow: only the "
            "files named)",
            err=True,
        )


def exit_code(
    report: LintReport, fixed: Fixed | None, exit_zero: bool, exit_non_zero_on_fix: bool
) -> int:
    """Ruff's: 2 for a file that could not be linted (or fixed), 1 while findings remain (after
    `--fix` too) or, with `--exit-non-zero-on-fix`, when something was fixed; `--exit-zero`: 0."""
    code = report.exit_code(exit_zero)
    if exit_zero or fixed is None:
        return code
    if fixed.failed:
        return 2
    return 1 if code == 0 and exit_non_zero_on_fix and fixed.count else code


def lint_stdin(project: Project, filename: str | None, data: bytes) -> LintReport:
    """Lint `data`, the code read from standard input, reported as `filename` (or `-`)."""
    shown = filename or "-"
    rules = project.rules_for(shown) if filename else project.rules
    result = lint_bytes(
        data,
        shown,
        rules,
        project.settings.target_version,
        notebook=is_notebook(shown),
        display=shown,
    )
    return LintReport(results=[result], rules=list(project.rules), files_checked=1)


def fixes_summary(report: LintReport) -> str:
    """`--show-fixes`: each fix `--fix` would make (and the unsafe ones), with its safety."""
    lines = [
        f"  {path}:{diag.line}:{diag.column}: {diag.code} ({diag.fix_safety}) {diag.fix_message}"
        for path, diag in report.diagnostics
        if diag.fix_safety != "none"
    ]
    if not lines:
        return "No fixes available.\n"
    head = "Fixes (`autoopt lint --fix` applies the safe ones; add --unsafe-fixes for the rest):"
    return "\n".join([head, *lines]) + "\n"


COMMANDS: list[click.Command] = [lint]
