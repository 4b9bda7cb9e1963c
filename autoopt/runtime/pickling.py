"""A pickle of an optimized model is the user's plain model; a deep copy is a working one.

`torch.save(model)` and `pickle.dumps(model)` write what the same module would write had
`optimize()` never run: the user's class, parameters, buffers, submodules and attributes, and
none of autoopt's forward layers, hooks, accumulators or reports. The file loads where autoopt
is not installed, and under `torch.load(weights_only=True)` (torch's default) with an allowlist
of the user's own classes only. Loaded, it is a plain model that computes as the unoptimized
one does (fp32, no autocast), and `optimize()` may be applied to it again.

`copy.deepcopy(model)` (EMA, SWA, snapshots) keeps giving a working optimized copy.

How: every module of an optimized model holds two instance attributes, which Python's pickle
and copy look up on the instance before the class: `__reduce_ex__` (pickle, `copy.copy`) runs
the class's own reduction and drops autoopt's entries from the state; `__deepcopy__` runs the
class's reduction unchanged, as deepcopy would have. Like the forward layers (`forward`), both
are objects of module-level classes holding the module, so a deep copy rebinds them to itself.

torch.compile's `OptimizedModule` drops its compiled forward from the pickle but is itself
pickled (a weights-only load must allow torch's class); Accelerate's AMP forward refuses to be
pickled and asks the user to unwrap the model first. Patching in place lets autoopt do better:
its objects hang off the user's module, so the module can be written without them.
"""

from __future__ import annotations

import copy
import functools
import types
from collections import OrderedDict
from typing import Any

from torch import nn

from autoopt.runtime.forward import PatchedForward

_REDUCE = "__reduce_ex__"
_DEEPCOPY = "__deepcopy__"
_PREFIX = "_autoopt"  # attributes named so (the report, accumulators, checkpoint plans)
# nn.Module's dicts keyed by hook id that say how a hook is called, not the hook itself.
_HOOK_FLAGS = (
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks_with_kwargs",
)


def install(*models: nn.Module | None) -> None:
    """Make every module of `models` pickle as the user's plain module and deep-copy as an
    optimized one (see the module docstring). Idempotent."""
    for model in models:
        if model is None:
            continue
        for module in model.modules():
            if not isinstance(module.__dict__.get(_REDUCE), PlainReduce):
                module.__dict__[_REDUCE] = PlainReduce(module)
                module.__dict__[_DEEPCOPY] = WorkingCopy(module)


class PlainReduce:
    """`module.__reduce_ex__`: the class's own reduction, with autoopt's entries dropped from the
    state. Protocol 2+ keeps `copyreg.__newobj__`, which pickle writes as the NEWOBJ opcode: the
    bytes are those of the unoptimized module."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, protocol: int) -> Any:
        module = self.module
        reduced = type(module).__reduce_ex__(module, protocol)
        if not isinstance(reduced, tuple) or len(reduced) < 3:
            return reduced
        return (*reduced[:2], plain_state(reduced[2]), *reduced[3:])


class WorkingCopy:
    """`module.__deepcopy__`: what `copy.deepcopy` does without it (the class's reduction with
    the whole state), so the copy keeps autoopt's layers, rebound to the copy by the memo."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, memo: dict[int, Any]) -> Any:
        module = self.module
        own = getattr(type(module), "__deepcopy__", None)
        if own is not None:  # the class's own (a ScriptModule's copies its C++ module)
            return own(module, memo)
        reduced = type(module).__reduce_ex__(module, 4)
        # copy.deepcopy's own reconstruction of a `__reduce_ex__` result (private, but the
        # same function deepcopy calls; it records the copy in the memo before its state).
        return copy._reconstruct(module, memo, *reduced)  # type: ignore[attr-defined]


def plain_state(state: Any) -> Any:
    """A module's pickled state without autoopt's attributes, forward and hooks: the user's
    forward set on the instance (if any) stands where autoopt's patched one was."""
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
        return (plain_state(state[0]), state[1])  # (dict, slots)
    if not isinstance(state, dict):
        return state
    plain: dict[str, Any] = {}
    dropped: set[Any] = set()
    for key, value in state.items():
        if isinstance(value, PatchedForward):
            if value.user is not None:
                plain[key] = value.user
            continue
        if key in (_REDUCE, _DEEPCOPY) or str(key).startswith(_PREFIX) or is_autoopt(value):
            continue
        if isinstance(value, dict) and key not in _HOOK_FLAGS:
            ours = [k for k, v in value.items() if is_autoopt(v)]
            if ours:  # a hook dict holding autoopt's hooks: a copy without them
                dropped.update(ours)
                value = _without(value, ours)
        plain[key] = value
    for key in _HOOK_FLAGS:
        flags = plain.get(key)
        if dropped and isinstance(flags, dict) and dropped & flags.keys():
            plain[key] = _without(flags, dropped)
    return plain


def _without(d: dict[Any, Any], keys: Any) -> dict[Any, Any]:
    kept = [(k, v) for k, v in d.items() if k not in keys]
    return OrderedDict(kept) if isinstance(d, OrderedDict) else dict(kept)


def is_autoopt(value: Any) -> bool:
    """Whether `value` is autoopt's: an object of one of its classes, one of its functions, or
    a partial or bound method of those."""
    if isinstance(value, functools.partial):
        return is_autoopt(value.func)
    if isinstance(value, types.MethodType):
        return is_autoopt(value.__func__) or is_autoopt(value.__self__)
    owner = value if isinstance(value, type | types.FunctionType) else type(value)
    name = getattr(owner, "__module__", None) or ""
    return name == "autoopt" or name.startswith("autoopt.")
