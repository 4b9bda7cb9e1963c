"""AO202: gradients clipped while they are still multiplied by the loss scale."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.tree.edits import enclosing_statement, statement_line
from autoopt.lint.tree.nodes import before, calls_in, code_of, is_name, method_name, position, walk

_CLIP = tuple(
    f"torch.nn.utils.{mod}{fn}"
    for mod in ("", "clip_grad.")
    for fn in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm")
)


class UnscaleBeforeClipping(Rule):
    """
    ## What it does
    Flags `clip_grad_norm_` / `clip_grad_value_` called after `scaler.scale(loss).backward()`
    and before `scaler.step(optimizer)` with no `scaler.unscale_(optimizer)` in between.

    ## Why
    With a `GradScaler` the gradients after `backward()` are multiplied by the loss scale
    (65536 at the start by default). Clipping them at, say, `max_norm=1.0` then clips gradients
    that are 65536 times too large: every step is clipped to a tiny fraction of the intended
    update, and training silently crawls. `scaler.unscale_(optimizer)` divides the gradients
    back first; `scaler.step` knows they are unscaled and does not divide again (as widely read PyTorch tutorials teach;
    the AMP recipe in the PyTorch docs).

    ## When not to
    - Clipping the parameters of a different optimizer than the one stepped next (GANs): the fix
      unscales the optimizer whose parameters are clipped when the file shows which one that is,
      and otherwise reports without a fix.
    - An `unscale_` already between `backward()` and the clip.

    ## Fix (safe)
    Inserts `scaler.unscale_(optimizer)` on the line before the clip, with the script's own
    scaler and optimizer names. `unscale_` may be called once per optimizer per step, which this
    placement keeps (it sits before the first clip only).
    """

    code = "AO202"
    name = "unscale-before-clipping"
    message = "gradients are clipped while still scaled by GradScaler; call scaler.unscale_ first"
    fix_safety = FixSafety.SAFE
    fix_reason = "scaler.step() skips the division it would otherwise do; results are exact"
    triggers = ("clip_grad",)
    requires = (".scale(", ".backward(")

    VALID = [
        Valid(
            """
            import torch
            for x, y in loader:
                scaler.scale(loss_fn(model(x), y)).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            """
        ),
        Valid(  # no GradScaler: gradients are true-scale
            """
            import torch
            for x, y in loader:
                loss_fn(model(x), y).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            """
        ),
        Valid(  # a user's own clip function
            """
            from mylib import clip_grad_norm_
            for x, y in loader:
                scaler.scale(loss_fn(model(x), y)).backward()
                clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
            """
        ),
        Valid(  # clip after the step (odd, but not this bug)
            """
            from torch.nn.utils import clip_grad_value_
            for x, y in loader:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                clip_grad_value_(model.parameters(), 1.0)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch import nn
            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                with torch.autocast("cuda"):
                    loss = loss_fn(model(x), y)
                scaler.scale(loss).backward()
                # keep updates bounded
                nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                scaler.step(opt)
                scaler.update()
            """,
            line=9,
            fixed="""
            import torch
            from torch import nn
            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                with torch.autocast("cuda"):
                    loss = loss_fn(model(x), y)
                scaler.scale(loss).backward()
                # keep updates bounded
                scaler.unscale_(opt)
                nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                scaler.step(opt)
                scaler.update()
            """,
        ),
        Invalid(  # GAN: the clipped parameters belong to opt_d, which is stepped second
            """
            from torch.nn.utils import clip_grad_norm_
            opt_g = Adam(gen.parameters())
            opt_d = Adam(disc.parameters())
            for real in loader:
                scaler.scale(d_loss).backward()
                if (i + 1) % 2 == 0:
                    norm = clip_grad_norm_(disc.parameters(), 5.0)
                scaler.step(opt_g)
                scaler.step(opt_d)
            """,
            line=7,
            fixed="""
            from torch.nn.utils import clip_grad_norm_
            opt_g = Adam(gen.parameters())
            opt_d = Adam(disc.parameters())
            for real in loader:
                scaler.scale(d_loss).backward()
                if (i + 1) % 2 == 0:
                    scaler.unscale_(opt_d)
                    norm = clip_grad_norm_(disc.parameters(), 5.0)
                scaler.step(opt_g)
                scaler.step(opt_d)
            """,
        ),
        Invalid(  # which optimizer owns these parameters is unknown: reported, not fixed
            """
            import torch
            opt = SGD(model.parameters(), lr=0.1)
            for x in loader:
                scaler.scale(loss).backward()
                torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
                scaler.step(opt)
            """,
            line=5,
            fixed=None,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, *_CLIP):
            return
        scope = self.facts.enclosing_scope(node)
        calls = list(calls_in(scope, into_scopes=False))
        backward = [c for c in calls if _scaled_backward(c) is not None and before(self, c, node)]
        if not backward:
            return
        last_backward = max(backward, key=self._pos)
        scaler = _scaled_backward(last_backward)
        assert scaler is not None
        scaler_text = code_of(scaler)
        steps = [
            c
            for c in calls
            if _is_method_on(c, "step", scaler_text) and c.args and before(self, node, c)
        ]
        if not steps:
            return
        if any(
            _is_method_on(c, "unscale_", scaler_text)
            and before(self, last_backward, c)
            and before(self, c, node)
            for c in calls
        ):
            return
        steps.sort(key=self._pos)
        optimizer = self._optimizer_for(node, steps)
        line = enclosing_statement(node, self.parent)
        if (
            optimizer is None
            or not isinstance(line, cst.SimpleStatementLine)
            or not isinstance(self.parent(line), cst.IndentedBlock | cst.Module)
        ):
            self.report(
                node,
                self.message + " (not fixed: cannot tell which optimizer owns these parameters)",
            )
            return
        unscale = statement_line(f"{scaler_text}.unscale_({code_of(optimizer)})")
        new = cst.FlattenSentinel(
            [
                unscale.with_changes(leading_lines=line.leading_lines),
                line.with_changes(leading_lines=()),
            ]
        )
        self.report(
            node,
            fix=Fix(replacements={line: new}, description=f"insert {scaler_text}.unscale_()"),
        )

    def _pos(self, node: cst.CSTNode) -> tuple[int, int]:
        return position(self, node)

    def _optimizer_for(self, clip: cst.Call, steps: list[cst.Call]) -> cst.BaseExpression | None:
        """The optimizer to unscale: the first stepped one built from the clipped module's
        parameters; the next stepped one when the file does not say what either is built from."""
        clipped = _params_owner(clip.args[0].value) if clip.args else None
        owners = {code_of(s.args[0].value): self._built_from(s.args[0].value) for s in steps}
        if clipped is not None:
            for s in steps:
                if owners[code_of(s.args[0].value)] == clipped:
                    return s.args[0].value
        first = steps[0].args[0].value
        owner = owners[code_of(first)]
        if clipped is None or owner is None:
            return first if len({*owners}) == 1 or clipped is None else None
        return None

    def _built_from(self, optimizer: cst.BaseExpression) -> str | None:
        """`opt = Adam(model.parameters(), ...)` -> "model"."""
        if not isinstance(optimizer, cst.Name):
            return None
        for node in walk(self.context.module):
            if (
                isinstance(node, cst.Assign)
                and any(is_name(t.target, optimizer.value) for t in node.targets)
                and isinstance(node.value, cst.Call)
                and node.value.args
            ):
                return _params_owner(node.value.args[0].value)
        return None


def _scaled_backward(call: cst.Call) -> cst.BaseExpression | None:
    """`S.scale(loss).backward()` -> S."""
    if method_name(call) != "backward":
        return None
    assert isinstance(call.func, cst.Attribute)
    inner = call.func.value
    if isinstance(inner, cst.Call) and method_name(inner) == "scale":
        assert isinstance(inner.func, cst.Attribute)
        return inner.func.value
    return None


def _is_method_on(call: cst.Call, method: str, receiver: str) -> bool:
    return (
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value == method
        and code_of(call.func.value) == receiver
    )


def _params_owner(expr: cst.BaseExpression) -> str | None:
    """`model.parameters()` / `list(model.parameters())` -> "model"."""
    if isinstance(expr, cst.Call) and is_name(expr.func, "list") and expr.args:
        expr = expr.args[0].value
    if isinstance(expr, cst.Call) and method_name(expr) == "parameters":
        assert isinstance(expr.func, cst.Attribute)
        return code_of(expr.func.value)
    return None
