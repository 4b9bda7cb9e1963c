"""The shipped default of a yacs config key (`cfg.DATALOADER.num_workers`), read from the
project's own config module (`_C.DATALOADER.num_workers = 0` in SimpleView's configs.py) and
checked against the project's YAML files, which override it on real runs. Read with `ast`,
never imported.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from pathlib import Path

import libcst as cst

from autoopt.lint.program.index import file_tree
from autoopt.lint.program.project_files import modules_importing, record_read, root_of
from autoopt.lint.program.project_text import read_text
from autoopt.lint.tree.encoding import content_digest

_MAX_YAML_FILES = 2_000  # a walk for the project's config files stops there


def yacs_default(
    path: str | os.PathLike[str], expr: cst.BaseExpression
) -> tuple[object, Path] | None:
    """`cfg.DATALOADER.num_workers` (the config object, then at least a section and a key)
    where one module of the project sets the yacs default `_C.DATALOADER.num_workers = 0`
    once, to a literal, and no YAML file of the project sets that key to another value:
    (the default, its module). None for anything else."""
    keys: list[str] = []
    node = expr
    while isinstance(node, cst.Attribute):
        keys.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name) or len(keys) < 2:
        return None
    keys.reverse()
    here = Path(os.path.abspath(path))
    found: list[tuple[object, Path]] = []
    # the modules that declare a yacs tree import its CfgNode: the project's import index
    # (built once per project state) names them, no module is read for the question
    for module in modules_importing(here, "CfgNode"):
        found += [(value, Path(module)) for value in _defaults(Path(module)).get(tuple(keys), ())]
    if len({repr(value) for value, _ in found}) != 1:
        return None
    default = found[0][0]
    if any(value != repr_yaml(default) for value in _yaml_values(str(root_of(here)), keys[-1])):
        return None
    return found[0]


def repr_yaml(value: object) -> str:
    """A literal as a YAML file writes it (`0`, `true`, `0.5`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _defaults(path: Path) -> dict[tuple[str, ...], list[object]]:
    """Key path (after the root node) -> the literals the module assigns it at its top level
    (`_C.DATALOADER.num_workers = 0` -> ("DATALOADER", "num_workers"): [0])."""
    try:
        data = path.read_bytes()
        tree = file_tree(str(path), path.stat(), data)
    except OSError:
        return {}
    record_read(str(path), content_digest(data))  # a changed default changes the finding
    found: dict[tuple[str, ...], list[object]] = {}
    for stmt in tree.body if tree is not None else ():
        if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)):
            continue
        for target in stmt.targets:
            keys: list[str] = []
            while isinstance(target, ast.Attribute):
                keys.append(target.attr)
                target = target.value
            if isinstance(target, ast.Name) and len(keys) >= 2:
                found.setdefault(tuple(reversed(keys)), []).append(stmt.value.value)
    return found


@functools.lru_cache(maxsize=64)
def _yaml_paths(root: str) -> tuple[Path, ...]:
    """Every YAML file under the project root (the configs a run may load)."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(folder) / name for name in files if name.endswith((".yaml", ".yml"))]
        if len(found) >= _MAX_YAML_FILES:
            break
    return tuple(found)


def _yaml_values(root: str, key: str) -> list[str]:
    """The values the project's YAML files give `key` (`num_workers: 4` -> "4"); each file
    read through `read_text`, so a changed YAML changes the finding."""
    pattern = re.compile(rf"^[ \t]*{re.escape(key)}[ \t]*:[ \t]*([^#\s]+)", re.MULTILINE)
    return [
        value.strip("'\"").lower()
        for path in _yaml_paths(root)
        for value in pattern.findall(read_text(path))
    ]
