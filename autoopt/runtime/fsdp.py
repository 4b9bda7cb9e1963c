"""FSDP2 sharding for `optimize(distributed="fsdp")`, and full state dicts of sharded models.

Shard units: each block of the model's repeated block stacks, then the root, which takes what the
blocks leave (embeddings, heads, norms). `fully_shard` gives each unit's forward and backward an
all-gather of its parameters and frees them afterwards, so a rank holds one unit's full
parameters at a time and its 1/world_size shard of all parameters, gradients and optimizer state.

`fully_shard` replaces every parameter with a new `nn.Parameter` holding a `DTensor` shard, so an
optimizer built before it holds parameters the model no longer trains: `shard()` points the
optimizer's param groups (and any state it has) at the sharded parameters, by name.

Saving: `full_state_dict(model)` gathers a plain state dict with the original keys on rank 0
(empty on the other ranks), loadable into the unsharded model; `load_full_state_dict` loads one
into a sharded or plain model. Both are torch's `torch.distributed.checkpoint.state_dict`
functions with full-state-dict options, and work on plain and DDP models too.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from autoopt.runtime.block_stacks import find_block_stacks
from autoopt.runtime.optimizer_state import repoint


def shard_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of the model's repeated block stacks (`find_block_stacks`, leaf layers
    included) that hold parameters and share none with anything outside themselves (tied
    weights): two shard units cannot own one parameter."""
    blocks = [block for _, _, stack in find_block_stacks(model, leaves=True) for block in stack]
    return [
        b
        for b in blocks
        if next(b.parameters(), None) is not None and not _shares_parameters(model, b)
    ]


def _shares_parameters(model: nn.Module, block: nn.Module) -> bool:
    inside = {id(p) for p in block.parameters()}
    inside_modules = {id(m) for m in block.modules()}
    return any(
        id(p) in inside
        for m in model.modules()
        if id(m) not in inside_modules
        for p in m.parameters(recurse=False)
    )


def mixed_precision(dtype: torch.dtype | None, *, root: bool) -> MixedPrecisionPolicy:
    """FSDP's mixed-precision policy for autocast dtype `dtype` (None: full precision).

    Parameters are all-gathered and computed in `dtype`, gradients reduced in fp32 into the fp32
    shards the optimizer steps; the root's floating outputs come back fp32, as under autoopt's
    autocast layer."""
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(
        param_dtype=dtype,
        reduce_dtype=torch.float32,
        output_dtype=torch.float32 if root else None,
    )


def shard(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    mesh: DeviceMesh,
    dtype: torch.dtype | None = None,
) -> list[nn.Module]:
    """`fully_shard` each block of `shard_blocks(model)`, then the root; returns the shard units.

    Rank 0's parameters and buffers are broadcast first (what DDP does at its construction), so
    every rank starts from the same model. `optimizer` is pointed at the sharded parameters."""
    _broadcast_from_rank0(model)
    before = dict(model.named_parameters(remove_duplicate=False))
    blocks = shard_blocks(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=mixed_precision(dtype, root=False))
    fully_shard(model, mesh=mesh, mp_policy=mixed_precision(dtype, root=True))
    if optimizer is not None:
        after = dict(model.named_parameters(remove_duplicate=False))
        repoint(
            optimizer, {id(old): after[name] for name, old in before.items()}, _shard_state_like
        )
    return [*blocks, model]


def unsharded_parameters(units: list[nn.Module]) -> list[nn.Parameter]:
    """The parameters autograd sees in the forward and backward of sharded `units` (root last):
    FSDP2's all-gathered copies, made at the first unshard and reused after, so each stays the
    same object for the whole run. Collective: all-gathers once on every rank."""
    fsdp_units = [u for u in units if isinstance(u, FSDPModule)]
    for unit in fsdp_units:
        unit.unshard()
    params = list(units[-1].parameters())
    for unit in fsdp_units:
        unit.reshard()
    return params


def _broadcast_from_rank0(model: nn.Module) -> None:
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def _shard_state_like(old: torch.Tensor, new: torch.Tensor, value: Any) -> Any:
    """A parameter-shaped state value (Adam's moments) sharded like the sharded parameter."""
    if not (isinstance(value, torch.Tensor) and value.shape == old.shape and value.dim() > 0):
        return value
    assert isinstance(new.data, DTensor)
    return distribute_tensor(value.detach(), new.data.device_mesh, new.data.placements)


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state_dict(model: nn.Module) -> dict[str, Any]:
    """The model's full, plain state dict (CPU tensors, the original keys) on rank 0, and `{}` on
    the other ranks; of an FSDP2-sharded, DDP or plain model alike. Collective under torchrun:
    every rank must call it. `torch.save` it on rank 0; it loads into the plain model."""
    return get_model_state_dict(model, options=_FULL)


def load_full_state_dict(model: nn.Module, state_dict: dict[str, Any]) -> None:
    """Load a full, plain state dict (what `full_state_dict` or a plain model's `state_dict()`
    gives) into `model`, sharded or not. Under torchrun rank 0's copy is broadcast: the other
    ranks may pass `{}`. Collective: every rank must call it."""
    set_model_state_dict(model, state_dict, options=_load_options())


def full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state dict on rank 0 (`{}` elsewhere), keyed by parameter name
    instead of index; `load_full_optimizer_state_dict` loads it back. Collective."""
    return get_optimizer_state_dict(model, optimizer, options=_FULL)


def load_full_optimizer_state_dict(
    model: nn.Module, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
) -> None:
    """Load what `full_optimizer_state_dict` gave into `optimizer` (of `model`, sharded or not);
    rank 0's copy is broadcast under torchrun. Collective."""
    set_optimizer_state_dict(model, optimizer, state_dict, options=_load_options())


def _load_options() -> StateDictOptions:
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    return StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed)
