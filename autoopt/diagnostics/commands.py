"""Click commands of the diagnostics: doctor and bench."""

import click

COMMANDS: list[click.Command] = []
