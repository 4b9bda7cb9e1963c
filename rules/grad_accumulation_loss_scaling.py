"""AO405: gradient accumulation that sums, rather than averages, the micro-batch gradients."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import FixSafety, Invalid, Rule, Valid
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.nodes import (
    calls_in,
    code_of,
    dotted,
    is_name,
    method_name,
    names_in,
    string_value,
    walk,
)


class GradAccumulationLossScaling(Rule):
    """
    ## What it does
    Flags a gradient-accumulation loop — `backward()` on every iteration, the optimizer stepped
    only under an `if (i + 1) % N == 0:`-style condition, or `for _ in range(N): ...
    loss.backward()` followed by one optimizer step — whose loss is not divided by the number
    of accumulated micro-batches.

    ## Why
    `backward()` adds into `.grad`. Accumulating N micro-batches of a mean-reduced loss gives N
    times the gradient of one big batch of the same total size, so the step is N times larger
    than the learning rate was tuned for (and gradient clipping thresholds mean something else).
    Dividing the loss (`(loss / N).backward()`) makes N micro-batches equal one large batch
    (as a widely read PyTorch tutorial teaches).

    ## When not to
    - Losses with `reduction="sum"`: their gradient already grows with the number of samples,
      and summing micro-batches reproduces the big-batch sum exactly. Dividing would change the
      effective learning rate, so such losses are not flagged (our choice: the rule checks the
      `reduction=` of the criterion the loss comes from, in the call or where the criterion is
      built).
    - A loss computed by a helper function in the file that divides: treated as divided.
    - Gradients divided before the step instead (`p.grad.div_(n)`, `p.grad /= n`, as
      mistral-finetune does after its micro-batches): the same thing, not flagged.
    - Framework-managed accumulation (`accelerator.backward(loss)`, DeepSpeed's `engine.backward`):
      they scale the loss themselves; calls passing the loss as an argument are not flagged.

    ## Fix
    None (report only): the learning rate of an existing script was tuned against its current
    gradient scale, so dividing the loss is a training change for the user to make.
    """

    code = "AO405"
    name = "grad-accumulation-loss-scaling"
    message = "gradients are accumulated over several backward() calls but the loss is not divided"
    fix_safety = FixSafety.NONE
    fix_reason = "dividing changes the effective learning rate the script was tuned with"
    triggers = ("%", "range(")
    requires = (".backward(",)

    VALID = [
        Valid(  # the gradients are divided instead of the loss (mistral-finetune)
            """
            for batch in loader:
                for i in range(num_microbatches):
                    loss = model(batch[i]).mean()
                    loss.backward()
                for p in model.parameters():
                    p.grad.div_(num_microbatches)
                optimizer.step()
                optimizer.zero_grad()
            """
        ),
        Valid(  # a loop over tasks (a meta-batch) is the algorithm's sum, not micro-batches
            """
            for epoch in range(epochs):
                for batch in loader:
                    for task in split_tasks(batch):
                        loss = inner_adapt(model, task)
                        loss.backward()
                    meta_optimizer.step()
                    meta_optimizer.zero_grad()
            """
        ),
        Valid(  # no optimizer stepped after the inner loop: its steps are not accumulated here
            """
            for epoch in range(epochs):
                for _ in range(steps_per_epoch):
                    loss = model(next(batches))
                    loss.backward()
                    apply_update(model)
            """
        ),
        Valid(  # micro-batches divided; a critic that steps inside its own loop accumulates none
            """
            for i in range(num_batches):
                for __ in range(GRADIENT_ACCUMULATE_EVERY):
                    loss = model(next(train_loader))
                    (loss / GRADIENT_ACCUMULATE_EVERY).backward()
                optim.step()
                optim.zero_grad()
                for _ in range(n_critic):
                    d_loss = critic(fake) - critic(real)
                    d_loss.backward()
                    d_optim.step()
                g_optim.step()
            """
        ),
        Valid(
            """
            for i, (x, y) in enumerate(loader):
                loss = criterion(model(x), y) / accum_steps
                loss.backward()
                if (i + 1) % accum_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """
        ),
        Valid(  # reduction="sum": no division wanted
            """
            import torch.nn as nn
            criterion = nn.CrossEntropyLoss(reduction="sum")
            for i, (x, y) in enumerate(loader):
                loss = criterion(model(x), y)
                loss.backward()
                if (i + 1) % 4 == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """
        ),
        Valid(  # mcan-vqa: the sum-reduced criterion placed on the GPU where it is built
            """
            import torch
            loss_fn = torch.nn.BCELoss(reduction="sum").cuda()
            for x, y in loader:
                optimizer.zero_grad()
                for accu_step in range(accu_steps):
                    loss = loss_fn(model(x[accu_step::accu_steps]), y[accu_step::accu_steps])
                    loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # steps every iteration: no accumulation
            """
            for i, (x, y) in enumerate(loader):
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                if i % 100 == 0:
                    print(loss.item())
            """
        ),
        Valid(  # divided in place, scaled backward
            """
            for step, batch in enumerate(loader):
                loss = model(**batch).loss
                loss /= args.grad_accum
                scaler.scale(loss).backward()
                if step % args.grad_accum == 0:
                    scaler.step(optimizer)
                    scaler.update()
            """
        ),
        Valid(  # accelerate scales the loss itself
            """
            for step, batch in enumerate(loader):
                loss = model(**batch).loss
                accelerator.backward(loss)
                if step % 8 == 0:
                    optimizer.step()
            """
        ),
    ]
    INVALID = [
        Invalid(  # micro-batches in a loop of their own, one step after it (lucidrains' PaLM)
            """
            for i in range(num_batches):
                for __ in range(GRADIENT_ACCUMULATE_EVERY):
                    loss = model(next(train_loader))
                    loss.backward()
                optim.step()
                optim.zero_grad()
            """,
            line=4,
            message_contains="GRADIENT_ACCUMULATE_EVERY",
        ),
        Invalid(  # the loss computed in the backward call itself (same verdict once named)
            """
            import torch
            for i, x in enumerate(loader):
                (model(x).pow(2).mean()).backward()
                if (i + 1) % 2 == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """,
            line=3,
        ),
        Invalid(
            """
            accumulation_steps = 4
            for i, (inputs, labels) in enumerate(train_loader):
                outputs = model(inputs)
                loss = criterion(outputs, labels)
                loss.backward()
                if (i + 1) % accumulation_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """,
            line=5,
            message_contains="accumulation_steps",
        ),
        Invalid(
            """
            import torch.nn.functional as F
            for step, (x, y) in enumerate(loader):
                loss = F.cross_entropy(model(x), y)
                scaler.scale(loss).backward()
                if step % 8 == 7:
                    scaler.step(opt)
                    scaler.update()
                    opt.zero_grad(set_to_none=True)
            """,
            line=4,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        for call in self.facts.backward_calls:
            loop = self.facts.training_loop_of(call)
            if loop is None or call.args and call.args[0].keyword is None:
                continue  # `accelerator.backward(loss)`: the framework scales
            if self._conditional_within(call, loop):
                continue
            every = self._step_interval(loop)
            if every is None:
                every = self._micro_batch_count(call, loop)
            if every is None:
                continue
            assert isinstance(call.func, cst.Attribute)
            loss = _unscaled(call.func.value)
            if self._divided(loop, loss) or self._gradients_divided(loop):
                continue
            self.report(call, f"{self.message} by the {code_of(every)} accumulated steps")

    def _conditional_within(self, node: cst.CSTNode, loop: cst.CSTNode) -> bool:
        for anc in self.facts.ancestors(node):
            if anc is loop:
                return False
            if isinstance(anc, cst.If):
                return True
        return False

    def _step_interval(self, loop: cst.CSTNode) -> cst.BaseExpression | None:
        """N when an optimizer `step` in `loop` runs under an `if ... % N ...` condition, and no
        other optimizer steps on every iteration (a GAN whose critic steps each iteration and
        whose generator steps every N: which loss feeds which step is not known, so silent)."""
        steps = _optimizer_steps(loop)
        if any(not self._conditional_within(n, loop) for n in steps):
            return None
        for n in steps:
            for anc in self.facts.ancestors(n):
                if anc is loop:
                    break
                if isinstance(anc, cst.If):
                    for op in walk(anc.test):
                        if isinstance(op, cst.BinaryOperation) and isinstance(
                            op.operator, cst.Modulo
                        ):
                            return op.right
        return None

    def _micro_batch_count(self, call: cst.Call, loop: cst.CSTNode) -> cst.BaseExpression | None:
        """N for `for _ in range(N): ... loss.backward()` with no optimizer step of its own,
        right inside a loop that steps after it (lucidrains' `GRADIENT_ACCUMULATE_EVERY`)."""
        loops = self.facts.enclosing_loops(call)
        if len(loops) < 2 or loops[0] is not loop or not isinstance(loop, cst.For):
            return None
        it = loop.iter
        if not (isinstance(it, cst.Call) and is_name(it.func, "range") and len(it.args) == 1):
            return None
        if _optimizer_steps(loop):
            return None
        outer = loops[1]
        if not any(self.facts.enclosing_loops(n)[0] is outer for n in _optimizer_steps(outer)):
            return None
        return it.args[0].value

    def _divided(self, loop: cst.CSTNode, loss: cst.BaseExpression) -> bool:
        if _has_division(loss):
            return True
        if isinstance(loss, cst.Call):  # computed in place: judged as an assigned value would be
            return self._sum_reduced(loss) or self._helper_divides(loss)
        if not isinstance(loss, cst.Name):
            return True  # an expression of other names we cannot follow: do not guess
        name = loss.value
        for n in walk(loop, into_scopes=False):
            if (
                isinstance(n, cst.AugAssign)
                and is_name(n.target, name)
                and isinstance(n.operator, cst.DivideAssign | cst.MultiplyAssign)
            ):
                return True
            if isinstance(n, cst.Assign) and any(name in names_in(t.target) for t in n.targets):
                if _has_division(n.value) or self._sum_reduced(n.value):
                    return True
                if self._helper_divides(n.value):
                    return True
        return False

    def _gradients_divided(self, loop: cst.CSTNode) -> bool:
        """The function running `loop` divides the accumulated gradients before the step
        (`p.grad.div_(n)`, `p.grad /= n`: mistral-finetune), which equals dividing the loss."""
        for n in walk(self.facts.enclosing_scope(loop)):
            if (
                isinstance(n, cst.Call)
                and isinstance(n.func, cst.Attribute)
                and n.func.attr.value in ("div_", "mul_")
                and _is_gradient(n.func.value)
            ) or (
                isinstance(n, cst.AugAssign)
                and isinstance(n.operator, cst.DivideAssign | cst.MultiplyAssign)
                and _is_gradient(n.target)
            ):
                return True
        return False

    def _sum_reduced(self, value: cst.BaseExpression) -> bool:
        """The loss comes from a criterion built (or called) with `reduction="sum"`."""
        for call in (n for n in walk(value) if isinstance(n, cst.Call)):
            if _reduction_sum(call):
                return True
            if isinstance(call.func, cst.Name):
                built = self._assigned_call(call.func.value)
                # `nn.BCELoss(reduction="sum").cuda()` (mcan-vqa): the criterion under its
                # placement
                while (
                    built is not None
                    and not _reduction_sum(built)
                    and isinstance(built.func, cst.Attribute)
                    and built.func.attr.value in ("cuda", "to")
                    and isinstance(built.func.value, cst.Call)
                ):
                    built = built.func.value
                if built is not None and _reduction_sum(built):
                    return True
        return False

    def _helper_divides(self, value: cst.BaseExpression) -> bool:
        names = {
            c.func.value
            for c in walk(value)
            if isinstance(c, cst.Call) and isinstance(c.func, cst.Name)
        }
        for n in walk(self.context.module):
            if isinstance(n, cst.FunctionDef) and n.name.value in names and _has_division(n):
                return True
        return False

    def _assigned_call(self, name: str) -> cst.Call | None:
        for n in walk(self.context.module):
            if (
                isinstance(n, cst.Assign)
                and isinstance(n.value, cst.Call)
                and any(is_name(t.target, name) for t in n.targets)
            ):
                return n.value
        return None


def _is_gradient(expr: cst.BaseExpression) -> bool:
    """`p.grad`, `p.grad.data`."""
    name = dotted(expr) or ""
    return name.endswith((".grad", ".grad.data"))


def _optimizer_steps(loop: cst.CSTNode) -> list[cst.Call]:
    """`x.step()` calls in `loop` on anything but a scheduler."""
    return [
        n
        for n in calls_in(loop, into_scopes=False)
        if method_name(n) == "step"
        and isinstance(n.func, cst.Attribute)
        and "sched" not in code_of(n.func.value).lower()
    ]


def _unscaled(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`scaler.scale(loss)` -> `loss`."""
    if isinstance(expr, cst.Call) and method_name(expr) == "scale" and expr.args:
        return expr.args[0].value
    return expr


def _has_division(node: cst.CSTNode) -> bool:
    return any(
        (isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Divide))
        or (isinstance(n, cst.AugAssign) and isinstance(n.operator, cst.DivideAssign))
        for n in walk(node)
    )


def _reduction_sum(call: cst.Call) -> bool:
    reduction = arg(call, "reduction")
    return reduction is not None and string_value(reduction.value) == "sum"
