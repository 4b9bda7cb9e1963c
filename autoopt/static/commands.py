"""Click commands of the static engine: lint, rewrite, rules, explain."""

import click

COMMANDS: list[click.Command] = []
