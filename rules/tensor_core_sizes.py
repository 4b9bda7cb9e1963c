"""AO610: layer sizes under mixed precision that do not fit tensor-core tiles."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.program.torch_api import uses_amp
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.nodes import int_constants, int_literal

# The size parameters (positions 0 and 1) of each layer.
_LINEAR = ("torch.nn.Linear", "torch.nn.modules.linear.Linear")
_EMBEDDING = ("torch.nn.Embedding", "torch.nn.modules.sparse.Embedding")
_SIZES = {_LINEAR: ("in_features", "out_features"), _EMBEDDING: ("num_embeddings", "embedding_dim")}
_SMALL = 64  # below this a layer's GEMM is too small for padding to matter (a 10-class head)


class TensorCoreSizes(Rule):
    """
    ## What it does
    In a script that trains under mixed precision (`autocast`, or `autoopt.optimize()` with
    its default AMP), flags literal `nn.Linear` / `nn.Embedding` sizes and vocabulary sizes
    (`vocab_size = ...`) of 64 or more that are not a multiple of 8.

    ## Why is this bad?
    fp16/bf16 tensor cores work on tiles whose dimensions are multiples of 8 (16 bytes); other
    sizes fall back to padded or non-tensor-core kernels. NVIDIA's guide measures up to several
    times slower GEMMs for such shapes, and nanoGPT pads GPT-2's vocabulary from 50257 to 50304
    (a multiple of 64) for a ~25% faster model. This is a hint: sizes are the model's design.

    ## Example
    `self.lm_head = nn.Linear(768, 50257)` with `torch.autocast(...)` in the loop.

    ## Use instead
    `self.lm_head = nn.Linear(768, 50304)` (pad the vocabulary; the extra logits never win).

    ## Fix safety
    None: padding changes the model's shapes, its checkpoints and (for a vocabulary) its output.

    ## When not to
    - Sizes from variables the lint cannot read, sizes below 64 (a class head), and scripts in
      fp32 (no tensor cores): not flagged.
    """

    code = "AO610"
    name = "tensor-core-sizes"
    message = "size is not a multiple of 8: mixed-precision GEMMs miss tensor-core tiles"
    fix_reason = "padding a layer changes the model's shapes and checkpoints"
    triggers = ("Linear", "Embedding", "vocab")
    requires = (("autocast(", "optimize("),)

    VALID = [
        Valid(
            """
            import torch
            from torch import nn
            head = nn.Linear(768, 50304)
            cls = nn.Linear(768, 10)
            with torch.autocast("cuda"):
                loss = head(x).sum()
            """
        ),
        Valid(  # fp32: no tensor cores to miss
            """
            from torch import nn
            head = nn.Linear(768, 50257)
            """
        ),
        Valid(  # precision left to a script that runs no autocast: fp32
            """
            import autoopt
            from torch import nn
            head = nn.Linear(768, 50257)
            head, opt = autoopt.optimize(head, opt, amp="script")
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch import nn
            VOCAB = 50257
            emb = nn.Embedding(VOCAB, embedding_dim=768)
            proj = nn.Linear(768, out_features=100)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = proj(emb(x)).sum()
            """,
            line=3,
            message_contains="50304",
        ),
        Invalid(
            """
            import torch
            from torch import nn
            proj = nn.Linear(768, out_features=100)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = proj(x).sum()
            """,
            line=3,
            message_contains="size 100",
        ),
        Invalid(
            """
            import autoopt
            from dataclasses import dataclass
            @dataclass
            class Config:
                vocab_size: int = 32001
            model, opt = autoopt.optimize(GPT(Config()), opt)
            """,
            line=5,
            message_contains="32001",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        self._constants = int_constants(node)
        self._reported: set[int] = set()
        self._amp = uses_amp(self)
        if self._amp:
            for name, (value, literal) in self._constants.items():
                if "vocab" in name.lower():
                    self._check(literal, value)

    def visit_Call(self, node: cst.Call) -> None:
        if not self._amp:
            return
        sizes = [arg(node, "vocab_size")]
        for layer, names in _SIZES.items():
            if self.is_call_to(node, *layer):
                sizes = [arg(node, k, i) for i, k in enumerate(names)]
        for size in sizes:
            if size is None:
                continue
            if isinstance(size.value, cst.Name) and size.value.value in self._constants:
                value, literal = self._constants[size.value.value]
                self._check(literal, value)
            elif (value := int_literal(size.value)) is not None:
                self._check(size.value, value)

    def _check(self, node: cst.BaseExpression, value: int) -> None:
        if value < _SMALL or value % 8 == 0 or id(node) in self._reported:
            return
        self._reported.add(id(node))
        padded = -(-value // 64) * 64
        self.report(
            node,
            f"size {value} is not a multiple of 8: mixed-precision GEMMs miss tensor-core tiles;"
            f" pad it (e.g. to {padded}, as nanoGPT pads 50257 to 50304)",
        )
