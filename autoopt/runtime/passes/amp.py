"""Pass: amp. (placeholder until implemented)"""

from __future__ import annotations

from autoopt.runtime.context import Context
from autoopt.runtime.report import PassResult

NAME = "amp"


def run(ctx: Context) -> PassResult | None:
    return PassResult.skipped(NAME, "not implemented yet")
