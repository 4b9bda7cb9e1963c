"""The runtime's module paths from before its regrouping by mechanism (docs/development.md, "Where
each module moved from"), kept working for one release with a DeprecationWarning naming the new
path. Moved modules are redirected by `autoopt.moved` (the old name is the new module); names that
moved out of a module that still exists are answered by that module's `__getattr__` through
`moved_name`."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from autoopt.moved import redirect

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
# "module.name" as it was -> the module holding `name` now. The module named first still exists
# (or is one of MODULES' new modules, which carries the old name's `__getattr__`).
NAMES = {
    "autoopt.runtime.scaling.user_amp.watch_grad_scalers": "autoopt.runtime.scaling.grad_scalers",
    "autoopt.runtime.scaling.user_amp.unwatch_grad_scalers": "autoopt.runtime.scaling.grad_scalers",
    "autoopt.runtime.memory.record_plan": "autoopt.runtime.report",
    "autoopt.runtime.passes.accumulate.Accumulator": "autoopt.runtime.accumulation.accumulator",
}
# A module that became a package of the same name: its old names now live in this module.
PACKAGES = {"autoopt.runtime.trials": "autoopt.runtime.trials.choices"}


def moved_name(module: str, name: str) -> Any:
    """`module.name` read from its new place with a DeprecationWarning at the reader's line (a
    module's `__getattr__` calls this); AttributeError if it never lived in `module`."""
    new = NAMES.get(f"{module}.{name}")
    if (
        new is None
        and module in PACKAGES
        and hasattr(importlib.import_module(PACKAGES[module]), name)
    ):
        new = PACKAGES[module]
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    old = f"{module}.{name}"
    warnings.warn(
        f"{old} moved to {new}.{name}; import it from there ({old} goes in a later release)",
        DeprecationWarning,
        stacklevel=3,  # past this function and the module's __getattr__
    )
    return getattr(importlib.import_module(new), name)


def install() -> None:
    """Answer the old module paths (run by `autoopt.runtime`)."""
    redirect(MODULES)
