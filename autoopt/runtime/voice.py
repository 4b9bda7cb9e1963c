"""How the runtime speaks: the `autoopt` logger, rank 0 only, and the environment variables that
switch `optimize()` off or override its options without editing code.

`optimize(verbose=True)` logs the report at INFO and each decision taken later (a measurement on
the first steps, a fallback) when it is made; `verbose=False` logs them at DEBUG. With no
logging configured, a stderr handler prints the INFO lines (as `print` did); configure the
`autoopt` logger (or the root logger) and autoopt's lines follow your handlers and levels.

    AUTOOPT_DISABLE=1                         optimize() returns its arguments untouched
    AUTOOPT_OPTIONS="amp=False,compile=True"  these options win over the call's (shown in
                                              the report)
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

logger = logging.getLogger("autoopt")

DISABLE_ENV = "AUTOOPT_DISABLE"
OPTIONS_ENV = "AUTOOPT_OPTIONS"
_TRUE = ("1", "true", "yes", "on")


def disabled() -> bool:
    """Whether the environment switches optimize() off."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() in _TRUE


def _value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    try:
        return int(text)
    except ValueError:
        return text.strip().strip("'\"")


def overrides(known: list[str]) -> dict[str, Any]:
    """`AUTOOPT_OPTIONS="amp=False, compile=True"` as option values; a name optimize() does not
    take, or an item without `=`, is a ValueError naming the variable."""
    text = os.environ.get(OPTIONS_ENV, "").strip()
    if not text:
        return {}
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ValueError(
                f"{OPTIONS_ENV}={text!r}: {item!r} is not name=value for an option of "
                f"optimize() ({', '.join(known)})"
            )
        out[name] = _value(value)
    return out


def is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is now (a handler made once must follow redirections)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _ensure_handler() -> None:
    # Without any logging configuration Python drops INFO; autoopt's report is meant to be seen.
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def say(message: str, verbose: bool = True) -> None:
    """Log `message` on rank 0: INFO when verbose, DEBUG otherwise."""
    if not is_rank_zero():
        return
    _ensure_handler()
    logger.log(logging.INFO if verbose else logging.DEBUG, message)
