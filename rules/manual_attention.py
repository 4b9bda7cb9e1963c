"""AO609: attention written out as softmax(q @ k^T * scale) @ v."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.calls import arg
from autoopt.lint.nodes import code_of, dotted, int_literal, method_name, walk
from autoopt.lint.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.torch_api import MATMUL, SOFTMAX, functional_name

_TRANSPOSES = ("transpose", "permute", "t", "mT", "T")


class ManualAttention(Rule):
    """
    ## What it does
    Flags a softmax over `q @ k.transpose(...)` scores (with or without scaling, a
    `masked_fill` mask or dropout on the weights, in one expression or over a few statements):
    hand-written scaled dot-product attention.

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
    - torch before 2.0 has no `scaled_dot_product_attention`: the rule does not apply.
    """

    code = "AO609"
    name = "manual-attention"
    message = "hand-written attention; use F.scaled_dot_product_attention (fused kernels)"
    fix_safety = FixSafety.UNSAFE
    fix_reason = "fused kernels round differently and the attention weights are not materialised"
    applies_to_versions = ((2, 0), None)
    triggers = ("softmax",)
    requires = (("@", "matmul", "bmm"),)

    VALID = [
        Valid(
            """
            import torch.nn.functional as F
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            probs = F.softmax(logits @ w, dim=-1)  # a classifier, no transposed operand
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

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, *SOFTMAX):
            scores, dim = arg(node, "input", 0), arg(node, "dim", 1)
        elif method_name(node) == "softmax" and not self.qualified_names(node.func):
            scores, dim = None, arg(node, "dim", 0)
            assert isinstance(node.func, cst.Attribute)
            if self._is_scores(node.func.value, 4):
                self.report(node)
            return
        else:
            return
        if scores is None or not self._is_scores(scores.value, 4):
            return
        self.report(node, fix=self._fix(node, scores.value, dim))

    # ----- detection -------------------------------------------------------------------------
    def _is_scores(self, expr: cst.BaseExpression, depth: int) -> bool:
        """`expr` holds `a @ b.transpose(...)`, directly or through names bound earlier in the
        same function (`att = q @ k.mT; att = att.masked_fill(...)`)."""
        if any(self._transposed_matmul(n) for n in walk(expr)):
            return True
        if depth == 0:
            return False
        scope = self.facts.enclosing_scope(expr)
        for name in {n.value for n in walk(expr) if isinstance(n, cst.Name)}:
            for node in walk(scope, into_scopes=False):
                if (
                    isinstance(node, cst.Assign)
                    and any(code_of(t.target) == name for t in node.targets)
                    and node.value is not expr
                    and self._is_scores(node.value, depth - 1)
                ):
                    return True
        return False

    def _transposed_matmul(self, node: cst.CSTNode) -> bool:
        operands = _matmul_operands(self, node)
        return operands is not None and _transposed(operands[1]) is not None

    # ----- the provable plain form -----------------------------------------------------------
    def _fix(
        self, softmax: cst.Call, scores: cst.BaseExpression, dim: cst.Arg | None
    ) -> Fix | None:
        up = self.parent(softmax)
        outer = self.parent(up) if isinstance(up, cst.Arg) else up
        operands = _matmul_operands(self, outer) if outer is not None else None
        if operands is None or operands[0] is not softmax or len(softmax.args) != 2:
            return None
        if dim is None or not _minus_one(dim.value):
            return None
        if not isinstance(scores, cst.BinaryOperation):
            return None
        product = _matmul_operands(self, scores.left)
        kt = _transposed(product[1]) if product else None
        if product is None or kt is None or not _last_two(product[1]):
            return None
        q, k, v = (code_of(x) for x in (product[0], kt, operands[1]))
        if not all(_plain(x) for x in (product[0], kt, operands[1])):
            return None
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
            and _last_dim_of(right.left, names)
        )

    def _sqrt_dim(self, expr: cst.BaseExpression, names: set[str]) -> bool:
        if isinstance(expr, cst.Call) and self.refers_to(expr.func, "math.sqrt") and expr.args:
            return _last_dim_of(expr.args[0].value, names)
        return (
            isinstance(expr, cst.BinaryOperation)
            and isinstance(expr.operator, cst.Power)
            and code_of(expr.right) == "0.5"
            and _last_dim_of(expr.left, names)
        )


def _matmul_operands(
    rule: Rule, node: cst.CSTNode | None
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
        return node.left, node.right
    if isinstance(node, cst.Call) and rule.is_call_to(node, *MATMUL) and len(node.args) == 2:
        return node.args[0].value, node.args[1].value
    return None


def _transposed(expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """`k.transpose(...)`, `k.permute(...)`, `k.t()`, `k.mT`, `k.T` -> `k`."""
    if isinstance(expr, cst.Attribute) and expr.attr.value in _TRANSPOSES:
        return expr.value
    if isinstance(expr, cst.Call) and method_name(expr) in _TRANSPOSES:
        assert isinstance(expr.func, cst.Attribute)
        return expr.func.value
    return None


def _last_two(expr: cst.BaseExpression) -> bool:
    """Swaps exactly the last two dims: `.transpose(-2, -1)`, `.transpose(-1, -2)`, `.mT`."""
    if isinstance(expr, cst.Attribute):
        return expr.attr.value == "mT"
    if isinstance(expr, cst.Call) and method_name(expr) == "transpose" and len(expr.args) == 2:
        return sorted(code_of(a.value) for a in expr.args) == ["-1", "-2"]
    return False


def _last_dim_of(expr: cst.BaseExpression, names: set[str]) -> bool:
    """`x.size(-1)` or `x.shape[-1]` with `x` in `names`."""
    text = code_of(expr).replace(" ", "")
    return any(text in (f"{n}.size(-1)", f"{n}.shape[-1]") for n in names)


def _minus_one(expr: cst.BaseExpression) -> bool:
    return (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, cst.Minus)
        and int_literal(expr.expression) == 1
    )


def _plain(expr: cst.BaseExpression) -> bool:
    """A name or attribute chain: evaluating it once or twice is the same."""
    return dotted(expr) is not None
