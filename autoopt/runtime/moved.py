"""The runtime's module paths from before its regrouping by mechanism (docs/development.md, "Where
each module moved from"), kept working for one release: importing an old path, or reading a name
from it, warns with a DeprecationWarning naming the new path and gives the object that lives
there. `install()` (run by `autoopt.runtime`) puts the finder for the old module paths first on
`sys.meta_path`; names that moved out of a module that still exists are answered by that
module's own `__getattr__` through `moved_name`."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

# old module -> new module
MODULES = {
    "autoopt.runtime.loss_scaling": "autoopt.runtime.scaling.loss_scaling",
    "autoopt.runtime.root_scaling": "autoopt.runtime.scaling.root_scaling",
    "autoopt.runtime.user_amp": "autoopt.runtime.scaling.user_amp",
    "autoopt.runtime.micro_batches": "autoopt.runtime.accumulation.micro_batches",
    "autoopt.runtime.loss_shares": "autoopt.runtime.accumulation.loss_shares",
    "autoopt.runtime.checkpoint_plan": "autoopt.runtime.checkpointing.checkpoint_plan",
    "autoopt.runtime.block_checkpoint": "autoopt.runtime.checkpointing.block_checkpoint",
    "autoopt.runtime.block_stacks": "autoopt.runtime.checkpointing.block_stacks",
    "autoopt.runtime.replay": "autoopt.runtime.trials.replay",
    "autoopt.runtime.timing": "autoopt.runtime.trials.timing",
    "autoopt.runtime.compile_cache": "autoopt.runtime.compiling.cache",
    "autoopt.runtime.compile_guard": "autoopt.runtime.compiling.guard",
    "autoopt.runtime.compile_log": "autoopt.runtime.compiling.log",
    "autoopt.runtime.batch": "autoopt.runtime.loading.batch",
    "autoopt.runtime.device_loader": "autoopt.runtime.loading.device_loader",
    "autoopt.runtime.fsdp": "autoopt.runtime.distributed.fsdp",
}
# old "module.name" -> the new module holding `name` (the old module still exists, or is above)
NAMES = {
    "autoopt.runtime.user_amp.watch_grad_scalers": "autoopt.runtime.scaling.grad_scalers",
    "autoopt.runtime.user_amp.unwatch_grad_scalers": "autoopt.runtime.scaling.grad_scalers",
    "autoopt.runtime.memory.record_plan": "autoopt.runtime.report",
    "autoopt.runtime.passes.accumulate.Accumulator": "autoopt.runtime.accumulation.accumulator",
}
# A module that became a package of the same name: its old names now live in this module.
PACKAGES = {"autoopt.runtime.trials": "autoopt.runtime.trials.choices"}


def _warn(old: str, new: str, depth: int) -> None:
    """Warn at the user's line, `depth` frames of autoopt's above this one (`warnings` skips the
    import machinery's frames itself)."""
    warnings.warn(
        f"{old} moved to {new}; import it from there ({old} goes in the next release)",
        DeprecationWarning,
        stacklevel=depth + 2,
    )


def moved_name(module: str, name: str) -> Any:
    """`module.name` read from its new place with a warning (a module's `__getattr__` calls
    this); AttributeError if it never lived in `module`."""
    new = NAMES.get(f"{module}.{name}")
    if new is None and module in PACKAGES:
        inner = importlib.import_module(PACKAGES[module])
        if hasattr(inner, name):
            new = PACKAGES[module]
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    _warn(f"{module}.{name}", f"{new}.{name}", 2)
    return getattr(importlib.import_module(new), name)


class _OldModule(types.ModuleType):
    """An old module path: every name read from it comes from the new module (or from where a
    name moved on to)."""

    def __init__(self, old: str, new: str) -> None:
        super().__init__(old, f"Moved to {new}.")
        self.__new_module = new

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if f"{self.__name__}.{name}" in NAMES:
            return moved_name(self.__name__, name)
        return getattr(importlib.import_module(self.__new_module), name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MODULES[spec.name]
        _warn(spec.name, new, 1)
        importlib.import_module(new)
        return _OldModule(spec.name, new)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the names are read from the new module."""


def install() -> None:
    """Answer the old module paths (once per process)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
