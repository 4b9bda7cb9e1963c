"""Pass: device. Pick the device, move the model (and optimizer state) there, and move inputs
that arrive elsewhere at the start of the forward.

`module.to(device)` swaps `param.data` and keeps the Parameter objects, so an optimizer built
before `optimize()` still holds the model's parameters. Batches from the loader are moved by the
loader pass (which knows whether memory is pinned); the forward layer here catches inputs that
the user feeds by hand, and costs one `isinstance`/device check per argument when they are
already on the device.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from autoopt.runtime.context import Context, Forward, ForwardLayer, Stage
from autoopt.runtime.loading.batch import map_tensors
from autoopt.runtime.optimizer_state import repoint
from autoopt.runtime.report import PassResult

NAME = "device"

# Arguments that need no walk: tensors are checked directly, these are never moved.
_PLAIN = (int, float, bool, str, bytes, type(None))


def run(ctx: Context) -> PassResult:
    """Choose `ctx.device`, move the model and optimizer state, register the input move."""
    device, why = choose(ctx.options.device, ctx.model, ctx.device)
    ctx.device = device
    moved = move_model(ctx.model, device, ctx.optimizer)
    ctx.forward_layers.append(
        ForwardLayer(NAME, Stage.OUTER, functools.partial(InputMover, device=device))
    )
    return PassResult.applied(NAME, f"{device} ({why}){'; model moved' if moved else ''}")


def choose(
    option: str | torch.device, model: torch.nn.Module, pinned: torch.device | None = None
) -> tuple[torch.device, str]:
    """The device to train on, and why. `pinned` is the distributed pass's LOCAL_RANK device.
    Raises ValueError when the device asked for is not there."""
    if pinned is not None:
        return _with_index(pinned), "set by the distributed pass"
    if option != "auto":
        device = torch.device(option)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"optimize(device={option!r}): CUDA is not available on this machine; "
                "use device='auto' or 'cpu'"
            )
        return _with_index(device), "as requested"
    current = {p.device for p in model.parameters()}
    if len(current) == 1 and (only := current.pop()).type not in ("cpu", "meta"):
        return only, "the model is already there"
    if torch.cuda.is_available():
        return _with_index(torch.device("cuda")), "CUDA is available"
    return torch.device("cpu"), "no CUDA device available"


def _with_index(device: torch.device) -> torch.device:
    """`cuda` -> `cuda:N` so that comparing with a tensor's device (always indexed) is exact."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def move_model(
    model: torch.nn.Module,
    device: torch.device,
    optimizer: torch.optim.Optimizer | None = None,
) -> bool:
    """Move `model` (and `optimizer`'s state) to `device`; True if anything moved.

    Between ordinary devices `module.to` keeps the Parameter objects. Where it cannot (e.g. to
    or from "meta") it makes new ones; the optimizer is then pointed at them, by name."""
    tensors = list(model.parameters()) + list(model.buffers())
    if all(t.device == device for t in tensors):
        return False
    before = dict(model.named_parameters(remove_duplicate=False))
    model.to(device)
    if optimizer is not None:
        after = dict(model.named_parameters(remove_duplicate=False))
        renamed = {id(old): after[name] for name, old in before.items() if after[name] is not old}
        if renamed:
            repoint(optimizer, renamed)
        _move_optimizer_state(optimizer, device)
    return True


def _move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move existing state next to its parameters. A state_dict round trip does it the way torch
    wants: per-parameter tensors follow the parameter, while Adam's `step` stays on the CPU
    unless the optimizer is fused or capturable."""
    stale = any(
        isinstance(v, torch.Tensor) and v.device != device and v.dim() > 0
        for state in optimizer.state.values()
        for v in state.values()
    )
    if stale:
        optimizer.load_state_dict(optimizer.state_dict())


class InputMover:
    """Forward layer: tensor arguments that are not on `device` are moved there."""

    def __init__(self, forward: Forward, device: torch.device) -> None:
        self.forward = forward
        self.device = device

    def _move(self, t: torch.Tensor) -> torch.Tensor:
        if t.device == self.device:
            return t
        # non_blocking only for host -> CUDA copies; a device -> host copy must be synchronous.
        cuda_from_host = self.device.type == "cuda" and t.device.type == "cpu"
        return t.to(self.device, non_blocking=cuda_from_host)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not _already_there(args, kwargs, self.device):
            args, kwargs = map_tensors((args, kwargs), self._move)
        return self.forward(*args, **kwargs)


def _already_there(args: tuple[Any, ...], kwargs: dict[str, Any], device: torch.device) -> bool:
    """Fast check for the common call (tensors and plain values): no container walk needed."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            if value.device != device:
                return False
        elif not isinstance(value, _PLAIN):
            return False  # a container: let map_tensors walk it
    return True
