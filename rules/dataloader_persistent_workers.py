"""AO104: worker processes torn down and restarted at every epoch."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.loops import holders_of
from autoopt.lint.program.project_facts import unpassed_default
from autoopt.lint.program.torch_api import DATALOADER
from autoopt.lint.tree.calls import arg, call_options, holder_name, with_keyword
from autoopt.lint.tree.nodes import (
    calls_in,
    contains,
    dotted,
    int_literal,
    is_name,
    names_in,
    nodes_of_type,
    walk,
)


class DataLoaderPersistentWorkers(Rule):
    """
    ## What it does
    Flags a `torch.utils.data.DataLoader` with `num_workers > 0` and no `persistent_workers`
    that is iterated inside an epoch loop (a loop around the loop over the loader, or a loop
    that passes the loader to a function each time round), or that a Lightning module's
    `train_dataloader()` returns (the Trainer iterates it every epoch), also a
    LightningDataModule of another module handed to `trainer.fit(model, data_module)`
    (AdaFace's data.py). A dict of loaders built in place (`dataloaders = {split:
    DataLoader(...) for ...}`, returned by a factory whose callers hand
    `dataloaders["train"]` to the epoch loop) counts as its loaders.

    ## Why
    Without `persistent_workers=True` every `iter(loader)` — every epoch — shuts the worker
    processes down and starts new ones, each re-importing torch and unpickling the dataset. That
    start-up costs from a fraction of a second to tens of seconds per epoch on large datasets,
    during which the accelerator idles. Persistent workers are started once and reused.

    ## When not to
    - `num_workers=0`: `persistent_workers=True` is a `ValueError` there (also the 0 a loader
      factory's parameter defaults to when no call passes it: AO101's case). A literal worker count
      must be positive; a variable count (`args.workers`) gets `persistent_workers=args.workers > 0`;
      a count that `**kwargs` sets on some paths only (`{"num_workers": 1} if use_cuda else {}`)
      is reported without a fix.
    - A loader that is iterated only once, or created anew inside the epoch loop: nothing to keep.
    - Options hidden in `**kwargs` that are not a literal dict in the same scope.
    - Workers that must see per-epoch changes to the dataset object made in the main process
      (persistent workers keep their own copy): such scripts should not adopt it.

    ## Fix (unsafe)
    Adds `persistent_workers=True` (or `=<count> > 0`). Unsafe because it changes which batches
    come from epoch 2 on: every new (non-persistent) iterator draws the workers' `base_seed`
    from the main process's global RNG, a persistent loader draws it once and then resets its
    iterator. The `RandomSampler`'s per-epoch seed then comes from another RNG state, so the
    shuffle order of epoch 2 onward (and the workers' random augmentation) differs from the
    script's (`tests/lint/test_persistent_workers_rng.py` shows it on a real DataLoader). The
    runtime `autoopt.optimize()` keeps the order by drawing that seed itself; a one-line edit
    cannot.
    """

    code = "AO104"
    name = "dataloader-persistent-workers"
    message = "DataLoader restarts its worker processes every epoch; set persistent_workers=True"
    fix_safety = FixSafety.UNSAFE
    fix_reason = (
        "the main process draws the workers' base seed once instead of every epoch, so the "
        "shuffle order from epoch 2 on differs from the script's"
    )
    covered_by_optimize = True  # autoopt.optimize() applies it at run time
    triggers = ("DataLoader",)
    requires = ("num_workers",)

    VALID = [
        Valid(  # a Lightning validation loader: how often it runs is the Trainer's setting
            """
            import lightning as L
            from torch.utils.data import DataLoader

            class NeRFSystem(L.LightningModule):
                def val_dataloader(self):
                    return DataLoader(self.val_dataset, batch_size=1, num_workers=4)
            """
        ),
        Valid(  # a trainer's loader read once by a method nothing calls in a loop
            """
            import torch
            class Trainer:
                def __init__(self, val_set):
                    self.val_loader = torch.utils.data.DataLoader(val_set, num_workers=4)
                def validation(self):
                    for image, target in self.val_loader:
                        evaluate(image, target)
            """
        ),
        Valid(  # no workers: persistent_workers would raise
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32)
            for epoch in range(10):
                for x in loader:
                    model(x).sum().backward()
            """
        ),
        Valid(  # a single pass
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=4)
            for x in loader:
                model(x).sum().backward()
            """
        ),
        Valid(  # loader rebuilt every epoch
            """
            from torch.utils.data import DataLoader
            for epoch in range(10):
                loader = DataLoader(ds, batch_size=32, num_workers=4)
                for x in loader:
                    model(x).sum().backward()
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, num_workers=4, persistent_workers=True)
            for epoch in range(10):
                for x in loader:
                    model(x).sum().backward()
            """
        ),
    ]
    INVALID = [
        Invalid(  # DANet's train_dist.py: an epoch function nested in the scope of the loader
            """
            from torch.utils.data import DataLoader
            def main_worker(args):
                trainloader = DataLoader(trainset, batch_size=8, num_workers=4)
                def training(epoch):
                    for image, target in trainloader:
                        model(image.cuda()).sum().backward()
                for epoch in range(args.epochs):
                    training(epoch)
            """,
            line=3,
            fixed="""
            from torch.utils.data import DataLoader
            def main_worker(args):
                trainloader = DataLoader(trainset, batch_size=8, num_workers=4, persistent_workers=True)
                def training(epoch):
                    for image, target in trainloader:
                        model(image.cuda()).sum().backward()
                for epoch in range(args.epochs):
                    training(epoch)
            """,
            unsafe=True,
        ),
        Invalid(  # DANet's train.py: a trainer's method loops over its loader (through tqdm),
            # and the script calls it on its instance every epoch
            """
            from torch.utils.data import DataLoader
            from tqdm import tqdm
            class Trainer:
                def __init__(self, args):
                    self.trainloader = DataLoader(trainset, batch_size=8, num_workers=4)
                def training(self, epoch):
                    tbar = tqdm(self.trainloader)
                    for i, (image, target) in enumerate(tbar):
                        model(image.cuda()).sum().backward()
            trainer = Trainer(args)
            for epoch in range(args.epochs):
                trainer.training(epoch)
            """,
            line=5,
            fixed="""
            from torch.utils.data import DataLoader
            from tqdm import tqdm
            class Trainer:
                def __init__(self, args):
                    self.trainloader = DataLoader(trainset, batch_size=8, num_workers=4, persistent_workers=True)
                def training(self, epoch):
                    tbar = tqdm(self.trainloader)
                    for i, (image, target) in enumerate(tbar):
                        model(image.cuda()).sum().backward()
            trainer = Trainer(args)
            for epoch in range(args.epochs):
                trainer.training(epoch)
            """,
            unsafe=True,
        ),
        Invalid(  # loaders kept in a dict the epoch loop picks from (brain-segmentation)
            """
            from torch.utils.data import DataLoader
            def main(epochs):
                loader_train = DataLoader(train_set, batch_size=16, num_workers=4)
                loaders = {"train": loader_train}
                for epoch in range(epochs):
                    for phase in ["train"]:
                        for data in loaders[phase]:
                            model(data.cuda()).sum().backward()
            """,
            line=3,
            fixed="""
            from torch.utils.data import DataLoader
            def main(epochs):
                loader_train = DataLoader(train_set, batch_size=16, num_workers=4, persistent_workers=True)
                loaders = {"train": loader_train}
                for epoch in range(epochs):
                    for phase in ["train"]:
                        for data in loaders[phase]:
                            model(data.cuda()).sum().backward()
            """,
            unsafe=True,
        ),
        Invalid(  # a dict of loaders built split by split, picked from every epoch (pvcnn)
            """
            from torch.utils.data import DataLoader
            def main(epochs):
                loaders = {}
                for split in dataset:
                    loaders[split] = DataLoader(dataset[split], batch_size=8, num_workers=4)
                for epoch in range(epochs):
                    train(model, loader=loaders["train"])
            """,
            line=5,
            fixed="""
            from torch.utils.data import DataLoader
            def main(epochs):
                loaders = {}
                for split in dataset:
                    loaders[split] = DataLoader(dataset[split], batch_size=8, num_workers=4, persistent_workers=True)
                for epoch in range(epochs):
                    train(model, loader=loaders["train"])
            """,
            unsafe=True,
        ),
        Invalid(  # the hook installed in __init__ (latent-diffusion's DataModuleFromConfig)
            """
            import pytorch_lightning as pl
            from torch.utils.data import DataLoader

            class DataModuleFromConfig(pl.LightningDataModule):
                def __init__(self, train=None):
                    super().__init__()
                    if train is not None:
                        self.train_dataloader = self._train_dataloader

                def _train_dataloader(self):
                    return DataLoader(self.train_set, batch_size=8, num_workers=4)
            """,
            line=11,
            fixed="""
            import pytorch_lightning as pl
            from torch.utils.data import DataLoader

            class DataModuleFromConfig(pl.LightningDataModule):
                def __init__(self, train=None):
                    super().__init__()
                    if train is not None:
                        self.train_dataloader = self._train_dataloader

                def _train_dataloader(self):
                    return DataLoader(self.train_set, batch_size=8, num_workers=4, persistent_workers=True)
            """,
            unsafe=True,
        ),
        Invalid(  # Lightning's Trainer iterates what train_dataloader() returns every epoch
            """
            import lightning as L
            from torch.utils.data import DataLoader

            class NeRFSystem(L.LightningModule):
                def train_dataloader(self):
                    return DataLoader(self.train_dataset, shuffle=True, num_workers=4)
            """,
            line=6,
            fixed="""
            import lightning as L
            from torch.utils.data import DataLoader

            class NeRFSystem(L.LightningModule):
                def train_dataloader(self):
                    return DataLoader(self.train_dataset, shuffle=True, num_workers=4, persistent_workers=True)
            """,
            unsafe=True,
        ),
        Invalid(  # a trainer's validation loader, re-read every few hundred iterations (Tramac)
            """
            import torch
            class Trainer:
                def __init__(self, args, val_set):
                    self.val_loader = torch.utils.data.DataLoader(val_set, num_workers=4)
                def train(self, loader):
                    for i, batch in enumerate(loader):
                        step(batch)
                        if i % 500 == 0:
                            self.validation()
                def validation(self):
                    for image, target in self.val_loader:
                        evaluate(image, target)
            """,
            line=4,
            fixed="""
            import torch
            class Trainer:
                def __init__(self, args, val_set):
                    self.val_loader = torch.utils.data.DataLoader(val_set, num_workers=4, persistent_workers=True)
                def train(self, loader):
                    for i, batch in enumerate(loader):
                        step(batch)
                        if i % 500 == 0:
                            self.validation()
                def validation(self):
                    for image, target in self.val_loader:
                        evaluate(image, target)
            """,
            unsafe=True,
        ),
        Invalid(  # the count from the command line through int() (crnn.pytorch)
            """
            import torch
            loader = torch.utils.data.DataLoader(ds, num_workers=int(opt.workers))
            for epoch in range(10):
                it = iter(loader)
                train_batch(next(it))
            """,
            line=2,
            fixed="""
            import torch
            loader = torch.utils.data.DataLoader(ds, num_workers=int(opt.workers), persistent_workers=int(opt.workers) > 0)
            for epoch in range(10):
                it = iter(loader)
                train_batch(next(it))
            """,
            unsafe=True,
        ),
        Invalid(
            """
            import torch
            loader = torch.utils.data.DataLoader(ds, batch_size=32, num_workers=4)
            for epoch in range(10):
                for x, y in loader:
                    loss = model(x).sum()
                    loss.backward()
            """,
            line=2,
            fixed="""
            import torch
            loader = torch.utils.data.DataLoader(ds, batch_size=32, num_workers=4, persistent_workers=True)
            for epoch in range(10):
                for x, y in loader:
                    loss = model(x).sum()
                    loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            def main(args):
                train_loader = DataLoader(ds, batch_size=64, num_workers=args.workers)
                for epoch in range(args.epochs):
                    train_one_epoch(model, train_loader, optimizer)
            """,
            line=3,
            fixed="""
            from torch.utils.data import DataLoader
            def main(args):
                train_loader = DataLoader(ds, batch_size=64, num_workers=args.workers, persistent_workers=args.workers > 0)
                for epoch in range(args.epochs):
                    train_one_epoch(model, train_loader, optimizer)
            """,
            unsafe=True,
        ),
        Invalid(  # the workers exist on CUDA only: no fix, persistent_workers=True raises on CPU
            """
            from torch.utils.data import DataLoader
            def main(args):
                kwargs = {"num_workers": 1, "pin_memory": True} if args.cuda else {}
                train_loader = DataLoader(ds, batch_size=64, shuffle=True, **kwargs)
                for epoch in range(args.epochs):
                    for x, y in train_loader:
                        model(x).sum().backward()
            """,
            line=4,
            unsafe=True,
        ),
        Invalid(  # an update under `if` sets the count on some paths only: no fix
            """
            from torch.utils.data import DataLoader
            def main(args):
                train_kwargs = {"batch_size": 64}
                if args.cuda:
                    train_kwargs.update({"num_workers": 1, "pin_memory": True})
                train_loader = DataLoader(ds, **train_kwargs)
                for epoch in range(args.epochs):
                    for x, y in train_loader:
                        model(x).sum().backward()
            """,
            line=6,
            unsafe=True,
        ),
        Invalid(  # the same count on both paths: the fix is safe to write
            """
            from torch.utils.data import DataLoader
            def main(args):
                kwargs = {"num_workers": 4, "pin_memory": True} if args.cuda else {"num_workers": 4}
                train_loader = DataLoader(ds, **kwargs)
                for epoch in range(args.epochs):
                    for x, y in train_loader:
                        model(x).sum().backward()
            """,
            line=4,
            fixed="""
            from torch.utils.data import DataLoader
            def main(args):
                kwargs = {"num_workers": 4, "pin_memory": True} if args.cuda else {"num_workers": 4}
                train_loader = DataLoader(ds, **kwargs, persistent_workers=True)
                for epoch in range(args.epochs):
                    for x, y in train_loader:
                        model(x).sum().backward()
            """,
            unsafe=True,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, *DATALOADER):
            return
        options = call_options(self, node)
        workers = options.values.get("num_workers")
        if workers is None or not options.known_missing("persistent_workers"):
            return
        count = int_literal(workers)
        if count is None and (unpassed := unpassed_default(self, node, workers)) is not None:
            count = unpassed[0] if isinstance(unpassed[0], int) else None  # autovc's get_loader
        if count is not None:
            if count <= 0:
                return
            value: cst.BaseExpression = cst.Name("True")
        elif isinstance(workers, cst.Name | cst.Attribute | cst.Subscript) or (
            isinstance(workers, cst.Call) and _is_int_of_a_setting(workers)
        ):
            # a variable count may be 0 at run time, where persistent_workers=True would raise
            value = cst.Comparison(
                left=workers.deep_clone(),
                comparisons=[
                    cst.ComparisonTarget(operator=cst.GreaterThan(), comparator=cst.Integer("0"))
                ],
            )
        else:
            return
        name = holder_name(self, node) or _self_attribute(self, node) or _dict_entry(self, node)
        if self._lightning_train_loader(node):
            name = name or "train_dataloader"  # the Trainer iterates it every epoch
        elif name is None or not self._iterated_every_epoch(node, name):
            return
        dataset = arg(node, "dataset", 0)
        dataset_name = dotted(dataset.value) if dataset is not None else None
        if self.context.program.changed_between_epochs(name, dataset_name):
            return  # persistent workers would keep the first epoch's copy of the dataset
        if "num_workers" in options.conditional:
            # `**kwargs` sets the count on some paths only (`{...} if cuda else {}`): where it
            # is 0, persistent_workers=True raises ValueError, and no expression names it
            self.report(node)
            return
        new_call = with_keyword(node, "persistent_workers", value)
        self.report(
            node, fix=Fix(replacements={node: new_call}, description="persistent_workers=True")
        )

    def _lightning_train_loader(self, call: cst.Call) -> bool:
        """`return DataLoader(...)` from a Lightning module's `train_dataloader()` hook: the
        Trainer iterates it once per epoch (nerf_pl); also from a method the class installs as
        that hook (`self.train_dataloader = self._train_dataloader`, latent-diffusion)."""
        scope = self.facts.enclosing_scope(call)
        return (
            isinstance(self.parent(call), cst.Return)
            and isinstance(scope, cst.FunctionDef)
            and (
                scope.name.value == "train_dataloader"
                or f"self.train_dataloader = self.{scope.name.value}\n" in self.context.source
            )
            and "lightning" in self.context.source
        )

    def _iterated_every_epoch(self, call: cst.Call, name: str) -> bool:
        """`name` is used inside the body of a loop that does not itself create the loader, or
        handed to the project's code that iterates it epoch after epoch (the program model)."""
        scope = self.facts.enclosing_scope(call)
        names = {name, *holders_of(self, name)}  # also `loaders[phase]`, a dict holding it
        # a function nested in the scope that reads it (DANet's `def training(epoch)` inside
        # `main_worker`, looping over the enclosing `trainloader`)
        readers = {
            f.name.value
            for f in nodes_of_type(scope, cst.FunctionDef)
            if f is not scope and names & names_in(f.body)
        }
        for node in nodes_of_type(scope, (cst.For, cst.While), into_scopes=False):
            if contains(node, call):
                continue
            if names & names_in(node.body) or any(
                isinstance(c.func, cst.Name) and c.func.value in readers
                for c in calls_in(node.body)
            ):
                return True
        program = self.context.program
        if name.startswith("self.") and self._iterated_by_a_method_called_in_a_loop(call, name):
            return True
        return name in program.iterated_per_epoch or program.returned_per_epoch(call, name)

    def _iterated_by_a_method_called_in_a_loop(self, call: cst.Call, name: str) -> bool:
        """A trainer class's loader (`self.val_loader`) that one of its methods loops over,
        and that method is called from inside a loop of the class (`self.validation()` every
        `val_per_iters` iterations): each call starts the workers again."""
        cls = next((a for a in self.facts.ancestors(call) if isinstance(a, cst.ClassDef)), None)
        if cls is None:
            return False
        methods = [m for m in cls.body.body if isinstance(m, cst.FunctionDef)]

        def reads(expr: cst.CSTNode, aliases: set[str]) -> bool:
            return any(
                dotted(n) == name if isinstance(n, cst.Attribute) else n.value in aliases
                for n in walk(expr)
                if isinstance(n, cst.Attribute | cst.Name)
            )

        readers = set()
        for m in methods:
            # `tbar = tqdm(self.trainloader)`, then `for i, batch in enumerate(tbar)` (DANet)
            aliases = {
                target.target.value
                for assign in nodes_of_type(m, cst.Assign)
                if reads(assign.value, set())
                for target in assign.targets
                if isinstance(target.target, cst.Name)
            }
            if any(reads(loop.iter, aliases) for loop in nodes_of_type(m, cst.For)):
                readers.add(m.name.value)
        if not readers:
            return False
        # ... or on an instance the file builds, inside a loop (DANet's `trainer =
        # Trainer(args)`, then `trainer.training(epoch)` for each epoch)
        holders = {"self"} | {
            target.target.value
            for assign in nodes_of_type(self.context.module, cst.Assign)
            if isinstance(assign.value, cst.Call) and is_name(assign.value.func, cls.name.value)
            for target in assign.targets
            if isinstance(target.target, cst.Name)
        }
        called = {f"{h}.{r}" for h in holders for r in readers}
        return any(
            isinstance(c.func, cst.Attribute) and dotted(c.func) in called
            for loop in nodes_of_type(self.context.module, (cst.For, cst.While))
            for c in calls_in(loop.body)
        )


def _is_int_of_a_setting(call: cst.Call) -> bool:
    """`int(opt.workers)`: a count read from the command line."""
    return (
        isinstance(call.func, cst.Name)
        and call.func.value == "int"
        and len(call.args) == 1
        and isinstance(call.args[0].value, cst.Name | cst.Attribute | cst.Subscript)
    )


def _self_attribute(rule: Rule, call: cst.Call) -> str | None:
    """`self.val_loader = call` -> "self.val_loader" (a trainer class's loader)."""
    parent = rule.parent(call)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        target = dotted(parent.targets[0].target)
        if target is not None and target.startswith("self.") and target.count(".") == 1:
            return target
    return None


def _dict_entry(rule: Rule, call: cst.Call) -> str | None:
    """`loaders[split] = call` -> "loaders": a dict of loaders built split by split, which
    the epoch loop picks from (`train(model, loader=loaders["train"])`, pvcnn)."""
    parent = rule.parent(call)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        target = parent.targets[0].target
        if isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name):
            return target.value.value
    return None
