"""AO101: a DataLoader that loads every batch in the training process."""

from __future__ import annotations

import os

import libcst as cst
from libcst.codemod.visitors import ImportItem

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.config_defaults import yacs_default
from autoopt.lint.program.index import Value, load_index
from autoopt.lint.program.loops import evaluation_only_loader
from autoopt.lint.program.project_facts import (
    argparse_default,
    imported_constant,
    passed_option_default,
    unpassed_default,
)
from autoopt.lint.program.summaries import Target
from autoopt.lint.program.torch_api import DATALOADER
from autoopt.lint.rewrite.fixes.preconditions import device_is_cuda
from autoopt.lint.tree.calls import arg, call_options, with_keyword
from autoopt.lint.tree.nodes import (
    assignments,
    code_of,
    dotted,
    int_literal,
    is_name,
    nodes_of_type,
    string_value,
    walk,
)

_ITERABLE_DATASET = (
    "torch.utils.data.IterableDataset",
    "torch.utils.data.dataset.IterableDataset",
)
# The runtime's worker rule (autoopt.runtime.passes.loader), as the fix writes it.
_CUDA_WORKERS = 8
_CPU_WORKERS = 4
_CPUS = "(os.cpu_count() or 1)"
_TENSOR_DATASET = (
    "torch.utils.data.TensorDataset",
    "torch.utils.data.dataset.TensorDataset",
)


class DataLoaderNumWorkers(Rule):
    """
    ## What it does
    Flags a `torch.utils.data.DataLoader` created without `num_workers`, or with
    `num_workers=0`, also a 0 read from a config module of the project
    (`num_workers=CFG.num_workers` where config.py binds `num_workers = 0`: reported without a
    fix, the change belongs in config.py; likewise a yacs key whose default the project's
    config module sets to 0, `cfg.DATALOADER.num_workers` with `_C.DATALOADER.num_workers = 0`
    in SimpleView's configs.py, also through a local name or a factory's parameter, unless
    a YAML file of the project sets that key to another value), or a command-line option
    whose default is 0
    (`num_workers=opt.threads` with `add_argument("--threads", type=int, default=0)` in the
    file or a module of the project it imports, or that a package it imports re-exports, or,
    none of those declaring it, the driver that imports this module (SCINet's run_ETTh.py for
    its Exp module's loader): reported without a fix, the default is the
    author's to raise), or the parameter of a loader factory that defaults to 0 where no call
    in the project passes it (autovc's `get_loader(root, batch_size, len_crop, num_workers=0)`:
    reported without a fix, naming the calls), or a parameter every call passes a command-line
    option whose default is 0 (egnn's `retrieve_dataloaders(args.batch_size,
    args.num_workers)` with `--num_workers` declared `default=0`: reported without a fix,
    naming the option and the calls).

    ## Why
    With no workers, every batch is read, decoded and augmented in the training process itself,
    one at a time, while the GPU (or the CPU's compute threads) waits. Worker processes prepare
    the next batches in parallel with the step; on image pipelines 4 workers commonly take the
    input side off the critical path (as widely read PyTorch tutorials teach). The runtime (`autoopt.optimize`) picks the
    count from the CPU count, and the rewrite writes the same rule as an expression.

    ## When not to
    - An evaluation loader beside a training loader that sets `num_workers`: leaving it out
      of the evaluation loader is the author's choice for a held-out set (not reported).
    - A loader the driver draws one batch from, once (`fixed, _ = next(iter(test_loader))`
      outside any loop: images to log), beside a training loader that sets `num_workers`.
    - The options come through `**kwargs` that the rule cannot read: the value may well be set
      there, so the rule stays quiet. A dict built in the same scope from literals is read,
      also when grown with `kw.update({...})` / `kw.update(other_literal_dict)` /
      `kw["key"] = ...` or chosen by a condition (`{...} if use_cuda else {}`); a key set on
      either branch counts as set.
    - A custom wrapper (a user's own `DataLoader` class or factory) is not torch's and is not
      flagged. PyG's and MONAI's `DataLoader`s hand their options to torch's and count as
      torch's (MONAI's `ThreadDataLoader` does not: its workers are threads).
    - An `IterableDataset` defined in the file that does not shard by
      `torch.utils.data.get_worker_info()`: each worker would replay the whole stream, so every
      sample would be seen `num_workers` times. Not flagged.

    ## Fix (unsafe)
    Adds (or replaces the 0 with) the runtime's own choice (`autoopt.optimize`'s loader pass),
    computed where the script runs: `min(8, (os.cpu_count() or 1) - 1)` on CUDA (one core kept
    for the training process), `min(4, (os.cpu_count() or 1) // 8)` on CPU (none below 8
    cores: workers would compete with the training's own threads), chosen by the script's own
    device test where it decides at run time. An in-memory `TensorDataset` is not flagged:
    indexing resident tensors is cheaper than a worker's IPC, so the runtime keeps 0 there too.
    It is unsafe because worker processes change
    how the script runs: the dataset, `collate_fn` and `worker_init_fn` must be picklable
    (lambdas are not) where workers are spawned (Windows, macOS), the script's top level then
    runs again in every worker unless it is under `if __name__ == "__main__":`, and per-worker
    random state differs (seed with `worker_init_fn`).
    """

    code = "AO101"
    name = "dataloader-num-workers"
    message = "DataLoader loads batches in the training process; set num_workers > 0"
    fix_safety = FixSafety.UNSAFE
    fix_reason = (
        "worker processes need a picklable dataset/collate_fn and, where workers are spawned, "
        'an `if __name__ == "__main__":` guard'
    )
    covered_by_optimize = True  # autoopt.optimize() applies it at run time
    triggers = ("DataLoader",)

    VALID = [
        Valid(  # an option whose default is not 0: the count is the user's
            """
            import argparse
            import torch
            from torch.utils.data import DataLoader
            parser = argparse.ArgumentParser()
            parser.add_argument("--threads", type=int, default=4)
            opt = parser.parse_args()
            loader = DataLoader(dataset, batch_size=64, num_workers=opt.threads)
            for x, y in loader:
                loss_fn(model(x.cuda()), y.cuda()).backward()
            """
        ),
        Valid(  # a loader only read by a loop that steps nothing (class images sampled with a
            # pipeline) beside a training loader that sets num_workers
            """
            import torch
            from torch.utils.data import DataLoader

            sample_loader = DataLoader(PromptDataset(prompt, 100), batch_size=4)
            for example in sample_loader:
                images = pipeline(example["prompt"]).images
            train_loader = DataLoader(dataset, batch_size=8, num_workers=4)
            for batch in train_loader:
                optimizer.zero_grad()
                model(batch).sum().backward()
                optimizer.step()
            """
        ),
        Valid(  # a TensorDataset a function of the file returns, handed to train() (BERT-NER)
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset

            def load_examples(path):
                ids = torch.tensor(read(path))
                dataset = TensorDataset(ids, ids)
                return dataset

            def train(args, train_dataset, model):
                loader = DataLoader(train_dataset, batch_size=32)
                for x, y in loader:
                    model(x).sum().backward()

            def main():
                examples = load_examples("train.txt")
                train(args, examples, model)
            """
        ),
        Valid(  # an in-memory TensorDataset: the runtime keeps 0 workers (IPC would cost more)
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            ds = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
            loader = DataLoader(ds, batch_size=32, shuffle=True)
            """
        ),
        Valid(  # workers set on the accelerator branch of a conditional dict (pytorch/examples vae)
            """
            import torch
            use_accel = torch.accelerator.is_available()
            kwargs = {"num_workers": 1, "pin_memory": True} if use_accel else {}
            with open("log.txt") as log:
                train_loader = torch.utils.data.DataLoader(ds, batch_size=128, **kwargs)
            """
        ),
        Valid(  # ... or merged in with .update()
            """
            import torch
            train_kwargs = {"batch_size": 64}
            if use_accel:
                accel_kwargs = {"num_workers": 1, "persistent_workers": True}
                train_kwargs.update(accel_kwargs)
            train_loader = torch.utils.data.DataLoader(dataset1, **train_kwargs)
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=4)
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader
            def make(ds, **kwargs):
                return DataLoader(ds, batch_size=32, **kwargs)
            """
        ),
        Valid(
            """
            from mylib import DataLoader
            loader = DataLoader(ds, batch_size=32)
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader, IterableDataset
            class Stream(IterableDataset):
                def __iter__(self):
                    yield from range(100)
            loader = DataLoader(Stream(), batch_size=8)
            """
        ),
        Valid(
            """
            import torch
            kw = {"batch_size": 32, "num_workers": 8}
            loader = torch.utils.data.DataLoader(ds, **kw)
            """
        ),
        Valid(  # the evaluation loader beside a training loader with workers: the author's choice
            """
            import torch
            from torch.utils.data import DataLoader
            def main():
                train_loader = DataLoader(train_set, 64, shuffle=True, num_workers=4)
                val_loader = DataLoader(val_set, 64)
                for x, y in train_loader:
                    loss_fn(model(x), y).backward()
                    opt.step()
                evaluate(model, val_loader)
            """
        ),
        Valid(  # TensorDatasets bound in one tuple assignment (transfer-learning-conv-ai)
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            train_dataset, valid_dataset = TensorDataset(*train_tensors), TensorDataset(*valid)
            train_loader = DataLoader(train_dataset, batch_size=8, shuffle=True)
            """
        ),
        Valid(  # one fixed batch drawn once from a test loader, beside a training loader with
            # workers (pytorch-vqvae)
            """
            import torch
            from torch.utils.data import DataLoader

            def train(loader, model, optimizer):
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()

            def main():
                train_loader = DataLoader(ds, batch_size=8, num_workers=4, pin_memory=True)
                test_loader = DataLoader(ts, batch_size=16, shuffle=True)
                fixed_images, _ = next(iter(test_loader))
                for epoch in range(10):
                    train(train_loader, model, optimizer)
            """
        ),
    ]
    INVALID = [
        Invalid(  # PyG's DataLoader hands its options to torch's (GraphCL)
            """
            import torch
            from torch_geometric.loader import DataLoader
            device = torch.device("cuda")
            loader = DataLoader(dataset, batch_size=128, shuffle=True)
            for epoch in range(10):
                for data in loader:
                    loss = model(data.to(device)).sum()
                    loss.backward()
            """,
            line=4,
            fixed="""
            import torch
            from torch_geometric.loader import DataLoader
            import os

            device = torch.device("cuda")
            loader = DataLoader(dataset, batch_size=128, shuffle=True, num_workers=min(8, (os.cpu_count() or 1) - 1))
            for epoch in range(10):
                for data in loader:
                    loss = model(data.to(device)).sum()
                    loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(  # the worker count is an option whose default is 0 (pytorch-SRResNet)
            """
            import argparse
            import torch
            from torch.utils.data import DataLoader
            parser = argparse.ArgumentParser()
            parser.add_argument("--threads", type=int, default=0)
            opt = parser.parse_args()
            loader = DataLoader(dataset, batch_size=64, num_workers=opt.threads)
            for x, y in loader:
                loss_fn(model(x.cuda()), y.cuda()).backward()
            """,
            line=7,
            message_contains="option whose default is 0",
        ),
        Invalid(  # a loopless helper may draw a batch every step: still reported
            """
            import torch
            from torch.utils.data import DataLoader

            train_loader = DataLoader(ds, batch_size=8, num_workers=4)
            side_loader = DataLoader(ts, batch_size=16)

            def get_batch():
                return next(iter(side_loader))

            for x, y in train_loader:
                model(x, get_batch()).sum().backward()
                optimizer.step()
            """,
            line=5,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            import os

            train_loader = DataLoader(ds, batch_size=8, num_workers=4)
            side_loader = DataLoader(ts, batch_size=16, num_workers=min(4, (os.cpu_count() or 1) // 8))

            def get_batch():
                return next(iter(side_loader))

            for x, y in train_loader:
                model(x, get_batch()).sum().backward()
                optimizer.step()
            """,
            unsafe=True,
        ),
        Invalid(  # the device is chosen at run time: the runtime's CUDA or CPU rule, as it runs
            """
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            if __name__ == "__main__":
                loader = DataLoader(ds, batch_size=32)
                for x, y in loader:
                    model(x.to(device)).sum().backward()
            """,
            line=5,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            import os

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            if __name__ == "__main__":
                loader = DataLoader(ds, batch_size=32, num_workers=min(8, (os.cpu_count() or 1) - 1) if device.type == "cuda" else min(4, (os.cpu_count() or 1) // 8))
                for x, y in loader:
                    model(x.to(device)).sum().backward()
            """,
            unsafe=True,
        ),
        Invalid(  # kwargs grown with .update() that never set num_workers
            """
            import torch
            train_kwargs = {"batch_size": 64}
            train_kwargs.update({"shuffle": True})
            train_loader = torch.utils.data.DataLoader(dataset1, **train_kwargs)
            """,
            line=4,
            fixed="""
            import torch
            import os

            train_kwargs = {"batch_size": 64}
            train_kwargs.update({"shuffle": True})
            train_loader = torch.utils.data.DataLoader(dataset1, **train_kwargs, num_workers=min(4, (os.cpu_count() or 1) // 8))
            """,
            unsafe=True,
        ),
        Invalid(
            """
            import torch
            loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True)
            """,
            line=2,
            fixed="""
            import torch
            import os

            loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=min(4, (os.cpu_count() or 1) // 8))
            """,
            unsafe=True,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader as DL
            def main():
                kw = dict(batch_size=32, num_workers=0)
                loader = DL(ds, **kw)
            """,
            line=4,
            fixed=None,  # the 0 is inside the dict: reported, not rewritten
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            def main():
                loader = DataLoader(
                    ds,
                    batch_size=64,
                    num_workers=0,
                )
            """,
            line=3,
            fixed="""
            from torch.utils.data import DataLoader
            import os

            def main():
                loader = DataLoader(
                    ds,
                    batch_size=64,
                    num_workers=min(4, (os.cpu_count() or 1) // 8),
                )
            """,
            unsafe=True,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, 32, True)
            """,
            line=2,
            message_contains="__main__",
            fixed="""
            from torch.utils.data import DataLoader
            import os

            loader = DataLoader(ds, 32, True, num_workers=min(4, (os.cpu_count() or 1) // 8))
            """,
            unsafe=True,
        ),
    ]

    def _bound_in_scope(self, node: cst.Call, expr: cst.BaseExpression) -> cst.BaseExpression:
        """What a local name is bound to where it is bound once in the function holding
        `node` (SimpleView's `num_workers = cfg.DATALOADER.num_workers`); else `expr`."""
        scope = self.facts.enclosing_scope(node)
        if not isinstance(expr, cst.Name) or not isinstance(scope, cst.FunctionDef):
            return expr
        values = [value for name, value, _ in assignments(scope) if name == expr.value]
        return values[0] if len(values) == 1 else expr

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, *DATALOADER):
            return
        options = call_options(self, node)
        workers = options.values.get("num_workers")
        configured = None
        flag = False  # the 0 is a command-line option's default
        said = None  # the 0 is the default of a parameter no caller passes
        if workers is None:
            if not options.complete:
                return  # `**kwargs` we cannot read may set it
        elif int_literal(workers) != 0:
            configured = imported_constant(self, workers) or yacs_default(
                self.context.path, self._bound_in_scope(node, workers)
            )
            if configured is None:
                configured = argparse_default(self, workers)
                flag = configured is not None
            if configured is None:
                unpassed = unpassed_default(self, node, workers)
                if unpassed is not None and unpassed[0] == 0:
                    said = (
                        f"`{code_of(workers)}` defaults to 0 in {unpassed[1]}() and no call "
                        f"passes it: {', '.join(unpassed[2][:3])}; pass a worker count there"
                    )
                passed = passed_option_default(self, node, workers) if unpassed is None else None
                if passed is not None and passed[0] == 0:
                    said = (
                        f"`{code_of(workers)}` is `{passed[1]}` at every call "
                        f"({', '.join(passed[2][:3])}), an option whose default is 0: raise it"
                    )
            elif configured[0] != 0:
                return
            if configured is None and said is None:
                return
        dataset = options.values.get("dataset") or _first_arg(node)
        if self._unsharded_iterable_dataset(dataset) or self._in_memory(dataset):
            return
        if self.context.program.dataset_on_device(node):
            return  # workers would have to start CUDA to run its __getitem__
        if evaluation_only_loader(self, node, "num_workers"):
            return  # the training loader sets it, this evaluation one does not: a choice
        message = self.message
        if self._unguarded_module_level(node):
            message += (
                ' (and put the script under `if __name__ == "__main__":`: spawned workers'
                " re-run the module's top level)"
            )
        if said is not None:
            self.report(node, f"{message} ({said})")
            return
        if configured is not None:  # the 0 is a config module's: the fix belongs there
            where = os.path.relpath(
                configured[1], os.path.dirname(os.path.abspath(self.context.path))
            )
            if flag:
                said = f"{code_of(workers)} is an option whose default is 0 ({where}): raise it"
            else:
                said = f"{code_of(workers)} is 0 in {where}: set it there"
            self.report(node, f"{message} ({said})")
            return
        explicit = arg(node, "num_workers", 5)
        if workers is not None and explicit is None:
            self.report(node, message)  # the 0 sits in a **dict: say so, leave it to the user
            return
        workers_expr, imports = self._workers(node)
        value = cst.parse_expression(workers_expr)
        if explicit is not None and explicit.keyword is None:
            new_call = node.with_changes(
                args=[a.with_changes(value=value) if a is explicit else a for a in node.args]
            )
        else:
            new_call = with_keyword(node, "num_workers", value)
        self.report(
            node,
            message,
            fix=Fix(
                replacements={node: new_call},
                description=f"num_workers={workers_expr}",
                add_imports=(ImportItem("os"), *imports),
            ),
        )

    def _workers(self, node: cst.Call) -> tuple[str, tuple[ImportItem, ...]]:
        """The runtime's worker count (`autoopt.runtime.passes.loader.choose_workers`), written
        as the script's own expression: one core kept for the training process on CUDA, one
        worker per 8 cores on CPU (none below 8: workers would compete with the training's
        threads), decided as the script decides its device."""
        cuda = f"min({_CUDA_WORKERS}, {_CPUS} - 1)"
        cpu = f"min({_CPU_WORKERS}, {_CPUS} // 8)"
        if not self.facts.device.gpu_path:
            return cpu, ()
        test = device_is_cuda(self, node)
        if test is None:
            return cuda, ()
        return f"{cuda} if {test[0]} else {cpu}", test[1]

    def _in_memory(self, dataset: cst.BaseExpression | None, hops: int = 0) -> bool:
        """A `TensorDataset`: indexing resident tensors is cheaper than a worker's IPC, so the
        runtime keeps 0 workers for it, and so does the rule. Also one a function of the file
        returns (`load_and_cache_examples(...)`, the old transformers examples), and one a
        function receives from every caller in the file (`train(args, train_dataset, ...)`)."""
        if dataset is None or hops > 2:
            return False
        call = dataset if isinstance(dataset, cst.Call) else self._assigned_call(dataset)
        if call is None:
            callers = self._arguments_for(dataset)
            return bool(callers) and all(self._in_memory(a, hops + 1) for a in callers)
        if self.refers_to(call.func, *_TENSOR_DATASET):
            return True
        func = self._function(call.func)
        if func is None:
            return self._project_returns_tensor_dataset(call)
        returns = [r.value for r in nodes_of_type(func, cst.Return) if r.value is not None]
        return bool(returns) and all(self._in_memory_in(func, r) for r in returns)

    def _project_returns_tensor_dataset(self, call: cst.Call) -> bool:
        """`call` runs a function or method of another module of the project (as the program
        model resolves it) whose every `return` hands back a `TensorDataset` it builds: the
        BERT classifier's `processor.create_dataset(features)` of pybert/io/bert_processor.py."""
        name = dotted(call.func)
        if name is None:
            return False
        program = self.context.program
        targets = list(
            program.program.resolve(
                program.index, program.function_of(call), tuple(name.split("."))
            )
        )
        return bool(targets) and all(_returns_tensor_dataset(t) for t in targets)

    def _in_memory_in(self, func: cst.FunctionDef, value: cst.BaseExpression) -> bool:
        """`value` (returned by `func`) is a TensorDataset built there."""
        if isinstance(value, cst.Name):
            built = [
                a.value
                for a in nodes_of_type(func, cst.Assign)
                if any(is_name(t.target, value.value) for t in a.targets)
            ]
            return bool(built) and all(self._in_memory_in(func, b) for b in built)
        return isinstance(value, cst.Call) and self.refers_to(value.func, *_TENSOR_DATASET)

    def _function(self, func: cst.BaseExpression) -> cst.FunctionDef | None:
        """The module-level function of this file that `func` names."""
        if not isinstance(func, cst.Name):
            return None
        return next(
            (
                d
                for d in self.context.module.body
                if isinstance(d, cst.FunctionDef) and d.name.value == func.value
            ),
            None,
        )

    def _arguments_for(self, dataset: cst.BaseExpression | None) -> list[cst.BaseExpression]:
        """What every call in the file passes for the parameter `dataset` of the module-level
        function around it (empty when it is not a parameter or a call passes nothing)."""
        if not isinstance(dataset, cst.Name):
            return []
        scope = self.facts.enclosing_scope(dataset)
        if not isinstance(scope, cst.FunctionDef) or scope not in self.context.module.body:
            return []
        params = [p.name.value for p in scope.params.params]
        if dataset.value not in params:
            return []
        position = params.index(dataset.value)
        found = []
        for call in nodes_of_type(self.context.module, cst.Call):
            if not is_name(call.func, scope.name.value):
                continue
            given = arg(call, dataset.value, position)
            if given is None:
                return []
            found.append(given.value)
        return found

    def _unsharded_iterable_dataset(self, dataset: cst.BaseExpression | None) -> bool:
        """The dataset is an instance of a file-local IterableDataset subclass that never asks
        `get_worker_info()` how to split the stream between workers."""
        if dataset is None:
            return False
        call = dataset if isinstance(dataset, cst.Call) else self._assigned_call(dataset)
        if call is None or not isinstance(call.func, cst.Name):
            return False
        for node in walk(self.context.module):
            if isinstance(node, cst.ClassDef) and node.name.value == call.func.value:
                iterable = any(self.refers_to(b.value, *_ITERABLE_DATASET) for b in node.bases)
                shards = any(is_name(n, "get_worker_info") for n in walk(node)) or any(
                    isinstance(n, cst.Attribute) and n.attr.value == "get_worker_info"
                    for n in walk(node)
                )
                return iterable and not shards
        return False

    def _assigned_call(self, expr: cst.BaseExpression) -> cst.Call | None:
        if not isinstance(expr, cst.Name):
            return None
        for node in nodes_of_type(self.context.module, cst.Assign):
            if isinstance(node.value, cst.Call) and any(
                is_name(t.target, expr.value) for t in node.targets
            ):
                return node.value
            # `train_dataset, valid_dataset = TensorDataset(...), TensorDataset(...)`
            for target in node.targets:
                if isinstance(target.target, cst.Tuple) and isinstance(node.value, cst.Tuple):
                    pairs = zip(target.target.elements, node.value.elements, strict=False)
                    for name, value in pairs:
                        if is_name(name.value, expr.value) and isinstance(value.value, cst.Call):
                            return value.value
        return None

    def _unguarded_module_level(self, node: cst.CSTNode) -> bool:
        """Created at module level, outside `if __name__ == "__main__":`."""
        for anc in self.facts.ancestors(node):
            if isinstance(anc, cst.FunctionDef | cst.ClassDef):
                return False
            if isinstance(anc, cst.If) and _is_main_guard(anc.test):
                return False
        return True


def _returns_tensor_dataset(target: Target) -> bool:
    """Every `return` of the project function `target` is a `TensorDataset(...)` built there
    (directly, or a local name bound only to one)."""
    index = None if target.is_class else load_index(target.path)
    func = index.functions.get(target.qualname) if index is not None else None
    if func is None or not func.returns:
        return False

    def built(value: Value) -> bool:
        return value.kind == "call" and value.dotted[-1:] == ("TensorDataset",)

    return all(
        built(value)
        or (
            value.kind == "ref"
            and len(value.dotted) == 1
            and bool(func.assigns.get(value.dotted[0]))
            and all(built(bound) for bound in func.assigns[value.dotted[0]])
        )
        for value in func.returns
    )


def _first_arg(call: cst.Call) -> cst.BaseExpression | None:
    first = call.args[0] if call.args else None
    return first.value if first is not None and first.keyword is None and not first.star else None


def _is_main_guard(test: cst.BaseExpression) -> bool:
    return (
        isinstance(test, cst.Comparison)
        and is_name(test.left, "__name__")
        and any(string_value(c.comparator) == "__main__" for c in test.comparisons)
    )
