"""The modules of the project that hold the training a script runs.

`autoopt lint train.py` checks train.py and, as mypy follows imports, the modules where the
training it runs lives: Conv-TasNet's `src/train.py` builds a `Solver` whose `train()` loop is in
`src/solver.py`; MelGAN's `trainer.py` calls `train(...)` of `utils/train.py`. A driver's
findings are those of the program it runs, reported where the code is (the file and line to
edit), once: a module already linted is not added again.

A call leads on when the program model says it trains (`Program.call_summary(...).trains`: the
callee reaches `backward()`, a constructor excepted) and resolves to a module of the project;
the modules found are followed in turn (`depth` calls deep: a driver, its trainer, the
trainer's step helper). Only from a script whose training is all elsewhere: one that calls
`backward()` itself has its loop in its own text (yolov5's `train.py` reaching a profiling
helper through its batch-size search is not a driver of that helper). From any script, the
modules that define the models it trains are checked for the rules that judge a model's own
code (`MODEL_RULES`: SRGAN's conv-then-BatchNorm blocks in model.py, S3Rec's attention,
EDSR's `nn.parallel.data_parallel` in its model's forward), and AO608 in the code the models'
`forward` methods run (`FORWARD_RULES`: MolCLR's loss builds its labels on the host and copies
them every step; a helper run once, at construction, is not reported), and the
modules of the functions it hands a trained model to evaluate are checked for AO403
(`EVALUATION_RULES`: federated-learning's `test_img(net_glob, ...)`), and those it calls to
parse a command line that declares `--local_rank` for AO502 (`OPTIONS_RULES`: Point-MAE's
`parser.get_args()`).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from autoopt.lint.program.index import (
    CallSite,
    Dotted,
    FunctionInfo,
    ModuleIndex,
    Value,
    load_index,
    parse_tree,
)
from autoopt.lint.program.project_files import resolve_module, root_of
from autoopt.lint.program.project_text import imported_paths, read_text
from autoopt.lint.program.summaries import Target, program
from autoopt.lint.program.view import drives_training_elsewhere, training_call_sites

# What a module followed because it defines the trained model is checked for: the rules that
# judge a model's own code (its layers, its attention, a DataParallel in its forward), not the
# training around it.
MODEL_RULES = ("AO501", "AO607", "AO609")
# ... and, in the code its modules' forward methods run every step (`forward_lines`), these.
FORWARD_RULES = ("AO608",)
# What a module followed because it builds the optimizer the training steps is checked for.
OPTIMIZER_RULES = ("AO605",)
# What a loader factory's module is checked for when the script runs its own loop.
LOADER_RULES = ("AO101", "AO102", "AO104")
# What a module followed because it evaluates the trained model is checked for.
EVALUATION_RULES = ("AO403",)
# What a module followed because it declares the script's command-line options is checked for.
OPTIONS_RULES = ("AO502",)
# What a module followed because the training step runs a function of it on the trained model
# (MART's `mart_loss(model=model, x_natural=data, ...)`: the adversarial examples it makes every
# step) is checked for: the tensors it makes on the host, or moves by hand, every step.
STEP_RULES = ("AO603", "AO608")


class Reached(NamedTuple):
    """A module a script's training reaches: where (`path`), what it holds there ("training",
    "loader", "loader options", "model", "optimizer", "evaluation", "options" or "step") and, for a
    module that
    defines the models, the classes the training builds from it (None: all of its classes, a
    module the models take their parts from)."""

    path: Path
    holds: str
    classes: frozenset[str] | None = None


def training_modules(path: Path, source: str, depth: int = 3) -> list[Reached]:
    """The project modules (other than `path`) whose code the training `path` runs lives in,
    in the order the calls reach them, then those that build the loaders it iterates
    (`loader_modules`), then those that define the models it trains (`model_modules`), and
    those that build the optimizers it steps (`optimizer_modules`), each with what it holds
    (`Reached`). Training modules only for a script whose training is all elsewhere (one with
    a backward of its own is checked as it is written); from such a script a loader factory's
    module is checked for the loader's options only ("loader options": `LOADER_RULES`,
    SimMIM's `build_loader_simmim`)."""
    root = os.path.abspath(root_of(path))
    start = os.path.abspath(path)
    index = load_index(path)
    if index is None:
        return []
    drives = drives_training_elsewhere(path, source) and not any(
        func.backward for func in index.functions.values()
    )
    found = _training(path, root, depth) if drives else []
    loaders = loader_modules([Path(start), *found], root)
    classes = loader_class_modules([Path(start), *found], root, exclude=[*found, *loaders])
    loaders_all = [*loaders, *classes]
    models = model_modules([Path(start), *found], root, exclude=[*found, *loaders_all])
    if not any(func.backward for func in index.functions.values()):
        # a model class that holds its own training loop, which the script calls by name
        # (CloserLookFewShot's `model.train_loop(epoch, loader, optimizer)` on a parameter
        # whose class the call graph cannot name): its module is where the training runs
        trains = [m.path for m in models if _calls_a_training_method(m.path, source)]
        found += trains
        models = [m for m in models if m.path not in trains]
    defined = [m.path for m in models]
    optimizers = optimizer_modules(
        [Path(start), *found], root, exclude=[*found, *loaders_all, *defined]
    )
    evaluators = evaluation_modules(
        [Path(start), *found], root, exclude=[*found, *loaders_all, *defined, *optimizers]
    )
    options = option_modules(
        [Path(start), *found],
        root,
        exclude=[*found, *loaders_all, *defined, *optimizers, *evaluators],
    )
    steps = step_helper_modules(
        [Path(start), *found],
        root,
        exclude=[*found, *loaders_all, *defined, *optimizers, *evaluators, *options],
    )
    return (
        [Reached(m, "training") for m in found]
        + [Reached(m, "loader" if drives else "loader options") for m in loaders]
        + [Reached(m, "loader options") for m in classes]
        + models
        + [Reached(m, "optimizer") for m in optimizers]
        + [Reached(m, "evaluation") for m in evaluators]
        + [Reached(m, "options") for m in options]
        + [Reached(m, "step") for m in steps]
    )


def _runs_backward(target: Target) -> bool:
    index = load_index(target.path)
    func = index.functions.get(target.qualname) if index is not None else None
    return func is not None and func.backward


def step_helper_modules(modules: list[Path], root: str, exclude: list[Path] = ()) -> list[Path]:
    """The project modules whose functions a training loop of `modules` (one that calls
    `backward()`) calls on every step with a model it runs forward (MART's
    `mart_loss(model=model, x_natural=data, ...)` in mart.py). Checked for `STEP_RULES` only,
    and only where the text moves something by hand (`.cuda(`, `.to(`)."""
    prog = program()
    targets: list[Target] = []
    for index, func, sites in _imported_call_sites(modules):
        if not func.backward:
            continue
        for site in sites:
            if not site.in_loop or site.no_grad:
                continue
            for target in prog.resolve(index, func, site.callee):
                if target.is_class or _runs_backward(target):
                    continue  # a helper with its own backward is training, not a step's helper
                summary = prog.summary(target)
                forwards = [
                    *(summary.roles_of(position=i) for i in range(len(site.args))),
                    *(summary.roles_of(keyword=k) for k, _ in site.keywords),
                ]
                if any("forward" in roles for roles in forwards):
                    targets.append(target)
    return [
        m
        for m in _function_modules(targets, [*modules, *exclude], root, "")
        if ".cuda(" in (text := read_text(m)) or ".to(" in text
    ]


def option_modules(modules: list[Path], root: str, exclude: list[Path] = ()) -> list[Path]:
    """The project modules whose code `modules` call to parse the command line and that
    declare a `--local_rank` option there (STCN's `HyperParameters().parse()` in
    util/hyper_para.py, SegmenTron's `parse_args()` of segmentron/utils/options.py, Point-MAE's
    `parser.get_args()`): the launcher's rank comes from them. Checked for `OPTIONS_RULES`
    only."""
    prog = program()
    seen = {os.path.abspath(m) for m in [*modules, *exclude]}  # checked, declaring or not
    found: list[Path] = []
    for index, func, sites in _imported_call_sites(modules):
        for site in sites:
            for target in prog.resolve(index, func, site.callee):
                where = os.path.abspath(target.path)
                if where in seen or not _inside(where, root):
                    continue
                seen.add(where)
                if _DECLARES_LOCAL_RANK.search(read_text(Path(where))):
                    found.append(Path(where))
    return found


_DECLARES_LOCAL_RANK = re.compile(r"add_argument\(\s*['\"]--local[_-]rank")


def _imported_call_sites(
    modules: list[Path],
) -> Iterator[tuple[ModuleIndex, FunctionInfo, list[CallSite]]]:
    """Each function of `modules` with its calls of a name it imports (`parse_args()`,
    `engine.evaluate(...)`): the calls that can run another module of the project."""
    for module in modules:
        index = load_index(module)
        if index is None:
            continue
        imported = {*index.imports, *index.module_aliases}
        for func in index.functions.values():
            sites = [s for s in func.calls if s.callee and s.callee[0] in imported]
            if sites:
                yield index, func, sites


def _calls_a_training_method(module: Path, source: str) -> bool:
    """A method of a class of `module` calls `backward()`, and `source` calls a method of
    that name (`.train_loop(`)."""
    index = load_index(module)
    return index is not None and any(
        func.backward and func.class_name and f".{func.qualname.rsplit('.', 1)[-1]}(" in source
        for func in index.functions.values()
    )


def _training(path: Path, root: str, depth: int) -> list[Path]:
    """The modules the training calls of `path` reach, `depth` calls deep."""
    prog = program()
    start = os.path.abspath(path)
    seen = {start}
    found: list[Path] = []
    frontier = [start]
    # a subclass's override counts where the script can run it: in a module it imports, as
    # far as imports go (deep-person-reid's projects/DML/dml.py subclasses torchreid's
    # `Engine` too, but scripts/main.py never imports it)
    runs = _imported_closure(Path(start), root)
    for _ in range(depth):
        later = []
        for module in frontier:
            index = load_index(module)
            if index is None:
                continue
            for func, site in training_call_sites(index, own_methods=module != start):
                for target in prog.resolve(index, func, site.callee):
                    where = os.path.abspath(target.path)
                    if where in seen or not _inside(where, root):
                        continue
                    if runs is not None and where not in runs:
                        continue
                    seen.add(where)
                    found.append(Path(where))
                    later.append(where)
        frontier = later
    return found


def _imported_closure(start: Path, root: str, limit: int = 2000) -> set[str] | None:
    """The modules of the project `start` imports, directly or through others; None past
    `limit` modules (then every module counts)."""
    seen = {str(start)}
    frontier = [start]
    while frontier:
        later = []
        for module in frontier:
            for imported in imported_paths(module, read_text(module)):
                where = os.path.abspath(imported)
                if where not in seen and _inside(where, root):
                    seen.add(where)
                    later.append(Path(where))
        if len(seen) > limit:
            return None
        frontier = later
    return seen


def model_modules(modules: list[Path], root: str, exclude: list[Path] = ()) -> list[Reached]:
    """The project modules that define the models the training of `modules` runs (a name
    run as a model, `model = S3RecModel(args)`, bound to a class of the project), with the
    classes built from each, and the project modules those import their parts from (S3Rec's
    models.py takes its attention layers from modules.py; all of their classes). Checked for
    `MODEL_RULES` only (and `FORWARD_RULES` in what those classes' forwards run)."""
    seen = {os.path.abspath(m) for m in [*modules, *exclude]}
    defining: list[Path] = []
    built: dict[str, set[str] | None] = {}
    for target in _builders(modules, _MODEL_ROLES):
        where = os.path.abspath(target.path)
        if where in built and target.is_class:
            names = built[where]
            if names is not None:
                names.add(target.qualname)
        if where in seen or not _inside(where, root):
            continue
        # a class, or a factory that wraps what it builds in DataParallel (Efficient-3DCNNs'
        # `generate_model(opt)`: AO501 is about its code)
        if target.is_class or _wraps_what_it_builds(target):
            seen.add(where)
            defining.append(Path(where))
            built[where] = {target.qualname} if target.is_class else None
    parts: list[Path] = []
    for module in defining:
        index = load_index(module)
        if index is None:
            continue
        imported = [(m, level) for m, _name, level in index.imports.values()]
        for name, level in [*imported, *index.star_imports]:
            resolved = resolve_module(module, name, level)
            where = os.path.abspath(resolved) if resolved is not None else None
            if where is None or where in seen or not _inside(where, root):
                continue
            seen.add(where)
            parts.append(Path(where))
    found = [
        Reached(m, "model", None if (names := built[str(m)]) is None else frozenset(names))
        for m in defining
    ]
    return [*found, *(Reached(m, "model") for m in parts)][:_MAX_MODEL_MODULES]


def forward_lines(module: Path, classes: frozenset[str] | None = None) -> list[tuple[int, int]]:
    """The lines (first, last) of the code `module`'s `forward` methods run: the `forward` of
    each of `classes` (all of the module's classes when None; one a class inherits from a
    base of the module), and what it calls within the module, transitively: its class's
    methods (`self.mask(...)`) and the module's functions (`index_points(...)`, CurveNet's
    `sample_and_group` and the helpers it calls). Not the forwards of other classes of the
    module (PEFT's peft_model.py: the script trains a `PeftModel`, not its prompt-learning
    subclasses), nor a branch one configuration takes (`if self.pooling == "average":`); the
    classes their code builds count as theirs (`_built_with`)."""
    tree = parse_tree(read_text(module))
    if tree is None:
        return []
    functions = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    methods = {
        node.name: {
            func.name: func
            for func in node.body
            if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }
    bases = {
        node.name: [b.id for b in node.bases if isinstance(b, ast.Name)]
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }
    if classes is not None:
        classes = _built_with(tree, classes & methods.keys(), functions)
    work = []
    for start in methods if classes is None else classes:
        cls, visited = start, set()
        while cls in methods and "forward" not in methods[cls] and cls not in visited:
            visited.add(cls)  # the forward it inherits from a base of the module
            cls = next((b for b in bases[cls] if b in methods), "")
        if cls in methods and "forward" in methods[cls]:
            work.append((cls, methods[cls]["forward"]))
    seen: set[ast.AST] = set()
    while work:
        cls, func = work.pop()
        if func in seen:
            continue
        seen.add(func)
        for call in ast.walk(func):
            if not isinstance(call, ast.Call):
                continue
            callee = call.func
            if isinstance(callee, ast.Name) and callee.id in functions:
                work.append(("", functions[callee.id]))
            elif (
                cls
                and isinstance(callee, ast.Attribute)
                and isinstance(callee.value, ast.Name)
                and callee.value.id == "self"
                and callee.attr in methods[cls]
            ):
                work.append((cls, methods[cls][callee.attr]))
    switched = [
        (node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno)
        for func in seen
        for node in ast.walk(func)
        if isinstance(node, ast.If) and _switch(node.test)
    ]
    return _without(sorted((f.lineno, f.end_lineno or f.lineno) for f in seen), switched)


def _built_with(
    tree: ast.Module, classes: frozenset[str], functions: dict[str, ast.AST]
) -> frozenset[str]:
    """`classes` and the classes of the module their code builds, directly or through the
    module's functions (Towards-Realtime-MOT's `Darknet` builds `YOLOLayer`s in
    `create_modules(...)`), transitively."""
    defined = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    built = set(classes)
    todo: list[ast.AST] = [defined[name] for name in classes]
    seen: set[str] = set()
    while todo:
        for call in ast.walk(todo.pop()):
            if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
                continue
            name = call.func.id
            if name in defined and name not in built:
                built.add(name)
                todo.append(defined[name])
            elif name in functions and name not in seen:
                seen.add(name)
                todo.append(functions[name])
    return frozenset(built)


def _switch(test: ast.expr) -> bool:
    """`self.pooling == "average"`: a branch only one configuration takes (powerful-gnns'
    neighbour pooling, "sum" by default), not the code every step runs."""
    return isinstance(test, ast.Compare) and any(
        isinstance(side, ast.Constant) and isinstance(side.value, str)
        for side in (test.left, *test.comparators)
    )


def _without(spans: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` with the lines of `holes` taken out."""
    for first, last in holes:
        kept = []
        for a, b in spans:
            if b < first or a > last:
                kept.append((a, b))
                continue
            if a < first:
                kept.append((a, first - 1))
            if b > last:
                kept.append((last + 1, b))
        spans = kept
    return spans


def _wraps_what_it_builds(target: Target) -> bool:
    """A factory function that wraps a model it builds in DataParallel: not a helper handed
    the model to wrap (CenterNet's `DataParallel(module, ...)`, ignite's `auto_model(model)`),
    which is the project's or a library's own parallel scheme."""
    if "DataParallel(" not in read_text(target.path):
        return False
    index = load_index(target.path)
    func = index.functions.get(target.qualname) if index is not None else None
    return func is not None and any(
        site.callee
        and site.callee[-1] == "DataParallel"
        and site.args
        and site.args[0] is not None
        and site.args[0][0] not in func.params
        for site in func.calls
    )


_MODEL_ROLES = {"module", "forward"}
_CLASS_BUILDERS = frozenset({"from_pretrained", "from_config"})  # classmethods building `cls`
_MAX_MODEL_MODULES = 8  # a model zoo's package is not read whole


def optimizer_modules(modules: list[Path], root: str, exclude: list[Path] = ()) -> list[Path]:
    """The project modules whose functions build the optimizers the training of `modules`
    steps (Swin's and SimMIM's `optimizer = build_optimizer(config, model)` of optimizer.py).
    Checked for `OPTIMIZER_RULES` only: the optimizer's own options."""
    # "optim": not where a torch.optim optimizer is built
    return _function_modules(_builders(modules, {"optimizer"}), [*modules, *exclude], root, "optim")


def evaluation_modules(modules: list[Path], root: str, exclude: list[Path] = ()) -> list[Path]:
    """The project modules whose functions the code of `modules` hands a model to run without
    training it (federated-learning's `test_img(net_glob, dataset_test, args)` of
    models/test.py: `net_g.eval()`, then a loop of forwards with autograd on). Checked for
    `EVALUATION_RULES` only."""
    prog = program()
    targets: list[Target] = []
    for index, func, sites in _imported_call_sites(modules):
        trained: set[Dotted] | None = None  # computed once a call needs it
        for site in sites:
            # a project function or a module's function by name (`test_img(...)`,
            # `engine.evaluate(...)`), handed a name: not every call of the file
            if not any(site.args) or site.no_grad:  # melgan's `with torch.no_grad(): ...`
                continue
            # the arguments the caller treats as a module (sets its mode, reads its
            # parameters) or hands to its training: a model, not a callable (`make_env`)
            models = [
                i for i, a in enumerate(site.args) if a and func.uses.get(a, set()) & _MODULE_USES
            ]
            if not models:
                if trained is None:
                    imported = {*index.imports, *index.module_aliases}
                    trained = _trained_arguments(index, func, imported)
                models = [i for i, a in enumerate(site.args) if a and a in trained]
            if not models:
                continue
            for target in prog.resolve(index, func, site.callee):
                summary = prog.summary(target)
                if (
                    not target.is_class
                    and not summary.trains
                    and any("forward" in summary.roles_of(position=i) for i in models)
                ):
                    targets.append(target)
    # "eval": a module that never names it has no evaluation loop for the rule to judge
    return _function_modules(targets, [*modules, *exclude], root, "eval")


_MODULE_USES = frozenset({"train_mode", "eval_mode", "parameters", "submodules"})


def _trained_arguments(index: ModuleIndex, func: FunctionInfo, imported: set[str]) -> set[Dotted]:
    """The names `func` hands to a project function that trains them (Efficient-3DCNNs'
    `train_epoch(i, train_loader, model, criterion, optimizer, ...)`)."""
    prog = program()
    found: set[Dotted] = set()
    for site in func.calls:
        if not site.callee or site.callee[0] not in imported or not any(site.args):
            continue
        summary = prog.call_summary(index, func, site.callee)
        if summary.trains and not summary.constructs:
            found.update(
                a
                for i, a in enumerate(site.args)
                if a is not None
                and a[-1] != "[]"  # an entry of a container: no name to follow
                and summary.roles_of(position=i) & {"forward", "trained"}
            )
    return found


def loader_modules(modules: list[Path], root: str) -> list[Path]:
    """The project modules (other than `modules`) whose functions build the loaders the
    training of `modules` iterates: guided-diffusion's `data = load_data(...)`, handed to
    `TrainLoop(data=data)`, built by a generator of image_datasets.py that re-iterates its
    DataLoader forever."""
    # "DataLoader": not a list the training iterates (metric names)
    return _function_modules(_loader_builders(modules), modules, root, "DataLoader")


def loader_class_modules(modules: list[Path], root: str, exclude: list[Path] = ()) -> list[Path]:
    """The project modules of the classes whose instances the training of `modules` is handed
    as its loaders (AdaFace's LightningDataModule given to `trainer.fit(model, data_mod)`).
    Checked for the loader rules only: the rest of such a module (a prefetcher on a CUDA
    stream) is not the training's code."""
    builders = [t for t in _loader_builders(modules) if t.is_class]
    return _function_modules(builders, [*modules, *exclude], root, "DataLoader", classes=True)


def loader_function_lines(modules: list[Path], root: str) -> dict[str, list[tuple[int, int]]]:
    """For each project module whose functions build the loaders the training of `modules`
    iterates, the lines of those functions (first, last): the loader rules report there only
    (End-to-end-ASR's src/data.py also holds `load_textset`, whose loader its ASR training
    never builds). A module where a class builds one is left out (all of it counts)."""
    functions: dict[str, set[str]] = {}
    whole: set[str] = set()
    for target in _loader_builders(modules):
        where = os.path.abspath(target.path)
        if target.is_class:
            whole.add(where)
        elif _inside(where, root):
            functions.setdefault(where, set()).add(target.qualname)
    found: dict[str, list[tuple[int, int]]] = {}
    for where, names in functions.items():
        if where in whole:
            continue
        tree = parse_tree(read_text(Path(where)))
        lines = list(_function_spans(tree, names)) if tree is not None else []
        if len(lines) == len(names):  # every builder found, else the whole module counts
            found[where] = lines
    return found


def _function_spans(tree: ast.Module, qualnames: set[str]) -> Iterator[tuple[int, int]]:
    for node in tree.body:
        inner = node.body if isinstance(node, ast.ClassDef) else [node]
        prefix = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
        for func in inner:
            if (
                isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef)
                and prefix + func.name in qualnames
            ):
                yield func.lineno, func.end_lineno or func.lineno


def _function_modules(
    targets: Iterable[Target], known: list[Path], root: str, word: str, classes: bool = False
) -> list[Path]:
    """The project modules (inside `root`, not among `known`) of the functions in `targets`
    (and of the classes, with `classes`) whose text names `word`, once each, in order."""
    seen = {os.path.abspath(m) for m in known}
    found: list[Path] = []
    for target in targets:
        where = os.path.abspath(target.path)
        if (target.is_class and not classes) or where in seen or not _inside(where, root):
            continue
        if word not in read_text(Path(where)):
            continue
        seen.add(where)
        found.append(Path(where))
    return found


def _loader_builders(modules: list[Path]) -> Iterator[Target]:
    """`_builders` of loaders, and one step further where a builder only hands on what
    another function returns (PatchTST's `Exp_Main._get_data`: `data_set, data_loader =
    data_provider(self.args, flag)`, `return data_set, data_loader`)."""
    prog = program()
    for target in _builders(modules, {"loader"}):
        yield target
        if target.is_class:
            continue
        index = load_index(target.path)
        func = index.functions.get(target.qualname) if index is not None else None
        if func is None:
            continue
        for r in func.returns:  # `return build_loader_simmim(config, logger)` (SimMIM)
            if r.kind == "call":
                yield from prog.resolve(index, func, r.dotted)
        returned = {
            v.dotted[0]
            for r in func.returns
            for v in (r.options if r.kind == "tuple" else (r,))
            if v.kind == "ref" and len(v.dotted) == 1
        }
        for name in returned:
            for value in func.assigns.get(name, ()):
                call = value.options[0] if value.kind == "item" else value
                if call.kind == "call":
                    yield from prog.resolve(index, func, call.dotted)


def _builders(modules: list[Path], roles: set[str]) -> Iterator[Target]:
    """The project functions and classes whose calls bind the names that the functions of
    `modules` use in one of `roles` (`model = S3RecModel(args)`, `data = load_data(...)`)."""
    prog = program()
    for module in modules:
        index = load_index(module)
        if index is None:
            continue
        for func in index.functions.values():
            summary = prog.summary(Target(index.path, func.qualname))
            bound: list[Value] = [
                value
                for name, held in summary.local_roles.items()
                if held & roles
                for value in func.assigns.get(name, ())
            ]
            cls = index.classes.get(func.class_name) if func.class_name else None
            if cls is not None:  # `self.model = VQAModel(...)` in a trainer's method (lxmert)
                bound += [
                    value
                    for key, held in summary.roles.items()
                    if key.startswith("self.") and key.count(".") == 1 and held & roles
                    for method in cls.methods.values()
                    for value in method.self_attrs.get(key[5:], ())
                ]
            for value in bound:
                call = value.options[0] if value.kind == "item" else value
                if call.kind != "call":
                    continue
                yield from prog.resolve(index, func, call.dotted)
                if len(call.dotted) >= 2 and call.dotted[-1] in _CLASS_BUILDERS:
                    # `UniterForVisualQuestionAnswering.from_pretrained(...)` builds that class
                    yield from prog.resolve(index, func, call.dotted[:-1])


def _inside(path: str, root: str) -> bool:
    return path.endswith(".py") and path.startswith(root.rstrip(os.sep) + os.sep)
