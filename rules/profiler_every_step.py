"""AO701: a profiler left recording every training step."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.tree.calls import arg, has_star_kwargs
from autoopt.lint.tree.nodes import walk

_PROFILE = (
    "torch.profiler.profile",
    "torch.profiler.profiler.profile",
    "torch.autograd.profiler.profile",
)
_BOUNDED_RANGE = 100  # a loop of at most this many literal steps is a deliberate short run


class ProfilerEveryStep(Rule):
    """
    ## What it does
    Flags `torch.profiler.profile(...)` (or `torch.autograd.profiler.profile(...)`) that is
    opened inside the training loop, or that wraps a training loop without a `schedule=`.

    ## Why
    A profiler that records every step adds per-operator bookkeeping (often 10–50% slower
    steps, far more with `record_shapes`/`with_stack`/`profile_memory`) and builds a trace
    that grows with every step until memory runs out or the export takes minutes (a widely read PyTorch tutorial
    profiles for insight, not for production runs). `torch.profiler.schedule(wait=...,
    warmup=..., active=..., repeat=...)` with `prof.step()` records only a few steps;
    `autoopt.optimize(..., profile=True)` does that for you.

    ## When not to
    - A profiler with `schedule=` around the loop (options behind `**kwargs` are not
      guessed).
    - A deliberately short run: the loop inside is `range(N)` with a literal `N <= 100`, or it
      `break`s out; or the profiler is opened under a condition inside the loop
      (`if step == 100:`), which profiles one step on purpose.
    - Profilers around evaluation or benchmark loops (no `backward()`), and a user's own
      `profile`.

    ## Fix
    None: choosing which steps to record is the user's call.
    """

    code = "AO701"
    name = "profiler-every-step"
    message = "profiler records every training step; use schedule=torch.profiler.schedule(...)"
    fix_reason = "which steps to record is a choice for the user"
    triggers = ("profile",)
    requires = (".backward(",)

    VALID = [
        Valid(
            """
            import torch
            from torch.profiler import profile, schedule
            with profile(schedule=schedule(wait=1, warmup=1, active=3)) as prof:
                for x in loader:
                    model(x).sum().backward()
                    prof.step()
            """
        ),
        Valid(
            """
            import torch
            with torch.profiler.profile() as prof:
                for step in range(10):
                    model(x).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            for step, x in enumerate(loader):
                if step == 100:
                    with torch.profiler.profile() as prof:
                        model(x).sum().backward()
                else:
                    model(x).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            model.eval()
            with torch.profiler.profile() as prof:
                for x in loader:
                    model(x)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch.profiler as tp
            with tp.profile(record_shapes=True) as prof:
                for epoch in range(epochs):
                    for x in loader:
                        model(x).sum().backward()
            """,
            line=2,
        ),
        Invalid(
            """
            from torch.autograd import profiler
            for x in loader:
                with profiler.profile() as prof:
                    loss = model(x).sum()
                    loss.backward()
            """,
            line=3,
            message_contains="inside the training loop",
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, *_PROFILE):
            return
        facts = self.context.facts
        loop = facts.training_loop_of(node)
        if loop is not None:
            if not self._conditional(node, loop):
                self.report(
                    node,
                    "profiler opened inside the training loop: it re-starts every step; open it "
                    "once around the loop with schedule=torch.profiler.schedule(...)",
                )
            return
        if arg(node, "schedule") is not None or has_star_kwargs(node):
            return
        with_node = self.parent(self.parent(node) or node)
        if not isinstance(with_node, cst.With):
            return
        loops = [
            n
            for n in walk(with_node.body, into_scopes=False)
            if isinstance(n, cst.For | cst.While) and facts.is_training_loop(n)
        ]
        if loops and not any(_bounded(lp) for lp in loops):
            self.report(node)

    def _conditional(self, node: cst.Call, loop: cst.CSTNode) -> bool:
        """Opened under an `if` inside the loop (profiling chosen steps on purpose)."""
        for anc in self.context.facts.ancestors(node):
            if anc is loop:
                return False
            if isinstance(anc, cst.If):
                return True
        return False


def _bounded(loop: cst.For | cst.While) -> bool:
    """A short run by construction: `range(<small literal>)` or a `break` in the loop."""
    if isinstance(loop, cst.For) and isinstance(loop.iter, cst.Call):
        func = loop.iter.func
        args = loop.iter.args
        if isinstance(func, cst.Name) and func.value == "range" and len(args) == 1:
            value = args[0].value
            if isinstance(value, cst.Integer) and int(value.value) <= _BOUNDED_RANGE:
                return True
    return any(isinstance(n, cst.Break) for n in walk(loop.body, into_scopes=False))
