"""Where the user's project is on disk: its root, the file a local import names, and the record
of every project file a lint read (the results cache drops a file's entry when one changes).

The project root is the first folder at or above the linted file holding pyproject.toml,
setup.py, setup.cfg or .git, or the current directory if that comes first. Local modules are
found next to the linted file, then in its parent folders up to the root.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

_ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
_READ: dict[str, str] = {}


def begin_run() -> None:
    """Look at the project's files afresh: a new `autoopt lint` or `rewrite` run (in a process
    that lives on, a test suite or an editor, files change between runs; within a run they
    are read once)."""
    _STAMPS.clear()
    _RESOLVED.clear()
    _PROJECT_MODULES.clear()
    _MODULE_LISTS.clear()
    _ROOTS.clear()
    _NAMED.clear()
    _ROOT_OF.clear()


def begin_file() -> None:
    """Start recording the modules consulted for one linted file."""
    _READ.clear()


def files_read() -> dict[str, str]:
    """Path -> content hash of every local module consulted since `begin_file()`."""
    return dict(_READ)


def record_read(path: Path | str, digest: str) -> None:
    """A project file was consulted while linting the current file."""
    _READ[str(path)] = digest


def project_root(start: Path) -> Path:
    """The nearest folder at or above `start` with a project marker, or the current directory
    when it is reached first (`autoopt lint train.py` from a checkout with no marker: the user
    named the project's root by standing in it); else `start` itself (remembered for the run:
    `begin_run` forgets it)."""
    key = (str(start), os.getcwd())
    found = _ROOTS.get(key)
    if found is None:
        found = _ROOTS[key] = _find_root(start, Path(os.path.abspath(key[1])))
    return found


def root_of(file: Path | str) -> Path:
    """`project_root` of the folder holding `file`, kept per run by the plain strings (the
    program model asks it for every module it reads, tens of thousands of times a run)."""
    key = (os.fspath(file), os.getcwd())
    found = _ROOT_OF.get(key)
    if found is None:
        if len(_ROOT_OF) >= 4096:  # a process that never calls `begin_run`: kept bounded
            _ROOT_OF.clear()
        found = _ROOT_OF[key] = project_root(Path(os.path.abspath(key[0])).parent)
    return found


_ROOT_OF: dict[tuple[str, str], Path] = {}


def _find_root(start: Path, cwd: Path) -> Path:
    for folder in (start, *start.parents):
        if folder == cwd or any((folder / marker).exists() for marker in _ROOT_MARKERS):
            return folder
    return start


_ROOTS: dict[tuple[str, str], Path] = {}


def _search_folders(folder: str) -> Iterator[str]:
    """The linted file's folder, then its parents up to the project root (absolute paths, as
    strings: the search runs for every import of every module read)."""
    root = str(project_root(Path(folder)))
    inside = root if root.endswith(os.sep) else root + os.sep
    yield folder
    current = folder
    while (parent := os.path.dirname(current)) != current:
        if parent != root and not parent.startswith(inside):
            return
        yield parent
        current = parent


def resolve_module(linted: Path, module: str, level: int = 0) -> Path | None:
    """The file of local module `module` imported from `linted` (`from .x import` when level>0)."""
    cwd = os.getcwd()
    key = (os.fspath(linted), module, level, cwd)
    try:  # asked thousands of times a run: a dict of plain strings before any `Path` is made
        return _RESOLVED[key]
    except KeyError:
        pass
    if len(_RESOLVED) >= 4096:  # a process that never calls `begin_run`: kept bounded
        _RESOLVED.clear()
    folder = os.path.dirname(os.path.abspath(linted))
    found = _RESOLVED[key] = _resolve_from(folder, module, level, cwd)
    return found


_RESOLVED: dict[tuple[str, str, int, str], Path | None] = {}  # for one run (`begin_run`)


@functools.lru_cache(maxsize=4096)
def _resolve_from(folder: str, module: str, level: int, cwd: str) -> Path | None:
    """(`cwd` is part of the key: where the search stops depends on it, see `project_root`.)"""
    parts = [p for p in module.split(".") if p]
    if level:
        base = folder
        for _ in range(level - 1):
            base = os.path.dirname(base)
        folders: Iterable[str] = (base,)
    else:
        if not parts:
            return None
        folders = _search_folders(folder)
    for folder in folders:
        if not parts:
            init = os.path.join(folder, "__init__.py")
            if os.path.isfile(init):
                return Path(init)
            continue
        candidate = os.path.join(folder, *parts)
        for file in (candidate + ".py", os.path.join(candidate, "__init__.py")):
            if os.path.isfile(file):
                return Path(file)
    return None


# Folders never holding the project's own modules.
_SKIPPED_FOLDERS = frozenset(
    {".git", ".hg", ".venv", "venv", "env", "node_modules", "__pycache__", "build", "dist",
     ".tox", ".mypy_cache", ".ruff_cache", ".pytest_cache", "site-packages"}
)  # fmt: skip
_MAX_PROJECT_FILES = 20_000  # a walk that finds more stops there (the fallback is best effort)
_PROJECT_MODULES: dict[str, dict[str, list[Path]]] = {}


def import_name(path: Path) -> str:
    """The last part of the name a module is imported by: `engine` for engine.py, the
    package's folder name for its `__init__.py`."""
    return path.stem if path.name != "__init__.py" else path.parent.name


def modules_named(linted: Path, module: str) -> list[Path]:
    """Every file of the linted file's project that `import <module>` could mean on some
    `PYTHONPATH` (`from solver import Solver` run with `PYTHONPATH=src/solver`): `.../solver.py`
    and `.../solver/__init__.py` for `solver`, shallowest first. The fallback when the import
    does not resolve from the linted file's folders (`resolve_module`)."""
    key = (os.fspath(linted), module, os.getcwd())
    found = _NAMED.get(key)  # asked thousands of times a run, mostly for the same few
    if found is None:
        if len(_NAMED) >= 4096:  # a process that never calls `begin_run`: kept bounded
            _NAMED.clear()
        found = _NAMED[key] = _modules_named(linted, module)
    return list(found)


_NAMED: dict[tuple[str, str, str], list[Path]] = {}  # for one run (`begin_run`)


def _modules_named(linted: Path, module: str) -> list[Path]:
    parts = [p for p in module.split(".") if p]
    if not parts or _library(parts[0], root_of(linted)):
        return []
    table = _project_table(linted)
    tail = "/".join(parts)
    found = [
        path
        for path in table.get(parts[-1], ())
        if path.as_posix().endswith((f"/{tail}.py", f"/{tail}/__init__.py"))
    ]
    return sorted(found, key=lambda p: (len(p.parts), str(p)))


# what the rules know as libraries: never a project module, even where torch is not installed
# (a lint-only CI job) and a checkout holds a copy of its sources
_KNOWN_LIBRARIES = frozenset({"torch", "torchvision", "torchaudio", "torchtext"})


@functools.lru_cache(maxsize=1024)
def _library(name: str, root: Path) -> bool:
    """`import <name>` means the standard library or a package installed outside the project
    (a copy of torch's sources somewhere in the checkout is not what `import torch` runs)."""
    if name in _KNOWN_LIBRARIES or name in sys.stdlib_module_names:
        return True
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    places = [spec.origin] if spec.origin not in (None, "built-in", "frozen") else []
    places += list(spec.submodule_search_locations or ())
    return bool(places) and not any(Path(p).resolve().is_relative_to(root) for p in places)


_MODULE_LISTS: dict[str, list[Path]] = {}


def project_modules(linted: Path) -> list[Path]:
    """Every module of the linted file's project (at most `_MAX_PROJECT_FILES`)."""
    root = str(root_of(linted))
    found = _MODULE_LISTS.get(root)
    if found is None:
        table = _project_table(linted)
        found = _MODULE_LISTS[root] = sorted({p for paths in table.values() for p in paths})
    return found


_STAMPS: dict[str, tuple[int, int]] = {}  # project root -> its stamp, for one run


def project_stamp(path: Path) -> tuple[int, int]:
    """(number of modules, latest modification) of the project holding `path`: a cache of
    answers about the whole project is kept while this stays the same (read once per run:
    `begin_run` forgets it)."""
    root = str(root_of(path))
    found = _STAMPS.get(root)
    if found is not None:
        return found
    latest = 0
    modules = project_modules(path)
    for module in modules:
        try:
            latest = max(latest, os.stat(module).st_mtime_ns)
        except OSError:
            continue
    found = _STAMPS[root] = (len(modules), latest)
    return found


# `from a.b import c, d` / `import a.b as e, f`: the words a module's imports name
_IMPORT_LINE = re.compile(
    r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+\(?([^)#\n]*)|import[ \t]+([^#\n]+))",
    re.MULTILINE,
)
_IMPORT_INDEX: dict[str, tuple[tuple[int, int], dict[str, list[Path]]]] = {}


def modules_importing(linted: Path, word: str) -> list[Path]:
    """The project's modules whose imports name `word` (a module or a name imported from
    one): the only ones that can import the module called `word` or use it. An index built
    once per project (while its stamp holds), so a question about importers reads no file."""
    root = str(root_of(linted))
    stamp = project_stamp(linted)
    cached = _IMPORT_INDEX.get(root)
    if cached is None or cached[0] != stamp:
        index: dict[str, list[Path]] = {}
        for path in project_modules(linted):
            try:
                text = path.read_bytes().decode("utf-8", "replace")
            except OSError:
                continue
            words: set[str] = set()
            for source, names, plain in _IMPORT_LINE.findall(text):
                for part in (source, *names.split(","), *plain.split(",")):
                    words.update(w for w in re.split(r"[\s.]+", part) if w and w != "as")
            absolute = Path(os.path.abspath(path))  # one `Path` per module, not one per word
            for w in words:
                index.setdefault(w, []).append(absolute)
        cached = _IMPORT_INDEX[root] = (stamp, index)
    return cached[1].get(word, [])


def _project_table(linted: Path) -> dict[str, list[Path]]:
    root = root_of(linted)
    table = _PROJECT_MODULES.get(str(root))
    if table is None:
        table = _PROJECT_MODULES[str(root)] = _module_table(root)
    return table


def _module_table(root: Path) -> dict[str, list[Path]]:
    """Module name (file stem, or package folder for `__init__.py`) -> files, under `root`."""
    table: dict[str, list[Path]] = {}
    seen = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_FOLDERS and not d.startswith("."))
        for name in files:
            if not name.endswith(".py"):
                continue
            path = Path(folder, name)
            stem = Path(folder).name if name == "__init__.py" else name[:-3]
            table.setdefault(stem, []).append(path)
            seen += 1
        if seen > _MAX_PROJECT_FILES:
            break
    return table
