"""AO503: a shuffling `DistributedSampler` whose `set_epoch` is never called."""

from __future__ import annotations

import functools
from pathlib import Path

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.loops import feeds_evaluation_only
from autoopt.lint.program.project_files import project_modules
from autoopt.lint.program.project_text import read_text
from autoopt.lint.tree.calls import arg, has_star_kwargs
from autoopt.lint.tree.edits import statement_line
from autoopt.lint.tree.nodes import (
    calls_in,
    code_of,
    dotted,
    method_name,
    names_in,
    nodes_of_type,
    walk,
)

_SAMPLER = (
    "torch.utils.data.DistributedSampler",
    "torch.utils.data.distributed.DistributedSampler",
)
_LOADER = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")


class DistributedSamplerSetEpoch(Rule):
    """
    ## What it does
    Flags a shuffling `DistributedSampler` whose `set_epoch(epoch)` is never called, when the
    script iterates its loader in an epoch loop.

    ## Why
    `DistributedSampler` seeds its shuffle with `seed + epoch`. Without `set_epoch`, the epoch
    stays 0: every epoch visits the samples in the same order on every rank, which is as if
    the data were never reshuffled after the first epoch (it usually costs accuracy, silently).
    The runtime (`autoopt.optimize`) calls `set_epoch` itself on each new pass over the loader.

    ## When not to
    - `shuffle=False` (typical for validation samplers): the order does not depend on the
      epoch, so nothing is missing. Options hidden in `**kwargs` are not guessed.
    - A loader iterated once, outside any epoch loop.
    - A loader only evaluation reads (its loops run under `no_grad`/`eval()` or step nothing,
      or it is handed to a function of the project that does not train) in a file that calls
      `set_epoch` on another sampler: the author left it on purpose, and an averaged metric
      does not depend on the order of the samples.
    - Any `set_epoch` call on the sampler (or on `loader.sampler`) anywhere in the file.

    A sampler made in another function than the epoch loop (a loader factory) is reported
    without a fix: its name is not bound there. So is a factory's loader that the project's
    code iterates epoch after epoch in another module (HigherHRNet's `make_dataloader`,
    returned to the driver that hands it to `do_train` each epoch), when no module of the
    project calls `set_epoch`.

    ## Fix (safe)
    Inserts `<sampler>.set_epoch(<epoch>)` as the first statement of the epoch loop, using the
    script's own names (`loader.sampler` when the sampler was created inline in the
    `DataLoader` call). It declines (report only) when the epoch loop has no plain loop
    variable (`for _ in ...`, tuples, `while`). Behaviour changes only in the way intended:
    each epoch gets its own permutation, identical across ranks. Where the sampler is created
    on one path only (under `if args.distributed:`, None or a `RandomSampler` otherwise), the
    call goes under `if isinstance(sampler, DistributedSampler):`, so single-process runs never
    call it on None.
    """

    code = "AO503"
    name = "distributed-sampler-set-epoch"
    message = "DistributedSampler without set_epoch(epoch): every epoch reuses the same order"
    fix_safety = FixSafety.SAFE
    fix_reason = "set_epoch only reseeds the sampler's shuffle per epoch, as its docs require"
    covered_by_optimize = True  # autoopt.optimize() applies it at run time
    triggers = ("DistributedSampler",)

    VALID = [
        Valid(  # the validation loader's sampler shuffles, but evaluation reads it (LoRA)
            """
            import torch
            from torch.utils.data import DataLoader, DistributedSampler
            train_loader = DataLoader(train_ds, sampler=DistributedSampler(train_ds))
            valid_loader = DataLoader(valid_ds, sampler=DistributedSampler(valid_ds))
            def evaluate(model, loader):
                model.eval()
                with torch.no_grad():
                    for x in loader:
                        total = model(x).sum()
            for epoch in range(10):
                train_loader.sampler.set_epoch(epoch)
                for x in train_loader:
                    model(x).sum().backward()
                    optimizer.step()
                evaluate(model, valid_loader)
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            sampler = DistributedSampler(ds)
            loader = DataLoader(ds, sampler=sampler)
            for epoch in range(10):
                sampler.set_epoch(epoch)
                for x in loader:
                    model(x).sum().backward()
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            val_sampler = DistributedSampler(val_ds, shuffle=False)
            val_loader = DataLoader(val_ds, sampler=val_sampler)
            for epoch in range(10):
                for x in val_loader:
                    evaluate(x)
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            loader = DataLoader(ds, sampler=DistributedSampler(ds))
            for x in loader:
                model(x).sum().backward()
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            loader = DataLoader(ds, sampler=DistributedSampler(ds, **opts))
            for epoch in range(3):
                for x in loader:
                    model(x).sum().backward()
            """
        ),
    ]
    INVALID = [
        Invalid(  # created only when distributed: None in single-process runs, so guarded
            """
            import torch
            from torch.utils.data import DataLoader
            if args.distributed:
                val_sampler = torch.utils.data.distributed.DistributedSampler(val_ds)
            else:
                val_sampler = None
            val_loader = DataLoader(val_ds, batch_size=64, sampler=val_sampler)
            for epoch in range(args.epochs):
                for x, y in val_loader:
                    evaluate(model, x, y)
            """,
            line=4,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            if args.distributed:
                val_sampler = torch.utils.data.distributed.DistributedSampler(val_ds)
            else:
                val_sampler = None
            val_loader = DataLoader(val_ds, batch_size=64, sampler=val_sampler)
            for epoch in range(args.epochs):
                if isinstance(val_sampler, torch.utils.data.distributed.DistributedSampler):
                    val_sampler.set_epoch(epoch)
                for x, y in val_loader:
                    evaluate(model, x, y)
            """,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler
            train_sampler = DistributedSampler(train_ds, shuffle=True)
            train_loader = DataLoader(train_ds, batch_size=64, sampler=train_sampler)
            for ep in range(start, epochs):
                # one pass over the data
                for x, y in train_loader:
                    loss_fn(model(x), y).backward()
            """,
            line=3,
            fixed="""
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler
            train_sampler = DistributedSampler(train_ds, shuffle=True)
            train_loader = DataLoader(train_ds, batch_size=64, sampler=train_sampler)
            for ep in range(start, epochs):
                train_sampler.set_epoch(ep)
                # one pass over the data
                for x, y in train_loader:
                    loss_fn(model(x), y).backward()
            """,
        ),
        Invalid(
            """
            import torch.utils.data as tud
            loader = tud.DataLoader(ds, sampler=tud.DistributedSampler(ds))
            for epoch in range(epochs):
                train_one_epoch(model, loader, optimizer)
            """,
            line=2,
            fixed="""
            import torch.utils.data as tud
            loader = tud.DataLoader(ds, sampler=tud.DistributedSampler(ds))
            for epoch in range(epochs):
                loader.sampler.set_epoch(epoch)
                train_one_epoch(model, loader, optimizer)
            """,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            sampler = DistributedSampler(ds)
            loader = DataLoader(ds, sampler=sampler)
            for _ in range(epochs):
                for x in loader:
                    model(x).sum().backward()
            """,
            line=2,
            message_contains="set_epoch",
        ),
        Invalid(  # a tuple assignment, in a loader factory: the epoch loop is in train()
            """
            from torch.utils.data import DataLoader, DistributedSampler
            def prepare_dataloaders(ds, n_gpus):
                sampler, shuffle = None, True
                if n_gpus > 1:
                    sampler, shuffle = DistributedSampler(ds), False
                train_loader = DataLoader(ds, shuffle=shuffle, sampler=sampler)
                return train_loader
            def train(ds, n_gpus):
                train_loader = prepare_dataloaders(ds, n_gpus)
                for epoch in range(epochs):
                    for batch in train_loader:
                        model(batch).sum().backward()
            """,
            line=5,
            message_contains="call train_loader.sampler.set_epoch(epoch) at the start of each "
            "epoch (the sampler is made in another function: no fix)",
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, *_SAMPLER):
            return
        shuffle = arg(node, "shuffle", 2)
        if has_star_kwargs(node) or (shuffle is not None and _is_false(shuffle.value)):
            return  # no shuffle (or unknown): set_epoch changes nothing
        handles, loaders = self._handles_and_loaders(node)
        if not loaders or self._has_set_epoch(handles):
            return
        for loader in loaders:
            if feeds_evaluation_only(self, loader) and self._sets_any_epoch:
                # the training sampler gets its set_epoch: the evaluation one was left
                # alone on purpose (its average does not depend on the order it reads)
                continue
            epoch_loop = self._epoch_loop(loader)
            if epoch_loop is None:
                if self._returned_for_epochs(node, loader):
                    self.report(
                        node,
                        f"{self.message}; the loader is returned to code that iterates it every "
                        f"epoch: call its .sampler.set_epoch(epoch) at the start of each epoch "
                        "there (no fix)",
                    )
                    return
                continue
            # the sampler's own name, or `loader.sampler` when it was created inline
            handle = handles[0] or f"{loader}.sampler"
            made = self.facts.enclosing_scope(node)
            if made is not self.context.module and made is not self.facts.enclosing_scope(
                epoch_loop
            ):
                # made in another function (flowtron's `prepare_dataloaders()`): its name is
                # not bound at the epoch loop, and the loader there may be another object
                self.report(
                    node,
                    f"{self.message}; call {loader}.sampler.set_epoch(epoch) at the start of "
                    "each epoch (the sampler is made in another function: no fix)",
                )
                return
            guard = None
            if self._conditional(handles[0] or loader):
                # Created on one path only (`if args.distributed:`; None or a RandomSampler
                # otherwise): call set_epoch only where it is this sampler.
                guard = f"isinstance({handle}, {code_of(node.func)})"
            self._report(node, epoch_loop, handle, guard)
            return

    # ----- finding the names ------------------------------------------------------------------
    def _handles_and_loaders(self, node: cst.Call) -> tuple[list[str], list[str]]:
        """The expressions that name the sampler (`sampler`, or "" when it is inline) and the
        loaders built on it."""
        parent = self.parent(node)
        module = self.context.module
        target = None
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            target = parent.targets[0].target
        elif isinstance(parent, cst.Element) and isinstance(self.parent(parent), cst.Tuple):
            # `sampler, shuffle = DistributedSampler(ds), False` (flowtron)
            values, assign = self.parent(parent), self.parent(self.parent(parent))
            if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
                names = assign.targets[0].target
                if isinstance(names, cst.Tuple) and len(names.elements) == len(values.elements):
                    target = names.elements[values.elements.index(parent)].value
        if target is not None:
            name = dotted(target)
            if name is None:
                return [], []
            loaders = [
                target
                for call, target in _assigned_loaders(self, module)
                if (s := arg(call, "sampler")) is not None and dotted(s.value) == name
            ]
            return [name, *(f"{ld}.sampler" for ld in loaders)], loaders
        if isinstance(parent, cst.Arg) and parent.keyword is not None:
            if parent.keyword.value != "sampler":
                return [], []
            call = self.parent(parent)
            for loader_call, target in _assigned_loaders(self, module):
                if loader_call is call:
                    return ["", f"{target}.sampler"], [target]
        return [], []

    def _conditional(self, name: str) -> bool:
        """`name` is bound more than once, or its binding sits under an `if`/`try`/loop/`with`
        of its function: on some path it may be something else (None) or unbound."""
        bindings = [
            a
            for a in nodes_of_type(self.context.module, cst.Assign)
            if any(name in names_in(t.target) for t in a.targets)
        ]
        if len(bindings) != 1:
            return True
        for anc in self.facts.ancestors(bindings[0]):
            if isinstance(anc, cst.FunctionDef | cst.Module):
                return False
            if isinstance(anc, cst.If | cst.Try | cst.For | cst.While | cst.With):
                return True
        return False

    def _returned_for_epochs(self, node: cst.Call, loader: str) -> bool:
        """A loader factory (HigherHRNet's `make_dataloader`, wavegrad's `from_path`) returns
        `loader`, its callers iterate it epoch after epoch, and no module of the project calls
        `set_epoch`."""
        program = self.context.program
        if not program.returned_as(node, loader, "loader_per_epoch"):
            return False
        modules = project_modules(Path(self.context.path))
        return not any("set_epoch" in read_text(p) for p in modules)

    @functools.cached_property
    def _sets_any_epoch(self) -> bool:
        return any(method_name(c) == "set_epoch" for c in calls_in(self.context.module))

    def _has_set_epoch(self, handles: list[str]) -> bool:
        wanted = {h for h in handles if h}
        return any(
            method_name(c) == "set_epoch"
            and isinstance(c.func, cst.Attribute)
            and dotted(c.func.value) in wanted
            for c in calls_in(self.context.module)
        )

    def _epoch_loop(self, loader: str) -> cst.For | None:
        """The innermost `for` that does not iterate `loader` itself but whose body uses it
        (a nested loop over it, or a call that gets it): the epoch loop."""
        best: cst.For | None = None
        best_depth = -1
        for node in walk(self.context.module):
            if not isinstance(node, cst.For) or _mentions(node.iter, loader):
                continue
            if not _mentions(node.body, loader):
                continue
            depth = sum(1 for _ in self.context.facts.ancestors(node))
            if depth > best_depth:
                best, best_depth = node, depth
        return best

    # ----- reporting ----------------------------------------------------------------------------
    def _report(self, node: cst.Call, loop: cst.For, handle: str, guard: str | None) -> None:
        target = loop.target
        body = loop.body
        if (
            not isinstance(target, cst.Name)
            or target.value == "_"
            or not isinstance(body, cst.IndentedBlock)
            or not body.body
        ):
            self.report(
                node,
                f"{self.message}; call {handle}.set_epoch(epoch) at the start of each epoch "
                "(no epoch variable to use here)",
            )
            return
        first = body.body[0]
        call = f"{handle}.set_epoch({target.value})"
        new: cst.BaseStatement = statement_line(call)
        if guard is not None:
            new = cst.parse_statement(f"if {guard}:\n    {call}\n")
        self.report(
            node,
            fix=Fix(
                replacements={first: cst.FlattenSentinel([new, first])},
                description=f"call {handle}.set_epoch({target.value}) each epoch",
            ),
        )


def _is_false(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "False"


def _mentions(node: cst.CSTNode, name: str) -> bool:
    """`name` is used under `node` (outside nested functions)."""
    return any(isinstance(n, cst.Name) and n.value == name for n in walk(node, into_scopes=False))


def _assigned_loaders(rule: Rule, module: cst.Module) -> list[tuple[cst.Call, str]]:
    """`(DataLoader call, name)` for every `name = DataLoader(...)` in the file."""
    found: list[tuple[cst.Call, str]] = []
    for n in nodes_of_type(module, cst.Assign):
        if (
            len(n.targets) == 1
            and isinstance(n.value, cst.Call)
            and rule.is_call_to(n.value, *_LOADER)
        ):
            target = n.targets[0].target
            if isinstance(target, cst.Name):  # loops are matched by plain names
                found.append((n.value, target.value))
    return found
