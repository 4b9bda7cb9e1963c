"""Reading the script's statements for `--wrap` (see `wrap_plan`): assignments and what they
bind, statement blocks and what runs whenever a statement does, the guard of a placement, what
a loop iterates, which classes wrap an optimizer. Pure functions of a parsed `SourceFile`."""

from __future__ import annotations

import re

import libcst as cst

from autoopt.lint.tree.nodes import code_of, is_name, string_value
from autoopt.lint.wrap.codebase import Func, SourceFile

# Calls a loop may wrap its loader in: `for i, b in enumerate(tqdm(loader))`.
ITER_WRAPPERS = {"enumerate", "tqdm", "iter", "progress", "track", "zip", "log_every"}
# Iterables of step numbers, never loaders (`for step in trange(n)`, `tqdm(range(n))`).
STEP_NUMBERS = {"range", "trange", "count", "itertools.count"}
# Calls that read a loader or model without keeping it (`len(loader)` for a schedule).
NO_CAPTURE = {
    *("len", "print", "isinstance", "id", "type", "str", "repr", "deepcopy", "copy"),
    "next",  # `images, labels = next(iter(loader))`: the iterator is used up at once
}
MODEL_METHODS = {"parameters", "named_parameters", "train", "eval", "state_dict", "to", "cuda"}
MODEL_WORDS = ("model", "net", "generator", "discriminator", "encoder", "decoder")
NOT_PLACED = "not a placement"  # `.to(dtype)`, `.to(memory_format=...)`


def is_self(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "self"


def is_object(node: cst.BaseExpression) -> bool:
    """A plain name or `self.attr`: something the inserted line can assign to."""
    if isinstance(node, cst.Name):
        return True
    return isinstance(node, cst.Attribute) and is_self(node.value)


def is_member_object(node: cst.BaseExpression) -> bool:
    """`self.member.attr`: an object held by an object the class holds (lightweight-gan's
    `self.GAN.G_opt`); where it is created tells a decline's reason."""
    return (
        isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Attribute)
        and is_self(node.value.value)
    )


def is_iter_wrapper(func: cst.BaseExpression) -> bool:
    text = code_of(func)
    return text in ITER_WRAPPERS or text.split(".")[-1] in ITER_WRAPPERS


def counts_steps(call: cst.Call) -> bool:
    """`range(n)`, `trange(n)`, `itertools.count()`: an iterable of step numbers."""
    return code_of(call.func) in STEP_NUMBERS or code_of(call.func).endswith(".trange")


def unwrap_iter(expr: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(expr, cst.Call) and expr.args and is_iter_wrapper(expr.func):
        expr = expr.args[0].value
    return expr


def assign_targets(node: cst.CSTNode) -> list[cst.BaseExpression]:
    if isinstance(node, cst.Assign):
        out: list[cst.BaseExpression] = []
        for t in node.targets:
            target = t.target
            out += [e.value for e in target.elements] if isinstance(target, cst.Tuple) else [target]
        return out
    if isinstance(node, cst.AnnAssign):
        return [node.target]
    return []


def assignments_of(func: Func, expr: str) -> list[cst.CSTNode]:
    """Statements of `func` binding `expr` (`x = ...`, `a, x = ...`, `x: T = ...`)."""
    return func.file.bindings(func.node).get(expr, [])


def bound_to(assign: cst.CSTNode, expr: str) -> cst.BaseExpression | None:
    """The value `assign` gives `expr` (the matching element when both sides are tuples)."""
    value = getattr(assign, "value", None)
    if isinstance(assign, cst.Assign) and isinstance(value, cst.Tuple):
        target = assign.targets[0].target
        if isinstance(target, cst.Tuple) and len(target.elements) == len(value.elements):
            for t, v in zip(target.elements, value.elements, strict=True):
                if code_of(t.value) == expr:
                    return v.value
    return value


def unpacked_from(assign: cst.CSTNode, expr: str) -> tuple[str, int] | None:
    """(source, index) when `assign` unpacks `expr` from a plain name or `self.attr`:
    `optim_g, optim_d = optims` gives ("optims", 1) for `optim_d`."""
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    target, value = assign.targets[0].target, assign.value
    if not isinstance(target, cst.Tuple | cst.List) or not is_object(value):
        return None
    elements = target.elements
    if any(isinstance(e, cst.StarredElement) for e in elements):
        return None
    for index, element in enumerate(elements):
        if code_of(element.value) == expr:
            return code_of(value), index
    return None


def element_at(value: cst.BaseExpression | None, index: int) -> cst.BaseExpression | None:
    """The `index`-th element of a list or tuple display (`[optim_g, optim_d]`), if it is one."""
    if not isinstance(value, cst.List | cst.Tuple) or index >= len(value.elements):
        return None
    found = value.elements[index]
    return None if isinstance(found, cst.StarredElement) else found.value


def rebinds(file: SourceFile, assign: cst.CSTNode, expr: str) -> bool:
    """`assign` gives `expr` a value built from `expr` itself: a wrap of the object it held
    (`optimizer = LARC(optimizer=optimizer)`, `model, optimizer = amp.initialize(model,
    optimizer)`), not a new one."""
    value = bound_to(assign, expr)
    if value is None:
        return False
    return any(
        (isinstance(n, cst.Name) and n.value == expr and file.reads(n))
        or (isinstance(n, cst.Attribute) and code_of(n) == expr)
        for n in [value, *file.inside(value)]
    )


def bound_name(assign: cst.CSTNode, expr: str) -> str | None:
    value = bound_to(assign, expr)
    return value.value if isinstance(value, cst.Name) else None


def bound_kwarg(assign: cst.CSTNode, expr: str, kwargs: str | None) -> str | None:
    """The keyword read from the `**kwargs` parameter named `kwargs` that `expr` is bound to:
    "optimizer" for `self.optimizer = kwargs["optimizer"]` (also `.get("optimizer")`,
    `.pop("optimizer", None)`)."""
    if kwargs is None:
        return None
    value = bound_to(assign, expr)
    key: cst.BaseExpression | None = None
    if isinstance(value, cst.Subscript) and len(value.slice) == 1:
        index = value.slice[0].slice
        if is_name(value.value, kwargs) and isinstance(index, cst.Index):
            key = index.value
    elif (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and is_name(value.func.value, kwargs)
        and value.func.attr.value in ("get", "pop")
        and value.args
    ):
        key = value.args[0].value
    return string_value(key) if key is not None else None


def loop_source(func: Func, name: cst.Name, use: cst.CSTNode) -> cst.BaseExpression | None:
    """What `name` iterates when it is the target of a `for` around `use` in `func` over a
    plain name or `self.attr` (`for opt in optimizers:`)."""
    for anc in func.file.ancestors(use):
        if anc is func.node:
            return None
        if (
            isinstance(anc, cst.For)
            and isinstance(anc.target, cst.Name)
            and anc.target.value == name.value
            and is_object(anc.iter)
        ):
            return anc.iter
    return None


def is_plain_class(file: SourceFile, cls: cst.ClassDef) -> bool:
    """A plain class (not a torch Optimizer subclass, not a module) that may hold an optimizer."""
    bases = {code_of(b.value).rsplit(".", 1)[-1] for b in cls.bases}
    return not bases & {"Optimizer", "Module"}


def stepping_methods(file: SourceFile, cls: cst.ClassDef) -> set[str]:
    """Methods of `cls` that step an optimizer it holds (`self._optimizer.step()`), directly or
    through another of its methods (`step_and_update_lr()` -> `self._step()`)."""
    methods = methods_of(file, cls)
    stepping: set[str] = set()
    for method in methods:
        for call in method.calls():
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "step"
                and isinstance(func.value, cst.Attribute)
                and is_self(func.value.value)
                and not any(w in func.value.attr.value.lower() for w in ("sched", "scaler"))
            ):
                stepping.add(method.name)
    changed = True
    while changed:
        changed = False
        for method in methods:
            if method.name in stepping:
                continue
            for call in method.calls():
                func = call.func
                if (
                    isinstance(func, cst.Attribute)
                    and is_self(func.value)
                    and func.attr.value in stepping
                ):
                    stepping.add(method.name)
                    changed = True
                    break
    return stepping


def methods_of(file: SourceFile, cls: cst.ClassDef) -> list[Func]:
    return [Func(file, s) for s in cls.body.body if isinstance(s, cst.FunctionDef)]


# `model_name`, `model_path`, `net_cfg`: what names or configures a model, not one
_DESCRIBES_A_MODEL = frozenset(
    (
        "name",
        "names",
        "path",
        "dir",
        "file",
        "type",
        "cfg",
        "config",
        "conf",
        "args",
        "kwargs",
        "id",
        "arch",
        "size",
        "dim",
        "str",
        "url",
        "key",
        "fn",
    )
)


def model_like(func: Func, name: str) -> bool:
    """`name` is used like a model in `func` (`.parameters()`, `.train()`...) or named like one;
    never an optimizer (which has a `.state_dict()` too)."""
    if "optim" in name.lower() or name.lower().rsplit("_", 1)[-1] in _DESCRIBES_A_MODEL:
        return False
    if any(w in name.lower() for w in MODEL_WORDS):
        return True
    # called, not read: `args.cuda` and `config.train.epochs` are a config's fields
    return any(
        isinstance(n, cst.Attribute)
        and isinstance(n.value, cst.Name)
        and n.value.value == name
        and n.attr.value in MODEL_METHODS
        and isinstance(call := func.file.parent(n), cst.Call)
        and call.func is n
        for n in func.statements()
    )


def common_block(file: SourceFile, nodes: list[cst.CSTNode]) -> cst.CSTNode | None:
    """The innermost statement block (indented block or module) holding every node."""
    chains = [
        [a for a in file.ancestors(n) if isinstance(a, cst.IndentedBlock | cst.Module)]
        for n in nodes
    ]
    if not chains:
        return None
    for block in chains[0]:
        if all(any(block is b for b in chain) for chain in chains[1:]):
            return block
    return None


def blocks_holding(file: SourceFile, node: cst.CSTNode) -> list[cst.CSTNode]:
    """The statement blocks holding `node`, innermost first."""
    return [a for a in file.ancestors(node) if isinstance(a, cst.IndentedBlock | cst.Module)]


def if_block(file: SourceFile, assign: cst.CSTNode, name: str) -> cst.CSTNode | None:
    """The block holding the `if` whose every branch (else included) binds `name` or raises,
    when `assign` is one of them (`if use_accel: device = ... else: device =
    torch.device("cpu")`; `else: raise NotImplementedError`)."""
    branch = common_block(file, [assign])
    node = file.parent(branch) if branch is not None else None
    if not isinstance(node, cst.If):
        return None
    while isinstance(file.parent(node), cst.If) and file.parent(node).orelse is node:
        node = file.parent(node)  # the head of an if/elif chain
    head: cst.If = node  # type: ignore[assignment]
    branches: list[cst.BaseSuite] = []
    cur: cst.If | cst.Else | None = head
    while isinstance(cur, cst.If):
        branches.append(cur.body)
        cur = cur.orelse
    if cur is None:
        return None  # no else: some paths leave `name` unbound
    branches.append(cur.body)

    def binds(suite: cst.BaseSuite) -> bool:
        """The branch binds `name`, or raises (no path goes on from it unbound)."""
        return any(
            isinstance(s, cst.SimpleStatementLine)
            and any(
                isinstance(a, cst.Raise)
                or (isinstance(a, cst.Assign) and name in (code_of(t) for t in assign_targets(a)))
                for a in s.body
            )
            for s in getattr(suite, "body", ())
        )

    return common_block(file, [head]) if all(binds(b) for b in branches) else None


def device_of(call: cst.Call) -> str | None:
    """The device a `.to(...)`/`.cuda()` call moves to, as code; None when it cannot be written
    as optimize()'s `device=` (`.cuda(args.gpu)`), `NOT_PLACED` for a dtype or format change."""
    func = call.func
    assert isinstance(func, cst.Attribute)
    if func.attr.value == "cuda":
        return None if call.args else '"cuda"'
    keyword = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    target = keyword.get("device", positional[0] if positional else None)
    if target is None:
        return NOT_PLACED
    text = code_of(target)
    if "dtype" in text.lower() or (text.startswith("torch.") and "device" not in text):
        return NOT_PLACED  # model.to(ptdtype), model.to(torch.bfloat16)
    return text


def read_before(home: Func, name: str, anchor: cst.CSTNode, blocks: list[cst.CSTNode]) -> bool:
    """`name` is read by a statement that runs whenever `anchor` does, before it (nanoGPT's
    `model.to(device)` after an if/elif chain that builds the model)."""
    file = home.file
    return any(
        isinstance(n, cst.Name)
        and n.value == name
        and runs_by(file, n, anchor)
        and file.reads(n)
        and any(b is common_block(file, [n]) for b in blocks)
        for n in home.statements()
    )


def keeps(value: cst.BaseExpression, expr: str) -> bool:
    """The object built by `value` holds `expr`: `cycle(loader)`, `tqdm(enumerate(loader))`,
    `Wrapper(model=model)`; not `len(loader)`, `next(iter(loader))` or `model.parameters()`."""
    if not isinstance(value, cst.Call):
        return False
    if code_of(value.func).rsplit(".", 1)[-1] in NO_CAPTURE:
        return False
    return any(code_of(a.value) == expr or keeps(a.value, expr) for a in value.args)


def runs_by(file: SourceFile, node: cst.CSTNode, anchor: cst.CSTNode) -> bool:
    """`node` has run once the statement `anchor` has: it comes before it or is part of it."""
    return file.order[id(node)] <= file.end[id(anchor)]


def guard_of(file: SourceFile, call: cst.Call, anchor: cst.CSTNode) -> str | None:
    """The condition under which `call` alone runs: the test of the `if` (without `else`) or
    of the `x if cond else y` holding it, when that `if` runs whenever `anchor` does. None when
    the call runs whenever `anchor` does (an `if __name__ == "__main__":` holding both)."""
    around = blocks_holding(file, anchor)
    for anc in file.ancestors(call):
        if any(anc is b for b in around):
            return None
        if isinstance(anc, cst.IfExp):
            if any(n is call for n in [anc.body, *file.inside(anc.body)]):
                holder: cst.CSTNode = anc
                break
            return None
        if isinstance(anc, cst.If):
            if anc.orelse is not None or not any(
                n is call for n in [anc.body, *file.inside(anc.body)]
            ):
                return None
            holder = anc
            break
        if isinstance(anc, cst.BaseCompoundStatement | cst.FunctionDef):
            return None
    else:
        return None
    if not any(b is common_block(file, [holder]) for b in around):
        return None
    return code_of(holder.test)  # type: ignore[attr-defined]


def read_names(expr: cst.BaseExpression) -> list[cst.Name]:
    """The names `expr` reads (not attribute names or keyword names)."""

    class Reads(cst.CSTVisitor):
        def __init__(self) -> None:
            self.names: list[cst.Name] = []

        def visit_Name(self, node: cst.Name) -> None:
            self.names.append(node)

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            node.value.visit(self)
            return False

    reads = Reads()
    expr.visit(reads)
    return reads.names


def child_of(file: SourceFile, block: cst.CSTNode, node: cst.CSTNode) -> cst.CSTNode:
    """The statement of `block` that holds `node`."""
    cur = node
    while file.parent(cur) is not block:
        cur = file.parent(cur)  # type: ignore[assignment]
    return cur


def statement_of(file: SourceFile, node: cst.CSTNode) -> str:
    """The statement holding `node` (or `node` itself, a statement) as written, without its
    comments: a compound statement by its header (`if device == "cuda"`)."""
    statement = node
    if not isinstance(node, cst.SimpleStatementLine | cst.BaseCompoundStatement):
        for anc in file.ancestors(node):
            if isinstance(anc, cst.SimpleStatementLine | cst.BaseCompoundStatement):
                statement = anc
                break
    if isinstance(statement, cst.SimpleStatementLine):
        code = "; ".join(file.module.code_for_node(s).strip() for s in statement.body)
        return re.sub(r"\s*\n\s*", " ", code)  # a call written over several lines, on one
    if isinstance(statement, cst.BaseCompoundStatement):
        header = statement.with_changes(leading_lines=(), body=cst.IndentedBlock(body=()))
        return file.module.code_for_node(header).strip().splitlines()[0].rstrip(":")
    return file.module.code_for_node(statement).strip()
