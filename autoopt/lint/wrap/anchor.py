"""Choose where the call goes: after the statements that create the optimizers and the loader,
before the statement that starts training, in the block that holds them all; and check that
what the call names is bound there on every path and not already kept by something built
before it."""

from __future__ import annotations

import builtins

import libcst as cst

from autoopt.lint.tree.nodes import code_of, names_in, nodes_of_type
from autoopt.lint.wrap import decline
from autoopt.lint.wrap.bind import Loader
from autoopt.lint.wrap.call import Pair, Plan
from autoopt.lint.wrap.codebase import CodeBase, Func
from autoopt.lint.wrap.decline import Decline
from autoopt.lint.wrap.options import apex_before, call_options, wrapped_before
from autoopt.lint.wrap.origins import Origin
from autoopt.lint.wrap.tree import (
    assign_targets,
    assignments_of,
    blocks_holding,
    bound_to,
    child_of,
    common_block,
    if_block,
    keeps,
    read_before,
    read_names,
    runs_by,
    statement_of,
)


def place_call(
    code: CodeBase,
    home: Func,
    optimizers: list[Origin],
    loader: Loader | None,
    pairs: list[Pair],
    trainers: list[Func],
    forced: dict[str, str],
) -> Plan | Decline:
    """The plan with the statement to insert after, once the objects all exist."""
    file = home.file
    relevant = [a for o in optimizers for a in o.assigns]
    entries = [o.entry for o in optimizers if o.entry is not None]
    if not entries:  # a global stepped by functions: the first call in `home` that trains
        entries = [c for c in home.calls() if code.trains(home, c)][:1]
    if loader is not None:
        pairs[0].loader = loader[0]
        if not _bound_above(home, loader[1], relevant):
            relevant += loader[1]
        # else: FloWaveNet's module-level `train_loader = DataLoader(...)`, the optimizer in
        # `if __name__ == "__main__":`: the loader exists wherever the optimizer does
    block = common_block(file, relevant + entries)
    if block is None:
        return decline.unrelated_blocks()
    tops = [child_of(file, block, n) for n in relevant]
    anchor = max(tops, key=lambda n: file.order[id(n)])
    late = any(not file.before(anchor, child_of(file, block, e)) for e in entries)
    around = training_loop_around(code, home, anchor)
    if late or (around is not None and not _builds_the_models(home, around, pairs, anchor)):
        for origin in optimizers:
            for assign in origin.assigns:
                loop = training_loop_around(code, home, assign)
                if loop is not None:
                    return decline.optimizer_in_training_loop(origin.expr, header(loop))
        return decline.created_in_loop()
    options = call_options(code, trainers, forced)
    over = {p.model for p in pairs}
    if "distributed" in options and (why := wrapped_before(code, home, anchor, over=over)):
        return decline.parallel_before_optimizer(why)
    if (apex := apex_before(home, anchor)) is not None:
        return decline.own_precision_late("apex amp", statement_of(file, apex))
    return Plan(anchor, pairs, options, _module_globals(code, home, pairs), home.node)


def _builds_the_models(
    home: Func, loop: cst.CSTNode, pairs: list[Pair], anchor: cst.CSTNode
) -> bool:
    """`loop` builds every model anew before the optimizer (GraphMAE's run per seed: model,
    optimizer, then training): each pass is a training run of its own, the call goes in it."""
    file = home.file
    return all(
        any(
            any(a is loop for a in file.ancestors(assign)) and file.before(assign, anchor)
            for assign in assignments_of(home, pair.model)
        )
        for pair in pairs
    )


def _module_globals(code: CodeBase, home: Func, pairs: list[Pair]) -> tuple[str, ...]:
    """The names the call rebinds that are globals of the module `home` (a function) never
    binds itself (TRADES: `train_loader` built at the top, read by `train()`): without
    `global`, the call would make them local to `home` and read them before assignment, and
    the functions reading the global would keep the original."""
    if not isinstance(home.node, cst.FunctionDef):
        return ()
    top = code.top(home.file)
    names = [n for p in pairs for n in (p.model, p.loader, p.optimizer) if n and "." not in n]
    return tuple(
        name
        for name in dict.fromkeys(names)
        if name not in home.params()
        and not assignments_of(home, name)
        and any(
            isinstance(home.file.parent(a), cst.SimpleStatementLine)
            and home.file.parent(home.file.parent(a)) is home.file.module
            for a in assignments_of(top, name)
        )
    )


def in_training_loop(code: CodeBase, home: Func, node: cst.CSTNode) -> bool:
    """`node` sits inside a loop of `home` that trains."""
    return training_loop_around(code, home, node) is not None


def training_loop_around(
    code: CodeBase, home: Func, node: cst.CSTNode
) -> cst.For | cst.While | None:
    """The innermost loop of `home` around `node` that trains."""
    for anc in home.file.ancestors(node):
        if anc is home.node:
            return None
        if isinstance(anc, cst.For | cst.While) and any(
            code.trains(home, c) for c in home.file.calls(anc)
        ):
            return anc
    return None


def recreated_in_training_loop(
    code: CodeBase, home: Func, origins: list
) -> tuple[str, cst.For | cst.While] | None:
    """An optimizer created (or handed in) before the training loop and created again inside
    it (pysot's `build_opt_lr(model.module, epoch)` once the backbone is unfrozen): (its
    expression, the loop). One created only inside a loop that also builds its model (a run
    per seed) is not this."""
    for origin in origins:
        inside = [(a, training_loop_around(code, home, a)) for a in origin.assigns]
        loops = [loop for _, loop in inside if loop is not None]
        if loops and (len(loops) < len(inside) or origin.expr in home.params()):
            return origin.expr, loops[0]
    return None


def header(loop: cst.For | cst.While) -> str:
    """`for epoch in range(args.epochs)`: the loop's first line, without its colon."""
    bare = loop.with_changes(body=cst.IndentedBlock(body=[cst.SimpleStatementLine([cst.Pass()])]))
    if isinstance(bare, cst.For | cst.While):
        bare = bare.with_changes(orelse=None)
    return code_of(bare).strip().splitlines()[0].rstrip(":").strip()


def defined(code: CodeBase, home: Func, expr: str, anchor: cst.CSTNode) -> bool:
    """Every name `expr` reads is bound when the statement after `anchor` runs: a
    parameter, an import, a builtin, a global of the module, or a name assigned before
    `anchor` in a block that holds it (not a later loop's variable)."""
    file = home.file
    tree = cst.parse_expression(expr)
    reads = [n.value for n in read_names(tree)]
    blocks = blocks_holding(file, anchor)
    top = code.top(file)
    given = {*home.params(), *(("self", "cls") if home.cls is not None else ())}
    for name in reads:
        if name in given or name in file.imports or hasattr(builtins, name):
            continue
        if name not in file.bound_names:
            continue  # bound nowhere in the file: it comes from elsewhere (`import *`)
        if read_before(home, name, anchor, blocks):
            continue  # read on every path before the call: bound there, or it had failed
        if any(
            runs_by(file, a, anchor)
            and any(b is common_block(file, [a]) or b is if_block(file, a, name) for b in blocks)
            for a in assignments_of(home, name)
        ):
            continue
        if home != top and any(
            isinstance(file.parent(a), cst.SimpleStatementLine)
            and file.parent(file.parent(a)) is file.module
            for a in assignments_of(top, name)
        ):
            continue  # a module global, set before any function runs
        return False
    return True


def _bound_above(home: Func, assigns: list[cst.CSTNode], optimizers: list[cst.CSTNode]) -> bool:
    """Every statement binding the loader is a top-level statement of `home` that runs before
    any optimizer is created: the loader is bound wherever the call can go."""
    file = home.file
    top = [s for s in (home.node.body if isinstance(home.node, cst.Module) else ())]
    return bool(assigns) and all(
        any(file.parent(a) is s or a is s for s in top)
        and all(file.before(a, o) for o in optimizers)
        for a in assigns
    )


def captures(home: Func, expr: str, anchor: cst.CSTNode) -> list[tuple[str, bool]]:
    """(target, is a plain alias) for each statement of `home` before `anchor` that keeps
    the object `expr` in another name: `looper = cycle(loader)`, `self.model = model`,
    `trainer = Diffusion(model)`. Reads that keep nothing (`len(loader)`, `model.parameters()`)
    and a re-binding of `expr` itself do not count."""
    file = home.file
    found: list[tuple[str, bool]] = []
    for node in home.statements():
        if not isinstance(node, cst.Assign) or not runs_by(file, node, anchor):
            continue
        targets = [code_of(t) for t in assign_targets(node)]
        if expr in targets:
            continue
        for target in targets:
            # `self.model, self.optimizer = model, optimizer`: each target its own value
            value = bound_to(node, target)
            alias = value is not None and code_of(value) == expr
            if alias or (value is not None and keeps(value, expr)):
                found.append((target, alias))
    return found


def loader_intact(code: CodeBase, home: Func, plan: Plan) -> bool:
    """The plan's loader is bound where the call goes, and nothing built before it from the
    loader (a generator, an iterator) would keep iterating the original."""
    loader = plan.pairs[0].loader
    assert loader is not None
    if not defined(code, home, loader, plan.anchor):
        return False
    if any(
        isinstance(a, cst.For) and loader in names_in(a.iter)
        for a in home.file.ancestors(plan.anchor)
    ):
        return False  # the call runs inside the loop over it (a run per seed): no loader
    # `dataiter = iter(train_loader)` to show a few images before training: a capture the
    # training never reads again leaves nothing iterating the original
    return not any(
        _read_from(home, target, plan.anchor) for target, _ in captures(home, loader, plan.anchor)
    )


def _read_from(home: Func, target: str, anchor: cst.CSTNode) -> bool:
    """`target` (a plain name) is read at or after `anchor` in `home`'s file, or by another
    function (which may run later); an attribute (`self.looper`) may be read by any method:
    always True."""
    if not target.isidentifier():
        return True
    file = home.file
    return any(
        isinstance(node, cst.Name)
        and node.value == target
        and file.reads(node)
        and (not file.before(node, anchor) or file.scope_of(node) is not home.node)
        for node in file.nodes
    )


def called_in(trainers: list[Func], target: str) -> bool:
    """`target(...)` (or `target.forward(...)`, minRF's `rf.forward(x, c)`) is called in a
    training function (the forward the loop runs)."""
    names = (target, f"{target}.forward")
    return any(code_of(c.func) in names for f in trainers for c in f.calls())


def runs_the_global(trainers: list[Func], name: str, member: str) -> bool:
    """The training functions never run `member` (`self.model`) but call `name` where it is
    none of their own names: the module's global (W2NER's `Trainer.train` runs `model(...)`
    of `__main__`, the object `Trainer(model)` also keeps as `self.model`)."""
    if called_in(trainers, member):
        return False
    return any(
        code_of(c.func) == name and name not in f.params() and not assignments_of(f, name)
        for f in trainers
        if f.cls is not None
        for c in f.calls()
    )


def only_under_a_flag(home: Func, expr: str, anchor: cst.CSTNode) -> bool:
    """Every binding of `expr` in `home` sits under an `if` (or `if/elif` chain) with no
    `else` that does not also hold the call: `if args.use_optimizer: optimizer = ...`,
    unbound when the flag is off. (A chain whose `else` raises, or binds it too, leaves it
    bound wherever the code goes on; an `if __name__ == "__main__":` holding the call too
    runs both.)"""
    binds = assignments_of(home, expr)
    if not binds:
        return False
    around_call = {id(a) for a in home.file.ancestors(anchor)}
    for bind in binds:
        flagged = False
        for anc in home.file.ancestors(bind):
            if anc is home.node:
                break
            if isinstance(anc, cst.If) and id(anc) not in around_call:
                chain: cst.If | cst.Else | None = anc
                while isinstance(chain, cst.If):
                    chain = chain.orelse
                flagged = chain is None and not _every_arm_binds_then_used(home, anc, expr)
                break
        if not flagged:
            return False
    return True


def _every_arm_binds_then_used(home: Func, chain: cst.If, expr: str) -> bool:
    """`if args.optimizer == "sgd": optimizer = SGD(...)` / `elif ... == "adam": optimizer =
    Adam(...)` with no `else` (federated-learning's baseline_main.py), where the function
    then calls a method of `expr` outside any `if` (`optimizer.zero_grad()` in the loop) or
    hands it to a call (DeepVO's `M_deepvo.step(t_x, t_y, optimizer)`): a path that binds
    none would raise there anyway, so the call may name it."""
    binds = assignments_of(home, expr)
    arm: cst.If | cst.Else | None = chain
    while isinstance(arm, cst.If):
        body = arm.body
        if not any(any(a is body for a in home.file.ancestors(b)) for b in binds):
            return False
        arm = arm.orelse
    # an `if` around the chain too (`if __name__ == "__main__":`) runs both
    around = {id(a) for a in _ancestors_within(home, chain)}
    for node in nodes_of_type(home.node, cst.Call):
        if (
            (
                (isinstance(node.func, cst.Attribute) and code_of(node.func.value) == expr)
                # handed to a call (DeepVO's `M_deepvo.step(t_x, t_y, optimizer)`): read there
                or any(code_of(a.value) == expr for a in node.args)
            )
            and home.file.before(chain, node)
            and not any(
                isinstance(a, cst.If) and id(a) not in around for a in _ancestors_within(home, node)
            )
        ):
            return True
    return False


def _ancestors_within(home: Func, node: cst.CSTNode) -> list[cst.CSTNode]:
    """The ancestors of `node` inside `home`'s function (its own node excluded)."""
    found = []
    for anc in home.file.ancestors(node):
        if anc is home.node:
            break
        found.append(anc)
    return found
