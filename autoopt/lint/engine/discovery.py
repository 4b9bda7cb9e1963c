"""Which files to lint: `.py` and `.ipynb` under the given paths, minus the excludes.

Directories are walked in name order (so runs are reproducible), symlinked folders are followed
once (a link back up the tree cannot loop: each real folder is visited once), and folders that
never hold user code are skipped (`.git`, `.venv`, `__pycache__`, `build`, ...). Excludes are
gitignore-style patterns relative to the project root. A file named on the command line is
linted even if an exclude matches it, unless `force_exclude` (pre-commit passes every staged
file by name, so its hook sets it). Nothing here opens a file: reading is the runner's job.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from autoopt.lint.engine.results import FileError

SUFFIXES = (".py", ".pyi", ".ipynb")
DEFAULT_EXCLUDES = (
    ".autoopt_cache",
    ".bzr",
    ".direnv",
    ".eggs",
    ".git",
    ".hg",
    ".ipynb_checkpoints",
    ".mypy_cache",
    ".nox",
    ".pytest_cache",
    ".ruff_cache",
    ".svn",
    ".tox",
    ".venv",
    "__pycache__",
    "__pypackages__",
    "_build",
    "buck-out",
    "build",
    "dist",
    "node_modules",
    "site-packages",
    "venv",
)


@dataclass
class Discovered:
    """The files to lint (in a stable order) and the paths that could not be walked;
    `followed`: modules linted too because a file named on the command line runs the training
    they hold or builds its loaders there (`follow_training`), each with the file it was
    followed from."""

    files: list[Path] = field(default_factory=list)
    errors: list[tuple[str, FileError]] = field(default_factory=list)
    followed: list[tuple[Path, Path]] = field(default_factory=list)
    # the followed modules that build a loader the training iterates (the rest hold training)
    loader_builders: set[Path] = field(default_factory=set)
    # ... and those that define a model it trains (checked for the model rules only)
    model_definers: set[Path] = field(default_factory=set)
    # ... and those that build the optimizer it steps (checked for its options only)
    optimizer_builders: set[Path] = field(default_factory=set)
    evaluators: set[Path] = field(default_factory=set)  # modules that evaluate a trained model
    option_parsers: set[Path] = field(default_factory=set)  # modules declaring its options
    step_helpers: set[Path] = field(default_factory=set)  # functions its training step runs
    # ... and the loader factories of a script with its own loop (the loader's options only)
    loader_option_builders: set[Path] = field(default_factory=set)
    # the lines of the functions of a loader module that build the loaders the training
    # iterates: the loader rules report there only (`followed.loader_function_lines`)
    loader_lines: dict[Path, list[tuple[int, int]]] = field(default_factory=dict)
    # the lines a model module's forward methods run: `followed.FORWARD_RULES` report there
    forward_lines: dict[Path, list[tuple[int, int]]] = field(default_factory=dict)


def is_notebook(path: Path | str) -> bool:
    return str(path).endswith(".ipynb")


def display_path(path: Path | str) -> str:
    """How a path is shown: relative to the current folder when inside it, else absolute."""
    absolute = os.path.abspath(path)
    cwd = os.getcwd()
    if absolute == cwd or absolute.startswith(cwd.rstrip(os.sep) + os.sep):
        return os.path.relpath(absolute, cwd)
    return absolute


class Excluder:
    """Gitignore-style matching of paths against the default and configured excludes."""

    def __init__(self, root: Path, patterns: Sequence[str] = ()) -> None:
        self.root = Path(os.path.abspath(root))
        self.spec = pathspec.GitIgnoreSpec.from_lines([*DEFAULT_EXCLUDES, *patterns])

    def _relative(self, path: Path | str) -> str:
        absolute = os.path.abspath(path)
        try:
            rel = os.path.relpath(absolute, self.root)
        except ValueError:  # another drive
            rel = absolute
        if rel.startswith(".."):
            rel = absolute.lstrip(os.sep)  # outside the root: only unanchored patterns can match
        return rel.replace(os.sep, "/")

    def excluded(self, path: Path | str, is_dir: bool) -> bool:
        rel = self._relative(path)
        if rel in (".", ""):
            return False
        return self.spec.match_file(rel + "/" if is_dir else rel)


def _loop_error(path: str, exc: OSError) -> FileError:
    if exc.errno == errno.ELOOP:
        return FileError("symbolic link loop (too many levels of symbolic links)", kind="read")
    if exc.errno == errno.ENOENT:
        return FileError("broken symbolic link (its target does not exist)", kind="read")
    return FileError(f"cannot access: {exc.strerror or exc}", kind="read")


def discover(
    paths: Sequence[Path | str],
    root: Path,
    exclude: Sequence[str] = (),
    force_exclude: bool = False,
) -> Discovered:
    """Files to lint under `paths` (default `.`), see the module docs."""
    excluder = Excluder(root, exclude)
    out = Discovered()
    seen_files: set[str] = set()
    seen_dirs: set[tuple[int, int]] = set()

    def add(path: str) -> None:
        key = os.path.abspath(path)
        if key not in seen_files:
            seen_files.add(key)
            out.files.append(Path(path))

    def walk(folder: str) -> None:
        try:
            info = os.stat(folder)
        except OSError as exc:
            out.errors.append((display_path(folder), _loop_error(folder, exc)))
            return
        if (info.st_dev, info.st_ino) in seen_dirs:
            return  # already walked (a symlink back up the tree, or a second name)
        seen_dirs.add((info.st_dev, info.st_ino))
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            out.errors.append(
                (
                    display_path(folder),
                    FileError(f"cannot list folder: {exc.strerror}", kind="read"),
                )
            )
            return
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # follows symlinks
                is_file = not is_dir and entry.is_file()
            except OSError:  # pragma: no cover - scandir swallows most of these itself
                is_dir = is_file = False
            if is_dir:
                if not excluder.excluded(entry.path, is_dir=True):
                    walk(entry.path)
            elif is_file:
                if entry.name.endswith(SUFFIXES) and not excluder.excluded(entry.path, False):
                    add(entry.path)
            elif entry.is_symlink() and entry.name.endswith(SUFFIXES):
                # A link that leads nowhere (or in a circle): say so rather than skip silently.
                try:
                    os.stat(entry.path)
                except OSError as exc:
                    if not excluder.excluded(entry.path, False):
                        out.errors.append((display_path(entry.path), _loop_error(entry.path, exc)))

    for raw in paths or (".",):
        path = str(raw)
        if os.path.isdir(path):
            if force_exclude and excluder.excluded(path, is_dir=True):
                continue
            walk(path)
        elif os.path.lexists(path) or os.path.exists(path):
            if force_exclude and excluder.excluded(path, is_dir=False):
                continue
            try:
                os.stat(path)
            except OSError as exc:
                out.errors.append((display_path(path), _loop_error(path, exc)))
                continue
            add(path)  # named explicitly: linted whatever its suffix
        else:
            out.errors.append(
                (display_path(path), FileError("no such file or folder", kind="read"))
            )
    return out


def follow_training(
    out: Discovered,
    paths: Sequence[Path | str],
    root: Path,
    exclude: Sequence[str] = (),
) -> None:
    """Add to `out.followed` the project modules holding the training that the files named
    in `paths` run (`program.followed`): `autoopt lint train.py` checks the `Solver` module its
    loop is in. Folders are not followed from (their modules are linted already); excluded,
    unreadable and already listed modules are left out."""
    from autoopt.lint.program.followed import (
        forward_lines,
        loader_function_lines,
        training_modules,
    )
    from autoopt.lint.program.project_files import root_of
    from autoopt.lint.tree.encoding import SourceDecodeError, decode_source

    excluder = Excluder(root, exclude)
    listed = {os.path.abspath(p) for p in out.files}
    for named in paths:
        if not os.path.isfile(named) or is_notebook(named):
            continue
        try:
            source = decode_source(Path(named).read_bytes()).text
        except (OSError, SourceDecodeError):
            continue  # the lint reports it
        reached = training_modules(Path(named), source)
        lines = {}
        if any(r.holds in ("loader", "loader options") for r in reached):
            training = [Path(named), *(r.path for r in reached if r.holds == "training")]
            lines = loader_function_lines(training, os.path.abspath(root_of(Path(named))))
        for module, holds, classes in reached:
            key = os.path.abspath(module)
            if key in listed or excluder.excluded(module, is_dir=False):
                continue
            listed.add(key)
            shown = Path(display_path(module))
            out.followed.append((shown, Path(named)))
            if key in lines and holds in ("loader", "loader options"):
                out.loader_lines[shown] = lines[key]
            if holds == "loader":
                out.loader_builders.add(shown)
            elif holds == "model":
                out.model_definers.add(shown)
                out.forward_lines[shown] = forward_lines(module, classes)
            elif holds == "optimizer":
                out.optimizer_builders.add(shown)
            elif holds == "evaluation":
                out.evaluators.add(shown)
            elif holds == "options":
                out.option_parsers.add(shown)
            elif holds == "step":
                out.step_helpers.add(shown)
            elif holds == "loader options":
                out.loader_builders.add(shown)
                out.loader_option_builders.add(shown)
