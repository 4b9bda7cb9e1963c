"""Memory budgets, and what one training step holds on the device.

A budget is what one training step of the model may hold on its device: parameters, gradients,
optimizer state and the activations saved for backward. `optimize(memory_budget=...)` takes
"auto" (the device's free memory on CUDA, no limit elsewhere), None (no limit), an int of bytes
or a string such as "2GiB" or "800MB". The passes that trade time for memory (checkpoint,
accumulate, distributed) resolve it with `resolve_budget`, record what they planned in
`Context.memory`, and add their before/after bytes to the report's memory section
(`report.record_plan`, `MemoryPlan`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

AUTO = "auto"

# Binary and decimal units, as `numfmt`/pip spell them; a bare number is bytes.
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
    "TIB": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")

# Optimizer state per parameter element, in parameter-sized tensors, for optimizers that have not
# stepped yet (after a step the real state is counted instead). Others count as 0 until stepped.
_STATE_TENSORS: dict[type[torch.optim.Optimizer], Callable[[dict[str, Any]], int]] = {
    torch.optim.SGD: lambda group: 1 if group.get("momentum", 0) else 0,
    torch.optim.Adam: lambda group: 3 if group.get("amsgrad") else 2,
    torch.optim.AdamW: lambda group: 3 if group.get("amsgrad") else 2,
    torch.optim.NAdam: lambda group: 2,
    torch.optim.RAdam: lambda group: 2,
    torch.optim.Adamax: lambda group: 2,
    torch.optim.Adagrad: lambda group: 1,
    torch.optim.Adadelta: lambda group: 2,
    torch.optim.RMSprop: lambda group: (
        1 + (1 if group.get("momentum", 0) else 0) + (1 if group.get("centered") else 0)
    ),
}


def parse_budget(value: object) -> int | str | None:
    """The `memory_budget` option checked and converted: "auto", None, or a number of bytes.

    Raises ValueError naming the accepted forms for anything else."""
    if value is None or (isinstance(value, str) and value == AUTO):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        unit = match.group(2).upper() if match else ""
        if match and unit in _UNITS:
            size = int(float(match.group(1)) * _UNITS[unit])
            if size > 0:
                return size
    raise ValueError(
        f"optimize(memory_budget={value!r}) is not allowed; memory_budget must be 'auto', None, "
        "a positive int of bytes, or a size string such as '2GiB', '800MB' or '512MiB'"
    )


def resolve_budget(
    option: int | str | None, device: torch.device | None, held: int = 0
) -> int | None:
    """Bytes one step may hold on `device`, or None for no limit. "auto" is the free memory of a
    CUDA device (what other processes and the caching allocator left) plus `held`, the bytes the
    model already holds there (its parameters, gradients and optimizer state are part of the step
    but no longer free); no limit elsewhere: host memory is rarely what limits training."""
    if option is None or isinstance(option, int):
        return option
    if device is not None and device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free + held
    return None


def describe_budget(option: int | str) -> str:
    """A limit for the report: "the free CUDA memory" for "auto", else its size."""
    return "the free CUDA memory" if option == AUTO else format_bytes(int(option))


def resident_bytes(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, device: torch.device
) -> int:
    """Bytes of the model's parameters and gradients and the optimizer's state tensors that
    already live on `device` (what `resolve_budget` adds back to the free memory)."""
    tensors = [t for p in model.parameters() for t in (p, p.grad) if t is not None]
    if optimizer is not None:
        tensors += [
            t
            for state in optimizer.state.values()
            for t in state.values()
            if isinstance(t, torch.Tensor)
        ]
    here = [
        t
        for t in tensors
        if t.device.type == device.type and device.index in (None, t.device.index)
    ]
    return sum(_nbytes(t) for t in here)


@dataclass(frozen=True)
class StepMemory:
    """Bytes one training step holds on one device (one rank), by kind. `activations` is None
    until measured (saved tensors of a forward on a real batch)."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int | None = None

    @property
    def state(self) -> int:
        """Everything but activations: what the step holds whatever the batch."""
        return self.parameters + self.gradients + self.optimizer_state

    @property
    def total(self) -> int:
        """All of it; activations count 0 while unmeasured."""
        return self.state + (self.activations or 0)

    def with_activations(self, activations: int) -> StepMemory:
        """The same state bytes with measured activations."""
        return replace(self, activations=activations)

    def render(self) -> str:
        """One line for the report: each kind and the total."""
        parts = [
            f"parameters {format_bytes(self.parameters)}",
            f"gradients {format_bytes(self.gradients)}",
            f"optimizer state {format_bytes(self.optimizer_state)}",
        ]
        if self.activations is not None:
            parts.append(f"activations {format_bytes(self.activations)}")
        return ", ".join(parts) + f" = {format_bytes(self.total)}"


@dataclass(frozen=True)
class MemoryPlan:
    """What one step holds on one rank before autoopt's memory passes (eager, unsharded) and
    after them (checkpointed, sharded), and the budget they planned for (None: no limit).
    Each pass changes its own kinds: FSDP the state bytes, checkpointing the activations."""

    before: StepMemory
    after: StepMemory
    budget: int | None

    def combine(self, before: StepMemory, after: StepMemory, budget: int | None) -> MemoryPlan:
        """This plan followed by a later pass's: `before` stays the earliest bytes (activations
        filled in when only the later pass measured them), `after` is the later pass's
        (activations kept when only this one measured them), the budget the latest known."""
        first = self.before
        if first.activations is None and before.activations is not None:
            first = first.with_activations(before.activations)
        last = after
        if last.activations is None and self.after.activations is not None:
            last = last.with_activations(self.after.activations)
        return MemoryPlan(first, last, budget if budget is not None else self.budget)

    def render(self) -> list[str]:
        """The report's memory section: a heading, then the step before and after."""
        budget = "no budget" if self.budget is None else f"budget {format_bytes(self.budget)}"
        return [
            f"memory per rank ({budget})",
            f"  before  {self.before.render()}",
            f"  after   {self.after.render()}",
        ]

    def to_dict(self) -> dict[str, Any]:
        """Plain data, in bytes."""
        return {
            "budget": self.budget,
            "before": asdict(self.before) | {"total": self.before.total},
            "after": asdict(self.after) | {"total": self.after.total},
        }


def state_memory(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> StepMemory:
    """Parameter, gradient and optimizer-state bytes of one step on this rank.

    Gradients are counted for every parameter that requires grad (they all get one at the first
    backward). Optimizer state is the real state once the optimizer has stepped, else what its
    class allocates at its first step (`_STATE_TENSORS`; 0 for optimizers not listed)."""
    params = list(model.parameters())  # tied parameters once
    param_bytes = sum(_nbytes(p) for p in params)
    grad_bytes = sum(_nbytes(p) for p in params if p.requires_grad)
    return StepMemory(param_bytes, grad_bytes, optimizer_state_bytes(optimizer))


def optimizer_state_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of `optimizer`'s state tensors, or the expected bytes when it has not stepped."""
    if optimizer is None:
        return 0
    if any(optimizer.state.values()):
        tensors = [
            t
            for state in optimizer.state.values()
            for t in state.values()
            if isinstance(t, torch.Tensor) and t.dim() > 0  # scalar `step` counters are noise
        ]
        return sum(_nbytes(t) for t in tensors)
    per_element = _STATE_TENSORS.get(type(optimizer))
    if per_element is None:
        return 0
    return sum(
        per_element(group) * _nbytes(p)
        for group in optimizer.param_groups
        for p in group["params"]
        if p.requires_grad
    )


class _SavedTally:
    """The storages counted by one `saved_tensor_bytes` call, each once."""

    def __init__(self) -> None:
        self.seen: set[Any] = set()
        self.keep: list[torch.Tensor] = []  # keeps storages alive, so their addresses stay unique
        self.total = 0

    def add(self, t: torch.Tensor) -> None:
        base = t._base if t._base is not None else t
        if base.is_leaf and base.requires_grad:  # a parameter (or a view of one)
            return
        if base.device.type == "meta":  # no storage to tell apart: count each base tensor once
            key: Any = ("meta", id(base))
            size = base.numel() * base.element_size()
        else:
            storage = base.untyped_storage()
            key = (base.device, storage.data_ptr())
            size = storage.nbytes()
        if key not in self.seen:
            self.seen.add(key)
            self.keep.append(base)
            self.total += size


_TALLY: ContextVar[_SavedTally | None] = ContextVar("autoopt_saved_tally", default=None)


def count_saved(t: torch.Tensor) -> None:
    """Count `t` in the innermost running `saved_tensor_bytes`, if any. For tensors kept for
    backward outside autograd's saved-tensor hooks (a selective checkpoint's cache)."""
    tally = _TALLY.get()
    if tally is not None:
        tally.add(t)


def saved_tensor_bytes(fn: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Run `fn` with grad enabled and count the bytes of the tensors kept for backward: what
    autograd saves, plus what `count_saved` reports; each storage once, parameters (leaves that
    require grad, and views of them) and the storages of `exclude` left out. Calls nest: each
    counts its own `fn`."""
    tally = _SavedTally()
    for t in exclude:
        tally.add(t)
    tally.total = 0
    token = _TALLY.set(tally)
    try:
        with (
            torch.enable_grad(),
            torch.autograd.graph.saved_tensors_hooks(_packer(tally), lambda t: t),
        ):
            fn()
    finally:
        _TALLY.reset(token)
    return tally.total


@contextlib.contextmanager
def not_counted() -> Iterator[None]:
    """What runs inside (trial forwards) is invisible to an enclosing `saved_tensor_bytes`:
    autograd's saves go through identity hooks (the innermost hooks are the ones called) and
    `count_saved` finds no tally."""
    token = _TALLY.set(None)
    try:
        with torch.autograd.graph.saved_tensors_hooks(_same, _same):
            yield
    finally:
        _TALLY.reset(token)


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _packer(tally: _SavedTally) -> Callable[[torch.Tensor], torch.Tensor]:
    def pack(t: torch.Tensor) -> torch.Tensor:
        tally.add(t)
        return t

    return pack


class _Storages:
    """Storages by address, held weakly: their bytes while they are alive."""

    def __init__(self) -> None:
        self.refs: dict[int, tuple[StorageWeakRef, int]] = {}  # data_ptr -> (ref, bytes)

    def add(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in self.refs or self.refs[key][0].expired():
            self.refs[key] = (StorageWeakRef(storage), storage.nbytes())

    def alive(self) -> int:
        self.refs = {k: v for k, v in self.refs.items() if not v[0].expired()}
        return sum(size for _, size in self.refs.values())


class _BackwardBytes(TorchDispatchMode):
    """Bytes held, op by op, beyond the start: storages the ops inside create (gradients, their
    temporaries) less the `saved` storages freed since (the backward frees what it used)."""

    def __init__(self, saved: _Storages) -> None:
        super().__init__()
        self.saved = saved
        self.start = saved.alive()
        self.new = _Storages()
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        # A storage an input already had (in-place ops, views) is not new.
        old = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if _real(t)}
        for t in tree_leaves(out):
            if _real(t) and t.untyped_storage().data_ptr() not in old:
                self.new.add(t)
        held = self.new.alive() + self.saved.alive() - self.start
        self.peak = max(self.peak, held)
        return out


def _real(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type != "meta" and not isinstance(t, DTensor)


def backward_transient_bytes(fn: Callable[[], Any], params: Iterable[nn.Parameter]) -> int:
    """Run `fn` (a forward) with grad enabled, then the backward of the tensors it returns
    (gradients of ones), and return the most bytes that backward held at once beyond what the
    forward saved: the gradient flowing in, the gradients it computes and their temporaries,
    less the saved tensors it has freed so far. Op by op, as torch's dispatcher sees outputs:
    buffers a kernel allocates and frees inside itself are not seen. `params` get their
    gradients added into zeroed `.grad`s, as in a step that keeps its gradients (the gradient
    computed is a temporary), and their `.grad`s are put back afterwards."""
    saved = _Storages()

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if _real(base) and not (base.is_leaf and base.requires_grad):  # parameters stay
            saved.add(base)
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, _same):
        out = fn()
    outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    del out
    if not outputs:
        return 0
    params = [p for p in params if p.requires_grad]
    grads = [p.grad for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    try:
        with _BackwardBytes(saved) as seen:
            torch.autograd.backward(outputs, [torch.ones_like(t) for t in outputs])
        return seen.peak
    finally:
        for p, grad in zip(params, grads, strict=True):
            p.grad = grad


def format_bytes(size: float) -> str:
    """1536 -> '1.5 KiB': binary units, three significant digits."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.3g} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _nbytes(t: torch.Tensor) -> int:
    """Bytes this rank holds for `t`: a sharded DTensor (FSDP2) counts its local shard only."""
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def __getattr__(name: str) -> Any:
    from autoopt.runtime import moved

    return moved.moved_name(__name__, name)
