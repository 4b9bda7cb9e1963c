"""AO406: gradients zeroed by writing zeros instead of being released."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.tree.calls import arg, with_keyword
from autoopt.lint.tree.nodes import is_name, method_name, nodes_of_type

_DEFAULT_TRUE = (2, 0)  # set_to_none defaults to True since torch 2.0


class ZeroGradSetToNone(Rule):
    """
    ## What it does
    For code targeting torch 2.0 or later (or an unknown version), flags
    `zero_grad(set_to_none=False)`. For code targeting torch 1.7-1.13, where `set_to_none`
    exists but defaults to False, flags a bare `zero_grad()` instead.

    ## Why
    `set_to_none=False` launches a fill kernel per parameter every step to write zeros and keeps
    the gradient memory allocated between steps; with `set_to_none=True` the gradients are
    released and `backward()` writes fresh ones instead of adding into zeros — one memory pass
    fewer per parameter and a smaller peak between steps. PyTorch made it the default in 2.0.

    ## When not to
    - Code that reads `p.grad` between `zero_grad()` and `backward()` (or for parameters that
      get no gradient) expects a zero tensor and would find `None`. Optimizers also skip
      parameters whose `.grad` is None, so a parameter unused in a step gets no momentum or
      weight-decay update. Where the file reads `.grad`, the fix is marked unsafe.
    - torch older than 1.7 has no `set_to_none`: the rule does not apply.

    ## Fix
    - torch >= 2.0: drop the argument (safe unless the file reads `.grad`).
    - torch 1.7-1.13: add `set_to_none=True` — always unsafe, since it changes what the code's
      torch version does by default.
    """

    code = "AO406"
    name = "zero-grad-set-to-none"
    message = "zero_grad(set_to_none=False) writes zeros into every gradient; drop the argument"
    fix_safety = FixSafety.SAFE
    fix_reason = (
        "the next backward() writes the same gradients into fresh tensors; unsafe where the code"
        " reads .grad, which becomes None instead of zeros"
    )
    triggers = ("zero_grad(",)
    applies_to_versions = ((1, 7), None)

    VALID = [
        Valid(
            """
            for x in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()
            """
        ),
        Valid(
            """
            optimizer.zero_grad(set_to_none=True)
            """
        ),
        Valid(  # a variable: the script decides at run time
            """
            optimizer.zero_grad(set_to_none=args.release_grads)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            for x in loader:
                optimizer.zero_grad(set_to_none=False)
                model(x).sum().backward()
                optimizer.step()
            """,
            line=2,
            fixed="""
            for x in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()
            """,
        ),
        Invalid(  # reads .grad: the fix is unsafe
            """
            for x in loader:
                model.zero_grad(False)
                model(x).sum().backward()
                norms = [p.grad.norm() for p in model.parameters()]
            """,
            line=2,
            fixed="""
            for x in loader:
                model.zero_grad()
                model(x).sum().backward()
                norms = [p.grad.norm() for p in model.parameters()]
            """,
            unsafe=True,
        ),
        Invalid(
            """
            for x in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
            """,
            line=2,
            target_version="1.13",
            message_contains="set_to_none=True",
            fixed="""
            for x in loader:
                optimizer.zero_grad(set_to_none=True)
                model(x).sum().backward()
            """,
            unsafe=True,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        self._reads_grad = any(n.attr.value == "grad" for n in nodes_of_type(node, cst.Attribute))

    def visit_Call(self, node: cst.Call) -> None:
        if method_name(node) != "zero_grad" or any(a.star for a in node.args):
            return
        version = self.context.target_version
        given = arg(node, "set_to_none", 0)
        if version is not None and version < _DEFAULT_TRUE:
            if given is None:
                self.report(
                    node,
                    "zero_grad() writes zeros into every gradient before torch 2.0; "
                    "pass set_to_none=True",
                    fix=Fix(
                        replacements={node: with_keyword(node, "set_to_none", cst.Name("True"))},
                        description="set_to_none=True",
                        safety=FixSafety.UNSAFE,  # changes this torch version's default
                    ),
                )
            return
        if given is None or not is_name(given.value, "False"):
            return
        new_call = node.with_changes(
            args=[a for a in node.args if a is not given],
            whitespace_before_args=cst.SimpleWhitespace(""),
        )
        self.report(
            node,
            fix=Fix(
                replacements={node: new_call},
                description="drop set_to_none=False",
                safety=FixSafety.UNSAFE if self._reads_grad else None,
            ),
        )
