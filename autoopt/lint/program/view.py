"""The program model as the linted file sees it: which of its calls run training somewhere in the
project, and what each call does with the objects it is handed.

The file is indexed like any module of the project (`index`), so a call in it resolves through
its own imports and definitions (`summaries.Program.resolve`); rules ask with libcst nodes:

    view = rule.context.program
    view.training_calls            # calls that train: train(model, loader), trainer.fit()
    view.argument_roles(call)      # [(argument, {"trained", "loader_per_epoch", ...}), ...]
    view.trained_names()           # names handed to a call that trains them as a model
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

from autoopt.lint.program.facts import local_callee, named_like_evaluation
from autoopt.lint.program.index import (
    CallSite,
    Dotted,
    FunctionInfo,
    ModuleIndex,
    Value,
    index_source,
    load_index,
    share_file_tree,
)
from autoopt.lint.program.library import (
    MODEL_FACTORIES,
    MODEL_WRAPPERS,
    not_a_model,
)
from autoopt.lint.program.project_files import (
    project_stamp,
    resolve_module,
)
from autoopt.lint.program.project_text import (
    an_importer_says,
    imported_paths,
    importers_of,
    imports_training,
    read_text,
    switches_cudnn_off,
    text_trains,
    text_uses_cuda,
)
from autoopt.lint.program.summaries import EMPTY, Summary, Target, program, returned_positions
from autoopt.lint.tree.encoding import content_digest
from autoopt.lint.tree.nodes import calls_in, dotted, nodes_of_type

# A call's keyword that turns the project's CUDA path off (DeepFM's `use_cuda=False`).
_ASKS_FOR_CPU = re.compile(r"\b(use_)?(cuda|gpu)\s*=\s*False\b")

if TYPE_CHECKING:
    from autoopt.lint.program.facts import FileFacts

# Roots of calls that are never the project's own (a cheap way out before any resolution).
_LIBRARY_ROOTS = frozenset(
    {"torch", "nn", "F", "np", "numpy", "math", "os", "sys", "print", "len", "range", "str",
     "int", "float", "list", "dict", "set", "tuple", "isinstance", "getattr", "setattr",
     "hasattr", "super", "enumerate", "zip", "min", "max", "sum", "sorted", "open", "logging",
     "logger", "json", "time", "random", "copy", "argparse", "parser", "args", "plt", "tqdm",
     "writer", "wandb", "optim", "transforms", "T"}
)  # fmt: skip


@functools.lru_cache(maxsize=8)
def _file_index(path: str, source: str) -> ModuleIndex:
    """The linted text's index: the project's own index of the file where the text is what the
    file holds (one index of it per process, not two), else the text's."""
    found = load_index(path)
    raw = source.encode("utf-8", "surrogatepass")
    if found is not None and found.digest == content_digest(raw):
        share_file_tree(path, source, raw)
        return found
    return index_source(Path(path), source)


class ProgramView:
    """See the module's docs. Built once per linted file, lazily."""

    def __init__(self, path: Path, source: str, facts: FileFacts) -> None:
        self.path = Path(path)
        self.facts = facts
        self.program = program()
        self._summaries: dict[int, Summary] = {}

    @functools.cached_property
    def index(self) -> ModuleIndex:
        """The file indexed like any module of the project (parsed only when asked)."""
        index = _file_index(str(self.path.absolute()), self.facts.source)
        self.program.linting(index)
        return index

    # ----- the file among the project's modules ---------------------------------------------------
    @functools.cached_property
    def runs_on_cuda(self) -> bool:
        """This file's training runs on CUDA: its own text says so, or a module it imports (a
        config with `DEVICE = "cuda"`, the trainer it hands the model to)."""
        if self.facts.uses_cuda:
            return True
        if _ASKS_FOR_CPU.search(self.facts.source):
            return False  # `DeepFM(feature_sizes, use_cuda=False)`: the CUDA path not taken
        return reached_text_uses_cuda(self._path, self.facts.source)

    @functools.cached_property
    def gpu_path(self) -> bool:
        """The file can run on a GPU: its own code says so (`facts.device.gpu_path`), or it
        reads a device of unknown origin in a program that runs on CUDA (Crossformer's
        `.to(self.device)`, the device set by `Exp_Basic` of another module), or it trains
        on a device it does not choose and a CUDA training script imports it."""
        device = self.facts.device
        if device.gpu_path or (not device.no_device and self.runs_on_cuda):
            return True
        # a training helper that names no device of its own (physics_informed's train_2d.py,
        # `x.to(rank)`) or reads its caller's (federated-learning's `LocalUpdate.train`,
        # `.to(self.args.device)`), imported by a script that trains on CUDA
        return bool(self.facts.backward_calls) and self.serves_cuda_training

    @functools.cached_property
    def cudnn_off(self) -> bool:
        """The program runs with cuDNN switched off (`cudnn.enabled = False`): in this file, a
        script that imports it, or a project module it imports (crnn-pytorch's train.py imports
        evaluate.py, which switches it off at import)."""
        return (
            switches_cudnn_off(self.facts.source)
            or self.importer_text_says(switches_cudnn_off)
            or self.reaches_text_that_says(switches_cudnn_off)
        )

    @functools.cached_property
    def _path(self) -> Path:
        return Path(os.path.abspath(self.path))

    def reaches_text_that_says(self, says: Callable[[str], bool]) -> bool:
        """`says` holds for this file's text or that of a project module it imports, two deep
        (`neuralop.training.setup(config)` setting TF32 for the driver)."""
        return reached_text_says(self._path, self.facts.source, says)

    def base_class_text_says(self, says: Callable[[str], bool]) -> bool:
        """`says` holds for the text of a project module that defines a base class of a class
        of this file (End-to-end-ASR's `Solver(BaseSolver)`, whose `enable_apex()` in
        src/solver.py the subclass's `set_model()` calls)."""
        for cls in self.index.classes.values():
            for index, _ in self.program.all_bases(self.index, cls):
                if index.path != self.index.path and says(read_text(Path(index.path))):
                    return True
        return False

    def importer_text_says(self, says: Callable[[str], bool]) -> bool:
        """`says` holds for the text of a project module that imports this one (the driver
        that sets cuDNN's flag before it builds the Solver this module defines)."""
        return an_importer_says(self._path, says)

    @functools.cached_property
    def cpu_only(self) -> bool:
        """The program trains on the CPU only: this file names no device and says nothing of
        GPUs (`FileFacts.cpu_only`), nor does the project's code that imports it or that it
        imports (physics_informed's train_2d.py moves batches with `.to(rank)`; the script
        that calls it picks `cuda:0`)."""
        return self.facts.cpu_only and not (self.runs_on_cuda or self.serves_cuda_training)

    @functools.cached_property
    def serves_cuda_training(self) -> bool:
        """A module of the project that imports this one trains on CUDA (an optimizer factory,
        a model definition, a data module of a CUDA program)."""
        return used_by_cuda_training(self._path)

    @functools.cached_property
    def is_entry_script(self) -> bool:
        """The program starts here: an `if __name__ == "__main__":` guard, or no module of the
        project imports this one. Program-wide switches (TF32, cuDNN autotuning) belong here,
        not in the trainer module a driver imports."""
        if "__main__" in self.facts.source:
            return True
        importers = self._importers_through_packages
        if importers and not _runs_at_top_level(self.facts.module.body):
            return False  # only definitions, imported: a trainer module, run from elsewhere
        return not any(
            drives_training_elsewhere(importer, read_text(importer)) for importer in importers
        )

    @functools.cached_property
    def _importers_through_packages(self) -> list[Path]:
        """The project's modules that import this one, also through a package's `__init__`
        that re-exports it (`from .ppo import PPO`, then `algo.PPO(...)` in main.py)."""
        importers = list(importers_of(self._path))
        for importer in list(importers):
            if importer.name == "__init__.py":
                importers.extend(importers_of(importer))
        return importers

    def dataset_on_device(self, call: cst.Call) -> bool:
        """The loader `call` builds iterates a dataset of the project whose `__getitem__` moves
        its samples to a device (`signal.to(self.device)`): worker processes would have to
        start CUDA, pinning has nothing to pin, and the batches arrive on the device already."""
        dataset = call.args[0].value if call.args and not call.args[0].keyword else None
        name = dotted(dataset) if dataset is not None else None
        func = self.function_of(call)
        if name is None or func is None:
            return False
        return self.program.holds_dataset_on_device(self.index, func, name)

    def called_from_the_project(self, func: cst.FunctionDef) -> bool:
        """Some code of the project calls `func` (this file, or a module importing it): what it
        is handed is built there (the model a `train(model, ...)` receives is the caller's)."""
        name = func.name.value
        own = (name, f"self.{name}")
        # also through a package's `__init__` that re-exports it (`from seq2seq.trainer import
        # SupervisedTrainer`, then `t.train(model, ...)`)
        importers = self._importers_through_packages
        if name == "__init__":  # a constructor runs when its class is called: `PPO(policy)`
            owner = next(
                (a for a in self.facts.ancestors(func) if isinstance(a, cst.ClassDef)), None
            )
            if owner is None:
                return False
            name = owner.name.value
            own = (name,)
        if any(dotted(c.func) in own for c in calls_in(self.facts.module)):
            return True
        return any(f"{name}(" in read_text(m) for m in importers)

    def called_in_a_loop(self, func: cst.FunctionDef) -> bool:
        """The project calls `func` inside a loop (this file or a module importing it): a step
        function a batch loop elsewhere runs (`loss = engine.train(x, y)` per batch)."""
        info = self.function_of(func.body)
        if info is None or info.qualname == "<module>":
            return False
        return self.program.called_in_a_loop(Target(self.index.path, info.qualname))

    @functools.cached_property
    def steps_run_elsewhere(self) -> list[cst.FunctionDef]:
        """This file's step functions that a loop of the project runs: they call `backward()`
        outside any loop of their own, and some loop calls them (`agent.learn()` once per
        environment step in main.py, `engine.train(x, y)` per batch). The file trains, its
        loop elsewhere."""
        facts = self.facts
        found: dict[int, cst.FunctionDef] = {}
        # a backward of its own, or through a helper of this file it calls once
        # (CORL's `trainer.train(batch)` per step, whose `self._update_v(...)` calls backward)
        # helpers that run one step, not an epoch loop: their backward outside any loop of
        # theirs (CORL's `_update_v`, pixel-nerf's `calc_losses`), or no loop at all
        loopless = {
            f.name.value
            for f in nodes_of_type(facts.module, cst.FunctionDef)
            if not nodes_of_type(f.body, (cst.For, cst.While), into_scopes=False)
        } | {
            scope.name.value
            for b in facts.backward_calls
            if isinstance(scope := facts.enclosing_scope(b), cst.FunctionDef)
            and not facts.enclosing_loops(b)
        }
        helper_calls = [
            c
            for c in facts.backward_helper_calls
            if local_callee(c) in loopless
            # pixel-nerf's `eval_step` runs `calc_losses(is_train=False)`: not a step
            and not _evaluation_function(facts.enclosing_scope(c))
        ]
        for call in [*facts.backward_calls, *helper_calls]:
            scope = facts.enclosing_scope(call)
            if (
                isinstance(scope, cst.FunctionDef)
                and id(scope) not in found
                and not facts.enclosing_loops(call)
                and self.called_in_a_loop(scope)
            ):
                found[id(scope)] = scope
        return list(found.values())

    # ----- calls --------------------------------------------------------------------------------
    def function_of(self, node: cst.CSTNode) -> FunctionInfo | None:
        """The index's entry for the function holding `node`: the outermost `def` (or the
        method `Class.name`), the module's own code outside any."""
        name = None
        cls = None
        for anc in self.facts.ancestors(node):
            kind = type(anc)  # exact types (see `nodes.SCOPE_TYPES`): asked for every call
            if kind is cst.FunctionDef:
                name, cls = anc.name.value, None  # type: ignore[attr-defined]
            elif kind is cst.ClassDef and name is not None and cls is None:
                cls = anc.name.value  # type: ignore[attr-defined]
        if name is None:
            return self.index.functions.get("<module>")
        return self.index.functions.get(f"{cls}.{name}" if cls else name)

    def called_by_the_project(self, node: cst.CSTNode) -> bool:
        """The function holding `node` is called somewhere in the project with its result
        kept (`optimizer = build_optimizer(config, model)`); code outside any function, a
        method (its object's making is not followed here) and a function that trains (the
        `train(config)` a script calls for its effect) count as called."""
        func = self.function_of(node)
        if func is None or func.qualname == "<module>" or func.class_name:
            return True
        if func.backward or func.zero_grad:
            return True
        return bool(self.program.callers(Target(self._path, func.qualname)))

    def callers_leave_out(self, node: cst.CSTNode, param: str) -> list[tuple[Path, int]] | None:
        """The lines of the project's calls of the function holding `node`, when there are
        some and none passes its parameter `param` (autovc's `get_loader(root, batch_size,
        len_crop, num_workers=0)`, called without `num_workers`): the parameter's default is
        what runs. None when a call passes it, or no call is found."""
        found = self._parameter_calls(node, param)
        if found is None:
            return None
        position, calls = found
        if not calls:
            return None
        for _, call in calls:
            if len(call.args) > position or any(k == param for k, _ in call.keywords):
                return None
        return sorted((path, call.line) for path, call in calls)

    def callers_pass(self, node: cst.CSTNode, param: str) -> list[tuple[Path, int, Dotted]] | None:
        """What the project's calls of the function holding `node` pass for its parameter
        `param`, as (file, line, the dotted name passed), when there are some and every one
        passes a dotted name there (egnn's `retrieve_dataloaders(args.batch_size,
        args.num_workers)`). None otherwise."""
        calls = self._parameter_calls(node, param)
        if calls is None:
            return None
        position = calls[0]
        found: list[tuple[Path, int, Dotted]] = []
        for path, call in calls[1]:
            passed = dict(call.keywords).get(param)
            if passed is None and len(call.args) > position:
                passed = call.args[position]
            if passed is None:
                return None
            found.append((path, call.line, passed))
        return sorted(set(found)) or None  # `a, b = f(...)`: one call, met once per target

    def _parameter_calls(
        self, node: cst.CSTNode, param: str
    ) -> tuple[int, list[tuple[Path, Value]]] | None:
        """For the function holding `node` and its parameter `param`: the position callers
        pass it at, and the project's calls of the function (file, call); None when `node` is
        in no function or `param` is none of its parameters."""
        func = self.function_of(node)
        if func is None or func.qualname == "<module>" or param not in func.params:
            return None
        position = func.params.index(param)
        if func.class_name:
            position -= 1  # `self` is not passed
        calls = [
            (index.path, value.options[0] if value.kind == "item" else value)
            for index, _, value in self.program.callers(Target(self._path, func.qualname))
        ]
        return position, calls

    def base_binding(self, class_name: str, attr: str) -> str | None:
        """Where a base class of the project binds `self.<attr>` for the class `class_name` of
        this file (Autoformer's `Exp_Main(Exp_Basic)`, whose `Exp_Basic.__init__` builds
        `self.model`): `Exp_Basic.__init__ of exp/exp_basic.py`, or None."""
        cls = self.index.classes.get(class_name)
        if cls is None:
            return None
        for index, base in self.program.all_bases(self.index, cls):
            for method in base.methods.values():
                if attr in method.self_attrs:
                    return f"{method.qualname} of {_shown_path(index.path)}"
        return None

    def call_summary(self, call: cst.Call) -> Summary:
        """What `call` runs, as far as the project's code tells (EMPTY for a library call)."""
        found = self._summaries.get(id(call))
        if found is None:
            found = self._summaries[id(call)] = self._resolve(call)
        return found

    def host_read_in_callee(self, call: cst.Call) -> tuple[str, int] | None:
        """Where a function of the project that `call` runs reads a tensor on the host every
        time it runs (glow-tts's `commons.clip_grad_value_(...)` calls `.item()` for every
        parameter): (its file as a report names it, the line). None for a library call, a
        training step (its reads are its own findings), a top-level function of this file
        (its read reports itself where it is) and a model's forward (what it reads on the
        host, lengths to pack a sequence, is its computation: no logging to thin out)."""
        for target, module, here in self._callees(call):
            if here and "." not in target.qualname:
                continue
            func = _host_reading_candidate(target, module)
            if func is None:
                continue
            if func.host_read:
                return _shown_path(module.path), func.host_read
            if (deeper := self._host_read_below(module, func)) is not None:
                return deeper
        return None

    def _host_read_below(self, module: ModuleIndex, func: FunctionInfo) -> tuple[str, int] | None:
        """A read on the host one call below `func`, in a method of its own object it calls
        every time it runs (outside its loops and `if`s): ChangeFormer's
        `_collect_running_batch_states()` calling `self._update_metric()`, whose
        `G_pred.cpu().numpy()` runs on every step. Not the functions of other modules it
        calls (hindsight-experience-replay's `sync_grads` reads the gradients into numpy for
        MPI's all-reduce: the algorithm's own need, not a metric)."""
        for site in func.calls:
            if site.in_if or site.in_loop or site.passed or site.callee[:1] != ("self",):
                continue
            for target in self.program.resolve(module, func, site.callee):
                below = self.program.module(target.path)
                inner = _host_reading_candidate(target, below) if below is not None else None
                if below is not None and inner is not None and inner.host_read:
                    return _shown_path(below.path), inner.host_read
        return None

    def data_parallel_in_callee(self, call: cst.Call) -> tuple[str, int] | None:
        """Where the project's class (its `__init__`) or function that `call` runs wraps a
        model in `nn.DataParallel` (CMC's `InsResNet50(...)`, a `create_model(config)`
        factory): (its file as a report names it, the line). None for a library call and for
        this file's own code (its DataParallel reports itself)."""
        for target, module, here in self._callees(call):
            if here:
                continue
            name = f"{target.qualname}.__init__" if target.is_class else target.qualname
            func = module.functions.get(name)
            if func is not None and func.data_parallel:
                return _shown_path(module.path), func.data_parallel
        return None

    def thin_data_parallel(self, call: cst.Call) -> bool:
        """`call` builds a project class that subclasses `nn.DataParallel` and keeps its
        scatter, forward and gather (Wave-U-Net's `model_utils.DataParallel`, which only adds
        `__getattr__`): DataParallel itself. A subclass with its own gather (a tutorial's
        balanced `DataParallelModel`) is the user's own class."""
        for target, module, _ in self._callees(call):
            cls = module.classes.get(target.qualname) if target.is_class else None
            if cls is None:
                continue
            chain = [(module, cls), *self.program.all_bases(module, cls)]
            if not any(_names_torch_class(m, b, "DataParallel") for m, c in chain for b in c.bases):
                continue
            return not any(set(c.methods) & {"scatter", "gather", "forward"} for _, c in chain)
        return False

    def determinism_in_callee(self, call: cst.Call) -> tuple[str, int] | None:
        """Where a function of the project that `call` runs asks for determinism whenever it
        runs (a seed helper setting `cudnn.deterministic = True`): (its file, the line)."""
        for target, module, _ in self._callees(call):
            if target.is_class:
                continue
            func = module.functions.get(target.qualname)
            if func is not None and func.determinism:
                return _shown_path(module.path), func.determinism
        return None

    def returns_placed(self, call: cst.Call) -> bool:
        """`call` runs a function of the project that hands back what it moved to a device
        (SSL4MIS's `net_factory`: `net = UNet(...).cuda()` in each branch, `return net`).
        False for this file's own functions: the model is placed, and reported, in them."""
        for target, module, here in self._callees(call):
            func = None if target.is_class or here else module.functions.get(target.qualname)
            if func is not None and func.returns_placed:
                return True
        return False

    def loader_class_without(self, call: cst.Call, option: str) -> tuple[str, str, int] | None:
        """`call` builds a `DataLoader` subclass of another module of the project
        (pytorch-template's `MnistDataLoader(BaseDataLoader)`, whose base hands its kwargs to
        `DataLoader.__init__`) none of whose modules names `option`: (the class, its file as
        a report names it, its line). None otherwise (a library class, this file's own class,
        a chain that sets the option somewhere, by any route)."""
        for target, module, here in self._callees(call):
            cls = module.classes.get(target.qualname) if target.is_class else None
            if here or cls is None:
                continue
            chain = [(module, cls), *self.program.all_bases(module, cls)]
            if not any(_names_torch_class(m, b, "DataLoader") for m, c in chain for b in c.bases):
                continue
            if any(option in read_text(Path(m.path)) for m, _ in chain):
                return None
            return cls.name, _shown_path(module.path), cls.line
        return None

    def _callees(self, call: cst.Call) -> Iterator[tuple[Target, ModuleIndex, bool]]:
        """The project's targets `call` may run, each with its module's index and whether
        that module is this file."""
        parts = self._project_callee(call)
        if parts is None:
            return
        index = self.index
        for target in self.program.resolve(index, self.function_of(call), parts):
            module = self.program.module(target.path)
            if module is not None:
                yield target, module, os.path.abspath(module.path) == os.path.abspath(index.path)

    def _project_callee(self, call: cst.Call) -> tuple[str, ...] | None:
        """The dotted name `call` calls (`("engine", "train_one_epoch")`), or None when it has
        none or it names a library the file does not rebind (`torch.nn.functional.relu`)."""
        name = dotted(call.func)
        if name is None:
            return None
        parts = tuple(name.split("."))
        head = parts[0]
        index = self.index
        if head in _LIBRARY_ROOTS and not (
            head in index.imports or head in index.functions or head in index.classes
        ):
            return None
        return parts

    def _resolve(self, call: cst.Call) -> Summary:
        if dotted(call.func) is None:
            built = _built_then_called(call)
            if built is None:
                return EMPTY
            # `Trainer(...).fit()`: whether the method trains (the constructor's call holds
            # the arguments and their roles)
            found = self.program.call_summary(self.index, self.function_of(call), built)
            return Summary(trains=found.trains) if found.trains else EMPTY
        parts = self._project_callee(call)
        if parts is None:
            return EMPTY
        return self.program.call_summary(self.index, self.function_of(call), parts)

    @functools.cached_property
    def training_calls(self) -> list[cst.Call]:
        """Calls of the file that run training (a function or method of the project that
        reaches `backward()`), outside the function they call (recursion). None where the file
        reaches no training code beyond what it says itself (`FileFacts` follows its own
        `backward()` helpers): the program is not consulted call by call."""
        if not drives_training_elsewhere(self._path, self.facts.source):
            return []
        heads, own = self._training_heads
        found = []
        for call in calls_in(self.facts.module):
            name = dotted(call.func)
            parts = name.split(".") if name is not None else _built_then_called(call)
            if parts is None:
                continue
            if parts[0] not in heads and parts[-1] not in own:
                continue  # nothing on its way to the project's training code: not resolved
            summary = self.call_summary(call)
            if summary.trains and not summary.constructs:
                found.append(call)
        return found

    @functools.cached_property
    def _training_heads(self) -> tuple[set[str], set[str]]:
        return training_heads(self.index)

    def argument_roles(self, call: cst.Call) -> Iterator[tuple[cst.Arg, set[str]]]:
        """Each argument of `call` with the roles the callee gives its parameter."""
        summary = self.call_summary(call)
        if summary is EMPTY:
            return
        position = 0
        for arg in call.args:
            if arg.star:
                return
            if arg.keyword is not None:
                roles = summary.roles_of(keyword=arg.keyword.value)
            else:
                roles = summary.roles_of(position)
                position += 1
            if roles:
                yield arg, roles

    def runs_forward_with_grad(self, call: cst.Call) -> bool | None:
        """Whether a call of the project's code runs a forward of something it is handed with
        autograd on (`evaluate(model, loader)` not decorated with no_grad: True; a
        `save_model(model, ...)` that only reads its state_dict: False); None when the callee is
        not the project's (a library's, or unresolved)."""
        summary = self.call_summary(call)
        if summary is EMPTY:
            return None
        # a forward both with and without autograd (DPR's `_do_biencoder_fwd_pass`: under
        # `torch.no_grad()` when `not model.training`): the callee picks the mode itself
        return any(
            ("forward" in roles and "forward_no_grad" not in roles)
            or {"methods", "module"} <= roles
            for _, roles in self.argument_roles(call)
        )

    def trained_names(self) -> dict[str, list[cst.Call]]:
        """Names (`model`, `self.G`) handed to a call that trains them as a model, with those
        calls: the driver's half of a loop that lives elsewhere."""
        return self._names_with_role("trained")

    @functools.cached_property
    def iterated_per_epoch(self) -> dict[str, list[cst.Call]]:
        """Names handed to a call that iterates them again and again (once per epoch), or to a
        call made in a loop that iterates them; also this module's own globals that a function
        of it iterates when called in a loop (`for epoch ...: train(epoch)` over a module-level
        `trainloader`)."""
        found: dict[str, list[cst.Call]] = {}
        for call in calls_in(self.facts.module):
            summary = self.call_summary(call)
            # `trainer = Trainer(model, train_loader=loader)`, then `trainer.train(epoch)` in a
            # loop: the instance runs its methods again and again
            in_loop = bool(self.facts.enclosing_loops(call)) or (
                summary.constructs and self._instance_used_in_loop(call)
            )
            for arg, roles in self.argument_roles(call):
                name = dotted(arg.value)
                if name is None or "loader" not in roles:
                    continue
                if "loader_per_epoch" in roles or in_loop:
                    found.setdefault(name, []).append(call)
            for name, roles in summary.global_roles.items():
                per_epoch = in_loop or "loader_per_epoch" in roles
                if "loader" in roles and per_epoch and self._is_own_global(call, name):
                    found.setdefault(name, []).append(call)
        return found

    def returned_per_epoch(self, node: cst.CSTNode, name: str) -> bool:
        """`name`, bound in the function holding `node`, is returned by it (alone or in a
        tuple), and the project's callers of that function iterate what it returns epoch after
        epoch (`train_loader, test_loader = get_loader(args)` then a loop over epochs)."""
        return self.returned_as(node, name, "loader_per_epoch")

    def returned_to_device(self, node: cst.CSTNode, name: str) -> bool:
        """`name` is returned by the function holding `node` and the project's callers move
        the batches of what it returns to a device (PatchTST's `data_provider` returning the
        DataLoader whose batches `Exp_Main.train` moves with `.to(self.device)`)."""
        return self.returned_as(node, name, "batches_to_device")

    def returned_as(self, node: cst.CSTNode, name: str, role: str) -> bool:
        """`name`, bound in the function holding `node`, is returned by it (alone or in a
        tuple), and the project's callers use what it returns in `role`."""
        func = self.function_of(node)
        if func is None or func.qualname == "<module>":
            return False
        target = Target(self.index.path, func.qualname)
        positions = returned_positions(func, name)
        if not name and any(value.kind == "call" for value in func.returns):
            positions.append(None)  # `return DataLoader(...)`, asked with no name
        return any(role in self.program.returned_roles(target, p) for p in positions)

    def changed_between_epochs(self, loader: str, dataset: str | None) -> bool:
        """The loader's dataset is changed in place in the main process while training: a
        method of `dataset` called in a loop (`train_dataset.ng_sample()` each epoch), or
        `loader.dataset.<method>()` anywhere, here or in a callee handed the loader. Worker
        processes that persist would keep the dataset as it was at the first epoch."""
        for func in self.index.functions.values():
            if "dataset_mutated" in func.uses.get((loader,), ()):
                return True
            if dataset and "method_called_in_loop" in func.uses.get((dataset,), ()):
                return True
        for call in calls_in(self.facts.module):
            for arg, roles in self.argument_roles(call):
                if "dataset_mutated" in roles and dotted(arg.value) == loader:
                    return True
        return False

    def _instance_used_in_loop(self, call: cst.Call) -> bool:
        """`call` builds an object bound to a name whose methods are called in a loop."""
        holder = self.facts.parent(call)
        if not isinstance(holder, cst.Assign) or len(holder.targets) != 1:
            return False
        name = dotted(holder.targets[0].target)
        func = self.function_of(call)
        if name is None or func is None:
            return False
        return "method_called_in_loop" in func.uses.get(tuple(name.split(".")), ())

    def _is_own_global(self, call: cst.Call, name: str) -> bool:
        """`call` runs a function of this very file and `name` is a global of it."""
        name_parts = dotted(call.func)
        if name_parts is None or name not in self.index.module_code.assigns:
            return False
        targets = self.program.resolve(
            self.index, self.function_of(call), tuple(name_parts.split("."))
        )
        return any(t.path == self.index.path for t in targets)

    def batches_moved_by_callee(self, name: str) -> bool:
        """`name` (a loader) is handed to a project call that moves the batches it iterates to
        a device (S3Rec's `FinetuneTrainer(model, train_dataloader, ...)`)."""
        return name in self._names_with_role("batches_to_device")

    def _names_with_role(self, role: str) -> dict[str, list[cst.Call]]:
        found: dict[str, list[cst.Call]] = {}
        for call in calls_in(self.facts.module):
            for arg, roles in self.argument_roles(call):
                name = dotted(arg.value)
                if name is not None and role in roles:
                    found.setdefault(name, []).append(call)
        return found

    # ----- what a name is bound to --------------------------------------------------------------
    def trained_models(self) -> dict[str, list[cst.Call]]:
        """`trained_names` that are models: kept as a module by the callee (its mode set, its
        parameters read), or bound here to what builds a model (`Net(...)` of an `nn.Module`
        class, a zoo or a factory, `nn.DataParallel(model)`); not a loss or a loss scaler."""
        found: dict[str, list[cst.Call]] = {}
        for call in calls_in(self.facts.module):
            for arg, roles in self.argument_roles(call):
                name = dotted(arg.value)
                if name is None or "trained" not in roles:
                    continue
                last = name.rsplit(".", 1)[-1]
                if not_a_model(last) or last.lower().startswith(("loss", "criterion")):
                    continue  # `loss_module = RegionLoss(cfg).cuda()` (YOWO): run, not trained
                if "module" in roles or self.builds_model(self.function_of(call), name):
                    found.setdefault(name, []).append(call)
        return found

    def builds_model(self, func: FunctionInfo | None, name: str, depth: int = 0) -> bool:
        """`name`, as bound in `func` (or the module's own code), is a model by how it was
        built (see `trained_models`)."""
        if func is None or depth > 4:
            return False
        parts = tuple(name.split("."))
        if len(parts) == 2 and parts[0] == "self" and func.class_name:
            cls = self.index.classes.get(func.class_name)
            values = (
                [v for m in cls.methods.values() for v in m.self_attrs.get(parts[1], ())]
                if cls
                else []
            )
        elif len(parts) == 1:
            values = list(func.assigns.get(name, ()))
            if not values and func.qualname != "<module>":
                values = list(self.index.module_code.assigns.get(name, ()))
        else:
            return False
        return any(self._model_value(func, v, depth) for v in values)

    def _model_value(self, func: FunctionInfo, value: Value, depth: int) -> bool:
        if value.kind == "item" and any(
            self.program.is_module_class(index, cls)
            for index, cls in self.program.classes_of(self.index, func, value)
        ):
            return True  # `model, diffusion = create_model_and_diffusion(...)`
        if value.kind in ("choice", "item"):
            return any(self._model_value(func, v, depth) for v in value.options)
        if value.kind == "ref":
            return self.builds_model(func, ".".join(value.dotted), depth + 1)
        if value.kind != "call" or not value.dotted:
            return False
        leaf = value.dotted[-1]
        if not_a_model(leaf):
            return False
        if leaf in MODEL_WRAPPERS and value.args and value.args[0] is not None:
            return self.builds_model(func, ".".join(value.args[0]), depth + 1)
        if leaf in MODEL_FACTORIES or leaf.endswith(("Model", "Net", "net")):
            return True
        if len(value.dotted) >= 2 and value.dotted[-2] == "models":  # torchvision.models.x
            return True
        for index, cls in self.program.classes_of(self.index, func, value):
            if self.program.is_module_class(index, cls):
                return True
        return False


def _evaluation_function(scope: cst.CSTNode) -> bool:
    """`def eval_step(...)`, `def validate(...)`: a function named for evaluation."""
    return isinstance(scope, cst.FunctionDef) and named_like_evaluation(scope.name.value)


def _built_then_called(call: cst.Call) -> tuple[str, ...] | None:
    """`Trainer(...).fit()` -> ("Trainer", "fit"): a method of the object the inner call builds
    (the index records such a call the same way)."""
    func = call.func
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call):
        built = dotted(func.value.func)
        if built is not None:
            return (*built.split("."), func.attr.value)
    return None


def drives_training_elsewhere(path: Path | str, source: str) -> bool:
    """See `_drives_training_elsewhere` (asked by the pre-filter and again by the rules: the
    answer for one text is kept)."""
    return _drives_training_elsewhere(str(os.path.abspath(path)), source, project_stamp(Path(path)))


@functools.lru_cache(maxsize=16)
def _drives_training_elsewhere(path: str, source: str, stamp: tuple[int, int]) -> bool:
    """The file trains through code that is not in its own text (a `train_one_epoch(...)` of
    another module, a `zero_grad()` step whose `backward()` is inside a loss scaler): the lint's
    pre-filter lets the training rules see it as if it called `backward()` itself. Cheap when
    the answer is no: the file is parsed only when it zeroes gradients or imports a module of
    the project whose text (or that of a module it imports) trains."""
    file = Path(path)
    if "zero_grad(" not in source and not any(
        text_trains(module, 2) for module in imported_paths(file, source)
    ):
        return False
    return any(True for _ in training_call_sites(_file_index(path, source)))


def training_call_sites(
    index: ModuleIndex, own_methods: bool = False
) -> Iterator[tuple[FunctionInfo, CallSite]]:
    """The calls of a module that run training in a function of the project (a constructor
    excepted): (the function making the call, the call). `own_methods`: also the calls of a
    class's own methods (a trainer module reached from a driver: `self._train_epoch()`, which
    a subclass may define)."""
    prog = program()
    heads, own = training_heads(index)
    for func in index.functions.values():
        for site in func.calls:
            # a call on its way to the project's training code, or of this file's own code
            # that zeroes gradients (its backward elsewhere: a loss scaler), or a method of
            # the class itself (a subclass's override may train: `self._train_epoch()`)
            if not site.callee or (
                site.callee[0] not in heads
                and site.callee[-1] not in own
                and not (own_methods and site.callee[0] == "self" and func.class_name)
                and not _hands_a_head(site, heads)
            ):
                continue
            summary = prog.call_summary(index, func, site.callee)
            if summary.trains and not summary.constructs:
                yield func, site


def _names_torch_class(module: ModuleIndex, base: Dotted, name: str) -> bool:
    """`base` of a class of `module` is torch's class `name` (`DataLoader`, `DataParallel`),
    also under an alias (meshed-memory-transformer's `from torch.utils.data import DataLoader as
    TorchDataLoader`)."""
    imported = module.imports.get(base[-1]) if len(base) == 1 else None
    return base[-1] == name or (imported is not None and imported[1] == name)


# ----- the file among the project's modules -----------------------------------------------------
def reached_text_uses_cuda(path: Path, text: str, depth: int = 2) -> bool:
    """The file, or a project module it imports (`depth` imports deep), runs on CUDA: a driver
    whose device is chosen in a config module (`cfg.MODEL.DEVICE = "cuda"`) or a trainer."""
    return reached_text_says(path, text, text_uses_cuda, depth)


def reached_text_says(path: Path, text: str, says: Callable[[str], bool], depth: int = 2) -> bool:
    """`says` holds for the file's text or that of a project module it imports (`depth`
    imports deep): a setting made by the setup code a driver calls."""
    seen = {path}
    frontier = [(path, text)]
    for _ in range(depth + 1):
        later = []
        for current, current_text in frontier:
            if says(current_text):
                return True
            for imported in imported_paths(current, current_text):
                if imported not in seen:
                    seen.add(imported)
                    later.append((imported, read_text(imported)))
        frontier = later
    return False


def used_by_cuda_training(path: Path, depth: int = 2) -> bool:
    """A project module that imports this one (or imports one that does, `depth` deep) trains
    on CUDA: an optimizer factory or a model module of a CUDA training program."""
    frontier = [path]
    seen = {path}
    for _ in range(depth):
        later = []
        for current in frontier:
            for importer in importers_of(current):
                if importer in seen:
                    continue
                seen.add(importer)
                text = read_text(importer)
                if reached_text_uses_cuda(importer, text) and (
                    ".backward(" in text or drives_training_elsewhere(importer, text)
                ):
                    return True
                later.append(importer)
        frontier = later
    return False


def training_heads(index: ModuleIndex) -> tuple[set[str], set[str]]:
    """(names that lead to the project's training code: imported from a module whose text
    trains, or bound to what such a name builds (`trainer = Trainer(...)`); the module's own
    functions and methods that call one of them or zero gradients, by name). Only calls
    through these can train elsewhere; the rest are never resolved."""
    heads = {
        name for name in (*index.imports, *index.module_aliases) if imports_training(index, name)
    }
    for module, level in index.star_imports:  # `from model import *`: what that module defines
        target = resolve_module(index.path, module, level)
        if target is None or not text_trains(Path(os.path.abspath(target)), 2):
            continue
        found = program().module(target)
        if found is not None:
            heads.update(n for n in (*found.functions, *found.classes) if n.isidentifier())
    for func in index.functions.values():  # `Exp = Exp_Main`: another name for it
        for name, values in func.assigns.items():  # `TRAINERS = {"a": TrainerA}`, `t[k]`
            if any(_names_a_head(v, heads) for v in values):
                heads.add(name)
    for func in index.functions.values():  # `trainer = Trainer(...)`: `trainer.fit()`
        for name, values in func.assigns.items():
            if any(v.kind == "call" and v.dotted[0] in heads for v in values):
                heads.add(name)
        for attr, values in func.self_attrs.items():
            if any(v.kind == "call" and v.dotted[0] in heads for v in values):
                heads.add(attr)
    own: set[str] = set()
    changed = True
    while changed:  # the file's functions that reach those names, to a fixed point
        changed = False
        for qualname, func in index.functions.items():
            leaf = qualname.rsplit(".", 1)[-1]
            if qualname == "<module>" or leaf in own:
                continue
            if (
                func.zero_grad
                or any(
                    (name := _named_callee(site.callee))
                    and (name[0] in heads or name[-1] in own or name[-1] in heads)
                    for site in func.calls
                )
                or any(_names_a_head(v, heads) for v in func.returns)  # `return Agent`
            ):
                own.add(leaf)
                changed = True
    for func in index.functions.values():  # `agent = make_agent(...)`: `agent.update()`
        for name, values in func.assigns.items():
            if any(
                v.kind == "call" and (callee := _named_callee(v.dotted)) and callee[-1] in own
                for v in values
            ):
                heads.add(name)
    return heads, own


def _named_callee(callee: tuple[str, ...]) -> tuple[str, ...]:
    """The name a call goes through: `pick(name)(args)` and `MODELS[k](args)` through `pick`
    and `MODELS` (see `index.callee_of`)."""
    return callee[:-1] if callee[-1:] in (("[]",), ("()",)) else callee


def _hands_a_head(site: CallSite, heads: set[str]) -> bool:
    """The call is handed what a head built (continual-learning's `train_standard.train(cnn,
    ...)` given `cnn = define.define_standard_classifier(...)`): the callee may train through
    the object's own methods."""
    handed = (*site.args, *(arg for _, arg in site.keywords))
    return any(arg is not None and len(arg) == 1 and arg[0] in heads for arg in handed)


def _names_a_head(value: Value, heads: set[str]) -> bool:
    """`value` is another name for one of `heads`: a reference, an entry of a table named so,
    a table holding one, or either arm of a conditional expression."""
    if value.kind in ("ref", "entry"):
        return bool(value.dotted[:1]) and value.dotted[0] in heads
    if value.kind == "choice":  # `Agent = SacdAgent if a else SharedSacdAgent`
        return any(_names_a_head(v, heads) for v in value.options)
    return value.kind == "table" and any(_names_a_head(v, heads) for v in value.options)


def _runs_at_top_level(statements: Sequence[cst.BaseStatement]) -> bool:
    """Running these module-level statements does something beyond defining names: a call or a
    loop (`main()`, `for epoch in ...`), also inside a top-level `if`/`with`/`try`."""
    for stmt in statements:
        if isinstance(stmt, cst.For | cst.While | cst.With):
            return True
        if isinstance(stmt, cst.SimpleStatementLine) and any(
            isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) for small in stmt.body
        ):
            return True
        if isinstance(stmt, cst.If | cst.Try) and _runs_at_top_level(stmt.body.body):  # type: ignore[arg-type]
            return True
    return False


def _shown_path(path: Path) -> str:
    """A module as a report names it: relative to the working folder where it is inside."""
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path.name


def _host_reading_candidate(target: Target, module: ModuleIndex) -> FunctionInfo | None:
    """The function `target` names in `module`, where its reads on the host would be a step's
    syncs: not a class, not a training step (its reads are its own findings), not a model's
    forward (what it reads, lengths to pack a sequence, is its computation, Raindrop's
    `lengths.cpu()`: no logging to thin out)."""
    if target.is_class or target.qualname.endswith(".forward"):
        return None
    func = module.functions.get(target.qualname)
    return None if func is None or func.backward else func
