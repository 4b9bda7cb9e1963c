"""`autoopt rules` (the catalog) and `autoopt explain CODE` (one rule; `autoopt rule CODE` too)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from autoopt.cli.options import allow_project_rules_option, fail, warn_skipped_rules
from autoopt.lint.engine.config import ConfigError, Options, resolve_settings
from autoopt.lint.engine.explain import render_explain, render_rules
from autoopt.lint.engine.project import registry_for
from autoopt.lint.engine.registry import Registry, RuleError


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


COMMANDS: list[click.Command] = [rules, explain]
