"""Find the training: the functions that reach `.backward()` (in the script and the local modules
it imports), the helpers beside them that step an optimizer, and each optimizer they step.

An optimizer is whatever the training code steps: `X.step()` next to `X.zero_grad()`, or
`scaler.step(X)`; `for opt in optimizers: opt.step()` steps each optimizer the collection names;
a plain class wrapping an optimizer (`optimizer.step_and_update_lr()`) is stepped through its
own methods (`OptimizerWrappers`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoopt.lint.tree.nodes import code_of
from autoopt.lint.wrap.codebase import CodeBase, Func, SourceFile
from autoopt.lint.wrap.tree import (
    MODEL_METHODS,
    assignments_of,
    bound_to,
    is_member_object,
    is_object,
    is_plain_class,
    is_self,
    loop_source,
    stepping_methods,
)

# How many calls below a function that does the backward a helper may step the optimizer
# (`train_step()` -> `self._apply_gradients()` -> `self.optimizer.step()`).
_STEP_HELPER_DEPTH = 2


@dataclass(frozen=True)
class Use:
    """An optimizer stepped in `func`: its expression there and the stepping call."""

    func: Func
    expr: str
    node: cst.CSTNode


@dataclass
class Training:
    """What the training code steps: the functions that train, the helpers that may step beside
    them, each optimizer use, and the collections iterated to step (`for opt in optimizers`)."""

    trainers: list[Func]
    steppers: list[Func]
    uses: list[Use] = field(default_factory=list)
    collections: set[str] = field(default_factory=set)
    closures: set[str] = field(default_factory=set)  # stepped as `opt.step(closure)` (LBFGS)
    # stepped through a method of a class --wrap cannot read: `optimizer.step_and_update_lr()`
    unseen_wrappers: dict[str, str] = field(default_factory=dict)

    @property
    def stepped(self) -> set[str]:
        """Every expression found stepped."""
        return {u.expr for u in self.uses}


def training_functions(code: CodeBase) -> list[Func]:
    """Functions (and module code) of the script that do a backward, themselves or through
    their helpers, and those helpers (in local modules too)."""
    # a stack popped from its end, filled in reverse: the functions come in the program's
    # order (the script's code, then what it calls first), which declines list them in
    todo = [code.top(code.script), *(Func(code.script, f) for f in script_defs(code.script))]
    todo.reverse()
    found: dict[Func, None] = {}
    while todo:
        func = todo.pop()
        if func in found or not code.does_backward(func):
            continue
        found[func] = None
        todo += reversed([t for c in func.calls() for t in code.runs(func.file, c)])
    return list(found)


def script_defs(file: SourceFile) -> list[cst.FunctionDef]:
    """The file's functions and methods (not nested ones)."""
    out = list(file.functions.values())
    for cls in file.classes.values():
        out += [s for s in cls.body.body if isinstance(s, cst.FunctionDef)]
    return out


def stepping_functions(
    code: CodeBase, trainers: list[Func], wrappers: OptimizerWrappers | None = None
) -> list[Func]:
    """The training functions and the helpers they call, where an optimizer may be stepped
    apart from the backward (`self._apply_gradients()` after `loss.backward()`); not the
    methods of a class wrapping an optimizer (LSTNet's `Optim.step()`: the loop steps the
    wrapper, which `wrappers` tells)."""
    found: dict[Func, None] = dict.fromkeys(trainers)
    layer = list(trainers)
    for _ in range(_STEP_HELPER_DEPTH):
        layer = [
            t
            for f in layer
            for c in f.calls()
            if (t := code.resolve(f.file, c)) is not None
            and t not in found
            and not _steps_a_wrapper(c, t, wrappers)
        ]
        found.update(dict.fromkeys(layer))
    return list(found)


def _steps_a_wrapper(call: cst.Call, target: Func, wrappers: OptimizerWrappers | None) -> bool:
    """`optim.step()` on an object of a class wrapping an optimizer (LSTNet's `Optim`), not a
    trainer's own helper (`self._apply_gradients()`)."""
    receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
    return (
        wrappers is not None
        and target.cls is not None
        and receiver is not None
        and not is_self(receiver)
        and bool(wrappers.steppers(target.file, target.cls))
    )


def find_training(code: CodeBase, trainers: list[Func], wrappers: OptimizerWrappers) -> Training:
    """The optimizers stepped by `trainers` and the helpers beside them."""
    training = Training(trainers, stepping_functions(code, trainers, wrappers))
    for func in training.steppers:
        training.uses += optimizer_uses(code, func, wrappers, training)
    return training


def optimizer_uses(
    code: CodeBase, func: Func, wrappers: OptimizerWrappers, training: Training | None = None
) -> list[Use]:
    """Each optimizer stepped in `func`; the collections stepped through a loop over them
    (`for opt in optimizers: opt.step()`) and the optimizers stepped with a closure are noted
    in `training`."""
    stepped: dict[str, cst.CSTNode] = {}
    zeroed: set[str] = set()
    certain: set[str] = set()  # stepped as only an optimizer is: scaler.step(X), X.step(closure)
    unseen: dict[str, str] = {}  # stepped through a method of a wrapper class not found
    # what scales a loss is a loss scaler, whatever its name (NVAE's `grad_scalar`)
    scalers = {
        code_of(c.func.value)
        for c in func.calls()
        if isinstance(c.func, cst.Attribute) and c.func.attr.value == "scale" and c.args
    }
    for call in func.calls():
        if not isinstance(call.func, cst.Attribute):
            continue
        attr, receiver = call.func.attr.value, call.func.value
        if isinstance(receiver, cst.Name) and (source := loop_source(func, receiver, call)):
            receiver = source  # `for opt in optimizers: opt.step()`
            if training is not None:
                training.collections.add(code_of(source))
        if (
            attr != "step"
            and attr not in MODEL_METHODS  # `self.model.train()`: a module's mode, not a
            and is_object(receiver)  # wrapper's stepping `train()` (FourCastNet's Trainer)
            and wrappers.wrapper_of(call)
        ):
            # `optimizer.step_and_update_lr()` of a class wrapping the optimizer
            stepped.setdefault(code_of(receiver), call)
        elif attr != "step" and "step" in attr.lower() and not call.args and is_object(receiver):
            # the same through a class --wrap cannot read (in a module it does not reach)
            stepped.setdefault(code_of(receiver), call)
            unseen[code_of(receiver)] = attr
        elif (
            attr == "step"
            and not call.args
            and (
                is_object(receiver)
                or is_member_object(receiver)
                or _held_by_a_local_object(code, func, receiver)
            )
        ):
            stepped.setdefault(code_of(receiver), call)
        elif is_object(receiver) and code.step_closure(func.file, call):
            # `optimizer.step(closure)`: LBFGS re-runs the forward and backward in the closure
            stepped.setdefault(code_of(receiver), call)
            certain.add(code_of(receiver))
            if training is not None:
                training.closures.add(code_of(receiver))
        elif attr == "zero_grad" and is_object(receiver):
            zeroed.add(code_of(receiver))
        elif (
            attr == "step"
            and call.args
            and ("scaler" in code_of(receiver).lower() or code_of(receiver) in scalers)
            and (is_object(call.args[0].value) or is_member_object(call.args[0].value))
        ):
            expr = code_of(call.args[0].value)  # scaler.step(optimizer)
            certain.add(expr)
            stepped.setdefault(expr, call)
    uses = []
    for expr, node in stepped.items():
        word = expr.lower()
        sure = expr in zeroed or expr in certain  # no scheduler or EMA is zeroed or scaled
        if not sure and "sched" in word:
            # MusicTransformer's `scheduler = CustomSchedule(d, optimizer=opt)`: a class of
            # the project whose step() steps the optimizer it holds, not an LR scheduler
            sure = wrappers.wrapper_class(func, expr, assignments_of(func, expr)) is not None
        if not sure and ("sched" in word or "scaler" in word or "ema" in word.split(".")):
            continue
        if sure or "opt" in word:
            uses.append(Use(func, expr, node))
            if expr in unseen and training is not None:
                training.unseen_wrappers[expr] = unseen[expr]
    return uses


def _held_by_a_local_object(code: CodeBase, func: Func, expr: cst.BaseExpression) -> bool:
    """`trainer_module.optimizer_d` where `trainer_module` is an instance of a local class
    (generative-inpainting: `trainer = Trainer(config)`, `trainer_module = trainer.module`);
    not `optims.discriminator` of a dict nor `model.optimizer` of a model's own."""
    if not (isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name)):
        return False
    names, seen = [expr.value.value], set()
    while names:
        name = names.pop()
        if name in seen or name in ("self", "cls"):
            continue
        seen.add(name)
        for assign in assignments_of(func, name):
            value = bound_to(assign, name)
            while isinstance(value, cst.Attribute) and value.attr.value == "module":
                value = value.value  # the module inside a DataParallel wrap
            if isinstance(value, cst.Name):
                names.append(value.value)
            elif isinstance(value, cst.Call) and code.called_class(func.file, value.func):
                return True
    return False


class OptimizerWrappers:
    """The plain classes of the code base that hold a torch optimizer and step it in their own
    methods (ScheduledOptim's `step_and_update_lr()` -> `self._optimizer.step()`)."""

    def __init__(self, code: CodeBase) -> None:
        self.code = code
        self._stepping: dict[int, set[str]] = {}

    def steppers(self, file: SourceFile, cls: cst.ClassDef) -> set[str]:
        """The stepping methods of `cls` when it is a plain class wrapping an optimizer."""
        if id(cls) not in self._stepping:
            wraps = is_plain_class(file, cls)
            self._stepping[id(cls)] = stepping_methods(file, cls) if wraps else set()
        return self._stepping[id(cls)]

    def wrapper_of(self, call: cst.Call) -> str | None:
        """The local class with a method of `call`'s name that steps an optimizer it holds."""
        func = call.func
        assert isinstance(func, cst.Attribute)
        name = func.attr.value
        for file in self.code.files():
            for cls in file.classes.values():
                if name in self.steppers(file, cls):
                    return cls.name.value
        return None

    def wrapper_class(
        self, home: Func, expr: str, assigns: list[cst.CSTNode]
    ) -> tuple[str, set[str]] | None:
        """The local class `expr` (bound by `assigns` in `home`) is an instance of, and its
        stepping methods, when it wraps an optimizer (then it is no optimizer optimize() can
        take)."""
        for assign in assigns:
            value = bound_to(assign, expr)
            if isinstance(value, cst.Call):
                found = self.code.called_class(home.file, value.func)
                if found is not None and (methods := self.steppers(*found)):
                    return code_of(value.func), methods
                # a local factory that returns one (end2end-asr's `init_optimizer(args, model,
                # "noam")` returning `NoamOpt(..., torch.optim.Adam(...))`)
                factory = self.code.resolve(home.file, value) if found is None else None
                if factory is not None and (made := self._returned_wrapper(factory)):
                    return made
        return None

    def _returned_wrapper(self, factory: Func) -> tuple[str, set[str]] | None:
        for node in factory.statements():
            if isinstance(node, cst.Return) and isinstance(node.value, cst.Name):
                name = node.value.value
                for assign in assignments_of(factory, name):
                    value = bound_to(assign, name)
                    if isinstance(value, cst.Call):
                        found = self.code.called_class(factory.file, value.func)
                        if found is not None and (methods := self.steppers(*found)):
                            return code_of(value.func), methods
        return None


def runs_epochs(code: CodeBase, func: Func) -> bool:
    """`func` runs the whole training, not one pass: a loop of it holds another loop that
    trains (`for epoch ...: for batch in loader:`), its own or a helper's it calls."""
    file = func.file
    loops = [n for n in func.statements() if isinstance(n, cst.For | cst.While)]
    for outer in loops:
        inner = [n for n in loops if n is not outer and any(a is outer for a in file.ancestors(n))]
        if any(trains_in(code, func, n) for n in inner):
            return True
        for call in file.calls(outer):
            target = code.resolve(file, call)
            if (
                target is not None
                and target != func
                and any(
                    trains_in(code, target, n)
                    for n in target.statements()
                    if isinstance(n, cst.For | cst.While)
                )
            ):
                return True
    return False


def trains_in(code: CodeBase, func: Func, loop: cst.CSTNode) -> bool:
    """Something in the body of `loop` (a loop of `func`) trains."""
    body = loop.body  # type: ignore[attr-defined]
    return any(code.trains(func, c) for c in func.file.calls(body))


def loop_around_calls(code: CodeBase, func: Func) -> tuple[Func, cst.CSTNode] | None:
    """(caller, loop) where a caller calls `func` on every pass of a loop (`for epoch in
    range(10): train_model(model, ...)`), if one does."""
    for caller, call in code.callers(func):
        for anc in caller.file.ancestors(call):
            if anc is caller.node:
                break
            if isinstance(anc, cst.For | cst.While):
                return caller, anc
    return None
