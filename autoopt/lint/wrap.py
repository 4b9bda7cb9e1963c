"""`autoopt rewrite --wrap`: insert the one-line runtime call instead of inline fixes.

    model, loader, optimizer = autoopt.optimize(model, loader, optimizer)

goes right after the optimizer is created, with the script's own names: the optimizer is the
`torch.optim.*` object the training loop steps, the model is what its `.parameters()` come from,
and the loader is the `DataLoader` the training loop iterates. When the three cannot be told
apart with confidence the file is left alone and the reason says why. Running it twice inserts
nothing the second time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import ImportItem
from libcst.metadata import MetadataWrapper, ParentNodeProvider, QualifiedNameProvider
from libcst.metadata.base_provider import LazyValue

from autoopt.lint import metadata
from autoopt.lint.edits import block_statement
from autoopt.lint.facts import FileFacts
from autoopt.lint.nodes import code_of, walk
from autoopt.lint.rewrite import apply_fixes
from autoopt.lint.rule import Fix
from autoopt.lint.torch_api import DATALOADER

_OPTIMIZE = {"autoopt.optimize", "autoopt.runtime.optimize", "autoopt.runtime.optimize.optimize"}
# Calls a loop may wrap its loader in: `for i, b in enumerate(tqdm(loader))`.
_ITER_WRAPPERS = {"enumerate", "tqdm", "iter", "tqdm.tqdm", "tqdm.auto.tqdm", "progress"}


@dataclass
class WrapResult:
    """The outcome of `wrap_source`: new text, and what happened (or why nothing did)."""

    source: str
    original: str
    message: str
    declined: bool = False

    @property
    def changed(self) -> bool:
        return self.source != self.original


def wrap_source(source: str, *, path: Path | str = "<string>") -> WrapResult:
    """Insert `autoopt.optimize(model, loader, optimizer)` after the optimizer's creation.
    Raises `libcst.ParserSyntaxError` on unparsable code."""
    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    metadata.install(wrapper)
    finder = _Finder(wrapper)
    if finder.already_wrapped():
        return WrapResult(source, source, "already calls autoopt.optimize()")
    found = finder.find()
    if isinstance(found, str):
        return WrapResult(source, source, f"--wrap declined: {found}", declined=True)
    anchor, model, loader, optimizer = found
    call = cst.parse_statement(
        f"{model}, {loader}, {optimizer} = autoopt.optimize({model}, {loader}, {optimizer})\n"
    )
    fix = Fix(
        replacements={anchor: cst.FlattenSentinel([anchor, call])},
        add_imports=[ImportItem("autoopt")],
    )
    new = apply_fixes(module, [fix]).code
    return WrapResult(new, source, f"inserted autoopt.optimize({model}, {loader}, {optimizer})")


class _Finder:
    """Finds the optimizer statement, the model and the loader of the training loop."""

    def __init__(self, wrapper: MetadataWrapper) -> None:
        self.module = wrapper.module
        self.qnames = wrapper.resolve(QualifiedNameProvider)
        self.parents = wrapper.resolve(ParentNodeProvider)
        self.facts = FileFacts(wrapper)
        self.order = {id(n): i for i, n in enumerate(walk(self.module))}

    def names(self, node: cst.CSTNode) -> set[str]:
        value = self.qnames.get(node, set())
        if isinstance(value, LazyValue):  # resolve() hands out lazy values for this provider
            value = value()
        return {q.name for q in value}

    def already_wrapped(self) -> bool:
        return any(
            isinstance(n, cst.Call) and self.names(n.func) & _OPTIMIZE for n in walk(self.module)
        )

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        stmt = block_statement(node, self.parents.get)
        assert stmt is not None
        return stmt

    def find(self) -> tuple[cst.CSTNode, str, str, str] | str:
        """(statement to insert after, model, loader, optimizer), or the reason to decline."""
        if not self.facts.training_loops:
            return "no training loop (a loop that calls .backward())"
        optimizers = [
            node
            for node in walk(self.module)
            if isinstance(node, cst.Assign)
            and len(node.targets) == 1
            and isinstance(node.value, cst.Call)
            and any(
                n.startswith("torch.optim.") and ".lr_scheduler" not in n and ".swa_utils" not in n
                for n in self.names(node.value.func)
            )
        ]
        if not optimizers:
            return "no torch.optim optimizer is created in this file"
        if len(optimizers) > 1:
            return (
                f"{len(optimizers)} optimizers are created (e.g. a GAN); autoopt.optimize takes "
                "one model/optimizer pair"
            )
        opt_assign = optimizers[0]
        opt_target = opt_assign.targets[0].target
        if not isinstance(opt_target, cst.Name | cst.Attribute):
            return "the optimizer is not assigned to a plain name"
        model = self._model(opt_assign.value)  # type: ignore[arg-type]
        if model is None:
            return "cannot tell which model's .parameters() feed the optimizer"
        loader = self._loader()
        if isinstance(loader, str):
            return loader
        loader_expr, loader_assign = loader
        opt_stmt = self.statement_of(opt_assign)
        anchor = opt_stmt
        if loader_assign is not None:
            loader_stmt = self.statement_of(loader_assign)
            if self.order[id(loader_stmt)] > self.order[id(opt_stmt)]:
                if self.parents.get(loader_stmt) is not self.parents.get(opt_stmt):
                    return "the loader is created after the optimizer, in another block"
                anchor = loader_stmt
        loop = self.facts.training_loops[0]
        if self.order[id(loop)] < self.order[id(anchor)]:
            return "the training loop starts before the optimizer and loader exist"
        return anchor, code_of(model), loader_expr, code_of(opt_target)

    def _model(self, call: cst.Call) -> cst.BaseExpression | None:
        """The common root of every `X.parameters()` inside the optimizer's arguments."""
        roots: dict[str, cst.BaseExpression] = {}
        for node in walk(call):
            if m.matches(node, m.Call(func=m.Attribute(attr=m.Name("parameters")))):
                owner = node.func.value  # type: ignore[attr-defined]
                root = owner
                # model.backbone.parameters() -> model
                while isinstance(root, cst.Attribute) and not self._is_self(root.value):
                    root = root.value
                if not isinstance(root, cst.Name | cst.Attribute):
                    return None
                roots[code_of(root)] = root
        if len(roots) != 1:
            return None
        return next(iter(roots.values()))

    @staticmethod
    def _is_self(node: cst.BaseExpression) -> bool:
        return isinstance(node, cst.Name) and node.value == "self"

    def _loader(self) -> tuple[str, cst.Assign | None] | str:
        """The DataLoader iterated by the training loop, and its assignment (if in this file)."""
        loaders: dict[str, cst.Assign] = {}
        for node in walk(self.module):
            if (
                isinstance(node, cst.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0].target, cst.Name | cst.Attribute)
                and isinstance(node.value, cst.Call)
                and self.names(node.value.func) & set(DATALOADER)
            ):
                loaders.setdefault(code_of(node.targets[0].target), node)
        iterated: list[str] = []
        for loop in self.facts.training_loops:
            if not isinstance(loop, cst.For):
                continue
            expr = loop.iter
            while isinstance(expr, cst.Call) and expr.args and self._is_iter_wrapper(expr.func):
                expr = expr.args[0].value
            if isinstance(expr, cst.Name | cst.Attribute):
                iterated.append(code_of(expr))
        for name in iterated:
            if name in loaders:
                return name, loaders[name]
        for name in iterated:  # a loader passed in (function parameter) named like one
            if "loader" in name.lower():
                return name, None
        return "no DataLoader iterated by the training loop"

    def _is_iter_wrapper(self, func: cst.BaseExpression) -> bool:
        if isinstance(func, cst.Name) and func.value in _ITER_WRAPPERS:
            return True
        return bool(self.names(func) & _ITER_WRAPPERS)
