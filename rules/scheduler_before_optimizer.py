"""AO703: `scheduler.step()` called before `optimizer.step()` in the same loop."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.tree.nodes import (
    assignments,
    before,
    dotted,
    method_name,
    names_in,
    nodes_of_type,
    walk,
)


class SchedulerBeforeOptimizer(Rule):
    """
    ## What it does
    Flags `scheduler.step()` that comes, within one loop's body, before the `optimizer.step()`
    (or `scaler.step(optimizer)`) of that loop or of a loop nested in it — for instance the
    `for epoch in ...: scheduler.step(); train(...)` layout that widely read PyTorch tutorials show,
    or at the top of a function, before that function's loop of optimizer steps (an epoch
    function that steps the scheduler first).

    ## Why
    Since torch 1.1 the scheduler must be stepped after the optimizer. Stepping it first
    skips the first value of the schedule (the initial learning rate is never used; a warm-up
    starts one step late) and torch warns "Detected call of `lr_scheduler.step()` before
    `optimizer.step()`".

    ## When not to
    - A step behind an `if` on the loop's own variable (`if epoch > args.warm:
      train_scheduler.step(epoch)`): the first iterations' optimizer steps come first.
    - `optimizer.step()` first, then `scheduler.step()` (in the same loop or after the inner
      step loop): the intended order.
    - Objects that are not known schedulers/optimizers: schedulers are names assigned from
      `torch.optim.lr_scheduler.*` (or transformers' `get_*_schedule_with_warmup`), or from a
      project class named `...LR`/`...Scheduler` under a name that says scheduler
      (`self.lr_scheduler = WarmupPolyLR(...)`; not one named for what else it schedules,
      VoteNet's `BNMomentumScheduler`); optimizers are names assigned from
      `torch.optim.*`, or whose name contains "optim". A call named for training that is
      handed the optimizer (`train(loader, model, optimizer, epoch)`) steps it, and so does a
      call of a function of the file that steps an optimizer itself (`train(epoch)`).
    - With `--target-version` below 1.1 (the old order was correct then).

    ## Fix
    None: moving the call changes the learning rate of every step, which the user may have
    tuned around.
    """

    code = "AO703"
    name = "scheduler-before-optimizer"
    message = "scheduler.step() before optimizer.step(): the first LR value is skipped"
    fix_reason = "reordering changes every step's learning rate, which the user may have tuned"
    triggers = ("scheduler", "lr_sched", "schedule_with_warmup")
    requires = (".step(",)
    applies_to_versions = ((1, 1), None)

    VALID = [
        Valid(  # the step waits for the warm-up epochs: the optimizer steps first (cifar100)
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            train_scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [60, 120])
            def train(epoch):
                for x, y in train_loader:
                    loss_fn(model(x), y).backward()
                    optimizer.step()
            for epoch in range(1, 200):
                if epoch > args.warm:
                    train_scheduler.step(epoch)
                train(epoch)
            """
        ),
        Valid(  # one step per call, after the step loop of the function
            """
            import torch
            opt = torch.optim.Adam(model.parameters())
            sched = torch.optim.lr_scheduler.StepLR(opt, 15, 0.1)
            def run_epoch():
                for batch in loader:
                    model(batch).sum().backward()
                    opt.step()
                sched.step()
            """
        ),
        Valid(  # saving the optimizer after the scheduler steps is no training
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
            for epoch in range(10):
                train(loader, model, optimizer)
                scheduler.step()
                save_checkpoint(model, optimizer, epoch)
            """
        ),
        Valid(
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
            for epoch in range(10):
                for x in loader:
                    optimizer.zero_grad()
                    model(x).sum().backward()
                    optimizer.step()
                scheduler.step()
            """
        ),
        Valid(
            """
            import torch
            from torch.optim import lr_scheduler
            opt = torch.optim.AdamW(model.parameters())
            sched = lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=100)
            for x in loader:
                model(x).sum().backward()
                scaler.step(opt)
                scaler.update()
                sched.step()
            """
        ),
        Valid(
            """
            scheduler = make_scheduler()
            for epoch in range(10):
                scheduler.step()
                optimizer.step()
            """
        ),
        Valid(  # a scheduler of BatchNorm's momentum (VoteNet's), not of the learning rate
            """
            import torch
            optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
            bnm_scheduler = BNMomentumScheduler(net, bn_lambda=bn_lbmd)
            for epoch in range(10):
                bnm_scheduler.step()
                for x in loader:
                    net(x).sum().backward()
                    optimizer.step()
            """
        ),
    ]
    INVALID = [
        Invalid(  # an `if` that picks the phase, true on the first pass (video-recognition)
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
            for epoch in range(100):
                for phase in ["train", "val"]:
                    if phase == "train":
                        scheduler.step()
                    for x, y in loaders[phase]:
                        loss_fn(model(x), y).backward()
                        optimizer.step()
            """,
            line=7,
        ),
        Invalid(  # the epoch's function steps the module-level optimizer (speech-commands)
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 30)
            def train(epoch):
                for x, y in train_loader:
                    loss_fn(model(x), y).backward()
                    optimizer.step()
            for epoch in range(90):
                lr_scheduler.step()
                train(epoch)
            """,
            line=9,
        ),
        Invalid(  # at the top of the epoch function, before its step loop (monodepth2)
            """
            import torch
            class Trainer:
                def __init__(self, model):
                    self.opt = torch.optim.Adam(model.parameters())
                    self.sched = torch.optim.lr_scheduler.StepLR(self.opt, 15, 0.1)
                def run_epoch(self):
                    self.sched.step()
                    for batch in self.loader:
                        self.model(batch).sum().backward()
                        self.opt.step()
            """,
            line=7,
        ),
        Invalid(  # the epoch's training in another module, after the step (human-pose)
            """
            import torch
            from core.function import train
            optimizer = get_optimizer(config, model)
            lr_scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [90, 120])
            for epoch in range(140):
                lr_scheduler.step()
                train(config, train_loader, model, criterion, optimizer, epoch)
            """,
            line=6,
        ),
        Invalid(  # a scheduler class of the project at the top of each iteration (Tramac)
            """
            import torch
            class Trainer:
                def __init__(self, model):
                    self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
                    self.lr_scheduler = WarmupPolyLR(self.optimizer, max_iters=1000)
                def train(self, loader):
                    for images, targets in loader:
                        self.lr_scheduler.step()
                        loss = self.model(images).sum()
                        loss.backward()
                        self.optimizer.step()
            """,
            line=8,
        ),
        Invalid(
            """
            import torch.optim as optim
            from torch.optim import lr_scheduler
            optimizer = optim.Adam(net.parameters(), lr=1e-3)
            scheduler = lr_scheduler.StepLR(optimizer, 10, 0.1)
            for n in n_epoch:
                scheduler.step()
                for x, y in loader:
                    optimizer.zero_grad()
                    loss_fn(net(x), y).backward()
                    optimizer.step()
            """,
            line=6,
        ),
        Invalid(
            """
            import torch
            opt = torch.optim.SGD(params, lr=0.1)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 100))
            for x in loader:
                loss = model(x).sum()
                loss.backward()
                sched.step()
                opt.step()
            """,
            line=7,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        schedulers, optimizers = self._objects(node)
        if not schedulers:
            return
        facts = self.context.facts
        # this file's functions that step an optimizer themselves: `train(epoch)` of a script
        # whose optimizer is a module-level name (pytorch-speech-commands)
        self._stepping = {
            f.name.value
            for f in nodes_of_type(node, cst.FunctionDef)
            if any(self._is_optimizer_step(n, optimizers) for n in walk(f.body))
        }
        for call in (n for n in walk(node) if isinstance(n, cst.Call)):
            if method_name(call) != "step" or not isinstance(call.func, cst.Attribute):
                continue
            if dotted(call.func.value) not in schedulers:
                continue
            loops = facts.enclosing_loops(call)
            if loops and self._waits_for_the_loop(call, loops[0]):
                continue
            if loops:
                region: cst.CSTNode = loops[0].body
            else:
                # `def run_epoch(self): self.sched.step(); for batch in loader: ... opt.step()`
                # (monodepth2): the epoch's first steps run at the schedule's second value
                scope = facts.enclosing_scope(call)
                if not isinstance(scope, cst.FunctionDef):
                    continue
                region = scope.body
            if any(
                (self._is_optimizer_step(other, optimizers) or self._trains_with(other, optimizers))
                and before(self, call, other)
                for other in walk(region, into_scopes=False)
            ):
                self.report(call)

    def _waits_for_the_loop(self, call: cst.Call, loop: cst.CSTNode) -> bool:
        """`if epoch > args.warm: train_scheduler.step(epoch)` (pytorch-cifar100): an `if` on
        the loop's own variable keeps the step off the first iterations, whose optimizer steps
        then come first."""
        if not isinstance(loop, cst.For):
            return False
        counters = names_in(loop.target)
        node = self.parent(call)
        while node is not None and node is not loop:
            if isinstance(node, cst.If) and _orders(node.test, counters):
                return True
            node = self.parent(node)
        return False

    def _objects(self, module: cst.Module) -> tuple[set[str], set[str]]:
        """Names assigned a scheduler, and names assigned an optimizer, anywhere in the file."""
        schedulers: set[str] = set()
        optimizers: set[str] = set()
        for n in nodes_of_type(module, (cst.Module, cst.FunctionDef)):
            for name, value, _ in assignments(n):
                if not isinstance(value, cst.Call):
                    continue
                names = self.qualified_names(value.func)
                if any(
                    q.startswith("torch.optim.lr_scheduler.") or q.endswith("_schedule_with_warmup")
                    for q in names
                ) or _project_scheduler(name, value.func):
                    schedulers.add(name)
                elif any(q.startswith("torch.optim.") for q in names):
                    optimizers.add(name)
        return schedulers, optimizers

    def _is_optimizer_step(self, node: cst.CSTNode, optimizers: set[str]) -> bool:
        if not isinstance(node, cst.Call) or method_name(node) != "step":
            return False
        assert isinstance(node.func, cst.Attribute)
        receiver = dotted(node.func.value)
        if receiver is None:
            return False

        def is_optimizer(name: str | None) -> bool:
            return name is not None and (name in optimizers or "optim" in name.lower())

        if is_optimizer(receiver):
            return True
        # scaler.step(optimizer)
        return bool(node.args) and is_optimizer(dotted(node.args[0].value))

    def _trains_with(self, node: cst.CSTNode, optimizers: set[str]) -> bool:
        """`train(config, loader, model, criterion, optimizer, epoch)`: a call named for
        training that is handed an optimizer steps it (in another module, often)."""
        if not isinstance(node, cst.Call) or method_name(node) == "step":
            return False
        if isinstance(node.func, cst.Name) and node.func.value in self._stepping:
            return True  # a function of this file that steps the optimizer itself
        callee = (dotted(node.func) or "").rsplit(".", 1)[-1].lower()
        if not callee.startswith(("train", "fit", "run_epoch")):
            return False
        return any(
            (name := dotted(a.value)) is not None
            and (name in optimizers or "optim" in name.lower())
            for a in node.args
        )


_ORDERINGS = (cst.GreaterThan, cst.GreaterThanEqual, cst.LessThan, cst.LessThanEqual)


def _orders(test: cst.BaseExpression, counters: set[str]) -> bool:
    """`epoch > args.warm`: the test orders one of the loop's own variables (not `phase ==
    "train"`, true on the first iteration of `for phase in ["train", "val"]`)."""
    return any(
        isinstance(target.operator, _ORDERINGS) and names_in(compare) & counters
        for compare in nodes_of_type(test, cst.Comparison)
        for target in compare.comparisons
    )


def _project_scheduler(name: str, func: cst.BaseExpression) -> bool:
    """`self.lr_scheduler = WarmupPolyLR(...)`: a class of the project named as an LR
    scheduler (they subclass torch's `_LRScheduler`), bound to a name that says so."""
    callee = (dotted(func) or "").rsplit(".", 1)[-1]
    if any(word in callee for word in _NOT_LEARNING_RATE):
        return False  # VoteNet's `BNMomentumScheduler(net, ...)`: BatchNorm momentum, no LR
    return "sched" in name.lower() and callee.endswith(("LR", "Scheduler"))


# What a project scheduler class may schedule other than the learning rate.
_NOT_LEARNING_RATE = ("BN", "Momentum", "Dropout", "Teacher", "Temperature", "Weight")
