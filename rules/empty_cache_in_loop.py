"""AO404: `torch.cuda.empty_cache()` on every step."""

from __future__ import annotations

import libcst as cst
from libcst.codemod.visitors import ImportItem

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.loops import data_loops
from autoopt.lint.tree.edits import remove_statement, sole_expression_statement
from autoopt.lint.tree.nodes import contains

_EMPTY_CACHE = ("torch.cuda.empty_cache", "torch.cuda.memory.empty_cache")


class EmptyCacheInLoop(Rule):
    """
    ## What it does
    Flags `torch.cuda.empty_cache()` called unconditionally inside a training or evaluation loop.

    ## Why
    `empty_cache()` hands the caching allocator's free blocks back to the driver. It does not
    give the program more memory — freed tensors are already reusable by PyTorch — but the next
    allocations must go back to `cudaMalloc`, which synchronises the device and costs tens to
    hundreds of microseconds each. Called every step it turns a warm allocator cold and can slow
    training by several percent to 2x on allocation-heavy models (as widely read PyTorch tutorials teach).

    ## When not to
    - Once after training, or between phases: fine, and outside any loop; also once per epoch
      (in the loop around the batch loop).
    - Under a condition inside the loop (every N steps, after an evaluation pass) or in an
      `except`/`finally` handler recovering from an out-of-memory error: deliberate, not flagged.

    ## Fix (unsafe)
    Removes the statement (and an import it leaves unused). Unsafe because a script that shares
    the GPU with other processes, or that relies on `nvidia-smi`'s reserved-memory figure, may
    depend on memory being returned to the driver.
    """

    code = "AO404"
    name = "empty-cache-in-loop"
    message = "torch.cuda.empty_cache() in the loop forces slow cudaMalloc calls every step"
    fix_safety = FixSafety.UNSAFE
    fix_reason = "other processes sharing the GPU may rely on the memory being handed back"
    triggers = ("empty_cache",)

    VALID = [
        Valid(  # once per epoch, in the loop around the batch loop
            """
            import torch
            for epoch in range(10):
                for x, y in loader:
                    loss_fn(model(x.cuda()), y.cuda()).backward()
                    opt.step()
                torch.cuda.empty_cache()
            """
        ),
        Valid(  # once after training
            """
            import torch
            for x in loader:
                model(x).sum().backward()
            torch.cuda.empty_cache()
            """
        ),
        Valid(  # every N steps
            """
            import torch
            for i, x in enumerate(loader):
                model(x).sum().backward()
                if i % 1000 == 0:
                    torch.cuda.empty_cache()
            """
        ),
        Valid(  # OOM recovery
            """
            import torch
            for x in loader:
                try:
                    model(x).sum().backward()
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
            """
        ),
        Valid(  # not torch's
            """
            from cache import empty_cache
            for x in loader:
                model(x).sum().backward()
                empty_cache()
            """
        ),
    ]
    INVALID = [
        Invalid(  # an evaluation every 100 steps inside the training loop (MusicTransformer)
            """
            import torch
            for e in range(10):
                for b in range(steps):
                    model(batch()).sum().backward()
                    opt.step()
                    if b % 100 == 0:
                        model.eval()
                        for x, y in val_loader:
                            evaluate(model(x), y)
                        model.train()
                    torch.cuda.empty_cache()
            """,
            line=11,
            fixed="""
            import torch
            for e in range(10):
                for b in range(steps):
                    model(batch()).sum().backward()
                    opt.step()
                    if b % 100 == 0:
                        model.eval()
                        for x, y in val_loader:
                            evaluate(model(x), y)
                        model.train()
            """,
            unsafe=True,
        ),
        Invalid(
            """
            import torch
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                torch.cuda.empty_cache()  # free memory
                print(loss.item())
            """,
            line=6,
            fixed="""
            import torch
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                print(loss.item())
            """,
            unsafe=True,
        ),
        Invalid(
            """
            from torch.cuda import empty_cache
            def evaluate(model, loader):
                model.eval()
                for x in loader:
                    out = model(x)
                    empty_cache()
            """,
            line=6,
            fixed="""
            def evaluate(model, loader):
                model.eval()
                for x in loader:
                    out = model(x)
            """,
            unsafe=True,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, *_EMPTY_CACHE):
            return
        loops = self.facts.enclosing_loops(node)
        if not loops or not any(
            self.facts.is_training_loop(loop) or self.facts.is_eval_loop(loop) for loop in loops
        ):
            return
        if self._conditional_within(node, loops[0]):
            return
        if any(
            inner is not loops[0]
            and contains(loops[0], inner)
            and not self._conditional_within(inner, loops[0])
            for inner in data_loops(self)
        ):
            # once per epoch: the loop it is in runs a batch loop each time (not one under an
            # `if`, MusicTransformer's evaluation every 100 steps inside its training loop)
            return
        line = sole_expression_statement(node, self.parent)
        if line is None or not isinstance(self.parent(line), cst.IndentedBlock):
            self.report(node)
            return
        imports = (
            (ImportItem("torch.cuda", "empty_cache"),) if isinstance(node.func, cst.Name) else ()
        )
        self.report(
            node,
            fix=Fix(
                replacements={line: remove_statement(line, self.parent)},
                description="remove torch.cuda.empty_cache()",
                remove_imports=imports,
            ),
        )

    def _conditional_within(self, node: cst.CSTNode, loop: cst.CSTNode) -> bool:
        """Under an `if`, `try` handler or `finally` between the call and its loop."""
        for anc in self.facts.ancestors(node):
            if anc is loop:
                return False
            if isinstance(anc, cst.If | cst.ExceptHandler | cst.Finally | cst.IfExp):
                return True
        return False
