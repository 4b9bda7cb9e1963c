"""The `autoopt` command: one click group, its subcommands in the modules beside this one."""

from __future__ import annotations

import click

from autoopt import __version__
from autoopt.cli.diagnostics import COMMANDS as DIAGNOSTICS_COMMANDS
from autoopt.cli.lint import COMMANDS as LINT_COMMANDS
from autoopt.cli.rewrite import COMMANDS as REWRITE_COMMANDS


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="autoopt")
def main() -> None:
    """Make PyTorch training fast: lint and rewrite training scripts, diagnose the machine."""


for _command in (*LINT_COMMANDS, *REWRITE_COMMANDS, *DIAGNOSTICS_COMMANDS):
    main.add_command(_command)
