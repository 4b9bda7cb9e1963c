"""Decide the call's `device=`: where the script itself puts the model, as an expression valid
where the call goes. `model.to(device)` gives `device`; under a flag (`if args.gpu:
model.cuda()`) the flag's own choice (`"cuda" if args.gpu else "cpu"`); a local factory that
builds and places the model (`net = get_network(args)`) or a class it is handed to
(`Trainer(model)` moving it to `self.gpu_id`) gives that placement in the script's names; a
script with no GPU path at all gets `"cpu"`; otherwise none (optimize() picks)."""

from __future__ import annotations

import builtins

import libcst as cst

from autoopt.lint.program.device import device_facts
from autoopt.lint.tree.nodes import code_of
from autoopt.lint.wrap.anchor import defined
from autoopt.lint.wrap.codebase import CodeBase, Func
from autoopt.lint.wrap.tree import (
    NOT_PLACED,
    assign_targets,
    assignments_of,
    blocks_holding,
    bound_to,
    common_block,
    device_of,
    guard_of,
    is_object,
    is_self,
    methods_of,
    read_names,
)


def device_for(code: CodeBase, home: Func, model: str, anchor: cst.CSTNode) -> str | None:
    """Where the script puts `model` (`model.to(device)`, `Net().to(args.device)`, `.cuda()`)
    as an expression valid after `anchor`; None (optimize() picks) when it never does, or
    only conditionally, or with a device not yet defined there. A model placed by the
    factory that builds it (`net = get_network(args)`) or by the function it is handed to
    (`Trainer(model, ...)` moving it to `self.gpu_id`) gets that placement, written with
    this function's names."""
    placed, device = placement(home, model, anchor)
    if not placed:
        placed, device = placed_by_class(home, model)
    if not placed:
        device = placed_elsewhere(code, home, model, anchor)
        if device is None and not any(
            device_facts(f.module, f.parent).gpu_path for f in code.files()
        ):
            return '"cpu"'  # a CPU-only script: its own code expects CPU tensors
    if device is None or not defined(code, home, device, anchor):
        return None
    return device


def moved_after(
    code: CodeBase, home: Func, model: str, anchor: cst.CSTNode, device: str | None
) -> cst.Call | None:
    """A placement of `model` after the call (before training starts) that may put it
    elsewhere than `device`, the call's: optimize() would keep moving inputs to its own device
    (imagenet's `model.cuda(args.gpu)` in a branch after the optimizer)."""
    file = home.file
    trains = [c for c in home.calls() if file.before(anchor, c) and code.trains(home, c)]
    for call, placed in placing_calls(home, model):
        if not file.before(anchor, call) or any(file.before(t, call) for t in trains):
            continue
        # Under a flag, the model stays where the call put it when the flag is off: the same
        # device, or the call's own `"cuda" if args.cuda else "cpu"`, is no move.
        flag = guard_of(file, call, anchor)
        same = placed is not None and (
            placed == device or (flag is not None and f'{placed} if {flag} else "cpu"' == device)
        )
        if not same or (placed == '"cuda"' and _current_device_set(home, anchor, call)):
            return call
    return None


def moved_in_callee(
    code: CodeBase, home: Func, model: str, anchor: cst.CSTNode, device: str | None
) -> tuple[Func, cst.Call] | None:
    """(function, placement) where a local function `home` hands `model` to after the call
    places it, before training there, on a device other than the call's (TransReID's
    `do_train(cfg, model, ..., args.local_rank)` running `model.to(local_rank)`): optimize()
    would keep moving the inputs to the device it chose. Only a device the function gets
    through a parameter is compared, as the caller passes it (`train(model, device)` doing
    `model.to(device)` with the call's `device=device` is no move; hysts' `config.device` of
    the `config` it is handed)."""
    file = home.file
    calls = [c for c in home.calls() if id(c) in file.order and file.before(anchor, c)]
    trains = [c for c in calls if code.trains(home, c)]
    for call in calls:
        if not any(code_of(a.value) == model for a in call.args):
            continue
        if any(t is not call and id(t) in file.order and file.before(t, call) for t in trains):
            break  # after training started (`export(model)` to time inference): no move
        callee = code.resolve(file, call)
        if callee is None:
            continue
        param = next(
            (
                p
                for p in callee.params()
                if (a := code.argument(call, callee, p)) is not None and code_of(a) == model
            ),
            None,
        )
        if param is None:
            continue
        trains_there = [c for c in callee.calls() if code.trains(callee, c)]
        for inner, placed in placing_calls(callee, param):
            if any(callee.file.before(t, inner) for t in trains_there):
                continue
            if callee.name == "__init__":
                # a trainer's constructor placing it gives the call its device
                # (`placed_elsewhere`) where that device reads in the caller's names, the same
                # one; else it moves the model where the call cannot follow (Dual-Path-RNN's
                # Trainer: `cuda:{gpuid[0]}` from a YAML, or the CPU, by branch)
                moved = device_of(inner)
                there = (
                    translate(code, moved, callee, call)
                    if moved is not None and not branched(callee, inner)
                    else None
                )
                if there is None or there not in _spellings(home, device):
                    return callee, inner
                continue
            # only a device the function is handed can be told apart from the call's (a
            # module's `config.device` read in both files may well be the same one)
            root = (placed or "").split(".", 1)[0]
            passed = code.argument(call, callee, root) if root in callee.params() else None
            if passed is None:
                continue
            placed = code_of(passed) + (placed or "")[len(root) :]
            if placed not in _spellings(home, device):
                return callee, inner
    return None


def _spellings(home: Func, device: str | None) -> set[str | None]:
    """`device` and what `home` binds it to (`device = torch.device(config.device)`:
    also `config.device`)."""
    found: set[str | None] = {device}
    for assign in assignments_of(home, device) if device else ():
        value = getattr(assign, "value", None)
        if isinstance(value, cst.Call) and code_of(value.func).endswith("device") and value.args:
            value = value.args[0].value
        if isinstance(value, cst.BaseExpression):
            found.add(code_of(value))
    return found


def _current_device_set(home: Func, anchor: cst.CSTNode, call: cst.Call) -> bool:
    """`torch.cuda.set_device(gpu)` runs between `anchor` and `call`: a bare `.cuda()` there
    goes to the rank's GPU, which `"cuda"` at the call is not (point-transformer's
    `DistributedDataParallel(model.cuda(), device_ids=[gpu])`)."""
    file = home.file
    return any(
        code_of(c.func).endswith("cuda.set_device")
        and file.before(anchor, c)
        and file.before(c, call)
        for c in home.calls()
    )


def placement(func: Func, model: str, anchor: cst.CSTNode) -> tuple[bool, str | None]:
    """(whether `func` places `model` at all, the device it leaves it on when the call after
    `anchor` runs, as code of `func`, or None when that cannot be told)."""
    file = func.file
    found: list[str | None] = []
    guarded: list[str | None] = []  # `if args.gpu: model.cuda()`, as the script's choice
    # Placements in branches of an if/else (`model = A(...).to(device)` / `B(...).to(device)`,
    # word_language_model and yolov5 pick the architecture so): one device for all of them
    # is the script's choice.
    branches: list[str | None] = []
    guarded_to: set[str | None] = set()  # where the guarded placements move it
    placed = False
    for call, device in placing_calls(func, model):
        placed = True
        # A placement that runs whenever the inserted call does is where the model stays;
        # one under `if <flag>:` (no else) is the flag's choice, else the CPU.
        flag = guard_of(file, call, anchor)
        if flag is not None:
            guarded.append(f'{device} if {flag} else "cpu"' if device is not None else None)
            guarded_to.add(device)
        elif any(b is common_block(file, [call]) for b in blocks_holding(file, anchor)):
            found.append(device)
        else:
            branches.append(device)
    if found:
        return placed, found[-1]  # the last placement is where the model stays
    if guarded and branches:
        # yolov5: `.to(device)` in both branches, then `if cuda and RANK != -1:` converts
        # to SyncBatchNorm and places it on the same device again: still that device.
        same = len(set(branches)) == 1 and guarded_to == set(branches)
        return placed, branches[0] if same else None
    if len(set(guarded)) == 1:
        return placed, guarded[0]
    if len(set(branches)) == 1:
        return placed, branches[0]
    return placed, None


def placing_calls(func: Func, model: str) -> list[tuple[cst.Call, str | None]]:
    """(call, device) for each `.to(...)`/`.cuda()` of `func` that places `model` (on it, or
    assigned to it: `model = Net().to(device)`); the device as `device_of` writes it."""
    file = func.file
    found: list[tuple[cst.Call, str | None]] = []
    for call in func.calls():
        callee = call.func
        if not (isinstance(callee, cst.Attribute) and callee.attr.value in ("to", "cuda")):
            continue
        holder = file.parent(call)
        assigned = isinstance(holder, cst.Assign) and any(
            code_of(t) == model and holder.value is call for t in assign_targets(holder)
        )
        if code_of(callee.value) != model and not assigned:
            continue
        if (device := device_of(call)) is not NOT_PLACED:
            found.append((call, device))
    return found


def placed_by_class(home: Func, model: str) -> tuple[bool, str | None]:
    """(whether another method of `home`'s class places the attribute `model`, the device when
    every such placement always runs and they agree): TabNet's `_set_network()` builds
    `self.network` on `self.device`, `_set_optimizer()` is where the call goes."""
    if not model.startswith("self.") or home.cls is None:
        return False, None
    devices: set[str | None] = set()
    always = False  # some placement runs whenever its method does (the constructor's)
    for method in methods_of(home.file, home.cls):
        if method != home:
            for call, device in placing_calls(method, model):
                devices.add(device)
                always = always or not branched(method, call)
    # A placement under a branch (a reload in `try:`) onto the same device changes nothing.
    return bool(devices), devices.pop() if len(devices) == 1 and always else None


def placed_elsewhere(code: CodeBase, home: Func, model: str, anchor: cst.CSTNode) -> str | None:
    """The device `model` is put on by the local function that returns it
    (`net = get_network(args)`, whose `if args.gpu: net = net.cuda()` gives
    `"cuda" if args.gpu else "cpu"`) or by the one it is handed to (`Trainer(model, ...)`
    whose `__init__` does `model.to(self.gpu_id)`), translated into `home`'s names."""
    file = home.file
    binds = assignments_of(home, model)
    if len(binds) == 1 and isinstance(value := bound_to(binds[0], model), cst.Call):
        factory = code.resolve(file, value)
        if factory is not None and factory.name != "__init__":
            returns = [
                n
                for n in factory.statements()
                if isinstance(n, cst.Return) and isinstance(n.value, cst.Name)
            ]
            names = {r.value.value for r in returns}  # type: ignore[union-attr]
            if len(names) == 1 and len(returns) == 1:
                placed, device = placement(factory, names.pop(), returns[0])
                if placed:
                    return translate(code, device, factory, value) if device else None
    # Only what runs before training starts: a helper called later may move the model for
    # saving or export (`model.to("cpu")`), which is no choice of the training device.
    trains = [c for c in home.calls() if code.trains(home, c)]
    for call in home.calls():
        target = code.resolve(file, call)
        if target is None or target == home or any(not file.before(call, t) for t in trains):
            continue
        for param in target.params():
            arg = code.argument(call, target, param)
            if arg is None or code_of(arg) != model:
                continue
            # Only a placement the callee always runs (no branch of its own around it).
            moves = [c for c, _ in placing_calls(target, param)]
            if len(moves) != 1 or branched(target, moves[0]):
                continue
            device = device_of(moves[0])
            return translate(code, device, target, call) if device else None
    return None


def branched(func: Func, node: cst.CSTNode) -> bool:
    """`node` sits under a branch or loop of `func` (it may not run)."""
    for anc in func.file.ancestors(node):
        if anc is func.node:
            return False
        if isinstance(anc, cst.If | cst.For | cst.While | cst.Try | cst.With | cst.IfExp):
            return True
    return False


def translate(
    code: CodeBase, expr: str, callee: Func, call: cst.Call, depth: int = 0
) -> str | None:
    """`expr` (code of `callee`) as the caller of `call` writes it: the callee's parameters
    become the arguments passed, `self.x` the value `callee` gives it, imports and builtins
    stay when the caller has them too; None when any name cannot be carried over."""
    caller = code.scope(code.script, call)
    for file in code.files():
        if any(c is call for c in file.calls()):
            caller = code.scope(file, call)
            break
    tree = cst.parse_expression(expr)
    replace: dict[str, str] = {}

    class Carry(cst.CSTTransformer):
        failed = False

        def leave_Attribute(
            self, original: cst.Attribute, updated: cst.Attribute
        ) -> cst.BaseExpression:
            if not is_self(original.value):
                return updated
            binds = assignments_of(callee, code_of(original))
            value = bound_to(binds[0], code_of(original)) if len(binds) == 1 else None
            text = (
                translate(code, code_of(value), callee, call, depth + 1)
                if value is not None and depth < 2
                else None
            )
            if text is None:
                self.failed = True
                return updated
            return cst.parse_expression(f"({text})")

    for name in read_names(tree):
        word = name.value
        if word == "self":
            continue  # `self.x`: carried by its value (below)
        if word in callee.params():
            arg = code.argument(call, callee, word)
            if arg is None or not is_object(arg):
                return None
            replace[word] = code_of(arg)
        elif word in callee.file.imports:
            if caller.file.imports.get(word) != callee.file.imports[word]:
                return None
        elif len(binds := assignments_of(callee, word)) == 1 and depth < 2:
            # a local of the callee bound once (`device = "cuda:0" if opt.cuda else "cpu"`):
            # its value, carried over in turn
            value = bound_to(binds[0], word)
            text = translate(code, code_of(value), callee, call, depth + 1) if value else None
            if text is None:
                return None
            replace[word] = f"({text})"
        elif not hasattr(builtins, word):
            return None

    class Rename(cst.CSTTransformer):
        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
            if any(original is n for n in names):
                return cst.parse_expression(replace[original.value])
            return updated

    names = [n for n in read_names(tree) if n.value in replace]
    carry = Carry()
    out = tree.visit(Rename()).visit(carry)
    if carry.failed:
        return None
    text = code_of(out)
    # `(int(...))` from a carried attribute: drop the parentheses around the whole
    return text[1:-1] if isinstance(out, cst.BaseExpression) and out.lpar else text
