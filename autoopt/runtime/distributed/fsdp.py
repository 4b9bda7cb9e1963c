"""FSDP2 sharding for `optimize(distributed="fsdp")`, and full state dicts of sharded models.

Shard units: each block of the model's repeated block stacks, then the root, which takes what the
blocks leave (embeddings, heads, norms). `fully_shard` gives each unit's forward and backward an
all-gather of its parameters and frees them afterwards, so a rank holds one unit's full
parameters at a time and its 1/world_size shard of all parameters, gradients and optimizer state.

`fully_shard` replaces every parameter with a new `nn.Parameter` holding a `DTensor` shard, so an
optimizer built before it holds parameters the model no longer trains: `shard()` points the
optimizer's param groups (and any state it has) at the sharded parameters, by name.

Mixed precision: bf16 parameters for every unit, except BatchNorm-style layers (running
statistics): those become their own units in fp32, as under autocast, since bf16 weights next to
fp32 running statistics fail in the first forward (and statistics kept in bf16 would drift).

Saving: `full_state_dict(model)` gathers a plain state dict with the original keys on rank 0
(empty on the other ranks), loadable into the unsharded model; `load_full_state_dict` loads one
into a sharded or plain model. Both are torch's `torch.distributed.checkpoint.state_dict`
functions with full-state-dict options, given the user's module: a DDP wrapper (autoopt's or
torch's) is looked through, since torch's helpers expect its `module.` prefix, which autoopt's
wrapper leaves out of its state dict.
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
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.parallel import DistributedDataParallel

from autoopt.runtime.checkpointing.block_stacks import find_block_stacks
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


def fp32_norms(model: nn.Module) -> list[nn.Module]:
    """The layers with running statistics and parameters (BatchNorm, affine InstanceNorm with
    tracked statistics) that share no parameter with the rest of the model: under bf16 they are
    shard units of their own that stay fp32. Not the root itself: it is the last unit anyway."""
    return [
        m
        for m in model.modules()
        if m is not model
        and isinstance(m, _NormBase)
        and m.track_running_stats
        and next(m.parameters(), None) is not None
        and not _shares_parameters(model, m)
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
    """`fully_shard` each block of `shard_blocks(model)`, then the root; returns the shard units
    (norm units first, then blocks, the root last). Under a `dtype`, each of `fp32_norms(model)`
    is first made a unit of its own with no mixed precision: its input comes in `dtype` and is
    normalised with fp32 weights and statistics, as autocast does.

    Rank 0's parameters and buffers are broadcast first (what DDP does at its construction), so
    every rank starts from the same model. `optimizer` is pointed at the sharded parameters."""
    _broadcast_from_rank0(model)
    before = dict(model.named_parameters(remove_duplicate=False))
    norms = fp32_norms(model) if dtype is not None else []
    for norm in norms:
        fully_shard(norm, mesh=mesh, mp_policy=mixed_precision(None, root=False))
    blocks = [b for b in shard_blocks(model) if not any(b is n for n in norms)]
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=mixed_precision(dtype, root=False))
    fully_shard(model, mesh=mesh, mp_policy=mixed_precision(dtype, root=True))
    if optimizer is not None:
        after = dict(model.named_parameters(remove_duplicate=False))
        repoint(
            optimizer, {id(old): after[name] for name, old in before.items()}, _shard_state_like
        )
    return [*norms, *blocks, model]


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


# FSDP2's mesh infos each hold their process groups (torch 2.13: `_fsdp_common`), and the
# device mesh a registry of them.
_GROUP_ATTRS = ("shard_process_group", "replicate_process_group", "reduce_scatter_process_group")


def release_groups(model: nn.Module) -> None:
    """Drop the process groups that `model`'s shard units hold (their mesh infos), so that
    destroying the default group frees it; for the exit hook (the model trains no more). A torch
    whose FSDP2 keeps them elsewhere only leaves the group alive to interpreter teardown."""
    for unit in model.modules():
        if not isinstance(unit, FSDPModule):
            continue
        try:
            group = unit._get_fsdp_state()._fsdp_param_group
            holders = [] if group is None else [group, *group.fsdp_params]
        except AttributeError:  # another torch's FSDP2 internals: the group lives on, as before
            return
        for holder in holders:
            for info in (
                getattr(holder, "mesh_info", None),
                getattr(holder, "post_forward_mesh_info", None),
            ):
                for attr in _GROUP_ATTRS:
                    if getattr(info, attr, None) is not None:
                        setattr(info, attr, None)
                # The device mesh keeps its groups by name, for the DTensors on it.
                registry = getattr(getattr(info, "mesh", None), "_pg_registry", None)
                if isinstance(registry, dict):
                    registry.clear()


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
    the other ranks; of an FSDP2-sharded, DDP or plain model alike. Collective for a sharded or
    DDP model under torchrun: every rank must call it. `torch.save` it on rank 0; it loads into
    the plain model."""
    return get_model_state_dict(_user_module(model), options=_FULL)


def load_full_state_dict(model: nn.Module, state_dict: dict[str, Any]) -> None:
    """Load a full, plain state dict (what `full_state_dict` or a plain model's `state_dict()`
    gives) into `model`. Into a sharded or DDP model under torchrun rank 0's copy is broadcast
    (collective: every rank calls it, the other ranks may pass `{}`); into a plain model it is a
    local load, so rank 0 alone can resume a plain copy."""
    set_model_state_dict(_user_module(model), state_dict, options=_load_options(model))


def full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state dict on rank 0 (`{}` elsewhere), keyed by parameter name
    instead of index; `load_full_optimizer_state_dict` loads it back. Collective, as
    `full_state_dict`."""
    return get_optimizer_state_dict(_user_module(model), optimizer, options=_FULL)


def load_full_optimizer_state_dict(
    model: nn.Module, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
) -> None:
    """Load what `full_optimizer_state_dict` gave into `optimizer` (of `model`); broadcast from
    rank 0 and collective for a sharded or DDP model, local for a plain one, as
    `load_full_state_dict`."""
    set_optimizer_state_dict(
        _user_module(model), optimizer, state_dict, options=_load_options(model)
    )


def _user_module(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (it holds the same, replicated parameters), else `model`.
    torch's helpers would look for the `module.` prefix in the state dict of autoopt's wrapper,
    whose keys are the user's."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def _load_options(model: nn.Module) -> StateDictOptions:
    """Broadcast rank 0's copy only into a model that every rank holds a part or replica of
    (FSDP2 or DDP): a broadcast into a plain model would wait for ranks that never call it."""
    distributed = (
        dist.is_available()
        and dist.is_initialized()
        and dist.get_world_size() > 1
        and (
            isinstance(model, DistributedDataParallel)
            or any(isinstance(m, FSDPModule) for m in model.modules())
        )
    )
    return StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed)
