"""AO402: a running loss metric that accumulates autograd graphs."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.tree.nodes import contains, method_name, names_in, walk

_LOG_METHODS = {
    "log",
    "info",
    "debug",
    "warning",
    "add_scalar",
    "add_scalars",
    "set_postfix",
    "set_description",
    "append",
    "write",
    "log_metrics",
    "log_dict",
    "format",
}
_NOT_GRAPH = {"item", "detach", "tolist", "cpu", "numpy"}
# Loggers that read a 0-dim tensor as they read a float.
_TAKES_TENSOR = {"add_scalar", "add_scalars"}


class LossItemForMetrics(Rule):
    """
    ## What it does
    Flags `total += loss` inside a training loop, where `loss` is the tensor that `backward()` is
    called on and `total` is only a metric (printed, logged or averaged).

    ## Why
    `loss` is the root of this step's autograd graph. Adding it to a running total makes the
    total part of every step's graph: the graphs of all steps stay alive (memory grows until the
    epoch ends or the process runs out), and each `+=` records another autograd node (as a widely read PyTorch tutorial teaches).
    `loss.item()` adds a plain Python float instead.

    ## When not to
    - The sum feeds a `backward()` (a loss summed over several heads or micro-steps on purpose),
      or `torch.autograd.grad`, or a `torch.distributed` collective: it must stay a tensor.
    - `loss` is already a float (`loss = loss.item()` / `float(...)`) or detached
      (`loss.detach()` keeps the total on the device without a sync — also fine).
    - A total that is never printed, logged or averaged in the function is not assumed to be a
      metric.

    ## Fix (safe)
    `total += loss.detach()`: the total keeps the same value without the graph, and stays on
    the device, so there is no host sync per step either (`total += loss.item()` would be one,
    which AO702 reports). Safe where every read of the total formats it with a format spec
    (`f"{total / n:.3f}"`) or hands it to `add_scalar`, which treat a 0-dim tensor as a
    float; elsewhere it is unsafe: the total becomes a tensor (`print(total)` shows
    `tensor(...)`), so call `.item()` where it is logged.
    """

    code = "AO402"
    name = "loss-item-for-metrics"
    message = "running metric accumulates the loss tensor (and its graph); add loss.detach()"
    fix_safety = FixSafety.SAFE
    fix_reason = "the metric gets the same value without the graph, formatted as before"
    triggers = ("+=",)
    requires = (".backward(",)

    VALID = [
        Valid(
            """
            total = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total += loss.item()
            print(total / len(loader))
            """
        ),
        Valid(  # the sum feeds backward
            """
            for x, y in loader:
                total = 0
                for head in heads:
                    loss = criterion(head(x), y)
                    total += loss
                total.backward()
            """
        ),
        Valid(  # loss already a float
            """
            running = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                loss = loss.item()
                running += loss
            print(running)
            """
        ),
        Valid(  # kept on the device on purpose, reduced across ranks
            """
            import torch.distributed as dist
            total = torch.zeros(())
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total += loss
            dist.all_reduce(total)
            """
        ),
    ]
    INVALID = [
        Invalid(  # printed as it is: a tensor total would print as tensor(...), so unsafe
            """
            total = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total += loss
            print("loss", total)
            """,
            line=5,
            message_contains="becomes a 0-dim tensor",
            fixed="""
            total = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total += loss.detach()
            print("loss", total)
            """,
            unsafe=True,
        ),
        Invalid(
            """
            for epoch in range(3):
                running_loss = 0.0
                for i, (x, y) in enumerate(loader):
                    optimizer.zero_grad()
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
                    running_loss += loss
                print(f"epoch {epoch}: {running_loss / len(loader):.3f}")
            """,
            line=8,
            fixed="""
            for epoch in range(3):
                running_loss = 0.0
                for i, (x, y) in enumerate(loader):
                    optimizer.zero_grad()
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
                    running_loss += loss.detach()
                print(f"epoch {epoch}: {running_loss / len(loader):.3f}")
            """,
        ),
        Invalid(
            """
            def train(model, loader, scaler, writer):
                epoch_loss = 0
                for x, y in loader:
                    loss = model(x, y)
                    scaler.scale(loss).backward()
                    epoch_loss += batch_size * loss
                writer.add_scalar("loss", epoch_loss / len(loader.dataset))
            """,
            line=6,
            fixed="""
            def train(model, loader, scaler, writer):
                epoch_loss = 0
                for x, y in loader:
                    loss = model(x, y)
                    scaler.scale(loss).backward()
                    epoch_loss += batch_size * loss.detach()
                writer.add_scalar("loss", epoch_loss / len(loader.dataset))
            """,
        ),
    ]

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if not isinstance(node.operator, cst.AddAssign) or not isinstance(node.target, cst.Name):
            return
        loop = self.facts.training_loop_of(node)
        if loop is None:
            return
        loss = next(
            (n for n in _loss_operands(node.value) if self._is_graph_loss(loop, n.value)), None
        )
        if loss is None:
            return
        total = node.target.value
        scope = self.facts.enclosing_scope(node)
        if self._stays_tensor(scope, total) or not self._is_metric(scope, node, total):
            return
        # `.detach()`, not `.item()`: the total stays on the device with no host sync per step
        # (`.item()` there is what AO702 flags; fixes and lint reach one fixed point).
        detached = cst.Call(func=cst.Attribute(value=loss, attr=cst.Name("detach")))
        unsafe = self._read_as_float(scope, total)
        self.report(
            node,
            self.message if unsafe is None else f"{self.message}; unsafe fix: {unsafe}",
            fix=Fix(
                replacements={loss: detached},
                description="loss.detach()",
                safety=None if unsafe is None else FixSafety.UNSAFE,
            ),
        )

    def _read_as_float(self, scope: cst.CSTNode, total: str) -> str | None:
        """Why a 0-dim tensor total would read differently from a float (None: every read
        formats it with a format spec, `f"{total / n:.3f}"`, or hands it to `add_scalar`,
        which take a tensor as they take a float)."""
        for n in walk(scope, into_scopes=False):
            if not (isinstance(n, cst.Name) and n.value == total) or self._stored(n):
                continue
            if not self._formatted(n):
                return (
                    f"`{total}` becomes a 0-dim tensor on the loss's device where it is read "
                    "(printed as tensor(...), not a Python float)"
                )
        return None

    def _stored(self, name: cst.Name) -> bool:
        parent = self.parent(name)
        return isinstance(parent, cst.AssignTarget | cst.AugAssign) and parent.target is name

    def _formatted(self, name: cst.Name) -> bool:
        for anc in self.facts.ancestors(name):
            if isinstance(anc, cst.BaseStatement):
                return False
            if isinstance(anc, cst.FormattedStringExpression):
                return anc.format_spec is not None
            if isinstance(anc, cst.Call) and method_name(anc) in _TAKES_TENSOR:
                return not contains(anc.func, name)
        return False

    def _is_graph_loss(self, loop: cst.CSTNode, loss: str) -> bool:
        """`loss` is assigned in the loop, not as a float or detached value, and backward() is
        called on it (directly, scaled, or divided)."""
        assigned = False
        for n in walk(loop, into_scopes=False):
            if isinstance(n, cst.Assign) and any(loss in names_in(t.target) for t in n.targets):
                value = n.value
                if isinstance(value, cst.Call) and (
                    method_name(value) in _NOT_GRAPH
                    or (isinstance(value.func, cst.Name) and value.func.value == "float")
                ):
                    return False
                assigned = True
        if not assigned:
            return False
        for call in self.facts.backward_calls:
            if (
                contains(loop, call)
                and isinstance(call.func, cst.Attribute)
                and loss in names_in(call.func.value)
            ):
                return True
        return False

    def _stays_tensor(self, scope: cst.CSTNode, total: str) -> bool:
        """`total` is differentiated or reduced across processes."""
        for call in self.facts.backward_calls:
            if isinstance(call.func, cst.Attribute) and total in names_in(call.func.value):
                return True
        for n in walk(scope, into_scopes=False):
            if isinstance(n, cst.Call) and any(total in names_in(a.value) for a in n.args):
                names = self.qualified_names(n.func)
                if any(
                    q.startswith("torch.distributed") or q == "torch.autograd.grad" for q in names
                ):
                    return True
        return False

    def _is_metric(self, scope: cst.CSTNode, aug: cst.AugAssign, total: str) -> bool:
        """`total` is read in a division, an f-string, a print or a logging call."""
        for n in walk(scope, into_scopes=False):
            if not (isinstance(n, cst.Name) and n.value == total) or n is aug.target:
                continue
            for anc in self.facts.ancestors(n):
                if isinstance(anc, cst.BaseStatement):
                    break
                if (
                    isinstance(anc, cst.BinaryOperation)
                    and isinstance(anc.operator, cst.Divide | cst.FloorDivide)
                    and contains(anc.left, n)
                ):
                    return True
                if isinstance(anc, cst.FormattedString):
                    return True
                if isinstance(anc, cst.Call) and not contains(anc.func, n):
                    if isinstance(anc.func, cst.Name) and anc.func.value == "print":
                        return True
                    if method_name(anc) in _LOG_METHODS:
                        return True
        return False


def _loss_operands(value: cst.BaseExpression) -> list[cst.Name]:
    """Candidates for `loss` in `loss`, `loss * n` or `n * loss`."""
    if isinstance(value, cst.Name):
        return [value]
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply):
        return [side for side in (value.left, value.right) if isinstance(side, cst.Name)]
    return []
