"""Measuring on the spot: the choices tried at the first training step, replaying a forward as if it
had not run, and timing candidates in turn."""

from typing import Any


def __getattr__(name: str) -> Any:
    # This package was the module `choices` is now: its names still answer, with a warning.
    from autoopt.runtime import moved

    return moved.moved_name(__name__, name)
