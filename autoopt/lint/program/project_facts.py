"""What a name imported from the user's own project is (`from models import Net` -> is `Net` a
convolutional network, does it flatten with `.view()`?), and which scripts of a folder import a
module (the script that drives a `train.py`).

Local modules are found next to the linted file, then in its parent folders up to the project
root (the first folder holding pyproject.toml, setup.py, setup.cfg or .git, or the current
directory if that comes first). They are parsed with
`ast` (several times cheaper than libcst) and never imported or executed. Each module is read and
summarised once per process (the runner lints files in worker processes; each keeps its own
cache). Every module consulted while a file is linted is recorded with its content hash
(`files_read`), so the results cache can drop that file's entry when one of them changes.

Known model zoos count inside local modules too (`torchvision.models.resnet18(...)`,
`timm.create_model("resnet50")`); see `torch_api.is_conv_zoo_model` for the linted file itself.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from autoopt.lint.program.config_defaults import yacs_default
from autoopt.lint.program.index import file_tree, parse_tree
from autoopt.lint.program.project_files import modules_named, record_read, resolve_module
from autoopt.lint.program.project_text import imported_paths, importers_of, read_text
from autoopt.lint.program.torch_api import is_conv_family, is_transformer_family
from autoopt.lint.tree.ast_walk import child_nodes, walk
from autoopt.lint.tree.encoding import content_digest
from autoopt.lint.tree.nodes import code_of, dotted, is_name, top_level_imports

if TYPE_CHECKING:
    from autoopt.lint.engine.rule import Rule

_MAX_DEPTH = 6  # re-export chains and class-of-class closures followed at most this deep
_MAX_VISITS = 200  # definitions looked at for one name's closure
_MAX_BYTES = 2_000_000  # a "module" larger than this is data, not code: not read

_CONV2D_LEAVES = frozenset({"Conv2d", "ConvTranspose2d", "LazyConv2d", "LazyConvTranspose2d"})
_CONV_LEAVES = _CONV2D_LEAVES | frozenset(
    f"{kind}{dim}d"
    for kind in ("Conv", "ConvTranspose", "LazyConv", "LazyConvTranspose")
    for dim in (1, 3)
)
_CONV_FUNCTION_LEAVES = frozenset({"conv1d", "conv2d", "conv3d", "conv_transpose2d"})
_CONV3D_LEAVES = frozenset({"Conv3d", "ConvTranspose3d", "LazyConv3d", "LazyConvTranspose3d"})
# Layers that make a model dense rather than convolutional (transformers, MLPs).
_DENSE_LEAVES = frozenset({"Linear", "LazyLinear", "Bilinear", "MultiheadAttention"})
_ZOO_CONVS = 20  # a torchvision/timm CNN counts as this many convolution layers
_WHOLE_MODULE = "*"  # a module used as a table of model builders (`resnet.__dict__[arch]`)
_REGISTERED = "@register_model"  # the module's models registered with timm
_BUILTIN_NAMES = frozenset(dir(builtins)) | {"self", "cls", "super", "nn", "F", "torch"}
# torch.optim's optimizer classes (`torch.optim.SGD(...)`, `optim.AdamW(...)`)
_OPTIMIZER_LEAVES = frozenset(
    {"SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Rprop", "NAdam",
     "RAdam", "ASGD", "LBFGS", "SparseAdam", "Adafactor"}
)  # fmt: skip


# ----- one module's summary ----------------------------------------------------------------------
@dataclass
class ModuleSummary:
    """What the lint needs to know about one local module, from its `ast`."""

    path: Path
    digest: str
    classes: dict[str, set[str]] = field(default_factory=dict)  # class -> names it uses
    functions: dict[str, set[str]] = field(default_factory=dict)  # function -> names it uses
    conv: set[str] = field(default_factory=set)  # classes/functions with convolution layers
    conv2d: set[str] = field(default_factory=set)  # ... with 2-D convolutions
    conv3d: set[str] = field(default_factory=set)  # ... with 3-D ones (5-D weights)
    views: set[str] = field(default_factory=set)  # ... that flatten with `.view(n, -1)`
    # functions that build a torch.optim optimizer, classes that are one (`class SAM(Optimizer)`)
    optimizers: set[str] = field(default_factory=set)
    own_to: set[str] = field(default_factory=set)  # classes whose `.to()` takes no non_blocking
    # def -> (2-D convolution layers, dense layers: Linear, MultiheadAttention) it builds itself
    layers: dict[str, tuple[int, int]] = field(default_factory=dict)
    # def -> name -> how many times it calls (or passes on) that name: `Down(...)` three times
    uses: dict[str, dict[str, int]] = field(default_factory=dict)
    imported_modules: list[tuple[str, int]] = field(default_factory=list)  # (module, level)
    # name bound by `import x.y as name` / `import name` -> (module, level)
    module_aliases: dict[str, tuple[str, int]] = field(default_factory=dict)
    # bound name -> (module, imported name, relative level)
    imports: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    star_imports: list[tuple[str, int]] = field(default_factory=list)  # (module, level)


def _leaf(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def summarize(path: Path, data: bytes, tree: ast.Module | None = None) -> ModuleSummary:
    """Summarise a module's source (a file that does not parse gives an empty summary);
    `tree`: its parse, when the caller has it."""
    summary = ModuleSummary(path, content_digest(data))
    tree = tree if tree is not None else parse_tree(data)
    if tree is None:
        return summary
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            summary.imported_modules.extend((alias.name, 0) for alias in stmt.names)
            for alias in stmt.names:  # `import models.crnn as crnn` binds the module itself
                if alias.asname:
                    summary.module_aliases[alias.asname] = (alias.name, 0)
                else:  # `import a.b` binds `a`
                    summary.module_aliases[alias.name.split(".")[0]] = (alias.name.split(".")[0], 0)
        if isinstance(stmt, ast.ImportFrom):
            summary.imported_modules.append((stmt.module or "", stmt.level))
            for alias in stmt.names:
                if alias.name == "*":
                    summary.star_imports.append((stmt.module or "", stmt.level))
                else:
                    summary.imports[alias.asname or alias.name] = (
                        stmt.module or "",
                        alias.name,
                        stmt.level,
                    )
        elif isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if any(_leaf(d) == "register_model" for d in stmt.decorator_list):
                # timm's `@register_model`: `create_model(args.model)` may build it
                summary.functions.setdefault(_REGISTERED, set()).add(stmt.name)
                summary.uses.setdefault(_REGISTERED, {})[stmt.name] = 1
            used: set[str] = set()
            convs = dense = other_convs = 0
            times: dict[str, int] = {}
            for node, weight in _weighted_walk(stmt):
                if isinstance(node, ast.Name):  # `ResNet(BasicBlock, ...)` passes a conv class
                    used.add(node.id)
                    times[node.id] = times.get(node.id, 0) + weight
                if not isinstance(node, ast.Call):
                    continue
                registry = _module_registry(node.func)
                if registry is not None:  # `resnet.__dict__[args.arch](...)`: one of a module's
                    used.add(registry)
                    times[registry] = times.get(registry, 0) + weight
                leaf = _leaf(node.func)
                if leaf is None:
                    continue
                used.add(leaf)
                if isinstance(node.func, ast.Attribute):
                    times[leaf] = times.get(leaf, 0) + weight
                    qualified = _in_module(node.func, summary)
                    if qualified is not None:  # DRIT's `networks.Dis(...)` after `import networks`
                        used.add(qualified)
                        times[qualified] = times.get(qualified, 0) + weight
                if leaf in _CONV_LEAVES or leaf in _CONV_FUNCTION_LEAVES:
                    summary.conv.add(stmt.name)
                if leaf in _CONV3D_LEAVES:
                    summary.conv3d.add(stmt.name)
                if leaf in _CONV2D_LEAVES or leaf == "conv2d":
                    summary.conv2d.add(stmt.name)
                    convs += weight
                elif leaf in _DENSE_LEAVES:
                    dense += weight
                elif leaf in _CONV_LEAVES:
                    other_convs += weight
                if leaf == "view" and isinstance(node.func, ast.Attribute) and _flattens(node):
                    summary.views.add(stmt.name)
                if (
                    isinstance(stmt, ast.FunctionDef)
                    # End-to-end-ASR's `class Optimizer` builds `getattr(torch.optim, name)(params)`
                    or (isinstance(stmt, ast.ClassDef) and "optim" in stmt.name.lower())
                ) and (leaf in _OPTIMIZER_LEAVES or _optimizer_by_name(node)):
                    summary.optimizers.add(stmt.name)
                if _zoo_model(node, leaf, summary.imports):
                    summary.conv.add(stmt.name)
                    summary.conv2d.add(stmt.name)
                    convs += _ZOO_CONVS
                elif _zoo_model(node, leaf, summary.imports, is_transformer_family):
                    dense += _ZOO_CONVS  # AST's `timm.create_model("vit_deit_...")` backbone
            if isinstance(stmt, ast.FunctionDef) and _leaf(stmt.returns) == "Optimizer":
                summary.optimizers.add(stmt.name)  # `def make_optimizer(...) -> optim.Optimizer`
            if isinstance(stmt, ast.ClassDef) and _own_to(stmt):
                summary.own_to.add(stmt.name)
            if isinstance(stmt, ast.ClassDef) and any(
                _leaf(base) == "Optimizer" for base in stmt.bases
            ):  # the project's own optimizer (SAM, a RAdam copy): built from parameters
                summary.optimizers.add(stmt.name)
            if not convs:
                # 1-D/3-D convolutions weigh against the 2-D ones too (FloWaveNet's Conv1d
                # WaveNet), unless the same definition also builds 2-D ones: a `conv_nd(dims)`
                # dispatcher, Graph-WaveNet's mix of (1, k) Conv2d and Conv1d layers
                dense += other_convs
            if convs or dense:
                summary.layers[stmt.name] = (convs, dense)
            summary.uses[stmt.name] = times
            target = summary.classes if isinstance(stmt, ast.ClassDef) else summary.functions
            target[stmt.name] = used
        elif (  # an alias kept for compatibility: `Model = DetectionModel` (yolov5)
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and isinstance(stmt.value, ast.Name)
        ):
            original = stmt.value.id
            target = summary.functions if original in summary.functions else summary.classes
            target[stmt.targets[0].id] = {original}
            summary.uses[stmt.targets[0].id] = {original: 1}
        elif (entries := _registry_entries(stmt)) is not None:
            # a table of model builders (`_models = {"fcn": get_fcn, ...}`) a factory picks
            # from: weighed as all its entries together
            summary.functions[entries[0]] = set(entries[1])
            summary.uses[entries[0]] = dict.fromkeys(entries[1], 1)
    _close_within(summary)
    return summary


_LOOP_TIMES = 4  # a layer built in a loop or comprehension counts as this many (blocks, stages)
_LOOPS = (
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.ListComp,
    ast.SetComp,
    ast.GeneratorExp,
    ast.DictComp,
)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _weighted_walk(top: ast.AST) -> Iterator[tuple[ast.AST, int]]:
    """Every node under `top` with how many times it runs when `top` builds its model, as far
    as the text says: a layer in a loop or comprehension counts `_LOOP_TIMES`, a layer in a
    helper defined inside a function counts once per call of that helper (CRNN's `convRelu`,
    called seven times). Facts by weight: a VGG whose convolutions are built in a loop over its
    configuration outweighs its three Linear layers."""
    stack: list[tuple[ast.AST, int]] = [(top, 1)]
    while stack:
        node, weight = stack.pop()
        yield node, weight
        calls: dict[str, int] | None = None
        for child in child_nodes(node):
            times = weight
            if isinstance(node, _LOOPS) and child not in getattr(node, "orelse", ()):
                times = weight * _LOOP_TIMES
            elif isinstance(child, _DEFS) and isinstance(node, _DEFS):
                if calls is None:  # how often this function calls each helper it defines
                    calls = {}
                    for sub in walk(node):
                        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name):
                            calls[sub.func.id] = calls.get(sub.func.id, 0) + 1
                times = weight * max(1, calls.get(child.name, 0))
            stack.append((child, times))


def _module_registry(func: ast.expr) -> str | None:
    """`resnet.__dict__[arch]`: the module `resnet` used as a table of its model builders,
    recorded as the name `resnet.__dict__`."""
    if (
        isinstance(func, ast.Subscript)
        and isinstance(func.value, ast.Attribute)
        and func.value.attr == "__dict__"
        and isinstance(func.value.value, ast.Name)
    ):
        return f"{func.value.value.id}.__dict__"
    return None


def _registry_entries(stmt: ast.stmt) -> tuple[str, list[str]] | None:
    """`name = {"a": build_a, "b": BuildB}` (or a list/tuple of names) at module level: the
    table's name and the names it holds, when it holds at least two; an entry may pair the
    builder with its sizes (SupContrast's `{"resnet50": [resnet50, 2048], ...}`)."""
    if not (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
    ):
        return None
    value = stmt.value
    items = value.values if isinstance(value, ast.Dict) else getattr(value, "elts", None)
    if not isinstance(value, ast.Dict | ast.List | ast.Tuple) or items is None:
        return None
    names = [
        n.id
        for v in items
        for n in (v.elts if isinstance(v, ast.List | ast.Tuple) else [v])
        if isinstance(n, ast.Name)
    ]
    return (stmt.targets[0].id, names) if len(names) >= 2 else None


def _own_to(cls: ast.ClassDef) -> bool:
    """The class defines `def to(self, ...)` that cannot take `non_blocking` (detr's
    `NestedTensor.to(self, device)`): not a tensor's `.to()`."""
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "to":
            args = stmt.args
            names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
            return args.kwarg is None and "non_blocking" not in names
    return False


def _flattens(view: ast.Call) -> bool:
    """`x.view(n, -1)` merges dimensions (fails on NHWC); `x.view(n, c, h, w)` does not (the
    test `conv_models` applies to the linted file's own libcst tree)."""
    minus_one = any(isinstance(a, ast.UnaryOp) and isinstance(a.op, ast.USub) for a in view.args)
    return minus_one or len(view.args) < 4 or any(isinstance(a, ast.Starred) for a in view.args)


def _zoo_model(
    call: ast.Call,
    leaf: str,
    imports: dict[str, tuple[str, str, int]] | None = None,
    family: Callable[[str], bool] = is_conv_family,
) -> bool:
    """`timm.create_model("resnet50")`, `get_model("vgg16")`, `models.resnet18(...)`, and
    `resnet50()` imported from torchvision or timm (of another `family`: a transformer's)."""
    if isinstance(call.func, ast.Name) and imports and leaf in imports:
        source = imports[leaf][0]
        return source.startswith(("torchvision", "timm")) and family(imports[leaf][1])
    if leaf in ("create_model", "get_model"):
        first = call.args[0] if call.args else None
        return (
            isinstance(first, ast.Constant) and isinstance(first.value, str) and family(first.value)
        )
    owner = call.func.value if isinstance(call.func, ast.Attribute) else None
    return _leaf(owner) == "models" and family(leaf) if owner is not None else False


def _close_within(summary: ModuleSummary) -> None:
    """A class or function that uses a conv class of the same module is conv too (a `ResNet`
    made of `Block`s, `def ResNet18(): return ResNet(BasicBlock, ...)`); likewise for views."""
    defs = {**summary.functions, **summary.classes}
    for found in (summary.conv, summary.conv2d, summary.views):
        changed = True
        while changed:
            changed = False
            for name, used in defs.items():
                if name not in found and used & found:
                    found.add(name)
                    changed = True


# ----- the per-process cache and the record of what a file's lint read ---------------------------
# Keyed by path, modification time and size: a module edited during the process is read again.
_SUMMARIES: dict[tuple[Path, int, int], ModuleSummary] = {}


def load(path: Path) -> ModuleSummary | None:
    """The summary of the module at `path` (read and parsed once per process)."""
    path = Path(os.path.abspath(path))
    try:
        stat = path.stat()
        key = (path, stat.st_mtime_ns, stat.st_size)
        summary = _SUMMARIES.get(key)
        if summary is None:
            if stat.st_size > _MAX_BYTES:
                return None
            data = path.read_bytes()
            tree = file_tree(str(path), stat, data)
            summary = _SUMMARIES[key] = summarize(path, data, tree)
    except OSError:
        return None
    record_read(path, summary.digest)
    return summary


def _definition(module_path: Path, name: str, depth: int = 0) -> tuple[ModuleSummary, str] | None:
    """The module summary that defines `name` as imported from `module_path`, following
    re-exports (`from .resnet import *` in a package's __init__)."""
    if depth > _MAX_DEPTH:
        return None
    summary = load(module_path)
    if summary is None:
        return None
    if name in summary.classes or name in summary.functions:
        return summary, name
    if name in summary.imports:
        module, original, level = summary.imports[name]
        target = resolve_module(module_path, module, level)
        return _definition(target, original, depth + 1) if target else None
    for module, level in summary.star_imports:
        target = resolve_module(module_path, module, level)
        found = _definition(target, name, depth + 1) if target else None
        if found is not None:
            return found
    return None


_IMPORTED = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", re.MULTILINE)


@dataclass(frozen=True)
class _Script:
    """One file of a folder, as far as "who drives whom" goes."""

    path: Path
    digest: str
    imports: frozenset[str]  # top-level module names it imports (`train` for `from train import`)
    text: str


# Keyed by the folder and its modification time (a file added or removed is seen).
_FOLDERS: dict[tuple[Path, int], list[_Script]] = {}


def _folder_scripts(folder: Path) -> list[_Script]:
    """Every .py file of `folder` with what it imports (read once per process)."""
    try:
        key = (folder, folder.stat().st_mtime_ns)
    except OSError:
        return []
    if key not in _FOLDERS:
        scripts = []
        try:
            paths = sorted(folder.glob("*.py"))
        except OSError:
            paths = []
        for path in paths:
            try:
                data = path.read_bytes() if path.stat().st_size <= _MAX_BYTES else b""
            except OSError:
                continue
            text = data.decode("utf-8", "replace")
            imports = frozenset(
                (a or b).split(".")[0] for a, b in _IMPORTED.findall(text) if a or b
            )
            scripts.append(_Script(path, content_digest(data), imports, text))
        _FOLDERS[key] = scripts
    return _FOLDERS[key]


def sibling_importers_text(linted: Path) -> list[str]:
    """The texts of the scripts in the linted file's folder that import it
    (`from train import ...`, `import train`): the scripts that drive a module. Those scripts
    are recorded as read (a sibling that starts importing the file later is not noticed by
    the results cache)."""
    linted = Path(os.path.abspath(linted))
    found = []
    for script in _folder_scripts(linted.parent):
        if script.path != linted and linted.stem in script.imports:
            record_read(script.path, script.digest)
            found.append(script.text)
    return found


# ----- what the rules ask ------------------------------------------------------------------------
def own_to_classes(rule: Rule) -> list[str]:
    """Classes of the project whose `.to()` takes no `non_blocking`, defined in the linted file
    or in a local module it imports (also one import further: a batch class is often defined
    in a utility module that the data module imports). A batch not proven to be tensors may be
    one of them."""
    path = Path(rule.context.path)
    found = (
        [
            n.name
            for n in ast.walk(ast.parse(rule.facts.source))
            if isinstance(n, ast.ClassDef) and _own_to(n)
        ]
        if "def to(" in rule.facts.source
        else []
    )
    pending = [(path, module, level) for module, level in _linted_imports(rule.context.module)]
    seen: set[Path] = set()
    for depth in range(2):
        later = []
        for origin, module, level in pending:
            target = resolve_module(origin, module, level)
            if target is None or target in seen:
                continue
            seen.add(target)
            summary = load(target)
            if summary is None:
                continue
            found.extend(sorted(summary.own_to))
            if depth == 0:
                later.extend((target, m, lv) for m, lv in summary.imported_modules)
        pending = later
    return found


def _linted_imports(module: cst.Module) -> list[tuple[str, int]]:
    """(module, level) of the linted file's top-level imports (`import util.misc as utils`,
    `from .datasets import build`)."""
    out: list[tuple[str, int]] = []
    for stmt in module.body:
        for small in _import_froms(stmt):
            source = (dotted(small.module) if small.module else "") or ""
            out.append((source, len(small.relative)))
            if not isinstance(small.names, cst.ImportStar):  # `from util import misc`
                prefix = f"{source}." if source else ""
                out.extend(
                    (prefix + (dotted(a.name) or ""), len(small.relative)) for a in small.names
                )
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import):
                    out.extend((dotted(a.name) or "", 0) for a in small.names)
    return out


@dataclass(frozen=True)
class LocalDefinition:
    """A class or function of the user's project that a name of the linted file refers to."""

    name: str
    conv: bool  # built from convolution layers (any dimension)
    conv2d: bool  # built from 2-D convolutions
    views: bool  # its code flattens with `.view(n, -1)` (see AO606)
    optimizer: bool  # a function that builds a torch.optim optimizer (yolov5's smart_optimizer)


def _optimizer_by_name(node: ast.Call) -> bool:
    """`getattr(optim, type)` / `getattr(torch.optim, name)`: a torch.optim class by name."""
    return (
        isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) == 2
        and _leaf(node.args[0]) == "optim"
    )


def imported_constant(rule: Rule, expr: cst.BaseExpression) -> tuple[object, Path] | None:
    """`CFG.num_workers` where `import config as CFG` names a module of the project whose top
    level binds `num_workers = 0` once (OpenAI-CLIP's config.py): (the literal, its module).
    None for anything else (a value computed, bound twice, or not the project's)."""
    if not (isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name)):
        return None
    alias, attr = expr.value.value, expr.attr.value
    for _, imported in top_level_imports(rule.context.module):
        bound = code_of(imported.asname.name) if imported.asname is not None else None
        name = dotted(imported.name) or ""
        if (bound or name) != alias:
            continue
        target = resolve_module(rule.context.path, name, 0)
        if target is None or target.name == "__init__.py":
            return None
        try:
            data = target.read_bytes()
            tree = file_tree(str(target), target.stat(), data)
        except OSError:
            return None
        if tree is None:
            return None
        values = [
            stmt.value
            for stmt in tree.body
            if isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == attr for t in stmt.targets)
        ]
        if len(values) == 1 and isinstance(values[0], ast.Constant):
            return values[0].value, target
        return None
    return None


def argparse_default(rule: Rule, expr: cst.BaseExpression) -> tuple[object, Path] | None:
    """`opt.threads` (also `int(opt.threads)`, `self.args.num_workers`) where the file, or a
    module of the project it imports (else one that imports it), declares
    `add_argument("--threads", default=0, ...)`:
    (the default, the module declaring it). None where the option is not found, or is declared
    more than once with other defaults (pytorch-SRResNet's `--threads`, lxmert's param.py)."""
    if isinstance(expr, cst.Call) and is_name(expr.func, "int") and len(expr.args) == 1:
        expr = expr.args[0].value
    if not (isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name | cst.Attribute)):
        return None
    here = Path(os.path.abspath(rule.context.path))
    return _option_default(here, rule.context.source, expr.attr.value)


def _option_default(here: Path, source: str, dest: str) -> tuple[object, Path] | None:
    """The literal default of the command-line option `dest` as the module `here` (its text
    `source`) sees it: declared there, in a module it imports, else in one importing it."""
    own = parse_tree(source) if "add_argument" in source else None
    found = [(value, here) for value in _argparse_defaults(own).get(dest, ())]
    paths = list(imported_paths(here, source))
    for path in list(paths):  # a package re-exporting its parser (`from mace import tools`)
        if path.name == "__init__.py":
            paths += [p for p in imported_paths(path, read_text(path)) if p not in paths]
    for path in paths:
        found += [(value, path) for value in _argparse_defaults(_module_tree(path)).get(dest, ())]
    if not found:  # the driver that imports this module parses the options (SCINet's run_ETTh.py)
        for path in importers_of(here):
            found += [
                (value, path) for value in _argparse_defaults(_module_tree(path)).get(dest, ())
            ]
    values = {value for value, _ in found}
    return found[0] if len(values) == 1 else None


def passed_option_default(
    rule: Rule, node: cst.CSTNode, expr: cst.BaseExpression
) -> tuple[object, str, list[str]] | None:
    """`num_workers=num_workers` inside `def retrieve_dataloaders(batch_size, num_workers)`
    whose every call in the project passes a command-line option there (egnn's
    `retrieve_dataloaders(args.batch_size, args.num_workers)`, `--num_workers` declared with
    `default=0`): (that default, the option as passed, where it is passed: "main.py:58").
    None where a call passes anything else, the options' defaults differ, or no call is found."""
    if not isinstance(expr, cst.Name):
        return None
    calls = rule.context.program.callers_pass(node, expr.value)
    if calls is None:
        return None
    defaults: set[object] = set()
    for path, _, passed in calls:
        if len(passed) > 2:  # a yacs key: SimpleView's `cfg.DATALOADER.num_workers`
            found = yacs_default(path, cst.parse_expression(".".join(passed)))
        elif len(passed) == 2:  # `args.num_workers`, not a local name
            found = _option_default(Path(path), read_text(Path(path)), passed[1])
        else:
            return None
        if found is None:
            return None
        defaults.add(found[0])
    if len(defaults) != 1:
        return None
    here = os.path.dirname(os.path.abspath(rule.context.path))
    where = [f"{os.path.relpath(path, here)}:{line}" for path, line, _ in calls]
    return defaults.pop(), ".".join(calls[0][2]), where


def unpassed_default(
    rule: Rule, node: cst.CSTNode, expr: cst.BaseExpression
) -> tuple[object, str, list[str]] | None:
    """`num_workers=num_workers` inside `def get_loader(..., num_workers=0)` whose every call
    in the project leaves the parameter out (autovc): (the default, the function's name, where
    it is called: "main.py:16"). None where the name is no such parameter with a literal
    default, or some call passes it, or no call is found."""
    if not isinstance(expr, cst.Name):
        return None
    func = rule.facts.enclosing_scope(node)
    if not isinstance(func, cst.FunctionDef):
        return None
    params = [*func.params.params, *func.params.kwonly_params]
    param = next((p for p in params if p.name.value == expr.value), None)
    if param is None or param.default is None:
        return None
    try:
        default = ast.literal_eval(code_of(param.default))
    except (ValueError, SyntaxError):
        return None
    calls = rule.context.program.callers_leave_out(node, expr.value)
    if calls is None:
        return None
    here = os.path.dirname(os.path.abspath(rule.context.path))
    where = [f"{os.path.relpath(path, here)}:{line}" for path, line in calls]
    return default, func.name.value, where


def _module_tree(path: Path) -> ast.Module | None:
    """The tree of a project module that declares command-line options, else None."""
    try:
        data = path.read_bytes()
        tree = file_tree(str(path), path.stat(), data) if b"add_argument" in data else None
    except OSError:
        return None
    record_read(str(path), content_digest(data))  # a changed default changes the finding
    return tree


def _argparse_defaults(tree: ast.Module | None) -> dict[str, list[object]]:
    """Each option's destination -> the literal defaults `add_argument(...)` calls give it."""
    found: dict[str, list[object]] = {}
    nodes = list(ast.walk(tree)) if tree is not None else []
    aliases = {  # `arg = parser.add_argument` (dfdc_deepfake_challenge), then `arg("--gpu", ...)`
        t.id
        for n in nodes
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.Attribute)
        and n.value.attr == "add_argument"
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    for node in nodes:
        if not (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument")
                or (isinstance(node.func, ast.Name) and node.func.id in aliases)
            )
        ):
            continue
        flags = [
            a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
        ]
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        named = keywords.get("dest")
        long = [f for f in flags if f.startswith("--")]
        if isinstance(named, ast.Constant) and isinstance(named.value, str):
            dest = named.value
        elif long or flags:
            dest = (long or flags)[0].lstrip("-").replace("-", "_")
        else:
            continue
        default = keywords.get("default")
        found.setdefault(dest, []).append(
            default.value if isinstance(default, ast.Constant) else object()
        )
    return found


def module_attribute_definition(rule: Rule, func: cst.BaseExpression) -> LocalDefinition | None:
    """What `lib.make_optimizer` is when `lib` is a module or package of the project the
    linted file imports (`import lib`; a package re-exporting its modules' names)."""
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
        return None
    alias = func.value.value
    module: tuple[str, int] | None = None
    for _, imported in top_level_imports(rule.context.module):
        if imported.asname is None and dotted(imported.name) == alias:
            module = (alias, 0)
    if module is None and alias in (table := _import_table(rule.context.module)).names:
        source, original, level = table.names[alias]  # `from tools import builder` (PoinTr)
        module = (f"{source}.{original}" if source else original, level)
    target = resolve_module(rule.context.path, *module) if module is not None else None
    found = _definition(target, func.attr.value) if target else None
    return _describe(func.attr.value, *found) if found is not None else None


def local_definition(rule: Rule, name: str) -> LocalDefinition | None:
    """What `name` (imported into the linted file from a local module) is, or None when it is
    not imported from the project (or cannot be found)."""
    # Rules ask it call after call for the same few names: answered once per linted tree (the
    # modules it read are recorded for this file by that first answer).
    table = _import_table(rule.context.module)
    key = (str(rule.context.path), name)
    if key not in table.definitions:
        table.definitions[key] = _local_definition(rule.context.path, table, name)
    return table.definitions[key]


def _local_definition(path: Path, table: _ImportTable, name: str) -> LocalDefinition | None:
    for module, original, level in table.imports_of(name):
        target = resolve_module(path, module, level)
        found = _definition(target, original) if target else None
        if found is not None:
            return _describe(name, *found)
    return None


def module_table_definition(rule: Rule, func: cst.BaseExpression) -> LocalDefinition | None:
    """What `resnet.__dict__[args.arch]` (or `getattr(resnet, args.arch)`) builds when `resnet` is a module of the project the
    linted file imports (`import resnet`, `from models import resnet`): its definitions weighed
    together (vicreg's backbone). None for anything else."""
    if (
        isinstance(func, cst.Call)
        and m.matches(func.func, m.Name("getattr"))
        and len(func.args) == 2
        and isinstance(func.args[0].value, cst.Name)
    ):
        alias = func.args[0].value.value  # `getattr(models, opt.model)` (pytorch-book)
    elif (
        isinstance(func, cst.Subscript)
        and isinstance(func.value, cst.Attribute)
        and func.value.attr.value == "__dict__"
        and isinstance(func.value.value, cst.Name)
    ):
        alias = func.value.value.value
    else:
        return None
    return _imported_module_definition(rule, alias)


def module_argument_definition(rule: Rule, call: cst.Call) -> LocalDefinition | None:
    """`config.init_obj("arch", module_arch)` after `import model.model as module_arch`
    (pytorch-template): a call handed a module of the project picks one of its definitions by
    name; they are weighed together, as for `getattr(module_arch, name)`."""
    for a in call.args:
        if isinstance(a.value, cst.Name):
            found = _imported_module_definition(rule, a.value.value, modules_only=True)
            if found is not None:
                return found
    return None


def evaluated_path_definition(rule: Rule, call: cst.Call) -> LocalDefinition | None:
    """`eval("models." + cfg.MODEL.NAME + ".get_pose_net")(cfg)` (HRNet and the pose-estimation
    code copied from it): the function of that name in every module of the package, weighed
    together."""
    evaluated = call.func
    if not (
        isinstance(evaluated, cst.Call)
        and m.matches(evaluated.func, m.Name("eval"))
        and len(evaluated.args) == 1
    ):
        return None
    parts = _concatenated_strings(evaluated.args[0].value)
    if parts is None or len(parts) != 3 or parts[1] is not None:
        return None
    head, _, tail = parts
    if not (head and tail and head.endswith(".") and tail.startswith(".")):
        return None
    package, name = head.rstrip("."), tail.lstrip(".")
    if not (package.replace(".", "").isidentifier() and name.isidentifier()):
        return None
    if package.split(".")[0] not in rule.facts.imported_names:
        return None  # the script imports the package it names (`import models`)
    inits = [
        p
        for p in (
            resolve_module(rule.context.path, package),
            *modules_named(rule.context.path, package),
        )
        if p is not None and p.name == "__init__.py"
    ]
    if not inits:
        return None
    init = inits[0]  # found from the script's folders, else the shallowest (`_init_paths`)
    described = [
        _describe(name, summary, name)
        for path in sorted(init.parent.glob("*.py"))
        if (summary := load(path)) is not None and name in summary.functions
    ]
    return any_of(name, described)


def registered_models_definition(rule: Rule) -> LocalDefinition | None:
    """What `timm.create_model(args.model)` builds in a script that imports modules of the
    project registering models with timm's `@register_model` (ConvNeXt's `import
    models.convnext`): every registered model of those modules, weighed together."""
    described = []
    for _, imported in top_level_imports(rule.context.module):
        name = dotted(imported.name)
        path = resolve_module(rule.context.path, name) if name else None
        summary = load(path) if path is not None else None
        if summary is not None and _REGISTERED in summary.functions:
            described.append(_describe(_REGISTERED, summary, _REGISTERED))
    return any_of(_REGISTERED, described)


def any_of(name: str, described: list[LocalDefinition]) -> LocalDefinition | None:
    """One of `described`, picked at run time: convolutional when every one is, flattening
    when any one does."""
    if not described:
        return None
    return LocalDefinition(
        name,
        conv=all(d.conv for d in described),
        conv2d=all(d.conv2d for d in described),
        views=any(d.views for d in described),
        optimizer=False,
    )


def _concatenated_strings(expr: cst.BaseExpression) -> list[str | None] | None:
    """`"a." + x + ".b"` as ["a.", None, ".b"] (None for each part that is not a string)."""
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        left = _concatenated_strings(expr.left)
        right = _concatenated_strings(expr.right)
        return None if left is None or right is None else left + right
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return [value] if isinstance(value, str) else None
    return [None]


def _imported_module_definition(
    rule: Rule, alias: str, modules_only: bool = False
) -> LocalDefinition | None:
    """The definitions of the project module the linted file imports as `alias`, weighed
    together (`modules_only`: not a package re-exporting its models)."""
    module: tuple[str, int] | None = None
    for _, imported in top_level_imports(rule.context.module):
        bound = imported.asname.name if imported.asname is not None else None
        name = dotted(imported.name) or ""
        if (code_of(bound) if bound is not None else name.split(".")[0]) == alias:
            module = (name if bound is not None else alias, 0)
    if module is None and alias in (table := _import_table(rule.context.module)).names:
        source, original, level = table.names[alias]
        module = (f"{source}.{original}" if source else original, level)
    path = resolve_module(rule.context.path, *module) if module is not None else None
    summary = load(path) if path is not None else None
    if summary is None:
        return None
    if (
        path is not None
        and not summary.classes
        and not summary.functions
        and (summary.imports or summary.star_imports)
    ):
        return None if modules_only else _re_exports(alias, path, summary)
    return _describe(alias, summary, _WHOLE_MODULE)


def _re_exports(alias: str, path: Path, summary: ModuleSummary) -> LocalDefinition | None:
    """A package whose `__init__` only re-exports its models (`from .resnet34 import
    ResNet34`): what they are, weighed together."""
    hits = [(name, _definition(path, name)) for name in summary.imports]
    described = [_describe(name, *hit) for name, hit in hits if hit is not None]
    zoo = [_describe(alias, s, _WHOLE_MODULE) for s in _star_model_modules(path, summary)]
    described += zoo
    if not described:
        return None
    # Named re-exports: every one a Conv2d network. A star-imported zoo (mixup-cifar10's
    # vgg, lenet, resnet, ...): most of its modules, LeNet's dense layers outweighing its convs.
    conv2d = (
        2 * sum(d.conv2d for d in described) > len(described)
        if zoo
        else all(d.conv2d for d in described)
    )
    return LocalDefinition(
        alias,
        conv=any(d.conv for d in described),
        conv2d=conv2d,
        views=any(d.views for d in described),
        optimizer=False,
    )


def _star_model_modules(path: Path, summary: ModuleSummary) -> list[ModuleSummary]:
    """The modules a package's `__init__` star-imports (`from .vgg import *`, network-slimming)
    that hold models to pick, not the building blocks the others import
    (`channel_selection`, which preresnet and densenet use)."""
    found: list[ModuleSummary] = []
    for module, level in summary.star_imports:
        target = resolve_module(path, module, level)
        star = load(target) if target is not None else None
        if star is not None and (star.classes or star.functions):
            found.append(star)
    used = {
        resolved
        for star in found
        for module, _name, level in star.imports.values()
        if (resolved := resolve_module(star.path, module, level)) is not None
    }
    return [s for s in found if s.path not in used]


def definition_at(path: Path, name: str) -> LocalDefinition | None:
    """What the class or function `name` of the module at `path` is (a call the program model
    resolved: `model.resnet50(...)` through `from retinanet import model`)."""
    summary = load(path)
    if summary is None or (name not in summary.classes and name not in summary.functions):
        return None
    return _describe(name, summary, name)


def _describe(name: str, summary: ModuleSummary, defined: str) -> LocalDefinition:
    closure = _cross_module_closure(summary, defined)
    return LocalDefinition(
        name,
        conv=bool(closure & {"conv"}),
        # a 2-D network with 3-D convolutions too (PSMNet's cost volume) is not a channels_last
        # candidate: `model.to(memory_format=torch.channels_last)` raises on its 5-D weights
        conv2d=bool(closure & {"conv2d"})
        and _convolutions_dominate(summary, defined)
        and not _builds_3d_convolutions(summary, defined),
        views=bool(closure & {"views"}),
        optimizer=defined in summary.optimizers,
    )


def _cross_module_closure(
    summary: ModuleSummary, name: str, seen: set[tuple[Path, str]] | None = None
) -> set[str]:
    """Which of conv/conv2d/views hold for `name`, following the names it uses, in its module
    and into the modules they are imported from (a model made of blocks defined elsewhere)."""
    seen = set() if seen is None else seen
    seen.add((summary.path, name))
    found = {
        kind
        for kind, names in (("conv", summary.conv), ("conv2d", summary.conv2d))
        if name in names
    }
    if name in summary.views:
        found.add("views")
    for other in sorted(_uses(summary, name)):
        if {"conv", "conv2d", "views"} <= found or len(seen) > _MAX_VISITS:
            break
        target = _used_definition(summary, other)
        if target is None or (target[0].path, target[1]) in seen:
            continue
        if "." in other and not _convolutions_dominate(*target):
            # `lora.MergedLinear` (a Linear computed with F.conv1d), FastSpeech2's Conv1d
            # blocks: a module's attribute counts as a convolutional part only when 2-D
            # convolutions are most of its layers (DRIT's `networks.Dis`)
            continue
        found |= _cross_module_closure(target[0], target[1], seen)
    return found


def _builds_3d_convolutions(
    summary: ModuleSummary, name: str, seen: set[tuple[Path, str]] | None = None
) -> bool:
    """`name`, or a definition it uses (in its module or another), builds a 3-D convolution;
    not a helper that builds one dimension or another (guided-diffusion's `conv_nd(dims,
    ...)`, which also builds Conv2d)."""
    seen = set() if seen is None else seen
    seen.add((summary.path, name))
    if name in summary.conv3d and not (name in summary.functions and name in summary.conv2d):
        return True
    for other in sorted(_uses(summary, name)):
        if len(seen) > _MAX_VISITS:
            return False
        target = _used_definition(summary, other)
        if (
            target is not None
            and (target[0].path, target[1]) not in seen
            and _builds_3d_convolutions(target[0], target[1], seen)
        ):
            return True
    return False


def _in_module(func: ast.Attribute, summary: ModuleSummary) -> str | None:
    """`"module.Name"` for `module.Name` where `module` is bound by an import of the module
    so far (`import networks`, `from . import networks`); None otherwise."""
    if not isinstance(func.value, ast.Name):
        return None
    head = func.value.id
    if head in summary.module_aliases or head in summary.imports:
        return f"{head}.{func.attr}"
    return None


def _uses(summary: ModuleSummary, name: str) -> set[str]:
    """The names the definition `name` uses; for a whole module (`_WHOLE_MODULE`), its
    definitions."""
    if name == _WHOLE_MODULE:
        return set(summary.classes) | set(summary.functions)
    return summary.classes.get(name) or summary.functions.get(name) or set()


def _used_definition(summary: ModuleSummary, other: str) -> tuple[ModuleSummary, str] | None:
    """Where a name a definition of `summary` uses is defined: in the same module, through its
    imports (star imports too), in a module it imports whole (`networks.Dis`), or a whole
    module used as a table of builders (`resnet.__dict__[arch]`)."""
    if other in summary.classes or other in summary.functions:
        return summary, other
    if other in summary.imports:
        module, original, level = summary.imports[other]
        path = resolve_module(summary.path, module, level)
        return _definition(path, original) if path else None
    if other.endswith(".__dict__"):
        return _whole_module(summary, other.removesuffix(".__dict__"))
    head, _, attr = other.partition(".")
    if attr:  # `networks.Dis`: a definition of the module bound to `networks`
        module = _whole_module(summary, head)
        return _definition(module[0].path, attr) if module is not None else None
    if summary.star_imports and other not in _BUILTIN_NAMES:
        return _definition(summary.path, other)
    return None


def _whole_module(summary: ModuleSummary, alias: str) -> tuple[ModuleSummary, str] | None:
    """The module bound to `alias` in `summary`'s module (`import resnet`, `from . import
    resnet`), as a whole."""
    if alias in summary.module_aliases:
        path = resolve_module(summary.path, *summary.module_aliases[alias])
    elif alias in summary.imports:
        module, original, level = summary.imports[alias]
        path = resolve_module(summary.path, f"{module}.{original}" if module else original, level)
    else:
        return None
    found = load(path) if path else None
    return (found, _WHOLE_MODULE) if found is not None else None


def _convolutions_dominate(summary: ModuleSummary, name: str) -> bool:
    """`name` builds at least as many 2-D convolution layers as dense (or 1-D/3-D convolution)
    ones, counting every instance it makes of its blocks (a U-Net's `DoubleConv` in each of
    its six stages), in its module and the modules they come from: a ResNet, a ConvNeXt or a
    diffusion U-Net with a few attention blocks, not a vision transformer whose only Conv2d is the patch embedding, nor a
    transformer holding an optional `nn.Conv2d(...) if talking_heads else None`, nor
    FloWaveNet's Conv1d WaveNet beside one 1-channel ConvTranspose2d upsampler (facts by
    weight, not by presence)."""
    convs, dense = _layer_weight(summary, name, {}, 0)
    return convs > 0 and convs >= dense


def _layer_weight(
    summary: ModuleSummary,
    name: str,
    memo: dict[tuple[Path, str], tuple[int, int]],
    depth: int,
) -> tuple[int, int]:
    """(convolution, dense) layers `name` builds, its blocks' counted once per use."""
    key = (summary.path, name)
    if key in memo:
        return memo[key]
    memo[key] = (0, 0)  # a cycle adds nothing
    convs, dense = summary.layers.get(name, (0, 0))
    uses = (
        dict.fromkeys(_uses(summary, name), 1)
        if name == _WHOLE_MODULE
        else summary.uses.get(name, {})
    )
    if depth < _MAX_DEPTH and len(memo) <= _MAX_VISITS:
        for other, times in sorted(uses.items()):
            if other == name:
                continue
            target = _used_definition(summary, other)
            if target is not None:
                c, d = _layer_weight(target[0], target[1], memo, depth + 1)
                convs, dense = convs + times * c, dense + times * d
    memo[key] = (convs, dense)
    return convs, dense


@dataclass
class _ImportTable:
    """The linted file's top-level `from ... import` statements."""

    module: cst.Module
    names: dict[str, tuple[str, str, int]]  # bound name -> (module, imported name, level)
    stars: list[tuple[str, int]]  # `from m import *`: (module, level)
    # (linted path, name) -> `local_definition`'s answer for this tree
    definitions: dict[tuple[str, str], LocalDefinition | None] = field(default_factory=dict)

    def imports_of(self, name: str) -> list[tuple[str, str, int]]:
        """Where the linted file may import `name` from: `from m import name [as alias]`, else
        any `from m import *` (tried in order)."""
        if name in self.names:
            return [self.names[name]]
        return [(module, name, level) for module, level in self.stars]


_TABLES: dict[int, _ImportTable] = {}  # id(linted module) -> its table (the last few files)


def _import_table(module: cst.Module) -> _ImportTable:
    table = _TABLES.get(id(module))
    if table is not None and table.module is module:
        return table
    names: dict[str, tuple[str, str, int]] = {}
    stars: list[tuple[str, int]] = []
    for stmt in module.body:
        for small in _import_froms(stmt):
            source = (dotted(small.module) if small.module is not None else "") or ""
            level = len(small.relative)
            if isinstance(small.names, cst.ImportStar):
                stars.append((source, level))
                continue
            for alias in small.names:
                bound = alias.asname.name if alias.asname is not None else alias.name
                if isinstance(bound, cst.Name):
                    names[bound.value] = (source, dotted(alias.name) or bound.value, level)
    if len(_TABLES) > 8:
        _TABLES.clear()
    table = _TABLES[id(module)] = _ImportTable(module, names, stars)
    return table


def _import_froms(stmt: cst.CSTNode) -> Iterator[cst.ImportFrom]:
    """`from ... import ...` statements at the top level, also inside `try:`/`if:` blocks."""
    if isinstance(stmt, cst.SimpleStatementLine):
        yield from (s for s in stmt.body if isinstance(s, cst.ImportFrom))
    elif isinstance(stmt, cst.Try | cst.If):
        for inner in stmt.body.body:
            yield from _import_froms(inner)
