"""Pass: distributed (AO501-AO503). Under torchrun, DDP or FSDP2 with no code change.

Activation:
* `distributed="auto"`: active when the environment says `WORLD_SIZE > 1` (torchrun's contract:
  RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), or when the user already initialised
  a process group of more than one process.
* `distributed=True`, `"ddp"`, `"fsdp"`: the same, but a missing torchrun environment is an error.
* `distributed=False`: skipped.

Strategy (`choose_strategy`): "ddp" and "fsdp" are taken as asked. "auto" and True keep DDP
unless one rank's parameters + gradients + optimizer state exceed the memory budget; then FSDP2
shards them. With no budget (the CPU's "auto") that is always DDP.

When active: the process group is initialised from the environment unless it already is
(`nccl` for CUDA, `gloo` for CPU, with a `INIT_TIMEOUT` timeout so a missing peer is an error,
not a hang), `ctx.device` is pinned to `cuda:LOCAL_RANK` (or the CPU) and `ctx.dist` is set so
the loader pass shards the data. A finalizer, run after every forward and step layer is in
place, then either
* wraps the model in `AutooptDDP`: a `DistributedDataParallel` whose `state_dict()` and
  `load_state_dict()` use the inner module's keys (no `module.` prefix) and whose unknown
  attributes are looked up on the inner module, so `model.my_head` or `model.config` keep
  working, and which frees torch's Reducer before its own handle on the process group (else a
  gloo teardown can hang, see `AutooptDDP.__del__`); or
* shards it in place with FSDP2 (`autoopt.runtime.distributed.fsdp`): each repeated block and the root
  become shard units, the optimizer is pointed at the sharded parameters, amp's dtype becomes
  FSDP's `MixedPrecisionPolicy`, and `ctx.memory` holds the per-rank bytes after sharding.
  `torch.compile` and channels-last stand down under FSDP (this pass turns them off, and says
  so): neither is verified with FSDP2's all-gather hooks here.

The report line also says what a single-process report would leave unsaid: BatchNorm layers
normalise over each rank's own samples (`batchnorm_note`; SyncBatchNorm is suggested, never
applied), and which choices a single process measures on the CPU were taken unmeasured
(`unmeasured_note`).

At exit: a process group this pass initialised is destroyed by an `atexit` hook
(`destroy_own_group`), before interpreter teardown, its DDP reducers and FSDP2 mesh groups let go
first so that gloo's threads are joined while Python still runs; a group the user initialised is
theirs to destroy, and a rank ending on an uncaught exception is left as it is.

Any disagreement between the environment and reality (a missing or malformed variable, a rank
outside the world, an existing process group of another size or rank, a LOCAL_RANK without a
GPU) raises `DistributedSetupError` naming the values.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import functools
import gc
import os
import sys
import weakref
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.nn.modules.batchnorm import _BatchNorm, _NormBase
from torch.nn.parallel import DistributedDataParallel

from autoopt.runtime.accumulation.accumulator import Accumulator
from autoopt.runtime.context import Context, DistState
from autoopt.runtime.distributed import fsdp
from autoopt.runtime.memory import (
    StepMemory,
    format_bytes,
    resident_bytes,
    resolve_budget,
    state_memory,
)
from autoopt.runtime.passes import backends
from autoopt.runtime.report import PassResult, record_plan
from autoopt.runtime.scaling import root_scaling

NAME = "distributed"
ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
INIT_TIMEOUT = datetime.timedelta(seconds=60)


class DistributedSetupError(RuntimeError):
    """The torchrun environment, the process group and the devices do not agree."""


class AutooptDDP(DistributedDataParallel):
    """DDP that looks like the module it wraps: same `state_dict` keys, same attributes."""

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The inner module's state dict: exactly the original keys, loadable by a plain model."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """Load a plain (un-prefixed) state dict into the inner module."""
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def release_group(self) -> None:
        """Let go of the process group: the reducer first (see `__del__`), then the wrapper's own
        handle, which frees it with the GIL released. For the exit hook: the model trains no more."""
        self.__del__()
        vars(self).pop("process_group", None)

    def __del__(self) -> None:
        # torch's Reducer lets go of the process group with the GIL held. When it is the last
        # holder (a script that calls destroy_process_group() and then drops the model), gloo's
        # destructor joins its worker threads while one of them waits for the GIL to free a
        # finished all-reduce (its work captured the backward's Python state): a hang at exit,
        # one run in a few under load. Free the reducer (and the logger that holds it) first,
        # while `self.process_group` still holds the group: that Python handle releases the GIL
        # when it lets go.
        state = vars(self)
        state.pop("logger", None)
        state.pop("reducer", None)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            # nn.Module.__getattr__ finds parameters, buffers and submodules only; fall back to
            # the user's module for everything else it defines (methods, config, heads).
            modules = self.__dict__.get("_modules", {})
            if "module" not in modules:
                raise
            return getattr(modules["module"], name)


def run(ctx: Context) -> PassResult | None:
    """Set up the process group, the device and `ctx.dist`; register the DDP finalizer."""
    option = ctx.options.distributed
    if option is False:
        return PassResult.skipped(NAME, "distributed=False")
    env = os.environ
    world_env = env.get("WORLD_SIZE")
    initialised = dist.is_available() and dist.is_initialized()
    if not initialised and (world_env is None or _int(env, "WORLD_SIZE") <= 1):
        if option is not False and option != "auto":
            raise DistributedSetupError(
                f"optimize(distributed={option!r}) needs a multi-process launch: run the script with "
                "`torchrun --nproc_per_node=N script.py` (which sets "
                f"{', '.join(ENV_VARS)}); WORLD_SIZE is {world_env!r}"
            )
        return PassResult.skipped(NAME, f"single process (WORLD_SIZE={world_env or 'unset'})")
    if not dist.is_available():
        raise DistributedSetupError("WORLD_SIZE > 1 but this torch build has no torch.distributed")

    device = _choose_device(ctx)
    if initialised:
        state = _check_existing(env, device)
        if state.world_size <= 1:
            return PassResult.skipped(NAME, "the existing process group has one process")
        how = "existing process group"
    else:
        state = check_env(env, device)
        _check_device(state.local_rank, device)
        if device.type == "cuda":
            torch.cuda.set_device(state.local_rank)
        _init_own_group(state)
        how = "process group initialised from the environment"
    if device.type == "cuda":
        device = torch.device("cuda", state.local_rank)
    ctx.device = device
    budget = resolve_budget(ctx.options.memory_budget, device)
    state.strategy, why = choose_strategy(option, state_memory(ctx.model, ctx.optimizer), budget)
    ctx.dist = state
    where = (
        f"over {state.world_size} processes, rank {state.rank} on {device} ({state.backend}, {how})"
    )
    # Decided now, before the backends pass installs its choice on the optimizer's groups.
    step_untimed = (
        ctx.optimizer is not None
        and device.type == "cpu"
        and backends.choose_optimizer(ctx.optimizer, device, state.strategy == "fsdp")[0]
        is not None
    )
    if state.strategy == "ddp":
        ctx.finalizers.append(functools.partial(_wrap_in_ddp, step_untimed=step_untimed))
        return PassResult.applied(NAME, f"DDP {where}; {why}")
    ctx.finalizers.append(functools.partial(_shard_with_fsdp, step_untimed=step_untimed))
    off = [name for name in ("compile", "channels_last") if getattr(ctx.options, name) is not False]
    if off:
        ctx.options = dataclasses.replace(ctx.options, **dict.fromkeys(off, False))
        why += f"; {' and '.join(off)} off under FSDP2 (not verified with its all-gather hooks)"
    return PassResult.applied(NAME, f"FSDP2 {where}; {why}")


# The process group optimize() initialised, weakly (a strong reference would itself keep gloo's
# threads alive into interpreter teardown), and the DDP wrappers made over it.
_OWN_GROUP: weakref.ref[dist.ProcessGroup] | None = None
_WRAPPERS: weakref.WeakSet[AutooptDDP] = weakref.WeakSet()
_SHARDED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def _init_own_group(state: DistState) -> None:
    """Initialise the default process group from the environment, and destroy it at exit."""
    global _OWN_GROUP
    dist.init_process_group(
        backend=state.backend,
        init_method="env://",
        rank=state.rank,
        world_size=state.world_size,
        timeout=INIT_TIMEOUT,
    )
    assert dist.group.WORLD is not None
    _OWN_GROUP = weakref.ref(dist.group.WORLD)
    atexit.unregister(destroy_own_group)  # once, however often optimize() is called
    atexit.register(destroy_own_group)


def destroy_own_group() -> bool:
    """Destroy the process group optimize() initialised, if it is still the default one; never
    a group the user initialised. Registered with `atexit`; True if it destroyed the group.

    Why at exit: gloo's worker threads (pt_gloo_runloop) live as long as the group. A thread
    that lets go of a finished collective's tensors takes the GIL; once interpreter teardown has
    begun, Python ends such a thread with pthread_exit, whose unwinding through a C++
    destructor aborts the rank ("terminate called without an active exception") after its work
    is done. Atexit handlers run before teardown: the DDP wrappers' reducers and handles are
    released, and the FSDP2 shard units' groups (`fsdp.release_groups`), then the group is
    destroyed and its threads are joined while Python still runs. A rank ending on an uncaught
    exception is left as it is: destroying a group could wait for peers stuck in a collective."""
    global _OWN_GROUP
    own = _OWN_GROUP() if _OWN_GROUP is not None else None
    if own is None or not dist.is_initialized() or dist.group.WORLD is not own:
        return False
    del own  # our frame must not be the group's last holder
    if getattr(sys, "last_value", None) is not None:
        return False
    for wrapper in list(_WRAPPERS):
        wrapper.release_group()
    for model in list(_SHARDED):
        fsdp.release_groups(model)
    gc.collect()  # cycles that hold works, tensors or wrappers
    dist.destroy_process_group()
    _OWN_GROUP = None
    gc.collect()
    return True


def choose_strategy(option: str | bool, memory: StepMemory, budget: int | None) -> tuple[str, str]:
    """ "ddp" or "fsdp" for `distributed=option`, and why. "auto" and True shard (FSDP2) only when
    one rank's parameters + gradients + optimizer state (`memory`) exceed `budget` (None: no
    limit). Pure: `doctor` and `tune` reuse it."""
    if option in ("ddp", "fsdp"):
        return str(option), f"distributed={option!r}"
    held = f"parameters + gradients + optimizer state {format_bytes(memory.state)}"
    if budget is None:
        return "ddp", f"{held}, no memory budget"
    if memory.state > budget:
        return "fsdp", f"{held} exceed the memory budget {format_bytes(budget)}"
    return "ddp", f"{held} fit the memory budget {format_bytes(budget)}"


def check_env(env: Mapping[str, str], device: torch.device) -> DistState:
    """The DistState that a torchrun environment describes, or a DistributedSetupError."""
    missing = [name for name in ENV_VARS if not env.get(name)]
    if missing:
        raise DistributedSetupError(
            f"WORLD_SIZE={env.get('WORLD_SIZE')!r} asks for distributed training, but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set; launch with "
            "`torchrun --nproc_per_node=N script.py`, which sets all of "
            f"{', '.join(ENV_VARS)}"
        )
    rank, world, local_rank = (_int(env, n) for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    _int(env, "MASTER_PORT")
    if world < 1 or not 0 <= rank < world:
        raise DistributedSetupError(f"RANK={rank} is outside WORLD_SIZE={world} (0..{world - 1})")
    if local_rank < 0 or local_rank > rank:
        raise DistributedSetupError(
            f"LOCAL_RANK={local_rank} is impossible for RANK={rank} (0 <= LOCAL_RANK <= RANK)"
        )
    return DistState(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        backend="nccl" if device.type == "cuda" else "gloo",
    )


def _check_existing(env: Mapping[str, str], device: torch.device) -> DistState:
    """The state of a process group the user initialised, checked against the environment."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for name, actual in (("WORLD_SIZE", world), ("RANK", rank)):
        if env.get(name) is not None and _int(env, name) != actual:
            raise DistributedSetupError(
                f"the existing process group has {name.lower()} {actual} but the environment "
                f"says {name}={env[name]}; destroy the group or fix the launcher"
            )
    if env.get("LOCAL_RANK") is not None:
        local_rank = _int(env, "LOCAL_RANK")
    elif device.type == "cuda":
        local_rank = rank % max(1, torch.cuda.device_count())
    else:
        local_rank = rank
    _check_device(local_rank, device)
    # The user's backend is kept even if it is not the one autoopt would pick (gloo on CUDA).
    backend = str(dist.get_backend())
    return DistState(rank=rank, world_size=world, local_rank=local_rank, backend=backend)


def _check_device(local_rank: int, device: torch.device) -> None:
    if device.type != "cuda":
        return
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise DistributedSetupError(
            f"LOCAL_RANK={local_rank} but this node has {count} CUDA device(s); start at most "
            f"{count} processes per node (--nproc_per_node={count}) or pass device='cpu'"
        )


def _choose_device(ctx: Context) -> torch.device:
    """CUDA when available (or asked for), else the CPU; the index comes from LOCAL_RANK."""
    wanted = ctx.options.device
    if wanted == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(torch.device(wanted).type)


def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise DistributedSetupError(f"{name}={value!r} is not an integer") from None


def _trainable(ctx: Context, wrapper: str) -> bool:
    """Whether the model has trainable parameters; if not, the report says `wrapper` stood down."""
    if any(p.requires_grad for p in ctx.model.parameters()):
        return True
    message = f"the model has no trainable parameters; {wrapper} not applied"
    ctx.report.replace(PassResult.skipped(NAME, message))
    return False


def _wrap_in_ddp(ctx: Context, step_untimed: bool) -> None:
    """Finalizer: wrap the (patched) model in AutooptDDP; it becomes what optimize() returns."""
    assert ctx.dist is not None and ctx.device is not None
    model: nn.Module = ctx.model
    if not _trainable(ctx, "DDP"):
        return
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    ctx.returned_model = AutooptDDP(model, device_ids=device_ids)
    _WRAPPERS.add(ctx.returned_model)
    _add_notes(ctx, ctx.report[NAME].detail, step_untimed)


def _shard_with_fsdp(ctx: Context, step_untimed: bool) -> None:
    """Finalizer: FSDP2 `fully_shard` on each repeated block and the root, in place; the
    optimizer is pointed at the sharded parameters, `ctx.memory` holds what a rank keeps and the
    report's memory section the state bytes per rank before and after sharding."""
    assert ctx.dist is not None and ctx.device is not None
    model: nn.Module = ctx.model
    if not _trainable(ctx, "FSDP2"):
        return
    before = state_memory(model, ctx.optimizer)
    held = resident_bytes(model, ctx.optimizer, ctx.device)
    budget = resolve_budget(ctx.options.memory_budget, ctx.device, held=held)
    mesh = init_device_mesh(ctx.device.type, (ctx.dist.world_size,))
    units = fsdp.shard(model, ctx.optimizer, mesh, ctx.amp_dtype)
    _SHARDED.add(model)
    after = state_memory(model, ctx.optimizer)
    if ctx.memory is not None and ctx.memory.activations is not None:
        after = after.with_activations(ctx.memory.activations)
    ctx.memory = after
    record_plan(ctx.report, before, after, budget)
    accumulation = ""
    if isinstance(acc := ctx.extras.get("accumulate"), Accumulator):
        # The 1/N seeding and clip gating find the model by its parameters: these are new now.
        root_scaling.add_params(model, [*model.parameters(), *fsdp.unsharded_parameters(units)])
        model.register_forward_pre_hook(ReduceOnLastMicroStep(acc), prepend=True)
        accumulation = "; gradients reduce-scattered on the last micro-batch only"
    norms = sum(isinstance(u, _NormBase) for u in units)
    parts = f"{len(units) - 1 - norms} blocks"
    if norms:
        parts += f" + {norms} BatchNorm layers in fp32"
    precision = "" if ctx.amp_dtype is None else ", parameters all-gathered in bf16"
    detail = ctx.report[NAME].detail
    _add_notes(
        ctx,
        f"{detail}; {len(units)} shard units ({parts} + the root){precision}; "
        f"per rank before: {before.render()}; after: {after.render()}{accumulation}",
        step_untimed,
    )


def _add_notes(ctx: Context, detail: str, step_untimed: bool) -> None:
    """The distributed line with what a reader of a single-process report would assume:
    BatchNorm statistics are per rank, and which choices were not measured under torchrun
    (`step_untimed`: a single process would have timed the optimizer step)."""
    assert ctx.dist is not None and ctx.device is not None
    notes = [detail]
    if bn := batchnorm_note(ctx.model, ctx.dist.strategy, ctx.device):
        notes.append(bn)
    if unmeasured := unmeasured_note(ctx, step_untimed):
        notes.append(unmeasured)
    ctx.report.replace(PassResult.applied(NAME, "; ".join(notes)))


def batchnorm_note(model: nn.Module, strategy: str, device: torch.device) -> str:
    """What BatchNorm layers (not SyncBatchNorm) compute under `strategy`, or "" if none."""
    layers = [
        m
        for m in model.modules()
        if isinstance(m, _BatchNorm) and not isinstance(m, nn.SyncBatchNorm)
    ]
    if not layers:
        return ""
    running = (
        "DDP copies rank 0's running statistics to the others at each forward"
        if strategy == "ddp"
        else "each rank keeps its own running statistics and full_state_dict saves rank 0's"
    )
    sync = (
        "for statistics over the global batch convert them before optimize() with "
        "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)"
        if device.type == "cuda"
        else "SyncBatchNorm, which would normalise over the global batch, needs a GPU"
    )
    return (
        f"{len(layers)} BatchNorm layers normalise each rank's batch over its own samples "
        f"(per-rank statistics, not the global batch's; {running}); {sync}"
    )


def unmeasured_note(ctx: Context, step_untimed: bool) -> str:
    """The choices a single process measures on the CPU that torchrun takes without measuring
    (each rank could time differently and so choose differently), or ""; `step_untimed`: the
    backends pass chose a step implementation that a single process would have timed."""
    assert ctx.device is not None
    if ctx.device.type != "cpu":
        return ""
    taken = []
    if ctx.amp_dtype is torch.bfloat16 and ctx.options.amp == "auto":
        taken.append("bf16 from the CPU's features (not timed against fp32)")
    if step_untimed:
        taken.append("the optimizer step implementation (not timed against the default)")
    if not taken:
        return ""
    return f"not measured under torchrun, taken as chosen: {' and '.join(taken)}"


@dataclasses.dataclass
class ReduceOnLastMicroStep:
    """Forward pre-hook on the FSDP2 root under `accumulate=N`: gradients are reduce-scattered in
    the last micro-batch's backward only (FSDP2's `no_sync`); the others accumulate locally."""

    acc: Accumulator

    def __call__(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():
            assert isinstance(module, FSDPModule)
            module.set_requires_gradient_sync(self.acc.at_last_micro_step)
