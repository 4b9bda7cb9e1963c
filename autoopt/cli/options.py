"""What `lint` and `rewrite` share on the command line: rule selection, target version, config,
standard input, and how they refuse what they cannot read (so that both say the same)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

from autoopt.lint.engine.config import ALLOW_PROJECT_RULES_ENV, ConfigError, Options, Settings
from autoopt.lint.engine.discovery import SUFFIXES
from autoopt.lint.engine.project import Project, load_project
from autoopt.lint.engine.registry import RuleError

STDIN = Path("-")


def plural(n: int, word: str) -> str:
    """`1 file`, `2 files`."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def split_selectors(values: Sequence[str]) -> tuple[str, ...]:
    """`--select AO1,AO2 --select AO3` -> ("AO1", "AO2", "AO3")."""
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


def fail(message: str) -> None:
    """Report a usage/config error on stderr and exit 2."""
    click.echo(f"{click.style('autoopt: error:', fg='red', bold=True)} {message}", err=True)
    sys.exit(2)


allow_project_rules_option = click.option(
    "--allow-project-rules",
    is_flag=True,
    default=None,
    help="Load the `extra-rules` the project's config names (this runs the project's code; "
    f"also {ALLOW_PROJECT_RULES_ENV}=1). Without it they are skipped.",
)


def warn_skipped_rules(settings: Settings) -> None:
    """Say on stderr that the config's `extra-rules` were not loaded, and how to load them."""
    if not settings.skipped_extra_rules:
        return
    folders = ", ".join(str(p) for p in settings.skipped_extra_rules)
    click.echo(
        f"autoopt: warning: not loading the extra-rules of {settings.config_path} ({folders}): "
        "they are code from the project being linted. If you trust it, pass "
        f"--allow-project-rules or set {ALLOW_PROJECT_RULES_ENV}=1.",
        err=True,
    )


def selection_options(func):  # type: ignore[no-untyped-def]
    """The options shared by `lint` and `rewrite`: rule selection, target version, config."""
    options = [
        click.option(
            "--select",
            multiple=True,
            metavar="CODES",
            help="Rules to enable, by code or prefix (AO201, AO2, ALL); comma-separated.",
        ),
        click.option("--ignore", multiple=True, metavar="CODES", help="Rules to disable."),
        click.option(
            "--extend-select",
            multiple=True,
            metavar="CODES",
            help="Rules to enable on top of the configured selection.",
        ),
        click.option(
            "--target-version",
            metavar="VERSION",
            help="The torch version the code targets, e.g. 2.0.",
        ),
        click.option(
            "--config",
            "config_file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Config file (default: the nearest pyproject.toml with [tool.autoopt]).",
        ),
        click.option(
            "--force-exclude",
            is_flag=True,
            default=None,
            help="Apply `exclude` to files named on the command line too (pre-commit).",
        ),
        click.option(
            "--per-file-ignores",
            multiple=True,
            metavar="PATTERN:CODES",
            help="Ignore CODES in files matching PATTERN (gitignore-style), e.g. "
            "'tests/*:AO1,AO2'; replaces the config's per-file-ignores. Repeatable.",
        ),
        click.option(
            "--extend-per-file-ignores",
            multiple=True,
            metavar="PATTERN:CODES",
            help="The same, on top of the config's per-file-ignores.",
        ),
        allow_project_rules_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_options(
    select: Sequence[str],
    ignore: Sequence[str],
    extend_select: Sequence[str],
    target_version: str | None,
    config_file: Path | None,
    force_exclude: bool | None,
    allow_project_rules: bool | None,
    per_file_ignores: Sequence[str] = (),
    extend_per_file_ignores: Sequence[str] = (),
    **extra: object,
) -> Options:
    """`Options` from the shared click options (plus any other `Options` fields in `extra`)."""
    return Options(
        select=split_selectors(select) or None,
        ignore=split_selectors(ignore),
        extend_select=split_selectors(extend_select),
        target_version=target_version,
        config=config_file,
        force_exclude=force_exclude,
        allow_project_rules=allow_project_rules,
        per_file_ignores=parse_per_file_ignores(per_file_ignores) if per_file_ignores else None,
        extend_per_file_ignores=parse_per_file_ignores(extend_per_file_ignores),
        **extra,  # type: ignore[arg-type]
    )


def parse_per_file_ignores(values: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`('tests/*:AO1,AO2',)` -> `(('tests/*', ('AO1', 'AO2')),)`; the codes are checked with
    the config's own (an unknown one is an error naming it)."""
    out = []
    for value in values:
        pattern, sep, codes = value.rpartition(":")
        if not sep or not pattern or not codes.strip():
            fail(f"--per-file-ignores {value!r}: expected PATTERN:CODES, e.g. 'tests/*:AO1,AO2'")
        out.append((pattern, split_selectors([codes])))
    return tuple(out)


stdin_filename_option = click.option(
    "--stdin-filename",
    metavar="PATH",
    help="With `-` as the path: the name the code read from standard input is reported under "
    "(and the config and per-file-ignores that apply to it).",
)


def reads_stdin(paths: Sequence[Path]) -> bool:
    """Whether the paths are `-` (standard input); `-` mixed with other paths is a usage error."""
    if STDIN in paths and len(paths) > 1:
        fail("`-` (standard input) cannot be mixed with other paths")
    return tuple(paths) == (STDIN,)


def refuse_non_python(paths: Sequence[Path]) -> None:
    """Ruff's rule: a file named on the command line that is not Python is an error (exit 2)."""
    for path in paths:
        if path.is_file() and path.suffix and path.suffix not in SUFFIXES:
            fail(
                f"{path}: not a Python file ({path.suffix}); autoopt lints "
                f"{', '.join(SUFFIXES)} files and extension-less scripts"
            )


def open_project(
    paths: Sequence[Path], options: Options, stdin_filename: str | None, follow: bool = False
) -> Project:
    """The project of `paths` (standard input: no files, the config of `stdin_filename`), or
    exit 2 with the configuration's or the rules' error; `follow`: with the modules holding
    the training the files named run."""
    from_stdin = tuple(paths) == (STDIN,)
    where = [stdin_filename or "."] if from_stdin else list(paths) or ["."]
    try:
        project = load_project(
            [] if from_stdin else where, options, config_from=where, follow=follow
        )
    except (ConfigError, RuleError) as exc:
        fail(str(exc))
        raise  # unreachable: fail exits
    warn_skipped_rules(project.settings)
    return project


def warn_no_files(project: Project, paths: Sequence[Path], quiet: bool) -> None:
    """Ruff's warning when there is nothing to lint under the paths (the exit code stays 0)."""
    if not project.files and not project.discovered.errors and not quiet:
        where = ", ".join(str(p) for p in paths) or "."
        click.echo(f"autoopt: warning: No Python files found under {where}", err=True)


verbose_option = click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Say on stderr which config, rules and files the run uses, and what it cost.",
)


def say_settings(project: Project) -> None:
    """`-v`: the config, the project root, the rules and the files of a run, on stderr."""
    settings = project.settings

    def say(line: str) -> None:
        click.echo(f"autoopt: {line}", err=True)

    say(f"config: {settings.config_path or 'none (defaults)'}")
    say(f"project root: {settings.project_root}")
    target = settings.target_version
    say(f"target torch version: {'.'.join(map(str, target)) if target else 'any'}")
    codes = [rule.code for rule in project.rules]
    say(f"{plural(len(codes), 'rule')} selected: {', '.join(codes)}")
    if settings.per_file_ignores:
        ignores = "; ".join(f"{p}: {', '.join(c)}" for p, c in settings.per_file_ignores)
        say(f"per-file-ignores: {ignores}")
    say(f"{plural(len(project.files), 'file')} to check")
