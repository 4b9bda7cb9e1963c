"""The `autoopt` command: each subcommand lives with the part of autoopt it drives."""

from __future__ import annotations

import click

from autoopt import __version__
from autoopt.diagnostics import commands as diagnostics_commands
from autoopt.static import commands as static_commands


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="autoopt")
def main() -> None:
    """Make PyTorch training fast: lint and rewrite training scripts, diagnose the machine."""


for _command in (*static_commands.COMMANDS, *diagnostics_commands.COMMANDS):
    main.add_command(_command)
