"""Click commands of the static engine, gathered for `autoopt.cli`."""

from autoopt.static.cli_lint import COMMANDS as LINT_COMMANDS
from autoopt.static.cli_rewrite import COMMANDS as REWRITE_COMMANDS

COMMANDS = [*LINT_COMMANDS, *REWRITE_COMMANDS]
