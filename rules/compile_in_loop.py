"""AO305: `torch.compile` called inside the training loop."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.tree.nodes import method_name

COMPILE = ("torch.compile", "torch._dynamo.optimize")


class CompileInLoop(Rule):
    """
    ## What it does
    Flags `torch.compile(...)` (or `model.compile()`) called unconditionally inside a training
    loop.

    ## Why is this bad?
    Each call wraps the module again: `torch.compile(model)` inside the loop makes a new
    `OptimizedModule` every step, and guards fail on the fresh wrapper, so dynamo re-traces and
    may recompile until it hits its recompile limit and falls back to eager, which is slower than
    never compiling. The compile cost belongs before the loop, once.

    ## Example
    `for x, y in loader: out = torch.compile(model)(x)`.

    ## Use instead
    `model = torch.compile(model)` (or `model.compile()`) once, after the model is built and
    placed, before the loop.

    ## Fix safety
    No fix: hoisting the call needs to know the model is not rebuilt in the loop.

    ## When not to
    - Under a condition in the loop (`if epoch == warmup_epochs: model.compile()`): once, on
      purpose.
    - Compiling a different function each step on purpose (rare; suppress with `# noqa: AO305`).
    """

    code = "AO305"
    name = "compile-in-loop"
    message = "torch.compile inside the training loop wraps (and re-traces) every step; compile once before the loop"
    triggers = ("compile(", "dynamo.optimize")
    requires = (".backward(",)

    VALID = [
        Valid(
            """
            import torch
            model = torch.compile(model)
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
            """
        ),
        Valid(
            """
            import torch
            for epoch in range(10):
                if epoch == 2:
                    model.compile()
                for x in loader:
                    model(x).sum().backward()
            """
        ),
        Valid(  # re.compile is no torch.compile
            """
            import re
            for x in loader:
                pattern = re.compile("a+")
                model(x).sum().backward()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x, y in loader:
                out = torch.compile(model)(x)
                loss = criterion(out, y)
                loss.backward()
                optimizer.step()
            """,
            line=3,
        ),
        Invalid(
            """
            import torch
            for x, y in loader:
                model.compile()
                model(x).sum().backward()
            """,
            line=3,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, *COMPILE):
            pass
        elif (
            method_name(node) == "compile"
            and not node.args
            and isinstance(node.func, cst.Attribute)
        ):
            pass  # nn.Module.compile(): the receiver's type is unknown, but no args is telling
        else:
            return
        loops = self.facts.enclosing_loops(node)
        if not loops or not any(self.facts.is_training_loop(loop) for loop in loops):
            return
        for anc in self.facts.ancestors(node):
            if anc is loops[0]:
                break
            if isinstance(
                anc, cst.If | cst.IfExp | cst.ExceptHandler | cst.FunctionDef | cst.Lambda
            ):
                return
        self.report(node)
