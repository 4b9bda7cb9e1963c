"""AO306: `torch.compile` on a model fed batches whose shape changes, without dynamic shapes."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.program.loops import loops_over
from autoopt.lint.program.torch_api import DATALOADER
from autoopt.lint.tree.calls import arg, call_options
from autoopt.lint.tree.nodes import (
    calls_in,
    code_of,
    dotted,
    int_literal,
    is_name,
    is_true,
    method_name,
    nodes_of_type,
    string_value,
    walk,
)

_COMPILE = ("torch.compile",)
_RAGGED = "a ragged last batch: drop_last=False, the default"
# Modes that capture CUDA graphs, which are recorded per input shape.
_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# transformers' collators that pad each batch to its own longest sequence (padding=True).
_PADDING_COLLATORS = (
    "DataCollatorWithPadding",
    "DataCollatorForSeq2Seq",
    "DataCollatorForTokenClassification",
)


class CompileRaggedBatches(Rule):
    """
    ## What it does
    Flags `torch.compile` of a model that a training loop feeds from a `DataLoader` whose batches
    change shape, when the compile has no `dynamic=True` and nothing is marked dynamic
    (`torch._dynamo.mark_dynamic`): batches padded to their own longest sequence (a `collate_fn`
    that calls `pad_sequence`, or transformers' `DataCollatorWithPadding`), or a ragged last
    batch (`batch_size` set, `drop_last` left False, the dataset's size not known to be a
    multiple of it) under a compile that pays per shape: `dynamic=False`, or CUDA graphs
    (`mode="reduce-overhead"` / `"max-autotune"`).

    ## Why is this bad?
    A compiled graph is specialised to the shapes it first saw. The first batch of another size
    recompiles (a second cold compile: seconds to minutes), after which torch makes that
    dimension dynamic, with kernels that no longer know the size; with `dynamic=False` every new
    size recompiles until the recompile limit, then the model runs eager. CUDA graphs
    (`mode="reduce-overhead"`) re-record per shape.

    ## Example
    `loader = DataLoader(ds, batch_size=64, shuffle=True)` and
    `model = torch.compile(model, mode="reduce-overhead")`, then `for x, y in loader: model(x)`:
    the last batch of each epoch is smaller and re-records the CUDA graphs.

    ## Use instead
    `DataLoader(..., drop_last=True)` for a ragged last batch; pad to a fixed length
    (`padding="max_length"`) or to a few buckets for variable lengths; or
    `torch.compile(model, dynamic=True)` to compile one dynamic graph from the start.

    ## Fix safety
    No fix: `drop_last=True` skips up to `batch_size - 1` samples an epoch, and `dynamic=True`
    changes the kernels of every step; which one fits is the user's choice.

    ## When not to
    - A ragged last batch under torch's defaults (`dynamic=None`) is not flagged: one recompile,
      after which torch's automatic dynamic shapes make the batch dimension dynamic; flagging it
      would also refuse the compile that `autoopt rewrite` inserts (AO301), which pays more.
    - The dataset size is a multiple of the batch size (no ragged batch), or every sequence
      already has one length.
    - `autoopt.optimize(model, compile=True)`: it reports the changing shape once and makes the
      dimension dynamic itself.
    """

    code = "AO306"
    name = "compile-ragged-batches"
    message = (
        "torch.compile on a model fed batches of changing shape ({why}) without dynamic=True: "
        "the first other shape recompiles"
    )
    triggers = ("compile",)
    requires = ("DataLoader", ".backward(")

    VALID = [
        Valid(  # drop_last=True: every batch has batch_size rows
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64, shuffle=True, drop_last=True)
            model = torch.compile(model, mode="reduce-overhead")
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            """
        ),
        Valid(  # compiled with dynamic shapes from the start
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64)
            model = torch.compile(model, dynamic=True, mode="reduce-overhead")
            for x, y in loader:
                criterion(model(x), y).backward()
            """
        ),
        Valid(  # a ragged last batch under torch's defaults: one recompile, then dynamic
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64, shuffle=True)
            model = torch.compile(model)
            for x, y in loader:
                criterion(model(x), y).backward()
            """
        ),
        Valid(  # batch_size 1 (the default): no ragged batch
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, shuffle=True)
            model = torch.compile(model, mode="reduce-overhead")
            for x, y in loader:
                criterion(model(x), y).backward()
            """
        ),
        Valid(  # drop_last unknown (from **kwargs): silent
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64, **loader_kwargs)
            model = torch.compile(model, mode="reduce-overhead")
            for x, y in loader:
                criterion(model(x), y).backward()
            """
        ),
        Valid(  # the loop feeds another model than the compiled one
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64)
            compiled = torch.compile(model, mode="reduce-overhead")
            for x, y in loader:
                criterion(model(x), y).backward()
            """
        ),
        Valid(  # the dataset's size is a multiple of the batch size
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            data = TensorDataset(torch.randn(64 * steps, 10), torch.randn(64 * steps, 1))
            loader = DataLoader(data, batch_size=64, shuffle=True)
            model = torch.compile(model, mode="reduce-overhead")
            for x, y in loader:
                criterion(model(x), y).backward()
            """
        ),
        Valid(  # padded to one fixed length
            """
            import torch
            from torch.utils.data import DataLoader
            from transformers import DataCollatorWithPadding
            collator = DataCollatorWithPadding(tokenizer, padding="max_length", max_length=128)
            loader = DataLoader(ds, batch_size=16, collate_fn=collator, drop_last=True)
            model = torch.compile(model, mode="reduce-overhead")
            for batch in loader:
                model(**batch).loss.backward()
            """
        ),
        Valid(  # the batch dimension is marked dynamic by hand
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64)
            model = torch.compile(model, mode="reduce-overhead")
            for x, y in loader:
                torch._dynamo.mark_dynamic(x, 0)
                criterion(model(x), y).backward()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64, shuffle=True)
            model = torch.compile(model, mode="reduce-overhead")
            for epoch in range(10):
                for x, y in loader:
                    optimizer.zero_grad()
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
            """,
            line=4,
        ),
        Invalid(  # padded per batch, compiled with model.compile()
            """
            import torch
            from torch.nn.utils.rnn import pad_sequence
            from torch.utils.data import DataLoader

            def collate(batch):
                tokens = pad_sequence([b[0] for b in batch], batch_first=True)
                return tokens, torch.stack([b[1] for b in batch])

            loader = DataLoader(ds, batch_size=32, collate_fn=collate, drop_last=True)
            model.compile()
            for tokens, labels in loader:
                model(tokens).loss.backward()
            """,
            line=10,
        ),
        Invalid(  # transformers' collator pads each batch to its longest sequence
            """
            import torch
            from torch.utils.data import DataLoader
            from transformers import DataCollatorWithPadding
            collator = DataCollatorWithPadding(tokenizer)
            train_loader = DataLoader(ds, batch_size=16, collate_fn=collator, drop_last=True)
            model = torch.compile(model, mode="max-autotune")
            for step, batch in enumerate(train_loader):
                loss = model(**batch).loss
                loss.backward()
            """,
            line=6,
        ),
    ]

    def leave_Module(self, node: cst.Module) -> None:
        calls = nodes_of_type(node, cst.Call)
        if any(method_name(c) == "mark_dynamic" for c in calls):
            return  # shapes handled by hand somewhere in the file
        ragged = self._ragged_loaders(node)
        if not ragged:
            return
        for call, model in self._compiled(node):
            for loader, why in ragged.items():
                if why == _RAGGED and not _specialised(call):
                    continue  # one recompile, then torch's automatic dynamic shapes
                if self._feeds(loader, model):
                    self.report(call, self.message.format(why=why))
                    break

    def _compiled(self, module: cst.Module) -> list[tuple[cst.Call, str]]:
        """(compile call, the name the compiled model is called by), without dynamic=True."""
        out = []
        for assign in nodes_of_type(module, cst.Assign):
            call = assign.value
            if not (self.is_call_to(call, *_COMPILE) and call.args and len(assign.targets) == 1):
                continue
            name = dotted(assign.targets[0].target)
            if name is not None and not _dynamic(call):
                out.append((call, name))
        for call in nodes_of_type(module, cst.Call):
            if method_name(call) == "compile" and not _dynamic(call):
                assert isinstance(call.func, cst.Attribute)
                if call.args and all(arg(call, k) is None for k in ("dynamic", "backend", "mode")):
                    continue  # re.compile(pattern), not nn.Module.compile()
                name = dotted(call.func.value)
                if name is not None and not self.refers_to(call.func.value, "torch"):
                    out.append((call, name))
        return out

    def _ragged_loaders(self, module: cst.Module) -> dict[str, str]:
        """Names bound to a DataLoader whose batches change shape, with why."""
        collators = self._padding_collators(module)
        out: dict[str, str] = {}
        for assign in nodes_of_type(module, cst.Assign):
            if not self.is_call_to(assign.value, *DATALOADER) or len(assign.targets) != 1:
                continue
            name = dotted(assign.targets[0].target)
            options = call_options(self, assign.value)
            if name is None or not options.complete or "batch_sampler" in options.values:
                continue  # options we cannot read, or batching the loader does not decide
            values = options.values
            collate = dotted(values["collate_fn"]) if "collate_fn" in values else None
            if collate is not None and collate in collators:
                out[name] = f"collate_fn {collate} pads each batch to its longest sequence"
                continue
            size = int_literal(values.get("batch_size"))
            drop_last = values.get("drop_last")
            if (
                "batch_size" in values
                and size != 1
                and (drop_last is None or is_name(drop_last, "False"))
                and not _multiple_of(module, arg(assign.value, "dataset", 0), values["batch_size"])
            ):
                out[name] = _RAGGED
        return out

    def _padding_collators(self, module: cst.Module) -> set[str]:
        """Functions that call `pad_sequence`, and names bound to transformers' collators that
        pad to the longest sequence of the batch (not `padding="max_length"`)."""
        out = set()
        for fn in nodes_of_type(module, cst.FunctionDef):
            if any((dotted(c.func) or "").endswith("pad_sequence") for c in calls_in(fn)):
                out.add(fn.name.value)
        for assign in nodes_of_type(module, cst.Assign):
            value = assign.value
            if not isinstance(value, cst.Call) or len(assign.targets) != 1:
                continue
            callee = (dotted(value.func) or "").rsplit(".", 1)[-1]
            padding = arg(value, "padding")
            fixed = padding is not None and string_value(padding.value) == "max_length"
            name = dotted(assign.targets[0].target)
            if callee in _PADDING_COLLATORS and not fixed and name is not None:
                out.add(name)
        return out

    def _feeds(self, loader: str, model: str) -> bool:
        """A training loop over `loader` calls `model(...)`."""
        for loop in loops_over(self, loader):
            if self.facts.is_eval_loop(loop):
                continue  # evaluation batches: no training step recompiles on them
            for call in calls_in(loop.body):
                if dotted(call.func) == model and self.facts.in_training_loop(call):
                    return True
        return False


def _dynamic(call: cst.Call) -> bool:
    found = arg(call, "dynamic")
    return found is not None and is_true(found.value)


def _multiple_of(
    module: cst.Module, dataset: cst.Arg | None, batch_size: cst.BaseExpression
) -> bool:
    """The dataset is built from a size known to be a multiple of the batch size: a product
    with the batch size as a factor (`make_tokens(32 * steps)` with batch_size=32,
    `TensorDataset(x, y)` after `x = torch.randn(bs * n, 8)`), or an integer literal that the
    literal batch size divides (`make_data(256, seed)` with batch_size=128). Names in the
    dataset expression are followed to their assignments in the file (any of them)."""
    if dataset is None:
        return False
    exprs = [dataset.value]
    for node in walk(dataset.value):
        if isinstance(node, cst.Name):
            bound = [
                assign.value
                for assign in nodes_of_type(module, cst.Assign)
                if any(is_name(t.target, node.value) for t in assign.targets)
            ]
            exprs += bound  # any of its bindings: silent when unsure
    factor = code_of(batch_size)
    size = int_literal(batch_size)
    for expr in exprs:
        for node in walk(expr):
            if (
                isinstance(node, cst.BinaryOperation)
                and isinstance(node.operator, cst.Multiply)
                and factor in (code_of(node.left), code_of(node.right))
            ):
                return True
            literal = int_literal(node) if isinstance(node, cst.Integer) else None
            if size and literal and literal >= size and literal % size == 0:
                return True
    return False


def _specialised(call: cst.Call) -> bool:
    """A compile that pays per shape: static (`dynamic=False`: every size recompiles) or with
    CUDA graphs (`mode="reduce-overhead"`/`"max-autotune"`: re-recorded per size)."""
    dynamic, mode = arg(call, "dynamic"), arg(call, "mode")
    return (dynamic is not None and is_name(dynamic.value, "False")) or (
        mode is not None and string_value(mode.value) in _GRAPH_MODES
    )
