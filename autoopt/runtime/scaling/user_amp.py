"""Noticing the user's own AMP and stepping aside for it.

A loop that already runs its forward under `torch.autocast`, or scales its loss with a
`torch.amp.GradScaler` (`torch.cuda.amp.GradScaler` is a subclass), must not be autocast and
scaled a second time: that double scaling skips most steps. Detection happens before any damage:
autocast at the model's forward (`AutocastLayer`), a GradScaler when its `scale()` is called on a
loss whose graph reaches an optimized model (before that loss's backward runs; `grad_scalers`).
"""

from __future__ import annotations

import warnings
from typing import Any

from autoopt.runtime.report import PassResult, Report


class UserAmp:
    """Whether autoopt's AMP for one model stepped aside for the user's own, and why. Shared by
    the model's autocast layer and its loss scaler; `report` gets the reason."""

    def __init__(self, report: Report | None = None, pass_name: str = "amp") -> None:
        self.report = report
        self.pass_name = pass_name
        self.reason: str | None = None

    def stand_down(self, reason: str, own: bool = True) -> None:
        """Stop autocasting and scaling this model from now on; warn once and say why. `own`:
        for the user's own AMP (else for a case autoopt's AMP cannot verify)."""
        if self.reason is not None:
            return
        self.reason = reason
        warnings.warn(
            f"autoopt: {reason}, so autoopt's own autocast and loss scaling step aside",
            stacklevel=3,
        )
        if self.report is not None:
            why = "stood down for the user's own AMP" if own else "stood down"
            self.report.replace(PassResult.skipped(self.pass_name, f"{why}: {reason}"))


def __getattr__(name: str) -> Any:
    # Reached through the old path autoopt.runtime.user_amp, which held the watchers too.
    from autoopt.runtime import moved

    return moved.moved_name(__name__, name)
