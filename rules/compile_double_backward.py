"""AO304: `torch.compile` on a module that a gradient penalty differentiates twice."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.nodes import dotted, nodes_of_type

_AUTOGRAD_GRAD = ("torch.autograd.grad", "torch.autograd.grad_mode.grad")
_COMPILE = ("torch.compile",)


class CompileDoubleBackward(Rule):
    """
    ## What it does
    Flags `torch.compile` of a module whose output a gradient penalty differentiates with
    `torch.autograd.grad(..., create_graph=True)` (WGAN-GP, R1, path-length regularisation).

    ## Why is this bad?
    The penalty's backward differentiates through the compiled module's backward, and
    "torch.compile with aot_autograd does not currently support double backward": the run fails
    at the first penalty step, after paying for the compile.

    ## Example
    `D = torch.compile(D)`, then `grads = torch.autograd.grad(D(x_hat).sum(), x_hat,
    create_graph=True)` and `penalty.backward()`.

    ## Use instead
    Compile the modules that are differentiated once (the generator) and leave this one eager;
    or `autoopt.optimize(model, compile=True)`, which falls back to eager for such a module.

    ## Fix safety
    No fix: which module to leave eager is a choice.

    ## When not to
    - The compiled module is not the one the penalty differentiates through.
    - `create_graph=False` (a first-order gradient): compile handles it.
    """

    code = "AO304"
    name = "compile-double-backward"
    message = "torch.compile on a module differentiated twice (create_graph=True): compile cannot run double backward"
    triggers = ("compile",)
    requires = ("create_graph",)

    VALID = [
        Valid(  # the penalty goes through D; G is compiled
            """
            import torch
            G = torch.compile(G)
            for real in loader:
                fake = G(z)
                x_hat = eps * real + (1 - eps) * fake
                score = D(x_hat)
                grads = torch.autograd.grad(score.sum(), x_hat, create_graph=True)[0]
                penalty = ((grads.norm(2, dim=1) - 1) ** 2).mean()
                penalty.backward()
            """
        ),
        Valid(
            """
            import torch
            D = torch.compile(D)
            score = D(x)
            grads = torch.autograd.grad(score.sum(), x, create_graph=False)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            D = torch.compile(D)
            for real in loader:
                x_hat = (eps * real + (1 - eps) * fake).requires_grad_(True)
                score = D(x_hat)
                grads = torch.autograd.grad(
                    outputs=score, inputs=x_hat, grad_outputs=torch.ones_like(score),
                    create_graph=True,
                )[0]
                gp = ((grads.norm(2, dim=1) - 1) ** 2).mean()
                gp.backward()
            """,
            line=2,
        ),
        Invalid(
            """
            import torch
            for real in loader:
                critic.compile()
                out = critic(real)
                g, = torch.autograd.grad(out.sum(), real, create_graph=True)
                (g.pow(2).sum()).backward()
            """,
            line=3,
        ),
    ]

    def leave_Module(self, node: cst.Module) -> None:
        penalised = self._penalised_modules(node)
        if not penalised:
            return
        for call in nodes_of_type(node, cst.Call):
            target = None
            if self.is_call_to(call, *_COMPILE) and call.args:
                target = dotted(call.args[0].value)
            elif (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "compile"
                and not call.args
            ):
                target = dotted(call.func.value)
            if target is not None and target in penalised:
                self.report(call)

    def _penalised_modules(self, module: cst.Module) -> set[str]:
        """Callees whose output feeds `autograd.grad(..., create_graph=True)`'s outputs."""
        made_by: dict[str, set[str]] = {}  # variable -> modules called to make it
        for assign in nodes_of_type(module, cst.Assign):
            if isinstance(assign.value, cst.Call):
                callee = dotted(assign.value.func)
                for target in assign.targets:
                    name = dotted(target.target)
                    if callee is not None and name is not None:
                        made_by.setdefault(name, set()).add(callee)
        found: set[str] = set()
        for call in nodes_of_type(module, cst.Call):
            if not self.is_call_to(call, *_AUTOGRAD_GRAD):
                continue
            create = arg(call, "create_graph", 3)
            if create is None or not (
                isinstance(create.value, cst.Name) and create.value.value == "True"
            ):
                continue
            outputs = arg(call, "outputs", 0)
            if outputs is None:
                continue
            expr = outputs.value
            while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
                expr = expr.func.value  # score.sum() -> score
            if isinstance(expr, cst.Call):
                callee = dotted(expr.func)  # autograd.grad(D(x).sum(), ...)
                if callee is not None:
                    found.add(callee)
                continue
            name = dotted(expr)
            if name is not None:
                found |= made_by.get(name, set())
        return found
