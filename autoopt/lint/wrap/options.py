"""What the script already does itself, read before the call is written: a library or way of
running that owns the loop (Accelerate, Lightning, ignite, RPC, Hogwild) or its precision (apex
amp, a half model, a loss scaler object) declines the file; its own autocast/GradScaler,
torch.compile or data-parallel wrap hands the overlapping option of the call to the script
(amp="script", compile=False, distributed=False), with the reason; a parallel wrap made before the optimizer exists rules out every place for the call."""

from __future__ import annotations

import dataclasses

import libcst as cst

from autoopt.lint.program.handled import ACCELERATOR
from autoopt.lint.program.placement import RETURN_THE_MODULE, without_placement
from autoopt.lint.program.precision import other_precision_system
from autoopt.lint.program.project_facts import sibling_importers_text
from autoopt.lint.tree.nodes import code_of, nodes_of_type
from autoopt.lint.wrap import decline
from autoopt.lint.wrap.codebase import CodeBase, Func, SourceFile, on_self
from autoopt.lint.wrap.decline import Decline, ParallelWrap
from autoopt.lint.wrap.tree import assignments_of, child_of, common_block, runs_by, statement_of

_AMP = ("autocast", "GradScaler")
# NVIDIA apex amp: it casts and patches the model and optimizer it is handed, after the call.
_APEX_AMP = {"apex.amp.initialize", "apex.amp.scale_loss"}
_COMPILE = {"torch.compile"}
# The user's own data/model parallel wraps (DDP, DataParallel, FSDP 1 and 2, tensor parallel).
_PARALLEL = {
    "DistributedDataParallel",
    "DataParallel",
    "FullyShardedDataParallel",
    "fully_shard",
    "parallelize_module",
}


def conflict(code: CodeBase, file: SourceFile) -> Decline | None:
    """A decline when `file` trains through a library or a way of running that owns the loop
    (an ignite Engine running the script's own step function does not own it)."""
    dotted = set(file.imports.values())
    if runs_accelerate(file):
        return decline.accelerate()
    if any(d.split(".")[0] in ("lightning", "pytorch_lightning") for d in dotted):
        return decline.lightning()
    if any(d.startswith("ignite.engine") for d in dotted) and not _own_engine_steps(code, file):
        return decline.ignite()
    for call in file.calls():
        qualified = file.qualname(call.func)
        if qualified.startswith("ignite.") and qualified.split(".")[-1] in _IGNITE_WRAPS:
            return decline.ignite_distributed(code_of(call))
    if any(d.startswith(("torch.distributed.rpc", "torch.distributed.autograd")) for d in dotted):
        return decline.rpc()
    for name in dotted:
        if name.startswith(("torchmeta.modules", "torchmeta.utils.data")):
            return decline.meta_learning(name.rsplit(".", 1)[-1], "torchmeta")
    if "learn2learn" in file.module.code:
        for call in file.calls():
            if file.qualname(call.func).startswith("learn2learn.algorithms."):
                return decline.meta_learning(code_of(call.func))
    if (_hogwild(file.module.code) and not _shares_only_untrained(file)) or (
        file.path is not None and any(_hogwild(t) for t in sibling_importers_text(file.path))
    ):
        # the script, or one beside it that imports it (mnist_hogwild's main.py starts the
        # processes that run train.py's train())
        return decline.hogwild()
    return None


# ignite.distributed's wraps of the model and optimizer (`idist.auto_model(model)`)
_IGNITE_WRAPS = {"auto_model", "auto_optim"}


def _own_engine_steps(code: CodeBase, file: SourceFile) -> bool:
    """Every ignite engine of `file` that trains runs a step function of the script's own
    (`Engine(step)`, the step doing the backward and `optimizer.step()`); none is built by
    ignite (`create_supervised_trainer(model, optimizer, loss)`)."""
    engines = [c for c in file.calls() if file.qualname(c.func).startswith("ignite.")]
    steps = [code.engine_step(file, c) for c in engines if code_of(c.func).endswith("Engine")]
    built = [c for c in engines if "trainer" in code_of(c.func).rsplit(".", 1)[-1].lower()]
    return not built and any(s is not None and code.does_backward(s) for s in steps)


def _hogwild(source: str) -> bool:
    return ".share_memory()" in source and ".Process(" in source


def _shares_only_untrained(file: SourceFile) -> bool:
    """The models `file` shares (`model.share_memory()`) are none of those its torch.optim
    optimizers are built over: TorchBeast's actors share an inference copy while one learner
    trains `learner_model` (no Hogwild; as the lint's `handled.is_hogwild`)."""
    shared: set[str] = set()
    trained: set[str] = set()
    for call in file.calls():
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "share_memory":
            shared.add(code_of(func.value))
        elif file.qualname(func).startswith("torch.optim.") and call.args:
            for n in nodes_of_type(call.args[0].value, cst.Call):
                if isinstance(n.func, cst.Attribute) and n.func.attr.value == "parameters":
                    trained.add(code_of(n.func.value))
    return bool(shared) and bool(trained) and not shared & trained


def runs_accelerate(file: SourceFile) -> bool:
    """`file` builds an Accelerate `Accelerator`, or trains through one it is handed
    (`accelerator.backward(loss)`, `accelerator.prepare(...)`); helpers imported from
    `accelerate.utils` (`set_seed`) are no Accelerate training."""
    if "ccelerat" not in file.module.code:
        return False
    for call in file.calls():
        func = call.func
        if code_of(func).endswith("Accelerator") and file.qualname(func) in ACCELERATOR:
            return True
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value in ("backward", "prepare")
            and code_of(func.value).rsplit(".", 1)[-1].endswith("accelerator")
        ):
            return True
    return False


def own_precision(file: SourceFile) -> Decline | None:
    """A decline when `file` (the script, or where its optimizer is stepped) already runs
    another mixed-precision system (a half model, loss scaling by hand, fp16 optimizers). apex
    amp is left to the script instead: the call goes before `amp.initialize(model, optimizer)`
    and leaves precision to it (`own_options`)."""
    if apex_amp(file):
        return None
    if why := other_precision_system(file.module, file.module.code):
        return decline.own_precision(why)
    return None


def apex_amp(file: SourceFile) -> list[cst.Call]:
    """The calls of `file` to apex amp (`amp.initialize`, `amp.scale_loss`)."""
    if "apex" not in file.module.code:
        return []
    return [
        c
        for c in file.calls()
        if isinstance(c.func, cst.Attribute)
        and c.func.attr.value in ("initialize", "scale_loss")
        and file.qualname(c.func) in _APEX_AMP
    ]


def is_apex_initialize(file: SourceFile, node: cst.CSTNode | None) -> bool:
    """`node` is a call of apex's `amp.initialize(model, optimizer, ...)`."""
    return isinstance(node, cst.Call) and file.qualname(node.func) == "apex.amp.initialize"


def apex_before(home: Func, anchor: cst.CSTNode) -> cst.Call | None:
    """An `amp.initialize(...)` of `home` that has run once the statement `anchor` has: the
    model and optimizer are apex's by then."""
    file = home.file
    for call in apex_amp(file):
        if is_apex_initialize(file, call) and runs_by(file, call, anchor):
            return call
    return None


def scaler_steps(steppers: list[Func], stepped: set[str]) -> Decline | None:
    """A decline when an optimizer (one of `stepped`) is handed to a loss scaler object that
    does the backward and the step itself (timm's and MAE's `loss_scaler(loss, optimizer,
    ...)`): a mixed-precision system optimize() cannot see into. torch's GradScaler is stepped
    as `scaler.step(optimizer)` and is not this."""
    for func in steppers:
        for call in func.calls():
            callee = code_of(call.func)
            if "scaler" not in callee.rsplit(".", 1)[-1].lower():
                continue
            if any(code_of(a.value) in stepped for a in call.args):
                return decline.loss_scaler(callee, func.name)
    return None


def own_options(code: CodeBase, trainers: list[Func]) -> dict[str, str]:
    """The options the script's own code already covers, each with the reason."""
    files = {id(code.script): code.script} | {id(f.file): f.file for f in trainers}
    calls = [(f, c) for f in files.values() for c in f.calls()]
    options: dict[str, str] = {}
    amp = []
    if any(f.qualname(c.func).split(".")[-1] in _AMP for f, c in calls):
        amp.append("own autocast/GradScaler")
    apex = any(f.qualname(c.func) in _APEX_AMP for f, c in calls)
    if apex:
        amp.append("own apex amp")
    if amp:
        options["amp"] = "; ".join(amp)
    if any(f.qualname(c.func) in _COMPILE for f, c in calls):
        options["compile"] = "own torch.compile"
    elif apex:
        options["compile"] = "apex amp casts and patches the model after the call"
    if any(is_parallel_wrap(f, c) or _wraps_through(code, f, c) for f, c in calls):
        options["distributed"] = "own DDP/FSDP/DataParallel wrap"
    return options


def call_options(code: CodeBase, trainers: list[Func], forced: dict[str, str]) -> dict[str, str]:
    """The options the call leaves to the script (`Plan.lines` writes amp="script", the others
    =False): what the script covers, and what the pairing forced (`amp` for an optimizer over
    several models), each with its reason."""
    options = own_options(code, trainers)
    if "amp" in forced and "amp" in options:
        options["amp"] += "; " + forced["amp"]
    return forced | options


def _wraps_through(code: CodeBase, file: SourceFile, call: cst.Call) -> bool:
    """`call` runs a helper of the project that wraps the model in DDP/FSDP/DataParallel
    (`model = apply_data_parallel_wrapper(config, model)`)."""
    target = code.resolve(file, call)
    return target is not None and any(is_parallel_wrap(target.file, c) for c in target.calls())


def is_parallel_wrap(file: SourceFile, call: cst.Call) -> bool:
    """`call` wraps a model in DDP, DataParallel, FSDP or tensor parallelism, also through a
    project's subclass named for it (EfficientDet's `CustomDataParallel`, mit_semseg's
    `UserScatteredDataParallel`, DANet's `DataParallelModel`)."""
    name = wrapper_name(file, call)
    return name in _PARALLEL or "DataParallel" in name


def wrapped_before(
    code: CodeBase,
    home: Func,
    anchor: cst.CSTNode,
    skip: Func | None = None,
    over: set[str] = frozenset(),
) -> ParallelWrap | None:
    """The data-parallel wrap of the model that runs before the statement `anchor` of `home`
    (the model is no longer bare where the call would go), if there is one: the last, the one
    nearest the optimizer (dino wraps its teacher, then the student it trains). Calls of
    `skip` are not looked into; when `anchor` is the call that hands the model to `skip`, a
    helper's wrap counts only for an object handed on to what `skip`'s optimizer is built
    over (EDSR's `loss.Loss(...)` wraps its own loss modules, not the model)."""
    file = home.file
    found: ParallelWrap | None = None
    feeds = _optimizer_inputs(skip) if skip is not None and isinstance(anchor, cst.Call) else None
    for call in home.calls():
        if not file.before(call, anchor):
            continue
        if is_parallel_wrap(file, call):
            if over and not _wraps_one_of(home, call, over):
                continue  # FourCastNet's frozen `self.model_wind`: not what the optimizer trains
            wrapper, helper = wrapper_name(file, call), None
        else:
            target = code.resolve(file, call)
            if target is not None and target == skip:
                continue  # the function the model is handed to, not a wrap before it
            if feeds is not None and not _handed_to(file, call, anchor, skip, feeds):
                continue  # an object the optimizer's function gets for another use
            inner = (
                next((c for c in target.calls() if is_parallel_wrap(target.file, c)), None)
                if target is not None
                else None
            )
            if target is None or inner is None:
                continue
            wrapper, helper = wrapper_name(target.file, inner), target.name
        # The statement beside the optimizer's that holds the wrap: where the optimizer must go.
        block = common_block(file, [anchor, call])
        outer = statement_of(file, child_of(file, block, call)) if block is not None else None
        statement = statement_of(file, call)
        found = ParallelWrap(statement, wrapper, helper, outer if outer != statement else None)
    return found


def _wraps_one_of(home: Func, call: cst.Call, over: set[str]) -> bool:
    """The wrap `call` may take, or be bound to, one of `over`: False only where it is bound
    to other names and wraps another plain name (FourCastNet's `self.model_wind`), neither of
    them an alias of one of `over` (`model_train = model.train()`, faster-rcnn)."""
    file = home.file
    holder = file.parent(call)
    while isinstance(holder, cst.Attribute | cst.Call):  # `DataParallel(D(...)).cuda()`
        holder = file.parent(holder)
    if not isinstance(holder, cst.Assign) or not call.args:
        return True
    first = call.args[0].value
    if not isinstance(first, cst.Name | cst.Attribute):
        first = None  # built in the call (`DataParallel(Discriminator())`): the target tells
    names = {code_of(t.target) for t in holder.targets} | ({code_of(first)} if first else set())
    for name in list(names):
        names |= _same_object_as(home, name)
    # `model.module.parameters()` reads the wrapped `model`'s parameters
    return any(o == name or o.startswith(f"{name}.") for name in names for o in over)


def _same_object_as(home: Func, name: str) -> set[str]:
    """Names `name` is bound to as the same object (`model_train = model.train()`,
    `net = model.cuda()`, `m = model`)."""
    found = set()
    for assign in assignments_of(home, name):
        value = getattr(assign, "value", None)
        if value is not None:
            value = without_placement(value, RETURN_THE_MODULE)
        if isinstance(value, cst.Name | cst.Attribute):
            found.add(code_of(value))
    return found


def wrapped_in_constructor(code: CodeBase, home: Func, over: set[str]) -> ParallelWrap | None:
    """The data-parallel wrap the constructor of `home`'s class gives one of `over` (the
    `self.` attributes the optimizer is built over) before `home`, another method, creates the
    optimizer (EEG-Conformer's `__init__`: `self.model = nn.DataParallel(self.model)`, the
    Adam in `train()`); also in a base class's constructor that `super().__init__()` runs,
    and in a method it calls that returns the wrapped model (Autoformer's `self.model =
    self._build_model().to(self.device)`, whose override returns `nn.DataParallel(model)`
    under `--use_multi_gpu`)."""
    if home.cls is None or home.name == "__init__":
        return None
    init = code.method(home.file, home.cls, "__init__")
    if init is None:
        return None
    # the constructors' own statements, and the methods they call before the optimizer's
    # (2s-AGCN's `self.load_model()` wrapping, then `self.load_optimizer()`)
    inits = [init, *_base_constructors(code, init)]
    for scope in inits:
        if wrap := _wrap_in_method(scope, over):
            return wrap
        for call in scope.calls():
            targets = code.runs(scope.file, call) if on_self(call) else []
            if home in targets:
                break
            for target in targets:
                if target.cls is None or target in inits:
                    continue
                if wrap := _wrap_in_method(target, over if target.cls is home.cls else set()):
                    return wrap
                if _binds_one_of(scope.file, call, over) and (wrap := _wrap_returned(target)):
                    # the constructor's statement names the model; the method makes the wrap
                    return ParallelWrap(statement_of(scope.file, call), wrap.wrapper, target.name)
    return None


def _base_constructors(code: CodeBase, init: Func) -> list[Func]:
    """The base classes' `__init__` that `init` runs (`super().__init__(args)`)."""
    for call in init.calls():
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "__init__"):
            continue
        target = code.resolve(init.file, call)
        if target is None and init.cls is not None:
            target = code.base_method(init.file, init.cls, "__init__")
        if target is not None and target != init:
            return [target, *_base_constructors(code, target)]
    return []


def _wrap_in_method(method: Func, over: set[str]) -> ParallelWrap | None:
    """A wrap in `method` (a constructor, or a method it runs) bound to one of `over`."""
    for call in method.calls():
        holder = method.file.parent(call)
        if (
            is_parallel_wrap(method.file, call)
            and isinstance(holder, cst.Assign)
            and any(code_of(t.target) in over for t in holder.targets)
        ):
            return ParallelWrap(statement_of(method.file, call), wrapper_name(method.file, call))
    return None


def _wrap_returned(method: Func) -> ParallelWrap | None:
    """A wrap `method` binds to a name it returns (`model = nn.DataParallel(model)`, then
    `return model`)."""
    returned = {
        n.value.value
        for n in method.statements()
        if isinstance(n, cst.Return) and isinstance(n.value, cst.Name)
    }
    return _wrap_in_method(method, returned) if returned else None


def _binds_one_of(file: SourceFile, call: cst.Call, over: set[str]) -> bool:
    """`call` (maybe placed: `self._build_model().to(device)`) is bound to one of `over`."""
    holder = file.parent(call)
    while isinstance(holder, cst.Attribute | cst.Call):
        holder = file.parent(holder)
    return isinstance(holder, cst.Assign) and any(code_of(t.target) in over for t in holder.targets)


def _optimizer_inputs(func: Func) -> set[str]:
    """The parameters of `func` its optimizer is built over: named in a call that builds an
    optimizer (`torch.optim.X(...)`, `make_optimizer(args, self.model)`), directly or through
    the attribute they are stored in (`self.model = my_model`)."""
    params = set(func.params())
    stored = {}
    for node in func.statements():
        if (
            isinstance(node, cst.Assign)
            and isinstance(node.value, cst.Name)
            and node.value.value in params
        ):
            for target in node.targets:
                stored[code_of(target.target)] = node.value.value
    found: set[str] = set()
    for call in func.calls():
        if "optim" not in code_of(call.func).lower():
            continue
        for node in nodes_of_type(call, (cst.Name, cst.Attribute)):
            text = code_of(node)
            if text in params:
                found.add(text)
            elif text in stored:
                found.add(stored[text])
    return found


def _handed_to(
    file: SourceFile, call: cst.Call, anchor: cst.Call, home: Func, feeds: set[str]
) -> bool:
    """What `call` returns (`_loss = loss.Loss(...)`) is handed by `anchor` to a parameter of
    `home` in `feeds`."""
    holder = file.parent(call)
    while isinstance(holder, cst.IfExp | cst.Attribute | cst.Call):  # `X(...) if a else None`
        holder = file.parent(holder)
    if not (isinstance(holder, cst.Assign) and isinstance(holder.targets[0].target, cst.Name)):
        return True  # not bound to a name: cannot tell, keep the wrap
    bound = holder.targets[0].target.value
    params = home.params()
    for position, argument in enumerate(anchor.args):
        if not (isinstance(argument.value, cst.Name) and argument.value.value == bound):
            continue
        if argument.keyword is not None:
            name = argument.keyword.value
        elif argument.star:
            return True
        else:
            name = params[position] if position < len(params) else ""
        if name in feeds:
            return True
    return False


def wrapped_by_callers(code: CodeBase, home: Func) -> ParallelWrap | None:
    """A DataParallel wrap a caller of `home` makes before it hands the model to `home`, the
    function that creates the optimizer (YOLOv4's `__main__` wraps the model, then
    `train(model=model)` builds the optimizer): optimize() would get the DataParallel, which
    replicates the module on every forward. (A caller's DDP keeps one module per process:
    detectron2's `do_train(cfg, model)` after `if distributed: model = DDP(model)` is wrapped.)"""
    if isinstance(home.node, cst.Module):
        return None  # the script's own code: nothing calls it
    for caller, call in code.callers(home):
        if caller == home:
            continue
        found = wrapped_before(code, caller, call, skip=home)
        if found is not None and found.wrapper == "DataParallel":
            return dataclasses.replace(found, handed_to=home.name)
    return None


def wrapper_name(file: SourceFile, call: cst.Call) -> str:
    """`DataParallel` for `torch.nn.DataParallel(model)`: the wrap's own name."""
    return file.qualname(call.func).split(".")[-1]
