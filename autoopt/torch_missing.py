"""What autoopt says where its runtime is used without torch installed.

autoopt does not require torch: the lint and the rewrite never import it, so a lint-only CI job
or the pre-commit hook installs a few MB. `optimize()`, `doctor`, `selftest` and `bench` do need
it; their users have torch already, built for their CUDA. This module is the one place that
says so, in the same words for `import autoopt; autoopt.optimize` and for the commands.
"""

from __future__ import annotations

import importlib.util
import sys


def message(what: str) -> str:
    """Why `what` cannot run here, and how to make it run."""
    return (
        f"{what} needs PyTorch, which is not installed in this environment ({sys.executable}): "
        "install the build for your CUDA (https://pytorch.org/get-started/locally/), or "
        'pip install "autoopt[torch]". autoopt lint and autoopt rewrite work without it.'
    )


def missing(what: str) -> str | None:
    """`message(what)` when torch cannot be imported here, else None."""
    return message(what) if importlib.util.find_spec("torch") is None else None
