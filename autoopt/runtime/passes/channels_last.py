"""Pass: channels_last. (placeholder until implemented)"""

from __future__ import annotations

from autoopt.runtime.context import Context
from autoopt.runtime.report import PassResult

NAME = "channels_last"


def run(ctx: Context) -> PassResult | None:
    return PassResult.skipped(NAME, "not implemented yet")
