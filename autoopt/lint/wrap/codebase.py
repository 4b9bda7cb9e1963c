"""The code `--wrap` reads: the script and the local modules it imports, parsed, never imported.

A `CodeBase` indexes each file's functions, classes and imports, resolves a call to the function
it runs (a function of the file, a method through `self.` or a local instance, a function
imported from a module beside the script), finds every caller of a function and maps a call's
arguments to the callee's parameters. That is what lets the analysis follow an optimizer from
the helper that steps it back to the function that creates it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from autoopt.lint.program.project_files import project_modules, root_of
from autoopt.lint.program.project_text import (
    is_registry_getter,
    read_text,
    registering_modules,
)
from autoopt.lint.tree.nodes import code_of

Scope = cst.FunctionDef | cst.Module
_PACKING = (cst.Tuple, cst.List, cst.Element, cst.StarredElement)
# How far up from the script's folder a package import (`from mingpt.trainer import Trainer`)
# may be found.
_PARENT_LEVELS = 2


@dataclass(eq=False)
class SourceFile:
    """One parsed file: its tree, a parent map, imports, top-level functions and classes."""

    path: Path | None
    module: cst.Module
    parents: dict[int, cst.CSTNode] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted name
    # names bound by several imports, each dotted name in source order (KAIR's
    # `from models.model_plain import ModelPlain as M` in one branch, `... as M` in others)
    import_choices: dict[str, list[str]] = field(default_factory=dict)
    star_imports: list[str] = field(default_factory=list)  # `from model import *`: modules
    functions: dict[str, cst.FunctionDef] = field(default_factory=dict)
    classes: dict[str, cst.ClassDef] = field(default_factory=dict)
    order: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)  # order of a node's last descendant
    nodes: list[cst.CSTNode] = field(default_factory=list)  # every node, in source order
    _bodies: dict[int, list[cst.CSTNode]] = field(default_factory=dict)
    _bindings: dict[int, dict[str, list[cst.CSTNode]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # One visitor pass: libcst rebuilds `.children` on every access, far too slow to walk.
        self.module.visit(_Indexer(self))
        for node in self.nodes:
            if isinstance(node, cst.Import):
                for alias in node.names:
                    dotted = code_of(alias.name)
                    if alias.asname is not None:
                        self.imports[code_of(alias.asname.name)] = dotted
                    else:
                        self.imports[dotted.split(".")[0]] = dotted.split(".")[0]
            elif isinstance(node, cst.ImportFrom) and isinstance(node.names, cst.ImportStar):
                base = "." * len(node.relative) + (code_of(node.module) if node.module else "")
                self.star_imports.append(base)
            elif isinstance(node, cst.ImportFrom):
                base = "." * len(node.relative) + (code_of(node.module) if node.module else "")
                for alias in node.names:
                    name = code_of(alias.name)
                    local = code_of(alias.asname.name) if alias.asname else name
                    self.imports[local] = f"{base}.{name}" if base.rstrip(".") else base + name
                    choices = self.import_choices.setdefault(local, [])
                    if self.imports[local] not in choices:
                        choices.append(self.imports[local])
        for stmt in self.module.body:
            if isinstance(stmt, cst.FunctionDef):
                self.functions[stmt.name.value] = stmt
            elif isinstance(stmt, cst.ClassDef):
                self.classes[stmt.name.value] = stmt

    def qualname(self, expr: cst.BaseExpression) -> str:
        """`expr`'s dotted name with its head resolved through the imports (`nn.Linear` ->
        `torch.nn.Linear`); the plain code when the head is not imported."""
        text = code_of(expr)
        head, _, rest = text.partition(".")
        if head in self.imports:
            return self.imports[head] + ("." + rest if rest else "")
        return text

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(id(node))

    @functools.cached_property
    def aliases(self) -> dict[str, list[str]]:
        """Names bound only to other plain names (`Exp = Exp_Main`, PatchTST's driver; `Exp =
        Exp_A` or `Exp = Exp_B` by a flag, iTransformer's): what they stand for, in order."""
        found: dict[str, dict[str, None]] = {}
        for node in self.nodes:
            if isinstance(node, cst.Assign):
                value = node.value.value if isinstance(node.value, cst.Name) else ""
                for target in node.targets:
                    if isinstance(target.target, cst.Name):
                        found.setdefault(target.target.value, {})[value] = None
        return {
            name: list(values)
            for name, values in found.items()
            if "" not in values and name not in values
        }

    @functools.cached_property
    def renamed(self) -> dict[str, str]:
        """Names bound only to one other plain name (`Exp = Exp_Main`): what they stand for."""
        return {name: values[0] for name, values in self.aliases.items() if len(values) == 1}

    @functools.cached_property
    def bound_names(self) -> frozenset[str]:
        """Every plain name the file binds anywhere (assignment, loop or `with` target,
        parameter, definition, import): a name outside it comes from elsewhere (`import *`)."""
        names = set(self.imports)
        names |= {n.value for n in self.nodes if isinstance(n, cst.Name) and self.binds(n)}
        return frozenset(names)

    def reads(self, name: cst.Name) -> bool:
        """`name` is read as a variable here (not bound, not an attribute or keyword name)."""
        holder = self.parent(name)
        if isinstance(holder, cst.Attribute) and holder.attr is name:
            return False
        if isinstance(holder, cst.Arg) and holder.keyword is name:
            return False
        return not self.binds(name)

    def binds(self, name: cst.Name) -> bool:
        """`name` is bound here (a target, parameter or definition), not read."""
        child, holder = name, self.parent(name)
        while isinstance(holder, _PACKING):  # `a, (b, c) = ...`
            child, holder = holder, self.parent(holder)
        if isinstance(holder, cst.AssignTarget | cst.AsName | cst.Param):
            return True
        if isinstance(holder, cst.For | cst.CompFor | cst.AnnAssign | cst.AugAssign):
            return holder.target is child
        if isinstance(holder, cst.NamedExpr):
            return holder.target is child
        if isinstance(holder, cst.FunctionDef | cst.ClassDef):
            return holder.name is child
        return False

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        cur = self.parent(node)
        while cur is not None:
            yield cur
            cur = self.parent(cur)

    def scope_of(self, node: cst.CSTNode) -> Scope:
        for anc in self.ancestors(node):
            if isinstance(anc, cst.FunctionDef):
                return anc
        return self.module

    def class_of(self, func: Scope) -> cst.ClassDef | None:
        """The class `func` is a method of (None for a plain function or the module)."""
        if isinstance(func, cst.Module):
            return None
        parent = self.parent(func)
        grand = self.parent(parent) if parent is not None else None
        return grand if isinstance(grand, cst.ClassDef) else None

    def bindings(self, scope: Scope) -> dict[str, list[cst.CSTNode]]:
        """The assignments of `scope`'s body with a value, by the code of each target
        (`x = ...`, `a, x = ...`, `x: T = ...`), in source order; indexed once per scope."""
        if id(scope) not in self._bindings:
            index: dict[str, list[cst.CSTNode]] = {}
            for node in self.body_nodes(scope):
                if isinstance(node, cst.Assign):
                    targets: list[cst.BaseExpression] = []
                    for t in node.targets:
                        target = t.target
                        tuple_ = isinstance(target, cst.Tuple)
                        targets += [e.value for e in target.elements] if tuple_ else [target]
                elif isinstance(node, cst.AnnAssign) and node.value is not None:
                    targets = [node.target]
                else:
                    continue
                for code in dict.fromkeys(code_of(t) for t in targets):
                    index.setdefault(code, []).append(node)
            self._bindings[id(scope)] = index
        return self._bindings[id(scope)]

    def body_nodes(self, scope: Scope) -> list[cst.CSTNode]:
        """The nodes of `scope`'s body, not entering nested functions or classes."""
        return self._bodies.get(id(scope), [])

    def calls(self, within: cst.CSTNode | None = None) -> list[cst.Call]:
        """Every call in the file (or within `within`)."""
        nodes = self.nodes if within is None else self.inside(within)
        return [n for n in nodes if isinstance(n, cst.Call)]

    def inside(self, outer: cst.CSTNode) -> list[cst.CSTNode]:
        """`outer`'s descendants."""
        return self.nodes[self.order[id(outer)] + 1 : self.end[id(outer)] + 1]

    def before(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        return self.order[id(a)] < self.order[id(b)]


class _Indexer(cst.CSTVisitor):
    """Fills a SourceFile's order, parents and per-scope node lists in one pass."""

    def __init__(self, file: SourceFile) -> None:
        self.file = file
        self.stack: list[cst.CSTNode] = []
        self.scopes: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        file = self.file
        file.order[id(node)] = len(file.nodes)
        file.nodes.append(node)
        if self.stack:
            file.parents[id(node)] = self.stack[-1]
            file._bodies.setdefault(id(self.scopes[-1]), []).append(node)
        else:
            file._bodies.setdefault(id(node), []).append(node)
        self.stack.append(node)
        if isinstance(node, cst.Module | cst.FunctionDef | cst.ClassDef | cst.Lambda):
            self.scopes.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()
        if self.scopes and self.scopes[-1] is original_node:
            self.scopes.pop()
        self.file.end[id(original_node)] = len(self.file.nodes) - 1


# Methods that return the module they are called on, placed or cast.
_PLACING = frozenset(("to", "cuda", "cpu", "float", "double", "half", "bfloat16", "train"))


_MAX_BASES = 4  # base classes followed for a method (a cycle or a deep tree stops there)


@dataclass(frozen=True, eq=False)
class Func:
    """A function (or a module's top-level code) in one of the files."""

    file: SourceFile
    node: Scope

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Func) and other.node is self.node

    def __hash__(self) -> int:
        return id(self.node)

    @property
    def cls(self) -> cst.ClassDef | None:
        return self.file.class_of(self.node)

    def statements(self) -> list[cst.CSTNode]:
        """Every node of its body, not entering nested functions or classes."""
        return self.file.body_nodes(self.node)

    def calls(self) -> Iterator[cst.Call]:
        return (n for n in self.statements() if isinstance(n, cst.Call))

    def star_kwargs(self) -> str | None:
        """The name of the `**kwargs` parameter, if any."""
        if not isinstance(self.node, cst.FunctionDef):
            return None
        star = self.node.params.star_kwarg
        return star.name.value if star is not None else None

    def params(self) -> list[str]:
        """Parameter names callers bind (without `self`/`cls` of a method)."""
        if not isinstance(self.node, cst.FunctionDef):
            return []
        p = self.node.params
        names = [x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params)]
        if self.cls is not None and names and names[0] in ("self", "cls"):
            names = names[1:]
        return names

    @property
    def name(self) -> str:
        return self.node.name.value if isinstance(self.node, cst.FunctionDef) else "<module>"


class CodeBase:
    """The script and the local modules reached from it."""

    def __init__(self, module: cst.Module, path: Path | None) -> None:
        self.script = SourceFile(path, module)
        self._files: dict[Path, SourceFile | None] = {}
        self._callers: dict[Func, list[tuple[Func, cst.Call]]] | None = None
        self._resolved: dict[int, Func | None] = {}
        self._backward: dict[Func, bool] = {}
        self._subclass_index: (
            tuple[int, dict[int, list[tuple[SourceFile, cst.ClassDef]]]] | None
        ) = None

    def files(self) -> list[SourceFile]:
        return [self.script, *(f for f in self._files.values() if f is not None)]

    def top(self, file: SourceFile) -> Func:
        return Func(file, file.module)

    def scope(self, file: SourceFile, node: cst.CSTNode) -> Func:
        return Func(file, file.scope_of(node))

    # ----- local modules -------------------------------------------------------------------------
    def _load(self, dotted: str, importer: SourceFile) -> SourceFile | None:
        """The local module `dotted` (`engine`, `mingpt.trainer`, `.utils`, `..models`) as
        `importer` imports it, parsed: a relative import from `importer`'s package, an
        absolute one from its folder or the script's (or up to two folders above it)."""
        if self.script.path is None:
            return None
        name = dotted.lstrip(".")
        level = len(dotted) - len(name)
        rel = Path(*name.split(".")) if name else Path()
        if level:
            if importer.path is None:
                return None
            bases = (
                [importer.path.parents[level - 1]] if level <= len(importer.path.parents) else []
            )
        else:
            # and the project's root: a package a setup.py installs, or run from the root
            # (prototypical-networks' scripts/train/few_shot/train.py imports `protonets`)
            script = [
                self.script.path.parent,
                *list(self.script.path.parents)[1 : _PARENT_LEVELS + 1],
                _shown(root_of(self.script.path)),
            ]
            bases = list(
                dict.fromkeys(
                    [*([importer.path.parent] if importer.path is not None else []), *script]
                )
            )
        for base in bases:
            candidates = (
                (base / rel / "__init__.py",)
                if not name
                else (base / rel.with_suffix(".py"), base / rel / "__init__.py")
            )
            for candidate in candidates:
                if candidate.is_file():
                    return self._load_path(candidate)
        return None

    def project_files(self, says: Callable[[str], bool], limit: int) -> list[SourceFile]:
        """The project's modules (beside the script's own) whose text `says` holds for, parsed;
        at most `limit`, in path order."""
        if self.script.path is None:
            return []
        found: list[SourceFile] = []
        for path in project_modules(self.script.path):
            if len(found) >= limit:
                break
            if Path(path).resolve() == self.script.path.resolve() or not says(read_text(path)):
                continue
            if (source := self._load_path(_shown(Path(path)))) is not None:
                found.append(source)
        return found

    def _load_path(self, path: Path) -> SourceFile | None:
        """The local module at `path`, parsed once (None: unreadable or not Python)."""
        key = path.resolve()
        if key not in self._files:
            try:
                tree = cst.parse_module(path.read_text(encoding="utf-8"))
                self._files[key] = SourceFile(path, tree)
            except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
                self._files[key] = None
            self._callers = None
        return self._files[key]

    def _imported(
        self, dotted: str, importer: SourceFile, depth: int = 0
    ) -> Func | tuple[SourceFile, cst.ClassDef] | None:
        """The function or class `module.name` that `dotted` names in `importer`, if its
        module is local; through a package's re-export (`from disvae import Trainer`, which
        disvae/__init__.py imports from disvae.training)."""
        module, _, name = dotted.rpartition(".")
        source = self._load(module, importer) if module else None
        if source is None:
            return None
        if name in source.functions:
            return Func(source, source.functions[name])
        if name in source.classes:
            return source, source.classes[name]
        if name in source.imports and depth < _MAX_BASES:
            return self._imported(source.imports[name], source, depth + 1)
        if depth < _MAX_BASES:
            # a package re-exporting with a star (crnn-audio's train/__init__.py:
            # `from train.trainer import *`)
            return self._star_imported(source, name, depth + 1)
        return None

    def local_class(self, file: SourceFile, name: str) -> tuple[SourceFile, cst.ClassDef] | None:
        """The class `name` of `file`, or imported into it from a local module (also under
        another name: `Exp = Exp_Main`)."""
        if name in file.classes:
            return file, file.classes[name]
        other = file.renamed.get(name)
        if other is not None and name not in file.imports and other not in file.renamed:
            return self.local_class(file, other)
        found = self._imported(file.imports[name], file) if name in file.imports else None
        if found is None and name not in file.imports:
            found = self._star_imported(file, name)
        return found if isinstance(found, tuple) else None

    def _star_imported(
        self, file: SourceFile, name: str, depth: int = 0
    ) -> Func | tuple[SourceFile, cst.ClassDef] | None:
        """`name` brought by a star import of a local module (`from model import *`)."""
        if name in file.bound_names:
            return None  # bound here: the star import does not provide it
        for module in file.star_imports:
            dotted = f"{module}.{name}" if module.strip(".") else module + name
            found = self._imported(dotted, file, depth)
            if found is not None:
                return found
        return None

    def called_class(
        self, file: SourceFile, func: cst.BaseExpression
    ) -> tuple[SourceFile, cst.ClassDef] | None:
        """The local class a call of `func` instantiates: `Name(...)` or `module.Name(...)` of a
        local module the file imports (LSTNet's `Optim.Optim(...)`)."""
        if isinstance(func, cst.Name):
            return self.local_class(file, func.value)
        if (
            isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value in file.imports
        ):
            found = self._imported(f"{file.imports[func.value.value]}.{func.attr.value}", file)
            return found if isinstance(found, tuple) else None
        return None

    # ----- calls -------------------------------------------------------------------------------
    def method(self, file: SourceFile, cls: cst.ClassDef, name: str, depth: int = 0) -> Func | None:
        """The method `name` of `cls`, or of the first of its local base classes that defines
        it (decision-transformer's `SequenceTrainer(Trainer)` runs `Trainer.train_iteration`)."""
        for stmt in cls.body.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
                return Func(file, stmt)
        return self.base_method(file, cls, name, depth) if depth < _MAX_BASES else None

    def base_method(
        self, file: SourceFile, cls: cst.ClassDef, name: str, depth: int = 0
    ) -> Func | None:
        """The method `name` of the first of `cls`'s local base classes that defines it."""
        for base in cls.bases:
            owner = self.called_class(file, base.value)
            if owner is not None and owner[1] is not cls:
                found = self.method(*owner, name, depth + 1)
                if found is not None:
                    return found
        return None

    def class_methods(self, file: SourceFile, cls: cst.ClassDef, depth: int = 0) -> list[Func]:
        """Every method of `cls` and of its local base classes (S3Rec's `FinetuneTrainer`
        steps the `self.optim` that the base `Trainer.__init__` creates)."""
        found = [Func(file, s) for s in cls.body.body if isinstance(s, cst.FunctionDef)]
        if depth < _MAX_BASES:
            for base in cls.bases:
                owner = self.called_class(file, base.value)
                if owner is not None and owner[1] is not cls:
                    found += self.class_methods(*owner, depth + 1)
        return found

    def overrides(self, func: Func) -> list[Func]:
        """The methods of the loaded files' subclasses of `func`'s class that override it: a
        base's `self.iteration(...)` runs the subclass's (S3Rec's `Trainer.train` runs
        `FinetuneTrainer.iteration`)."""
        return self._subclass_methods(func.cls, func.name) if func.cls is not None else []

    def _subclass_methods(self, cls: cst.ClassDef, name: str) -> list[Func]:
        """The methods `name` of the loaded files' subclasses of `cls`."""
        found: list[Func] = []
        for sub_file, sub in self._subclasses().get(id(cls), []):
            found += [
                Func(sub_file, s)
                for s in sub.body.body
                if isinstance(s, cst.FunctionDef) and s.name.value == name
            ]
        return found

    def _subclasses(self) -> dict[int, list[tuple[SourceFile, cst.ClassDef]]]:
        """The local subclasses of each class of the loaded files (also indirect ones), by
        the base class's id; indexed again whenever another file is loaded."""
        loaded = len(self._files)
        if self._subclass_index is None or self._subclass_index[0] != loaded:
            index: dict[int, list[tuple[SourceFile, cst.ClassDef]]] = {}
            for file in self.files():
                for cls in file.classes.values():
                    for base in self._bases(file, cls):
                        index.setdefault(id(base[1]), []).append((file, cls))
            self._subclass_index = (len(self._files), index)
        return self._subclass_index[1]

    def _bases(
        self, file: SourceFile, cls: cst.ClassDef, depth: int = 0
    ) -> list[tuple[SourceFile, cst.ClassDef]]:
        """`cls`'s local base classes, also indirect ones."""
        found: list[tuple[SourceFile, cst.ClassDef]] = []
        for base in cls.bases:
            owner = self.called_class(file, base.value)
            if owner is not None and owner[1] is not cls:
                found.append(owner)
                if depth < _MAX_BASES:
                    found += self._bases(*owner, depth + 1)
        return found

    def resolve(self, file: SourceFile, call: cst.Call) -> Func | None:
        """The function `call` runs, when it is defined in the script or a local module."""
        if id(call) not in self._resolved:
            self._resolved[id(call)] = None  # a call met again while resolving it runs nothing
            self._resolved[id(call)] = self._resolve(file, call)
        return self._resolved[id(call)]

    def _resolve(self, file: SourceFile, call: cst.Call) -> Func | None:
        return self._callee(file, call.func, call)

    def _callee(self, file: SourceFile, func: cst.BaseExpression, at: cst.CSTNode) -> Func | None:
        """The local function a call of `func` at `at` runs."""
        call = at
        if isinstance(func, cst.Name):
            name = func.value
            if nested := self._nested(file, call, name):
                return nested
            if name in file.functions:
                return Func(file, file.functions[name])
            if name in file.imports:
                found = self._imported(file.imports[name], file)
                if isinstance(found, Func):
                    return found
            elif isinstance(found := self._star_imported(file, name), Func):
                return found
            owner = self.local_class(file, name)
            if owner:
                return self.method(*owner, "__init__")
            if returned := self._returned_function(file, name, call):
                return returned
            # `maml(x)` where `maml = Meta(...).to(device)`: the module's forward runs; a
            # plain class's `__call__` (disentangling-vae's `trainer(train_loader, ...)`)
            instance = self._instance_class(file, name, file.scope_of(call))
            if instance is None:
                return None
            return self.method(*instance, "__call__") or self.method(*instance, "forward")
        if isinstance(func, cst.Subscript) and isinstance(func.value, cst.Name):
            return self._dispatched(file, func.value.value, at)
        if not isinstance(func, cst.Attribute):
            return None
        receiver, attr = func.value, func.attr.value
        if isinstance(receiver, cst.Call) and code_of(receiver.func) == "super":
            # `super().__init__(model, optimizer)`: the first base class that defines it
            cls = file.class_of(file.scope_of(call))
            return self.base_method(file, cls, attr) if cls is not None else None
        if isinstance(receiver, cst.Name):
            if receiver.value in ("self", "cls"):
                cls = file.class_of(file.scope_of(call))
                return self.method(file, cls, attr) if cls is not None else None
            if receiver.value in file.imports:  # engine.train_one_epoch(...)
                found = self._imported(f"{file.imports[receiver.value]}.{attr}", file)
                if isinstance(found, tuple):  # `lib.Trainer(...)`: its constructor runs
                    return self.method(*found, "__init__")
                return found
            owner = self._instance_class(file, receiver.value, file.scope_of(call))
            return self.method(*owner, attr) if owner else None
        return None

    def _dispatched(self, file: SourceFile, table: str, at: cst.CSTNode) -> Func | None:
        """`trainer[dataset_name](args, net)` where `trainer = {'Synapse': trainer_synapse}`
        (TransUNet): the function of a dispatch table, when all its entries run the same one."""
        found: list[Func | None] = []
        for node in file.bindings(file.scope_of(at)).get(table, []):
            value = node.value if isinstance(node, cst.Assign | cst.AnnAssign) else None
            if not isinstance(value, cst.Dict) or not value.elements:
                return None
            for element in value.elements:
                entry = element.value if isinstance(element, cst.DictElement) else None
                found.append(self._callee(file, entry, at) if entry is not None else None)
        funcs = {id(f.node): f for f in found if f is not None}
        if len(funcs) != 1 or None in found:
            return None
        return next(iter(funcs.values()))

    def _returned_function(self, file: SourceFile, name: str, at: cst.CSTNode) -> Func | None:
        """`train_step_fn(state, batch)` where `train_step_fn = losses.get_step_fn(...)` and
        the project's `get_step_fn` returns the `step_fn` it defines (score_sde)."""
        for node in file.bindings(file.scope_of(at)).get(name, []):
            value = node.value if isinstance(node, cst.Assign) else None
            if not isinstance(value, cst.Call):
                continue
            factory = self.resolve(file, value)
            if factory is None or not isinstance(factory.node, cst.FunctionDef):
                continue
            defined = {
                n.name.value: n
                for n in factory.file.body_nodes(factory.node)
                if isinstance(n, cst.FunctionDef)
            }
            for returned in factory.statements():
                if (
                    isinstance(returned, cst.Return)
                    and isinstance(returned.value, cst.Name)
                    and returned.value.value in defined
                ):
                    return Func(factory.file, defined[returned.value.value])
        return None

    @staticmethod
    def _nested(file: SourceFile, call: cst.CSTNode, name: str) -> Func | None:
        """The function `name` defined inside a function enclosing `call` (timm's
        `def _backward(_loss): ...` in train_one_epoch, called from its loop)."""
        scope = file.scope_of(call)
        while isinstance(scope, cst.FunctionDef):
            for node in file.body_nodes(scope):
                if isinstance(node, cst.FunctionDef) and node.name.value == name:
                    return Func(file, node)
            scope = file.scope_of(scope)
        return None

    def _instance_class(
        self, file: SourceFile, name: str, scope: Scope
    ) -> tuple[SourceFile, cst.ClassDef] | None:
        """The local class of `name = SomeClass(...)` in `scope` (also placed:
        `SomeClass(...).to(device)`, `.cuda()`)."""
        found = self._instance_classes(file, name, scope)
        return found[0] if found else None

    def _instance_classes(
        self, file: SourceFile, name: str, scope: Scope, depth: int = 0
    ) -> list[tuple[SourceFile, cst.ClassDef]]:
        """Every local class `name` may be an instance of: `name = SomeClass(...)`, or `name =
        Exp(...)` where `Exp` stands for one class or another, or `name = make(...)` where the
        local function `make` returns an instance (pytorch-3dunet's `create_trainer(config)`)."""
        found: dict[int, tuple[SourceFile, cst.ClassDef]] = {}
        bindings = file.bindings(scope).get(name, ())
        for node in bindings:
            if (
                isinstance(node, cst.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0].target, cst.Name)
            ):
                # each binding, in order (TD3's `policy = TD3.TD3(...)` or `OurDDPG.DDPG(...)`)
                for owner in self._classes_of(file, node.value, depth):
                    found.setdefault(id(owner[1]), owner)
        if not found and isinstance(scope, cst.FunctionDef) and depth < _MAX_BASES:
            # a parameter: what its callers pass (CloserLookFewShot's `train(..., model, ...)`
            # handed `model = BaselineTrain(...)` or `ProtoNet(...)` by the main block)
            for owner in self._passed_classes(Func(file, scope), name, bool(bindings), depth):
                found.setdefault(id(owner[1]), owner)
        return list(found.values())

    def _passed_classes(
        self, func: Func, name: str, rebound: bool, depth: int
    ) -> list[tuple[SourceFile, cst.ClassDef]]:
        """The local classes of the objects `func`'s callers pass for its parameter `name`
        (unless the function binds the name itself: `rebound`)."""
        if rebound or name not in func.params():
            return []
        found: list[tuple[SourceFile, cst.ClassDef]] = []
        # the calls by its name that run it (not `callers()`: its index resolves every call
        # of every file, and this runs while one of them is being resolved)
        for file in self.files():
            for call in file.calls():
                called = call.func.attr if isinstance(call.func, cst.Attribute) else call.func
                if not isinstance(called, cst.Name) or called.value != func.name:
                    continue
                if self.resolve(file, call) != func:
                    continue
                passed = self.argument(call, func, name)
                if isinstance(passed, cst.Name):
                    found += self._instance_classes(
                        file, passed.value, file.scope_of(call), depth + 1
                    )
        return found

    def classes_made(
        self, file: SourceFile, value: cst.BaseExpression
    ) -> list[tuple[SourceFile, cst.ClassDef]]:
        """The local classes whose instance `value` (a call, maybe placed) makes."""
        return self._classes_of(file, value, 0)

    def _classes_of(
        self, file: SourceFile, value: cst.BaseExpression, depth: int
    ) -> list[tuple[SourceFile, cst.ClassDef]]:
        """The local classes whose instance `value` (a call, maybe placed) makes."""
        while (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in _PLACING
        ):
            value = value.func.value
        if not isinstance(value, cst.Call):
            return []
        if depth < _MAX_BASES and (made := self._made_by(file, value, depth)):
            return made
        if isinstance(value.func, cst.Call):
            # `get_method(name)(args)`, `MODEL_REGISTRY.get(name)(opt)`: a class picked by name
            return self.classes_returned(file, value.func)
        if isinstance(value.func, cst.Attribute):
            # `trainer = lib.Trainer(...)` of a local package (GRU4REC)
            one = self.called_class(file, value.func)
            return [one] if one is not None else []
        if not isinstance(value.func, cst.Name):
            return []
        called = value.func.value
        if len(choices := file.import_choices.get(called, [])) > 1:
            # a class picked by an import in each branch: every one of them, the first first
            found = [c for d in choices if isinstance(c := self._imported(d, file), tuple)]
            if found:
                return found
        if (one := self.local_class(file, called)) is not None:
            return [one]
        if called in file.imports:
            return []
        if picked := self._class_bound_by_factory(file, value.func):
            return picked
        return [
            c
            for other in file.aliases.get(called, ())
            if other not in file.aliases and (c := self.local_class(file, other))
        ]

    def _class_bound_by_factory(
        self, file: SourceFile, name: cst.Name, depth: int = 0
    ) -> list[tuple[SourceFile, cst.ClassDef]]:
        """The local classes a name stands for when its scope binds it to what a class factory
        returns (TabSurvey's `model_name = str2model(args.model_name)`, then
        `model_name(params, args)`)."""
        found: list[tuple[SourceFile, cst.ClassDef]] = []
        for node in file.bindings(file.scope_of(name)).get(name.value, ()):
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
                found += self.classes_returned(file, node.value, depth)
        return found

    def _made_by(
        self, file: SourceFile, call: cst.Call, depth: int
    ) -> list[tuple[SourceFile, cst.ClassDef]]:
        """The local classes whose instances the local function `call` runs returns."""
        if depth > _MAX_BASES:
            return []
        if self.local_class(file, code_of(call.func)) is not None:
            return []
        factory = self._factory(file, call)
        if factory is None:
            return []
        found: dict[int, tuple[SourceFile, cst.ClassDef]] = {}
        for node in factory.statements():
            if not isinstance(node, cst.Return) or node.value is None:
                continue
            value = node.value
            if isinstance(value, cst.Name):
                classes = self._instance_classes(factory.file, value.value, factory.node, depth + 1)
            elif isinstance(value, cst.Call):
                owner = self.called_class(factory.file, value.func)
                classes = [owner] if owner else self._made_by(factory.file, value, depth + 1)
            else:
                classes = []
            found.update((id(c[1]), c) for c in classes)
        return list(found.values())

    def _factory(self, file: SourceFile, call: cst.Call) -> Func | None:
        """The local function (not a method) `call` runs."""
        factory = self.resolve(file, call)
        if (
            factory is None
            or factory.cls is not None
            or not isinstance(factory.node, cst.FunctionDef)
        ):
            return None
        return factory

    def classes_returned(
        self, file: SourceFile, call: cst.Call, depth: int = 0
    ) -> list[tuple[SourceFile, cst.ClassDef]]:
        """The local classes (not instances) `call` returns: every class registered with a
        registry it looks up (BasicSR's `MODEL_REGISTRY.get(name)`), or those a local function
        returns by name (TALENT's `get_method(name)`, importing one class in each branch; also
        a name it binds to such a lookup: MiniGPT-4's `runner_cls =
        registry.get_runner_class(...)`, `return runner_cls`)."""
        func = call.func
        if (
            isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and is_registry_getter(func.value.value, func.attr.value)
        ):
            return self._registered(file, func.value.value)
        factory = self._factory(file, call)
        if factory is None:
            return []
        found: dict[int, tuple[SourceFile, cst.ClassDef]] = {}
        for node in factory.statements():
            if isinstance(node, cst.Return) and isinstance(node.value, cst.Name):
                owner = self.local_class(factory.file, node.value.value)
                owners = [owner] if owner is not None else []
                if owner is None and depth < _MAX_BASES:
                    owners = self._class_bound_by_factory(factory.file, node.value, depth + 1)
                found.update((id(o[1]), o) for o in owners)
        return list(found.values())

    def _registered(self, file: SourceFile, registry: str) -> list[tuple[SourceFile, cst.ClassDef]]:
        """The project's classes decorated `@registry.register(...)`, in the modules that
        register with it (imported by a folder scan, not by name)."""
        if file.path is None:
            return []
        found: list[tuple[SourceFile, cst.ClassDef]] = []
        for path in registering_modules(file.path, registry):
            source = self._load_path(_shown(path))
            for cls in source.classes.values() if source is not None else ():
                if any(
                    code_of(d.decorator).startswith(f"{registry}.register") for d in cls.decorators
                ):
                    found.append((source, cls))
        return found

    def callers(self, func: Func) -> list[tuple[Func, cst.Call]]:
        """Every (calling function, call) that runs `func`, across the loaded files."""
        if self._callers is None:
            index: dict[Func, list[tuple[Func, cst.Call]]] = {}
            for file in self.files():
                for call in file.calls():
                    target = self.resolve(file, call)
                    for runs in [target, *self._bound_functions(file, call)]:
                        if runs is not None:
                            index.setdefault(runs, []).append((self.scope(file, call), call))
            self._callers = index
        return self._callers.get(func, [])

    @staticmethod
    def _bound_functions(file: SourceFile, call: cst.Call) -> list[Func]:
        """The functions of the file a local name is bound to before it is called (vnet's
        `if nll: train = train_nll` / `else: train = train_dice`, then `train(args, ...)`)."""
        if not isinstance(call.func, cst.Name):
            return []
        name = call.func.value
        found = []
        for node in file.body_nodes(file.scope_of(call)):
            if (
                isinstance(node, cst.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0].target, cst.Name)
                and node.targets[0].target.value == name
                and isinstance(node.value, cst.Name)
                and node.value.value in file.functions
            ):
                found.append(Func(file, file.functions[node.value.value]))
        return found

    @staticmethod
    def argument(call: cst.Call, callee: Func, param: str) -> cst.BaseExpression | None:
        """The expression `call` passes for `callee`'s parameter `param`."""
        params = callee.params()
        positional = [a for a in call.args if a.keyword is None and not a.star]
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == param:
                return arg.value
        if param in params:
            index = params.index(param)
            if index < len(positional) and not any(a.star for a in call.args[: index + 1]):
                return positional[index].value
        return None

    def runs(self, file: SourceFile, call: cst.Call) -> list[Func]:
        """The functions of the code base `call` runs: the one it calls (and, for a method called
        on `self`, its overrides in subclasses), and the closure an optimizer's `step(closure)`
        calls (LBFGS: the forward and backward live in it)."""
        found = [target] if (target := self.resolve(file, call)) is not None else []
        if target is not None and on_self(call):
            found += self.overrides(target)
        elif target is None and on_self(call):
            # a method only the subclasses define (a base `train()` calling
            # `self._train_epoch(epoch)` with no abstract stub)
            cls = file.class_of(file.scope_of(call))
            if cls is not None:
                found += self._subclass_methods(cls, call.func.attr.value)  # type: ignore[attr-defined]
        found += self._alternatives(file, call, target)
        found += [f for f in self._handed(file, call) if f not in found]
        if closure := self.step_closure(file, call):
            found.append(closure)
        return found

    def _handed(self, file: SourceFile, call: cst.Call) -> list[Func]:
        """The local functions and bound methods handed to `call`, which it runs:
        `mp.spawn(run_training, ...)`, lightweight-gan's `retry_call(model.train, tries=3)`."""
        found: list[Func] = []
        for arg in call.args:
            value = arg.value
            if isinstance(value, cst.Name) and value.value in ("self", "cls"):
                continue
            if isinstance(value, cst.Name | cst.Attribute):
                target = self._callee(file, value, call)
                # a function or bound method, not an instance (Swin's `loss_scaler` handed to
                # train_one_epoch is called there, with its own arguments) nor a class
                if target is not None and target.name not in ("__init__", "__call__", "forward"):
                    found.append(target)
        return found

    def engine_step(self, file: SourceFile, call: cst.Call) -> Func | None:
        """The script's own step function an ignite `Engine(step)` runs on every batch."""
        if not (file.qualname(call.func).startswith("ignite.") and call.args):
            return None
        if not code_of(call.func).endswith("Engine") or call.args[0].keyword is not None:
            return None
        step = call.args[0].value
        return self._callee(file, step, call) if isinstance(step, cst.Name) else None

    def _alternatives(self, file: SourceFile, call: cst.Call, target: Func | None) -> list[Func]:
        """The same method of the other classes `obj` of `obj.method(...)` may be an instance
        of (`exp = Exp(args)` where `Exp` is one of two experiment classes)."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
            return []
        classes = self._instance_classes(file, func.value.value, file.scope_of(call))
        found = [self.method(*owner, func.attr.value) for owner in classes[1:]]
        return [f for f in found if f is not None and f != target]

    @staticmethod
    def step_closure(file: SourceFile, call: cst.Call) -> Func | None:
        """The local function `X.step(closure)` hands the optimizer, if `call` is one."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "step" and call.args):
            return None
        first = call.args[0]
        if first.keyword is not None and first.keyword.value != "closure":
            return None
        if not isinstance(first.value, cst.Name):
            return None
        name = first.value.value
        scope: Scope = file.scope_of(call)
        while True:  # the closure is defined in the scope of the step or one enclosing it
            for node in file.body_nodes(scope):
                if isinstance(node, cst.FunctionDef) and node.name.value == name:
                    return Func(file, node)
            if isinstance(scope, cst.Module):
                return None
            scope = file.scope_of(scope)

    def does_backward(self, func: Func) -> bool:
        """`func` calls `.backward()`, itself or through the functions it calls."""
        if func not in self._backward:
            self._backward[func] = False  # a recursive call does not count
            self._backward[func] = any(self.trains(func, call) for call in func.calls())
        return self._backward[func]

    def trains(self, func: Func, call: cst.Call) -> bool:
        """`call` (in `func`) is a backward, or runs a function that does one."""
        if is_backward(call):
            return True
        return any(self.does_backward(target) for target in self.runs(func.file, call))


def on_self(call: cst.Call) -> bool:
    """`self.method(...)`."""
    func = call.func
    return (
        isinstance(func, cst.Attribute)
        and isinstance(func.value, cst.Name)
        and func.value.value == "self"
    )


def is_backward(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"


def _shown(path: Path) -> Path:
    """`path` relative to the working folder when it lies below it, as the script's own
    imports are found (the names a decline shows)."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path
