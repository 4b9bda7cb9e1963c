"""AO204: fp16 autocast in a training loop with no GradScaler."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.program.amp_api import autocast_dtype, is_autocast


class AutocastFp16WithoutScaler(Rule):
    """
    ## What it does
    Flags `torch.autocast` in fp16 (CUDA's default dtype: `torch.autocast("cuda")`, or
    `dtype=torch.float16`) around a training step in a script that never creates a
    `GradScaler`.

    ## Why is this bad?
    fp16 has a range of about 6e-5 to 65504: without loss scaling, small gradients underflow to
    zero and the model silently trains worse (or not at all). `torch.amp.GradScaler` multiplies
    the loss before `backward()` and unscales before the step; it is the other half of fp16 AMP.

    ## Example
    `with torch.autocast("cuda"): loss = model(x)` then `loss.backward()`, no scaler.

    ## Use instead
    `scaler = torch.amp.GradScaler("cuda")`, `scaler.scale(loss).backward()`,
    `scaler.step(optimizer)`, `scaler.update()`; or `dtype=torch.bfloat16` on GPUs that have it
    (no scaler needed); or `autoopt.optimize()`, which scales without changing the loop.

    ## Fix safety
    No fix: where the scaler's calls go depends on the loop.

    ## When not to
    - bf16 autocast, autocast on CPU (bf16 by default), `enabled=` decided at run time, and a
      dtype held in a variable: not flagged.
    - Autocast only for inference (evaluation under `no_grad`, outside the training loop).
    - A script that scales its loss some other way (apex amp, its own dynamic loss scale).
    """

    code = "AO204"
    name = "autocast-fp16-without-scaler"
    message = "fp16 autocast in training without a GradScaler: small gradients underflow to zero"
    triggers = ("autocast",)
    requires = (".backward(",)

    VALID = [
        Valid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                with torch.autocast("cuda"):
                    loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """
        ),
        Valid(
            """
            import torch
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x)
                loss.backward()
            """
        ),
        Valid(  # CPU autocast is bf16
            """
            import torch
            for x, y in loader:
                with torch.autocast(device_type="cpu"):
                    loss = model(x)
                loss.backward()
            """
        ),
        Valid(  # bf16 given by position
            """
            import torch
            for x, y in loader:
                with torch.autocast("cuda", torch.bfloat16):
                    loss = model(x)
                loss.backward()
            """
        ),
        Valid(  # the dtype is decided at run time
            """
            import torch
            for x, y in loader:
                with torch.autocast("cuda", dtype=amp_dtype):
                    loss = model(x)
                loss.backward()
            """
        ),
        Valid(  # inference only
            """
            import torch
            for x, y in train_loader:
                model(x).sum().backward()
            with torch.no_grad(), torch.autocast("cuda"):
                preds = model(test_x)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x, y in loader:
                optimizer.zero_grad()
                with torch.autocast("cuda"):
                    loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            line=4,
        ),
        Invalid(
            """
            from torch.cuda.amp import autocast
            def train(model, loader, optimizer):
                for x, y in loader:
                    with autocast():
                        loss = model(x, y)
                    loss.backward()
                    optimizer.step()
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            for x, y in loader:
                with torch.autocast(device_type="cuda", dtype=torch.float16):
                    loss = model(x)
                loss.backward()
            """,
            line=3,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not is_autocast(self, node) or autocast_dtype(self, node) != "fp16":
            return
        source = self.context.source
        if "GradScaler" in source or "scaler" in source.lower():
            return  # a scaler is in the script, however it is spelt
        if self.facts.other_precision:
            return  # apex amp or a hand-written loss scale
        if not self.facts.in_training_loop(node) or self.facts.in_no_grad(node):
            return
        self.report(node)
