"""AO401: activation checkpointing with the legacy reentrant implementation."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.tree.calls import arg, has_star_kwargs, with_keyword

_CHECKPOINT = (
    "torch.utils.checkpoint.checkpoint",
    "torch.utils.checkpoint.checkpoint_sequential",
)


class CheckpointUseReentrant(Rule):
    """
    ## What it does
    Flags `torch.utils.checkpoint.checkpoint(...)` and `checkpoint_sequential(...)` called
    without `use_reentrant=`.

    ## Why
    Activation checkpointing trades compute for memory: activations of the wrapped blocks are
    recomputed in the backward pass instead of being stored (a widely read PyTorch tutorial cuts peak memory this way
    on deep `nn.Sequential` stacks). The legacy *reentrant* implementation — the default when
    nothing is passed — has a silent failure: when none of the inputs requires grad (the first
    block takes the raw batch), the checkpointed block's parameters get **no gradients at all**,
    and training continues without error. Seed 003 works around it with a dummy input tensor that
    requires grad. `use_reentrant=False` has no such failure, supports keyword arguments and
    `torch.autograd.grad`, and stops at the needed activation early. Since torch 2.4 omitting the
    argument warns, and the default is slated to change.

    ## When not to
    - An explicit `use_reentrant=True` is a deliberate choice and is not flagged.
    - A user's own `checkpoint` function (e.g. one that saves the model) is not torch's.
    - Arguments passed through `**kwargs` may already set it.

    ## Fix (safe)
    Adds `use_reentrant=False`. Forward results and, where the reentrant variant produced them,
    gradients are the same; where it silently produced none, they are now correct.
    """

    code = "AO401"
    name = "checkpoint-use-reentrant"
    message = (
        "checkpoint without use_reentrant=False: the reentrant default silently drops gradients"
        " when no input requires grad"
    )
    fix_safety = FixSafety.SAFE
    fix_reason = "the non-reentrant implementation computes the same values and gradients"
    triggers = ("utils.checkpoint", "utils import checkpoint")
    applies_to_versions = ((1, 11), None)  # `use_reentrant` exists since torch 1.11

    VALID = [
        Valid(
            """
            from torch.utils.checkpoint import checkpoint
            def forward(self, x):
                return checkpoint(self.block, x, use_reentrant=False)
            """
        ),
        Valid(  # explicit choice
            """
            import torch.utils.checkpoint as cp
            y = cp.checkpoint(block, x, use_reentrant=True)
            """
        ),
        Valid(  # the user's own checkpoint (saves the model)
            """
            from utils import checkpoint
            for epoch in range(3):
                checkpoint(model, f"ckpt_{epoch}.pt")
            """
        ),
        Valid(
            """
            import torch
            def run(fn, *args, **kwargs):
                return torch.utils.checkpoint.checkpoint(fn, *args, **kwargs)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.checkpoint import checkpoint
            class Net(torch.nn.Module):
                def forward(self, x):
                    x = checkpoint(self.block1, x)
                    return self.head(x)
            """,
            line=5,
            fixed="""
            import torch
            from torch.utils.checkpoint import checkpoint
            class Net(torch.nn.Module):
                def forward(self, x):
                    x = checkpoint(self.block1, x, use_reentrant=False)
                    return self.head(x)
            """,
        ),
        Invalid(
            """
            from torch.utils import checkpoint as ckpt
            out = ckpt.checkpoint_sequential(model, 4, inputs)
            """,
            line=2,
            fixed="""
            from torch.utils import checkpoint as ckpt
            out = ckpt.checkpoint_sequential(model, 4, inputs, use_reentrant=False)
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, *_CHECKPOINT):
            return
        if arg(node, "use_reentrant") is not None or has_star_kwargs(node):
            return
        new_call = with_keyword(node, "use_reentrant", cst.Name("False"))
        self.report(node, fix=Fix(replacements={node: new_call}, description="use_reentrant=False"))
