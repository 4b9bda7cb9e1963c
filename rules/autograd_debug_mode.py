"""AO704: autograd debugging switched on in a training run."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.tree.edits import remove_statement, sole_expression_statement, unwrap_with
from autoopt.lint.tree.nodes import SCOPE_NODES, is_true, names_in, walk

_ANOMALY = ("torch.autograd.set_detect_anomaly", "torch.autograd.anomaly_mode.set_detect_anomaly")
_ANOMALY_BLOCK = ("torch.autograd.detect_anomaly", "torch.autograd.anomaly_mode.detect_anomaly")
_NVTX = ("torch.autograd.profiler.emit_nvtx", "torch.autograd.profiler_legacy.emit_nvtx")
_GRADCHECK = (
    "torch.autograd.gradcheck",
    "torch.autograd.gradgradcheck",
    "torch.autograd.gradcheck.gradcheck",
    "torch.autograd.gradcheck.gradgradcheck",
)


class AutogradDebugMode(Rule):
    """
    ## What it does
    Flags debugging switches of autograd left on in a training script:
    `torch.autograd.set_detect_anomaly(True)`, `with torch.autograd.detect_anomaly():` or
    `with torch.autograd.profiler.emit_nvtx():` around or inside the training loop, and
    `gradcheck`/`gradgradcheck` called inside the training loop.

    ## Why is this bad?
    Anomaly detection records a Python stack trace for every autograd node in the forward and
    checks every backward output for NaN, which makes steps several times slower (PyTorch's
    tuning guide: "use only for debugging"). `emit_nvtx` pushes an NVTX range per operator.
    `gradcheck` runs the function once per input element in float64.

    ## Example
    `torch.autograd.set_detect_anomaly(True)` at the top of `train.py`.

    ## Use instead
    Nothing, or a guard: `if args.debug: torch.autograd.set_detect_anomaly(True)`.

    ## Fix safety
    Unsafe: removes the call (or the `with` line, keeping its body), so a NaN is no longer
    traced to the operator that made it. `gradcheck` is reported without a fix.

    ## When not to
    - The switch is under an `if` (a `--debug` flag) or passed a variable: a deliberate choice.
    - `set_detect_anomaly(False)`, and files without a training loop (tests, debugging tools).
    - A profiler around the whole loop is AO701's.
    """

    code = "AO704"
    name = "autograd-debug-mode"
    message = "autograd anomaly detection left on: every step records stack traces; remove it"
    fix_safety = FixSafety.UNSAFE
    fix_reason = "a NaN is no longer traced back to the operator that produced it"
    triggers = ("anomaly", "emit_nvtx", "gradcheck")
    requires = (".backward(",)

    VALID = [
        Valid(
            """
            import torch
            if args.debug:
                torch.autograd.set_detect_anomaly(True)
            for x in loader:
                model(x).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            torch.autograd.set_detect_anomaly(args.detect_anomaly)
            for x in loader:
                model(x).sum().backward()
            """
        ),
        Valid(  # a unit test: no training loop
            """
            from torch.autograd import gradcheck, detect_anomaly
            def test_op():
                with detect_anomaly():
                    assert gradcheck(op, (x,))
                    op(x).sum().backward()
            """
        ),
        Valid(  # a user's own function with the same name
            """
            def set_detect_anomaly(flag):
                pass
            set_detect_anomaly(True)
            for x in loader:
                model(x).sum().backward()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            torch.autograd.set_detect_anomaly(True)
            for x in loader:
                model(x).sum().backward()
            """,
            line=2,
            fixed="""
            import torch
            for x in loader:
                model(x).sum().backward()
            """,
            unsafe=True,
        ),
        Invalid(  # the main guard is not a debug flag
            """
            import torch
            if __name__ == "__main__":
                torch.autograd.set_detect_anomaly(mode=True)
                main()
            def main():
                for x in loader:
                    model(x).sum().backward()
            """,
            line=3,
            fixed="""
            import torch
            if __name__ == "__main__":
                main()
            def main():
                for x in loader:
                    model(x).sum().backward()
            """,
            unsafe=True,
        ),
        Invalid(
            """
            from torch import autograd
            def train():
                # hunting a NaN
                with autograd.detect_anomaly():
                    for x in loader:
                        loss = model(x).sum()
                        loss.backward()
            """,
            line=4,
            fixed="""
            from torch import autograd
            def train():
                # hunting a NaN
                for x in loader:
                    loss = model(x).sum()
                    loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(
            """
            from torch.autograd import gradcheck
            for x in loader:
                assert gradcheck(layer, (x.double().requires_grad_(),))
                model(x).sum().backward()
            """,
            line=3,
            message_contains="gradcheck",
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, *_GRADCHECK):
            if self.facts.in_training_loop(node) and not _guarded(self, node):
                self.report(
                    node, "gradcheck inside the training loop runs float64 checks; remove it"
                )
            return
        anomaly = self.is_call_to(node, *_ANOMALY)
        if anomaly and not (node.args and is_true(node.args[0].value)):  # mode=True
            return
        nvtx = self.is_call_to(node, *_NVTX)
        if not (anomaly or nvtx or self.is_call_to(node, *_ANOMALY_BLOCK)):
            return
        if not self.facts.training_loops or _guarded(self, node):
            return
        message = (
            "emit_nvtx() left on: every operator pushes an NVTX range; remove it" if nvtx else None
        )
        with_node = self._with_of(node)
        if with_node is not None:
            if self._wraps_training(with_node):
                fix = None
                unwrapped = unwrap_with(with_node)
                if len(with_node.items) == 1 and with_node.items[0].asname is None and unwrapped:
                    fix = Fix(replacements={with_node: unwrapped}, description="unwrap the with")
                self.report(node, message, fix=fix)
            return
        line = sole_expression_statement(node, self.parent) if anomaly else None
        if line is not None:
            removal = remove_statement(line, self.parent)
            self.report(node, message, fix=Fix(replacements={line: removal}, description="remove"))
        elif anomaly:
            self.report(node, message)

    def _with_of(self, call: cst.Call) -> cst.With | None:
        item = self.parent(call)
        with_node = self.parent(item) if isinstance(item, cst.WithItem) else None
        return with_node if isinstance(with_node, cst.With) else None

    def _wraps_training(self, with_node: cst.With) -> bool:
        facts = self.facts
        return facts.in_training_loop(with_node) or any(
            facts.is_training_loop(n) for n in walk(with_node.body, into_scopes=False)
        )


def _guarded(rule: Rule, node: cst.CSTNode) -> bool:
    """Under an `if` (a debug flag) within its function."""
    for anc in rule.facts.ancestors(node):
        if isinstance(anc, SCOPE_NODES):
            return False
        if isinstance(anc, cst.IfExp) or (
            isinstance(anc, cst.If) and "__name__" not in names_in(anc.test)
        ):
            return True
    return False
