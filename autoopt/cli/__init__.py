"""The `autoopt` command: one click group, its subcommands in the modules beside this one.

Subcommands are imported when they run, not at start-up: `lint` pulls in libcst and `bench`
torch, which would make `autoopt --version` and `autoopt --help` take most of a second.
"""

from __future__ import annotations

import importlib

import click

from autoopt import __version__

# name -> (module, one-line help shown by `autoopt --help` without importing the module)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "lint": ("autoopt.cli.lint", "Find missing PyTorch optimizations in files or folders."),
    "rewrite": ("autoopt.cli.rewrite", "Rewrite training scripts to adopt the tricks."),
    "rules": ("autoopt.cli.rules", "List every rule: code, name, fix availability, message."),
    "explain": ("autoopt.cli.rules", "Print the documentation of one rule (AO201)."),
    "rule": (
        "autoopt.cli.rules",
        "The same as explain (Ruff's name for it: `autoopt rule AO201`).",
    ),
    "doctor": ("autoopt.cli.diagnostics", "Report torch, devices, CPU features; diagnose a model."),
    "bench": ("autoopt.cli.diagnostics", "Benchmark eager, each trick and optimize()."),
    "selftest": ("autoopt.cli.diagnostics", "Prove each pass here against torch's own loop."),
}

# Other names of a subcommand: Ruff users type `rule`.
ALIASES = {"rule": "explain"}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use (click's documented lazy pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return None
        module = importlib.import_module(SUBCOMMANDS[cmd_name][0])
        name = ALIASES.get(cmd_name, cmd_name)
        return next(c for c in module.COMMANDS if c.name == name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SUBCOMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="autoopt", message="%(prog)s %(version)s")
def main() -> None:
    """Make PyTorch training fast: lint and rewrite training scripts, diagnose the machine."""
