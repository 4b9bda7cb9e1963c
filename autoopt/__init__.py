"""autoopt: make PyTorch training fast with the least change to the user's code.

model, loader, optimizer = autoopt.optimize(model, loader, optimizer)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = [
    "optimize",
    "report",
    "unwrap",
    "seed_everything",
    "explain_compile",
    "explain_memory",
    "full_state_dict",
    "load_full_state_dict",
    "full_optimizer_state_dict",
    "load_full_optimizer_state_dict",
    "__version__",
]

# The runtime imports torch (about 2 s); `autoopt lint` and `rewrite` never need it (autoopt
# installs without torch), so the public names are resolved on first use, and without torch
# the first use says so (autoopt.torch_missing).
_LAZY = {
    "optimize": "autoopt.runtime.optimize",
    "report": "autoopt.runtime.optimize",
    "unwrap": "autoopt.runtime.optimize",
    "seed_everything": "autoopt.runtime.seed",
    "explain_compile": "autoopt.runtime.compiling.log",
    "explain_memory": "autoopt.runtime.memory_explain",
    "full_state_dict": "autoopt.runtime.distributed.fsdp",
    "load_full_state_dict": "autoopt.runtime.distributed.fsdp",
    "full_optimizer_state_dict": "autoopt.runtime.distributed.fsdp",
    "load_full_optimizer_state_dict": "autoopt.runtime.distributed.fsdp",
}

if TYPE_CHECKING:
    from autoopt.runtime.compiling.log import explain_compile
    from autoopt.runtime.distributed.fsdp import (
        full_optimizer_state_dict,
        full_state_dict,
        load_full_optimizer_state_dict,
        load_full_state_dict,
    )
    from autoopt.runtime.memory_explain import explain_memory
    from autoopt.runtime.optimize import optimize, report, unwrap
    from autoopt.runtime.seed import seed_everything


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        try:
            module = importlib.import_module(_LAZY[name])
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            from autoopt.torch_missing import message

            raise ModuleNotFoundError(message(f"autoopt.{name}"), name="torch") from None
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autoopt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
