"""AO504: DDP gradient accumulation that all-reduces on every micro-step."""

from __future__ import annotations

import libcst as cst
from libcst.codemod.visitors import ImportItem

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.loops import accumulation_gate
from autoopt.lint.program.torch_api import DDP
from autoopt.lint.tree.edits import wrap_in_with
from autoopt.lint.tree.nodes import assignments, calls_in, code_of, contains, dotted, names_in


class DdpAccumulationNoSync(Rule):
    """
    ## What it does
    Flags a training loop over a `DistributedDataParallel` model that accumulates gradients by
    hand (`optimizer.step()` under `if (i + 1) % N == 0:`) and never calls `model.no_sync()`.

    ## Why is this bad?
    DDP all-reduces every gradient at the end of every `backward()`. With accumulation only the
    last micro-step's gradients are needed across ranks, so N-1 of every N all-reduces move the
    whole model over the network for nothing. `no_sync()` keeps those micro-steps local; the
    next synchronised backward all-reduces the accumulated sum. `autoopt.optimize(...,
    accumulate=N)` does this for you.

    ## Example
    `loss = model(x).sum() / N; loss.backward()` then `if (i + 1) % N == 0: opt.step()`.

    ## Use instead
    `with (model.no_sync() if (i + 1) % N != 0 else contextlib.nullcontext()):` around the
    forward and the backward (DDP decides in the forward whether the backward syncs, so wrapping
    the backward alone does nothing).

    ## Fix safety
    Unsafe: after the last micro-step the gradients are equal up to rounding order, but between
    micro-steps `.grad` holds this rank's local sum, not the average over ranks (code that reads
    it there sees other numbers). Offered only when the forward (a call of the DDP model) and
    the backward are statements of the loop body just before the `if ... % N == 0` block.

    ## When not to
    - The loop already uses `no_sync()` (anywhere in the file), or steps every iteration.
    """

    code = "AO504"
    name = "ddp-accumulation-no-sync"
    message = "DDP all-reduces gradients on every accumulation micro-step; use model.no_sync()"
    fix_safety = FixSafety.UNSAFE
    fix_reason = "between micro-steps .grad holds the rank-local sum instead of the global mean"
    triggers = ("DistributedDataParallel", "DDP")
    requires = (".backward(", "%")

    VALID = [
        Valid(
            """
            import contextlib
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            for i, x in enumerate(loader):
                ctx = model.no_sync() if (i + 1) % 4 != 0 else contextlib.nullcontext()
                with ctx:
                    model(x).sum().backward()
                if (i + 1) % 4 == 0:
                    opt.step()
            """
        ),
        Valid(  # no DDP: nothing to synchronise
            """
            for i, x in enumerate(loader):
                model(x).sum().backward()
                if (i + 1) % 4 == 0:
                    opt.step()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[rank])
            for step, (x, y) in enumerate(loader):
                out = model(x)
                loss = loss_fn(out, y) / accum
                loss.backward()
                if (step + 1) % accum == 0:
                    opt.step()
                    opt.zero_grad()
            """,
            line=6,
            fixed="""
            import torch
            import contextlib

            model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[rank])
            for step, (x, y) in enumerate(loader):
                with (model.no_sync() if (step + 1) % accum != 0 else contextlib.nullcontext()):
                    out = model(x)
                    loss = loss_fn(out, y) / accum
                    loss.backward()
                if (step + 1) % accum == 0:
                    opt.step()
                    opt.zero_grad()
            """,
            unsafe=True,
        ),
        Invalid(  # the forward is in another function: report only
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            for i, x in enumerate(loader):
                compute(model, x).backward()
                if i % 8 == 0:
                    scheduler.step()
                if i % 2 == 0:
                    opt.step()
            """,
            line=4,
            message_contains="no_sync",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        if "no_sync" in self.context.source:
            return
        models = {t for t, value, _ in assignments(node) if self.is_call_to(value, *DDP)}
        if not models:
            return
        for loop in self.facts.training_loops:
            if not isinstance(loop.body, cst.IndentedBlock):
                continue
            body = list(loop.body.body)
            gate = next((s for s in body if accumulation_gate(s) is not None), None)
            if gate is None:
                continue
            for call in self.facts.backward_calls:
                if (
                    contains(loop, call)
                    and not contains(gate, call)
                    and self.facts.training_loop_of(call) is loop
                ):
                    self.report(call, fix=self._fix(body, gate, call, models))

    def _fix(
        self, body: list[cst.BaseStatement], gate: cst.If, backward: cst.Call, models: set[str]
    ) -> Fix | None:
        """Wrap the loop-body statements from the DDP forward to the backward in `no_sync()`,
        when they are simple statements right before the gate that do not change its test."""
        last = next((i for i, s in enumerate(body) if contains(s, backward)), None)
        if last is None or body.index(gate) != last + 1:
            return None
        forwards = [
            (i, dotted(c.func))
            for i, s in enumerate(body[: last + 1])
            for c in calls_in(s)
            if dotted(c.func) in models
        ]
        if not forwards:
            return None
        first, model = forwards[0]
        wrapped = body[first : last + 1]
        modulo = accumulation_gate(gate)
        assert modulo is not None
        written = {t for s in wrapped for t, _, _ in assignments(s)}
        if names_in(modulo) & written or not all(
            isinstance(s, cst.SimpleStatementLine) for s in wrapped
        ):
            return None
        header = f"({model}.no_sync() if {code_of(modulo)} != 0 else contextlib.nullcontext())"
        return Fix(
            replacements=wrap_in_with(wrapped, header),
            description="no_sync() on the non-final micro-steps",
            add_imports=(ImportItem("contextlib"),),
        )
