"""AO203: a model or its data in float64 in a training script."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import FixSafety, Invalid, Rule, Valid
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.nodes import dotted, method_name, string_value

_FLOAT64 = ("torch.float64", "torch.double")
_DOUBLE_TENSOR = ("torch.DoubleTensor", "torch.cuda.DoubleTensor")
_GRADCHECK = ("gradcheck", "gradgradcheck")


class Float64Training(Rule):
    """
    ## What it does
    Flags float64 in a script that trains (has a loop calling `backward()`, or runs training
    that lives in another module of the project): `.double()`,
    `torch.set_default_dtype(torch.float64)`, `set_default_tensor_type(torch.DoubleTensor)`,
    `dtype=torch.float64` and `.to(torch.float64)` / `.type(torch.float64)`, also through a
    name bound to `torch.float64` (`dtype = torch.float64; torch.set_default_dtype(dtype)`).

    ## Why
    float64 halves the numbers that fit in a cache line and a SIMD register on CPUs (about 2x
    slower for memory- and compute-bound kernels alike), and on consumer and most data-centre
    GPUs float64 runs at 1/32 to 1/64 of float32 throughput (no tensor cores, no TF32, no AMP).
    Neural-network training is robust to float32 — and usually to bf16/fp16 — so the extra
    precision buys nothing but time and twice the memory (as a widely read PyTorch tutorial teaches).

    ## When not to
    - Scientific code that needs float64 (ill-conditioned solves, physics simulations,
      `torch.autograd.gradcheck`, which requires it): files that call `gradcheck` are not
      flagged, and `# noqa: AO203` silences one line.
    - A `.double()` used for a metric (`correct.double() / n`, inside `print` or an f-string) is
      not flagged: it is a scalar, not the model or the data.
    - Files with no training loop.

    ## Fix
    None: whether float32 suffices is a numerical judgement about the user's problem.
    """

    code = "AO203"
    name = "float64-training"
    message = "float64 in a training script is 2x (CPU) to 32x (GPU) slower than float32"
    fix_safety = FixSafety.NONE
    fix_reason = "whether float32 is precise enough is a judgement about the user's numerics"
    triggers = ("double", "float64", "DoubleTensor")
    requires = (".backward(",)

    VALID = [
        Valid(  # gradcheck needs float64
            """
            import torch
            x = torch.randn(3, dtype=torch.float64, requires_grad=True)
            torch.autograd.gradcheck(f, (x,))
            for step in range(3):
                f(x).sum().backward()
            """
        ),
        Valid(  # a metric, not training data
            """
            import torch
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                running_corrects += (preds == y).sum()
            acc = running_corrects.double() / len(ds)
            """
        ),
        Valid(  # no training loop
            """
            import torch
            model = Net().double()
            print(model(torch.randn(1, 3, dtype=torch.float64)))
            """
        ),
        Valid(  # numpy's float64 is not torch's
            """
            import numpy as np
            weights = np.zeros(3, dtype=np.float64)
            for x in loader:
                model(x).sum().backward()
            """
        ),
    ]
    INVALID = [
        Invalid(  # the dtype bound to a name first (PyTorch-RL's examples)
            """
            import torch
            dtype = torch.float64
            torch.set_default_dtype(dtype)
            for x in loader:
                model(x).sum().backward()
            """,
            line=3,
        ),
        Invalid(  # torch only through a star import of the project's helpers
            """
            from utils import *
            torch.set_default_dtype(torch.float64)
            for x in loader:
                model(x).sum().backward()
            """,
            line=2,
        ),
        Invalid(
            """
            import torch
            model = Net().double()
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            """,
            line=2,
            message_contains=".double()",
        ),
        Invalid(
            """
            import torch
            torch.set_default_dtype(torch.float64)
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            """,
            line=2,
        ),
        Invalid(
            """
            import torch as th
            def train(model, loader):
                for x, y in loader:
                    x = x.to(th.double)
                    model(x).sum().backward()
            """,
            line=4,
        ),
        Invalid(
            """
            from torch import float64, randn
            data = randn(100, 3, dtype=float64)
            for x in data:
                model(x).sum().backward()
            """,
            line=2,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        self._active = bool(self.facts.training_loops) and not any(
            g in self.context.source for g in _GRADCHECK
        )

    def visit_Call(self, node: cst.Call) -> None:
        if not self._active:
            return
        what = self._float64_use(node)
        if what is not None:
            self.report(node, f"{what}: {self.message}")

    def _float64_use(self, call: cst.Call) -> str | None:
        method = method_name(call)
        if method == "double" and not call.args and not self._in_metric(call):
            return "`.double()`"
        if self._is_torch(call.func, "torch.set_default_dtype") and call.args:
            if self._is_float64(call.args[0].value):
                return "`set_default_dtype(float64)`"
            return None
        if self.is_call_to(call, "torch.set_default_tensor_type") and call.args:
            value = call.args[0].value
            if self.refers_to(value, *_DOUBLE_TENSOR) or string_value(value) in _DOUBLE_TENSOR:
                return "`set_default_tensor_type(DoubleTensor)`"
            return None
        dtype = arg(call, "dtype")
        if dtype is not None and self._is_float64(dtype.value):
            return "`dtype=float64`"
        if (
            method in ("to", "type")
            and call.args
            and call.args[0].keyword is None
            and self._is_float64(call.args[0].value)
        ):
            return f"`.{method}(float64)`"
        return None

    def _is_float64(self, expr: cst.BaseExpression) -> bool:
        """`torch.float64`, or a name bound only to it here or at module level
        (`dtype = torch.float64; torch.set_default_dtype(dtype)`)."""
        if not isinstance(expr, cst.Name | cst.Attribute):
            return False
        if self._is_torch(expr, *_FLOAT64):
            return True
        if not isinstance(expr, cst.Name):
            return False
        facts = self.facts
        for scope in (facts.enclosing_scope(expr), self.context.module):
            bound = facts.assigned_in(scope).get(expr.value)
            if bound:
                return all(self._is_torch(value, *_FLOAT64) for value, _ in bound)
        return False

    def _is_torch(self, expr: cst.BaseExpression, *qualified: str) -> bool:
        """`expr` names one of torch's `qualified` objects: through the file's imports, or
        spelled out in a file that has `torch` only from a star import of its own helpers
        (PyTorch-RL's `from utils import *`)."""
        if not isinstance(expr, cst.Name | cst.Attribute):
            return False
        if self.refers_to(expr, *qualified):
            return True
        facts = self.facts
        return (
            dotted(expr) in qualified
            and "torch" not in facts.imported_names
            and "torch" not in facts.defined_names
            and "import *" in self.context.source
        )

    def _in_metric(self, call: cst.Call) -> bool:
        """Part of a division, a print or an f-string: a statistic, not the model or data."""
        child: cst.CSTNode = call
        for anc in self.facts.ancestors(call):
            if isinstance(anc, cst.BinaryOperation) and isinstance(
                anc.operator, cst.Divide | cst.FloorDivide
            ):
                return True
            if isinstance(anc, cst.FormattedString):
                return True
            if (
                isinstance(anc, cst.Call)
                and child is not anc.func
                and isinstance(anc.func, cst.Name)
                and anc.func.value in ("print", "float")
            ):
                return True
            if isinstance(anc, cst.BaseStatement):
                return False
            child = anc
        return False
