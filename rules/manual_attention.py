"""AO609: attention written out as softmax(q @ k^T * scale) @ v."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import FileContext, Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.torch_api import (
    SOFTMAX,
    functional_name,
    last_dim_of,
    matmul_operands,
    swaps_last_two_dims,
    transposed_operand,
)
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.nodes import assignments, code_of, dotted, method_name, walk

_DEPTH = 4  # how many assignments back a softmax input is traced to its scores
_SOFTMAX_MODULE = ("torch.nn.Softmax", "torch.nn.modules.activation.Softmax")


class ManualAttention(Rule):
    """
    ## What it does
    Flags a softmax over `q @ k.transpose(...)` scores (with or without scaling, a
    `masked_fill` mask or dropout on the weights, in one expression or over a few statements;
    also through an `nn.Softmax(dim=-1)` module, BERT-style): hand-written scaled dot-product
    attention.

    ## Why is this bad?
    Written out, attention materialises the full `L x L` score matrix in memory three times
    (scores, softmax, dropout) and runs four kernels. `F.scaled_dot_product_attention` (torch
    2.0+) dispatches to FlashAttention or memory-efficient kernels that never store it: 2-4x
    faster on GPUs and linear instead of quadratic memory in sequence length (nanoGPT switched
    for this reason).

    ## Example
    `torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ v`

    ## Use instead
    `F.scaled_dot_product_attention(q, k, v)` (`attn_mask=`, `dropout_p=`, `is_causal=`).

    ## Fix safety
    Unsafe, and only for the plain form: one expression, no mask, no dropout, softmax over the
    last dim, scale `1/sqrt(last dim of q or k)` written so it is provable. The fused kernels
    round differently (about 1e-7 relative in fp32) and the attention weights no longer exist
    as a tensor (hooks or code reading them break). Other forms are reported only: a mask or a
    dropout module maps onto `attn_mask=`/`dropout_p=` only with care (boolean masks flip sense,
    dropout must follow `self.training`).

    ## When not to
    - Code that needs the attention weights themselves (visualisation, returning them).
    - A fallback in a function that also calls `scaled_dot_product_attention` (nanoGPT's path
      for torch < 2.0): not flagged.
    - torch before 2.0 has no `scaled_dot_product_attention`: the rule does not apply.
    """

    code = "AO609"
    name = "manual-attention"
    message = "hand-written attention; use F.scaled_dot_product_attention (fused kernels)"
    fix_safety = FixSafety.UNSAFE
    fix_reason = "fused kernels round differently and the attention weights are not materialised"
    applies_to_versions = ((2, 0), None)
    triggers = ("softmax", "Softmax")
    requires = (("@", "matmul", "bmm"),)

    VALID = [
        Valid(
            """
            import torch.nn.functional as F
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            probs = F.softmax(logits @ w, dim=-1)  # a classifier, no transposed operand
            """
        ),
        Valid(  # the fallback of a function that uses the fused kernel when it can
            """
            import math
            import torch
            import torch.nn.functional as F
            def attend(q, k, v, flash):
                if flash:
                    return F.scaled_dot_product_attention(q, k, v)
                return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ v
            """
        ),
        Valid(  # a Softmax module over a classifier's logits
            """
            import torch
            from torch import nn

            class Head(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.softmax = nn.Softmax(dim=-1)
                    self.fc = nn.Linear(8, 3)

                def forward(self, x):
                    return self.softmax(self.fc(x))
            """
        ),
        Valid(  # a user's own softmax
            """
            def softmax(x, dim):
                return x
            y = softmax(q @ k.transpose(-2, -1), dim=-1) @ v
            """
        ),
    ]
    INVALID = [
        Invalid(  # BERT-style: a Softmax module over the scores (S3Rec), reported only
            """
            import math
            import torch
            from torch import nn

            class SelfAttention(nn.Module):
                def forward(self, q, k, v, mask):
                    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
                    probs = nn.Softmax(dim=-1)(scores + mask)
                    return torch.matmul(probs, v)
            """,
            line=8,
        ),
        Invalid(  # the module bound in __init__ and called in forward
            """
            import torch
            from torch import nn

            class SelfAttention(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.softmax = nn.Softmax(dim=-1)

                def forward(self, q, k, v):
                    return torch.matmul(self.softmax(torch.matmul(q, k.transpose(-1, -2))), v)
            """,
            line=10,
        ),
        Invalid(
            """
            import math
            import torch
            def attend(q, k, v):
                return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ v
            """,
            line=4,
            fixed="""
            import math
            import torch
            def attend(q, k, v):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)
            """,
            unsafe=True,
        ),
        Invalid(
            """
            import math
            import torch
            import torch.nn.functional as F
            w = F.softmax(torch.matmul(q, k.mT) * k.shape[-1] ** -0.5, dim=-1)
            y = torch.matmul(w, v)
            out = F.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1))), -1) @ v
            """,
            line=4,
            fixed="""
            import math
            import torch
            import torch.nn.functional as F
            w = F.softmax(torch.matmul(q, k.mT) * k.shape[-1] ** -0.5, dim=-1)
            y = torch.matmul(w, v)
            out = F.scaled_dot_product_attention(q, k, v)
            """,
            unsafe=True,
        ),
        Invalid(  # nanoGPT's form: mask and dropout, over statements (report only)
            """
            import math
            import torch.nn.functional as F
            class Attn:
                def forward(self, q, k, v, T):
                    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                    att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                    att = F.softmax(att, dim=-1)
                    att = self.attn_dropout(att)
                    return att @ v
            """,
            line=7,
            message_contains="scaled_dot_product_attention",
        ),
    ]

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._bound: dict[int, dict[str, list[cst.BaseExpression]]] = {}

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, *SOFTMAX):
            scores, dim = arg(node, "input", 0), arg(node, "dim", 1)
            if (
                scores is not None
                and self._is_scores(scores.value, _DEPTH)
                and not self._has_fused_path(node)
            ):
                self.report(node, fix=self._fix(node, scores.value, dim))
        elif method_name(node) == "softmax" and not self.qualified_names(node.func):
            assert isinstance(node.func, cst.Attribute)
            if self._is_scores(node.func.value, _DEPTH) and not self._has_fused_path(node):
                self.report(node)  # `scores.softmax(-1)`: report only
        elif self._softmax_module(node.func) and node.args:
            # `nn.Softmax(dim=-1)(scores)`, `self.softmax(scores)` (BERT-style): report only
            scores = node.args[0].value
            if self._is_scores(scores, _DEPTH) and not self._has_fused_path(node):
                self.report(node)

    def _softmax_module(self, func: cst.BaseExpression) -> bool:
        """`nn.Softmax(...)`, or `self.name` where the class binds `self.name = nn.Softmax(...)`."""
        if isinstance(func, cst.Call):
            return self.is_call_to(func, *_SOFTMAX_MODULE)
        if not (
            isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value == "self"
        ):
            return False
        cls = self.parent(func)
        while cls is not None and not isinstance(cls, cst.ClassDef):
            cls = self.parent(cls)
        if cls is None:
            return False
        methods = [s for s in cls.body.body if isinstance(s, cst.FunctionDef)]
        return any(
            isinstance(value, cst.Call) and self.is_call_to(value, *_SOFTMAX_MODULE)
            for method in methods
            for target, value, _ in assignments(method)
            if target == f"self.{func.attr.value}"
        )

    def _has_fused_path(self, node: cst.Call) -> bool:
        """A fallback next to the fused path (nanoGPT's `if self.flash: ... else:`). Checked only
        for a matched softmax: generating a scope's code for every call is quadratic."""
        return "scaled_dot_product_attention" in code_of(self.facts.enclosing_scope(node))

    def _is_scores(self, expr: cst.BaseExpression, depth: int) -> bool:
        """`expr` holds `a @ b.transpose(...)`, directly or through names bound in the same
        function (`att = q @ k.mT; att = att.masked_fill(...)`)."""
        for node in walk(expr):
            operands = matmul_operands(self, node)
            if operands is not None and transposed_operand(operands[1]) is not None:
                return True
        if depth == 0:
            return False
        bound = self._bindings(self.facts.enclosing_scope(expr))
        return any(
            value is not expr and self._is_scores(value, depth - 1)
            for name in {n.value for n in walk(expr) if isinstance(n, cst.Name)}
            for value in bound.get(name, ())
        )

    def _bindings(self, scope: cst.CSTNode) -> dict[str, list[cst.BaseExpression]]:
        """name -> the values assigned to it in `scope` (cached per scope)."""
        if id(scope) not in self._bound:
            found: dict[str, list[cst.BaseExpression]] = {}
            for target, value, _ in assignments(scope):
                found.setdefault(target, []).append(value)
            self._bound[id(scope)] = found
        return self._bound[id(scope)]

    # ----- the provable plain form -----------------------------------------------------------
    def _fix(
        self, softmax: cst.Call, scores: cst.BaseExpression, dim: cst.Arg | None
    ) -> Fix | None:
        up = self.parent(softmax)
        outer = self.parent(up) if isinstance(up, cst.Arg) else up
        operands = matmul_operands(self, outer)
        if operands is None or operands[0] is not softmax or len(softmax.args) != 2:
            return None
        if dim is None or code_of(dim.value) != "-1" or not isinstance(scores, cst.BinaryOperation):
            return None
        product = matmul_operands(self, scores.left)
        if product is None or not swaps_last_two_dims(product[1]):
            return None
        q, k, v = product[0], transposed_operand(product[1]), operands[1]
        if not all(dotted(x) is not None for x in (q, k, v)):
            return None  # only names and attributes: evaluated once or twice alike
        q, k, v = (code_of(x) for x in (q, k, v))
        if not self._inverse_sqrt_scale(scores, {q, k}):
            return None
        functional, imports = functional_name(self)
        new = cst.parse_expression(f"{functional}.scaled_dot_product_attention({q}, {k}, {v})")
        return Fix(
            replacements={outer: new},
            description="scaled_dot_product_attention",
            add_imports=imports,
        )

    def _inverse_sqrt_scale(self, scores: cst.BinaryOperation, names: set[str]) -> bool:
        """`S / sqrt(d)`, `S * (1 / sqrt(d))` or `S * d ** -0.5`, with d = `q.size(-1)`."""
        right = scores.right
        if isinstance(scores.operator, cst.Divide):
            return self._sqrt_dim(right, names)
        if not isinstance(scores.operator, cst.Multiply):
            return False
        if isinstance(right, cst.BinaryOperation) and isinstance(right.operator, cst.Divide):
            one = right.left
            return code_of(one) in ("1", "1.0") and self._sqrt_dim(right.right, names)
        return (
            isinstance(right, cst.BinaryOperation)
            and isinstance(right.operator, cst.Power)
            and code_of(right.right) == "-0.5"
            and last_dim_of(right.left, names)
        )

    def _sqrt_dim(self, expr: cst.BaseExpression, names: set[str]) -> bool:
        if isinstance(expr, cst.Call) and self.refers_to(expr.func, "math.sqrt") and expr.args:
            return last_dim_of(expr.args[0].value, names)
        return (
            isinstance(expr, cst.BinaryOperation)
            and isinstance(expr.operator, cst.Power)
            and code_of(expr.right) == "0.5"
            and last_dim_of(expr.left, names)
        )
