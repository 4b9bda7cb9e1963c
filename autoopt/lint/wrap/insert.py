"""`autoopt rewrite --wrap`: insert the one-line runtime call instead of inline fixes.

    model, loader, optimizer = autoopt.optimize(model, loader, optimizer)

goes where the script's optimizer, model and loader all exist, before training starts, with the
script's own names (see `autoopt.lint.wrap.plan` for how they are found). A script whose loop draws batches
from tensors gets `model, optimizer = autoopt.optimize(model, optimizer=optimizer)`; a GAN gets
one call per model/optimizer pair; `device=` repeats where the script puts the model. When the analysis cannot prove where the call belongs, or the
script already does what optimize() would (Accelerate, Hogwild), the file is left alone and the
reason says why. A script that already calls autoopt.optimize() is left alone, so running it
twice inserts nothing the second time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.codemod.visitors import ImportItem

from autoopt.lint.engine.rule import Fix
from autoopt.lint.rewrite.apply import apply_fixes
from autoopt.lint.tree.edits import is_docstring
from autoopt.lint.wrap.plan import Decline, plan_wrap

ALREADY_WRAPPED = "already calls autoopt.optimize()"


@dataclass
class WrapResult:
    """The outcome of `wrap_source`: new text, and what happened (or why nothing did).

    `reason` is the short reason for the run's summary (the declined category, or
    `ALREADY_WRAPPED`); `message` is the file's own line."""

    source: str
    original: str
    message: str
    declined: bool = False
    reason: str = ""
    inserted: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.source != self.original


def wrap_source(source: str, *, path: Path | str | None = None) -> WrapResult:
    """Insert `autoopt.optimize(...)` where the training objects exist (see the module doc).
    `path` locates the local modules the script imports (`from engine import train_one_epoch`),
    which are parsed, never imported. Raises `libcst.ParserSyntaxError` on unparsable code."""
    module = cst.parse_module(source)
    where = Path(path) if path is not None and not str(path).startswith("<") else None
    plan = plan_wrap(module, where)
    if plan is None:
        return WrapResult(source, source, ALREADY_WRAPPED, reason=ALREADY_WRAPPED)
    if isinstance(plan, Decline):
        return WrapResult(
            source, source, f"--wrap declined: {plan.message}", declined=True, reason=plan.reason
        )
    lines = plan.lines()
    statements = [cst.parse_statement(line + "\n") for line in lines]
    replacements: dict[cst.CSTNode, cst.CSTNode | cst.FlattenSentinel] = {
        plan.anchor: cst.FlattenSentinel([plan.anchor, *statements])
    }
    if plan.globals_ and isinstance(plan.scope, cst.FunctionDef):
        declared = f"global {', '.join(plan.globals_)}"
        first = _first_statement(plan.scope)
        ahead = cst.parse_statement(declared + "\n")
        after = statements if first is plan.anchor else []
        replacements[first] = cst.FlattenSentinel([ahead, first, *after])
    fix = Fix(replacements=replacements, add_imports=[ImportItem("autoopt")])
    new = apply_fixes(module, [fix]).code
    shown = [f"global {', '.join(plan.globals_)}"] if plan.globals_ else []
    return WrapResult(new, source, "inserted " + "; ".join(shown + lines), inserted=tuple(lines))


def _first_statement(func: cst.FunctionDef) -> cst.BaseStatement:
    """The first statement of `func` after its docstring (where `global` goes)."""
    body = list(func.body.body) if isinstance(func.body, cst.IndentedBlock) else []
    return body[1] if len(body) > 1 and is_docstring(body[0]) else body[0]


@dataclass
class WrapTally:
    """Counts over a run, for the one-line coverage summary."""

    wrapped: int = 0
    already: int = 0
    declined: Counter[str] = field(default_factory=Counter)

    def add(self, result: WrapResult) -> None:
        if result.declined:
            self.declined[result.reason] += 1
        elif result.reason == ALREADY_WRAPPED:
            self.already += 1
        elif result.changed:
            self.wrapped += 1

    def line(self) -> str:
        """`wrapped 21, declined 4 (already uses Accelerate ×2, Hogwild ×1, ...)`."""
        out = f"wrapped {self.wrapped}"
        if self.already:
            out += f", {self.already} already call autoopt.optimize()"
        total = sum(self.declined.values())
        out += f", declined {total}"
        if total:
            reasons = ", ".join(f"{r} ×{n}" for r, n in self.declined.most_common())
            out += f" ({reasons})"
        return out
