"""AO205: a GradScaler beside bf16 autocast."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.program.amp_api import GRAD_SCALER, autocast_dtype, is_autocast
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.nodes import calls_in


class GradScalerWithBf16(Rule):
    """
    ## What it does
    Flags a `GradScaler` created unconditionally in a script whose every autocast is bf16.

    ## Why is this bad?
    bf16 has fp32's exponent range: gradients do not underflow, so loss scaling has nothing to
    protect. The scaler still multiplies every loss, checks every gradient for inf/nan (a
    device-to-host sync on each step) and may skip steps (pytorch/pytorch#127176).

    ## Example
    `scaler = torch.amp.GradScaler()` with `torch.autocast("cuda", dtype=torch.bfloat16)`.

    ## Use instead
    Drop the scaler (`loss.backward()`, `optimizer.step()`), or create it with
    `enabled=(amp_dtype == torch.float16)` when the dtype is chosen at run time.

    ## Fix safety
    No fix: removing the scaler means rewriting every call of it.

    ## When not to
    - `GradScaler(enabled=...)` with an expression: the script already decides.
    - Any fp16 autocast, or one whose dtype is a variable: the scaler may be needed.
    """

    code = "AO205"
    name = "gradscaler-with-bf16"
    message = "GradScaler with bf16 autocast does nothing useful (bf16 does not underflow); drop it"
    triggers = ("GradScaler",)
    requires = ("bfloat16",)

    VALID = [
        Valid(
            """
            import torch
            scaler = torch.amp.GradScaler(enabled=amp_dtype == torch.float16)
            with torch.autocast("cuda", dtype=amp_dtype):
                loss = model(x)
            """
        ),
        Valid(
            """
            import torch
            scaler = torch.amp.GradScaler()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                a = model(x)
            with torch.autocast("cuda"):
                b = model(x)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """,
            line=2,
        ),
        Invalid(  # torch.cuda.amp.autocast(enabled, dtype): bf16 given by position
            """
            import torch
            scaler = torch.cuda.amp.GradScaler()
            with torch.cuda.amp.autocast(True, torch.bfloat16):
                loss = model(x)
            """,
            line=2,
        ),
    ]

    def leave_Module(self, node: cst.Module) -> None:
        scalers, dtypes = [], set()
        for call in calls_in(node):
            if self.is_call_to(call, *GRAD_SCALER):
                if arg(call, "enabled") is None:
                    scalers.append(call)
            elif is_autocast(self, call):
                dtypes.add(autocast_dtype(self, call))
        if scalers and dtypes == {"bf16"}:
            for call in scalers:
                self.report(call)
