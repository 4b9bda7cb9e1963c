"""Old import paths of modules that moved: importing one still works for a release, with a
DeprecationWarning that names the new path.

A package lists its moves once (`redirect({"autoopt.lint.nodes": "autoopt.lint.tree.nodes"})`
in its `__init__`); the old name then *is* the new module (`sys.modules` holds the same object),
so attributes, monkeypatches and `isinstance` checks see one module, not a copy.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType

_MOVED: dict[str, str] = {}


def redirect(moves: Mapping[str, str]) -> None:
    """Make each old module name in `moves` an alias of its new one (see the module's docs)."""
    _MOVED.update(moves)
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


def new_name(old: str) -> str | None:
    """Where the module `old` lives now (None if it did not move)."""
    return _MOVED.get(old)


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = _MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path will be removed in a later release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, already executed."""
