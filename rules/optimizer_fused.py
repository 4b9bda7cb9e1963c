"""AO605: an Adam/AdamW/SGD optimizer on CUDA that steps without the fused kernel."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.torch_api import FUSED_OPTIMIZERS
from autoopt.lint.tree.calls import call_options, with_keyword
from autoopt.lint.tree.nodes import is_true

_CPU_FUSED = (2, 4)  # fused Adam/AdamW/SGD also run on CPU since torch 2.4


class OptimizerFused(Rule):
    """
    ## What it does
    Flags `torch.optim.Adam`, `AdamW` and `SGD` built without `fused=` or `foreach=` in a
    training script that runs on CUDA, in a trainer class whose step method runs `backward()`
    (SR3's `optimize_parameters`), or in the project's optimizer factory that such a program
    calls: `autoopt lint train.py` also checks the module of `build_optimizer(config, model)`
    for this rule (Swin's optimizer.py), reporting the factories the project calls, not the
    others of that module.

    ## Why is this bad?
    Without either flag torch picks the `foreach` step on CUDA: a few kernels per parameter
    group and per operation. `fused=True` does the whole update (moments, bias correction,
    weight decay, the parameter write) in one kernel per group, which PyTorch's tuning guide
    recommends; on CPU (torch 2.4+) it is also several times faster than the default loop.
    This is a hint: `autoopt.optimize()` picks the fastest step at run time.

    ## Example
    `optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)` with the model on CUDA.

    ## Use instead
    `optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)`

    ## Fix safety
    Unsafe: the fused kernel needs every parameter to be a floating-point tensor on CUDA (or,
    since torch 2.4, the CPU) and rounds in another order; an optimizer over parameters
    elsewhere fails at its first step. For code targeting torch before 2.4 the rule reports
    without a fix (a CPU run would fail).

    ## When not to
    - `fused=` or `foreach=` given, either way, or hidden in `**kwargs`; `differentiable=True`
      (no fused kernel).
    - Scripts without CUDA: not flagged (the runtime still picks the fused step on CPU).
    """

    code = "AO605"
    name = "optimizer-fused"
    message = "optimizer on CUDA without fused=True; the fused step is one kernel per group"
    fix_safety = FixSafety.UNSAFE
    fix_reason = "every parameter must be a float tensor on CUDA (or CPU, torch 2.4+)"
    covered_by_optimize = True  # the backends pass picks fused, else foreach
    triggers = ("Adam", "SGD")
    # no text requirement: an optimizer factory module names neither CUDA nor backward (the
    # program model says whether a CUDA training program uses it)

    VALID = [
        Valid(
            """
            import torch
            model = Net().cuda()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
            for x in loader:
                model(x.cuda()).sum().backward()
            """
        ),
        Valid(  # options hidden in **kwargs; an explicit foreach=False
            """
            import torch
            model = Net().cuda()
            opt = torch.optim.Adam(model.parameters(), **opt_kwargs)
            sgd = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
            for x in loader:
                model(x.cuda()).sum().backward()
            """
        ),
        Valid(  # CPU only
            """
            import torch
            opt = torch.optim.AdamW(model.parameters())
            for x in loader:
                model(x).sum().backward()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            device = "cuda"
            model = Net().to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
            for x in loader:
                model(x.to(device)).sum().backward()
            """,
            line=4,
            fixed="""
            import torch
            device = "cuda"
            model = Net().to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
            for x in loader:
                model(x.to(device)).sum().backward()
            """,
            unsafe=True,
        ),
        Invalid(  # before torch 2.4 fused needs CUDA parameters: report only
            """
            from torch.optim import SGD
            model = Net().cuda()
            opt = SGD(model.parameters(), 0.1, 0.9)
            for x in loader:
                model(x.cuda()).sum().backward()
            """,
            line=3,
            target_version="2.3",
            message_contains="fused",
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, *FUSED_OPTIMIZERS):
            return
        facts = self.facts
        program = self.context.program
        # a trainer class whose step method runs backward() counts (SR3's `optimize_parameters`)
        trains_here = (facts.trains or bool(facts.backward_calls)) and program.runs_on_cuda
        if not trains_here and not program.serves_cuda_training:  # not an optimizer factory
            return
        if not trains_here and not program.called_by_the_project(node):
            return  # a factory of the module no code calls (LoRA's `create_sgd_optimizer`)
        options = call_options(self, node, positions={})
        if not options.complete or {"fused", "foreach"} & set(options.values):
            return
        if is_true(options.values.get("differentiable")):
            return
        version = self.context.target_version
        if version is not None and version < _CPU_FUSED:
            self.report(node)
            return
        new = with_keyword(node, "fused", cst.Name("True"))
        self.report(node, fix=Fix(replacements={node: new}, description="fused=True"))
