"""AO102: batches copied to CUDA from pageable host memory."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.handled import library_moves_batches, library_places_batches
from autoopt.lint.program.loops import (
    batch_transfers,
    data_loops,
    evaluation_only_loader,
    loops_over,
)
from autoopt.lint.program.project_facts import own_to_classes
from autoopt.lint.program.torch_api import DATALOADER, torch_name
from autoopt.lint.rewrite.fixes.preconditions import device_is_cuda
from autoopt.lint.tree.calls import arg, assigned_name, call_options, holder_name, with_keyword
from autoopt.lint.tree.nodes import dotted, is_name, nodes_of_type


class DataLoaderPinMemory(Rule):
    """
    ## What it does
    Flags a `torch.utils.data.DataLoader` without `pin_memory` in a script that moves its batches
    to the GPU (`batch.to(device)`, `.cuda()`, the legacy `imgs.type(torch.cuda.FloatTensor)`
    inside the loop over the loader, or ignite's `create_supervised_trainer(..., device=device)`,
    which copies every batch itself). The device may come from CUDA, `torch.accelerator`, a
    `--device` flag or a `device` parameter (see `autoopt.lint.program.device`). A `DataLoader`
    subclass of another module of the project (pytorch-template's `MnistDataLoader`, whose
    base hands its options to `DataLoader.__init__`) is reported where the script builds it
    when none of its modules names `pin_memory` (without a fix: the option goes in the
    class). A loader factory that names no device itself is reported when it returns the
    loader and the project's callers move its batches to the device (PatchTST's
    `data_provider`, whose loader `Exp_Main.train` feeds to CUDA), also one of a dict of
    loaders it returns (egnn's `retrieve_dataloaders`, whose caller hands
    `dataloaders["train"]` to its training, directly or from a `main()` reading the
    module's global); its fix tests
    `torch.cuda.is_available()`, the device being its callers'. So is a loader of a driver
    that names no device, handed to the project's training code that copies its batches to
    CUDA (ECAPA-TDNN's `s.train_network(epoch, loader=trainLoader)`). Copies made in a loop
    inside the loop over the loader count (PSPNet's `for inputs_slice, gts_slice in
    zip(inputs, gts): ... .cuda()`), and so does a subclass of torch's DataLoader under an
    alias (`from torch.utils.data import DataLoader as TorchDataLoader`).

    ## Why
    A host-to-GPU copy from ordinary (pageable) memory is staged by the driver through a pinned
    buffer and cannot overlap with compute. With `pin_memory=True` the loader's pinning thread
    puts batches in page-locked memory, the copy runs by DMA at full PCIe bandwidth (typically
    about 2x faster than from pageable memory) and, with `non_blocking=True` (AO103), overlaps
    with the kernels already queued (as a widely read PyTorch tutorial teaches).

    ## When not to
    - An evaluation loader beside a training loader that sets `pin_memory` (either way,
      `pin_memory=False` too): leaving it out of the evaluation loader is the author's choice
      for a held-out set (not reported).
    - Scripts with no GPU path (a CPU-only tutorial): pinning costs host memory and a thread for
      nothing. The rule only speaks when the file can run on a GPU and moves batches to a
      device.
    - Loaders handed to `accelerator.prepare(...)` (HF Accelerate) or driven by Lightning: the
      library places the batches.
    - `pin_memory=False` written explicitly is the user's choice (e.g. a host short of locked
      memory). Options in `**kwargs` are read when the dict is built in the same scope from
      literals (also `kw.update(cuda_kwargs)` and `{...} if use_cuda else {}`, where a key set
      on either branch counts as set); other `**kwargs` are not assumed missing.
    - torch before 1.8 could crash with `pin_memory=True` together with
      `persistent_workers=True`: with `--target-version` below 1.8 such a loader is left alone.
    - A loader with a `collate_fn` in a project that defines a batch class with its own `.to()`
      (DETR's `NestedTensor`): its batches may be that class, which `pin_memory` leaves
      unpinned (it pins tensors and containers of them only).

    ## Fix (safe)
    Adds `pin_memory=True` where the script always trains on CUDA, and otherwise the script's
    own device test, as the runtime pins only CUDA runs: `pin_memory=device.type == "cuda"`
    where a `device` is bound before the loader, else `pin_memory=torch.cuda.is_available()`
    (`torch.accelerator.is_available()` in scripts that use `torch.accelerator`), so a CPU run
    neither pins nor gets torch's warning. Batches hold the same values; only where they live
    on the host changes.
    """

    code = "AO102"
    name = "dataloader-pin-memory"
    message = "DataLoader feeds a CUDA device from pageable memory; set pin_memory=True"
    fix_safety = FixSafety.SAFE
    fix_reason = "pinning changes where the batch lives on the host, not its values"
    covered_by_optimize = True  # autoopt.optimize() applies it at run time
    triggers = ("DataLoader",)
    # no text `requires`: a loader factory of a CUDA program may name no device itself

    VALID = [
        Valid(  # a collate of the project's batch class (DETR's NestedTensor): not pinned
            """
            import torch
            from torch.utils.data import DataLoader
            class NestedTensor:
                def __init__(self, tensors, mask):
                    self.tensors, self.mask = tensors, mask
                def to(self, device):
                    return NestedTensor(self.tensors.to(device), self.mask.to(device))
            loader = DataLoader(dataset, batch_size=2, collate_fn=collate_fn, num_workers=2)
            for samples, targets in loader:
                loss = criterion(model(samples.to("cuda")), targets)
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # the training loader declines pinning: the evaluation one follows (open_brats)
            """
            import torch
            from torch.utils.data import DataLoader
            train_loader = DataLoader(train_ds, batch_size=8, num_workers=4, pin_memory=False)
            bench_loader = DataLoader(bench_ds, batch_size=1, num_workers=4)
            for epoch in range(10):
                for x, y in train_loader:
                    loss = model(x.cuda()).mean()
                    loss.backward()
                with torch.no_grad():
                    for x, y in bench_loader:
                        model(x.cuda())
            """
        ),
        Valid(  # MONAI's `first(check_loader)`: one batch read once, beside the training loader
            """
            import torch
            from monai.data import DataLoader
            from monai.utils import first
            device = torch.device("cuda")
            check_loader = DataLoader(check_ds, batch_size=2, num_workers=4)
            print(first(check_loader)["img"].shape)
            train_loader = DataLoader(train_ds, batch_size=2, num_workers=4, pin_memory=True)
            for epoch in range(10):
                for batch in train_loader:
                    loss = model(batch["img"].to(device, non_blocking=True)).sum()
                    loss.backward()
            """
        ),
        Valid(  # torch < 1.8 crashed with pin_memory + persistent_workers: left alone
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=4, persistent_workers=True)
            for x, y in loader:
                model(x.cuda()).sum().backward()
            """,
            target_version="1.7",
        ),
        Valid(  # ignite's trainer with no device: the batches stay on the host
            """
            import torch
            from torch.utils.data import DataLoader
            from ignite.engine import create_supervised_trainer
            device = "cuda" if torch.cuda.is_available() else "cpu"
            def get_loader(ds):
                return DataLoader(ds, batch_size=64)
            trainer = create_supervised_trainer(model, optimizer, loss_fn)
            trainer.run(get_loader(ds), max_epochs=10)
            """
        ),
        Valid(  # CPU-only script
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=4)
            for x, y in loader:
                x = x.to("cpu")
                loss = model(x).sum()
                loss.backward()
            """
        ),
        Valid(
            """
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda")
            loader = DataLoader(ds, batch_size=32, pin_memory=True)
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                loss = model(x).sum()
                loss.backward()
            """
        ),
        Valid(  # options hidden in **kwargs
            """
            import torch
            def build(ds, **loader_kwargs):
                loader = torch.utils.data.DataLoader(ds, **loader_kwargs)
                for x in loader:
                    model(x.cuda()).sum().backward()
            """
        ),
        Valid(  # pin_memory set through .update() of another literal dict (pytorch/examples)
            """
            import torch
            def main(args):
                device = torch.accelerator.current_accelerator()
                train_kwargs = {"batch_size": args.batch_size}
                if torch.accelerator.is_available():
                    accel_kwargs = {"num_workers": 1, "pin_memory": True, "shuffle": True}
                    train_kwargs.update(accel_kwargs)
                train_loader = torch.utils.data.DataLoader(dataset1, **train_kwargs)
                for data, target in train_loader:
                    model(data.to(device)).sum().backward()
            """
        ),
        Valid(  # ... or by a conditional dict
            """
            import torch
            use_cuda = torch.cuda.is_available()
            kwargs = {"num_workers": 1, "pin_memory": True} if use_cuda else {}
            loader = torch.utils.data.DataLoader(ds, batch_size=128, **kwargs)
            for data, _ in loader:
                model(data.to(device)).sum().backward()
            """
        ),
        Valid(  # Accelerate places the batches
            """
            from accelerate import Accelerator
            from torch.utils.data import DataLoader
            accelerator = Accelerator(mixed_precision="fp16")
            loader = DataLoader(ds, batch_size=32)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                batch.to(accelerator.device)
                accelerator.backward(model(**batch).loss)
            """
        ),
        Valid(  # CPU-only tutorial: no device path at all
            """
            import torch
            loader = torch.utils.data.DataLoader(ds, batch_size=100, shuffle=True)
            for images, labels in loader:
                images = images.reshape(-1, 28 * 28).to(device)
                loss = criterion(model(images), labels)
                loss.backward()
            """
        ),
        Valid(  # CUDA in the file, but batches only cast to a dtype
            """
            import torch
            from torch.utils.data import DataLoader
            model = Net().cuda()
            loader = DataLoader(ds, batch_size=32)
            for x in loader:
                x = x.to(torch.float16)
                model(x).sum().backward()
            """
        ),
        Valid(  # the evaluation loader beside a pinned training loader: the author's choice
            """
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            train_loader = DataLoader(train_set, 64, shuffle=True, pin_memory=True)
            val_loader = DataLoader(val_set, 64)
            for x, y in train_loader:
                loss_fn(model(x.to(device)), y.to(device)).backward()
                opt.step()
            model.eval()
            with torch.no_grad():
                for x, y in val_loader:
                    acc = (model(x.to(device)).argmax(1) == y.to(device)).float().mean()
            """
        ),
    ]
    INVALID = [
        Invalid(  # a step function copies the entries of the batch it is handed (GwcNet)
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(dataset, batch_size=8, num_workers=4)
            def train_sample(sample):
                imgL, imgR = sample["left"], sample["right"]
                loss = model(imgL.cuda(), imgR.cuda()).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            for epoch in range(10):
                for sample in loader:
                    train_sample(sample)
            """,
            line=2,
            fixed="""
            from torch.utils.data import DataLoader
            loader = DataLoader(dataset, batch_size=8, num_workers=4, pin_memory=True)
            def train_sample(sample):
                imgL, imgR = sample["left"], sample["right"]
                loss = model(imgL.cuda(), imgR.cuda()).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            for epoch in range(10):
                for sample in loader:
                    train_sample(sample)
            """,
        ),
        Invalid(  # the batch's slices go to the device in an inner loop (PSPNet's sliding crops)
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=8, num_workers=8, shuffle=True)
            for epoch in range(10):
                for inputs, gts in loader:
                    for inputs_slice, gts_slice in zip(inputs, gts):
                        loss = criterion(net(inputs_slice.cuda()), gts_slice.cuda())
                        loss.backward()
            """,
            line=3,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=8, num_workers=8, shuffle=True, pin_memory=True)
            for epoch in range(10):
                for inputs, gts in loader:
                    for inputs_slice, gts_slice in zip(inputs, gts):
                        loss = criterion(net(inputs_slice.cuda()), gts_slice.cuda())
                        loss.backward()
            """,
        ),
        Invalid(  # PyG's DataLoader hands its options to torch's (ogb, GraphCL)
            """
            import torch
            from torch_geometric.loader import DataLoader
            device = torch.device("cuda")
            loader = DataLoader(dataset, batch_size=128, shuffle=True, num_workers=4)
            for epoch in range(10):
                for data in loader:
                    loss = model(data.to(device, non_blocking=True)).sum()
                    loss.backward()
            """,
            line=4,
            fixed="""
            import torch
            from torch_geometric.loader import DataLoader
            device = torch.device("cuda")
            loader = DataLoader(dataset, batch_size=128, shuffle=True, num_workers=4, pin_memory=True)
            for epoch in range(10):
                for data in loader:
                    loss = model(data.to(device, non_blocking=True)).sum()
                    loss.backward()
            """,
        ),
        Invalid(  # batches drawn through a generator that re-iterates the loader (pytorch-ddpm)
            """
            import torch
            device = torch.device("cuda:0")
            def infiniteloop(dataloader):
                while True:
                    for x, y in iter(dataloader):
                        yield x
            dataloader = torch.utils.data.DataLoader(dataset, batch_size=128, num_workers=4)
            looper = infiniteloop(dataloader)
            for step in range(1000):
                x_0 = next(looper).to(device)
                model(x_0).mean().backward()
            """,
            line=7,
            fixed="""
            import torch
            device = torch.device("cuda:0")
            def infiniteloop(dataloader):
                while True:
                    for x, y in iter(dataloader):
                        yield x
            dataloader = torch.utils.data.DataLoader(dataset, batch_size=128, num_workers=4, pin_memory=True)
            looper = infiniteloop(dataloader)
            for step in range(1000):
                x_0 = next(looper).to(device)
                model(x_0).mean().backward()
            """,
        ),
        Invalid(  # torch < 1.8 without persistent_workers: pinning alone is fine
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=4)
            for x, y in loader:
                model(x.cuda()).sum().backward()
            """,
            line=3,
            target_version="1.7",
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=4, pin_memory=True)
            for x, y in loader:
                model(x.cuda()).sum().backward()
            """,
        ),
        Invalid(  # ignite's trainer copies the batches to the device (ignite's mnist example)
            """
            import torch
            from torch.utils.data import DataLoader
            from ignite.engine import create_supervised_trainer
            device = "cuda" if torch.cuda.is_available() else "cpu"
            def get_loader(ds):
                return DataLoader(ds, batch_size=64)
            trainer = create_supervised_trainer(model, optimizer, loss_fn, device=device)
            trainer.run(get_loader(ds), max_epochs=10)
            """,
            line=6,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            from ignite.engine import create_supervised_trainer
            device = "cuda" if torch.cuda.is_available() else "cpu"
            def get_loader(ds):
                return DataLoader(ds, batch_size=64, pin_memory=torch.device(device).type == "cuda")
            trainer = create_supervised_trainer(model, optimizer, loss_fn, device=device)
            trainer.run(get_loader(ds), max_epochs=10)
            """,
        ),
        Invalid(  # legacy CUDA idioms (PyTorch-GAN)
            """
            import torch
            from torch.utils.data import DataLoader
            cuda = True if torch.cuda.is_available() else False
            Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
            dataloader = DataLoader(dataset, batch_size=64, shuffle=True)
            for epoch in range(200):
                for i, (imgs, _) in enumerate(dataloader):
                    real_imgs = Variable(imgs.type(Tensor))
                    loss = adversarial_loss(discriminator(real_imgs), valid)
                    loss.backward()
            """,
            line=5,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            cuda = True if torch.cuda.is_available() else False
            Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
            dataloader = DataLoader(dataset, batch_size=64, shuffle=True, pin_memory=torch.cuda.is_available())
            for epoch in range(200):
                for i, (imgs, _) in enumerate(dataloader):
                    real_imgs = Variable(imgs.type(Tensor))
                    loss = adversarial_loss(discriminator(real_imgs), valid)
                    loss.backward()
            """,
        ),
        Invalid(  # torch.accelerator; kwargs grown with .update() lack pin_memory
            """
            import torch
            def main(args):
                device = torch.accelerator.current_accelerator()
                train_kwargs = {"batch_size": args.batch_size}
                if torch.accelerator.is_available():
                    train_kwargs.update({"num_workers": 1, "shuffle": True})
                train_loader = torch.utils.data.DataLoader(dataset1, **train_kwargs)
                for data, target in train_loader:
                    data = data.to(device)
                    model(data).sum().backward()
            """,
            line=7,
            fixed="""
            import torch
            def main(args):
                device = torch.accelerator.current_accelerator()
                train_kwargs = {"batch_size": args.batch_size}
                if torch.accelerator.is_available():
                    train_kwargs.update({"num_workers": 1, "shuffle": True})
                train_loader = torch.utils.data.DataLoader(dataset1, **train_kwargs, pin_memory=torch.accelerator.is_available())
                for data, target in train_loader:
                    data = data.to(device)
                    model(data).sum().backward()
            """,
        ),
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            loader = DataLoader(ds, batch_size=32, shuffle=True)
            for inputs, labels in loader:
                inputs, labels = inputs.to(device), labels.to(device)
                loss = criterion(model(inputs), labels)
                loss.backward()
            """,
            line=4,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            loader = DataLoader(ds, batch_size=32, shuffle=True, pin_memory=device.type == "cuda")
            for inputs, labels in loader:
                inputs, labels = inputs.to(device), labels.to(device)
                loss = criterion(model(inputs), labels)
                loss.backward()
            """,
        ),
        Invalid(
            """
            import torch.utils.data as tud
            def train(model, ds, opt):
                kw = {"batch_size": 8, "num_workers": 2}
                loader = tud.DataLoader(ds, **kw)
                for epoch in range(3):
                    for i, data in enumerate(loader):
                        x = data[0].cuda()
                        model(x).mean().backward()
            """,
            line=4,
            fixed="""
            import torch.utils.data as tud
            def train(model, ds, opt):
                kw = {"batch_size": 8, "num_workers": 2}
                loader = tud.DataLoader(ds, **kw, pin_memory=True)
                for epoch in range(3):
                    for i, data in enumerate(loader):
                        x = data[0].cuda()
                        model(x).mean().backward()
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        program = self.context.program
        if not self.is_call_to(node, *DATALOADER):
            if program.gpu_path:
                self._project_loader_class(node)
            return
        factory = self._returned_to_cuda_training(node) or self._handed_to_cuda_training(node)
        if not (program.gpu_path or factory):
            return
        if library_places_batches(self):
            return
        options = call_options(self, node)
        if not options.known_missing("pin_memory"):
            return
        version = self.context.target_version
        persistent = options.values.get("persistent_workers")
        if version is not None and version < (1, 8) and not _false(persistent):
            return  # pin_memory + persistent_workers crashed before torch 1.8
        if not (factory or self._moves_batches_to_device(node)):
            return
        if self.context.program.dataset_on_device(node):
            return  # its samples are on the device already: nothing to pin
        if arg(node, "collate_fn") is not None and own_to_classes(self):
            # the project's collate may make batches of its own class (DETR's NestedTensor,
            # with a `.to()` of its own): pin_memory pins tensors only, not such a batch
            return
        if evaluation_only_loader(self, node, "pin_memory"):
            return  # the training loader sets it, this evaluation one does not: a choice
        # Pin only on runs that use CUDA, decided as the script decides its device: torch warns
        # on every CPU run of a loader that pins without an accelerator.
        cuda = device_is_cuda(self, node)
        if factory and not program.gpu_path:  # the device is the callers': test it here
            cuda = (f"{torch_name(self)[0]}.cuda.is_available()", torch_name(self)[1])
        value, imports = ("True", ()) if cuda is None else cuda
        new_call = with_keyword(node, "pin_memory", cst.parse_expression(value))
        self.report(
            node,
            fix=Fix(
                replacements={node: new_call},
                description=f"pin_memory={value}",
                add_imports=imports,
            ),
        )

    def _returned_to_cuda_training(self, call: cst.Call) -> bool:
        """A loader factory of a CUDA training program, which names no device itself: it
        returns the loader, and its callers move the batches to a device (SPADE's
        `data.create_dataloader(opt)`)."""
        program = self.context.program
        name = holder_name(self, call)  # a loader, or a dict of them (egnn's `dataloaders`)
        returned = (
            name is not None and program.returned_to_device(call, name)
        ) or self._returned_directly(call)
        return returned and program.serves_cuda_training

    def _handed_to_cuda_training(self, call: cst.Call) -> bool:
        """A loader of a driver that names no device, handed to the project's training code
        that moves its batches to CUDA (ECAPA-TDNN's `s.train_network(epoch, loader=
        trainLoader)`, whose loop calls `data.cuda()`)."""
        program = self.context.program
        name = holder_name(self, call)
        return (
            name is not None
            and self.context.facts.device.no_device
            and program.batches_moved_by_callee(name)
            and program.runs_on_cuda
        )

    def _returned_directly(self, call: cst.Call) -> bool:
        """`return DataLoader(...)` whose callers move its batches to a device."""
        if not isinstance(self.parent(call), cst.Return):
            return False
        return self.context.program.returned_to_device(call, "")

    def _project_loader_class(self, call: cst.Call) -> None:
        """`MnistDataLoader(...)`: a DataLoader subclass of the project whose modules never
        name pin_memory. Reported where the script builds it (no fix: the option belongs in
        the class's own DataLoader call)."""
        leaf = (dotted(call.func) or "").rsplit(".", 1)[-1]
        if not leaf[:1].isupper():  # a class, by Python's naming
            return
        if arg(call, "pin_memory") is not None or any(a.star == "**" for a in call.args):
            return  # handed on to its DataLoader (MACE's `pin_memory=args.pin_memory`)
        found = self.context.program.loader_class_without(call, "pin_memory")
        if found is None or library_places_batches(self):
            return
        if not self._moves_batches_to_device(call):
            return
        if evaluation_only_loader(self, call, "pin_memory"):
            return
        name, where, line = found
        self.report(
            call,
            f"`{name}` ({where}:{line}) is a DataLoader that feeds a CUDA device from pageable "
            "memory; pass pin_memory=True to its DataLoader",
        )

    def _moves_batches_to_device(self, call: cst.Call) -> bool:
        """The loops over this loader move their batches to a device; when the loader's loops
        cannot be found (it is handed to another function), any batch loop of the file counts."""
        name = assigned_name(self, call)
        loops = loops_over(self, name) if name else []
        if loops and any(batch_transfers(self, loop) for loop in loops):
            return True
        if loops and any(  # `for inputs_slice, gts_slice in zip(inputs, gts):` (PSPNet's)
            batch_transfers(self, inner)
            for inner in data_loops(self)
            if any(outer in self.facts.ancestors(inner) for outer in loops)
        ):
            return True
        if not loops or (name is not None and self._wrapped(name)):
            if library_moves_batches(self):  # ignite's create_supervised_trainer(device=...)
                return True
            if name is not None and self.context.program.batches_moved_by_callee(name):
                return True  # a trainer of the project copies them: `Trainer(model, loader)`
            # handed to another function, or to a generator the training loop draws from
            # (`looper = infiniteloop(loader)`, then `next(looper).to(device)`)
            return any(batch_transfers(self, loop) for loop in data_loops(self))
        return False

    def _wrapped(self, name: str) -> bool:
        """The loader is bound into a generator of the file's own (`infiniteloop(loader)`,
        `cycle(loader)`) that a loop draws from with `next(...)`."""
        for call in nodes_of_type(self.context.module, cst.Call):
            if any(isinstance(a.value, cst.Name) and a.value.value == name for a in call.args):
                holder = self.parent(call)
                bound = _bound(holder) if isinstance(holder, cst.Assign) else ""
                if bound and f"next({bound})" in self.context.source:
                    return True
        return False


def _bound(assign: cst.Assign) -> str:
    target = assign.targets[0].target
    return target.value if isinstance(target, cst.Name) else ""


def _false(expr: cst.BaseExpression | None) -> bool:
    return expr is None or is_name(expr, "False")
