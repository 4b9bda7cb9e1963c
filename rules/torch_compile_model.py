"""AO301: a model trained in eager mode only."""

from __future__ import annotations

import ast
from collections.abc import Sequence

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.handled import (
    LIBRARY_TRAINER_MARKERS,
    is_hogwild,
    library_trainer_calls,
    uses_accelerate,
)
from autoopt.lint.program.placement import binds_or_places, without_placement
from autoopt.lint.program.torch_api import torch_imports, torch_name
from autoopt.lint.program.trained_models import is_compiled, mentions, trained_models
from autoopt.lint.rewrite.fixes.preconditions import (
    double_backward,
    double_backward_only_behind_flags,
    trains_twice,
)
from autoopt.lint.tree.edits import statement_line
from autoopt.lint.tree.nodes import (
    calls_in,
    contains,
    dotted,
    is_name,
    names_in,
    nodes_of_type,
    string_value,
)

_SCRIPTED = (
    "torch.jit.script",
    "torch.jit.trace",
    "torch._dynamo.optimize",
)
_IN_PLACE_COMPILE = (2, 2)  # nn.Module.compile() exists since torch 2.2


def _handed_in(stmt: cst.BaseStatement, model: str, method: cst.FunctionDef) -> bool:
    """`stmt` binds `model` (`self.model`) to a parameter of `method`, placed or not
    (`self.model = model.to(self.device)`, BERT4Rec's trainer): an object its caller built."""
    if not isinstance(stmt, cst.SimpleStatementLine) or not isinstance(stmt.body[0], cst.Assign):
        return False
    assign = stmt.body[0]
    if not any(dotted(t.target) == model for t in assign.targets):
        return False
    value = without_placement(assign.value, None)  # `model.to(device)`, `model.cuda()`
    # `self.model = self.initModel()` is the class's own factory, not an object handed in
    return (
        isinstance(value, cst.Name)
        and value.value not in ("self", "cls")
        and value.value in _parameter_names(method)
    )


def _local_callers(
    module: cst.Module, func: cst.FunctionDef, param: str
) -> list[tuple[cst.Call, str]]:
    """The calls of `func` (a module-level function) in `module`, each with the plain name it
    passes for `param`."""
    p = func.params
    positional = [x.name.value for x in [*p.posonly_params, *p.params]]
    found = []
    for call in nodes_of_type(module, cst.Call):
        if not is_name(call.func, func.name.value):
            continue
        passed = next((a.value for a in call.args if a.keyword and a.keyword.value == param), None)
        if passed is None and param in positional:
            index = positional.index(param)
            plain = [a for a in call.args if a.keyword is None and not a.star]
            if index < len(plain) and not any(a.star for a in call.args[: index + 1]):
                passed = plain[index].value
        if isinstance(passed, cst.Name):
            found.append((call, passed.value))
    return found


def _parameter_names(func: cst.FunctionDef) -> set[str]:
    p = func.params
    return {x.name.value for x in [*p.posonly_params, *p.params, *p.kwonly_params]}


class TorchCompileModel(Rule):
    """
    ## What it does
    Flags a model that is trained (an optimizer is built from `model.parameters()`, from
    parameter groups a helper makes of the model, by `model.configure_optimizers(...)`, or by a
    function of the project that builds a torch.optim optimizer, `smart_optimizer(model, ...)`,
    read without importing it; and
    the file has a loop calling `backward()` or hands model and optimizer to ignite's
    `create_supervised_trainer`) without `torch.compile`, and inserts `model.compile()` right
    after the model is built and placed (after its last assignment, `.to(...)` or `.cuda()`).

    ## Why
    `torch.compile` traces the model into graphs and generates fused kernels (Triton on GPU, C++
    on CPU), removing Python overhead and most elementwise memory traffic. PyTorch reports
    1.3-2x training speed-ups across its HuggingFace, TIMM and TorchBench suites on A100 (seed
    001). It is not always a win: on CPU the gain depends on the model and the machine
    (docs/benchmarks/cpu.md has one machine's figures per workload), and the first steps pay the
    compilation time — measure with `autoopt bench`.

    ## When not to
    - The model compiled under another name it is an alias of (`raw_model = model.module if
      ddp else model`), also behind a switch the author turned off on purpose.
    - A function or method named `compile` in the file (a Keras-style `model.compile(...)`
      method on the user's class, or a helper that shadows the name): not flagged.
    - The call never goes inside the training loop: a new optimizer made there for a model
      whose parameters it replaces (DirectVoxGO's and TensoRF's grids, scaled up a few times
      a run) is no place to compile; the model is reported where it is built (each scaling
      then recompiles, a few times a run).
    - A model re-assigned while training (e.g. a best-checkpoint swap inside the epoch loop,
      or a factory the epoch loop calls again: TimeSformer's multigrid `build_trainer(cfg)`),
      or built only inside another function: the rule cannot place the call safely and stays
      quiet. (A model a trainer or agent class builds in its own `__init__`, `self.actor =
      Actor(...).to(device)` beside its optimizer, is built where it is trained: reported
      there; and one a base class of another module builds, `self.model =
      self._build_model().to(self.device)` in Autoformer's `Exp_Basic.__init__`, trained by
      the subclass's optimizer, is reported at that optimizer without a fix, naming the base
      class where the call goes.) A model a function or a trainer class is handed (`train(model, ...)`,
      `self.model = model.to(device)` in `__init__`) is the caller's to compile, reported
      where the caller builds it when that is this file (GPT2-chitchat's `main()` building the
      model it hands to `train()`). A model
      reloaded after training (to test the best checkpoint) is compiled where it
      is first built; one moved while training (`model.cpu()` to save, `.to(device)` back) too.
    - A model already compiled (`model.compile()`, `torch.compile(model)` under any name), and
      files that use TorchScript or `torch._dynamo.optimize`.
    - Scripts driven by HF Accelerate (`Accelerator(...)` compiles through its `dynamo_backend`
      setting) and Hogwild training (`model.share_memory()` of the trained model with CPU
      worker processes, also the module such a script starts; a shared inference copy beside
      a learner model, as TorchBeast's actors, is no Hogwild).
    - Each model that an optimizer trains gets its own report (a GAN's generator and
      discriminator both do).

    ## Fix (safe)
    Inserts `model.compile()`: the in-place form compiles the module's forward without wrapping
    it, so `state_dict()` keys stay the same (no `_orig_mod.` prefix) and checkpoints load into a
    plain model; the optimizer keeps the same parameters. Where the script picks its device at
    run time (`model.to(device)` with a CPU fallback) the call goes behind
    `if torch.device(device).type == "cuda":`: on a CPU the script keeps running eagerly, as
    before, instead of paying a cold compile that may not pay back there. With `--target-version` below 2.2,
    where `nn.Module.compile` does not exist, the rule reports without a fix, and so it does in
    a script that differentiates through a gradient (`torch.autograd.grad(create_graph=True)`,
    a WGAN-GP gradient penalty): torch.compile's aot_autograd does not support double backward.
    The model the double backward runs through is not reported at all (compile cannot train
    it), nor is any model when the penalty's module cannot be traced (its outputs are handed
    in by the caller, or it lives in a project module the script imports: FFJORD's ODE
    function, SIREN's `diff_operators`); the other models (a GAN's generator) are reported
    without a fix. A double backward behind a flag only (`create_graph=is_second_order` of a loss scaler, off
    for the usual optimizers) is reported without a fix.
    """

    code = "AO301"
    name = "torch-compile-model"
    message = "model is trained without torch.compile"
    fix_safety = FixSafety.SAFE
    fix_reason = (
        "in-place compile keeps the module, its parameters and state_dict keys; numerics match"
        " eager within floating-point reordering"
    )
    covered_by_optimize = True  # autoopt.optimize() applies it at run time
    triggers = (".backward(", *LIBRARY_TRAINER_MARKERS)
    applies_to_versions = ((2, 0), None)
    _trainers: list[cst.Call]  # library trainer calls of the file (set per visit)
    _anchors: set[int]  # statements already reported (set per visit)

    VALID = [
        Valid(  # the trainer class is handed a model its caller built: compile goes there
            """
            import torch
            class Trainer:
                def __init__(self, model, device):
                    self.model = model.to(device)

                def train(self, loader):
                    optimizer = torch.optim.Adam(self.model.parameters())
                    for x in loader:
                        self.model(x.cuda()).sum().backward()
                        optimizer.step()
            """
        ),
        Valid(  # the training method swaps the model it trains: a compiled one would be missed
            """
            import torch
            class Trainer:
                def __init__(self, model):
                    self.model = model.cuda()

                def train(self, loader, best):
                    optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
                    for x in loader:
                        self.model(x.cuda()).sum().backward()
                        optimizer.step()
                        self.model = best
            """
        ),
        Valid(  # the user's own compile method (Keras style)
            """
            import torch
            class Net(torch.nn.Module):
                def compile(self, optimizer):
                    self.optimizer = optimizer
            model = Net()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in loader:
                model(x).sum().backward()
            """
        ),
        Valid(  # re-assigned while training (a best-checkpoint swap in the epoch loop)
            """
            import torch
            model = Net().cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(10):
                for x in loader:
                    model(x).sum().backward()
                model = load_best()
            """
        ),
        Valid(
            """
            import torch
            model = Net().cuda()
            compiled = torch.compile(model)
            opt = torch.optim.AdamW(model.parameters())
            for x in loader:
                compiled(x).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            model = torch.compile(Net())
            opt = torch.optim.AdamW(model.parameters())
            for x in loader:
                model(x).sum().backward()
            """
        ),
        Valid(  # Accelerate configures compilation (dynamo_backend)
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator(mixed_precision="bf16")
            model = Net()
            optimizer = torch.optim.AdamW(model.parameters())
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                loss = model(**batch).loss
                accelerator.backward(loss)
                loss.backward()
            """
        ),
        Valid(  # a scheduler takes the optimizer, not parameters (yolov5's smart_optimizer)
            """
            from torch.optim import lr_scheduler
            model = Model().cuda()
            optimizer = smart_optimizer(model, "SGD")
            scheduler = lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)
            for x in loader:
                model(x).sum().backward()
            """
        ),
        Valid(  # no optimizer over a model's parameters: not a model training script
            """
            import torch
            w = torch.zeros(3, requires_grad=True)
            for x in data:
                (w * x).sum().backward()
            """
        ),
        Valid(  # a gradient penalty differentiates the critic twice: compile cannot train it
            """
            import torch
            D = Discriminator().cuda()
            opt_d = torch.optim.Adam(D.parameters(), lr=1e-4)
            for real in loader:
                real.requires_grad_(True)
                score = D(real)
                grad, = torch.autograd.grad(score.sum(), real, create_graph=True)
                loss = -score.mean() + ((grad.norm(2, dim=1) - 1) ** 2).mean()
                loss.backward()
                opt_d.step()
            """
        ),
        Valid(  # an optimizer factory of a config object, not of a model: nothing to compile
            """
            cfg = Config()
            net = Net().cuda()
            optimizer = cfg.get_optimizer(0.1)
            for x, y in loader:
                optimizer.zero_grad()
                criterion(net(x), y).backward()
                optimizer.step()
            """
        ),
        Valid(  # second-order MAML (learn2learn's default): adapt() differentiates twice
            """
            import learn2learn as l2l
            import torch
            model = Net().cuda()
            maml = l2l.algorithms.MAML(model, lr=0.5)
            opt = torch.optim.Adam(maml.parameters())
            for batch in tasks:
                learner = maml.clone()
                learner.adapt(loss_fn(learner(batch.x), batch.y))
                loss_fn(learner(batch.x), batch.y).backward()
                opt.step()
            """
        ),
        Valid(  # R1 on predictions handed in by the caller: any model may be the one, silent
            """
            import torch
            from torch.autograd import grad
            G, D = Generator(), Discriminator()
            opt_g = torch.optim.Adam(G.parameters())
            opt_d = torch.optim.Adam(D.parameters())
            def r1(pred, real):
                g, = grad(outputs=pred.sum(), inputs=real, create_graph=True)
                return g.pow(2).sum()
            for real in loader:
                pred = D(real)
                (pred.mean() + r1(pred, real)).backward()
                opt_d.step()
                D(G(z)).mean().backward()
                opt_g.step()
            """
        ),
        Valid(  # compiled behind a switch; the optimizer is built on an alias of the model
            """
            import torch
            model = GPT(config).to(device)
            use_compile = False  # interferes with the eval: off on purpose
            if use_compile:
                model = torch.compile(model)
            if ddp:
                model = DDP(model, device_ids=[local_rank])
            raw_model = model.module if ddp else model
            optimizer = raw_model.configure_optimizers(weight_decay=0.1)
            for x, y in batches():
                model(x, y)[1].backward()
                optimizer.step()
            """
        ),
    ]
    INVALID = [
        Invalid(  # a new optimizer for the scaled-up grids while training: compiled where built
            """
            import torch
            def create_new_model():
                model = VoxelGrid(64).cuda()
                optimizer = torch.optim.Adam(model.parameters())
                return model, optimizer
            def train():
                model, optimizer = create_new_model()
                for step in range(20000):
                    if step in (1000, 2000, 3000):
                        model.scale_volume_grid(step // 10)
                        optimizer = torch.optim.Adam(model.parameters())
                        model.act_shift -= 0.5
                    loss = model(rays()).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
            line=3,
            fixed="""
            import torch
            def create_new_model():
                model = VoxelGrid(64).cuda()
                model.compile()
                optimizer = torch.optim.Adam(model.parameters())
                return model, optimizer
            def train():
                model, optimizer = create_new_model()
                for step in range(20000):
                    if step in (1000, 2000, 3000):
                        model.scale_volume_grid(step // 10)
                        optimizer = torch.optim.Adam(model.parameters())
                        model.act_shift -= 0.5
                    loss = model(rays()).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # the optimizer (with its scheduler) from a factory of a spec object (GPT2)
            """
            import torch
            class Trainer:
                def train(self):
                    model = self.spec.construct_model().cuda()
                    optimizer, scheduler = self.spec.create_optimizer(model.parameters())
                    for step in range(100):
                        optimizer.zero_grad()
                        model(batch()).mean().backward()
                        optimizer.step()
                        scheduler.step()
            """,
            line=4,
            fixed="""
            import torch
            class Trainer:
                def train(self):
                    model = self.spec.construct_model().cuda()
                    model.compile()
                    optimizer, scheduler = self.spec.create_optimizer(model.parameters())
                    for step in range(100):
                        optimizer.zero_grad()
                        model(batch()).mean().backward()
                        optimizer.step()
                        scheduler.step()
            """,
        ),
        Invalid(  # a whole training run again per hyperparameter-evolution round (yolov5):
            # each round builds its own model, no swap while training
            """
            import torch
            from torch import nn

            def train(hyp):
                model = nn.Linear(4, 2).cuda()
                optimizer = torch.optim.SGD(model.parameters(), lr=hyp["lr"])
                for x in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()

            def main(opt):
                for _ in range(opt.evolve):
                    train(mutate(opt.hyp))
            """,
            line=5,
            fixed="""
            import torch
            from torch import nn

            def train(hyp):
                model = nn.Linear(4, 2).cuda()
                model.compile()
                optimizer = torch.optim.SGD(model.parameters(), lr=hyp["lr"])
                for x in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()

            def main(opt):
                for _ in range(opt.evolve):
                    train(mutate(opt.hyp))
            """,
        ),
        Invalid(  # main() builds it, hands it to train(), whose optimizer trains it through
            # train_epoch(); a DataParallel only under a flag keeps the runtime device's test
            # (GPT2-chitchat)
            """
            import torch
            from torch import nn

            def train_epoch(model, loader, optimizer):
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()

            def train(model, loader):
                optimizer = torch.optim.AdamW(model.parameters())
                for epoch in range(3):
                    train_epoch(model=model, loader=loader, optimizer=optimizer)

            def main(args, loader):
                device = "cuda:0" if args.cuda else "cpu"
                model = nn.Linear(16, 4).to(device)
                if args.cuda and torch.cuda.device_count() > 1:
                    model = torch.nn.DataParallel(model).cuda()
                train(model, loader)
            """,
            line=17,
            fixed="""
            import torch
            from torch import nn

            def train_epoch(model, loader, optimizer):
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()

            def train(model, loader):
                optimizer = torch.optim.AdamW(model.parameters())
                for epoch in range(3):
                    train_epoch(model=model, loader=loader, optimizer=optimizer)

            def main(args, loader):
                device = "cuda:0" if args.cuda else "cpu"
                model = nn.Linear(16, 4).to(device)
                if args.cuda and torch.cuda.device_count() > 1:
                    model = torch.nn.DataParallel(model).cuda()
                if torch.device(device).type == "cuda":
                    model.compile()
                train(model, loader)
            """,
        ),
        Invalid(  # an attribute of the model set while training is no swap (self-critical's
            # scheduled-sampling probability)
            """
            import torch

            model = Net().cuda()
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            for epoch in range(10):
                model.ss_prob = min(0.05 * epoch, 0.25)
                for x, y in loader:
                    loss = criterion(model(x.cuda()), y.cuda())
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
            line=3,
            fixed="""
            import torch

            model = Net().cuda()
            model.compile()
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            for epoch in range(10):
                model.ss_prob = min(0.05 * epoch, 0.25)
                for x, y in loader:
                    loss = criterion(model(x.cuda()), y.cuda())
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # a function of the file builds the optimizer and its scheduler (RAFT)
            """
            import torch.optim as optim
            def fetch_optimizer(args, model):
                optimizer = optim.AdamW(model.parameters(), lr=args.lr)
                scheduler = optim.lr_scheduler.OneCycleLR(optimizer, args.lr, 1000)
                return optimizer, scheduler
            def train(args, loader):
                model = Net()
                model.cuda()
                optimizer, scheduler = fetch_optimizer(args, model)
                for x in loader:
                    optimizer.zero_grad()
                    model(x).sum().backward()
                    optimizer.step()
                    scheduler.step()
            """,
            line=8,
            fixed="""
            import torch.optim as optim
            def fetch_optimizer(args, model):
                optimizer = optim.AdamW(model.parameters(), lr=args.lr)
                scheduler = optim.lr_scheduler.OneCycleLR(optimizer, args.lr, 1000)
                return optimizer, scheduler
            def train(args, loader):
                model = Net()
                model.cuda()
                model.compile()
                optimizer, scheduler = fetch_optimizer(args, model)
                for x in loader:
                    optimizer.zero_grad()
                    model(x).sum().backward()
                    optimizer.step()
                    scheduler.step()
            """,
        ),
        Invalid(  # the class's own factory methods build model and optimizer (dlwpt's LunaTrainingApp)
            """
            import torch
            class App:
                def __init__(self):
                    self.model = self.init_model()
                    self.optimizer = self.init_optimizer()
                def init_model(self):
                    return Net().cuda()
                def init_optimizer(self):
                    return torch.optim.SGD(self.model.parameters(), lr=0.01)
                def train(self, loader):
                    for x in loader:
                        self.optimizer.zero_grad()
                        self.model(x).sum().backward()
                        self.optimizer.step()
            """,
            line=4,
            fixed="""
            import torch
            class App:
                def __init__(self):
                    self.model = self.init_model()
                    self.model.compile()
                    self.optimizer = self.init_optimizer()
                def init_model(self):
                    return Net().cuda()
                def init_optimizer(self):
                    return torch.optim.SGD(self.model.parameters(), lr=0.01)
                def train(self, loader):
                    for x in loader:
                        self.optimizer.zero_grad()
                        self.model(x).sum().backward()
                        self.optimizer.step()
            """,
        ),
        Invalid(  # parameter groups from a function of the file handed `model.module` (deeplab)
            """
            import torch
            import torch.nn as nn
            def get_params(model, key):
                for name, p in model.named_parameters():
                    if key in name:
                        yield p
            model = build_deeplab(n_classes=21)
            model = nn.DataParallel(model)
            model.to("cuda")
            optimizer = torch.optim.SGD(
                params=[{"params": get_params(model.module, key="1x")}], lr=0.1
            )
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                criterion(model(x), y).backward()
                optimizer.step()
            """,
            line=9,
            fixed="""
            import torch
            import torch.nn as nn
            def get_params(model, key):
                for name, p in model.named_parameters():
                    if key in name:
                        yield p
            model = build_deeplab(n_classes=21)
            model = nn.DataParallel(model)
            model.to("cuda")
            model.compile()
            optimizer = torch.optim.SGD(
                params=[{"params": get_params(model.module, key="1x")}], lr=0.1
            )
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                criterion(model(x), y).backward()
                optimizer.step()
            """,
        ),
        Invalid(  # the model's own optimizer factory (pytorch-book's BasicModule.get_optimizer)
            """
            model = Net()
            model.cuda()
            optimizer = model.get_optimizer(0.1, 1e-4)
            for x, y in loader:
                optimizer.zero_grad()
                criterion(model(x.cuda()), y.cuda()).backward()
                optimizer.step()
            """,
            line=2,
            fixed="""
            model = Net()
            model.cuda()
            model.compile()
            optimizer = model.get_optimizer(0.1, 1e-4)
            for x, y in loader:
                optimizer.zero_grad()
                criterion(model(x.cuda()), y.cuda()).backward()
                optimizer.step()
            """,
        ),
        Invalid(  # first-order MAML differentiates once: compiled like any model
            """
            import learn2learn as l2l
            import torch
            model = Net().cuda()
            maml = l2l.algorithms.MAML(model, lr=0.5, first_order=True)
            opt = torch.optim.Adam(maml.parameters())
            for batch in tasks:
                learner = maml.clone()
                learner.adapt(loss_fn(learner(batch.x), batch.y))
                loss_fn(learner(batch.x), batch.y).backward()
                opt.step()
            """,
            line=4,
            fixed="""
            import learn2learn as l2l
            import torch
            model = Net().cuda()
            maml = l2l.algorithms.MAML(model, lr=0.5, first_order=True)
            maml.compile()
            opt = torch.optim.Adam(maml.parameters())
            for batch in tasks:
                learner = maml.clone()
                learner.adapt(loss_fn(learner(batch.x), batch.y))
                loss_fn(learner(batch.x), batch.y).backward()
                opt.step()
            """,
            message_contains="maml.compile()",
        ),
        Invalid(  # `model = model.train()` in the loop rebinds the same module: no swap
            """
            import torch
            classifier = Net().cuda()
            optimizer = torch.optim.Adam(classifier.parameters())
            for epoch in range(10):
                classifier = classifier.train()
                for x in loader:
                    classifier(x.cuda()).sum().backward()
                    optimizer.step()
            """,
            line=2,
            fixed="""
            import torch
            classifier = Net().cuda()
            classifier.compile()
            optimizer = torch.optim.Adam(classifier.parameters())
            for epoch in range(10):
                classifier = classifier.train()
                for x in loader:
                    classifier(x.cuda()).sum().backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # the optimizer class picked by name from a flag (TCN's pmnist_test.py)
            """
            import torch
            from torch import optim
            model = Net()
            if args.cuda:
                model.cuda()
            optimizer = getattr(optim, args.optim)(model.parameters(), lr=0.1)
            for x, y in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()
            """,
            line=4,
            fixed="""
            import torch
            from torch import optim
            model = Net()
            if args.cuda:
                model.cuda()
            model.compile()
            optimizer = getattr(optim, args.optim)(model.parameters(), lr=0.1)
            for x, y in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()
            """,
        ),
        Invalid(  # a trainer class: the model built in __init__, the optimizer in train()
            """
            import torch
            class Trainer:
                def __init__(self, config, loader):
                    self.loader = loader
                    self.model = Net(config)
                    self.model.to("cuda")

                def train(self):
                    groups = list()
                    groups.append({"params": self.model.parameters(), "lr": 0.1})
                    optimizer = torch.optim.SGD(groups, lr=0.1)
                    for x, y in self.loader:
                        loss = self.model(x.cuda()).sum()
                        loss.backward()
                        optimizer.step()
            """,
            line=6,
            fixed="""
            import torch
            class Trainer:
                def __init__(self, config, loader):
                    self.loader = loader
                    self.model = Net(config)
                    self.model.to("cuda")
                    self.model.compile()

                def train(self):
                    groups = list()
                    groups.append({"params": self.model.parameters(), "lr": 0.1})
                    optimizer = torch.optim.SGD(groups, lr=0.1)
                    for x, y in self.loader:
                        loss = self.model(x.cuda()).sum()
                        loss.backward()
                        optimizer.step()
            """,
        ),
        Invalid(  # models held by a solver class, built in a method (stargan's Solver)
            """
            import torch
            class Solver:
                def build_model(self):
                    self.G = Generator(64)
                    self.g_optimizer = torch.optim.Adam(self.G.parameters(), 1e-4)
                    self.G.to(self.device)
                def train(self):
                    for x in self.loader:
                        self.G(x.to(self.device)).mean().backward()
                        self.g_optimizer.step()
            """,
            line=6,
            fixed="""
            import torch
            class Solver:
                def build_model(self):
                    self.G = Generator(64)
                    self.g_optimizer = torch.optim.Adam(self.G.parameters(), 1e-4)
                    self.G.to(self.device)
                    if torch.device(self.device).type == "cuda":
                        self.G.compile()
                def train(self):
                    for x in self.loader:
                        self.G(x.to(self.device)).mean().backward()
                        self.g_optimizer.step()
            """,
        ),
        Invalid(  # WGAN-GP: the penalty differentiates D twice, G once: G only (no fix)
            """
            import torch
            from torch import autograd
            G, D = Generator(), Discriminator()
            opt_g = torch.optim.Adam(G.parameters(), lr=1e-4)
            opt_d = torch.optim.Adam(D.parameters(), lr=1e-4)
            def penalty(critic, x_hat):
                score = critic(x_hat)
                grad, = autograd.grad(outputs=score, inputs=x_hat, create_graph=True)
                return ((grad.norm(2, dim=1) - 1) ** 2).mean()
            for real in loader:
                fake = G(noise())
                loss = -D(real).mean() + D(fake.detach()).mean() + penalty(D, real)
                loss.backward()
                opt_d.step()
                (-D(fake).mean()).backward()
                opt_g.step()
            """,
            line=3,
            message_contains="`G` is trained without torch.compile (not fixed: the script runs a",
        ),
        Invalid(  # the loop is ignite's: create_supervised_trainer (ignite's mnist example)
            """
            import torch
            from torch import nn
            from ignite.engine import create_supervised_trainer
            def run(loader, device):
                model = Net()
                model.to(device)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
                trainer = create_supervised_trainer(model, optimizer, nn.NLLLoss(), device=device)
                trainer.run(loader, max_epochs=10)
            """,
            line=6,
            fixed="""
            import torch
            from torch import nn
            from ignite.engine import create_supervised_trainer
            def run(loader, device):
                model = Net()
                model.to(device)
                if torch.device(device).type == "cuda":
                    model.compile()
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
                trainer = create_supervised_trainer(model, optimizer, nn.NLLLoss(), device=device)
                trainer.run(loader, max_epochs=10)
            """,
        ),
        # Chosen in an if/else, trained by a function the epoch loop calls, reloaded after
        # training to test the best checkpoint (pytorch/examples word_language_model).
        Invalid(
            """
            import torch
            if args.model == "Transformer":
                model = TransformerModel().to(device)
            else:
                model = RNNModel().to(device)
            optimizer = torch.optim.AdamW(model.parameters())

            def train():
                for x, y in batches:
                    loss_fn(model(x), y).backward()
                    optimizer.step()

            for epoch in range(10):
                train()
            model = torch.load("best.pt")
            """,
            line=2,
            fixed="""
            import torch
            if args.model == "Transformer":
                model = TransformerModel().to(device)
            else:
                model = RNNModel().to(device)
            if torch.device(device).type == "cuda":
                model.compile()
            optimizer = torch.optim.AdamW(model.parameters())

            def train():
                for x, y in batches:
                    loss_fn(model(x), y).backward()
                    optimizer.step()

            for epoch in range(10):
                train()
            model = torch.load("best.pt")
            """,
        ),
        Invalid(
            """
            import torch
            device = torch.device("cuda")
            model = ResNet()
            model.to(device)  # place it
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            line=4,
            fixed="""
            import torch
            device = torch.device("cuda")
            model = ResNet()
            model.to(device)  # place it
            model.compile()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(
            """
            from torch import optim
            def main(args):
                if args.big:
                    net = Big()
                else:
                    net = Small()
                opt = optim.Adam(net.parameters())
                for epoch in range(args.epochs):
                    train(net, opt)
                    net(x).sum().backward()
            """,
            line=3,
            fixed="""
            from torch import optim
            def main(args):
                if args.big:
                    net = Big()
                else:
                    net = Small()
                net.compile()
                opt = optim.Adam(net.parameters())
                for epoch in range(args.epochs):
                    train(net, opt)
                    net(x).sum().backward()
            """,
        ),
        # Moved to the CPU to save a checkpoint and back while training (pytorch/examples
        # fast_neural_style): in-place compile survives `.cpu()`/`.to()`.
        Invalid(
            """
            import torch
            net = TransformerNet().to(device)
            optimizer = torch.optim.Adam(net.parameters(), 1e-3)
            for x in loader:
                net(x).sum().backward()
                optimizer.step()
                if step % 1000 == 0:
                    torch.save(net.eval().cpu().state_dict(), path)
                    net.to(device).train()
            """,
            line=2,
            fixed="""
            import torch
            net = TransformerNet().to(device)
            if torch.device(device).type == "cuda":
                net.compile()
            optimizer = torch.optim.Adam(net.parameters(), 1e-3)
            for x in loader:
                net(x).sum().backward()
                optimizer.step()
                if step % 1000 == 0:
                    torch.save(net.eval().cpu().state_dict(), path)
                    net.to(device).train()
            """,
        ),
        # Parameter groups from a helper over the model (dino's `get_params_groups(student)`).
        Invalid(
            """
            import torch
            student = DDP(Student().cuda(), device_ids=[gpu])
            groups = get_params_groups(student)
            optimizer = torch.optim.AdamW(groups)
            for x in loader:
                student(x).sum().backward()
            """,
            line=2,
            fixed="""
            import torch
            student = DDP(Student().cuda(), device_ids=[gpu])
            student.compile()
            groups = get_params_groups(student)
            optimizer = torch.optim.AdamW(groups)
            for x in loader:
                student(x).sum().backward()
            """,
        ),
        # The model builds its own optimizer (nanoGPT/minGPT/Lightning `configure_optimizers`),
        # in a Trainer class (minGPT's trainer.py).
        Invalid(
            """
            class Trainer:
                def run(self):
                    model, config = self.model, self.config
                    self.optimizer = model.configure_optimizers(config)
                    while True:
                        x, y = next(batches)
                        logits, self.loss = model(x, y)
                        self.loss.backward()
                        self.optimizer.step()
            """,
            line=3,
            fixed="""
            class Trainer:
                def run(self):
                    model, config = self.model, self.config
                    model.compile()
                    self.optimizer = model.configure_optimizers(config)
                    while True:
                        x, y = next(batches)
                        logits, self.loss = model(x, y)
                        self.loss.backward()
                        self.optimizer.step()
            """,
        ),
        Invalid(
            """
            import torch
            model = Net()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in loader:
                model(x).sum().backward()
            """,
            line=2,
            target_version="2.1",
            message_contains="2.2",
            fixed=None,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        self._trainers = library_trainer_calls(self)  # ignite runs the loop for the file
        trains = self.facts.trains or self._trainers or self.context.program.steps_run_elsewhere
        if not trains or self._shadowed_or_scripted(node):
            return
        if uses_accelerate(self) or is_hogwild(self):
            return  # Accelerate compiles (`dynamo_backend`); Hogwild shares one eager model
        self._anchors: set[int] = set()
        # (scope, model): a name may mean two models
        self._done: set[tuple[int, str]] = set()
        for opt_call, model in trained_models(self):
            key = (id(self.facts.enclosing_scope(opt_call)), model)
            if key in self._done or is_compiled(self, model):
                continue
            self._done.add(key)
            self._offer(opt_call, model)  # each trained model (GANs have two)

    def _offer(self, opt_call: cst.Call, model: str) -> None:
        scope = self.facts.enclosing_scope(opt_call)
        root = model.split(".")[0]
        if (
            isinstance(scope, cst.FunctionDef)
            and root not in ("self", "cls")  # built by the method itself (`self.net = Net()`)
            and root in _parameter_names(scope)
            and self.context.program.called_from_the_project(scope)
        ):
            # `train(model, ...)` receives it: the caller builds it, compile goes there (a
            # caller in this file is offered here: GPT2-chitchat's main() -> train())
            for call, name in _local_callers(self.context.module, scope, root):
                key = (id(self.facts.enclosing_scope(call)), name)
                if key not in self._done:
                    self._done.add(key)
                    self._offer(call, name)
            return
        if isinstance(scope, cst.FunctionDef) and self._rebuilt_while_training(scope):
            return  # a factory called again in a loop (TimeSformer's multigrid `build_trainer`)
        found = self._where_built(opt_call, model)
        if found is None:
            self._built_by_a_base(opt_call, model)
            return
        body, builds, training = found
        # Assigned while training (a best-checkpoint swap): the compiled module would be
        # replaced. A reload after training (to test the best model) leaves training compiled,
        # and so does moving it while training (`model.cpu()` to save, `.to(device)` back).
        if (
            training < len(body)
            and binds_or_places(body[training], model, rebinds=True)
            and not self._returns_what_it_trains(body[training], model)
        ):
            return
        anchor = body[builds[-1]]
        if id(anchor) in self._anchors:  # the same model reached from two scopes
            return
        if any(
            self.facts.is_training_loop(loop) and not binds_or_places(loop, model, rebinds=True)
            for loop in self.facts.enclosing_loops(anchor)
        ):
            # a new optimizer while training (grids scaled up) for a model built before the
            # loop: compiled where built (a model built per seed inside it, GraphMAE, is not)
            return
        self._anchors.add(id(anchor))
        version = self.context.target_version
        if version is not None and version < _IN_PLACE_COMPILE:
            self.report(
                anchor,
                f"{self.message} (not fixed: in-place `{model}.compile()` needs torch 2.2; "
                "`torch.compile(model)` would prefix state_dict keys with `_orig_mod.`)",
            )
            return
        if double_backward(self) is None and self._modules_differentiate_a_gradient(
            _built_classes([body[i] for i in builds])
        ):
            # the model's own forward or method runs a double backward (FFJORD's divergence,
            # HNN's time_derivative), or a helper of the project does on outputs it is handed
            # (SIREN's diff_operators): which model goes through it cannot be traced from here
            return
        twice = double_backward(self)
        if (
            twice is not None
            and trains_twice(self, model)
            and not double_backward_only_behind_flags(self)
        ):
            return  # compile cannot train it (nor, when untraceable, any model of the file)
        if twice is not None:
            runs = (
                "may run a double backward (create_graph=<a flag>)"
                if double_backward_only_behind_flags(self)
                else f"runs a {twice}"
            )
            self.report(
                anchor,
                f"model `{model}` is trained without torch.compile (not fixed: the script {runs},"
                " which torch.compile's aot_autograd does not support)",
            )
            return
        device = self._runtime_device([body[i] for i in builds])
        if device is None:
            added: cst.BaseStatement = statement_line(f"{model}.compile()")
            where = ""
        else:  # a CPU fallback must not start paying a cold compile it never paid before
            added = cst.parse_statement(
                f'if {self._device_type(device)} == "cuda":\n    {model}.compile()\n'
            )
            where = " on CUDA"
        new = cst.FlattenSentinel([anchor, added])
        self.report(
            anchor,
            f"model `{model}` is trained without torch.compile; call `{model}.compile()`{where}"
            " once it is built and placed",
            fix=Fix(
                replacements={anchor: new},
                description=f"insert {model}.compile(){where}",
                add_imports=torch_imports(self.context.module) if device else (),
            ),
        )

    def _rebuilt_while_training(self, scope: cst.FunctionDef) -> bool:
        """`scope` is a module-level builder (it trains nothing itself) that this file calls
        inside a training loop: what it builds is re-assigned while training, as a
        best-checkpoint swap is. A function that runs a whole training and is called again
        (yolov5's `train()` per hyperparameter-evolution round) builds a new model each time."""
        if self.parent(scope) is not self.context.module:
            return False
        if any(contains(scope, loop) for loop in self.facts.training_loops):
            return False
        return any(
            is_name(call.func, scope.name.value)
            and any(self.facts.is_training_loop(loop) for loop in self.facts.enclosing_loops(call))
            for call in nodes_of_type(self.context.module, cst.Call)
        )

    def _modules_differentiate_a_gradient(self, classes: set[str]) -> bool:
        """A project module the file imports (two deep) differentiates through a gradient
        (`torch.autograd.grad(..., create_graph=True)`) in a module's forward or a free
        function (FFJORD's ODE function, SIREN's `diff_operators.gradient`), or in a method of
        one of `classes`, those the model is built from (HNN's `time_derivative`): compile
        cannot train what goes through it."""
        return self.context.program.reaches_text_that_says(
            lambda text: _differentiates_a_gradient(text, classes)
        )

    def _runtime_device(self, builds: Sequence[cst.BaseStatement]) -> str | None:
        """The device the statements that build and place the model put it on, when the
        script picks it at run time (`model = Net().to(device)` with `device = "cuda" if
        available else "cpu"`): the compile goes behind a test of it. None when the model goes
        to CUDA by name (`.cuda()`, `.to("cuda")`, a device bound to "cuda" only) or its
        placement is not in sight."""
        found = None
        for stmt in builds:
            for call in calls_in(stmt):
                if not isinstance(call.func, cst.Attribute):
                    continue
                if call.func.attr.value == "cuda":
                    if found is not None and isinstance(stmt, cst.If):
                        continue  # `if n_gpu > 1: model = DataParallel(model).cuda()` (GPT2-chitchat)
                    return None
                if call.func.attr.value != "to" or not call.args:
                    continue
                first = call.args[0]
                if first.keyword is not None and first.keyword.value != "device":
                    continue
                text = string_value(first.value)
                if text is not None:
                    return None if text.startswith("cuda") else found
                name = dotted(first.value)
                if name is not None and not any(
                    q.startswith("torch.") for q in self.qualified_names(first.value)
                ):
                    found = None if self._names_cuda(name) else name
        return found

    def _device_type(self, device: str) -> str:
        """`device.type` for a name bound to `torch.device(...)` only, else
        `torch.device(<device>).type` (a string, an index or a device alike)."""
        values = self._assigned(device)
        if values and all(
            isinstance(v, cst.Call) and self.is_call_to(v, "torch.device") for v in values
        ):
            return f"{device}.type"
        torch, _ = torch_name(self)
        return f"{torch}.device({device}).type"

    def _assigned(self, name: str) -> list[cst.BaseExpression]:
        return [
            n.value
            for n in nodes_of_type(self.context.module, cst.Assign)
            if any(dotted(t.target) == name for t in n.targets)
        ]

    def _names_cuda(self, name: str) -> bool:
        """Every assignment of `name` in the file is CUDA by name (`device = "cuda:0"`,
        `torch.device("cuda")`)."""
        values = self._assigned(name)

        def cuda(value: cst.BaseExpression) -> bool:
            if (
                isinstance(value, cst.Call)
                and self.is_call_to(value, "torch.device")
                and value.args
            ):
                value = value.args[0].value
            text = string_value(value)
            return text is not None and text.startswith("cuda")

        return bool(values) and all(cuda(v) for v in values)

    def _where_built(
        self, opt_call: cst.Call, model: str
    ) -> tuple[Sequence[cst.BaseStatement], list[int], int] | None:
        """(statements, those that build or place `model`, the first that trains) in the
        innermost block around `opt_call`, within its function, that both builds the model and
        then trains it (an `if __name__ == "__main__":` body, a `try:` around the training call
        counts as training); None when no block does."""
        scope = self.facts.enclosing_scope(opt_call)
        blocks: list[cst.IndentedBlock | cst.Module] = [
            anc
            for anc in self.facts.ancestors(opt_call)
            if isinstance(anc, cst.IndentedBlock) and not contains(anc, scope)
        ]
        outer = scope.body if isinstance(scope, cst.FunctionDef) else scope
        if isinstance(outer, cst.IndentedBlock | cst.Module) and outer not in blocks:
            blocks.append(outer)
        for block in blocks:
            body: Sequence[cst.BaseStatement] = block.body
            # The first statement that trains (a `def` holding a loop only trains when called).
            training = next(
                (
                    i
                    for i, stmt in enumerate(body)
                    if not isinstance(stmt, cst.FunctionDef | cst.ClassDef)
                    and self._has_training_loop(stmt)
                ),
                len(body),
            )
            builds = [i for i, stmt in enumerate(body[:training]) if binds_or_places(stmt, model)]
            if builds:
                return body, builds, training
        return self._built_by_another_method(scope, model)

    def _built_by_another_method(
        self, scope: cst.CSTNode, model: str
    ) -> tuple[Sequence[cst.BaseStatement], list[int], int] | None:
        """A trainer class's model (`self.model`) built by another of its methods (its
        `__init__`) than the one that builds the optimizer and trains: that method's statements
        and those that build or place the model. None when the training method
        rebinds the model (a swap the compiled module would miss)."""
        owner = self.facts.ancestors(scope)
        cls = next((a for a in owner if isinstance(a, cst.ClassDef)), None)
        if not model.startswith("self.") or cls is None or not isinstance(scope, cst.FunctionDef):
            return None
        if any(binds_or_places(stmt, model, rebinds=True) for stmt in scope.body.body):
            return None
        for method in cls.body.body:
            if not isinstance(method, cst.FunctionDef) or method is scope:
                continue
            body = method.body.body
            builds = [i for i, stmt in enumerate(body) if binds_or_places(stmt, model)]
            if builds and _handed_in(body[builds[0]], model, method):
                return None  # `self.model = model.to(device)`: the caller built it, compiles it
            if builds:
                return body, builds, len(body)
        return None

    def _built_by_a_base(self, opt_call: cst.Call, model: str) -> None:
        """`self.model` built by a base class of the project in another module (Autoformer's
        `Exp_Basic.__init__`), trained by this class's optimizer: reported at the optimizer,
        without a fix (the compile goes in the base class, once the model is placed)."""
        scope = self.facts.enclosing_scope(opt_call)
        cls = next((a for a in self.facts.ancestors(scope) if isinstance(a, cst.ClassDef)), None)
        if not model.startswith("self.") or model.count(".") != 1 or cls is None:
            return
        if any(
            binds_or_places(stmt, model, rebinds=True)
            for method in cls.body.body
            if isinstance(method, cst.FunctionDef)
            for stmt in method.body.body
        ):
            return  # the class binds it itself: `_where_built` decided
        where = self.context.program.base_binding(cls.name.value, model.removeprefix("self."))
        if where is None or double_backward(self) is not None:
            return
        self.report(
            opt_call,
            f"model `{model}` is trained without torch.compile (not fixed: it is built in "
            f"{where}; call `{model}.compile()` there, once it is built and placed)",
        )

    def _returns_what_it_trains(self, stmt: cst.BaseStatement, model: str) -> bool:
        """`model = do_train(cfg, model, ...)`: the training call hands back the model it was
        given (the same object, trained), no swap."""
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return False
        assign = stmt.body[0]
        return (
            isinstance(assign, cst.Assign)
            and any(assign.value is call for call in self.facts.training_calls)
            and any(mentions(a.value, model) for a in assign.value.args)
        )

    def _has_training_loop(self, stmt: cst.BaseStatement) -> bool:
        """`stmt` holds a training loop, or builds a library trainer that runs one."""
        points = [*self.facts.training_points, *self._trainers]
        return any(contains(stmt, point) for point in points)

    def _shadowed_or_scripted(self, module: cst.Module) -> bool:
        """A user-defined `compile` (function, method, import, variable), or TorchScript /
        `torch._dynamo` already in use."""
        # A name resolves to `torch.jit.*` / `torch._dynamo.*` only through text that spells
        # it (an import or an attribute): without that text no call needs its names resolved.
        source = self.context.source
        kinds = (cst.FunctionDef, cst.ImportAlias, cst.AssignTarget)
        if "jit" in source or "_dynamo" in source:
            kinds += (cst.Call,)
        for n in nodes_of_type(module, kinds):
            if isinstance(n, cst.FunctionDef) and n.name.value == "compile":
                return True
            if isinstance(n, cst.ImportAlias | cst.AssignTarget) and "compile" in names_in(n):
                return True
            if isinstance(n, cst.Call) and self.refers_to(n.func, *_SCRIPTED):
                return True
        return False


def _built_classes(statements: list[cst.BaseStatement]) -> set[str]:
    """The class names the statements that build the model call (`model = HNN(...)`)."""
    found: set[str] = set()
    for statement in statements:
        for assign in nodes_of_type(statement, cst.Assign):
            value = without_placement(assign.value)
            if isinstance(value, cst.Call):
                found.add((dotted(value.func) or "").rsplit(".", 1)[-1])
    return found


def _differentiates_a_gradient(text: str, classes: set[str]) -> bool:
    """The text differentiates through a gradient (`autograd.grad(..., create_graph=True)`)
    in a module's `forward` (FFJORD's ODE function), in a free function handed outputs
    (SIREN's `diff_operators.gradient`) or in a method of one of `classes` (HNN's
    `time_derivative`); not in a method of another class (GAIL's
    `Discriminator.compute_grad_pen`, a penalty on that class's own model)."""
    if "create_graph=True" not in text or "autograd.grad(" not in text:
        return False
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return True  # unreadable: as the text says
    sites: set[str] = set()
    _double_backward_sites(tree, None, None, sites)
    return "*" in sites or bool(sites & classes)


def _double_backward_sites(
    node: ast.AST, cls: ast.ClassDef | None, func: ast.AST | None, sites: set[str]
) -> None:
    """Adds to `sites` "*" for a double backward in a free function or a `forward`, and the
    class name for one in another method of a class."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            inner_cls, inner_func = child, None
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            inner_cls, inner_func = cls, func or child
        else:
            inner_cls, inner_func = cls, func
        if (
            isinstance(child, ast.Call)
            and isinstance(child.func, ast.Attribute | ast.Name)
            and (child.func.attr if isinstance(child.func, ast.Attribute) else child.func.id)
            == "grad"
            and any(
                k.arg == "create_graph"
                and isinstance(k.value, ast.Constant)
                and k.value.value is True
                for k in child.keywords
            )
        ):
            in_forward = cls is None or getattr(func, "name", None) == "forward"
            sites.add("*" if in_forward else cls.name)  # type: ignore[union-attr]
        _double_backward_sites(child, inner_cls, inner_func, sites)
