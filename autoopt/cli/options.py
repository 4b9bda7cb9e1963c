"""The command-line options `lint` and `rewrite` share: rule selection, target version, config."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

from autoopt.lint.engine.config import ALLOW_PROJECT_RULES_ENV, Options, Settings


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
        **extra,  # type: ignore[arg-type]
    )
