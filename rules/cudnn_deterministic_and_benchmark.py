"""AO802: `cudnn.deterministic = True` and `cudnn.benchmark = True` in the same script."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.tree.nodes import before, is_true, nodes_of_type, walk

_DETERMINISTIC = "torch.backends.cudnn.deterministic"
_BENCHMARK = "torch.backends.cudnn.benchmark"
_USE_DETERMINISTIC = "torch.use_deterministic_algorithms"


class CudnnDeterministicAndBenchmark(Rule):
    """
    ## What it does
    Flags a script that asks for determinism (`torch.backends.cudnn.deterministic = True` or
    `torch.use_deterministic_algorithms(True)`) and also turns on
    `torch.backends.cudnn.benchmark = True`.

    ## Why
    The flags pull in opposite directions (as widely read PyTorch tutorials teach). `benchmark` times the candidate
    convolution algorithms at run time and keeps the fastest, so timing noise can pick a
    different algorithm in each run, with different rounding: results are no longer
    bit-reproducible even though every chosen algorithm is deterministic. The script gets
    neither the reproducibility it asked for nor all of the speed. Decide with one switch:
    `autoopt.seed_everything(seed, deterministic=True)` sets both flags consistently.

    ## When not to
    - The two flags set in different branches of one `if` (`if args.deterministic: ... else:
      ...`), or `benchmark = False` next to `deterministic = True` (a widely read PyTorch tutorial's pairing).
    - Values that are not literally `True` (`benchmark = not args.deterministic`).

    ## Fix
    None: which of the two the user wants is a choice (speed or reproducibility).
    """

    code = "AO802"
    name = "cudnn-deterministic-and-benchmark"
    message = "cudnn.benchmark = True undoes cudnn.deterministic = True; choose one"
    fix_reason = "speed or reproducibility is the user's choice"
    triggers = ("deterministic",)
    requires = ("benchmark",)

    VALID = [
        Valid(
            """
            import torch
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
            """
        ),
        Valid(
            """
            import torch
            if args.deterministic:
                torch.backends.cudnn.deterministic = True
            else:
                torch.backends.cudnn.benchmark = True
            """
        ),
        Valid(
            """
            import torch
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = not args.deterministic
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = True
            """,
            line=3,
        ),
        Invalid(
            """
            from torch.backends import cudnn
            import torch
            cudnn.benchmark = True
            torch.use_deterministic_algorithms(True)
            """,
            line=4,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        determinism: list[cst.CSTNode] = []
        benchmark: list[cst.CSTNode] = []
        for n in nodes_of_type(node, (cst.Assign, cst.Call)):
            if type(n) is cst.Assign and is_true(n.value):
                for t in n.targets:
                    if self.refers_to(t.target, _DETERMINISTIC):
                        determinism.append(n)
                    elif self.refers_to(t.target, _BENCHMARK):
                        benchmark.append(n)
            elif (
                type(n) is cst.Call
                and self.is_call_to(n, _USE_DETERMINISTIC)
                and n.args
                and is_true(n.args[0].value)
            ):
                determinism.append(n)
        for b in benchmark:
            for d in determinism:
                if not self._exclusive(b, d):
                    self.report(d if before(self, b, d) else b)
                    return

    def _exclusive(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        """`a` and `b` lie in different branches of one `if`."""
        facts = self.context.facts
        a_branches = {
            (id(anc), "body" if _within(anc.body, a) else "else")
            for anc in facts.ancestors(a)
            if isinstance(anc, cst.If)
        }
        for anc in facts.ancestors(b):
            if not isinstance(anc, cst.If):
                continue
            side = "body" if _within(anc.body, b) else "else"
            if (id(anc), "else" if side == "body" else "body") in a_branches:
                return True
        return False


def _within(outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
    return any(n is inner for n in walk(outer))
