"""The project's modules read as text, never parsed: what a module imports, who imports it, and
whether it (or what it imports) trains or runs on CUDA. Cheap questions asked before the program
model parses anything: a module whose text never trains cannot hold training code.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from autoopt.lint.program.project_files import (
    import_name,
    modules_importing,
    modules_named,
    project_stamp,
    record_read,
    resolve_module,
    root_of,
)
from autoopt.lint.tree.encoding import content_digest

if TYPE_CHECKING:
    from autoopt.lint.program.index import ModuleIndex


# `import x`, `from x import y, z` anywhere in a file (the prefilter's cheap look at its imports)
_IMPORTED = re.compile(
    r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*|[\w \t,\\]*)|import[ \t]+([\w.]+(?:[ \t]+as[ \t]+\w+)?(?:[ \t]*,[ \t]*[\w.]+(?:[ \t]+as[ \t]+\w+)?)*))",
    re.MULTILINE,
)


def read_text(path: Path) -> str:
    """A project file's text (cached while the file keeps its size and modification time)."""
    try:
        stat = os.stat(path)
    except OSError:
        return ""
    text, digest = _read_unchanged(path, stat.st_mtime_ns, stat.st_size)
    if digest:  # the results cache re-lints the file when this one changes
        record_read(path, digest)
    return text


@functools.lru_cache(maxsize=4096)
def _read_unchanged(path: Path, mtime_ns: int, size: int) -> tuple[str, str]:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return "", ""
    return data.decode("utf-8", "replace"), content_digest(data)


def imported_paths(path: Path, text: str) -> tuple[Path, ...]:
    """The project's modules a file imports (`from .engine import`, `import utils.misc`,
    `from solver import Solver` run with its own PYTHONPATH)."""
    # Asked of the same module by every file that reaches it (its importers, the modules two
    # imports deep of each driver): its imports are resolved once while the project stays as
    # it is (the stamp) and from the same folder (`cwd`: where resolution stops).
    return _imported_paths(path, text, project_stamp(path), os.getcwd())


@functools.lru_cache(maxsize=1024)
def _imported_paths(path: Path, text: str, stamp: tuple[int, int], cwd: str) -> tuple[Path, ...]:
    found = []
    for relative, names, absolute in _IMPORTED.findall(text):
        # `import data_setup, engine, utils`: each module of the list
        listed = [part.split()[0] for part in absolute.split(",")] if absolute else [relative]
        for name in listed:
            level = len(name) - len(name.lstrip("."))
            target = resolve_module(path, name.lstrip("."), level)
            # run with a PYTHONPATH of its own, `import solver` may mean any module of that name
            targets = (
                [target] if target is not None else modules_named(path, name) if not level else []
            )
            if target is not None and target.name == "__init__.py":
                # `from pkg import engine` / `from . import engine`: the package's submodules too
                targets += _submodules(target.parent, names)
                if not level and names and not _binds_any(read_text(target), names):
                    # `from solver import Solver` run with src/solver on PYTHONPATH
                    # (Listen-Attend-Spell's path.sh): a package that does not bind the name
                    # leaves the module of that name that does
                    targets += [
                        m
                        for m in modules_named(path, name)
                        if m != target and _binds_any(read_text(Path(m)), names)
                    ]
            elif target is None and names:
                # a folder without `__init__.py` (a namespace package: GPT2's `from gpt2
                # import (train_model, ...)`): the modules it names
                targets += [
                    t
                    for word in _imported_names(names)
                    if (t := resolve_module(path, f"{name.lstrip('.')}.{word}", level))
                ]
            found.extend(Path(os.path.abspath(t)) for t in targets if t != path)
    for registry in set(_REGISTRY_GET.findall(text)):
        # `MODEL_REGISTRY.get(name)(opt)` (BasicSR, detectron2): the modules registering
        # classes with it are what runs (they are imported by a folder scan, not by name)
        found.extend(m for m in registering_modules(path, registry) if m != path)
    return tuple(found)


def is_registry_getter(owner: str, method: str) -> bool:
    """`MODEL_REGISTRY.get`, `registry.get_task_class`: a registry's lookup by name."""
    return method.startswith("get") and _REGISTRY_NAME.match(owner) is not None


def registering_modules(path: Path, registry: str) -> tuple[Path, ...]:
    """The project's modules that register classes with `registry` (`@registry.register...`,
    imported under that name), found once per project state."""
    key = (str(root_of(path)), project_stamp(path), registry)
    found = _REGISTERING.get(key)
    if found is None:
        if len(_REGISTERING) >= 256:
            _REGISTERING.clear()
        found = _REGISTERING[key] = tuple(
            Path(os.path.abspath(module))
            for module in modules_importing(path, registry)
            if f"{registry}.register" in read_text(module)
        )
    return found


_REGISTERING: dict[tuple[str, tuple[int, int], str], tuple[Path, ...]] = {}


# `ARCH_REGISTRY`, `META_ARCH_REGISTRY` (BasicSR, detectron2), LAVIS's `registry`
_REGISTRY_NAME = re.compile(r"^(?:[A-Z][A-Z0-9_]*REGISTRY[A-Z0-9_]*|registry)$")
# `ARCH_REGISTRY.get(`, `registry.get_model_class(`: a registry of classes the module picks from
_REGISTRY_GET = re.compile(r"\b([A-Z][A-Z0-9_]*REGISTRY[A-Z0-9_]*|registry)\.get\w*\(")


def _binds_any(text: str, names: str) -> bool:
    """`text` defines, assigns or imports one of the names a `from ... import` lists."""
    return any(
        re.search(
            rf"^[ \t]*(?:(?:class|def)[ \t]+{w}\b|{w}[ \t]*=|(?:from|import)\b.*\b{w}\b)",
            text,
            re.MULTILINE,
        )
        for w in map(re.escape, _imported_names(names))
    )


def _submodules(package: Path, names: str) -> list[Path]:
    """The modules of `package` among the names a `from package import ...` lists."""
    found = []
    for word in _imported_names(names):
        for file in (package / f"{word}.py", package / word / "__init__.py"):
            if file.is_file():
                found.append(file)
                break
    return found


def _imported_names(names: str) -> list[str]:
    """The names a `from ... import` lists, as they are in the module (`a as b` -> a)."""
    words = re.findall(r"\w+", names)
    return [w for at, w in enumerate(words) if w != "as" and (at == 0 or words[at - 1] != "as")]


def importers_of(path: Path) -> tuple[Path, ...]:
    """The project's modules that import the module at `path` (whose text names its stem)."""
    return _importers(path, project_stamp(path))


@functools.lru_cache(maxsize=256)
def _importers(path: Path, stamp: tuple[int, int]) -> tuple[Path, ...]:
    stem = import_name(path)
    return tuple(
        other
        for other in modules_importing(path, stem)
        if other != path and path in imported_paths(other, read_text(other))
    )


def an_importer_says(path: Path, says: Callable[[str], bool], depth: int = 1) -> bool:
    """`says` holds for the text of a project module that imports the module at `path`, also
    through a package `__init__` that imports it (`depth` such packages up). The same answer
    as asking each of `importers_of(path)`, but `says` is read first: a module's imports are
    resolved only when its text says it (resolving every importer's imports is the cost)."""
    stem = import_name(path)
    for other in modules_importing(path, stem):
        if other == path:
            continue
        text = read_text(other)
        package = other.name == "__init__.py" and depth > 0
        if not says(text) and not package:
            continue
        if path not in imported_paths(other, text):
            continue
        if says(text) or an_importer_says(other, says, depth - 1):
            return True
    return False


def imports_training(index: ModuleIndex, name: str) -> bool:
    """The module a name of `index` is imported from (or is) trains, by its text."""
    if name in index.module_aliases:
        module, level = index.module_aliases[name]
        candidates = [module]
    else:
        module, original, level = index.imports[name]
        candidates = [module, f"{module}.{original}" if module else original]
    for candidate in candidates:
        target = resolve_module(index.path, candidate, level)
        targets = (
            [target]
            if target is not None
            else []
            if level
            else modules_named(index.path, candidate)
        )
        if (
            target is not None
            and target.name == "__init__.py"
            and not level
            and name not in index.module_aliases
            and not _binds_any(read_text(target), original)
        ):
            # `from solver import Solver` with src/solver on PYTHONPATH (Listen-Attend-Spell):
            # the package does not bind it, the module of that name does
            targets += [m for m in modules_named(index.path, candidate) if m != target]
        if any(text_trains(Path(os.path.abspath(t)), 2) for t in targets):
            return True
    return False


def text_trains(path: Path, depth: int) -> bool:
    """The module's text calls `backward()` or zeroes gradients, or a module it imports does
    (`depth` imports deep): read as text, nothing parsed."""
    return _text_trains_at(path, depth, project_stamp(path))


@functools.lru_cache(maxsize=2048)
def _text_trains_at(path: Path, depth: int, stamp: tuple[int, int]) -> bool:
    text = read_text(path)
    if ".backward(" in text or "zero_grad(" in text:
        return True
    package = path.parent if path.name == "__init__.py" else None
    for module in imported_paths(path, text):
        # a package's `__init__.py` handing on its own modules costs no import: torchreid's
        # `import torchreid` reaches engine/image/softmax.py
        inside = package is not None and package in module.parents
        if (inside or depth > 0) and text_trains(module, depth if inside else depth - 1):
            return True
    return False


def text_uses_cuda(text: str) -> bool:
    """The text runs (or can run) on CUDA: `.cuda()`, a "cuda" device string, `torch.cuda`
    (the file-level test of `FileFacts.uses_cuda`, for any file of the project)."""
    return ".cuda(" in text or "'cuda" in text or '"cuda' in text or "torch.cuda" in text


# `cudnn.enabled = False`, or `= args.enable_cudnn` of a `store_true` flag (off unless given)
_CUDNN_OFF = re.compile(r"cudnn\.enabled\s*=\s*(?:False\b|args\.(\w+))")


def switches_cudnn_off(text: str) -> bool:
    """`text` switches cuDNN off: `torch.backends.cudnn.enabled = False`, or set from a
    command-line flag that is off by default (Rainbow's `--enable-cudnn`, `store_true`); a
    config's `CUDNN.ENABLED` (True in HRNet's defaults) is not."""
    if "cudnn.enabled" not in text:
        return False
    for match in _CUDNN_OFF.finditer(text):
        flag = match.group(1)
        if flag is None:
            return True
        spelled = flag.replace("_", "[-_]")
        if re.search(rf"""["']--{spelled}["'][^)]*store_true""", text):
            return True
    return False
