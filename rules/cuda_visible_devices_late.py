"""AO604: `CUDA_VISIBLE_DEVICES` set after CUDA was already initialised."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.tree.edits import block_statement
from autoopt.lint.tree.nodes import before, calls_in, dotted, string_value, top_level_imports, walk

_VAR = "CUDA_VISIBLE_DEVICES"


class CudaVisibleDevicesLate(Rule):
    """
    ## What it does
    Flags `os.environ["CUDA_VISIBLE_DEVICES"] = ...` that runs after the script has already
    touched CUDA: a `torch.cuda.*` call (`is_available()`, `device_count()`, ...), a `.cuda()`
    call, or a tensor/module moved or created on a `"cuda"` device.

    ## Why
    The CUDA runtime reads `CUDA_VISIBLE_DEVICES` once, when it initialises; PyTorch
    initialises it on the first CUDA query (even `torch.cuda.is_available()` counts). A later
    assignment is silently ignored: the job runs on all GPUs, or on GPU 0 while the user meant
    another one (widely read PyTorch tutorials set it after checking `torch.cuda.is_available()`).

    ## When not to
    - Setting it after `import torch` but before any CUDA call is fine: importing torch does
      not initialise CUDA.
    - Setting it from the shell (`CUDA_VISIBLE_DEVICES=0,1 python train.py`) is best; nothing
      in the script is flagged then.

    ## Fix (unsafe)
    Moves the assignment to the top of the script, right after `import os`, when it is a
    module-level statement with a literal value and `import os` comes before the first CUDA
    call; otherwise it is reported only. Unsafe because it changes behaviour on purpose: the
    CUDA calls that ran before it now see only the selected GPUs (`device_count()` changes,
    `cuda:0` becomes the selected device).
    """

    code = "AO604"
    name = "cuda-visible-devices-late"
    message = "CUDA_VISIBLE_DEVICES is set after CUDA was initialised, so it has no effect"
    fix_safety = FixSafety.UNSAFE
    fix_reason = "the CUDA calls before it then see only the selected GPUs (intended, but new)"
    triggers = (_VAR,)

    VALID = [
        Valid(
            """
            import os
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            """
        ),
        Valid(
            """
            import os
            import torch
            os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
            model = Net().cuda()
            """
        ),
        Valid(
            """
            import os
            import torch
            def report():
                print(torch.cuda.device_count())
            os.environ["CUDA_VISIBLE_DEVICES"] = "1"
            report()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import os
            import torch

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            # use the first GPU only
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            print(device)
            """,
            line=6,
            fixed="""
            import os
            # use the first GPU only
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            import torch

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            print(device)
            """,
            unsafe=True,
        ),
        Invalid(
            """
            import os
            import torch
            def main(args):
                x = torch.zeros(3).cuda()
                os.environ["CUDA_VISIBLE_DEVICES"] = args.gpus
            """,
            line=5,
        ),
    ]

    def visit_Assign(self, node: cst.Assign) -> None:
        if not any(self._is_env_var(t.target) for t in node.targets):
            return
        facts = self.context.facts
        scope = facts.enclosing_scope(node)
        touch = self._first_touch(scope, node)
        if touch is None and isinstance(scope, cst.FunctionDef):
            # module-level code that ran before this function was defined (and called)
            touch = self._first_touch(self.context.module, scope)
        if touch is None:
            return
        fix = self._move_fix(node, scope, touch)
        self.report(node, fix=fix)

    def _is_env_var(self, target: cst.BaseExpression) -> bool:
        if not isinstance(target, cst.Subscript) or len(target.slice) != 1:
            return False
        index = target.slice[0].slice
        return (
            isinstance(index, cst.Index)
            and string_value(index.value) == _VAR
            and self.refers_to(target.value, "os.environ")
        )

    def _first_touch(self, scope: cst.CSTNode, limit: cst.CSTNode) -> cst.Call | None:
        """The first call in `scope` (not in nested functions) before `limit` that initialises
        CUDA."""
        for call in calls_in(scope, into_scopes=False):
            if before(self, call, limit) and self._touches_cuda(call):
                return call
        return None

    def _touches_cuda(self, call: cst.Call) -> bool:
        if any(q.startswith("torch.cuda.") for q in self.qualified_names(call.func)):
            return not any(
                q.startswith(("torch.cuda.amp", "torch.cuda.nvtx"))
                for q in self.qualified_names(call.func)
            )
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "cuda":
            return True
        for a in call.args:
            value = string_value(a.value)
            if value is None or not value.startswith("cuda"):
                continue
            if a.keyword is not None and a.keyword.value == "device":
                return True
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "to":
                return True
        return False

    def _move_fix(self, node: cst.Assign, scope: cst.CSTNode, touch: cst.Call) -> Fix | None:
        """Move the statement right after `import os`, if that is simple and early enough."""
        stmt = block_statement(node, self.parent)
        if (
            scope is not self.context.module
            or not isinstance(stmt, cst.SimpleStatementLine)
            or len(stmt.body) != 1
            or any(isinstance(n, cst.Name) for n in walk(node.value))
        ):
            return None
        target = node.targets[0].target
        assert isinstance(target, cst.Subscript)
        root = dotted(target.value)
        os_name = root.split(".")[0] if root else None
        anchor = self._import_of(os_name)
        if anchor is None or not before(self, anchor, touch) or not before(self, anchor, node):
            return None
        comments = [ln for ln in stmt.leading_lines if ln.comment is not None]
        moved = stmt.with_changes(leading_lines=comments)
        return Fix(
            replacements={
                anchor: cst.FlattenSentinel([anchor, moved]),
                stmt: cst.RemoveFromParent(),
            },
            description="move CUDA_VISIBLE_DEVICES to the top, after `import os`",
        )

    def _import_of(self, name: str | None) -> cst.SimpleStatementLine | None:
        """The top-level `import os` line that binds `name`."""
        if name is None:
            return None
        for stmt, alias in top_level_imports(self.context.module):
            bound = alias.asname.name if alias.asname is not None else alias.name
            if dotted(alias.name) == "os" and dotted(bound) == name:
                return stmt
        return None
