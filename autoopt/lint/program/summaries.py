"""What each function of the user's project does with what it is given, computed bottom-up across
modules: the call graph and the per-function summaries of the program model.

A call is resolved (`Program.resolve`) to the functions, methods or classes it may run: a
function of the module or one it imports (re-exports followed), `module.f` through an imported
module, `self.m()` through the class and its bases in the project, `obj.m()` where `obj` was bound
to `Cls(...)` in the same function (or `self.obj` in any method), `Cls.m()`. Library calls
(torch, numpy, ...) resolve to nothing.

A `Summary` says whether running the function trains (it reaches `.backward()` or `zero_grad()`,
itself or through a call it makes) and what each parameter is to it:

    forward     it runs it (`p(x)`, `p.forward(x)`); "forward_no_grad" when only under
                torch.no_grad()
    methods     it calls other methods of it (`p.pi(s)`, `p.inference(z)`: a forward through
                another method when it is a module); "methods_no_grad" likewise
    module      it treats it as an nn.Module (sets its mode, reads its parameters)
    trained     it runs its forward (or a method of a module) in a function that trains
    loader      it iterates it; "loader_per_epoch" when it iterates it again and again (in a loop
                of its own, or because the caller calls it in a loop)
    optimizer   it steps it or zeroes its gradients
    batches_to_device   it moves the batches it iterates to a device
    copied_to_device    it copies it (or an element of it) to a device with a blocking
                        `.to()` / `.cuda()` (KAIR's `feed_data(data)`: `data["L"].to(self.device)`);
                        "copied_to_device_non_blocking" with `non_blocking=`
    dataset_mutated     it changes the loader's dataset in place (`loader.dataset.resample()`)

For a class, the summary is its construction's: a constructor parameter kept as `self.attr` has
the roles `self.attr` has in every method, and the class trains when a method does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from autoopt.lint.program.index import (
    NO_FORWARD_METHODS,
    CallSite,
    ClassInfo,
    Dotted,
    FunctionInfo,
    ModuleIndex,
    Value,
    load_index,
    may_name,
)
from autoopt.lint.program.library import MODEL_BASES
from autoopt.lint.program.project_files import (
    import_name,
    modules_importing,
    modules_named,
    project_stamp,
    resolve_module,
)
from autoopt.lint.program.project_text import (
    imports_training,
    is_registry_getter,
    registering_modules,
)

_MAX_DEPTH = 6  # re-export chains and base classes followed at most this deep
# a class whose module this many others import is a framework's, searched for no subclasses
_MAX_IMPORTERS = 24

# Direct uses (the index's) -> a parameter's roles (see the module's docs).
_ROLE_OF_USE = {
    "called": "forward",
    "called_no_grad": "forward_no_grad",
    "method_called": "methods",
    "method_called_no_grad": "methods_no_grad",
    "zero_grad": "optimizer",
    "train_mode": "module",
    "eval_mode": "module",
    "parameters": "module",
    "submodules": "module",
    "iterated": "loader",
    "iterated_in_loop": "loader_per_epoch",
    "batches_moved": "batches_to_device",
    "dataset_mutated": "dataset_mutated",
    "copied_blocking": "copied_to_device",
    "copied_non_blocking": "copied_to_device_non_blocking",
}


@dataclass(frozen=True)
class Target:
    """A function, method (`Class.method`) or class (its construction) of the project."""

    path: Path
    qualname: str
    is_class: bool = False


@dataclass
class Summary:
    """What running one target does (see the module's docs)."""

    params: tuple[str, ...] = ()
    trains: bool = False
    roles: dict[str, set[str]] = field(default_factory=dict)
    # a class's construction: `trains` says a method trains, not that constructing does
    constructs: bool = False
    # the roles of the module-level names it uses (`for x in trainloader` in `def train(epoch)`)
    global_roles: dict[str, set[str]] = field(default_factory=dict)
    # ... and of its own local names (what a caller does with a helper's return value)
    local_roles: dict[str, set[str]] = field(default_factory=dict)

    def roles_of(self, position: int | None = None, keyword: str | None = None) -> set[str]:
        """The roles of the parameter an argument binds: by position, else by keyword."""
        if keyword is not None and keyword in self.params:
            return self.roles.get(keyword, set())
        if position is not None and position < len(self.params):
            return self.roles.get(self.params[position], set())
        return set()


EMPTY = Summary()


def _roles_of_uses(uses: set[str]) -> set[str]:
    roles = {_ROLE_OF_USE[u] for u in uses if u in _ROLE_OF_USE}
    if "stepped" in uses and "iterated" not in uses:
        roles.add("optimizer")
    return roles


_MAX_REGISTERED_MODULES = 200  # the modules read for a registry's classes
_LOADER_ROLES = frozenset({"loader", "loader_per_epoch", "batches_to_device", "dataset_mutated"})
_UNDER_NO_GRAD = {"forward": "forward_no_grad", "methods": "methods_no_grad"}


def _import_targets(index: ModuleIndex, module: str, level: int) -> list[Path]:
    """The files `from <module> import ...` in `index` may mean: the one the folders resolve,
    then (an absolute import, run with a PYTHONPATH of its own: `from solver import Solver`,
    `import _init_paths`) every module of the project with that dotted name."""
    target = resolve_module(index.path, module, level)
    found = [target] if target is not None else []
    if not level:
        found += [p for p in modules_named(index.path, module) if p != target]
    return found


class Program:
    """The project's modules, resolved calls and summaries, cached for the process."""

    def __init__(self) -> None:
        self._summaries: dict[tuple[str, str, str], Summary] = {}
        self._computing: set[tuple[str, str, str]] = set()
        self._following: set[tuple[int, str]] = set()  # names being followed to their class
        # keyed by the project's stamp: a file added or edited is seen
        self._callers: dict[
            tuple[str, str, tuple[int, int]], list[tuple[ModuleIndex, FunctionInfo, Value]]
        ] = {}
        self._in_loop: dict[tuple[str, str, tuple[int, int]], bool] = {}
        # what `_returned_classes` and `_local_classes` found, by module content (a walk that
        # met a name already being followed keeps what it found without it)
        self._classes: dict[tuple[str, str, str], list[tuple[ModuleIndex, ClassInfo]]] = {}
        self._subclasses: dict[
            tuple[str, str, str, tuple[int, int]], list[tuple[ModuleIndex, ClassInfo]]
        ] = {}
        self._linted: ModuleIndex | None = None

    # ----- modules ------------------------------------------------------------------------------
    def module(self, path: Path | str) -> ModuleIndex | None:
        linted = self._linted
        if linted is not None and str(linted.path) == os.path.abspath(path):
            return linted
        return load_index(path)

    def linting(self, index: ModuleIndex) -> None:
        """`index` is the file being linted, as its text is now (a fix round's edit, stdin, a
        file not saved yet): calls into it resolve to this text, not to what is on disk."""
        self._linted = index

    def definition(
        self, index: ModuleIndex, name: str, depth: int = 0
    ) -> tuple[ModuleIndex, str] | None:
        """The module and name that define `name` as seen from `index` (imports and re-exports
        followed); None for a library's name or one not found."""
        if depth > _MAX_DEPTH:
            return None
        if name in index.functions or name in index.classes:
            return index, name
        if name in index.aliases and index.aliases[name] != name:
            return self.definition(index, index.aliases[name], depth + 1)
        if name in index.imports:
            module, original, level = index.imports[name]
            for candidate in _import_targets(index, module, level):
                found = self.module(candidate)
                hit = self.definition(found, original, depth + 1) if found is not None else None
                if hit is not None:
                    return hit
            return None
        for module, level in index.star_imports:
            target = resolve_module(index.path, module, level)
            found = self.module(target) if target is not None else None
            hit = self.definition(found, name, depth + 1) if found is not None else None
            if hit is not None:
                return hit
        return None

    def imported_module(self, index: ModuleIndex, name: str) -> ModuleIndex | None:
        """The project module a name of `index` is bound to (`import engine`,
        `import utils.misc as misc`, `from . import engine`)."""
        if name in index.module_aliases:
            module, level = index.module_aliases[name]
            target = resolve_module(index.path, module, level)
        elif name in index.imports:
            module, original, level = index.imports[name]
            target = resolve_module(
                index.path, f"{module}.{original}" if module else original, level
            )
        else:
            return None
        return self.module(target) if target is not None else None

    def _submodule(self, package: ModuleIndex, name: str) -> ModuleIndex | None:
        """The module `name` of the package whose `__init__.py` `package` is, which its
        `__init__` need not import: `import models.densenet` then `models.densenet.DenseNet(...)`
        (Audio-Classification)."""
        if Path(package.path).name != "__init__.py":
            return None
        target = resolve_module(package.path, name, 1)
        return self.module(target) if target is not None else None

    # ----- call resolution ----------------------------------------------------------------------
    def resolve(
        self, index: ModuleIndex, func: FunctionInfo | None, callee: Dotted
    ) -> list[Target]:
        """The targets a call of `callee` made in `func` of `index` may run (see the docs)."""
        if not callee:
            return []
        if callee[-1] in ("[]", "()"):  # `MODELS[args.model](cfg)`, `str2model(name)(args)`
            return self._chosen(index, func, callee[:-1], callee[-1])
        head, rest = callee[0], callee[1:]
        if not rest:
            return (
                self._named(index, head)
                or self._renamed(index, func, head)
                or self._called_instance(index, func, head)
            )
        if head == "super" and len(rest) == 1 and func is not None and func.class_name:
            owner = index.classes.get(func.class_name)  # `super().__init__(...)`
            return [
                t
                for base_index, base in (self._bases(index, owner) if owner else ())
                for t in self._method(base_index, base, rest[0])
            ][:1]
        if head in ("self", "cls") and func is not None and func.class_name:
            owner = index.classes.get(func.class_name)
            if owner is None:
                return []
            if len(rest) == 1:  # the method, or what a subclass puts in its place
                found = self._method(index, owner, rest[0])
                if found and all(self._is_abstract(t) for t in found):
                    found += self._overrides(index, owner, rest[0])
                return found
            # `self.trainer.fit()`: the class `self.trainer` was built from
            classes = self._attr_classes(index, owner, rest[0])
            return [t for cls_index, cls in classes for t in self._method(cls_index, cls, rest[1])]
        module = self.imported_module(index, head)
        if module is not None:  # `engine.train_one_epoch(...)`, `utils.misc.f(...)`
            for part in rest[:-1]:
                sub = self.imported_module(module, part) or self._submodule(module, part)
                if sub is None:
                    break
                module = sub
            return self._named(module, rest[-1])
        if len(rest) == 1:
            found = self.definition(index, head)
            if found is not None and found[1] in found[0].classes:  # `Trainer.run(...)`
                return self._method(found[0], found[0].classes[found[1]], rest[0])
            if func is not None:  # `trainer.fit()` with `trainer = Trainer(...)` above
                return [
                    t
                    for cls_index, cls in self._local_classes(index, func, head)
                    for t in self._method(cls_index, cls, rest[0])
                ]
        return []

    def _renamed(self, index: ModuleIndex, func: FunctionInfo | None, name: str) -> list[Target]:
        """`Exp = Exp_Main` in the function (or the module's code) before `Exp(args)`: what the
        other name is (PatchTST's run_longExp.py, inside its `__main__` block); also a class
        picked at run time: `cls = MODELS[args.model]`, `cls = str2model(args.model_name)`,
        `Agent = SacdAgent if not args.shared else SharedSacdAgent` (either)."""
        key = (id(index), f"renamed:{name}")
        if key in self._following:
            return []
        self._following.add(key)
        try:
            out = []
            for scope in _scopes(index, func):
                for value in scope.assigns.get(name, ()):
                    if value.kind == "ref" and value.dotted != (name,):
                        out += self.resolve(index, scope, value.dotted)
                    elif value.kind == "choice":  # `Agent = SacdAgent if a else Shared`
                        for option in value.options:
                            if option.kind == "ref" and option.dotted != (name,):
                                out += self.resolve(index, scope, option.dotted)
                    elif value.kind == "entry":
                        out += self._chosen(index, scope, value.dotted, "[]")
                    elif value.kind == "call" and self._names_a_function(index, value.dotted):
                        out += self._chosen(index, scope, value.dotted, "()")
            return out
        finally:
            self._following.discard(key)

    def _called_instance(
        self, index: ModuleIndex, func: FunctionInfo | None, name: str
    ) -> list[Target]:
        """`trainer(train_loader, epochs=...)` with `trainer = Trainer(...)` above: the
        `__call__` its project class defines (disentangling-vae's `Trainer`); a module's
        forward is not this (torch's `__call__` runs it)."""
        if func is None:
            return []
        return [
            target
            for scope in _scopes(index, func)
            if any(  # built by a class, as Python names them: `trainer = Trainer(...)`
                v.kind == "call" and v.dotted[-1][:1].isupper() for v in scope.assigns.get(name, ())
            )
            for cls_index, cls in self._local_classes(index, scope, name)
            for target in self._method(cls_index, cls, "__call__")
        ]

    def _names_a_function(self, index: ModuleIndex, callee: Dotted) -> bool:
        """`str2model` or `models.str2model`: a name that can only be a function (of this module
        or one it imports), not a method of an object whose class must be found first."""
        if len(callee) == 1:
            return callee[0] in index.functions or callee[0] in index.imports
        return len(callee) == 2 and self.imported_module(index, callee[0]) is not None

    def _chosen(
        self, index: ModuleIndex, func: FunctionInfo | None, base: Dotted, how: str
    ) -> list[Target]:
        """The project classes and functions a name picked at run time may be: the values of
        the table `base` (how "[]": `MODELS = {"unet": UNet, ...}` here or imported), or the
        classes and functions the function `base` returns by name (how "()": TabSurvey's
        `str2model`, `if model == "MLP": return MLP`). Instances are not followed: a factory
        returning `Net()` gives a model, not a class to call."""
        key = (id(index), f"chosen:{'.'.join(base)}{how}")
        if not base or key in self._following:
            return []
        self._following.add(key)
        try:
            if how == "()" and len(base) >= 2 and is_registry_getter(base[-2], base[-1]):
                registered = self._registered(index, base[-2], base[-1])
                if registered:  # `MODEL_REGISTRY.get(opt["model_type"])(opt)` (BasicSR)
                    return registered
            if how == "()":
                return [
                    found
                    for target in self.resolve(index, func, base)
                    if not target.is_class
                    for module, factory in [self._function(target)]
                    if factory is not None
                    for value in factory.returns
                    if value.kind == "ref"
                    for found in self._named_by(module, factory, value.dotted)
                ]
            out = []
            for module, scope, table in self._tables(index, func, base):
                for option in table.options:
                    if option.kind == "ref":
                        out += self._named_by(module, scope, option.dotted)
            return out
        finally:
            self._following.discard(key)

    def _registered(self, index: ModuleIndex, registry: str, getter: str) -> list[Target]:
        """The project classes registered with `registry` that `registry.<getter>(name)` may
        return: `@registry.register()` for `get`, `@registry.register_task(...)` for
        `get_task_class` (the kind named in the getter). The modules searched are those whose
        imports name the registry."""
        wanted = getter[len("get") :].strip("_").removesuffix("_class").removesuffix("class")
        found: list[Target] = []
        for path in registering_modules(index.path, registry)[:_MAX_REGISTERED_MODULES]:
            module = self.module(path)
            if module is None:
                continue
            for cls in module.classes.values():
                if any(r == registry and kind == wanted for r, kind in cls.registered):
                    found.append(Target(module.path, cls.name, is_class=True))
        return found

    def _function(self, target: Target) -> tuple[ModuleIndex | None, FunctionInfo | None]:
        module = self.module(target.path)
        return module, module.functions.get(target.qualname) if module is not None else None

    def _named_by(self, index: ModuleIndex, func: FunctionInfo, name: Dotted) -> list[Target]:
        """The project class or function `name` is, seen from `func` of `index` (a local import
        of the factory's branch included); a variable is not followed."""
        if len(name) == 1:
            return self._named(index, name[0])
        module = self.imported_module(index, name[0])
        return self._named(module, name[-1]) if module is not None and len(name) == 2 else []

    def _tables(
        self, index: ModuleIndex, func: FunctionInfo | None, name: Dotted, depth: int = 0
    ) -> Iterator[tuple[ModuleIndex, FunctionInfo, Value]]:
        """The dict literals `name` is bound to: in `func`, at module level, or in the module
        it is imported from (`from models import MODELS`, `models.MODELS`)."""
        if depth > _MAX_DEPTH:
            return
        if len(name) == 2:
            module = self.imported_module(index, name[0])
            if module is not None:
                yield from self._tables(module, None, name[1:], depth + 1)
            return
        if len(name) != 1:
            return
        found = False
        for scope in _scopes(index, func):
            for value in scope.assigns.get(name[0], ()):
                if value.kind == "table":
                    found = True
                    yield index, scope, value
            if found:
                return
        if name[0] in index.imports:
            module_name, original, level = index.imports[name[0]]
            # FairMOT's `from trains.train_factory import train_factory`, on a sys.path that
            # `import _init_paths` extends
            target = resolve_module(index.path, module_name, level)
            if target is None and not level:
                target = next(iter(modules_named(index.path, module_name)), None)
            if target is not None:
                module = self.module(target)
                if module is not None:
                    yield from self._tables(module, None, (original,), depth + 1)

    def _named(self, index: ModuleIndex, name: str) -> list[Target]:
        found = self.definition(index, name)
        if found is None:
            return []
        module, defined = found
        return [Target(module.path, defined, defined in module.classes)]

    def _method(
        self, index: ModuleIndex, cls: ClassInfo, name: str, depth: int = 0
    ) -> list[Target]:
        """`cls.name`, looked up through the project's base classes."""
        if name in cls.methods:
            return [Target(index.path, f"{cls.name}.{name}")]
        if depth > _MAX_DEPTH:
            return []
        for base_index, base in self._bases(index, cls):
            found = self._method(base_index, base, name, depth + 1)
            if found:
                return found
        return []

    def _is_abstract(self, target: Target) -> bool:
        _, func = self._function(target)
        return func is not None and func.abstract

    def _overrides(self, index: ModuleIndex, cls: ClassInfo, name: str) -> list[Target]:
        """The project's subclasses' own `name` methods: what `self.name()` in a method of
        `cls` runs when the instance is one of them and `cls` leaves it to them (`raise
        NotImplementedError`, `pass`: pytorch-template's `BaseTrainer.train` calling
        `self._train_epoch`, S3Rec's `Trainer.train` calling `self.iteration`)."""
        return [
            Target(sub_index.path, f"{sub.name}.{name}")
            for sub_index, sub in self.subclasses(index, cls)
            if name in sub.methods
        ]

    def subclasses(self, index: ModuleIndex, cls: ClassInfo) -> list[tuple[ModuleIndex, ClassInfo]]:
        """The project's classes derived from `cls` (through its bases): in its module and in
        the modules that import it."""
        key = (str(index.path), index.digest, cls.name, project_stamp(index.path))
        found = self._subclasses.get(key)
        if found is not None:
            return found
        self._subclasses[key] = []  # a class hierarchy that goes round finds nothing more
        if len(self._candidate_modules(Target(index.path, cls.name, True))) > _MAX_IMPORTERS:
            return []  # a base class much of a framework builds on (torch's own), not a trainer
        found = [
            (module, other)
            for module, _ in self._modules_that_may_call(Target(index.path, cls.name, True))
            for other in module.classes.values()
            if other is not cls
            and any(
                base.name == cls.name and base_index.path == index.path
                for base_index, base in self.all_bases(module, other)
            )
        ]
        self._subclasses[key] = found
        return found

    def _bases(self, index: ModuleIndex, cls: ClassInfo) -> Iterable[tuple[ModuleIndex, ClassInfo]]:
        for base in cls.bases:
            if len(base) == 1:
                found = self.definition(index, base[0])
            else:
                module = self.imported_module(index, base[0])
                found = self.definition(module, base[-1]) if module is not None else None
            if found is not None and found[1] in found[0].classes:
                yield found[0], found[0].classes[found[1]]

    def holds_dataset_on_device(
        self, index: ModuleIndex, func: FunctionInfo, name: str, depth: int = 0
    ) -> bool:
        """`name`, in `func`, is a dataset whose `__getitem__` moves samples to a device: bound
        there (or at module level) to such a class, or a parameter the callers hand one
        (`create_data_loader(usd, 128)` with `usd = UrbanSoundDataset(..., device)`)."""
        values = func.assigns.get(name) or index.module_code.assigns.get(name, [])
        for value in values:
            for cls_index, cls in self.classes_of(index, func, value):
                if self.getitem_on_device(cls_index, cls):
                    return True
        if name in func.params and depth < 2 and func.qualname != "<module>":
            position = func.params.index(name)
            for caller_index, caller, value in self.callers(Target(index.path, func.qualname)):
                call = value.options[0] if value.kind == "item" else value
                handed = call.args[position] if position < len(call.args) else None
                if (
                    handed is not None
                    and len(handed) == 1
                    and self.holds_dataset_on_device(caller_index, caller, handed[0], depth + 1)
                ):
                    return True
        return False

    def getitem_on_device(self, index: ModuleIndex, cls: ClassInfo) -> bool:
        """The class's `__getitem__` (through its bases) moves what it returns to a device,
        itself or in a method of the class it calls (`self._resample(signal)`)."""
        for target in self._method(index, cls, "__getitem__"):
            module = self.module(target.path)
            func = module.functions.get(target.qualname) if module else None
            if func is None:
                continue
            if func.to_device:
                return True
            for site in func.calls:
                if site.callee[:1] == ("self",) and len(site.callee) == 2:
                    for helper in self._method(index, cls, site.callee[1]):
                        helper_module = self.module(helper.path)
                        found = (
                            helper_module.functions.get(helper.qualname) if helper_module else None
                        )
                        if found is not None and found.to_device:
                            return True
        return False

    def is_module_class(self, index: ModuleIndex, cls: ClassInfo) -> bool:
        """`cls` derives from `nn.Module` (or a model base class of a library), through the
        project's own classes."""
        if any(base[-1] in MODEL_BASES for base in cls.bases):
            return True
        return any(
            base[-1] in MODEL_BASES for _, c in self.all_bases(index, cls) for base in c.bases
        )

    def classes_of(
        self, index: ModuleIndex, func: FunctionInfo | None, value: Value
    ) -> list[tuple[ModuleIndex, ClassInfo]]:
        """The project classes `value` constructs (`Trainer(...)`, `mod.Solver(...)`)."""
        if value.kind == "choice":
            return [c for option in value.options for c in self.classes_of(index, func, option)]
        if value.kind == "item" and value.options and value.options[0].kind == "call":
            # `model, diffusion = create_model_and_diffusion(...)`: the factory's element
            return [
                c
                for target in self.resolve(index, func, value.options[0].dotted)
                if not target.is_class
                for module in [self.module(target.path)]
                if module is not None
                for c in self._returned_classes(module, target.qualname, value.index)
            ]
        if value.kind != "call":
            return []
        out = []
        for target in self.resolve(index, func, value.dotted):
            module = self.module(target.path)
            if module is None:
                continue
            if target.is_class:
                if target.qualname in module.classes:
                    out.append((module, module.classes[target.qualname]))
            else:  # `agent = make_agent(...)`: the classes the factory returns
                out.extend(self._returned_classes(module, target.qualname))
        return out

    def _returned_classes(
        self, index: ModuleIndex, qualname: str, position: int | None = None
    ) -> list[tuple[ModuleIndex, ClassInfo]]:
        """The project classes a function returns instances of (`return CurlSacAgent(...)`,
        or a name bound to one: `model = Net(); return model`), one factory deep; with
        `position`, of that element of the tuple it returns (`return model, diffusion`)."""
        func = index.functions.get(qualname)
        key = (id(index), f"returns:{qualname}:{position}")
        done = (str(index.path), index.digest, f"returns:{qualname}:{position}")
        if done in self._classes:
            return self._classes[done]
        if func is None or key in self._following:
            return []
        self._following.add(key)
        try:
            out: list[tuple[ModuleIndex, ClassInfo]] = []
            for value in func.returns:
                if position is not None:
                    if value.kind != "tuple" or position >= len(value.options):
                        continue
                    value = value.options[position]
                if value.kind == "ref" and len(value.dotted) == 1:
                    for bound in func.assigns.get(value.dotted[0], ()):
                        out.extend(self.classes_of(index, func, bound))
                else:
                    out.extend(self.classes_of(index, func, value))
            self._classes[done] = out
            return out
        finally:
            self._following.discard(key)

    def _local_classes(
        self, index: ModuleIndex, func: FunctionInfo, name: str
    ) -> list[tuple[ModuleIndex, ClassInfo]]:
        key = (id(func), name)
        done = (str(index.path), index.digest, f"{func.qualname}:{name}")
        if done in self._classes:
            return self._classes[done]
        if key in self._following:  # `x = x.build()`: no class to find by going round
            return []
        self._following.add(key)
        try:
            found = [c for v in func.assigns.get(name, ()) for c in self.classes_of(index, func, v)]
            if not found and name in func.params and func.class_name is None:
                found = self._passed_classes(index, func, name)
            self._classes[done] = found
            return found
        finally:
            self._following.discard(key)

    def _passed_classes(
        self, index: ModuleIndex, func: FunctionInfo, param: str
    ) -> list[tuple[ModuleIndex, ClassInfo]]:
        """The classes of what the project's calls of `func` pass for its parameter `param`
        (DrQA's `train(args, data_loader, model, stats)` given `model = DocReader(...)`; also
        from another module: continual-learning's `train_standard.train(cnn, ...)` given `cnn =
        define.define_standard_classifier(...)`, a factory returning its `Classifier`)."""
        position = func.params.index(param)
        found = []
        target = Target(Path(os.path.abspath(index.path)), func.qualname)
        for caller_index, names in self._modules_that_may_call(target):
            for caller in caller_index.functions.values():
                for site in caller.calls:
                    own = caller_index is index and site.callee == (func.qualname,)
                    if not own and not (
                        site.callee
                        and site.callee[-1] in names
                        and target in self.resolve(caller_index, caller, site.callee)
                    ):
                        continue
                    keywords = dict(site.keywords)
                    passed = (
                        site.args[position] if position < len(site.args) else keywords.get(param)
                    )
                    if passed is not None and len(passed) == 1:
                        found += self._local_classes(caller_index, caller, passed[0])
        return found

    def _attr_classes(
        self, index: ModuleIndex, cls: ClassInfo, attr: str
    ) -> list[tuple[ModuleIndex, ClassInfo]]:
        key = (id(cls), attr)
        if key in self._following:
            return []
        self._following.add(key)
        try:
            return [
                c
                for method in cls.methods.values()
                for v in method.self_attrs.get(attr, ())
                for c in self.classes_of(index, method, v)
            ]
        finally:
            self._following.discard(key)

    # ----- summaries --------------------------------------------------------------------------
    def summary(self, target: Target) -> Summary:
        """The summary of a target (computed once; a recursive call sees an empty summary)."""
        index = self.module(target.path)
        if index is None:
            return EMPTY
        key = (str(target.path), index.digest, target.qualname)
        found = self._summaries.get(key)
        if found is not None:
            return found
        if key in self._computing:
            return EMPTY
        self._computing.add(key)
        try:
            if target.is_class:
                cls = index.classes.get(target.qualname)
                result = self._class_summary(index, cls) if cls is not None else EMPTY
            else:
                func = index.functions.get(target.qualname)
                result = self._function_summary(index, func) if func is not None else EMPTY
        finally:
            self._computing.discard(key)
        self._summaries[key] = result
        return result

    def call_summary(
        self, index: ModuleIndex, func: FunctionInfo | None, callee: Dotted
    ) -> Summary:
        """What a call of `callee` in `func` does: its targets' summaries merged (a call that
        may run several functions trains if one does, and takes the union of their roles)."""
        targets = self.resolve(index, func, callee)
        if not targets:
            return EMPTY
        if len(targets) == 1:
            return self.summary(targets[0])
        first = self.summary(targets[0])
        merged = Summary(first.params, constructs=first.constructs)
        for target in targets:
            found = self.summary(target)
            merged.trains |= found.trains
            for param, roles in found.roles.items():
                merged.roles.setdefault(param, set()).update(roles)
        return merged

    # ----- callers ----------------------------------------------------------------------------
    def callers(self, target: Target) -> list[tuple[ModuleIndex, FunctionInfo, Value]]:
        """Where the project calls `target`, as (module, function, the call's value) for each
        call whose result is bound to a name (`train_loader, val_loader = get_loader(args)`)."""
        key = (str(target.path), target.qualname, project_stamp(target.path))
        found = self._callers.get(key)
        if found is not None:
            return found
        found = []
        for index, names in self._modules_that_may_call(target):
            for func in index.functions.values():
                for values in (*func.assigns.values(), *func.self_attrs.values(), func.returns):
                    for value in values:
                        call = value.options[0] if value.kind == "item" else value
                        if (
                            call.kind == "call"
                            and call.dotted[-1] in names
                            and target in self.resolve(index, func, call.dotted)
                        ):
                            found.append((index, func, value))
        self._callers[key] = found
        return found

    def called_in_a_loop(self, target: Target) -> bool:
        """Some function of the project calls `target` inside a for/while loop of its own (a
        step function that another module's loop runs once per batch)."""
        key = (str(target.path), target.qualname, project_stamp(target.path))
        if key not in self._in_loop:
            self._in_loop[key] = any(
                site.in_loop
                and site.callee
                and site.callee[-1] in names
                and target in self.resolve(index, func, site.callee)
                for index, names in self._modules_that_may_call(target)
                for func in index.functions.values()
                for site in func.calls
            ) or self._returned_step_called_in_a_loop(target)
        return self._in_loop[key]

    def _returned_step_called_in_a_loop(self, target: Target) -> bool:
        """`target` returns a function it defines (score_sde's `get_step_fn(...)` returning
        its nested `step_fn`), and a caller binds it and calls it inside a loop
        (`train_step_fn = losses.get_step_fn(...)`, then `train_step_fn(state, batch)` per
        batch): the nested step runs once per batch."""
        index = self.module(target.path)
        func = index.functions.get(target.qualname) if index is not None else None
        if func is None or not any(
            v.kind == "ref" and len(v.dotted) == 1 and v.dotted[0] not in func.assigns
            for v in func.returns
        ):
            return False
        for _, caller, value in self.callers(target):
            bound = [n for n, values in caller.assigns.items() if any(v is value for v in values)]
            if any(
                site.in_loop and len(site.callee) == 1 and site.callee[0] in bound
                for site in caller.calls
            ):
                return True
        return False

    def _candidate_modules(self, target: Target) -> list[Path]:
        """The module of `target` and those whose imports name it or its module."""
        leaf = target.qualname.rsplit(".", 1)[-1]
        stem = import_name(target.path)
        importers = modules_importing(target.path, stem)
        candidates = {
            Path(os.path.abspath(target.path)),
            *importers,
            *modules_importing(target.path, leaf),
        }
        for importer in importers:  # a package re-exporting it (`import trainlib`, pixel-nerf)
            if (
                importer.name == "__init__.py"
                and "." not in target.qualname
                # `from .trainer import Trainer`; exact: the count decides `subclasses`' cut-off
                and may_name(importer, leaf, exact=True)
            ):
                candidates.update(modules_importing(importer, importer.parent.name))
        if "." in target.qualname:
            # a method of an object a factory of another module builds (KAIR's
            # `model = define_Model(opt)` in select_model.py, then `model.optimize_parameters()`
            # in main_train_psnr.py): the modules importing the factory's module call it too
            for importer in importers:
                candidates.update(modules_importing(importer, import_name(importer)))
            # a base class's method calls the subclass's override (pixel-nerf's
            # `trainlib.Trainer.start` runs `self.train_step(...)` per batch)
            index = self.module(target.path)
            cls = index.classes.get(target.qualname.split(".")[0]) if index is not None else None
            for registry, _ in cls.registered if cls is not None else ():
                # a class a registry builds (BasicSR's `MODEL_REGISTRY.get(...)(opt)` in
                # models/__init__.py): the modules using the registry, and their importers
                for user in modules_importing(target.path, registry):
                    candidates.add(user)
                    candidates.update(modules_importing(user, import_name(user)))
            if cls is not None:
                candidates.update(
                    Path(os.path.abspath(base.path)) for base, _ in self.all_bases(index, cls)
                )
        return sorted(candidates)

    def _modules_that_may_call(self, target: Target) -> Iterator[tuple[ModuleIndex, set[str]]]:
        """The module of `target` and the modules whose imports name it or its module (no other
        module can call it), each with the names `target` is called by there (its own, or an
        alias it is imported under)."""
        leaf = target.qualname.rsplit(".", 1)[-1]
        for path in self._candidate_modules(target):
            # a module whose text never names `leaf` neither imports it nor calls it
            index = self.module(path) if may_name(path, leaf) else None
            if index is not None:
                yield (
                    index,
                    {leaf}
                    | {
                        alias
                        for alias, (_, original, _) in index.imports.items()
                        if original == leaf
                    },
                )

    def returned_roles(self, target: Target, position: int | None, depth: int = 0) -> set[str]:
        """The roles the project's callers give what `target` returns (element `position` of
        a returned tuple, or the whole value when None): `get_loader(args)`'s loader iterated
        epoch after epoch by the script that called it. A caller that returns the call's value
        as it is (a package's `build_loader` wrapper) passes the question on to its callers."""
        roles: set[str] = set()
        if depth > _MAX_DEPTH:
            return roles
        for index, func, value in self.callers(target):
            if any(v is value for v in func.returns):
                caller = Target(index.path, func.qualname)
                if caller != target:
                    roles |= self.returned_roles(caller, position, depth + 1)
                continue
            if (value.kind == "item") != (position is not None):
                continue
            if value.kind == "item" and value.index != position:
                continue
            summary = self.summary(Target(index.path, func.qualname))
            caller = Target(index.path, func.qualname)
            for name, values in func.assigns.items():
                if any(v is value for v in values):
                    roles |= summary.local_roles.get(name, set())
                    # bound, then returned as it is (PatchTST's `_get_data`: `data_set,
                    # data_loader = data_provider(...)`, `return data_set, data_loader`)
                    for returned_at in returned_positions(func, name):
                        if caller != target:
                            roles |= self.returned_roles(caller, returned_at, depth + 1)
            owner = index.classes.get(func.class_name) if func.class_name else None
            for attr, values in func.self_attrs.items() if owner is not None else ():
                if any(v is value for v in values):
                    # `self.train_loader = get_loader_segment(...)` (Anomaly-Transformer): what
                    # the class's methods do with `self.train_loader`
                    for method in owner.methods.values():
                        held = self.summary(Target(index.path, method.qualname)).roles
                        roles |= held.get(f"self.{attr}", set())
        return roles

    def _function_summary(self, index: ModuleIndex, func: FunctionInfo) -> Summary:
        summary = Summary(func.params, trains=func.backward or func.zero_grad)
        # roles by dotted name first (params and self attributes), parameters kept at the end
        by_name: dict[Dotted, set[str]] = {
            name: _roles_of_uses(uses) for name, uses in func.uses.items()
        }
        for site in func.calls:
            for arg in _lightning_loaders(index, func, site):
                # `trainer.fit(module, data_module)`: Lightning iterates its loaders per epoch
                by_name.setdefault(arg, set()).update({"loader", "loader_per_epoch"})
            if not _worth_resolving(index, func, site):
                continue
            callee = self.call_summary(index, func, site.callee)
            if callee is EMPTY:
                continue
            if not callee.constructs:
                summary.trains |= callee.trains
            for name, roles in self._globals_read(index, func, site, callee).items():
                by_name.setdefault((name,), set()).update(roles)
            for position, keyword, arg in _bound_args(site):
                if arg is None:
                    continue
                roles = set(callee.roles_of(position, keyword))
                if not roles:
                    continue
                if site.no_grad:  # the callee's forwards run under the caller's no_grad
                    roles = {_UNDER_NO_GRAD.get(r, r) for r in roles} - {"trained"}
                if site.in_loop and "loader" in roles:
                    roles.add("loader_per_epoch")
                by_name.setdefault(arg, set()).update(roles)
        for batch, loader in func.batches.items():
            # a batch a helper copies to a device (`inference(net, data_label)` doing
            # `img.cuda()`): the loader's batches go to the device
            if by_name.get((batch,), set()) & {"copied_to_device", "copied_to_device_non_blocking"}:
                by_name.setdefault(loader, set()).add("batches_to_device")
        for name, values in func.assigns.items():
            # `data_loader = self.vcc_loader`, then `iter(data_loader)` (autovc's Solver): what
            # is done with the local name as a loader is done with what it holds; also with an
            # entry of a container (`loader = loaders["train"]`)
            held = by_name.get((name,), set()) & _LOADER_ROLES
            if held and values and all(v.kind in ("ref", "entry") for v in values):
                for v in values:
                    if v.dotted != (name,):
                        by_name.setdefault(v.dotted, set()).update(held)
        for name, roles in list(by_name.items()):
            # an entry handed on (`train(epoch, dataloaders["train"])`): the container holds
            # loaders (egnn's `retrieve_dataloaders` returns a dict of them)
            if len(name) >= 2 and name[-1] == "[]" and roles & _LOADER_ROLES:
                by_name.setdefault(name[:-1], set()).update(roles & _LOADER_ROLES)
        for roles in by_name.values():
            # a forward under autograd in a function that trains: `model(x)`, or a method of
            # an object used as a module (`policy.act(s)` with `policy.parameters()` read)
            if summary.trains and (
                "forward" in roles or ("methods" in roles and "module" in roles)
            ):
                roles.add("trained")
        for param in func.params:
            if (param,) in by_name:
                summary.roles[param] = by_name[(param,)]
        summary.local_roles = {
            name[0]: roles for name, roles in by_name.items() if len(name) == 1 and roles
        }
        if func.qualname != "<module>":
            local = set(func.params) | set(func.assigns)
            summary.global_roles = {
                name[0]: roles
                for name, roles in by_name.items()
                if len(name) == 1 and roles and name[0] not in local and name[0] != "self"
            }
        if func.class_name:  # a method: its self attributes' roles go to the class
            attrs = {
                name[1]: roles
                for name, roles in by_name.items()
                if len(name) == 2 and name[0] == "self" and name[1] != "[]"
            }
            if attrs:
                summary.roles.update({f"self.{a}": r for a, r in attrs.items()})
        return summary

    def _globals_read(
        self, index: ModuleIndex, func: FunctionInfo, site: CallSite, callee: Summary
    ) -> dict[str, set[str]]:
        """The loader roles a function of this module, called by name here, gives the
        module's globals it reads (e3_diffusion's `main()` hands the global `dataloaders`
        entry by entry to its training): they are the caller's names too, where the caller
        does not bind a name of its own."""
        if not callee.global_roles or len(site.callee) != 1:
            return {}
        if not any(t.path == index.path for t in self.resolve(index, func, site.callee)):
            return {}  # another module's function reads that module's globals
        own = set() if func.qualname == "<module>" else {*func.params, *func.assigns}
        found: dict[str, set[str]] = {}
        for name, roles in callee.global_roles.items():
            held = roles & _LOADER_ROLES
            if held and name not in own:
                if site.in_loop and "loader" in held:
                    held.add("loader_per_epoch")
                found[name] = held
        return found

    def _class_summary(self, index: ModuleIndex, cls: ClassInfo) -> Summary:
        """A construction: the constructor's parameters with the roles of the attributes they
        are kept in (across every method), and whether any method trains."""
        init = self._method(index, cls, "__init__")
        init_info = None
        params: tuple[str, ...] = ()
        if init:
            init_index = self.module(init[0].path)
            init_info = init_index.functions.get(init[0].qualname) if init_index else None
            params = init_info.params if init_info is not None else ()
        summary = Summary(params, constructs=True)
        attr_roles: dict[str, set[str]] = {}
        for method_index, owner in [(index, cls), *self.all_bases(index, cls)]:
            for method in owner.methods.values():
                found = self.summary(Target(method_index.path, method.qualname))
                summary.trains |= found.trains
                for name, roles in found.roles.items():
                    if name.startswith("self."):
                        attr_roles.setdefault(name[5:], set()).update(roles)
        if init_info is not None:
            init_summary = self.summary(init[0])
            kept = self._kept_in(init_index, init_info)
            for param in params:
                roles = set(init_summary.roles.get(param, set()))
                for attr in kept.get(param, ()):
                    roles |= attr_roles.get(attr, set())
                if roles:
                    summary.roles[param] = roles
        return summary

    def _kept_in(
        self, index: ModuleIndex, init: FunctionInfo, depth: int = 0
    ) -> dict[str, set[str]]:
        """The attributes a constructor keeps each parameter in: `self.loader = loader`, also
        through `super().__init__(model, loader, ...)` to the base's constructor (S3Rec's
        `FinetuneTrainer`, whose `Trainer.__init__` keeps the loader)."""
        kept: dict[str, set[str]] = {}
        for attr, values in init.self_attrs.items():
            for v in values:
                if v.kind == "ref" and len(v.dotted) == 1 and v.dotted[0] in init.params:
                    kept.setdefault(v.dotted[0], set()).add(attr)
        if depth > _MAX_DEPTH:
            return kept
        for site in init.calls:
            if site.callee != ("super", "__init__"):
                continue
            for target in self.resolve(index, init, site.callee):
                base_index, base_init = self._function(target)
                if base_init is None or base_index is None:
                    continue
                inner = self._kept_in(base_index, base_init, depth + 1)
                for position, keyword, arg in _bound_args(site):
                    if arg is None or len(arg) != 1 or arg[0] not in init.params:
                        continue
                    if keyword is not None:
                        base_param = keyword
                    elif position is not None and position < len(base_init.params):
                        base_param = base_init.params[position]
                    else:
                        continue
                    kept.setdefault(arg[0], set()).update(inner.get(base_param, ()))
        return kept

    def all_bases(
        self, index: ModuleIndex, cls: ClassInfo, depth: int = 0
    ) -> list[tuple[ModuleIndex, ClassInfo]]:
        """The project's base classes of `cls`, nearest first (with the module of each)."""
        if depth > _MAX_DEPTH:
            return []
        out = []
        for base_index, base in self._bases(index, cls):
            out.append((base_index, base))
            out.extend(self.all_bases(base_index, base, depth + 1))
        return out


def _scopes(index: ModuleIndex, func: FunctionInfo | None) -> list[FunctionInfo]:
    """Where a name used in `func` may be bound: the function, then the module's own code."""
    if func is None or func is index.module_code:
        return [index.module_code]
    return [func, index.module_code]


# Where `Trainer.fit` takes what holds the training loaders (a LightningDataModule, the
# loaders themselves): its second argument or these keywords.
_FIT_LOADER_KEYWORDS = ("datamodule", "train_dataloaders", "train_dataloader")


def _lightning_loaders(index: ModuleIndex, func: FunctionInfo, site: CallSite) -> list[Dotted]:
    """What a Lightning `trainer.fit(model, dm)` hands over as its loaders (`dm`, or the
    `datamodule=` / `train_dataloaders=` keyword), where `trainer` is bound in the function
    (or the module) to a `Trainer(...)` of a module that imports Lightning (AdaFace's
    `pl.Trainer(...)` then `trainer.fit(trainer_mod, data_mod)`)."""
    if len(site.callee) != 2 or site.callee[1] != "fit":
        return []
    if not any(m.split(".")[0] in ("lightning", "pytorch_lightning") for m in _imported(index)):
        return []
    holder = site.callee[0]
    bound = func.assigns.get(holder) or index.module_code.assigns.get(holder, [])
    if not any(v.kind == "call" and v.dotted and v.dotted[-1] == "Trainer" for v in bound):
        return []
    found = [a for k, a in site.keywords if k in _FIT_LOADER_KEYWORDS and a is not None]
    if len(site.args) > 1 and site.args[1] is not None:
        found.append(site.args[1])
    return found


def _imported(index: ModuleIndex) -> set[str]:
    """The modules `index` imports from, by name (`import pytorch_lightning as pl`)."""
    return {module for module, _, _ in index.imports.values()} | {
        module for module, _ in index.module_aliases.values()
    }


def _worth_resolving(index: ModuleIndex, func: FunctionInfo, site: CallSite) -> bool:
    """A call can change the summary: it runs this module's code (`self.step()`, a local
    helper, an instance built here), it is handed what the function was handed (roles flow
    back), or it calls into a module of the project whose text trains. Any other call (a
    library's, a project helper that never trains and is handed nothing of ours) is not
    resolved: its module is never parsed for this."""
    if not site.callee:
        return False
    if site.callee[-1] in ("[]", "()"):  # a class picked at run time: `MODELS[name](...)`
        return True
    head = site.callee[0]
    if head in ("self", "cls") or head in index.functions or head in index.classes:
        return True
    if head in func.assigns or head in index.aliases:
        return True
    ours = set(func.params) | {"self"}
    args = (*site.args, *(a for _, a in site.keywords))
    if any(a is not None and a[0] in ours for a in args):
        return True
    if (
        len(site.callee) == 2
        and head in func.params
        and func.class_name is None
        and site.callee[1] not in NO_FORWARD_METHODS
    ):
        # a method of an object the callers hand in (continual-learning's `train(model, ...)`
        # calling `model.train_a_batch(x, y)`): its class is what the callers pass
        return True
    return (head in index.imports or head in index.module_aliases) and imports_training(index, head)


def _bound_args(site) -> Iterable[tuple[int | None, str | None, Dotted | None]]:
    for position, arg in enumerate(site.args):
        yield position, None, arg
    for keyword, arg in site.keywords:
        yield None, keyword, arg


_PROGRAM: Program | None = None


def program() -> Program:
    """The process's program model (summaries are keyed by content hash: a module edited while
    the process runs is summarised again)."""
    global _PROGRAM
    if _PROGRAM is None:
        _PROGRAM = Program()
    return _PROGRAM


def returned_positions(func: FunctionInfo, name: str) -> list[int | None]:
    """Where `func` returns local `name` as it is: None for `return name`, i for element i
    of a returned tuple."""
    found: list[int | None] = []
    for value in func.returns:
        if value.kind == "ref" and value.dotted == (name,):
            found.append(None)
        elif value.kind == "tuple":
            found += [
                i for i, v in enumerate(value.options) if v.kind == "ref" and v.dotted == (name,)
            ]
    return found
