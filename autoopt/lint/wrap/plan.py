"""Where `--wrap` inserts `autoopt.optimize(...)`, with which names and options, or why it won't.

The analysis starts from what training does, not from where things are written, in named steps
(one module each, run in this order by `plan_wrap`):

1. **What the script runs on** (`options.conflict`, `options.own_precision`): Accelerate,
   Lightning, ignite, RPC and Hogwild scripts, and scripts running another mixed-precision
   system (apex amp, a half model, loss scaling by hand, a loss scaler object that does the
   backward and the step), are declined.
2. **Find the loop** (`loop`): the functions that reach `.backward()`, also in local modules,
   and each optimizer they or their helpers step (`X.step()` next to `X.zero_grad()`,
   `scaler.step(X)`, `for opt in optimizers: opt.step()`, a plain class wrapping one).
3. **Bind the optimizers** (`origins`): each one followed back through parameters, callers and
   `self.` attributes to the statement that creates it; the function holding those statements
   is where the call goes (`main()` that builds the optimizer and calls `train()` later).
4. **Bind the model and the loader** (`bind`): whose `.parameters()` build each optimizer (one
   call per pair; a model stepped by an optimizer over several models gets a call without it,
   in the script's precision: `amp="script"`), and what the training loop iterates, followed
   back to that function.
5. **Choose the insertion point** (`anchor`): after the optimizers and the loader exist, before
   the statement that starts training; what the call names must be bound there on every path,
   and not already kept by something built before it (`looper = cycle(loader)`: the call goes
   without the loader).
6. **Decide the options and the device** (`options`, `device`): what the script already does
   itself hands the overlapping option to it with a comment (its own autocast/GradScaler:
   `amp="script"`; torch.compile, DDP wrap: `=False`); `device=` is where the script itself
   puts the model, in its names.
7. **Write the call** (`call`), or **explain the decline** (`decline`): every decline says
   why, in one place.
"""

from __future__ import annotations

import builtins
import re
from pathlib import Path

import libcst as cst

from autoopt.lint.program.library import OPTIMIZER_CLASSES, OPTIMIZER_FACTORIES
from autoopt.lint.tree.nodes import code_of, names_in, walk
from autoopt.lint.wrap import decline
from autoopt.lint.wrap.anchor import (
    called_in,
    captures,
    defined,
    header,
    loader_intact,
    only_under_a_flag,
    place_call,
    recreated_in_training_loop,
    runs_the_global,
)
from autoopt.lint.wrap.bind import loader_of, pair_models
from autoopt.lint.wrap.call import Pair, Plan
from autoopt.lint.wrap.codebase import CodeBase, Func, SourceFile, is_backward, on_self
from autoopt.lint.wrap.decline import Decline
from autoopt.lint.wrap.device import device_for, moved_after, moved_in_callee
from autoopt.lint.wrap.loop import OptimizerWrappers, Training, find_training, training_functions
from autoopt.lint.wrap.options import (
    conflict,
    own_precision,
    scaler_steps,
    wrapped_before,
    wrapped_in_constructor,
)
from autoopt.lint.wrap.origins import (
    Origin,
    bind_optimizers,
    creates_optimizer,
    steps_tensors,
    where_created,
)
from autoopt.lint.wrap.tree import assignments_of, bound_name, statement_of

__all__ = ["Decline", "Pair", "Plan", "plan_wrap"]

_OPTIMIZE = {"autoopt.optimize", "autoopt.runtime.optimize", "autoopt.runtime.optimize.optimize"}


def plan_wrap(module: cst.Module, path: Path | None) -> Plan | Decline | None:
    """The insertion for `module` (the file at `path`), why there is none, or None when the
    script already calls autoopt.optimize()."""
    code = CodeBase(module, path)
    if any(code.script.qualname(c.func) in _OPTIMIZE for c in code.script.calls()):
        return None
    return _told_with_the_other_file(_plan(code))


def _told_with_the_other_file(found: Plan | Decline) -> Plan | Decline:
    """A decline that sends the user to the file creating the optimizer says as well why
    --wrap would decline there (Swin-Unet's trainer.py wraps the model in DataParallel before
    its optimizer): one run tells the whole change."""
    if not isinstance(found, Decline) or found.elsewhere is None:
        return found
    try:
        there = _plan(CodeBase(cst.parse_module(found.elsewhere.read_bytes()), found.elsewhere))
    except (OSError, cst.ParserSyntaxError, RecursionError):
        return found
    if not isinstance(there, Decline) or there.reason == found.reason:
        return found
    # one of several files (Point-MAE's pretraining and fine-tuning runners): name it
    where = "there" if "optimizers are created" not in found.detail else f"in {found.elsewhere}"
    return Decline(
        found.reason,
        f"{found.detail}; {where}, {there.detail}",
        f"in {found.elsewhere}, {there.change.replace('run --wrap again', 'run --wrap on it')}",
    )


def _plan(code: CodeBase) -> Plan | Decline:
    """The steps in order: what the script runs on, the loop and its optimizers, where they
    are created, then the call."""
    if why := conflict(code, code.script):
        return why
    trainers = training_functions(code)
    if not trainers:
        return _no_loop_reached(code)
    for func in trainers:
        if func.file is not code.script and (why := conflict(code, func.file)):
            return why
    wrappers = OptimizerWrappers(code)
    training = find_training(code, trainers, wrappers)
    if not training.uses:
        if where := _optimizers_of_built_objects(code, code.script):
            return decline.optimizer_in_module(where)  # stepped in code --wrap cannot follow
        # where the backward is, when in another file (prototypical-networks' Engine.train,
        # stepping `state["optimizer"]`): where to look
        backward = [
            where_created(f)
            for f in trainers
            if f.file is not code.script and any(is_backward(c) for c in f.calls())
        ]
        return decline.no_optimizer(backward)
    for expr, method in training.unseen_wrappers.items():
        return decline.optimizer_wrapper_unseen(expr, method)
    for use in training.uses:
        if _is_module_forward(use.func):
            return decline.steps_inside_forward(use.func.cls.name.value, use.expr)  # type: ignore[union-attr]
    # Only a script that trains and steps an optimizer is declined for its own precision
    # scheme (an export or validation script that casts a model to half has no loop).
    stepping = {id(code.script): code.script} | {
        id(u.func.file): u.func.file for u in training.uses
    }
    for file in stepping.values():
        if why := own_precision(file):
            return why
    bound = bind_optimizers(code, training)
    if isinstance(bound, Decline):
        return bound
    return _place(code, bound.home, bound.optimizers, bound.stepped, training, wrappers)


def _read_parameters_of(code: CodeBase, optimizers: list[Origin]) -> set[str]:
    """What the optimizers' creation reads the parameters of (`self.model` of
    `Adam(self.model.parameters())`), also inside a method of the same object that builds it
    (Autoformer's `model_optim = self._select_optimizer()`)."""
    read = set()
    for o in optimizers:
        for a in o.assigns:
            scopes = [walk(a)]
            for node in walk(a):
                if (
                    isinstance(node, cst.Call)
                    and on_self(node)
                    and (method := code.resolve(o.func.file, node)) is not None
                ):
                    scopes.append(method.statements())
            read |= {
                code_of(n.value)
                for nodes in scopes
                for n in nodes
                if isinstance(n, cst.Attribute)
                and n.attr.value in ("parameters", "named_parameters")
            }
    return read


def _no_loop_reached(code: CodeBase) -> Decline:
    """Why nothing is inserted in a script whose `.backward()` --wrap cannot reach: what it
    sees of the script still tells the true reason where it can. A model wrapped in
    DataParallel/DDP before the optimizer exists rules the call out wherever the loop is; an
    optimizer handed to a class or function of another module (a `Trainer(model, optimizer,
    ...)`) trains there, in code --wrap cannot follow."""
    file = code.script
    if _uses_hf_trainer(file):
        return decline.hf_trainer()
    for call in file.calls():
        if not creates_optimizer(file, call):
            continue
        home = code.scope(file, call)
        if early := wrapped_before(code, home, call):
            return decline.parallel_before_optimizer(early)
        holder = file.parent(call)
        bound = holder.targets[0].target if isinstance(holder, cst.Assign) else None
        if not isinstance(bound, cst.Name):
            continue
        for later in home.calls():
            if (
                file.before(call, later)
                and any(_is_name(a.value, bound.value) for a in later.args)
                and not _rebinds(file, later, bound.value)  # a checkpoint loader hands it back
                and not _schedules(file, later)
                and not _builtin(file, later)  # `print(optimizer)` trains nothing
            ):
                return decline.trained_in_unread_code(code_of(later.func), bound.value)
    if where := _optimizers_of_built_objects(code, file):
        return decline.optimizer_in_module(where, unreached=True)
    if where := _optimizers_in_project(code):
        return decline.optimizer_elsewhere_in_project(where)
    return decline.no_training_loop()


def _optimizers_of_built_objects(code: CodeBase, file: SourceFile) -> list[str]:
    """Where the classes of local modules the script builds or hands on create their
    optimizers: each as "BCQ.__init__() of BCQ.py" (`policy = BCQ.BCQ(...)`, whose `__init__`
    builds the networks and their Adams), naming the class that defines the method. The
    classes: those it instantiates, also through a factory or a registry (`build_model(opt)`,
    `get_method(name)(args)`), and those it names as values (`AGENTS = [DDPG, TD3]` handed to
    a trainer that instantiates them); then, a few levels down, what their methods and the
    local functions the script runs build and run in turn (edge-connect's `EdgeConnect`
    builds the `EdgeModel` whose `__init__` creates the Adams), nearest first."""
    classes: dict[int, tuple[SourceFile, cst.ClassDef]] = {}
    for node in file.nodes:
        if isinstance(node, cst.Call):
            owners = code.classes_made(file, node)
        elif isinstance(node, cst.Name) and file.reads(node):
            owners = [o] if (o := code.local_class(file, node.value)) is not None else []
        else:
            continue
        classes.update((id(o[1]), o) for o in owners if o[0] is not file)
    level = [m for source, cls in classes.values() for m in code.class_methods(source, cls)]
    level += [t for c in file.calls() for t in code.runs(file, c) if t.file is not file]
    found: dict[str, None] = {}
    seen: set[Func] = set()
    for _ in range(_BUILT_DEPTH):
        deeper: list[Func] = []
        for func in level:
            if func in seen:
                continue
            seen.add(func)
            if any(creates_optimizer(func.file, c) for c in func.calls()):
                found[where_created(func)] = None
                continue
            for call in func.calls():
                for source, cls in code.classes_made(func.file, call):
                    deeper += code.class_methods(source, cls)
                deeper += code.runs(func.file, call)
        if found:  # the nearest level that creates optimizers names the place
            break
        level = deeper
    return list(found)


_BUILT_DEPTH = 4  # levels of classes and functions followed down from the script


def _optimizers_in_project(code: CodeBase) -> list[str]:
    """The last look for a script whose training no call --wrap can follow reaches (a class a
    config names: hydra's `instantiate(cfg.agent)`, a module imported by name at run time):
    the functions of the project's training modules (their text calls `.backward()`) that
    create optimizers, as "DRQAgent.__init__() of drq.py"."""
    found: dict[str, None] = {}
    for source in code.project_files(_trains_and_creates, _PROJECT_FILES_READ):
        for node in source.nodes:
            if not isinstance(node, cst.FunctionDef):
                continue
            func = Func(source, node)
            if any(creates_optimizer(source, c) and not steps_tensors(c) for c in func.calls()):
                found[where_created(func)] = None
    return list(found)


# a module that both calls `.backward()` and builds an optimizer (either order)
_OPTIMIZER_NAMES = "|".join(sorted(OPTIMIZER_CLASSES | OPTIMIZER_FACTORIES))
_CREATES = (
    r"\b(?:optim\.[A-Z]\w*\s*\(|optim\.__dict__\[|getattr\(\s*(?:torch\.)?optim\b"
    rf"|(?:{_OPTIMIZER_NAMES})\s*\()"
)
_CREATES_TEXT = re.compile(_CREATES)


def _trains_and_creates(text: str) -> bool:
    """A module's text calls `.backward()` and builds an optimizer."""
    return ".backward(" in text and _CREATES_TEXT.search(text) is not None


_PROJECT_FILES_READ = 12  # a project-wide look: only so many modules are parsed


def _uses_hf_trainer(file: SourceFile) -> bool:
    """The file imports transformers' Trainer (to run it, or to subclass it: SimCSE's
    `CLTrainer(Trainer)`), and no loop of its own trains."""
    return any(
        d.split(".")[0] == "transformers" and d.rsplit(".", 1)[-1] in _HF_TRAINERS
        for d in file.imports.values()
    )


_HF_TRAINERS = {"Trainer", "Seq2SeqTrainer"}


def _builtin(file: SourceFile, call: cst.Call) -> bool:
    """`print(...)`, `len(...)`: Python's own functions, not rebound by the file."""
    func = call.func
    return (
        isinstance(func, cst.Name)
        and func.value in _BUILTINS
        and func.value not in file.imports
        and func.value not in file.functions
    )


_BUILTINS = frozenset(dir(builtins))


def _schedules(file: SourceFile, call: cst.Call) -> bool:
    """A learning-rate scheduler (or anything else of torch's) built over the optimizer: it
    runs no training (the project's `WarmupMultiStepLR(optimizer, ...)` by its name)."""
    qualified = file.qualname(call.func)
    leaf = qualified.rsplit(".", 1)[-1]
    return qualified.startswith("torch.") or "sched" in leaf.lower() or leaf.endswith("LR")


def _is_name(expr: cst.BaseExpression, name: str) -> bool:
    return isinstance(expr, cst.Name) and expr.value == name


def _rebinds(file: SourceFile, call: cst.Call, name: str) -> bool:
    """`call`'s result is bound to `name` again (`model, optimizer = load_model(model,
    path, optimizer)`)."""
    holder = file.parent(call)
    return isinstance(holder, cst.Assign) and any(
        name in names_in(t.target) for t in holder.targets
    )


def _dataset_changed(home: Func, trainers: list[Func], loader: str) -> str | None:
    """A call that changes the loader's dataset in place while training
    (`train_loader.dataset.ng_sample()`, NCF's negatives drawn again each epoch), as written:
    optimize() rebuilds the loader with persistent workers, which keep the dataset as it was
    at their start."""
    # the dataset by the loader (`loader.dataset`), or by the name it was built over
    # (world-models: `dataset_train.load_next_buffer()` for `DataLoader(dataset_train, ...)`)
    named = _built_over(home, loader)
    for func in dict.fromkeys([home, *trainers]):
        # the dataset's name means it where `home` binds it: there, or read as a global
        # (mnist's `data` is the dataset in main() and a batch in train())
        datasets = {f"{loader}.dataset"} | (
            named if func == home else {n for n in named if not _binds(func, n)}
        )
        for call in func.calls():
            owner = call.func.value if isinstance(call.func, cst.Attribute) else None
            if (
                owner is None
                or code_of(owner) not in datasets
                or call.func.attr.value.startswith("__")  # type: ignore[union-attr]
            ):
                continue
            # through its own name, a call whose value is dropped: a change in place, not a
            # read (DeepLabV3Plus's `train_dst.decode_target(target)`, GraphCL's
            # `dataset.get_num_feature()`)
            if code_of(owner) in named and not isinstance(func.file.parent(call), cst.Expr):
                continue
            return code_of(call)
    return None


def _binds(func: Func, name: str) -> bool:
    """`func` binds `name` itself: an assignment, a parameter, a for loop's target."""
    return (
        bool(assignments_of(func, name))
        or name in func.params()
        or any(isinstance(n, cst.For) and name in names_in(n.target) for n in func.statements())
    )


def _built_over(home: Func, loader: str) -> set[str]:
    """The names of the datasets `loader` is built over in `home` (`DataLoader(dataset_train,
    ...)`, `dataset=`)."""
    found = set()
    for assign in assignments_of(home, loader):
        value = getattr(assign, "value", None)
        if isinstance(value, cst.Call) and code_of(value.func).split(".")[-1] == "DataLoader":
            first = next((a for a in value.args if a.keyword is None), None)
            named = next(
                (a for a in value.args if a.keyword is not None and a.keyword.value == "dataset"),
                first,
            )
            if named is not None and isinstance(named.value, cst.Name):
                found.add(named.value.value)
    return found


def _is_module_forward(func: Func) -> bool:
    """`func` is the forward() of a class with bases (an nn.Module: MAML's Meta steps its
    optimizer there)."""
    cls = func.cls
    return (
        isinstance(func.node, cst.FunctionDef)
        and func.node.name.value == "forward"
        and cls is not None
        and bool(cls.bases)
    )


def _placement_to_follow(
    file: SourceFile, model: str, anchor: cst.CSTNode, moved: cst.Call
) -> cst.CSTNode | None:
    """The statement `moved` (a placement of `model` after the call's place) when the call can
    go after it instead: a statement of its own (`model.to(device)`) in the anchor's block, and
    no statement between them names the model (a wrap, a compile, a use)."""
    block = file.parent(anchor)
    statement = file.parent(file.parent(moved))
    if not isinstance(statement, cst.SimpleStatementLine) or file.parent(statement) is not block:
        return None
    if not isinstance(file.parent(moved), cst.Expr):
        return None  # `net = model.to(device)` binds another name: the call cannot follow it
    body = list(block.body)  # type: ignore[attr-defined]
    start, end = body.index(anchor), body.index(statement)
    if end <= start or any(model in names_in(s) for s in body[start + 1 : end]):
        return None
    return statement


def _kept_from(home: Func, member: str) -> str | None:
    """The parameter of `home` that its only binding of `member` keeps (`self.model = model`
    in `__init__(self, model)`)."""
    binds = assignments_of(home, member) if member.startswith("self.") else []
    name = bound_name(binds[0], member) if len(binds) == 1 else None
    return name if name in home.params() else None


def _trained_as_global(home: Func, model: str, member: str) -> Decline:
    owner = f"{home.cls.name.value}." if home.cls is not None else ""
    return decline.trained_as_global(model, member, owner + home.name)


def _place(
    code: CodeBase,
    home: Func,
    optimizers: list[Origin],
    stepped: set[str],
    training: Training,
    wrappers: OptimizerWrappers,
) -> Plan | Decline:
    """The call in `home`: the models bound, the insertion point chosen, the device decided."""
    trainers = training.trainers
    # A model wrapped in DDP/FSDP before the optimizer is created rules out every place for
    # the call, whatever the optimizer is built over: say so first (parameter groups
    # gathered in a loop would otherwise be "cannot tell the model").
    first = min((a for o in optimizers for a in o.assigns), key=lambda a: home.file.order[id(a)])
    over = _read_parameters_of(code, optimizers)
    if early := wrapped_before(code, home, first, over=over) or wrapped_in_constructor(
        code, home, over
    ):
        return decline.parallel_before_optimizer(early)
    if why := scaler_steps(training.steppers, stepped):
        return why
    for opt in optimizers:
        if wrapped := wrappers.wrapper_class(home, opt.expr, opt.assigns):
            return decline.optimizer_wrapper(opt.expr, *wrapped)
    if again := recreated_in_training_loop(code, home, optimizers):
        # say so before binding: what it is rebuilt over may be a part of the model
        return decline.optimizer_in_training_loop(again[0], header(again[1]))
    pairing = pair_models(code, home, optimizers, stepped)
    if isinstance(pairing, Decline):
        return pairing
    pairs, forced = pairing.pairs, pairing.forced
    if training.closures:
        # The runtime's fp16 loss scaling checks the gradients before a step; a step that runs
        # its own closure (LBFGS) cannot be checked first: the script keeps its precision
        # (amp="script": no autocast or loss scaling added; compile and the rest as usual).
        forced["amp"] = "the optimizer steps through a closure: loss scaling cannot check it first"
    # optimize() only accepts an optimizer over its own model's parameters, and fp16 loss
    # scaling lives in the optimizer's step: without the optimizer, mixed precision would
    # step on unscaled (or non-finite) gradients. So every call of such a script keeps the
    # script's precision (amp="script").
    loader = loader_of(code, home, trainers, training.uses)
    placed = place_call(code, home, optimizers, loader, pairs, trainers, forced)
    if isinstance(placed, Decline) and loader is not None:
        # e.g. the loader is built after the user's own DataParallel wrap: a call without
        # the loader, right after the optimizer, still comes before that wrap.
        pairs[0].loader = None
        placed = place_call(code, home, optimizers, None, pairs, trainers, forced)
    if isinstance(placed, Plan) and pairs[0].loader and not loader_intact(code, home, placed):
        # The loader is not bound where the call goes on every path, or something built
        # before it (`looper = cycle(loader)`) keeps the original: the call goes without it.
        pairs[0].loader = None
        placed = place_call(code, home, optimizers, None, pairs, trainers, forced)
    if not isinstance(placed, Plan):
        return placed
    if (passed := pairs[0].loader) and (changed := _dataset_changed(home, trainers, passed)):
        # only a loader the call gets is rebuilt with persistent workers (dfdc's loader, made
        # anew each epoch after `data_train.reset(epoch)`, is not passed: nothing to keep)
        return decline.dataset_changed_between_epochs(changed)
    for pair in pairs:
        if not defined(code, home, pair.model, placed.anchor):
            return decline.model_unbound(pair.model)
        if (kept := _kept_from(home, pair.model)) and runs_the_global(trainers, kept, pair.model):
            return _trained_as_global(home, kept, pair.model)
        for target, alias in captures(home, pair.model, placed.anchor):
            if alias and target.startswith("self."):
                if runs_the_global(trainers, pair.model, target):
                    return _trained_as_global(home, pair.model, target)
                pair.model = target  # `self.model = model`: the loop trains self.model
            elif called_in(trainers, target):
                return decline.trained_through(pair.model, target)
        pair.device = device_for(code, home, pair.model, placed.anchor)
        moved = moved_after(code, home, pair.model, placed.anchor, pair.device)
        if moved and (later := _placement_to_follow(home.file, pair.model, placed.anchor, moved)):
            # nanoVLM: AdamW, then `model.to(device)` once the device is picked: the call goes
            # after the placement, the model then on its device
            placed.anchor = later
            pair.device = device_for(code, home, pair.model, placed.anchor)
            moved = moved_after(code, home, pair.model, placed.anchor, pair.device)
        if moved:
            return decline.moved_after_call(pair.model, statement_of(home.file, moved))
        if inside := moved_in_callee(code, home, pair.model, placed.anchor, pair.device):
            func, inner = inside
            where = f"{func.name}() of {func.file.path}" if func.file is not home.file else None
            statement = statement_of(func.file, inner)
            return decline.moved_after_call(pair.model, statement, where or f"{func.name}()")
        if pair.optimizer and only_under_a_flag(home, pair.optimizer, placed.anchor):
            # `if args.use_optimizer: optimizer = AdamW(...)`: passing it would raise a
            # NameError on the other path. The model alone, in fp32 (fp16 loss scaling lives
            # in the optimizer's step); the optimizer keeps the model's own parameters.
            why = f"`{pair.optimizer}` exists only on some paths"
            pair.optimizer = None
            amp = placed.options.get("amp")
            placed.options["amp"] = f"{amp}; {why}" if amp else why
    return placed
