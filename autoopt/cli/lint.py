"""`autoopt lint`, `autoopt rules`, `autoopt explain`.

Exit codes of `lint` (Ruff's): 0 no findings, 1 findings, 2 usage, configuration or internal
error, or a file that could not be read/decoded/parsed (unless `--exit-zero`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from autoopt.cli.options import (
    allow_project_rules_option,
    build_options,
    fail,
    selection_options,
    warn_skipped_rules,
)
from autoopt.cli.output import render
from autoopt.lint.engine.config import OUTPUT_FORMATS, ConfigError, Options, resolve_settings
from autoopt.lint.engine.discovery import SUFFIXES, is_notebook
from autoopt.lint.engine.explain import render_explain, render_rules
from autoopt.lint.engine.project import Project, load_project, registry_for
from autoopt.lint.engine.registry import Registry, RuleError
from autoopt.lint.engine.runner import LintReport, Progress, lint_bytes, run_lint

PROGRESS_MIN_FILES = 100  # below this a progress bar is noise


def color_setting() -> bool | None:
    """None: colour only on a terminal (click decides); False where NO_COLOR is set."""
    return False if os.environ.get("NO_COLOR") else None


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
    help="How findings are printed (default: text).",
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
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes (default: one per CPU).",
)
@click.option("--fix", is_flag=True, help="Apply the fixes (the same engine as `autoopt rewrite`).")
@click.option(
    "--diff", is_flag=True, help="Print the fixes as a diff; write nothing; exit 1 if any."
)
@click.option(
    "--show-fixes", is_flag=True, help="After the findings, list the fixes by rule and safety."
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
    "--stdin-filename",
    metavar="PATH",
    help="With `-` as the path: the name the code read from standard input is reported under "
    "(and the config and per-file-ignores that apply to it).",
)
@click.pass_context
def lint(
    ctx: click.Context,
    paths: tuple[Path, ...],
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    extend_select: tuple[str, ...],
    target_version: str | None,
    config_file: Path | None,
    force_exclude: bool | None,
    allow_project_rules: bool | None,
    no_cache: bool,
    output_format: str | None,
    statistics: bool,
    exit_zero: bool | None,
    unsafe_fixes: bool | None,
    quiet: bool,
    jobs: int | None,
    fix: bool,
    diff: bool,
    show_fixes: bool,
    extend_exclude: tuple[str, ...],
    output_file: Path | None,
    stdin_filename: str | None,
) -> None:
    """Find missing PyTorch optimizations in PATHS (files or folders; default: .; `-` reads
    standard input)."""
    if fix or diff:
        if STDIN in paths:
            fail("--fix/--diff do not take standard input; name the files")
        from autoopt.cli.rewrite import rewrite

        ctx.invoke(
            rewrite,
            paths=paths,
            diff=diff,
            check=False,
            unsafe_fixes=unsafe_fixes,
            wrap=False,
            select=select,
            ignore=ignore,
            extend_select=extend_select,
            target_version=target_version,
            config_file=config_file,
            force_exclude=force_exclude,
            allow_project_rules=allow_project_rules,
        )
        return
    if STDIN in paths and len(paths) > 1:
        fail("`-` (standard input) cannot be mixed with other paths")
    options = build_options(
        select,
        ignore,
        extend_select,
        target_version,
        config_file,
        force_exclude,
        allow_project_rules,
        no_cache=no_cache,
        output_format=output_format,
        exit_zero=exit_zero,
        unsafe_fixes=unsafe_fixes,
        extend_exclude=extend_exclude,
    )
    from_stdin = paths == (STDIN,)
    where = [stdin_filename or "."] if from_stdin else list(paths) or ["."]
    try:
        project = load_project([] if from_stdin else where, options, config_from=where)
    except (ConfigError, RuleError) as exc:
        fail(str(exc))
        return
    warn_skipped_rules(project.settings)
    settings = project.settings
    if from_stdin:
        report = lint_stdin(project, stdin_filename)
    else:
        _warn_unlintable(project, paths, quiet)
        with progress_bar(len(project.files), quiet) as progress:
            report = run_lint(project, jobs=jobs, progress=progress)
    text = render(
        report,
        settings.output_format,
        statistics=statistics,
        quiet=quiet,
        unsafe_fixes=settings.unsafe_fixes,
        root=settings.project_root,
    )
    if show_fixes:
        text += fixes_summary(report)
    if output_file is not None:
        try:
            output_file.write_text(click.unstyle(text), encoding="utf-8")
        except OSError as exc:
            fail(f"cannot write {output_file}: {exc.strerror or exc}")
    else:
        click.echo(text, nl=False, color=color_setting())
    sys.exit(report.exit_code(settings.exit_zero))


STDIN = Path("-")


def lint_stdin(project: Project, filename: str | None) -> LintReport:
    """Lint the code on standard input, reported as `filename` (or `-`)."""
    shown = filename or "-"
    rules = project.rules_for(shown) if filename else project.rules
    result = lint_bytes(
        sys.stdin.buffer.read(),
        shown,
        rules,
        project.settings.target_version,
        notebook=is_notebook(shown),
        display=shown,
    )
    return LintReport(results=[result], rules=list(project.rules), files_checked=1)


def _warn_unlintable(project: Project, paths: tuple[Path, ...], quiet: bool) -> None:
    """Ruff's warnings: nothing to lint under the paths; a file named that is not Python."""
    if not project.files and not project.discovered.errors and not quiet:
        where = ", ".join(str(p) for p in paths) or "."
        click.echo(f"autoopt: warning: No Python files found under {where}", err=True)
    for path in paths:
        if path.is_file() and path.suffix and path.suffix not in SUFFIXES:
            fail(
                f"{path}: not a Python file ({path.suffix}); autoopt lints "
                f"{', '.join(SUFFIXES)} files and extension-less scripts"
            )


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


def _registry(config_file: Path | None, allow_project_rules: bool | None) -> Registry:
    try:
        options = Options(config=config_file, allow_project_rules=allow_project_rules)
        settings = resolve_settings(["."], options)
        warn_skipped_rules(settings)
        return registry_for(settings)
    except (ConfigError, RuleError) as exc:
        fail(str(exc))
        raise  # unreachable: fail exits


def registry_config_options(command: Callable[..., None]) -> Callable[..., None]:
    """`--config` and `--allow-project-rules`: which extra rules `rules`/`explain` include."""
    command = allow_project_rules_option(command)
    return click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Config file whose extra-rules to include (with --allow-project-rules).",
    )(command)


@click.command("rules")
@click.option(
    "--output-format",
    type=click.Choice(["text", "json", "markdown"]),
    default="text",
    help="text, json, or markdown (the full reference, as in docs/rules.md).",
)
@registry_config_options
def rules(output_format: str, config_file: Path | None, allow_project_rules: bool | None) -> None:
    """List every rule: code, name, fix availability (safe/unsafe/none), message."""
    registry = _registry(config_file, allow_project_rules)
    click.echo(render_rules(registry.all(), output_format), nl=False)


@click.command("explain")
@click.argument("code")
@registry_config_options
def explain(code: str, config_file: Path | None, allow_project_rules: bool | None) -> None:
    """Print the documentation of one rule, given its code (AO201) or name."""
    registry = _registry(config_file, allow_project_rules)
    rule = registry.find(code)
    if rule is None:
        close = registry.suggest(code)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        fail(f"unknown rule {code!r}{hint} (`autoopt rules` lists them)")
        return
    click.echo(render_explain(rule), nl=False)


COMMANDS: list[click.Command] = [lint, rules, explain]
