"""Placeholder until implemented."""

import click

COMMANDS: list[click.Command] = []
