"""Training and data loops: which loops iterate batches, which names hold the batch, which
calls move it (or the model's input) to the device, and what waits for such a copy anyway (a
read on the host, the fallback path of the script's own prefetcher)."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Rule
from autoopt.lint.program.device import is_cuda_tensor_type
from autoopt.lint.program.facts import local_callee, named_like_evaluation
from autoopt.lint.program.placement import device_move
from autoopt.lint.program.summaries import EMPTY
from autoopt.lint.program.torch_api import DATALOADER
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.edits import enclosing_statement
from autoopt.lint.tree.nodes import (
    calls_in,
    code_of,
    dotted,
    int_literal,
    is_name,
    method_name,
    names_in,
    nodes_of_type,
    root_name,
    string_value,
    walk,
)


def loader_names(rule: Rule) -> set[str]:
    """Names bound to a `torch.utils.data.DataLoader(...)` anywhere in the file."""
    out: set[str] = set()
    if "DataLoader" not in rule.context.source:
        return out  # no name resolves to it without the text (an import or an attribute)
    for node in nodes_of_type(rule.context.module, cst.Assign):
        if rule.is_call_to(node.value, *DATALOADER):
            for t in node.targets:
                if isinstance(t.target, cst.Name):
                    out.add(t.target.value)
    return out


def batch_names(loop: cst.For | cst.While) -> set[str]:
    """Names that hold (parts of) the batch in `loop`: the loop's targets, names bound to
    `next(...)` (`batch = next(data_iter)`), and names unpacked, indexed or
    iterated from them in the loop body (`inputs, labels = data`, `x = batch["x"]`,
    `[t.to(device) for t in batch]`)."""
    # `x = next(looper)` also in a `for step in range(n):` loop: batches drawn from a generator
    # that re-iterates the loader (`looper = cycle(loader)`).
    names = {
        n
        for node in nodes_of_type(loop.body, cst.Assign, into_scopes=False)
        if _is_next_call(node.value)
        for t in node.targets
        for n in names_in(t.target)
    }
    if isinstance(loop, cst.For):
        names |= names_in(loop.target)
    binders = nodes_of_type(loop.body, (cst.Assign, cst.CompFor), into_scopes=False)
    changed = True
    while changed:  # a few rounds: `data = batch; x, y = data`
        changed = False
        for node in binders:
            if type(node) is cst.Assign and _is_batch_expr(node.value, names):
                new = set().union(*(names_in(t.target) for t in node.targets)) - names
            elif type(node) is cst.CompFor and _is_batch_expr(node.iter, names):
                new = names_in(node.target) - names
            else:
                continue
            if new:
                names |= new
                changed = True
    # a name bound anew to a tensor made on the host in the loop (`cam = torch.from_numpy(
    # cam.astype("float32"))`, VideoPose3D): pageable memory no loader pinned, where
    # `non_blocking=True` copies synchronously all the same
    made = {
        n
        for node in binders
        if type(node) is cst.Assign and _makes_a_host_tensor(node.value)
        for t in node.targets
        for n in names_in(t.target)
    }
    return names - made


_HOST_TENSOR_MAKERS = frozenset(
    {"from_numpy", "tensor", "as_tensor", "Tensor", "FloatTensor", "LongTensor"}
)


def _makes_a_host_tensor(expr: cst.BaseExpression) -> bool:
    """`torch.from_numpy(a)`, `torch.tensor(x)`, `torch.FloatTensor(x)`: a new tensor on the host."""
    return (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and isinstance(expr.func.value, cst.Name)
        and expr.func.value.value == "torch"
        and expr.func.attr.value in _HOST_TENSOR_MAKERS
        and not any(a.keyword is not None and a.keyword.value == "device" for a in expr.args)
    )


def _is_next_call(expr: cst.BaseExpression) -> bool:
    """`next(it)`, or the iterator's own `it.next()` of torch before 1.x (its loader iterator
    had the method: CDAN's `inputs_source, labels_source = iter_source.next()`)."""
    if not isinstance(expr, cst.Call):
        return False
    if isinstance(expr.func, cst.Name):
        return expr.func.value == "next"
    return (
        isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value in ("next", "__next__")
        and isinstance(expr.func.value, cst.Name)
        and not expr.args
    )


def _is_batch_expr(expr: cst.BaseExpression, names: set[str]) -> bool:
    if isinstance(expr, cst.Name):
        return expr.value in names
    if isinstance(expr, cst.Subscript | cst.Attribute):
        return _is_batch_expr(expr.value, names)
    if isinstance(expr, cst.Call) and expr.args and _is_variable(expr.func):
        # the legacy `Variable(batch[0])` wraps the batch's tensor, still on the host
        return _is_batch_expr(expr.args[0].value, names)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        # reshaped, cast or split on the host: `sdf_data[:, 3].unsqueeze(1)`, and torch's
        # functions of it, `torch.chunk(sdf_gt, batch_split)` (DeepSDF)
        method = expr.func.attr.value
        if method in _HOST_RESHAPES:
            if code_of(expr.func.value) == "torch":
                return bool(expr.args) and _is_batch_expr(expr.args[0].value, names)
            return _is_batch_expr(expr.func.value, names)
    if isinstance(expr, cst.Tuple | cst.List):
        return bool(expr.elements) and all(_is_batch_expr(e.value, names) for e in expr.elements)
    return False


# What keeps a batch's tensor on the host, reshaped, cast or cut (not `.to()`/`.cuda()`, which
# move it, nor `.type()`, which may)
_HOST_RESHAPES = frozenset(
    {
        "reshape", "view", "unsqueeze", "squeeze", "permute", "transpose", "contiguous",
        "flatten", "float", "long", "double", "half", "int", "chunk", "split", "clone",
        "detach",
    }
)  # fmt: skip


def _is_variable(func: cst.BaseExpression) -> bool:
    """`Variable` or `autograd.Variable` / `torch.autograd.Variable` (by name: the wrapper of
    torch before 0.4, a no-op since)."""
    return (isinstance(func, cst.Name) and func.value == "Variable") or (
        isinstance(func, cst.Attribute) and func.attr.value == "Variable"
    )


_DTYPE_PREFIXES = ("torch.float", "torch.bfloat", "torch.half", "torch.double", "torch.int")
_DTYPES = {
    "torch.bool",
    "torch.long",
    "torch.short",
    "torch.uint8",
    "torch.int8",
    "torch.cfloat",
    "torch.cdouble",
    "torch.complex64",
    "torch.complex128",
}


def is_dtype(rule: Rule, expr: cst.BaseExpression) -> bool:
    """`torch.float16`, `torch.long`, ... (by qualified name)."""
    names = rule.qualified_names(expr) if isinstance(expr, cst.Name | cst.Attribute) else set()
    return any(n in _DTYPES or n.startswith(_DTYPE_PREFIXES) for n in names)


def to_destination(rule: Rule, call: cst.Call) -> str | None:
    """What a `.to(...)` call moves to: "cpu", "device" (anything else that names a device), or
    None (a dtype, another tensor's properties via `**kwargs`, nothing)."""
    if any(a.star for a in call.args):
        return None
    dest = arg(call, "device", 0)
    if dest is None:
        return None
    value = dest.value
    if is_dtype(rule, value):
        return None
    text = string_value(value)
    if isinstance(value, cst.Call) and rule.refers_to(value.func, "torch.device") and value.args:
        text = string_value(value.args[0].value) or text
    if text is not None:
        return "cpu" if text.startswith("cpu") else "device"
    if isinstance(value, cst.Name | cst.Attribute | cst.Call | cst.Subscript):
        return "device"
    return None


def data_loops(rule: Rule) -> list[cst.For | cst.While]:
    """Loops that iterate batches: training loops (also `while` loops that pull batches with
    `next(it)`), evaluation loops, and `for` loops over a name bound to a DataLoader."""
    loaders = loader_names(rule)
    facts = rule.facts
    out: list[cst.For | cst.While] = []
    for node in nodes_of_type(rule.context.module, (cst.For, cst.While)):
        if type(node) is cst.While:
            batches = facts.is_training_loop(node)
        else:
            batches = (
                facts.is_training_loop(node)
                or facts.is_eval_loop(node)
                or bool(names_in(node.iter) & loaders)
            )
        if batches:
            out.append(node)
    return out


def batch_transfers(rule: Rule, loop: cst.For | cst.While) -> list[cst.Call]:
    """`<batch>.to(<device>)`, `<batch>.cuda()` and the legacy `<batch>.type(Tensor)` (with
    `Tensor = torch.cuda.FloatTensor if cuda else ...`) calls in `loop` whose receiver comes from
    the batch the loop iterates, also through host-side methods (`x.reshape(n, -1).to(device)`);
    not a module, not a dtype cast."""
    names = batch_names(loop)
    out = _transfers_of(rule, loop.body, names, next_calls=True)
    # the batch handed to a helper of this file that moves it (Informer's
    # `self._process_one_batch(dataset, batch_x, batch_y)` doing `batch_x.to(self.device)`)
    seen: set[int] = set()
    defs: dict[str, list[cst.FunctionDef]] | None = None
    for call in calls_in(loop.body, into_scopes=False):
        name = local_callee(call)
        if name is None or not any(isinstance(a.value, cst.Name) for a in call.args):
            continue
        if defs is None:  # the file's functions by name, once per loop that needs them
            defs = {}
            for f in nodes_of_type(rule.context.module, cst.FunctionDef):
                defs.setdefault(f.name.value, []).append(f)
        found = defs.get(name, [])
        helper = found[0] if len(found) == 1 else None  # the one def `f(...)` can run
        if helper is None or id(helper) in seen:
            continue
        seen.add(id(helper))
        params = _params_bound_to(helper, call, names)
        if params:
            out += _transfers_of(rule, helper.body, params, next_calls=False)
    return out


def _transfers_of(
    rule: Rule, body: cst.CSTNode, names: set[str], next_calls: bool
) -> list[cst.Call]:
    out = []
    # `for key, ipt in inputs.items(): inputs[key] = ipt.to(self.device)` (monodepth2)
    names = names | {
        n
        for loop in nodes_of_type(body, cst.For, into_scopes=False)
        if root_name(_through_methods(loop.iter)) in names
        for n in names_in(loop.target)
    }
    names = names | _parts_bound(body, names)
    # ... and in a comprehension: `[x.to(self.device) for x in data]` (denoiser),
    # `{k: v.cuda() for k, v in model_input.items()}` (siren)
    # ... also over a batch drawn in place: `[x.to(device) for x in next(iterator_train)]`
    # (partial-conv inpainting)
    names = names | {
        n
        for comp in nodes_of_type(body, cst.CompFor, into_scopes=False)
        if root_name(_through_methods(comp.iter)) in names
        or (next_calls and _is_next_call(comp.iter))
        for n in names_in(comp.target)
    }
    for call in calls_in(body, into_scopes=False):
        method = method_name(call)
        if method not in ("to", "cuda", "type"):
            continue
        assert isinstance(call.func, cst.Attribute)
        moved = _through_methods(call.func.value)
        # `next(dl).to(device)`
        if root_name(moved) not in names and not (next_calls and _is_next_call(moved)):
            continue
        if (
            method == "cuda"
            or (method == "to" and to_destination(rule, call) == "device")
            or (method == "type" and _to_cuda_type(rule, call))
        ):
            out.append(call)
    return out


def _parts_bound(body: cst.CSTNode, names: set[str]) -> set[str]:
    """The names `body` binds to parts of `names`: `imgL = sample["left"]`, `a, b =
    s["a"], s["b"]` (GwcNet's `train_sample(sample)`), `x, y = batch`."""
    found: set[str] = set()

    def bind(target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if isinstance(target, cst.Tuple | cst.List):
            if isinstance(value, cst.Tuple | cst.List) and len(value.elements) == len(
                target.elements
            ):
                for sub_target, sub_value in zip(target.elements, value.elements, strict=True):
                    bind(sub_target.value, sub_value.value)
            elif isinstance(value, cst.Name) and value.value in names:
                found.update(names_in(target))
        elif (
            isinstance(target, cst.Name)
            and isinstance(value, cst.Subscript)
            and root_name(value) in names
        ):
            found.add(target.value)

    for assign in nodes_of_type(body, cst.Assign, into_scopes=False):
        for target in assign.targets:
            bind(target.target, assign.value)
    return found


def _params_bound_to(func: cst.FunctionDef, call: cst.Call, names: set[str]) -> set[str]:
    """The parameters of `func` that `call` hands a batch name (by position or keyword)."""
    params = [p.name.value for p in (*func.params.posonly_params, *func.params.params)]
    if params and params[0] in ("self", "cls") and isinstance(call.func, cst.Attribute):
        params = params[1:]
    bound = set()
    for position, a in enumerate(call.args):
        if a.star or not isinstance(a.value, cst.Name) or a.value.value not in names:
            continue
        if a.keyword is not None:
            bound.add(a.keyword.value)
        elif position < len(params):
            bound.add(params[position])
    return bound


def _through_methods(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`images` for `images.reshape(n, -1).float()`: a batch reshaped or cast on the host;
    also inside the legacy `Variable(images)` wrapper (pytorch-wgan)."""
    while isinstance(expr, cst.Call):
        if isinstance(expr.func, cst.Attribute):
            expr = expr.func.value
        elif _is_variable(expr.func) and len(expr.args) == 1:
            expr = expr.args[0].value
        else:
            break
    return expr


def _to_cuda_type(rule: Rule, call: cst.Call) -> bool:
    dest = arg(call, "dtype", 0)
    return dest is not None and is_cuda_tensor_type(rule.facts.device, dest.value)


# Reading a tensor on the host: a copy to the device has to be finished right there anyway.
_HOST_READS = {"item", "tolist", "numpy", "cpu"}
_HOST_FUNCS = {"print", "float", "int", "bool", "list"}


def read_on_host_later(rule: Rule, call: cst.Call) -> bool:
    """The result of `call` is bound to a name that the rest of its block reads on the host
    (`y.item()`, `y[0].tolist()`, `print(y)`, `float(y)`) every time, not only under an `if`."""
    stmt = enclosing_statement(call, rule.parent)
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    node = rule.parent(call)
    while node is not None and node is not stmt:
        if isinstance(node, cst.Call) and method_name(node) in _HOST_READS:
            return True  # `model(x, edges.to(device)).cpu()`: read in the same statement
        node = rule.parent(node)
    targets: set[str] = set()
    for small in stmt.body:
        if isinstance(small, cst.Assign):
            for t in small.targets:
                targets |= _bound_by(t.target, small.value, call)
    block = rule.parent(stmt)
    if not targets or not isinstance(block, cst.IndentedBlock | cst.Module):
        return False
    body = list(block.body)
    index = next(i for i, s in enumerate(body) if s is stmt)
    program = rule.context.program
    for later in body[index + 1 :]:
        if isinstance(later, cst.SimpleStatementLine):
            # parts of the moved batch hold it too: `bert_inputs, grid_labels, ... = data_batch`
            # (W2NER), `labels = labels[mask].view(-1)`
            for small in later.body:
                if isinstance(small, cst.Assign) and _read_root(small.value) in targets:
                    for t in small.targets:
                        targets |= names_in(t.target)
        if isinstance(later, cst.If):
            if _truth_read(later.test, targets):
                return True  # `if batch.batch[-1] == 0:` (deep_gcns' ogbg_mol) reads it now
            if not (_skips(later) and isinstance(later.orelse, cst.Else)):
                continue  # read now and then (`if batch_idx % log_step == 0:` to log images)
            later = later.orelse  # `if <odd batch>: pass` / `else:` the step, every time
        for n in calls_in(later, into_scopes=False):
            if (
                any(root_name(a.value) in targets for a in n.args)
                and method_name(n) != "forward"  # the model's own reads are not a helper's
                and not _under_an_if(rule, n, later)
                and program.host_read_in_callee(n) is not None
            ):
                return True  # handed to a helper that reads on the host (DnCNN's batch_PSNR)
            func = n.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value in _HOST_READS
                and _read_root(func.value) in targets
            ):
                return True  # `y.item()`, `y[0].tolist()`
            if (
                isinstance(func, cst.Name)
                and func.value in _HOST_FUNCS
                and any(root_name(a.value) in targets for a in n.args)
            ):
                return True  # `print(y)`, `float(y)`
    return False


def _under_an_if(rule: Rule, node: cst.CSTNode, within: cst.CSTNode) -> bool:
    """`node` runs only under an `if` inside `within` (`if phase == "valid": log_images(x)`)."""
    parent = rule.parent(node)
    while parent is not None and parent is not within:
        if isinstance(parent, cst.If):
            return True
        parent = rule.parent(parent)
    return False


def _read_root(expr: cst.BaseExpression) -> str | None:
    """The name a value derives from, through methods: `batch.y.view(s).detach()` -> batch."""
    while isinstance(expr, cst.Subscript | cst.Attribute | cst.Call):
        expr = expr.func if isinstance(expr, cst.Call) else expr.value
    return expr.value if isinstance(expr, cst.Name) else None


def _skips(branch: cst.If) -> bool:
    """The `if` body only skips (`pass`, `continue`): its `else` is the usual path."""
    body = branch.body.body if isinstance(branch.body, cst.IndentedBlock) else ()
    return bool(body) and all(
        isinstance(stmt, cst.SimpleStatementLine)
        and all(isinstance(small, cst.Pass | cst.Continue) for small in stmt.body)
        for stmt in body
    )


# What a tensor tells without a device sync: its metadata.
_METADATA = {"shape", "size", "dim", "ndim", "dtype", "device", "numel", "is_cuda"}


def _truth_read(test: cst.BaseExpression, targets: set[str]) -> bool:
    """An `if` test that takes the truth value of a tensor held by one of `targets`: a
    comparison of its values (`x[-1] == 0`), not of its shape (`x.shape[0] == 1`)."""
    for node in walk(test):
        if not isinstance(node, cst.Comparison):
            continue
        operands = [node.left, *(c.comparator for c in node.comparisons)]
        for operand in operands:
            if root_name(operand) not in targets:
                continue
            names = {n.value for n in walk(operand) if isinstance(n, cst.Name)}
            if not names & _METADATA and not any(
                isinstance(n, cst.Call) and (dotted(n.func) or "") == "len" for n in walk(operand)
            ):
                return True
    return False


def _bound_by(target: cst.BaseExpression, value: cst.BaseExpression, call: cst.Call) -> set[str]:
    """The names of `target = value` that hold what `call` returns: in `data, label =
    data.to(d), label.to(d)`, `data` for the first copy only (dgcnn reads `label` on the
    host, not `data`)."""
    if (
        isinstance(target, cst.Tuple | cst.List)
        and isinstance(value, cst.Tuple | cst.List)
        and len(target.elements) == len(value.elements)
    ):
        for t, v in zip(target.elements, value.elements, strict=True):
            if any(n is call for n in walk(v.value)):
                return names_in(t.value)
    return names_in(target)


def prefetcher_fallback(rule: Rule, call: cst.Call) -> bool:
    """`call` is under `if not args.prefetcher:` (within its loop or function): the fallback of
    a script whose own prefetcher copies batches ahead on a side stream (timm's train.py)."""
    for anc in rule.facts.ancestors(call):
        if isinstance(anc, cst.For | cst.While | cst.FunctionDef):
            return False
        if isinstance(anc, cst.If) and "prefetch" in code_of(anc.test).lower():
            return True
    return False


def loops_over(rule: Rule, name: str) -> list[cst.For]:
    """`for` loops whose iterable mentions `name` (`loader`, `enumerate(loader)`, `tqdm(loader)`),
    or a dict that holds it (`for data in loaders[phase]`, see `holders_of`)."""
    names = {name, *holders_of(rule, name)}
    return [n for n in nodes_of_type(rule.context.module, cst.For) if names & names_in(n.iter)]


def holders_of(rule: Rule, name: str) -> set[str]:
    """The names bound to a dict literal that holds `name` as a value (`loaders = {"train":
    loader_train, "valid": loader_valid}`, then `for data in loaders[phase]` in each epoch:
    brain-segmentation, wavenet_vocoder)."""
    return {
        target
        for a in nodes_of_type(rule.context.module, cst.Assign)
        if len(a.targets) == 1
        and isinstance(a.value, cst.Dict)
        and (target := dotted(a.targets[0].target)) is not None
        and any(isinstance(e, cst.DictElement) and is_name(e.value, name) for e in a.value.elements)
    }


def names_device(rule: Rule, expr: cst.BaseExpression) -> bool:
    """`expr` certainly names a non-CPU device: a device string, `torch.device(...)` of one, or a
    name/attribute called like a device (`device`, `dev`, `args.device`, `x.device`) or a GPU's
    index (`self.gpu_id`, `local_rank`). Other names may hold a tensor (`.to(other)`) or a
    dtype, so they do not count."""
    text = string_value(expr)
    if isinstance(expr, cst.Call) and rule.refers_to(expr.func, "torch.device") and expr.args:
        text = string_value(expr.args[0].value)
        if text is None:
            return not any(a.star for a in expr.args)
    if text is not None:
        return not text.startswith("cpu")
    leaf = expr.attr.value if isinstance(expr, cst.Attribute) else getattr(expr, "value", None)
    return (
        isinstance(leaf, str)
        and isinstance(expr, cst.Name | cst.Attribute)
        and (any(word in leaf.lower() for word in ("device", "gpu", "cuda")) or leaf in _INDEXES)
    )


_INDEXES = ("dev", "rank", "local_rank")  # names of a device (a process's GPU under torchrun)


def accumulation_gate(stmt: cst.BaseStatement) -> cst.BinaryOperation | None:
    """For `if <i> % <N> == 0:` whose body steps an optimizer (not an LR scheduler): the
    `<i> % <N>` it tests; else None."""
    modulo = _modulo_tested(stmt, cst.Equal)
    return modulo if modulo is not None and _steps_an_optimizer([stmt.body]) else None


def accumulation_skip(
    stmt: cst.BaseStatement, after: list[cst.BaseStatement]
) -> cst.BinaryOperation | None:
    """For `if <i> % <N> != 0: continue` followed (in `after`, the rest of the loop body) by
    an optimizer step (SLIP's `if (data_iter + 1) % args.update_freq != 0: continue`, then
    `scaler.step(optimizer)`): the `<i> % <N>` it tests; else None."""
    modulo = _modulo_tested(stmt, cst.NotEqual)
    if modulo is None or not isinstance(stmt, cst.If) or stmt.orelse is not None:
        return None
    body = stmt.body
    if not (
        isinstance(body, cst.IndentedBlock)
        and len(body.body) == 1
        and isinstance(body.body[0], cst.SimpleStatementLine)
        and all(isinstance(s, cst.Continue) for s in body.body[0].body)
    ):
        return None
    return modulo if _steps_an_optimizer(after) else None


def _modulo_tested(stmt: cst.BaseStatement, operator: type) -> cst.BinaryOperation | None:
    """The `<i> % <N>` of `if <i> % <N> == 0:` (`operator` Equal) or `!= 0` (NotEqual)."""
    if not isinstance(stmt, cst.If) or not isinstance(stmt.test, cst.Comparison):
        return None
    test = stmt.test
    modulo = test.left
    if (
        len(test.comparisons) != 1
        or not isinstance(test.comparisons[0].operator, operator)
        or int_literal(test.comparisons[0].comparator) != 0
        or not isinstance(modulo, cst.BinaryOperation)
        or not isinstance(modulo.operator, cst.Modulo)
    ):
        return None
    return modulo


def _steps_an_optimizer(nodes: list[cst.CSTNode]) -> bool:
    """A `.step()` in `nodes` that is not an LR scheduler's."""
    return any(
        isinstance(n.func, cst.Attribute)
        and n.func.attr.value == "step"
        and "sched" not in code_of(n.func.value).lower()
        for node in nodes
        for n in calls_in(node)
    )


_READS_SIZE = frozenset({"len", "print", "str", "repr"})  # uses of a loader that read no batch


def evaluation_only_loader(rule: Rule, call: cst.Call, option: str) -> bool:
    """The `DataLoader(...)` `call` feeds evaluation only (its loops are evaluation loops or run
    under no_grad; or it is handed to an `evaluate(...)`-like function; or, used nowhere in
    sight, it is named so: `val_loader`) while a loader of the file that feeds the training
    loop passes `option` (`num_workers=4`, `pin_memory=True`, also open_brats2020's
    `pin_memory=False`: the author decided). The evaluation loader's setting is then the
    author's choice for a held-out set, not an oversight."""
    if _in_the_else_of_a_train_flag(rule, call, option):
        return True
    name = _bound_leaf(rule, call)
    if name is None or _loader_use(rule, name) != "eval":
        return False
    return any(
        arg(other, option) is not None and _loader_use(rule, leaf) == "train"
        for leaf, other in _loaders(rule)
        if leaf != name
    )


def _in_the_else_of_a_train_flag(rule: Rule, call: cst.Call, option: str) -> bool:
    """voicefilter's `create_dataloader(hp, args, train)`: `if train: return DataLoader(...,
    num_workers=..., pin_memory=True)` `else: return DataLoader(..., batch_size=1,
    num_workers=0)`: `call` is in the `else` of an `if` on a flag named for training whose
    branch builds a loader that sets `option`."""
    for anc in rule.facts.ancestors(call):
        if isinstance(anc, cst.Else):
            branch = rule.parent(anc)
            if not isinstance(branch, cst.If) or "train" not in (dotted(branch.test) or ""):
                return False
            return any(
                _sets(other, option)
                for other in calls_in(branch.body)
                if rule.is_call_to(other, "torch.utils.data.DataLoader")
            )
        if isinstance(anc, cst.FunctionDef):
            return False
    return False


def feeds_evaluation_only(rule: Rule, name: str) -> bool:
    """Loader `name` is read only by evaluation (its loops evaluate or run under no_grad, or
    the functions it is handed to do not train)."""
    return _loader_use(rule, name) == "eval"


def _sets(call: cst.Call, option: str) -> bool:
    """`call` passes `option` by keyword with a value that is not 0/False/None."""
    given = arg(call, option)
    return given is not None and not (
        int_literal(given.value) == 0
        or (isinstance(given.value, cst.Name) and given.value.value in ("False", "None"))
    )


def _bound_leaf(rule: Rule, call: cst.Call) -> str | None:
    """`val_loader` for `val_loader = DataLoader(...)` and `self.val_loader = DataLoader(...)`."""
    parent = rule.parent(call)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        target = parent.targets[0].target
        if isinstance(target, cst.Name):
            return target.value
        if isinstance(target, cst.Attribute):
            return target.attr.value
    return None


def _loaders(rule: Rule) -> list[tuple[str, cst.Call]]:
    """(bound name, call) of every `DataLoader(...)` bound to a name or `self.<name>`."""
    found = []
    for node in nodes_of_type(rule.context.module, cst.Call):
        if rule.is_call_to(node, *DATALOADER):
            leaf = _bound_leaf(rule, node)
            if leaf is not None:
                found.append((leaf, node))
    return found


def _loader_use(rule: Rule, name: str) -> str | None:
    """ "train" when a training loop iterates loader `name` or it is handed to a function of the
    file that trains; "eval" when only evaluation reads it; None when unknown."""
    facts = rule.facts
    loops = loops_over(rule, name)
    if any(facts.is_training_loop(loop) for loop in loops):
        return "train"
    if loops:
        evaluation = all(
            facts.is_eval_loop(loop) or facts.in_no_grad(loop) or not _steps(loop) for loop in loops
        )
        return "eval" if evaluation else None
    uses = [
        c
        for c in nodes_of_type(rule.context.module, cst.Call)
        if any(name in names_in(a.value) for a in c.args)
        and not rule.is_call_to(c, *DATALOADER)
        and not (isinstance(c.func, cst.Name) and c.func.value in _READS_SIZE)
    ]
    callees = [local_callee(c) or (method_name(c) or "") for c in uses]
    if any(callee in facts.backward_helpers for callee in callees):
        return "train"
    kinds = [_use_by_project_function(rule, c, name) for c in uses]
    if "train" in kinds:
        return "train"
    if callees and all(
        kind == "eval" or named_like_evaluation(callee)
        for kind, callee in zip(kinds, callees, strict=True)
    ):
        return "eval"
    if not callees and named_like_evaluation(name):
        return "eval"
    if uses and all(_draws_one_batch(rule, c) for c in uses):
        return "eval"  # `fixed_images, _ = next(iter(test_loader))`: one batch, read once
    return None


def _draws_one_batch(rule: Rule, call: cst.Call) -> bool:
    """`call` is the `iter(loader)` of a `next(iter(loader))` (or MONAI's `first(loader)`)
    outside any loop, in a scope that
    runs loops of its own (the driver): a fixed batch drawn once (images to log, a shape to
    read), not a per-step input pipeline (a loopless `get_batch()` helper may run every step)."""
    if is_name(call.func, "next") and len(call.args) == 1:
        inner = call.args[0].value
        return isinstance(inner, cst.Call) and _draws_one_batch(rule, inner)
    if code_of(call.func).rsplit(".", 1)[-1] == "first" and len(call.args) == 1:
        outer: cst.CSTNode | None = call  # MONAI's `first(check_loader)`: its first batch
    elif is_name(call.func, "iter"):
        outer = rule.parent(rule.parent(call))
        if not (isinstance(outer, cst.Call) and is_name(outer.func, "next")):
            return False
    else:
        return False
    node: cst.CSTNode | None = outer
    while node is not None and not isinstance(node, cst.FunctionDef | cst.Module):
        if isinstance(node, cst.For | cst.While | cst.CompFor):
            return False
        node = rule.parent(node)
    scope = node.body if isinstance(node, cst.FunctionDef) else node
    return scope is not None and any(nodes_of_type(scope, (cst.For, cst.While), into_scopes=False))


def _steps(loop: cst.CSTNode) -> bool:
    """The loop steps something (`optimizer.step()`, `zero_grad()`, `scheduler.step()`): a
    loop that trains in a way the file cannot show, not one that only reads its loader
    (sampling class images with a pipeline)."""
    return any(method_name(c) in ("step", "zero_grad") for c in nodes_of_type(loop, cst.Call))


def _use_by_project_function(rule: Rule, call: cst.Call, name: str) -> str | None:
    """ "train"/"eval" when `call` hands loader `name` to a function of the project that
    iterates it and does (or does not) train (`metrics(model, test_loader, k)` of an
    evaluate.py); None when the callee is not the project's or does not iterate it."""
    summary = rule.context.program.call_summary(call)
    if summary is EMPTY:
        return None
    for argument, roles in rule.context.program.argument_roles(call):
        if "loader" in roles and name in names_in(argument.value):
            return "train" if summary.trains else "eval"
    return None


def model_input_transfer(rule: Rule, model: str) -> cst.Call | None:
    """The `.to(device)` call that moves `model`'s input in its training loop, when there is
    one and it is simple: `x = x.to(device)`, `x, y = x.to(device), y.to(device)` or
    `model(x.to(device))` (a `.cuda()`, several candidates or `*args` give None)."""
    facts = rule.facts
    candidates: list[cst.Call] = []
    for outer in facts.training_loops:
        for call in calls_in(outer, into_scopes=False):
            if not (is_name(call.func, model) and call.args):
                continue
            # look only in the step loop that makes this call (not in an eval loop nested
            # in the epoch loop)
            loop = facts.enclosing_loops(call)[0]
            if not facts.is_training_loop(loop):
                continue
            first = call.args[0].value
            if isinstance(first, cst.Call) and device_move(rule, first) is not None:
                candidates.append(first)
            elif isinstance(first, cst.Name):
                candidates += _assigned_transfers(rule, loop, first.value)
    unique = {id(c): c for c in candidates}
    if len(unique) != 1:
        return None
    (call,) = unique.values()
    if call.func.attr.value != "to" or any(a.star for a in call.args):  # type: ignore[union-attr]
        return None
    return call


def _assigned_transfers(rule: Rule, loop: cst.CSTNode, name: str) -> list[cst.Call]:
    """The device moves bound to `name` in `loop`: `name = <x>.to(d)`, `a, name = ..., <x>.to(d)`."""
    found: list[cst.Call] = []
    for n in walk(loop, into_scopes=False):
        if not isinstance(n, cst.Assign) or len(n.targets) != 1:
            continue
        target, value = n.targets[0].target, n.value
        pairs: list[tuple[cst.BaseExpression, cst.BaseExpression]] = []
        if isinstance(target, cst.Name):
            pairs = [(target, value)]
        elif (
            isinstance(target, cst.Tuple)
            and isinstance(value, cst.Tuple)
            and len(target.elements) == len(value.elements)
        ):
            pairs = [
                (t.value, v.value) for t, v in zip(target.elements, value.elements, strict=True)
            ]
        for t, v in pairs:
            if is_name(t, name) and isinstance(v, cst.Call) and device_move(rule, v) is not None:
                found.append(v)
    return found
