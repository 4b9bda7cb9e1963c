"""AO504: DDP gradient accumulation that all-reduces on every micro-step."""

from __future__ import annotations

import libcst as cst
from libcst.codemod.visitors import ImportItem

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.loops import accumulation_gate, accumulation_skip
from autoopt.lint.program.torch_api import DDP
from autoopt.lint.tree.edits import wrap_in_with
from autoopt.lint.tree.nodes import (
    assignments,
    calls_in,
    code_of,
    contains,
    dotted,
    names_in,
    nodes_of_type,
)


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

    The DDP model may be wrapped at the top of the file, in the loop's own function
    (`model = DDP(model, ...)` inside `main()`), as an attribute (`self.model = DDP(...)`), or
    handed to the loop's function as a parameter of the same name (SLIP's `train(train_loader,
    model, ...)`). The step may also follow `if (i + 1) % N != 0: continue` (reported without
    a fix).

    ## When not to
    - The loop already uses `no_sync()` (anywhere in the file), or steps every iteration.
    - A loop over another model of the same name, in a function the DDP model is not made in
      nor handed to.
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
        Valid(  # the DDP model is another function's; this loop trains a plain one
            """
            import torch

            def distributed(net):
                model = torch.nn.parallel.DistributedDataParallel(net)
                return model

            def local(loader, net, opt):
                model = net.cuda()
                for i, x in enumerate(loader):
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
        Invalid(  # wrapped in a function, skipped micro-steps by `continue` (SLIP): report only
            """
            import torch

            def train(loader, model, optimizer, args):
                for i, x in enumerate(loader):
                    model(x).sum().backward()
                    if (i + 1) % args.update_freq != 0:
                        continue
                    optimizer.step()
                    optimizer.zero_grad()

            def main(args):
                model = torch.nn.parallel.DistributedDataParallel(Net().cuda())
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                train(loader, model, optimizer, args)
            """,
            line=5,
        ),
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
        # `model = DDP(model, ...)` at the top, in the loop's own function (`main()`), or as
        # an attribute (`self.model = DDP(...)` in a trainer's `__init__`)
        wrapped = [
            (assign, name)
            for assign in nodes_of_type(node, cst.Assign)
            if self.is_call_to(assign.value, *DDP)
            for target in assign.targets
            if (name := dotted(target.target)) is not None
        ]
        if not wrapped:
            return
        for loop in self.facts.training_loops:
            if not isinstance(loop.body, cst.IndentedBlock):
                continue
            scope = self.facts.enclosing_scope(loop)
            params = (
                {p.name.value for p in scope.params.params}
                if isinstance(scope, cst.FunctionDef)
                else set()
            )
            models = {
                name
                for assign, name in wrapped
                if name.startswith("self.")
                or name in params  # SLIP's `train(train_loader, model, ...)`, handed the DDP model
                or self.facts.enclosing_scope(assign) in (scope, self.context.module)
            }
            if not models:
                continue
            body = list(loop.body.body)
            gate = next((s for s in body if accumulation_gate(s) is not None), None)
            # `if (i + 1) % N != 0: continue` before the step: the same accumulation (no
            # fix: the micro-steps' statements are not one block before a gate)
            skip = next(
                (s for at, s in enumerate(body) if accumulation_skip(s, body[at + 1 :])),
                None,
            )
            if gate is None and skip is None:
                continue
            for call in self.facts.backward_calls:
                if (
                    contains(loop, call)
                    and not contains(gate or skip, call)
                    and self.facts.training_loop_of(call) is loop
                ):
                    fix = self._fix(body, gate, call, models) if gate is not None else None
                    self.report(call, fix=fix)

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
